"""`specdec train` / `specdec eval` on a tiny recipe over a synthetic dictionary, the pure
helpers of specdec_jax_lab.evaluation, and the demo pipeline's stages for a larger target
(aligned drafters that start from existing models ("init"), training on a prefix of the
data ("examples"), the recipe's stages as "all", a configurable bundle with its wheel-size
check), which start from the same trained workdir."""

import json
import math
import shutil

import numpy as np
import pytest
import specdec_command as cli
from helpers import DEMO_PAIRS_FILE
from test_prepare import write_dictionary

import specdec_jax as sd
from specdec_jax.drafters.heads import fingerprint
from specdec_jax.errors import InputError, SamplingError
from specdec_jax.io.reports import read_json
from specdec_jax_lab import demo, evaluation
from specdec_jax_lab.errors import TrainingError

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_train_rerun_skips_finished_stages(trained, capsys):
  recipe, workdir = trained
  before = (workdir / "target" / "final").stat().st_mtime_ns
  code, out, err = run(capsys, "train", "--recipe", recipe, "--workdir", workdir,
                       "--stages", "target")
  assert code == 0, err
  assert out.startswith(f"target: {workdir / 'target' / 'final'}")
  assert (workdir / "target" / "final").stat().st_mtime_ns == before


@pytest.mark.slow
def test_train_more_steps_continues_and_restarts_downstream(trained, capsys, tmp_path):
  """Raising target.steps continues the target from its checkpoint; the aligned drafter,
  trained from the old target, starts over on the new target's outputs."""
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
  assert code == 1 and "past steps=20" in err and "Traceback" not in err
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
  assert [json.loads(s)["step"] for s in after.splitlines()] == [10] and after != before


@pytest.mark.parametrize("argv, message", [
    (["--stages", "data,nope"], "unknown stage"),
    (["--stages", ""], "unknown stage"),
])
def test_train_bad_stages(trained, capsys, tmp_path, argv, message):
  recipe, _ = trained
  code, out, err = run(capsys, "train", "--recipe", recipe, "--workdir", tmp_path, *argv)
  assert code == 1 and message in err
  assert err.startswith("specdec train: error:") and len(err.strip().splitlines()) == 1


def test_train_bad_recipes(capsys, tmp_path):
  def check(recipe_path, message, stages="data,target"):
    code, out, err = run(capsys, "train", "--recipe", recipe_path, "--workdir",
                         tmp_path / "w", "--stages", stages)
    assert code == 1, err
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
                             evaluation.EvalSettings(limit=LIMIT, batch_size=8))


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
  assert "]: autoregressive, Greedy()" in out


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
  assert stats["tokens"] == result["generated_tokens"] and stats["gamma"] == 3


def test_eval_ngram_drafter_fitted_on_train_split(trained, capsys, baseline):
  """In the library, and through `specdec eval`: a method whose `drafter_role` is a drafter
  takes --drafter ngram fitted on the data's train split (not a model to load)."""
  _, workdir = trained
  target = sd.load(str(workdir / "target" / "final"))
  result = evaluation.evaluate(target, workdir / "data",
                               evaluation.EvalSettings(gamma=2, limit=LIMIT, batch_size=8),
                               drafter="ngram")
  assert result["hypotheses"] == baseline["hypotheses"]
  assert result["stats"]["drafted"] > 0
  command = eval_json(capsys, workdir, "--drafter", "ngram", "--gamma", 2)
  assert command["hypotheses"] == baseline["hypotheses"]
  assert command["stats"]["drafted"] == result["stats"]["drafted"]


def test_eval_beam_with_a_drafter_is_speculative_beam_search(trained, capsys):
  """--method beam --drafter X is experimental.SpeculativeBeam, its drafter loaded as its
  `drafter_role` says: the hypotheses are beam search's."""
  _, workdir = trained
  beam = eval_json(capsys, workdir, "--method", "beam", "--num-beams", 2)
  drafted = eval_json(capsys, workdir, "--method", "beam", "--num-beams", 2, "--drafter",
                      workdir / "drafter" / "final", "--gamma", 2)
  assert drafted["method"] == "speculative-beam" and beam["method"] == "beam"
  assert drafted["hypotheses"] == beam["hypotheses"]


@pytest.mark.parametrize("argv, message", [
    (["--gamma", "3"], "--gamma only applies"),
    (["--limit", "0"], "--limit must be"),
    (["--split", "nope"], "no split 'nope'"),
    (["--sampling", "greedy", "--temperature", "0.5"], "only apply with --sampling sample"),
    (["--batch-size", "0"], "--batch-size must be"),
    (["--drafter", "ngram", "--sampling", "sample", "--top-p", "0"], "top_p"),
    (["--fallback-threshold", "0.5"],
     "--fallback-threshold only applies to --method bild, not --method autoregressive"),
    (["--method", "bild"], "needs the small model"),
    (["--method", "bild", "--drafter", "early-exit:1"], "at least 2 decoder layers"),
    (["--method", "blockwise", "--drafter", "ngram"], "drop --drafter"),
    (["--method", "blockwise", "--rescoring", "ngram"], "needs a --rescorer"),
    (["--method", "blockwise", "--gamma", "2"],
     "--gamma only applies to --method speculative / speculative-beam, not --method blockwise"),
    (["--method", "bild", "--drafter", "x", "--lattice-k", "2", "--lenience", "0.5"],
     "--lenience, --lattice-k only apply to --method speculative / blockwise, not --method bild"),
    (["--method", "speculative"], "needs a drafter"),
    (["--method", "autoregressive", "--drafter", "ngram"], "drop --drafter"),
    (["--drafter", "early-exit:1"], "add --method bild"),
])
def test_eval_bad_input(trained, capsys, argv, message):
  _, workdir = trained
  code, out, err = run(capsys, "eval", "--model", workdir / "target" / "final",
                       "--data", workdir / "data", *argv)
  assert code == 1, err
  assert err.startswith("specdec eval: error:") and message in err, err
  assert len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- BiLD, blockwise


@pytest.fixture(scope="module")
def heads_file(trained, tmp_path_factory):
  """Random prediction heads for the trained target (greedy output must not depend on them)."""
  _, workdir = trained
  target = sd.load(str(workdir / "target" / "final"))
  return sd.save_heads(tmp_path_factory.mktemp("heads") / "heads.safetensors",
                       sd.init_heads(target, 4, rng=0))


@pytest.mark.slow
def test_eval_bild_limit_and_lossy_point(trained, capsys, baseline):
  _, workdir = trained
  drafter = workdir / "drafter" / "final"
  large_only = eval_json(capsys, workdir, "--method", "bild", "--drafter", drafter,
                         "--fallback-threshold", "1.0")
  assert large_only["hypotheses"] == baseline["hypotheses"]   # the large model decides all
  assert large_only["stats"]["drafter_tokens"] == 0
  assert large_only["settings"]["method"] == "bild"
  small_led = eval_json(capsys, workdir, "--method", "bild", "--drafter", drafter,
                        "--fallback-threshold", "0.0", "--rollback-threshold", "inf",
                        "--max-small-steps", "64")
  assert small_led["stats"]["target_tokens"] == 0 and small_led["stats"]["drafter_tokens"] > 0
  assert small_led["hypotheses"] != baseline["hypotheses"]   # the 30-step drafter is not the target
  assert small_led["stats"]["lossy"] is True


@pytest.mark.slow
def test_eval_blockwise_with_each_flag_is_the_target_greedy(trained, capsys, baseline,
                                                            heads_file):
  """eval's blockwise flags, each in one of two runs (an n-gram rescorer fitted on the data
  dir, a model rescorer): the target's greedy output. Every variant of the lab's table:
  test_sweep_blockwise_table."""
  _, workdir = trained
  common = ["--method", "blockwise", "--heads", heads_file, "--lattice-k", "3"]
  for extra in (["--num-drafts", "2", "--rescoring", "ngram", "--rescorer", "data"],
                ["--rescoring", "neural", "--rescorer", workdir / "drafter" / "final"]):
    result = eval_json(capsys, workdir, *common, *extra)
    assert result["hypotheses"] == baseline["hypotheses"], extra
    assert result["stats"]["mean_max_run"] >= 1.0     # some rounds drafted
    assert 0.0 <= result["stats"]["repeated_draft_rate"] <= 1.0


@pytest.mark.slow
def test_sweep_bild_writes_reports_and_resumes(trained, capsys, tmp_path, baseline):
  _, workdir = trained
  argv = ["sweep-bild", "--model", workdir / "target" / "final", "--data", workdir / "data",
          "--limit", 8, "--batch-size", 4, "--repeats", 1, "--no-progress",
          "--small", f"tiny={workdir / 'drafter' / 'final'}", "--fallback", "0.0,1.0",
          "--rollback", "inf", "--gammas", "2", "--out", tmp_path]
  code, out, err = run(capsys, *argv)
  assert code == 0, err
  result = json.loads((tmp_path / "bild.json").read_text())
  points = {p["label"]: p for p in result["points"]}
  assert set(points) == {"tiny/fb0/rbinf", "tiny/fb1/rbinf", "speculative/tiny/g2"}
  base = result["baselines"]["target, greedy"]["bleu"]
  for label in ("tiny/fb1/rbinf", "speculative/tiny/g2"):   # exact: the target's BLEU
    assert points[label]["bleu"] == base and points[label]["bleu_drop"] == 0.0
  assert points["tiny/fb0/rbinf"]["fallback_rate"] < points["tiny/fb1/rbinf"]["fallback_rate"]
  assert all(p["speedup"] > 0 for p in result["points"])
  assert "## Table 1 layout" in out and "no BLEU drop" in out
  assert (tmp_path / "bild.png").stat().st_size > 0 and (tmp_path / "bild.md").is_file()
  code, out, err = run(capsys, *argv, "--resume")   # nothing left to measure: same entries
  assert code == 0, err
  again = json.loads((tmp_path / "bild.json").read_text())
  assert [p["wall_s"] for p in again["points"]] == [p["wall_s"] for p in result["points"]]
  code, out, err = run(capsys, *argv[:-2], "--limit", 4, "--out", tmp_path, "--resume")
  assert code == 1 and "other settings (limit)" in err


@pytest.mark.slow
def test_sweep_blockwise_table(trained, capsys, tmp_path, heads_file):
  _, workdir = trained
  code, out, err = run(capsys, "sweep-blockwise", "--model", workdir / "target" / "final",
                       "--data", workdir / "data", "--limit", 8, "--batch-size", 4,
                       "--repeats", 1, "--no-progress", "--heads", heads_file,
                       "--lattice-k", 2, "--num-drafts", 2, "--rescorer",
                       workdir / "drafter" / "final", "--exact", "off", "--out", tmp_path)
  assert code == 0, err
  result = json.loads((tmp_path / "blockwise.json").read_text())
  assert result["config"]["exact"] == "off"
  assert all(p["settings"]["exact"] is False for p in result["points"])
  base = result["baselines"]["target, greedy"]["bleu"]
  assert [p["label"] for p in result["points"]] == [
      "base", "ngram", "neural", "parallel base p=2", "parallel ngram p=2", "oracle k=2"]
  assert all(p["bleu"] == base for p in result["points"])    # greedy: every variant is exact
  oracle = result["points"][-1]
  assert oracle["oracle_tokens_per_target_call"] >= oracle["block_efficiency"]
  assert set(result["lattice_ms"]) == {"p=1", "p=2"}
  assert "lattice dynamic program" in out


def test_eval_missing_data_dir(capsys, tmp_path):
  code, out, err = run(capsys, "eval", "--model", "config:t5_1_1_tiny", "--data",
                       tmp_path / "nope")
  assert code == 1 and "is neither a .jsonl file of pairs nor a directory" in err


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
  with pytest.raises(SamplingError, match="method"):
    evaluation.resolve_sampling("beam")
  target = sd.Model(config=sd.get_config("t5_1_1_tiny"), params={})
  with pytest.raises(evaluation.EvaluationError, match="train split"):
    evaluation.resolve_drafter("ngram", target, None)
  with pytest.raises(InputError, match="drafter must be"):
    evaluation.resolve_drafter("bigram", target, None)
  assert evaluation.resolve_drafter(None, target, None) is None
  assert isinstance(evaluation.resolve_drafter("prompt-lookup", target, None),
                    sd.PromptLookupDrafter)


def test_eval_settings_are_checked_where_they_are_made():
  """`EvalSettings` refuses a bad size or a sampling that conflicts with its method when it
  is made, before `evaluate` loads any data."""
  for field in ("batch_size", "gamma", "max_new_tokens", "limit"):
    with pytest.raises(evaluation.EvaluationError, match=f"{field} must be an integer >= 1"):
      evaluation.EvalSettings(**{field: 0})
  with pytest.raises(evaluation.EvaluationError, match="batch_size must be an integer"):
    evaluation.EvalSettings(batch_size=2.5)
  with pytest.raises(evaluation.EvaluationError, match="conflicts"):
    evaluation.EvalSettings(sampling=sd.Sampling(temperature=0.7))
  assert evaluation.EvalSettings(method="sample", sampling=sd.Sampling(top_p=0.8)).gamma == 5


# ----------------------------------------------------------------------------- from a fresh clone

SHIPPED_PAIRS = DEMO_PAIRS_FILE


@pytest.mark.slow
def test_eval_and_sweep_run_on_the_shipped_pairs(capsys, tmp_path):
  """`specdec eval` and `specdec sweep-bild` on tests/data/demo_test_pairs.jsonl with the
  bundled demo pair: no prepared data dir, no dictionary, no recipe; timings exclude
  compilation by default and speedups divide by the plain baseline."""
  code, out, err = run(capsys, "eval", "--model", "demo-de-en/target", "--data", SHIPPED_PAIRS,
                       "--drafter", "demo-de-en/drafter", "--gamma", 2, "--limit", 4,
                       "--batch-size", 2, "--json")
  assert code == 0, err
  result = json.loads(out)
  assert result["pairs"] == 4 and result["includes_compile"] is False
  assert result["bleu"] > 0 and result["stats"]["tokens"] == result["generated_tokens"]
  assert result["settings"]["data"] == str(SHIPPED_PAIRS)
  code, out, err = run(capsys, "sweep-bild", "--data", SHIPPED_PAIRS, "--limit", 4,
                       "--batch-size", 2, "--repeats", 1, "--no-progress",
                       "--small", "aligned=demo-de-en/drafter", "--fallback", "0.5",
                       "--rollback", "5", "--gammas", "2", "--out", tmp_path)
  assert code == 0, err
  sweep = json.loads((tmp_path / "bild.json").read_text())
  points = {p["label"]: p for p in sweep["points"]}
  assert set(points) == {"aligned/fb0.5/rb5", "speculative/aligned/g2"}
  spec = points["speculative/aligned/g2"]
  assert spec["exact"] and spec["exact_cost"] == pytest.approx(
      spec["exact_baseline_ms_per_token"] / spec["baseline_ms_per_token"])
  assert spec["speedup"] == pytest.approx(spec["baseline_ms_per_token"] / spec["ms_per_token"])
  assert "natural call width" in out


def test_jsonl_data_errors_are_clear(capsys, tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"de": "Hallo."}\n')
  code, _, err = run(capsys, "eval", "--model", "demo-de-en/target", "--data", bad)
  assert code == 1 and "bad.jsonl' line 1: expected an object with \"de\" and \"en\"" in err
  code, _, err = run(capsys, "eval", "--model", "demo-de-en/target", "--data",
                     tmp_path / "missing.jsonl")
  assert code == 1 and "no such file" in err


# ----------------------------------------------------------------------------- demo stages

ALIGN = {**TRAIN, "steps": 6, "checkpoint_every": 6}


@pytest.fixture(scope="module")
def base(trained, tmp_path_factory):
  """A copy of the `trained` workdir (data, target and drafter of the tiny recipe; the
  demo stages' refusals run in it, apart from the tests above), its recipe, and the
  drafter also saved outside the workdir, as a model an "init" names by path."""
  recipe, workdir = trained
  tmp = tmp_path_factory.mktemp("pipeline")
  workdir = shutil.copytree(workdir, tmp / "work")
  init = shutil.copytree(workdir / "drafter" / "final", tmp / "small-model")
  return json.loads(recipe.read_text()), workdir, init


def with_sections(tmp_path, base_recipe, **sections):
  path = tmp_path / "recipe.json"
  path.write_text(json.dumps({**base_recipe, **sections}))
  return path


def test_shipped_recipes_keep_their_stages():
  """configs/demo runs the stages it always ran; configs/demo-large its own (all valid)."""
  from specdec_jax_lab.commands import train
  demo_recipe = read_json(demo.REPO / "configs/demo/train.json", "recipe")
  assert demo.recipe_stages(demo_recipe) == (
      "data", "target", "drafter", "aligned", "distilled", "heads", "early_exit", "bundle")
  large = read_json(demo.REPO / "configs/demo-large/train.json", "recipe")
  assert demo.recipe_stages(large) == (
      "data", "target", "aligned_small", "aligned_mid", "heads", "bundle")
  assert large["aligned_small"]["init"] == "demo-de-en/drafter"
  assert large["aligned_mid"]["init"] == "demo-de-en/target"
  for path, recipe in (("configs/demo/train.json", demo_recipe),
                       ("configs/demo-large/train.json", large)):
    train.read_recipe(str(demo.REPO / path), demo.recipe_stages(recipe))


@pytest.mark.slow
def test_aligned_from_init_on_a_prefix(base, tmp_path, capsys):
  """aligned_small starts from the init's weights, trains on the first `examples` pairs
  against the target's greedy outputs, and records the init by fingerprint; a stage with
  more examples extends the cached outputs without changing the first rows."""
  recipe, workdir, init = base
  workdir = shutil.copytree(workdir, tmp_path / "work")
  path = with_sections(tmp_path, recipe, aligned_small={"init": str(init), "examples": 20,
                                                         **ALIGN})
  code, out, err = run(capsys, "train", "--recipe", path, "--workdir", workdir,
                       "--stages", "aligned_small")
  assert code == 0, err
  log = json.loads((workdir / "aligned_small" / "final" / "train_log.json").read_text())
  start = sd.load(str(init))
  assert log["upstream"] == {"target": TRAIN["steps"], "init": str(init),
                             "init_fingerprint": fingerprint(start), "examples": 20}
  cache = np.load(workdir / "aligned_targets.npz")
  assert cache["targets"].shape[0] == 20
  target = sd.load(str(workdir / "target" / "final"))
  inputs = np.load(workdir / "data" / "train.npz")["inputs"]
  np.testing.assert_array_equal(cache["targets"][:4],
                                demo.greedy_targets(target, inputs[:4], cache["targets"].shape[1],
                                                    progress=False))
  # fine-tuned from the init: same architecture, moved weights
  aligned = sd.load(str(workdir / "aligned_small" / "final"))
  assert aligned.config.emb_dim == start.config.emb_dim
  assert fingerprint(aligned) != fingerprint(start)

  first = cache["targets"].copy()
  finished = (workdir / "aligned_small" / "final").stat().st_mtime_ns
  path = with_sections(tmp_path, recipe,
                       aligned_small={"init": str(init), "examples": 20, **ALIGN},
                       aligned_mid={"init": "target", "examples": 36, **ALIGN})
  code, out, err = run(capsys, "train", "--recipe", path, "--workdir", workdir,
                       "--stages", "aligned_small,aligned_mid")
  assert code == 0, err
  grown = np.load(workdir / "aligned_targets.npz")["targets"]
  assert grown.shape[0] == 36
  np.testing.assert_array_equal(grown[:20], first)
  log = json.loads((workdir / "aligned_mid" / "final" / "train_log.json").read_text())
  assert log["upstream"] == {"target": TRAIN["steps"], "examples": 36}   # a stage: its steps
  # aligned_small was current (its 20 examples' outputs unchanged): not retrained
  assert (workdir / "aligned_small" / "final").stat().st_mtime_ns == finished
  # other training pairs: the stage starts over on them
  path = with_sections(tmp_path, recipe, aligned_small={"init": str(init), "examples": 24,
                                                         **ALIGN})
  code, out, err = run(capsys, "train", "--recipe", path, "--workdir", workdir,
                       "--stages", "aligned_small")
  assert code == 0, err
  log = json.loads((workdir / "aligned_small" / "final" / "train_log.json").read_text())
  assert log["upstream"]["examples"] == 24
  assert (workdir / "aligned_small" / "final").stat().st_mtime_ns != finished
  assert out.splitlines()[0].startswith(f"aligned_small: {workdir / 'aligned_small' / 'final'}")


def test_bundled_init_with_other_pieces_is_refused(base, tmp_path):
  """demo-de-en/drafter's token ids mean other words than this workdir's tiny vocabulary."""
  recipe, workdir, _ = base
  path = with_sections(tmp_path, recipe,
                       aligned_small={"init": "demo-de-en/drafter", **ALIGN})
  with pytest.raises(TrainingError, match="other pieces"):
    demo.run_pipeline(path, workdir, stages=("aligned_small",))


def test_recipe_errors_for_the_new_stages(base, tmp_path, capsys):
  recipe, workdir, init = base
  for sections, stages, message in [
      ({"aligned_mid": dict(ALIGN)}, "aligned_mid", "needs an \"init\""),
      ({"aligned_small": {"init": str(init), "exampels": 3, **ALIGN}}, "aligned_small",
       "unknown key(s) exampels"),
      ({"bundle": {"model": {}}}, "bundle", "section 'bundle': unknown key(s) model"),
  ]:
    path = with_sections(tmp_path, recipe, **sections)
    code, out, err = run(capsys, "train", "--recipe", path, "--workdir", workdir,
                         "--stages", stages)
    assert code == 1 and message in err and "Traceback" not in err, err
  # "aligned" with an init needs no drafter section; without one it does
  from specdec_jax_lab.commands import train
  no_drafter = {k: v for k, v in recipe.items() if k != "drafter"}
  train.read_recipe(str(with_sections(tmp_path, no_drafter,
                                      aligned={"init": str(init), **ALIGN})), ("aligned",))
  code, out, err = run(capsys, "train", "--recipe",
                       with_sections(tmp_path, no_drafter, aligned=dict(ALIGN)),
                       "--workdir", workdir, "--stages", "aligned")
  assert code == 1 and "no section for stage(s) drafter" in err, err


@pytest.mark.slow
def test_all_is_the_recipes_stages_and_bundle_ships_what_it_names(base, tmp_path, capsys):
  """'all' of a recipe without drafter sections runs data, target, its aligned stage, heads
  and bundle; the bundle holds the named models (bfloat16), the heads, the tokenizer, and
  refuses assets past its wheel limit."""
  recipe, workdir, init = base
  workdir = shutil.copytree(workdir, tmp_path / "work")
  assets = tmp_path / "pkg" / "assets" / "tiny-large"
  sections = {k: v for k, v in recipe.items() if k != "drafter"}
  path = with_sections(
      tmp_path, sections, aligned_small={"init": str(init), "examples": 16, **ALIGN},
      heads={"num_heads": 3, "hidden_dim": 8, "examples": 16, **ALIGN, "batch_size": 8},
      bundle={"assets": str(assets), "models": {"target": "target", "drafter": "aligned_small"},
              "heads": "target"})
  code, out, err = run(capsys, "train", "--recipe", path, "--workdir", workdir)
  assert code == 0, err
  assert "stages data, target, aligned_small, heads, bundle done" in err
  assert not (workdir / "aligned").exists() and not (workdir / "distilled").exists()
  assert sorted(p.name for p in assets.iterdir()) == ["drafter", "spiece.model", "target"]
  assert {p.stat().st_mode & 0o777 for p in assets.rglob("*") if p.is_file()} == {0o644}
  target = sd.load(str(assets / "target"), dtype=None)
  import jax
  assert {str(x.dtype) for x in jax.tree_util.tree_leaves(target.params)} == {"bfloat16"}
  heads = sd.load_heads(str(assets / "target"), target)
  assert heads.num_heads == 3 and heads.hidden_dim == 8
  log = json.loads((workdir / "heads" / "final" / "train_log.json").read_text())
  assert log["hidden_dim"] == 8

  size = demo.compressed_mb(assets)
  assert 0 < size < sum(p.stat().st_size for p in assets.rglob("*") if p.is_file()) / 1e6
  with pytest.raises(TrainingError, match="past the 0.001 MB wheel limit"):
    demo.bundle(workdir, tmp_path / "other", models={"target": "target"}, max_wheel_mb=0.001)
  with pytest.raises(TrainingError, match="no final model for stage.s. aligned_mid"):
    demo.bundle(workdir, tmp_path / "other", models={"drafter": "aligned_mid"})
