"""The documented commands name things that exist: `specdec --help` names every model kind,
and every model or tokenizer a shell example of README or docs/ passes is a bundled name, a
`config:` name, a drafter kind, a metavariable (DIR), an explicit path, or a directory an
earlier line of the same block makes (`hf download ... --local-dir gpt2`)."""

import pathlib
import re
import shlex

import pytest

import specdec_jax as sd
from specdec_jax import cli, package_data
from specdec_jax.io.checkpoints import resolve
from specdec_jax.io.tokenizer import bundled_tokenizers

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FLAGS = ("--model", "--target", "--drafter", "--tokenizer", "--rescorer", "--small")
KINDS = ("ngram", "prompt-lookup", "data")


def shell_blocks(text: str) -> list[str]:
  return re.findall(r"^ *```(?:bash|sh|console)\n(.*?)^ *```", text, re.MULTILINE | re.DOTALL)


def named(block: str) -> list[tuple[str, str]]:
  """(flag, value) of every model / tokenizer flag in the block's commands."""
  words = shlex.split(block.replace("\\\n", " "), comments=True)
  pairs = []
  for flag, value in zip(words, words[1:], strict=False):   # each word and the next
    if flag in FLAGS:
      pairs.append((flag, value.split("=", 1)[1] if flag == "--small" else value))
  return pairs


def made_dirs(block: str) -> set[str]:
  return set(re.findall(r"--(?:local-dir|workdir|out)[ =](\S+)", block))


def fine(value: str, made: set[str], known: set[str]) -> bool:
  if value in known or value in made or value in KINDS or value.isupper():
    return True
  if value.startswith("config:"):
    return sd.get_config(value[len("config:"):]) is not None
  if re.fullmatch(r"early-exit:\d+", value):
    return True
  # an explicit path (path/to/..., runs/..., a file) or one under a directory made here
  return ("/" in value or "." in value) and not value.startswith("hf-")


def test_help_names_every_model_kind():
  parser = cli.build_parser()
  assert parser.description in " ".join(parser.format_help().split()).replace("- ", "-")
  text = parser.description
  assert "T5 encoder-decoders and decoder-only LMs" in text
  for group in package_data.SEPARATE:       # every bundled pair, demo-de-en-large too
    assert re.search(rf"(?<![\w-]){group}(?![\w-])", text), group


def test_documented_names_exist():
  known = set(resolve.bundled_names()) | set(bundled_tokenizers())
  known |= {f"{g}/{m}" for g in package_data.SEPARATE for m in ("target", "drafter")}
  known |= set(package_data.SEPARATE)
  bad = []
  for page in PAGES:
    for block in shell_blocks(page.read_text()):
      made = made_dirs(block)
      bad += [f"{page.relative_to(ROOT)}: {flag} {value}" for flag, value in named(block)
              if not fine(value, made, known)]
  assert not bad, bad


@pytest.mark.parametrize("value, ok", [("hf-gpt2", False), ("llama", False), ("gpt2", False),
                                       ("demo-en-lm/target", True), ("DIR", True),
                                       ("config:t5_1_1_tiny", True), ("path/to/t5-xxl", True)])
def test_the_check_tells_names_from_placeholders(value, ok):
  """Negative control: the placeholders the docs used to show are caught."""
  known = set(resolve.bundled_names()) | set(bundled_tokenizers())
  assert fine(value, set(), known) == ok
