"""The worked examples in the package's docstrings (`>>>` lines) run, and print what they say.

Every module of `specdec_jax` whose source has a `>>>` line is one test. The examples see
the module's own names plus `sd` (the package), `np`, `jax` and `jnp`, as README's examples
do; output is compared with ELLIPSIS and NORMALIZE_WHITESPACE. An example must stay cheap (a
tiny model: `sd.load("config:t5_1_1_tiny")`); what cannot run (a path on the reader's disk)
is written as plain text, not after `>>>`.
"""

import doctest
import importlib
import io
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd

PACKAGE_DIR = pathlib.Path(sd.__file__).resolve().parent
PROMPT = re.compile(r"^\s*>>>", re.MULTILINE)
GLOBALS = {"sd": sd, "np": np, "jax": jax, "jnp": jnp}
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules_with_examples() -> dict[str, int]:
  """Module name -> number of `>>>` lines in its source (found without importing it)."""
  found = {}
  for path in sorted(PACKAGE_DIR.rglob("*.py")):
    count = len(PROMPT.findall(path.read_text(encoding="utf-8")))
    if count:
      found[_module_name(path)] = count
  return found


MODULES = _modules_with_examples()


def test_the_package_has_examples():
  # The scan itself: a broken pattern or path would silently make every test below vanish.
  assert "specdec_jax.batching" in MODULES, MODULES


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODULES))
def test_docstring_examples(name):
  module = importlib.import_module(name)
  tests = [t for t in doctest.DocTestFinder().find(module, extraglobs=GLOBALS) if t.examples]
  # Each example starts at one `>>>` line: any the finder misses (in a comment, in a
  # docstring doctest cannot reach) would look executed to a reader without being run.
  found = sum(len(t.examples) for t in tests)
  assert found == MODULES[name], (
      f"{name}: {MODULES[name]} '>>>' lines in the source but doctest finds {found} "
      "examples; write non-runnable code as plain text, without '>>>'")
  runner = doctest.DocTestRunner(optionflags=OPTIONS)
  report = io.StringIO()
  for test in tests:
    runner.run(test, out=report.write)
  result = runner.summarize(verbose=False)
  assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed:\n" + \
      report.getvalue()
