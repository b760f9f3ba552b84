"""README's Python examples run as written, in order, in one namespace (later blocks reuse
earlier names), so the front door cannot drift from the API. Its T5X snippet's placeholder
paths stand for a real T5X checkpoint (the tests' fixture, written by T5X) and a
SentencePiece model (the demo pair's)."""

import pathlib
import re

import pytest

import specdec_jax as sd
from specdec_jax import package_data

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
T5X_CHECKPOINT = ROOT / "tests" / "fixtures" / "t5x_tiny_v1_1" / "legacy" / "checkpoint_0"


def python_blocks(text: str) -> list[str]:
  return re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def placeholders() -> dict[str, str]:
  """README's placeholder paths -> real files of the same kind."""
  spiece = next(root / "demo-de-en" / "spiece.model" for root in package_data.installed_assets()
                if (root / "demo-de-en" / "spiece.model").is_file())
  return {'"path/to/checkpoint_1000000"': repr(str(T5X_CHECKPOINT)),
          '"path/to/spiece.model"': repr(str(spiece))}


def test_readme_has_an_example_per_method():
  code = "\n".join(python_blocks(README.read_text()))
  for name in [f"sd.{m.__name__}(" for m in sd.methods.METHODS] + ["prompt_lengths="]:
    assert name in code, name


def test_the_t5x_snippet_names_the_placeholders_the_test_fills():
  code = "\n".join(python_blocks(README.read_text()))
  for placeholder in placeholders():
    assert placeholder in code, placeholder


@pytest.mark.docs
@pytest.mark.slow
def test_readme_python_examples_run(capsys):
  pytest.importorskip("tokenizers")
  namespace: dict = {}
  for i, block in enumerate(python_blocks(README.read_text())):
    for placeholder, path in placeholders().items():
      block = block.replace(placeholder, path)
    exec(compile(block, f"README.md python block {i}", "exec"), namespace)
  printed = capsys.readouterr().out
  assert printed.count("\n") >= 4          # every example prints its output
  assert namespace["t5"].config.vocab_size == 512 and namespace["inputs"].ndim == 2
