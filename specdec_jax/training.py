"""Teacher-forced training of T5 models with optax, with Orbax checkpoints and exact resume.

    state = init_train_state(model, tx)
    state, metrics = train_step(state, batch, rng)      # jitted, pure

`train(...)` drives it: a deterministic batch order that depends only on
(seed, step), periodic Orbax checkpoints of (params, optimizer state, step), and
resume from the newest checkpoint, so an interrupted run continues exactly as
an uninterrupted one would. Three kinds of targets:

  references   cross-entropy on the data's English side;
  aligned      the same on the verifier's greedy outputs (BiLD prediction alignment);
  distilled    cross-entropy against a teacher's softmax (soft targets).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from specdec_jax.model import Model, module_for

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  steps: int = 1000
  batch_size: int = 64
  learning_rate: float = 1e-3
  warmup_steps: int = 200
  weight_decay: float = 0.0
  label_smoothing: float = 0.0
  distill_temperature: float = 1.0
  checkpoint_every: int = 500
  seed: int = 0

  def __post_init__(self):
    for name in ("steps", "batch_size", "checkpoint_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")


@struct.dataclass
class TrainState:
  step: Array
  params: Any
  opt_state: Any
  tx: optax.GradientTransformation = struct.field(pytree_node=False)


class TrainingError(ValueError):
  """A training run that cannot continue as asked (e.g. checkpoints past its steps)."""


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """AdamW with linear warm-up and inverse-square-root decay (T5's schedule shape)."""
  warm = max(cfg.warmup_steps, 1)

  def schedule(step):
    step = jnp.maximum(step.astype(jnp.float32), 1.0)
    return cfg.learning_rate * jnp.minimum(step / warm, jnp.sqrt(warm / step))

  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=cfg.weight_decay))


def init_train_state(model: Model, tx: optax.GradientTransformation) -> TrainState:
  # A copy: `train_step` donates the state's buffers, the caller's model must stay usable.
  params = jax.tree_util.tree_map(jnp.array, model.params)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    tx=tx)


def shift_right(targets: Array, start_id: int = 0) -> Array:
  """Decoder inputs: [B, L] targets -> [start, t_0, ..., t_{L-2}]."""
  return jnp.pad(targets, ((0, 0), (1, 0)), constant_values=start_id)[:, :-1]


def loss_fn(params, config, batch: dict, rng: Array, label_smoothing: float = 0.0,
            teacher_probs: Array | None = None):
  """Mean token cross-entropy over non-pad targets.

  batch: {"inputs": [B, Le], "targets": [B, Ld]} int32, 0-padded.
  teacher_probs: [B, Ld, V] soft targets (distillation) replacing the one-hot labels.
  """
  targets = batch["targets"]
  logits = module_for(config).apply(
      {"params": params}, batch["inputs"], shift_right(targets, config.decoder_start_id),
      deterministic=config.dropout_rate == 0.0, rngs={"dropout": rng})
  if teacher_probs is None:
    labels = jax.nn.one_hot(targets, config.vocab_size)
    if label_smoothing:
      labels = optax.smooth_labels(labels, label_smoothing)
  else:
    labels = teacher_probs
  token_loss = optax.softmax_cross_entropy(logits, labels)
  mask = (targets > 0).astype(jnp.float32)
  loss = jnp.sum(token_loss * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  accuracy = jnp.sum((jnp.argmax(logits, -1) == targets) * mask) / jnp.maximum(jnp.sum(mask), 1)
  return loss, {"loss": loss, "accuracy": accuracy}


@functools.partial(jax.jit, static_argnames=("config", "label_smoothing", "distill_temperature"),
                   donate_argnums=(0,))
def train_step(state: TrainState, batch: dict, rng: Array, teacher: Model | None = None, *,
               config, label_smoothing: float = 0.0, distill_temperature: float = 1.0):
  """One optimizer step. With `teacher`, the targets are its softmax at `distill_temperature`."""
  teacher_probs = None
  if teacher is not None:
    t_logits = teacher.forward(batch["inputs"], shift_right(batch["targets"],
                                                            config.decoder_start_id))
    teacher_probs = jax.nn.softmax(t_logits / distill_temperature, axis=-1)
  grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, config, batch, rng,
                                                   label_smoothing, teacher_probs)
  updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def batch_indices(num_examples: int, batch_size: int, seed: int, step: int) -> np.ndarray:
  """Indices of the examples in batch `step`: a fresh permutation each epoch, from (seed, epoch)."""
  per_epoch = max(num_examples // batch_size, 1)
  epoch, offset = divmod(step, per_epoch)
  perm = np.random.default_rng([seed, epoch]).permutation(num_examples)
  return perm[offset * batch_size:(offset + 1) * batch_size]


def batches(inputs: np.ndarray, targets: np.ndarray, batch_size: int, seed: int,
            start_step: int = 0) -> Iterator[dict]:
  step = start_step
  while True:
    idx = batch_indices(len(inputs), batch_size, seed, step)
    yield {"inputs": jnp.asarray(inputs[idx]), "targets": jnp.asarray(targets[idx])}
    step += 1


def evaluate_loss(model: Model, inputs: np.ndarray, targets: np.ndarray,
                  batch_size: int = 256) -> float:
  """Token-level cross-entropy of `model` on a dataset (no dropout)."""
  cfg = model.config.replace(dropout_rate=0.0)
  fn = jax.jit(lambda p, b: loss_fn(p, cfg, b, jax.random.PRNGKey(0))[0])
  total, weight = 0.0, 0.0
  for i in range(0, len(inputs), batch_size):
    b = {"inputs": jnp.asarray(inputs[i:i + batch_size]),
         "targets": jnp.asarray(targets[i:i + batch_size])}
    n = float((targets[i:i + batch_size] > 0).sum())
    total += float(fn(model.params, b)) * n
    weight += n
  return total / max(weight, 1.0)


def _checkpoint_manager(directory: pathlib.Path, keep: int = 2):
  import orbax.checkpoint as ocp
  return ocp.CheckpointManager(directory.resolve(),
                               options=ocp.CheckpointManagerOptions(max_to_keep=keep,
                                                                    create=True))


def train(model: Model, inputs: np.ndarray, targets: np.ndarray, cfg: TrainConfig,
          workdir: str | pathlib.Path, teacher: Model | None = None,
          progress: bool = True) -> tuple[Model, list[dict]]:
  """Train `model` (its current params are the initialisation) and return the trained model.

  Checkpoints go to `workdir/checkpoints` every `cfg.checkpoint_every` steps; if
  any exist, training resumes from the newest one (same batches, same RNG).
  """
  import orbax.checkpoint as ocp
  from tqdm.auto import tqdm

  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  tx = make_optimizer(cfg)
  state = init_train_state(model, tx)
  manager = _checkpoint_manager(workdir / "checkpoints")
  history_path = workdir / "history.jsonl"
  latest = manager.latest_step()
  if latest is not None:
    abstract = {"step": state.step, "params": state.params, "opt_state": state.opt_state}
    restored = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
    state = state.replace(step=jnp.asarray(restored["step"]), params=restored["params"],
                          opt_state=restored["opt_state"])
  start = int(state.step)
  if start > cfg.steps:
    raise TrainingError(f"{workdir / 'checkpoints'} holds a checkpoint at step {start}, past "
                     f"steps={cfg.steps}: raise steps or train in a fresh directory")
  history = []
  if history_path.exists():
    history = [json.loads(line) for line in history_path.read_text().splitlines()
               if json.loads(line)["step"] <= start]
  base_rng = jax.random.PRNGKey(cfg.seed)
  data = batches(inputs, targets, cfg.batch_size, cfg.seed, start)
  bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not progress,
             desc=f"train {workdir.name}", dynamic_ncols=True)
  running = None
  for step in bar:
    rng = jax.random.fold_in(base_rng, step)
    state, metrics = train_step(state, next(data), rng, teacher, config=model.config,
                                label_smoothing=cfg.label_smoothing,
                                distill_temperature=cfg.distill_temperature)
    if (step + 1) % 50 == 0 or step + 1 == cfg.steps:
      m = {k: float(v) for k, v in metrics.items()}
      running = m["loss"] if running is None else 0.9 * running + 0.1 * m["loss"]
      bar.set_postfix(loss=f"{running:.3f}", acc=f"{m['accuracy']:.3f}")
      history.append({"step": step + 1, **m})
    if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
      manager.save(step + 1, args=ocp.args.StandardSave(
          {"step": state.step, "params": state.params, "opt_state": state.opt_state}))
      manager.wait_until_finished()
      history_path.write_text("".join(json.dumps(h) + "\n" for h in history))
  manager.close()
  return model.replace(params=jax.device_get(state.params)), history
