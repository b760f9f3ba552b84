"""Training of T5 and decoder-only models with optax, with Orbax checkpoints and exact resume.

    state = init_train_state(params, tx)
    state, metrics = train_step(state, batch, rng, objective)   # jitted, pure

`train(...)` drives it: a deterministic batch order that depends only on
(seed, step), periodic Orbax checkpoints of (params, optimizer state, step), and
resume from the newest checkpoint, so an interrupted run continues exactly as
an uninterrupted one would. Three kinds of targets for T5:

  references   cross-entropy on the data's English side;
  aligned      the same on the verifier's greedy outputs (BiLD prediction alignment);
  distilled    cross-entropy against a teacher's softmax (soft targets);

and next-token cross-entropy for a decoder-only model (`LMLoss`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Any, Iterator, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from specdec_jax.models.model import Model, module_for
from specdec_jax_lab.errors import TrainingError

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  steps: int = 1000
  batch_size: int = 64
  optimizer: str = "adamw"     # or "adafactor" (T5's: updates scale with the parameter)
  learning_rate: float = 1e-3
  warmup_steps: int = 200
  decay_start: int = 0         # inverse-sqrt decay from this step on (0: from warmup_steps)
  weight_decay: float = 0.0
  label_smoothing: float = 0.0
  distill_temperature: float = 1.0
  checkpoint_every: int = 500
  seed: int = 0
  # > 0: batches of similar-length examples, trimmed to a multiple of this many tokens
  # (less padding, a handful of compiled shapes); 0: every batch at the data's full width.
  length_bucket: int = 0

  def __post_init__(self):
    for name in ("steps", "batch_size", "checkpoint_every"):
      if getattr(self, name) < 1:
        raise TrainingError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.optimizer not in OPTIMIZERS:
      raise TrainingError(f"TrainConfig.optimizer must be one of {', '.join(OPTIMIZERS)}, "
                       f"got {self.optimizer!r}")
    if self.length_bucket < 0:
      raise TrainingError(f"TrainConfig.length_bucket must be >= 0, got {self.length_bucket}")


class TrainState(struct.PyTreeNode):
  step: Array
  params: Any
  opt_state: Any
  tx: optax.GradientTransformation = struct.field(pytree_node=False)


OPTIMIZERS = ("adamw", "adafactor")


def learning_rate_schedule(cfg: TrainConfig):
  """Linear warm-up to `learning_rate`, flat until `decay_start`, then inverse-sqrt decay.

  T5's own schedule is 0.01 flat for 10k steps, then 1/sqrt(step): decay_start=10000.
  """
  warm = max(cfg.warmup_steps, 1)
  decay = max(cfg.decay_start, warm)

  def schedule(step):
    step = jnp.maximum(jnp.asarray(step, jnp.float32), 1.0)
    return cfg.learning_rate * jnp.minimum(jnp.minimum(step / warm, 1.0),
                                           jnp.sqrt(decay / step))
  return schedule


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """AdamW (global-norm clipped) or Adafactor, on `learning_rate_schedule(cfg)`.

  Adafactor's updates are relative to each parameter's scale, which suits T5X's
  N(0, 1) embedding init: AdamW moves every embedding entry by ~lr per step
  whatever its size, so at lr 2e-3 a rarely-seen token's embedding hardly leaves
  its random init.
  """
  schedule = learning_rate_schedule(cfg)
  if cfg.optimizer == "adafactor":
    return optax.adafactor(schedule, multiply_by_parameter_scale=True, clipping_threshold=1.0,
                           decay_rate=0.8, min_dim_size_to_factor=128,
                           weight_decay_rate=cfg.weight_decay or None)
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=cfg.weight_decay))


def init_train_state(params: Any, tx: optax.GradientTransformation) -> TrainState:
  # A copy: `train_step` donates the state's buffers, the caller's params must stay usable.
  params = jax.tree_util.tree_map(jnp.array, params)
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
  # cast: flax types apply's result as (output, state) too; without mutable= it is the output
  logits = cast(Array, module_for(config).apply(
      {"params": params}, batch["inputs"], shift_right(targets, config.decoder_start_id),
      deterministic=config.dropout_rate == 0.0, rngs={"dropout": rng}))
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


@struct.dataclass
class TokenLoss:
  """Cross-entropy on the targets; with a `teacher`, against its softmax at
  `distill_temperature` (distillation). Trains a whole model's params."""

  config: Any = struct.field(pytree_node=False)
  label_smoothing: float = struct.field(pytree_node=False, default=0.0)
  teacher: Model | None = None
  distill_temperature: float = struct.field(pytree_node=False, default=1.0)

  def __call__(self, params, batch: dict, rng: Array):
    teacher_probs = None
    if self.teacher is not None:
      t_logits = self.teacher.forward(batch["inputs"], shift_right(
          batch["targets"], self.config.decoder_start_id))
      teacher_probs = jax.nn.softmax(t_logits / self.distill_temperature, axis=-1)
    return loss_fn(params, self.config, batch, rng, self.label_smoothing, teacher_probs)


def lm_loss_fn(params, config, batch: dict, rng: Array, pad_id: int | None = None):
  """Next-token cross-entropy of a decoder-only model on right-padded sequences.

  batch: {"inputs": x [B, L], "targets": y [B, L]} int32, y[b, t] the token after x[b, t]
  (`next_token_pairs`); targets equal to `pad_id` (default `config.pad_id`) are masked.
  """
  pad_id = config.pad_id if pad_id is None else pad_id
  targets = batch["targets"]
  logits = cast(Array, module_for(config).apply({"params": params}, batch["inputs"],
                                                deterministic=config.dropout_rate == 0.0,
                                                rngs={"dropout": rng}))     # (see loss_fn)
  mask = (targets != pad_id).astype(jnp.float32)
  loss = _masked_mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets), mask)
  accuracy = _masked_mean((jnp.argmax(logits, -1) == targets).astype(jnp.float32), mask)
  return loss, {"loss": loss, "accuracy": accuracy}


@struct.dataclass
class LMLoss:
  """Next-token cross-entropy of a decoder-only model (`lm_loss_fn`)."""

  config: Any = struct.field(pytree_node=False)

  def __call__(self, params, batch: dict, rng: Array):
    return lm_loss_fn(params, self.config, batch, rng)


def next_token_pairs(sequences: np.ndarray, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded sequences [N, L] -> (inputs [N, L-1], targets [N, L-1]) for `LMLoss`.

  The last token of each row is only a target, the first only an input. Rows padded with a
  `pad_id` that no real token uses: an EOS-padded row (GPT-2's pad) would mask its own EOS.
  """
  sequences = np.asarray(sequences)
  if sequences.ndim != 2 or sequences.shape[1] < 2:
    raise TrainingError(f"next_token_pairs expects sequences [N, L >= 2], got shape "
                        f"{sequences.shape}")
  return sequences[:, :-1], sequences[:, 1:]


@struct.dataclass
class EarlyExitLoss:
  """BiLD's early-exit training (NeurIPS §4.4): 1/2 (L_exit + L_last), the exit read after
  `exit_layer` decoder layers through the shared final norm and output layer."""

  config: Any = struct.field(pytree_node=False)
  exit_layer: int = struct.field(pytree_node=False, default=1)

  def __call__(self, params, batch: dict, rng: Array):
    targets = batch["targets"]
    exits = (self.exit_layer, self.config.num_decoder_layers)
    logits = cast(tuple[Array, ...], module_for(self.config).apply(     # (see loss_fn)
        {"params": params}, batch["inputs"], shift_right(targets, self.config.decoder_start_id),
        exits, self.config.dropout_rate == 0.0, rngs={"dropout": rng},
        method=module_for(self.config).__class__.exit_logits))
    mask = (targets > 0).astype(jnp.float32)
    per = [_masked_mean(optax.softmax_cross_entropy_with_integer_labels(lg, targets), mask)
           for lg in logits]
    acc = [_masked_mean((jnp.argmax(lg, -1) == targets).astype(jnp.float32), mask)
           for lg in logits]
    loss = 0.5 * (per[0] + per[1])
    return loss, {"loss": loss, "loss_exit": per[0], "loss_last": per[1],
                  "accuracy": acc[1], "accuracy_exit": acc[0]}


@struct.dataclass
class HeadsLoss:
  """Prediction heads' loss sum_h lambda_h L_h (`drafters.heads.heads_loss`) on `model`.

  Trains {"heads": ...} (frozen base, the default) or {"heads": ..., "model": ...} (joint)."""

  model: Model
  num_heads: int = struct.field(pytree_node=False)
  freeze_model: bool = struct.field(pytree_node=False, default=True)

  def __call__(self, params, batch: dict, rng: Array):
    from specdec_jax.drafters.heads import Heads, heads_loss
    model = self.model if self.freeze_model else self.model.replace(params=params["model"])
    loss, per_head, accuracy = heads_loss(model, Heads(params["heads"], self.num_heads),
                                          batch["inputs"], batch["targets"],
                                          freeze_model=self.freeze_model)
    return loss, {"loss": loss, "accuracy": accuracy[1],      # head 2's top-1 accuracy
                  **{f"loss_head_{j + 1}": per_head[j] for j in range(self.num_heads)},
                  **{f"accuracy_head_{j + 1}": accuracy[j] for j in range(self.num_heads)}}


def _masked_mean(x: Array, mask: Array) -> Array:
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


@functools.partial(jax.jit, donate_argnums=(0,))
def train_step(state: TrainState, batch: dict, rng: Array, objective):
  """One optimizer step on `objective(params, batch, rng) -> (loss, metrics)`."""
  grads, metrics = jax.grad(lambda p: objective(p, batch, rng), has_aux=True)(state.params)
  updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def batch_indices(num_examples: int, batch_size: int, seed: int, step: int,
                  lengths: np.ndarray | None = None, pool_batches: int = 64) -> np.ndarray:
  """Indices of the examples in batch `step`, a pure function of (seed, step).

  A fresh permutation each epoch, from (seed, epoch). With `lengths` [N], each
  run of `pool_batches` batches of the permutation is sorted by length and cut
  into batches, served in a random order: similar lengths share a batch.
  """
  per_epoch = max(num_examples // batch_size, 1)
  epoch, offset = divmod(step, per_epoch)
  perm = np.random.default_rng([seed, epoch]).permutation(num_examples)
  if lengths is None:
    return perm[offset * batch_size:(offset + 1) * batch_size]
  pool_index, j = divmod(offset, pool_batches)
  pool = perm[pool_index * pool_batches * batch_size:(pool_index + 1) * pool_batches * batch_size]
  pool = pool[np.argsort(lengths[pool], kind="stable")]
  order = np.random.default_rng([seed, epoch, pool_index]).permutation(
      max(len(pool) // batch_size, 1))
  return pool[order[j] * batch_size:(order[j] + 1) * batch_size]


def token_lengths(tokens: np.ndarray) -> np.ndarray:
  """[N, L] 0-padded -> [N] lengths (position of the last non-pad token + 1)."""
  nonzero = tokens > 0
  return np.where(nonzero.any(1), tokens.shape[1] - np.argmax(nonzero[:, ::-1], 1), 0)


def batches(inputs: np.ndarray, targets: np.ndarray, batch_size: int, seed: int,
            start_step: int = 0, length_bucket: int = 0) -> Iterator[dict]:
  """Training batches from `start_step` on. With `length_bucket` > 0, batches group
  similar lengths and are trimmed to the longest row, rounded up to that multiple."""
  lengths = None
  if length_bucket:
    lengths = np.maximum(token_lengths(inputs), token_lengths(targets))
  step = start_step
  while True:
    idx = batch_indices(len(inputs), batch_size, seed, step, lengths)
    x, y = inputs[idx], targets[idx]
    if lengths is not None:     # length_bucket > 0
      width = -(-max(int(lengths[idx].max()), 1) // length_bucket) * length_bucket
      x, y = x[:, :width], y[:, :width]
    yield {"inputs": jnp.asarray(x), "targets": jnp.asarray(y)}
    step += 1


def _checkpoint_manager(directory: pathlib.Path, keep: int = 2):
  import orbax.checkpoint as ocp
  return ocp.CheckpointManager(directory.resolve(),
                               options=ocp.CheckpointManagerOptions(max_to_keep=keep,
                                                                    create=True))


# Settings a run may change when it resumes; any other change makes the checkpoints invalid.
RESUMABLE_CHANGES = ("steps", "checkpoint_every")


def changed_settings(workdir: pathlib.Path, cfg: TrainConfig) -> list[str]:
  """Settings of `cfg` that differ from the run recorded in `workdir` (none recorded: [])."""
  path = workdir / "train_config.json"
  if not path.exists():
    return []
  before, now = json.loads(path.read_text()), dataclasses.asdict(cfg)
  return sorted(k for k in set(now) | set(before)
                if k not in RESUMABLE_CHANGES and before.get(k) != now.get(k))


def _check_settings(workdir: pathlib.Path, cfg: TrainConfig, resuming: bool) -> None:
  """Record the run's settings in workdir/train_config.json; refuse to resume under others."""
  path = workdir / "train_config.json"
  now = dataclasses.asdict(cfg)
  if resuming:
    changed = changed_settings(workdir, cfg)
    before = json.loads(path.read_text()) if changed else {}
    if changed:
      raise TrainingError(
          f"{workdir} holds checkpoints trained with other settings ("
          + ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed)
          + "): train in a fresh directory")
  path.write_text(json.dumps(now, indent=1) + "\n")


def train(model: Model, inputs: np.ndarray, targets: np.ndarray, cfg: TrainConfig,
          workdir: str | pathlib.Path, teacher: Model | None = None,
          progress: bool = True, objective=None) -> tuple[Model, list[dict]]:
  """Train `model` (its current params are the initialisation) and return the trained model.

  The objective is the targets' cross-entropy (`TokenLoss`; against `teacher`'s softmax
  when given; for a decoder-only model `LMLoss`, with `next_token_pairs` as inputs and
  targets), or `objective` (e.g. `EarlyExitLoss`). Checkpoints and resume: `fit`.
  """
  if objective is None and getattr(model.config, "is_decoder_only", False):
    if teacher is not None or cfg.label_smoothing:
      raise TrainingError("a decoder-only model trains on next-token cross-entropy "
                          "(LMLoss): no teacher, no label smoothing")
    objective = LMLoss(model.config)
  if objective is None:
    objective = TokenLoss(model.config, cfg.label_smoothing, teacher, cfg.distill_temperature)
  params, history = fit(model.params, objective, inputs, targets, cfg, workdir, progress)
  return model.replace(params=params), history


def train_heads(model: Model, heads, inputs: np.ndarray, targets: np.ndarray,
                cfg: TrainConfig, workdir: str | pathlib.Path, freeze_model: bool = True,
                progress: bool = True):
  """Train prediction heads for `model` (frozen by default) on (inputs, targets).

  Returns (heads, model, history): the model is returned unchanged when frozen."""
  params = {"heads": heads.params}
  if not freeze_model:
    params["model"] = model.params
  params, history = fit(params, HeadsLoss(model, heads.num_heads, freeze_model), inputs,
                        targets, cfg, workdir, progress)
  if not freeze_model:
    from specdec_jax.drafters.heads import model_fingerprint
    model = model.replace(params=params["model"])
    return heads.replace(params=params["heads"], base=model_fingerprint(model)), model, history
  return heads.replace(params=params["heads"]), model, history


def fit(params: Any, objective, inputs: np.ndarray, targets: np.ndarray, cfg: TrainConfig,
        workdir: str | pathlib.Path, progress: bool = True) -> tuple[Any, list[dict]]:
  """Minimise `objective(params, batch, rng)` from `params`; return (params, history).

  Checkpoints go to `workdir/checkpoints` every `cfg.checkpoint_every` steps; if
  any exist, training resumes from the newest one (same batches, same RNG).
  """
  import orbax.checkpoint as ocp
  from tqdm.auto import tqdm

  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  state = init_train_state(params, make_optimizer(cfg))
  manager = _checkpoint_manager(workdir / "checkpoints")
  latest = manager.latest_step()
  _check_settings(workdir, cfg, resuming=latest is not None)
  if latest is not None:
    abstract = {"step": state.step, "params": state.params, "opt_state": state.opt_state}
    restored = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
    state = state.replace(step=jnp.asarray(restored["step"]), params=restored["params"],
                          opt_state=restored["opt_state"])
  start = int(state.step)
  if start > cfg.steps:
    raise TrainingError(f"{workdir / 'checkpoints'} holds a checkpoint at step {start}, past "
                        f"steps={cfg.steps}: raise steps or train in a fresh directory")
  history_path = workdir / "history.jsonl"
  history = []
  if history_path.exists():
    history = [json.loads(line) for line in history_path.read_text().splitlines()
               if json.loads(line)["step"] <= start]
  base_rng = jax.random.PRNGKey(cfg.seed)
  data = batches(inputs, targets, cfg.batch_size, cfg.seed, start, cfg.length_bucket)
  bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not progress,
             desc=f"train {workdir.name}", dynamic_ncols=True)
  running = None
  for step in bar:
    state, metrics = train_step(state, next(data), jax.random.fold_in(base_rng, step),
                                objective)
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
  return jax.device_get(state.params), history
