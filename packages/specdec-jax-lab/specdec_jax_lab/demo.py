"""The De→En demo pairs: data, target, drafters (references / aligned / distilled), bundle.

Each stage writes its result under `workdir` and is skipped when that result
exists and is current, so `run_pipeline` can be rerun or resumed after an
interruption (the training stages also resume from their Orbax checkpoints
mid-stage). A training stage's result is current when it was trained for the
recipe's `steps` from the current upstream models: raising `steps` continues
training from the last checkpoint; a retrained target or drafter restarts the
aligned and distilled stages (and regenerates the target's greedy outputs).

The aligned stages (BiLD's prediction alignment: fine-tuning on the target's greedy
outputs) start from the workdir's drafter, or from the model a section's ``"init"`` names:
a bundled model ("demo-de-en/target"), a path, or another stage of the workdir. So a larger
target gets its drafters from models that already exist (configs/demo-large/train.json)::

    specdec train --recipe configs/demo/train.json --workdir runs/demo --stages all
    specdec train --recipe configs/demo-large/train.json --workdir runs/demo-large --stages all
"""

from __future__ import annotations

import json
import pathlib
import shutil
import time

import numpy as np

import specdec_jax as sd
from specdec_jax import config as config_lib
from specdec_jax import generate, package_data
from specdec_jax.batching import padded_batches
from specdec_jax.io.reports import make_dirs, read_json
from specdec_jax.models.model import Model, init_model
from specdec_jax_lab import training
from specdec_jax_lab.data import prepare
from specdec_jax_lab.errors import TrainingError

STAGES = ("data", "target", "drafter", "aligned", "aligned_small", "aligned_mid", "distilled",
          "heads", "early_exit", "bundle")
#: Stages that fine-tune a model on the target's greedy outputs.
ALIGNED = ("aligned", "aligned_small", "aligned_mid")
#: Aligned stages that need an "init" (they have no workdir drafter to start from).
NEEDS_INIT = ("aligned_small", "aligned_mid")
#: Recipe keys a stage reads besides its `TrainConfig` fields. "examples": train on the
#: first N training pairs (the target's greedy outputs are generated for those only).
STAGE_KEYS = {"target": {"config"}, "drafter": {"config"},
              "heads": {"num_heads", "hidden_dim", "examples"}, "early_exit": {"exit_layer"},
              **{name: {"init", "examples"} for name in ALIGNED}}
#: Keys of the optional "bundle" section (default: the demo-de-en pair into ASSETS).
BUNDLE_KEYS = {"assets", "models", "heads", "max_wheel_mb"}
REPO = pathlib.Path(__file__).resolve().parents[3]   # the repository (a source tree)


def source_assets(group: str) -> pathlib.Path:
  """Where a bundle stage writes `group`: its assets directory in this repository's copy of
  the distribution that ships it (`package_data.SEPARATE`), installed from there."""
  module, _, source = package_data.SEPARATE[group]
  return REPO / source / module / "assets" / group


ASSETS = source_assets("demo-de-en")


def _target_outputs(workdir: pathlib.Path, target: Model, inputs: np.ndarray,
                    max_len: int) -> np.ndarray:
  """The target's greedy outputs [N, max_len] for `inputs` [N, Le], cached per target version.

  The cache holds the outputs for a prefix of the training inputs; a stage that asks for
  more rows extends it (only the missing rows are decoded).
  """
  cache = workdir / "aligned_targets.npz"
  target_steps = _upstream(workdir, ["target"])["target"]
  target_steps = -1 if target_steps is None else target_steps
  done = np.zeros((0, max_len), np.int32)
  if cache.exists():
    with np.load(cache) as stored:
      if int(stored.get("target_steps", -2)) == target_steps:
        done = stored["targets"]
  if len(done) < len(inputs):
    fresh = greedy_targets(target, inputs[len(done):], max_len)
    done = np.concatenate([done, fresh.astype(done.dtype)]) if len(done) else fresh
    np.savez(cache, targets=done, target_steps=target_steps)
  return done[:len(inputs)]


def _examples(data: dict, section: dict) -> dict:
  """The training split, cut to the section's first "examples" pairs when it sets them."""
  n = section.get("examples")
  if n is None:
    return data
  if not isinstance(n, int) or n < 1:
    raise TrainingError(f"\"examples\" must be an integer >= 1, got {n!r}")
  return {k: v[:n] for k, v in data.items() if k in ("inputs", "targets")}


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
  """Which upstream models a stage was trained from: {name: their steps}. A dict passes
  through (a stage that records its upstream itself, e.g. a bundled init's fingerprint)."""
  if isinstance(names, dict):
    return names
  return {n: (_final_log(workdir, n) or {}).get("steps") for n in names}


def _load_init(workdir: pathlib.Path, init: str) -> tuple[Model, dict]:
  """The model an aligned stage starts from, and its upstream record.

  `init` names a stage of the workdir ("drafter": its final checkpoint, recorded by its
  steps) or anything `sd.load` reads (a bundled name, a path: recorded by its fingerprint,
  so a changed init restarts the stage).
  """
  from specdec_jax.drafters.heads import fingerprint
  if init in STAGES and (workdir / init / "final").is_dir():
    return sd.load(str(workdir / init / "final")), _upstream(workdir, [init])
  model = sd.load(init)
  return model, {"init": init, "init_fingerprint": fingerprint(model)}


def _check_vocabulary(workdir: pathlib.Path, init: str) -> None:
  """A bundled init ("demo-de-en/target") must share the workdir's SentencePiece pieces:
  its token ids mean the same words only then."""
  from specdec_jax.io.tokenizer import bundled_tokenizers, load_tokenizer
  group = init.split("/", 1)[0]
  if "/" not in init or group not in bundled_tokenizers():
    return
  ours, theirs = (load_tokenizer(str(workdir / "data" / "spiece.model")),
                  load_tokenizer(group))
  if _pieces(ours) != _pieces(theirs):
    raise TrainingError(f"init {init!r}: its tokenizer ({group}) has other pieces than "
                        f"{workdir / 'data' / 'spiece.model'}; its token ids would not match")


def _pieces(tok) -> list[str]:
  sp = tok.processor
  return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def greedy_targets(model: Model, inputs: np.ndarray, max_len: int, batch_size: int = 512,
                   progress: bool = True) -> np.ndarray:
  """The model's greedy outputs for every input, as training targets [N, max_len]."""
  from tqdm.auto import tqdm
  batches = padded_batches(inputs, batch_size)   # one compiled shape
  return np.concatenate([np.asarray(generate(model, b.tokens, max_len).tokens)[:b.real]
                         for b in tqdm(batches, desc="greedy targets", disable=not progress)])


def _stage_train(name, workdir, recipe, data, make_init, teacher=None, upstream=(),
                 objective=None):
  """Train model stage `name` from `make_init()` on `data` ({"inputs", "targets"}) unless its
  final checkpoint is current."""
  def train(init, cfg):
    return training.train(init, data["inputs"], data["targets"], cfg, workdir / name,
                          teacher=teacher, objective=objective)

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


def _stage_heads(workdir, recipe, data, target, targets, upstream=("target",)):
  """Prediction heads for the target (frozen), fitted to its own greedy outputs."""
  from specdec_jax.drafters.heads import init_heads, load_heads, save_heads
  section = recipe["heads"]
  num_heads = int(section["num_heads"])
  hidden_dim = section.get("hidden_dim")        # None: the target's mlp_dim
  log = _final_log(workdir, "heads") or {}
  if (workdir / "heads").exists() and (log.get("num_heads", num_heads) != num_heads
                                       or log.get("hidden_dim", hidden_dim) != hidden_dim):
    shutil.rmtree(workdir / "heads")        # other heads: their checkpoints do not fit

  def train(heads, cfg):
    heads, _, history = training.train_heads(target, heads, data["inputs"], targets, cfg,
                                             workdir / "heads")
    return heads, history

  def save(path, heads, seconds, history, steps, upstream):
    save_heads(path, heads)
    (path / "train_log.json").write_text(json.dumps(
        {"steps": steps, "upstream": upstream, "seconds": seconds, "num_heads": num_heads,
         "hidden_dim": hidden_dim, "history": history[-20:]}, indent=1))
    return heads

  return _run_stage("heads", workdir, recipe,
                    lambda: init_heads(target, num_heads, rng=section.get("seed", 0),
                                       hidden_dim=hidden_dim),
                    train, save, lambda final: load_heads(final, target), upstream=upstream)


def recipe_stages(recipe: dict) -> tuple[str, ...]:
  """The stages "all" means for a recipe: data, every stage it has a section for, bundle."""
  return tuple(s for s in STAGES if s in ("data", "bundle") or isinstance(recipe.get(s), dict))


def run_pipeline(recipe_path: str | pathlib.Path, workdir: str | pathlib.Path,
                 stages=STAGES) -> dict:
  """Run `stages` of the recipe in `workdir` ("all": `recipe_stages`); {stage: its model}."""
  recipe = read_json(recipe_path, "recipe")
  workdir = pathlib.Path(workdir)
  make_dirs(workdir)
  stages = recipe_stages(recipe) if stages in ("all", None) else tuple(stages)
  unknown = set(stages) - set(STAGES)
  if unknown:
    raise TrainingError(f"unknown stages {sorted(unknown)}; stages: {', '.join(STAGES)}")
  data_dir = workdir / "data"
  if "data" in stages and not (data_dir / "meta.json").exists():
    prepare.prepare_de_en(data_dir, **recipe["data"])
  data = prepare.load_split(data_dir, "train")
  max_len = data["targets"].shape[1]
  results = {}

  def config_for(name):
    return config_lib.get_config(REPO / recipe[name]["config"])

  def greedy(section):     # the stage's training pairs, targets = the target's greedy outputs
    part = _examples(data, section)
    return part, _target_outputs(workdir, target, part["inputs"], max_len)

  def with_examples(upstream, section):   # other training pairs: the stage starts over
    upstream = _upstream(workdir, upstream)
    return {**upstream, "examples": section["examples"]} if "examples" in section else upstream

  for name, seed in (("target", 0), ("drafter", 1)):
    if name in stages:
      results[name] = _stage_train(
          name, workdir, recipe, data,
          lambda name=name, seed=seed: init_model(config_for(name),
                                                  recipe[name].get("seed", seed)))
  if {*ALIGNED, "distilled", "heads", "early_exit"} & set(stages):
    target = results.get("target") or sd.load(str(workdir / "target" / "final"))
  for name in (s for s in ALIGNED if s in stages):
    init = recipe[name].get("init")
    if init is None and name in NEEDS_INIT:
      raise TrainingError(f"recipe section {name!r} needs an \"init\": the model it starts "
                          "from (e.g. \"demo-de-en/drafter\")")
    if init is None:     # the workdir's drafter, trained with its recipe's dropout
      start = results.get("drafter") or sd.load(str(workdir / "drafter" / "final"))
      start = start.replace(config=start.config.replace(
          dropout_rate=config_for("drafter").dropout_rate))
      upstream: tuple[str, ...] | dict = ("target", "drafter")
    else:
      _check_vocabulary(workdir, init)
      start, upstream = _load_init(workdir, init)
      upstream = {**_upstream(workdir, ["target"]), **upstream}
    part, targets = greedy(recipe[name])
    results[name] = _stage_train(name, workdir, recipe, {"inputs": part["inputs"],
                                                         "targets": targets},
                                 lambda start=start: start,
                                 upstream=with_examples(upstream, recipe[name]))
  if "distilled" in stages:
    drafter = results.get("drafter") or sd.load(str(workdir / "drafter" / "final"))
    trainable = drafter.replace(config=drafter.config.replace(
        dropout_rate=config_for("drafter").dropout_rate))
    results["distilled"] = _stage_train("distilled", workdir, recipe, data,
                                        lambda: trainable, teacher=target,
                                        upstream=("target", "drafter"))
  if "heads" in stages:
    part, targets = greedy(recipe["heads"])
    results["heads"] = _stage_heads(workdir, recipe, part, target, targets,
                                    with_examples(("target",), recipe["heads"]))
  if "early_exit" in stages:
    exit_layer = int(recipe["early_exit"].get("exit_layer", 1))
    results["early_exit"] = _stage_train(
        "early_exit", workdir, recipe, data, lambda: target, upstream=("target",),
        objective=training.EarlyExitLoss(target.config, exit_layer))
  if "bundle" in stages:
    bundle_recipe(workdir, recipe.get("bundle") or {})
  return results


#: What `bundle` ships by default: asset name -> the workdir stage it comes from.
BUNDLE_MODELS = {"target": "target", "drafter": "aligned", "early-exit": "early_exit"}
#: The assets' share of a wheel: the usual package-index limit on one file (100 MB) less
#: room for the code and metadata.
MAX_WHEEL_MB = 95.0


def bundle_recipe(workdir: str | pathlib.Path, section: dict) -> pathlib.Path:
  """`bundle` as a recipe's optional "bundle" section sets it; the assets directory.

  {"assets": dir relative to the repository (default: ASSETS, specdec-jax-demo-small's
   demo-de-en),
   "models": {asset name: stage}, "heads": asset name that gets the heads stage's heads,
   "max_wheel_mb": limit on the assets' compressed size}
  """
  unknown = sorted(set(section) - BUNDLE_KEYS)
  if unknown:
    raise TrainingError(f"recipe section 'bundle': unknown key(s) {', '.join(unknown)}; "
                        f"known: {', '.join(sorted(BUNDLE_KEYS))}")
  assets = REPO / section["assets"] if "assets" in section else ASSETS
  bundle(workdir, assets, models=section.get("models"), heads=section.get("heads", "target"),
         max_wheel_mb=section.get("max_wheel_mb", MAX_WHEEL_MB))
  return assets


def bundle(workdir: str | pathlib.Path, assets: pathlib.Path = ASSETS,
           drafter_stage: str = "aligned", models: dict | None = None,
           heads: str | None = "target", max_wheel_mb: float | None = None) -> None:
  """Ship models into an assets directory, in bfloat16, with the SentencePiece model.

  `models` maps asset names to workdir stages (default: the target, the `drafter_stage`
  drafter and the early-exit target, BiLD's early-exit variant); the `heads` asset also
  gets the heads stage's prediction heads (target/heads.safetensors). With
  `max_wheel_mb`, a TrainingError when the assets would compress past it (a wheel over
  the package index's file limit).
  """
  from specdec_jax.drafters.heads import load_heads, save_heads
  from specdec_jax.io.checkpoints import save_checkpoint
  workdir = pathlib.Path(workdir)
  models = models or {**BUNDLE_MODELS, "drafter": drafter_stage}
  missing = [s for s in models.values() if not (workdir / s / "final").is_dir()]
  if missing:
    raise TrainingError(f"bundle: no final model for stage(s) {', '.join(missing)} in "
                        f"{workdir}: run them first")
  assets.mkdir(parents=True, exist_ok=True)
  for name, stage in models.items():
    model = sd.load(str(workdir / stage / "final"))
    dest = assets / name
    if dest.exists():
      shutil.rmtree(dest)
    save_checkpoint(str(dest), model.config, model.params, dtype="bfloat16")
    if name == heads:
      save_heads(dest, load_heads(workdir / "heads" / "final", model), dtype="bfloat16")
  shutil.copy(workdir / "data" / "spiece.model", assets / "spiece.model")
  for path in assets.rglob("*"):     # checkpoint files are written private (a temp file)
    path.chmod(0o755 if path.is_dir() else 0o644)
  if max_wheel_mb is not None:
    size = compressed_mb(assets)
    if size >= max_wheel_mb:
      raise TrainingError(
          f"bundle: {assets} compresses to {size:.1f} MB, past the {max_wheel_mb:g} MB wheel "
          "limit: ship fewer models or heads (the recipe's bundle \"models\")")


def compressed_mb(directory: pathlib.Path) -> float:
  """The deflate-compressed size of every file under `directory` in MB: what it adds to
  a wheel (a zip archive)."""
  import zlib
  total = 0
  for path in sorted(p for p in pathlib.Path(directory).rglob("*") if p.is_file()):
    compressor, size = zlib.compressobj(6), 0
    with open(path, "rb") as f:
      while chunk := f.read(1 << 24):
        size += len(compressor.compress(chunk))
    total += size + len(compressor.flush())
  return total / 1e6
