"""The bundled De→En demo pair: data, target, drafters (references / aligned / distilled), bundle.

Each stage writes its result under `workdir` and is skipped when that result
exists and is current, so `run_pipeline` can be rerun or resumed after an
interruption (the training stages also resume from their Orbax checkpoints
mid-stage). A training stage's result is current when it was trained for the
recipe's `steps` from the current upstream models: raising `steps` continues
training from the last checkpoint; a retrained target or drafter restarts the
aligned and distilled stages (and regenerates the target's greedy outputs).

    specdec train --recipe configs/demo/train.json --workdir runs/demo --stages all
"""

from __future__ import annotations

import json
import pathlib
import shutil
import time

import numpy as np

import specdec_jax as sd
from specdec_jax import config as config_lib
from specdec_jax.decoding.autoregressive import generate
from specdec_jax.models.model import Model, init_model
from specdec_jax.tools import training
from specdec_jax.tools.batching import padded_batches
from specdec_jax.tools.data import prepare
from specdec_jax.tools.errors import TrainingError
from specdec_jax.tools.report import make_dirs, read_json

STAGES = ("data", "target", "drafter", "aligned", "distilled", "bundle")
ASSETS = pathlib.Path(__file__).resolve().parents[1] / "assets" / "demo-de-en"
REPO = pathlib.Path(__file__).resolve().parents[2]


def _train_config(d: dict) -> training.TrainConfig:
  keys = {f for f in training.TrainConfig.__dataclass_fields__}
  return training.TrainConfig(**{k: v for k, v in d.items() if k in keys})


def _save_final(path: pathlib.Path, model: Model, seconds: float, history: list, steps: int,
                upstream: dict) -> None:
  from specdec_jax.io.checkpoints import save_checkpoint
  save_checkpoint(str(path), model.config, model.params)
  (path / "train_log.json").write_text(json.dumps(
      {"steps": steps, "upstream": upstream, "seconds": seconds,
       "num_params": model.num_params(), "history": history[-20:]}, indent=1))


def _final_log(workdir: pathlib.Path, name: str) -> dict | None:
  path = workdir / name / "final" / "train_log.json"
  return json.loads(path.read_text()) if path.exists() else None


def _upstream(workdir: pathlib.Path, names) -> dict:
  """Which upstream models a stage was trained from: {name: their steps}."""
  return {n: (_final_log(workdir, n) or {}).get("steps") for n in names}


def greedy_targets(model: Model, inputs: np.ndarray, max_len: int, batch_size: int = 512,
                   progress: bool = True) -> np.ndarray:
  """The model's greedy outputs for every input, as training targets [N, max_len]."""
  from tqdm.auto import tqdm
  batches = padded_batches(inputs, batch_size)   # one compiled shape
  return np.concatenate([np.asarray(generate(model, b.tokens, max_len).tokens)[:b.real]
                         for b in tqdm(batches, desc="greedy targets", disable=not progress)])


def _stage_train(name, workdir, recipe, data, make_init, teacher=None, targets=None,
                 upstream=()):
  """Train stage `name` from `make_init()` unless its final checkpoint is current.

  Current = trained for the recipe's steps and settings from the same upstream
  models. Stale because of `steps`: training continues from the stage's
  checkpoints. Stale because another setting (optimizer, learning rate, ...) or
  an upstream model changed: the stage's checkpoints are discarded.
  """
  cfg = _train_config(recipe[name])
  final = workdir / name / "final"
  upstream = _upstream(workdir, upstream)
  if training.changed_settings(workdir / name, cfg):   # e.g. another optimizer: start over
    shutil.rmtree(workdir / name)
  log = _final_log(workdir, name)
  if log is not None and log.get("steps") == cfg.steps and log.get("upstream", {}) == upstream:
    return sd.load(str(final))
  if log is not None and log.get("upstream", {}) != upstream:
    shutil.rmtree(workdir / name)
  init = make_init()
  start = time.time()
  model, history = training.train(init, data["inputs"], data["targets"] if targets is None
                                  else targets, cfg, workdir / name, teacher=teacher)
  model = model.replace(config=model.config.replace(dropout_rate=0.0))
  # The old final stays until the new one is complete (a failed run must not lose it).
  fresh = final.with_name("final.tmp")
  shutil.rmtree(fresh, ignore_errors=True)
  _save_final(fresh, model, time.time() - start, history, cfg.steps, upstream)
  shutil.rmtree(final, ignore_errors=True)
  fresh.rename(final)
  return model


def run_pipeline(recipe_path: str | pathlib.Path, workdir: str | pathlib.Path,
                 stages=STAGES) -> dict:
  recipe = read_json(recipe_path, "recipe")
  workdir = pathlib.Path(workdir)
  make_dirs(workdir)
  stages = STAGES if stages in ("all", None) else tuple(stages)
  unknown = set(stages) - set(STAGES)
  if unknown:
    raise TrainingError(f"unknown stages {sorted(unknown)}; stages: {', '.join(STAGES)}")
  data_dir = workdir / "data"
  if "data" in stages and not (data_dir / "meta.json").exists():
    prepare.prepare_de_en(data_dir, **recipe["data"])
  data = prepare.load_split(data_dir, "train")
  results = {}

  def config_for(name):
    return config_lib.get_config(REPO / recipe[name]["config"])

  for name, seed in (("target", 0), ("drafter", 1)):
    if name in stages:
      results[name] = _stage_train(
          name, workdir, recipe, data,
          lambda name=name, seed=seed: init_model(config_for(name),
                                                  recipe[name].get("seed", seed)))
  if "aligned" in stages or "distilled" in stages:
    target = results.get("target") or sd.load(str(workdir / "target" / "final"))
    drafter = results.get("drafter") or sd.load(str(workdir / "drafter" / "final"))
    trainable = drafter.replace(config=drafter.config.replace(
        dropout_rate=config_for("drafter").dropout_rate))
    if "aligned" in stages:
      cache = workdir / "aligned_targets.npz"
      target_steps = _upstream(workdir, ["target"])["target"]
      if not cache.exists() or int(np.load(cache).get("target_steps", -1)) != target_steps:
        np.savez(cache, targets=greedy_targets(target, data["inputs"],
                                               data["targets"].shape[1]),
                 target_steps=-1 if target_steps is None else target_steps)
      aligned_targets = np.load(cache)["targets"]
      results["aligned"] = _stage_train("aligned", workdir, recipe, data, lambda: trainable,
                                        targets=aligned_targets,
                                        upstream=("target", "drafter"))
    if "distilled" in stages:
      results["distilled"] = _stage_train("distilled", workdir, recipe, data,
                                          lambda: trainable, teacher=target,
                                          upstream=("target", "drafter"))
  if "bundle" in stages:
    bundle(workdir)
  return results


def bundle(workdir: str | pathlib.Path, assets: pathlib.Path = ASSETS,
           drafter_stage: str = "aligned") -> None:
  """Ship target (bfloat16), the aligned drafter (bfloat16) and the SentencePiece model."""
  from specdec_jax.io.checkpoints import save_checkpoint
  workdir = pathlib.Path(workdir)
  assets.mkdir(parents=True, exist_ok=True)
  for name, stage in (("target", "target"), ("drafter", drafter_stage)):
    model = sd.load(str(workdir / stage / "final"))
    dest = assets / name
    if dest.exists():
      shutil.rmtree(dest)
    save_checkpoint(str(dest), model.config, model.params, dtype="bfloat16")
  shutil.copy(workdir / "data" / "spiece.model", assets / "spiece.model")
