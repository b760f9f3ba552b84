"""The demo pipeline's stages for a larger target: aligned drafters that start from existing
models ("init"), training on a prefix of the data ("examples"), the recipe's stages as
"all", and a configurable bundle with its wheel-size check; on a tiny synthetic recipe."""

import json
import shutil

import numpy as np
import pytest
import specdec_command as cli
from test_cli_train_eval import TRAIN, run, write_recipe
from test_prepare import write_dictionary

import specdec_jax as sd
from specdec_jax.drafters.heads import fingerprint
from specdec_jax.io.reports import read_json
from specdec_jax_lab import demo
from specdec_jax_lab.errors import TrainingError

ALIGN = {**TRAIN, "steps": 6, "checkpoint_every": 6}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  """data, target and drafter of the tiny recipe; the drafter also saved outside the
  workdir, as a model an "init" names by path."""
  tmp = tmp_path_factory.mktemp("pipeline")
  recipe = write_recipe(tmp, write_dictionary(tmp / "de-en"))
  workdir = tmp / "work"
  assert cli.main(["train", "--recipe", str(recipe), "--workdir", str(workdir),
                   "--stages", "data,target,drafter"]) == 0
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
