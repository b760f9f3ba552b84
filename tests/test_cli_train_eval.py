"""`specdec train` / `specdec eval` on a tiny recipe over a synthetic dictionary, and the
pure helpers of specdec_jax.tools.evaluation."""

import json
import math

import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax.tools import cli, evaluation
from specdec_jax.tools.errors import OptionError
from test_prepare import write_dictionary

VOCAB = 120
LIMIT = 16     # test pairs evaluated: two batches of 8 (the second one padded)
TARGET = {"vocab_size": VOCAB, "emb_dim": 32, "num_heads": 2, "head_dim": 16, "mlp_dim": 64,
          "num_encoder_layers": 1, "num_decoder_layers": 1, "mlp_activations": ["gelu", "linear"],
          "logits_via_embedding": False, "dropout_rate": 0.0}
DRAFTER = {**TARGET, "emb_dim": 16, "head_dim": 8, "mlp_dim": 32}
TRAIN = {"steps": 30, "batch_size": 16, "learning_rate": 0.01, "warmup_steps": 5,
         "checkpoint_every": 30}


def run(capsys, *argv):
  code = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return code, out, err


def write_recipe(tmp, dictionary, **changes):
  (tmp / "target.json").write_text(json.dumps(TARGET))
  (tmp / "drafter.json").write_text(json.dumps(DRAFTER))
  recipe = {
      "data": {"vocab_size": VOCAB, "max_len": 12, "min_words_de": 2, "seed": 0,
               "path": str(dictionary), "test_size": 30, "valid_size": 20},
      # absolute paths: run_pipeline joins them to the repository root, which keeps them
      "target": {"config": str(tmp / "target.json"), "seed": 0, **TRAIN},
      "drafter": {"config": str(tmp / "drafter.json"), "seed": 1, **TRAIN},
  }
  recipe.update(changes)
  path = tmp / "recipe.json"
  path.write_text(json.dumps(recipe))
  return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """One `specdec train --stages data,target,drafter` run shared by the tests below."""
  tmp = tmp_path_factory.mktemp("train")
  recipe = write_recipe(tmp, write_dictionary(tmp / "de-en"))
  workdir = tmp / "work"
  code = cli.main(["train", "--recipe", str(recipe), "--workdir", str(workdir),
                   "--stages", "data,target,drafter"])
  assert code == 0
  return recipe, workdir


def eval_json(capsys, workdir, *argv):
  code, out, err = run(capsys, "eval", "--model", workdir / "target" / "final",
                       "--data", workdir / "data", "--limit", LIMIT, "--batch-size", 8,
                       "--json", *argv)
  assert code == 0, err
  return json.loads(out)


# ----------------------------------------------------------------------------- train


def test_train_writes_every_requested_stage(trained):
  _, workdir = trained
  assert (workdir / "data" / "meta.json").is_file()
  assert (workdir / "data" / "spiece.model").is_file()
  for stage in ("target", "drafter"):
    assert (workdir / stage / "final" / "specdec_config.json").is_file()
    assert (workdir / stage / "final" / "train_log.json").is_file()
    assert (workdir / stage / "checkpoints" / str(TRAIN["steps"])).is_dir()
  assert not (workdir / "aligned").exists()
  config = json.loads((workdir / "drafter" / "final" / "specdec_config.json").read_text())
  assert config.get("emb_dim", config.get("config", {}).get("emb_dim")) == DRAFTER["emb_dim"]


def test_train_rerun_skips_finished_stages(trained, capsys):
  recipe, workdir = trained
  before = (workdir / "target" / "final").stat().st_mtime_ns
  code, out, err = run(capsys, "train", "--recipe", recipe, "--workdir", workdir,
                       "--stages", "target")
  assert code == 0, err
  assert out.startswith(f"target: {workdir / 'target' / 'final'}")
  assert (workdir / "target" / "final").stat().st_mtime_ns == before


def test_train_more_steps_continues_and_restarts_downstream(trained, capsys, tmp_path):
  """Raising target.steps continues the target from its checkpoint; the aligned drafter,
  trained from the old target, starts over on the new target's outputs."""
  import shutil
  recipe, workdir = trained
  workdir = shutil.copytree(workdir, tmp_path / "work")
  good = json.loads(recipe.read_text())
  aligned = {**TRAIN, "steps": 10, "checkpoint_every": 10}
  path = tmp_path / "recipe.json"
  path.write_text(json.dumps({**good, "aligned": aligned}))
  code, _, err = run(capsys, "train", "--recipe", path, "--workdir", workdir,
                     "--stages", "aligned")
  assert code == 0, err
  log = json.loads((workdir / "aligned" / "final" / "train_log.json").read_text())
  assert log["steps"] == 10 and log["upstream"] == {"target": 30, "drafter": 30}
  old_history = (workdir / "target" / "history.jsonl").read_text().splitlines()

  path.write_text(json.dumps({**good, "aligned": aligned,
                              "target": {**good["target"], "steps": 40}}))
  code, _, err = run(capsys, "train", "--recipe", path, "--workdir", workdir,
                     "--stages", "target,aligned")
  assert code == 0, err
  assert (workdir / "target" / "checkpoints" / "40").is_dir()
  history = (workdir / "target" / "history.jsonl").read_text().splitlines()
  assert history[:len(old_history)] == old_history   # continued, not restarted
  assert json.loads(history[-1])["step"] == 40
  assert json.loads((workdir / "target" / "final" / "train_log.json").read_text())["steps"] == 40
  log = json.loads((workdir / "aligned" / "final" / "train_log.json").read_text())
  assert log["upstream"] == {"target": 40, "drafter": 30}
  assert int(np.load(workdir / "aligned_targets.npz")["target_steps"]) == 40
  assert sorted(p.name for p in (workdir / "aligned" / "checkpoints").iterdir()) == ["10"]

  # steps lowered below the newest checkpoint: a clear error, not silently more steps
  path.write_text(json.dumps({**good, "target": {**good["target"], "steps": 20}}))
  code, _, err = run(capsys, "train", "--recipe", path, "--workdir", workdir,
                     "--stages", "target")
  assert code == 2 and "past steps=20" in err and "Traceback" not in err
  assert (workdir / "target" / "final" / "train_log.json").exists()   # the failure kept it

  # another setting than steps (the aligned stage's optimizer): that stage starts over
  before = (workdir / "aligned" / "history.jsonl").read_text()
  path.write_text(json.dumps({**good, "aligned": {**aligned, "optimizer": "adafactor"},
                              "target": {**good["target"], "steps": 40}}))
  code, _, err = run(capsys, "train", "--recipe", path, "--workdir", workdir,
                     "--stages", "aligned")
  assert code == 0, err
  settings = json.loads((workdir / "aligned" / "train_config.json").read_text())
  assert settings["optimizer"] == "adafactor"
  after = (workdir / "aligned" / "history.jsonl").read_text()
  assert [json.loads(l)["step"] for l in after.splitlines()] == [10] and after != before


@pytest.mark.parametrize("argv, message", [
    (["--stages", "data,nope"], "unknown stage"),
    (["--stages", ""], "unknown stage"),
])
def test_train_bad_stages(trained, capsys, tmp_path, argv, message):
  recipe, _ = trained
  code, out, err = run(capsys, "train", "--recipe", recipe, "--workdir", tmp_path, *argv)
  assert code == 2 and message in err
  assert err.startswith("specdec train: error:") and len(err.strip().splitlines()) == 1


def test_train_bad_recipes(capsys, tmp_path):
  def check(recipe_path, message, stages="data,target"):
    code, out, err = run(capsys, "train", "--recipe", recipe_path, "--workdir",
                         tmp_path / "w", "--stages", stages)
    assert code == 2, err
    assert err.startswith("specdec train: error:") and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err

  check(tmp_path / "missing.json", "missing.json")
  (tmp_path / "broken.json").write_text("{not json")
  check(tmp_path / "broken.json", "not valid JSON")
  good = json.loads(write_recipe(tmp_path, tmp_path / "de-en").read_text())
  for name, recipe, message in [
      ("nodata", {k: v for k, v in good.items() if k != "data"}, "no section for stage(s) data"),
      ("noconfig", {**good, "target": {"steps": 3}}, "needs a \"config\""),
      ("badsteps", {**good, "target": {**good["target"], "steps": 0}}, "steps must be >= 1"),
      ("badkey", {**good, "data": {**good["data"], "vocab": 3}}, "section 'data'"),
      ("typo", {**good, "target": {**good["target"], "optimiser": "adafactor"}},
       "section 'target': unknown key(s) optimiser"),
      ("badopt", {**good, "target": {**good["target"], "optimizer": "sgd"}},
       "optimizer must be one of adamw, adafactor"),
  ]:
    (tmp_path / f"{name}.json").write_text(json.dumps(recipe))
    check(tmp_path / f"{name}.json", message)
  # the dictionary file does not exist
  check(tmp_path / "recipe.json", "not found")
  # no data stage and no prepared data
  check(tmp_path / "recipe.json", "holds no prepared data", stages="target")


# ----------------------------------------------------------------------------- eval


@pytest.fixture(scope="module")
def baseline(trained):
  _, workdir = trained
  return evaluation.evaluate(sd.load(str(workdir / "target" / "final")), workdir / "data",
                             limit=LIMIT, batch_size=8)


def test_eval_json_scores_and_speed(trained, capsys, baseline):
  _, workdir = trained
  result = eval_json(capsys, workdir)
  for key in ("bleu", "chrf"):
    assert math.isfinite(result[key]) and 0.0 <= result[key] <= 100.0
  assert result["pairs"] == LIMIT and len(result["hypotheses"]) == LIMIT
  assert result["generated_tokens"] > 0 and result["ms_per_token"] > 0
  assert result["speculative"] is False and result["stats"]["target_calls"] >= 1
  # target calls are counted per row: the baseline makes one per generated token
  assert result["stats"]["target_calls"] == result["generated_tokens"]
  assert result["stats"]["tokens_per_target_call"] == 1.0
  # varied outputs, so that equal hypotheses below mean something
  assert len(set(result["hypotheses"])) > LIMIT // 2
  assert result["settings"]["split"] == "test"
  # the CLI is evaluation.evaluate with the same settings
  assert result["hypotheses"] == baseline["hypotheses"]
  assert result["bleu"] == baseline["bleu"] and result["chrf"] == baseline["chrf"]


def test_eval_text_report(trained, capsys):
  _, workdir = trained
  code, out, err = run(capsys, "eval", "--model", workdir / "target" / "final",
                       "--data", workdir / "data", "--limit", LIMIT, "--batch-size", 8)
  assert code == 0, err
  for label in ("BLEU", "chrF", "ms/token", "tokens/s", "generated tokens"):
    assert label in out
  assert "baseline" in out


def test_eval_speculative_greedy_equals_target_greedy(trained, capsys, baseline):
  _, workdir = trained
  result = eval_json(capsys, workdir, "--drafter", workdir / "drafter" / "final",
                     "--gamma", 3)
  assert result["speculative"] is True and result["gamma"] == 3
  assert result["hypotheses"] == baseline["hypotheses"]     # speculative greedy is exact
  assert result["bleu"] == baseline["bleu"] and result["chrf"] == baseline["chrf"]
  stats = result["stats"]
  assert 0.0 <= stats["acceptance_rate"] <= 1.0 and 0.0 <= stats["alpha"] <= 1.0
  assert stats["tokens_per_target_call"] >= 1.0
  assert 0 < stats["accepted"] <= stats["drafted"]
  assert stats["acceptance_rate"] == pytest.approx(stats["accepted"] / stats["drafted"])
  assert stats["alpha"] == pytest.approx(stats["beta_sum"] / stats["beta_count"])
  assert stats["tokens_per_target_call"] == pytest.approx(result["generated_tokens"]
                                                          / stats["target_calls"])
  assert stats["emitted"] == result["generated_tokens"] and stats["gamma"] == 3


def test_eval_ngram_drafter_fitted_on_train_split(trained, baseline):
  _, workdir = trained
  target = sd.load(str(workdir / "target" / "final"))
  result = evaluation.evaluate(target, workdir / "data", drafter="ngram", gamma=2,
                               limit=LIMIT, batch_size=8)
  assert result["hypotheses"] == baseline["hypotheses"]
  assert result["stats"]["drafted"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--gamma", "3"], "--gamma only applies"),
    (["--limit", "0"], "--limit must be"),
    (["--split", "nope"], "no split 'nope'"),
    (["--method", "greedy", "--temperature", "0.5"], "only apply with --method sample"),
    (["--batch-size", "0"], "--batch-size must be"),
    (["--drafter", "ngram", "--method", "sample", "--top-p", "0"], "top_p"),
])
def test_eval_bad_input(trained, capsys, argv, message):
  _, workdir = trained
  code, out, err = run(capsys, "eval", "--model", workdir / "target" / "final",
                       "--data", workdir / "data", *argv)
  assert code == 2, err
  assert err.startswith("specdec eval: error:") and message in err, err
  assert len(err.strip().splitlines()) == 1


def test_eval_missing_data_dir(capsys, tmp_path):
  code, out, err = run(capsys, "eval", "--model", "config:t5_1_1_tiny", "--data",
                       tmp_path / "nope")
  assert code == 2 and "is not a directory" in err


# ----------------------------------------------------------------------------- helpers


def test_corpus_scores():
  refs = ["the old dog sleeps", "a big red house"]
  perfect = evaluation.corpus_scores(refs, refs)
  assert perfect["bleu"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)
  worse = evaluation.corpus_scores(["the dog", "a house"], refs)
  assert 0.0 <= worse["bleu"] < 100.0 and 0.0 < worse["chrf"] < 100.0
  with pytest.raises(evaluation.EvaluationError):
    evaluation.corpus_scores(["x"], refs)


def test_resolve_sampling_and_drafter_errors():
  assert evaluation.resolve_sampling("greedy").is_greedy
  assert not evaluation.resolve_sampling("sample").is_greedy
  with pytest.raises(evaluation.EvaluationError, match="conflicts"):
    evaluation.resolve_sampling("greedy", sd.Sampling(temperature=0.7))
  with pytest.raises(OptionError, match="method"):
    evaluation.resolve_sampling("beam")
  target = sd.Model(config=sd.get_config("t5_1_1_tiny"), params={})
  with pytest.raises(evaluation.EvaluationError, match="train split"):
    evaluation.resolve_drafter("ngram", target, None)
  with pytest.raises(OptionError, match="drafter must be"):
    evaluation.resolve_drafter("bigram", target, None)
  assert evaluation.resolve_drafter(None, target, None) is None
  assert isinstance(evaluation.resolve_drafter("prompt-lookup", target, None),
                    sd.PromptLookupDrafter)
