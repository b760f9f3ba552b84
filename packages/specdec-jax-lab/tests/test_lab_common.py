"""The lab's modules and the pieces its tools share: every module imports, their errors,
the sweeps' settings and tables. The library's shared pieces are tests/test_tools_common.py;
that the lab imports only the library's public API, tests/unit/test_layers.py."""

import importlib
import inspect
import pathlib

import pytest

import specdec_jax as sd
from specdec_jax.flags import FlagError
from specdec_jax.io import reports as report

LAB = pathlib.Path(__file__).resolve().parents[1] / "specdec_jax_lab"


def test_every_lab_module_imports():
  """Each module of the lab imports (a name it takes from the library still exists)."""
  modules = sorted(LAB.rglob("*.py"))
  assert len(modules) > 30
  for path in modules:
    parts = ["specdec_jax_lab", *path.relative_to(LAB).with_suffix("").parts]
    if parts[-1] in ("__init__", "__main__"):
      parts = parts[:-1]
    importlib.import_module(".".join(parts))


def test_every_lab_error_is_a_lab_error_exported_where_it_is_raised():
  from specdec_jax_lab import errors as lab_errors
  classes = [c for _, c in inspect.getmembers(lab_errors, inspect.isclass)
             if c.__module__ == lab_errors.__name__]
  assert len(classes) >= 8
  for cls in classes:
    assert issubclass(cls, lab_errors.LabError) and issubclass(cls, ValueError), cls
    assert issubclass(cls, sd.SpecdecError), cls
  assert issubclass(lab_errors.MissingDataError, FileNotFoundError)
  assert issubclass(lab_errors.T5XSourceError, lab_errors.CompareError)
  from specdec_jax_lab import bench, data, evaluation, hf_compare, results, t5x_bench, training
  for module, name in ((bench, "BenchError"), (evaluation, "EvaluationError"),
                       (hf_compare, "CompareError"), (results, "ResultsError"),
                       (t5x_bench, "T5XSourceError"), (training, "TrainingError"),
                       (data, "DataError"), (data, "MissingDataError")):
    assert getattr(module, name) is getattr(lab_errors, name)


def test_sweep_pick_and_table1_read_the_bleu_drop():
  from specdec_jax_lab import sweep
  from specdec_jax_lab.errors import SweepError
  point = lambda label, group, bleu, speedup: {
      "label": label, "group": group, "bleu": bleu, "bleu_drop": 10.0 - bleu,
      "speedup": speedup, "fallback_rate": 0.5, "rollback_rate": 0.1}
  results = {"baselines": {"target, greedy": {"bleu": 10.0}},
             "points": [point("a", "BiLD x", 10.0, 1.2), point("b", "BiLD x", 9.95, 1.5),
                        point("c", "BiLD x", 9.2, 2.0), point("d", "BiLD x", 7.0, 3.0),
                        point("e", "BiLD y", 8.0, 2.5)]}
  assert sweep.pick(results, "BiLD x", sweep.report.NO_DROP)["label"] == "b"
  assert sweep.pick(results, "BiLD x", sweep.report.ONE_DROP)["label"] == "c"
  assert sweep.pick(results, "BiLD y", sweep.report.ONE_DROP) is None   # 2 BLEU below
  table = sweep.table1_markdown(results)
  assert "| BiLD x, no BLEU drop | 9.95 | 1.50 |" in table
  assert "| BiLD y, ~1 BLEU drop | — | — | | | none within 1.0 BLEU |" in table
  with pytest.raises(SweepError, match="unique"):
    sweep.run_points(None, None, None, [sweep.Point("a", "g", None), sweep.Point("a", "g", None)])


def test_sweep_settings_record_the_config_that_resume_compares():
  """The command line becomes `BildSweep` / `BlockwiseSweep` once; the `config` they record
  keeps the keys (and order) of the results written before, so --resume reads those; bad
  flags are refused before any model is loaded."""
  import specdec_command as cli

  from specdec_jax_lab.commands import sweep
  from specdec_jax_lab.sweep import settings
  argv = ["sweep-bild", "--data", "pairs.jsonl", "--small", "a=b", "--fallback", "0.5,inf",
          "--out", "o"]
  args = cli.build_parser().parse_args(argv)
  args.argv = argv
  bild = sweep.bild_from_args(args)
  assert bild.fallback == (0.5, float("inf")) and bild.smalls() == [("a", "b")]
  config = settings.recorded_config(bild, decoder_only=False)
  assert list(config) == ["model", "data", "split", "limit", "batch_size", "seed", "small",
                          "early_exit", "top_p", "exact", "fallback", "rollback", "gammas",
                          "command"]
  assert report.to_jsonable(config)["small"] == ["a=b"]
  assert config["command"] == "specdec " + " ".join(argv)
  args = cli.build_parser().parse_args(["sweep-blockwise", "--data", "d", "--out", "o"])
  blockwise = sweep.blockwise_from_args(args)
  assert list(settings.recorded_config(blockwise, decoder_only=True)) == [
      "model", "data", "split", "limit", "batch_size", "seed", "exact", "heads", "lattice_k",
      "num_drafts", "rescorer", "rescoring_weight", "tokenizer", "prompt_len",
      "max_new_tokens", "command"]
  assert blockwise.lm_new_tokens == settings.LM_NEW_TOKENS and blockwise.exact_mode is None
  for flags, message in ((["--batch-policies", "wait,later"], "unknown policy 'later'"),
                         (["--small", "nameless"], "is not NAME=PATH"),
                         (["--repeats", "0"], "--repeats must be >= 1")):
    args = cli.build_parser().parse_args(argv + flags)
    with pytest.raises(FlagError, match=message):
      sweep.bild_from_args(args)
