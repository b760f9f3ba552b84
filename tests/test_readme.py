"""README's Python examples run as written, in order, in one namespace (later blocks reuse
earlier names), so the front door cannot drift from the API."""

import pathlib
import re

import pytest

import specdec_jax as sd

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
  return re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_readme_has_an_example_per_method():
  code = "\n".join(python_blocks(README.read_text()))
  for name in [f"sd.{m.__name__}(" for m in sd.methods.METHODS] + ["prompt_lengths="]:
    assert name in code, name


@pytest.mark.slow
def test_readme_python_examples_run(capsys):
  pytest.importorskip("tokenizers")
  namespace: dict = {}
  for i, block in enumerate(python_blocks(README.read_text())):
    exec(compile(block, f"README.md python block {i}", "exec"), namespace)
  printed = capsys.readouterr().out
  assert printed.count("\n") >= 4          # every example prints its output
