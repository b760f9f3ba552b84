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

STAGES = ("data", "target", "drafter", "aligned", "distilled", "heads", "early_exit", "bundle")
#: Recipe keys a stage reads besides its `TrainConfig` fields.
STAGE_KEYS = {"target": {"config"}, "drafter": {"config"}, "heads": {"num_heads"},
              "early_exit": {"exit_layer"}}
ASSETS = pathlib.Path(__file__).resolve().parents[1] / "assets" / "demo-de-en"
REPO = pathlib.Path(__file__).resolve().parents[2]


def _target_outputs(workdir: pathlib.Path, target: Model, inputs: np.ndarray,
                    max_len: int) -> np.ndarray:
  """The target's greedy outputs for the training inputs, cached per target version."""
  cache = workdir / "aligned_targets.npz"
  target_steps = _upstream(workdir, ["target"])["target"]
  if not cache.exists() or int(np.load(cache).get("target_steps", -1)) != target_steps:
    np.savez(cache, targets=greedy_targets(target, inputs, max_len),
             target_steps=-1 if target_steps is None else target_steps)
  return np.load(cache)["targets"]


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
                 upstream=(), objective=None):
  """Train model stage `name` from `make_init()` unless its final checkpoint is current."""
  def train(init, cfg):
    return training.train(init, data["inputs"], data["targets"] if targets is None else targets,
                          cfg, workdir / name, teacher=teacher, objective=objective)

  def save(path, model, seconds, history, steps, upstream):
    model = model.replace(config=model.config.replace(dropout_rate=0.0))
    _save_final(path, model, seconds, history, steps, upstream)
    return model

  return _run_stage(name, workdir, recipe, make_init, train, save,
                    lambda final: sd.load(str(final)), upstream)


def _run_stage(name, workdir, recipe, make_init, train, save, load, upstream=()):
  """Run a training stage unless its final result is current.

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
    return load(final)
  if log is not None and log.get("upstream", {}) != upstream:
    shutil.rmtree(workdir / name)
  start = time.time()
  result, history = train(make_init(), cfg)
  # The old final stays until the new one is complete (a failed run must not lose it).
  fresh = final.with_name("final.tmp")
  shutil.rmtree(fresh, ignore_errors=True)
  result = save(fresh, result, time.time() - start, history, cfg.steps, upstream)
  shutil.rmtree(final, ignore_errors=True)
  fresh.rename(final)
  return result


def _stage_heads(workdir, recipe, data, target, targets):
  """Prediction heads for the target (frozen), fitted to its own greedy outputs."""
  from specdec_jax.drafters.heads import init_heads, load_heads, save_heads
  num_heads = int(recipe["heads"]["num_heads"])
  log = _final_log(workdir, "heads")
  if (workdir / "heads").exists() and (log or {}).get("num_heads", num_heads) != num_heads:
    shutil.rmtree(workdir / "heads")        # other heads: their checkpoints do not fit

  def train(heads, cfg):
    heads, _, history = training.train_heads(target, heads, data["inputs"], targets, cfg,
                                             workdir / "heads")
    return heads, history

  def save(path, heads, seconds, history, steps, upstream):
    save_heads(path, heads)
    (path / "train_log.json").write_text(json.dumps(
        {"steps": steps, "upstream": upstream, "seconds": seconds, "num_heads": num_heads,
         "history": history[-20:]}, indent=1))
    return heads

  return _run_stage("heads", workdir, recipe,
                    lambda: init_heads(target, num_heads, rng=recipe["heads"].get("seed", 0)),
                    train, save, lambda final: load_heads(final, target), upstream=("target",))


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
  if {"aligned", "distilled", "heads", "early_exit"} & set(stages):
    target = results.get("target") or sd.load(str(workdir / "target" / "final"))
  if "aligned" in stages or "distilled" in stages:
    drafter = results.get("drafter") or sd.load(str(workdir / "drafter" / "final"))
    trainable = drafter.replace(config=drafter.config.replace(
        dropout_rate=config_for("drafter").dropout_rate))
    if "aligned" in stages:
      results["aligned"] = _stage_train(
          "aligned", workdir, recipe, data, lambda: trainable,
          targets=_target_outputs(workdir, target, data["inputs"], data["targets"].shape[1]),
          upstream=("target", "drafter"))
    if "distilled" in stages:
      results["distilled"] = _stage_train("distilled", workdir, recipe, data,
                                          lambda: trainable, teacher=target,
                                          upstream=("target", "drafter"))
  if "heads" in stages:
    results["heads"] = _stage_heads(
        workdir, recipe, data, target,
        _target_outputs(workdir, target, data["inputs"], data["targets"].shape[1]))
  if "early_exit" in stages:
    exit_layer = int(recipe["early_exit"].get("exit_layer", 1))
    results["early_exit"] = _stage_train(
        "early_exit", workdir, recipe, data, lambda: target, upstream=("target",),
        objective=training.EarlyExitLoss(target.config, exit_layer))
  if "bundle" in stages:
    bundle(workdir)
  return results


def bundle(workdir: str | pathlib.Path, assets: pathlib.Path = ASSETS,
           drafter_stage: str = "aligned") -> None:
  """Ship into the package assets, in bfloat16: the target with its prediction heads
  (target/heads.safetensors), the aligned drafter, the early-exit target (BiLD's
  early-exit variant) and the SentencePiece model."""
  from specdec_jax.drafters.heads import load_heads, save_heads
  from specdec_jax.io.checkpoints import save_checkpoint
  workdir = pathlib.Path(workdir)
  assets.mkdir(parents=True, exist_ok=True)
  for name, stage in (("target", "target"), ("drafter", drafter_stage),
                      ("early-exit", "early_exit")):
    model = sd.load(str(workdir / stage / "final"))
    dest = assets / name
    if dest.exists():
      shutil.rmtree(dest)
    save_checkpoint(str(dest), model.config, model.params, dtype="bfloat16")
    if name == "target":
      save_heads(dest, load_heads(workdir / "heads" / "final", model), dtype="bfloat16")
  shutil.copy(workdir / "data" / "spiece.model", assets / "spiece.model")
