"""The bad inputs of issue 31 that reach the lab's commands (eval, bench, sweep-bild): each
gets a `SpecdecError` naming the problem, one line and a non-zero exit, before any model
is loaded where it can be. Those of the library's commands are tests/test_bad_inputs.py.
"""

import pytest
import specdec_command as cli
from helpers import DEMO_PAIRS_FILE as PAIRS

import specdec_jax as sd
from specdec_jax_lab import evaluation
from specdec_jax_lab.commands import bench as bench_cli
from specdec_jax_lab.commands import evaluate as evaluate_cli
from specdec_jax_lab.data import prepare


def failed(capsys, *argv) -> str:
  """The one error line of a failing command (no traceback, nothing on stdout)."""
  code = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  lines = err.strip().splitlines()
  assert code != 0 and out == "", (code, out, err)
  assert "Traceback" not in err and lines[-1].startswith("specdec "), err
  return lines[-1]


def test_eval_refuses_another_models_tokenizer(capsys):
  """The LM's tokenizer on the De->En T5 model: was BLEU 1.68, exit 0."""
  pytest.importorskip("tokenizers")
  line = failed(capsys, "eval", "--model", "demo-de-en/target", "--data", PAIRS,
                "--tokenizer", "demo-en-lm", "--limit", "2")
  assert "has 4096 ids but the model's vocabulary is 8000" in line


def test_output_dir_is_checked_before_the_work(capsys, tmp_path, monkeypatch):
  """A bad `bench --out` (and `sweep-bild --out`) fails before any model is loaded (it was
  found after 55 s of benchmarking)."""
  def loaded(*args, **kwargs):
    raise AssertionError("a model was loaded before --out was checked")
  monkeypatch.setattr(bench_cli, "load_target", loaded)
  (tmp_path / "file").write_text("x")
  line = failed(capsys, "bench", "--target", "config:t5_1_1_tiny", "--baseline-only",
                "--out", tmp_path / "file" / "bench")
  assert "--out" in line and "is a file, not a directory" in line
  line = failed(capsys, "sweep-bild", "--data", PAIRS, "--small", f"a={tmp_path}",
                "--out", tmp_path / "file")
  assert "--out" in line and "is a file" in line


def test_unknown_split_is_an_error(capsys, monkeypatch):
  """`eval --split bogus` was ignored for a .jsonl file; now refused before any model."""
  def loaded(*args, **kwargs):
    raise AssertionError("the model was loaded before --split was checked")
  monkeypatch.setattr(evaluate_cli, "load_target", loaded)
  line = failed(capsys, "eval", "--model", "demo-de-en/target", "--data", PAIRS,
                "--split", "bogus")
  assert "no split 'bogus'" in line and "train, validation, test" in line
  line = failed(capsys, "eval", "--model", "demo-de-en/target", "--data", PAIRS,
                "--split", "validation")
  assert "a .jsonl file of pairs is one split" in line
  with pytest.raises(sd.SpecdecError, match="no split 'bogus'"):
    evaluation.split_inputs(str(PAIRS), "bogus", None)


def test_non_utf8_jsonl_is_a_data_error(capsys, tmp_path):
  bad = tmp_path / "pairs.jsonl"
  bad.write_bytes(b'{"de": "Stra\xdfe", "en": "street"}\n')      # Latin-1, not UTF-8
  with pytest.raises(sd.SpecdecError, match=r"is not UTF-8 text"):
    prepare.read_pairs_jsonl(bad)
  line = failed(capsys, "eval", "--model", "demo-de-en/target", "--data", bad)
  assert "is not UTF-8 text" in line and str(bad) in line

