"""Every input line has its output line, in order: an empty line is an empty input (T5: EOS
alone), through stdout, --json, --output and a resumed --output; a decoder-only model, which
cannot continue nothing, names the empty line."""

import contextlib
import io
import json

import pytest

from specdec_jax import cli
from specdec_jax.runtime import output_file

MODEL = "config:t5_1_1_tiny"
FLAGS = ["--model", MODEL, "--max-new-tokens", "4", "--batch-size", "2"]
# empty lines at the start, in the middle and at the end (and one of blanks only)
TEXT = "\n5 17 42 1\n\n7 8 9 11 1\n  \n"
# the same inputs with each empty line as what it stands for: EOS alone
SAME = ["1", "5 17 42 1", "1", "7 8 9 11 1", "1"]


def _main(*argv) -> tuple[int, str, str]:
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main([str(a) for a in argv])
  return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def expected() -> str:
  code, out, err = _main("decode", *FLAGS, *SAME)
  assert code == 0, err
  assert len(out.splitlines()) == len(SAME)
  return out


@pytest.fixture()
def prompts(tmp_path):
  path = tmp_path / "prompts.txt"
  path.write_text(TEXT)
  return path


@pytest.mark.slow
def test_stdout_and_json_answer_every_line(expected, prompts):
  code, out, err = _main("decode", *FLAGS, "--input-file", prompts)
  assert code == 0, err
  assert out == expected
  code, out, err = _main("decode", *FLAGS, "--input-file", prompts, "--json")
  assert code == 0, err
  rows = json.loads(out)["outputs"]
  assert [" ".join(map(str, r)) for r in rows] == expected.splitlines()


def test_output_and_resume_answer_every_line(expected, prompts, tmp_path):
  out_path = tmp_path / "out.txt"
  code, printed, err = _main("decode", *FLAGS, "--input-file", prompts, "--output", out_path)
  assert code == 0 and printed == "", err
  assert out_path.read_text() == expected
  sidecar = json.loads(open(output_file.sidecar_path(str(out_path))).read())
  assert sidecar["input_rows"] == len(SAME) and sidecar["complete"]
  # a run stopped after its first batch (its second line, an empty input's, cut half way)
  lines = expected.splitlines(keepends=True)
  out_path.write_text(lines[0] + lines[1][:2])
  code, printed, err = _main("decode", *FLAGS, "--input-file", prompts, "--output", out_path,
                             "--resume")
  assert code == 0, err
  assert out_path.read_text() == expected


def test_an_empty_decoder_only_prompt_is_named(tmp_path):
  path = tmp_path / "prompts.txt"
  path.write_text("5 6 7\n\n8 9\n")
  code, out, err = _main("decode", "--model", "config:llama_tiny", "--max-new-tokens", "2",
                         "--input-file", path)
  assert code == 1 and out == ""
  assert "error: prompt 2 is empty: a decoder-only model needs" in err and "Traceback" not in err


@pytest.mark.slow
def test_an_empty_line_is_a_bos_prompt_where_the_tokenizer_prepends_one(tmp_path):
  """demo-en-lm's tokenizer encodes an empty text as BOS alone: a prompt to continue."""
  path = tmp_path / "prompts.txt"
  path.write_text("I have no\n\nCan you help\n")
  flags = ["--model", "demo-en-lm/target", "--tokenizer", "demo-en-lm", "--max-new-tokens", "3",
           "--json"]
  code, out, err = _main("decode", *flags, "--input-file", path)
  assert code == 0, err
  payload = json.loads(out)
  assert len(payload["outputs"]) == 3 and payload["prompt_lengths"][1] == 1
