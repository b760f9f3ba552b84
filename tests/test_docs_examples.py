"""Every ```python block of docs/ runs as written (docs/extending/ runs as doctests:
test_extending_docs.py; README: test_readme.py): each page's blocks in order, in one
namespace of the page's own, with nothing defined beforehand. The few that need what a test
machine lacks (a checkpoint at a placeholder path, 8 devices, several hosts) are listed in
CANNOT_RUN with why; a block that starts to run, or a new block, fails the listing."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if p.parent.name != "extending")
#: (page, block index): why it does not run here.
CANNOT_RUN = {
    ("accelerators.md", 2): "a checkpoint at path/to/t5-xxl, 8 devices",
    ("decoder-only.md", 1): "checkpoints at path/to/llama",
    ("scale.md", 0): "a checkpoint at path/to/t5-xxl, 8 devices",
    ("scale.md", 1): "several hosts (jax.distributed.initialize)",
}


def python_blocks(page: pathlib.Path) -> list[str]:
  return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"),
                    re.MULTILINE | re.DOTALL)


def name(page: pathlib.Path) -> str:
  return page.relative_to(ROOT / "docs").as_posix()


RUNNABLE = [p for p in PAGES
            if any((name(p), i) not in CANNOT_RUN for i in range(len(python_blocks(p))))]


def test_the_blocks_that_cannot_run_are_listed_with_a_reason():
  blocks = {(name(p), i): b for p in PAGES for i, b in enumerate(python_blocks(p))}
  assert len(blocks) > 15 and set(CANNOT_RUN) <= set(blocks)
  for key, why in CANNOT_RUN.items():
    needs = re.search(r"path/to/|make_mesh|distributed", blocks[key])
    assert why and needs, key


@pytest.mark.docs
@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=name)
def test_page_python_blocks_run_as_written(page, capsys):
  namespace: dict = {"__name__": f"docs_{page.stem}"}
  for i, block in enumerate(python_blocks(page)):
    if (name(page), i) in CANNOT_RUN:
      continue
    exec(compile(block, f"{name(page)} python block {i}", "exec"), namespace)
