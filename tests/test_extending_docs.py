"""The worked examples of docs/extending/*.md (`>>>` lines) run as doctests, and print what
the pages say: the extension pages cannot drift from the API they document.

Each page runs in a namespace of its own (a reader copies a page, not this file), with
ELLIPSIS and NORMALIZE_WHITESPACE, on the tiny random model `config:t5_1_1_tiny`.
"""

import doctest
import io
import pathlib
import re

import pytest

PAGES_DIR = pathlib.Path(__file__).resolve().parents[1] / "docs" / "extending"
PAGES = sorted(PAGES_DIR.glob("*.md"))
PROMPT = re.compile(r"^\s*>>>", re.MULTILINE)
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def examples(page: pathlib.Path) -> doctest.DocTest:
  return doctest.DocTestParser().get_doctest(page.read_text(encoding="utf-8"), {},
                                             page.stem, str(page), 0)


def test_every_page_has_runnable_examples():
  # The scan itself: a wrong path or pattern would make the test below vanish.
  assert {p.name for p in PAGES} >= {"drafter.md", "acceptance.md"}, PAGES
  for page in PAGES:
    found = len(examples(page).examples)
    # Each `>>>` line opens one example: one the parser misses would look run but is not.
    assert found == len(PROMPT.findall(page.read_text(encoding="utf-8"))) and found, page


@pytest.mark.docs
@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_page_examples_run(page):
  runner = doctest.DocTestRunner(optionflags=OPTIONS)
  report = io.StringIO()
  runner.run(examples(page), out=report.write)
  result = runner.summarize(verbose=False)
  assert result.attempted and result.failed == 0, (
      f"{page.name}: {result.failed} of {result.attempted} examples failed:\n"
      + report.getvalue())
