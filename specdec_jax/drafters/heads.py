"""Prediction heads for blockwise parallel drafts (Stern et al. 2018; Kim et al. 2024).

Head 1 is the verifier itself: its output layer on the final decoder state s_t at
position t predicts token t+1. Head j = 2..h predicts token t+j from the SAME state:
a one-hidden-layer FFN with a residual, then the verifier's own output layer,

    u_j = s_t + relu(s_t W_in^j) W_out^j          logits_j = output_layer(u_j)

so one verifier call (which yields s_t) also yields the next round's h - 1 drafts.
Heads are trained for one base model: they carry its fingerprint, and loading them
for another model is an error.

    heads = init_heads(model, num_heads=5, rng=0)       # 4 drafting heads, [E, F] + [F, E] each
    logits = head_logits(model, heads, states)          # states [..., E] -> [..., h - 1, V]
    save_heads(dir_or_file, heads); heads = load_heads(dir_or_file, model)
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.errors import CheckpointError, InputError
from specdec_jax.models.model import Model

Array = jax.Array
FORMAT = "specdec-heads-v1"
FILENAME = "heads.safetensors"


class Heads(struct.PyTreeNode):
  """Heads 2..h: params {"head_j": {"wi": [E, F], "wo": [F, E]}} and the base's fingerprint."""

  params: Any
  num_heads: int = struct.field(pytree_node=False)
  base: str = struct.field(pytree_node=False, default="")

  @property
  def num_drafts(self) -> int:
    """G = h - 1: tokens drafted per round."""
    return self.num_heads - 1

  @property
  def hidden_dim(self) -> int:
    return self.params["head_2"]["wi"].shape[1]

  def take(self, num_heads: int) -> "Heads":
    """Heads 2..num_heads of these (each head is trained on its own: a prefix is a set)."""
    if not 2 <= num_heads <= self.num_heads:
      raise InputError(f"take({num_heads}): these heads have num_heads={self.num_heads}; "
                       f"choose 2..{self.num_heads}")
    return self.replace(params={f"head_{j}": self.params[f"head_{j}"]
                                for j in range(2, num_heads + 1)}, num_heads=num_heads)


def fingerprint(model: Model) -> str:
  """A short digest of a model: config plus shape and a strided sample of every parameter.

  Cheap for any size (256 values per leaf), and changes with any fine-tuning that
  moves the sampled values, which all training does. Values are compared at bfloat16
  precision, so the same weights loaded as float32 or bfloat16 match.
  """
  arch = {k: v for k, v in model.config.to_dict().items() if k != "dtype"}   # not activations
  h = hashlib.sha256(json.dumps(arch, sort_keys=True).encode())
  leaves, _ = jax.tree_util.tree_flatten_with_path(model.params)
  with jax.ensure_compile_time_eval():    # concrete weights stay concrete inside a jit trace
    for path, leaf in leaves:
      flat = jnp.ravel(leaf)
      step = max(1, flat.shape[0] // 256)
      h.update(jax.tree_util.keystr(path).encode() + str(leaf.shape).encode())
      h.update(np.asarray(flat[::step][:256].astype(jnp.bfloat16), np.float32).tobytes())
  return h.hexdigest()[:16]


_FINGERPRINTS: dict[tuple[int, ...], tuple[list, str]] = {}


def model_fingerprint(model: Model) -> str:
  """`fingerprint`, computed once per set of parameter arrays (kept alive with the entry,
  so an id cannot be reused by other arrays while it is cached)."""
  leaves = jax.tree_util.tree_leaves(model.params)
  key = tuple(id(x) for x in leaves)
  if key not in _FINGERPRINTS:
    if len(_FINGERPRINTS) >= 8:
      _FINGERPRINTS.pop(next(iter(_FINGERPRINTS)))
    _FINGERPRINTS[key] = (leaves, fingerprint(model))
  return _FINGERPRINTS[key][1]


def init_heads(model: Model, num_heads: int, rng: Array | int = 0,
               hidden_dim: int | None = None, init_scale: float = 0.1) -> Heads:
  """Random heads 2..num_heads for `model` (float32). W_out starts small (`init_scale` of a
  fan-in normal): every head starts close to head 1 and learns its offset."""
  if not isinstance(num_heads, int) or num_heads < 2:
    raise InputError(f"num_heads must be an integer >= 2 (head 1 is the model), got {num_heads!r}")
  emb = model.config.emb_dim
  hidden_dim = hidden_dim or model.config.mlp_dim
  key = jax.random.PRNGKey(rng) if isinstance(rng, int) else rng
  params = {}
  for j, k in zip(range(2, num_heads + 1), jax.random.split(key, num_heads - 1), strict=True):
    k_in, k_out = jax.random.split(k)
    params[f"head_{j}"] = {
        "wi": jax.random.normal(k_in, (emb, hidden_dim), jnp.float32) / np.sqrt(emb),
        "wo": jax.random.normal(k_out, (hidden_dim, emb), jnp.float32)
              * (init_scale / np.sqrt(hidden_dim))}
  return Heads(params=params, num_heads=num_heads, base=model_fingerprint(model))


def head_states(heads: Heads, states: Array) -> Array:
  """Final decoder states [..., E] -> the heads' states u_j [..., h - 1, E] (before the output
  layer)."""
  dtype = states.dtype
  out = []
  for j in range(2, heads.num_heads + 1):
    p = heads.params[f"head_{j}"]
    inner = jax.nn.relu(jnp.dot(states, p["wi"].astype(dtype)))
    out.append(states + jnp.dot(inner, p["wo"].astype(dtype)))
  return jnp.stack(out, axis=-2)


def head_logits(model: Model, heads: Heads, states: Array) -> Array:
  """states [..., E] -> float32 logits [..., h - 1, V] of heads 2..h (verifier's output layer)."""
  return model.output_logits(head_states(heads, states))


def check_heads(model: Model, heads: Heads) -> None:
  """Heads must have been trained for this very model."""
  if heads.params["head_2"]["wi"].shape[0] != model.config.emb_dim:
    raise InputError(f"heads trained for another model: hidden size "
                     f"{heads.params['head_2']['wi'].shape[0]} != the model's emb_dim "
                     f"{model.config.emb_dim}")
  traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(model.params))
  # Under the user's jit (the model an argument) the weights cannot be read: no fingerprint.
  if heads.base and not traced and heads.base != model_fingerprint(model):
    raise InputError(f"heads trained for another model (fingerprint {heads.base}, this model "
                     f"{model_fingerprint(model)}); train heads for it with "
                     "`specdec train --heads`")


def heads_path(path: str | pathlib.Path) -> pathlib.Path:
  """A `*.safetensors` heads file, or a model directory holding `heads.safetensors`."""
  path = pathlib.Path(path)
  return path if path.suffix == ".safetensors" else path / FILENAME


def save_heads(path: str | pathlib.Path, heads: Heads, dtype="float32") -> pathlib.Path:
  """Write `heads` as safetensors (a file, or `heads.safetensors` inside a model dir),
  in `dtype` (bfloat16 halves the file)."""
  from specdec_jax.io.checkpoints.files import write_safetensors
  target = heads_path(path)
  target.parent.mkdir(parents=True, exist_ok=True)
  tensors = {f"{name}/{k}": np.asarray(jnp.asarray(v, dtype))
             for name, p in heads.params.items() for k, v in p.items()}
  meta = {"format": FORMAT, "num_heads": str(heads.num_heads), "base_fingerprint": heads.base}
  tmp = target.with_suffix(".tmp")
  write_safetensors(tensors, str(tmp), metadata=meta)    # honours the umask
  tmp.replace(target)
  return target


def load_heads(path: str | pathlib.Path, model: Model) -> Heads:
  """Read heads written by `save_heads` and check they were trained for `model`.

  `path`: a heads file, a model directory with `heads.safetensors`, or a bundled model
  name such as "demo-de-en/target".
  """
  from safetensors import safe_open

  from specdec_jax.io.checkpoints import resolve
  source = pathlib.Path(path)
  if not source.exists():
    source = pathlib.Path(resolve.resolve(str(path)))
  file = heads_path(source)
  if not file.is_file():
    raise CheckpointError(f"{file}: no heads file (write one with sd.save_heads)")
  try:
    with safe_open(str(file), framework="numpy") as f:
      meta = f.metadata() or {}
      tensors = {k: f.get_tensor(k) for k in f.keys()}
  except Exception as e:   # safetensors raises its own error types for corrupt files
    raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from None
  if meta.get("format") != FORMAT:
    raise CheckpointError(f"{file}: not a specdec heads file (format {meta.get('format')!r})")
  params: dict[str, dict[str, Any]] = {}
  for key, value in tensors.items():
    name, leaf = key.split("/")
    params.setdefault(name, {})[leaf] = jnp.asarray(value)
  heads = Heads(params=params, num_heads=int(meta["num_heads"]),
                base=meta.get("base_fingerprint", ""))
  check_heads(model, heads)
  return heads


def heads_loss(model: Model, heads: Heads, inputs: Array | None, targets: Array,
               weights: Array | None = None, freeze_model: bool = True,
               rngs=None) -> tuple[Array, Array, Array]:
  """sum_h lambda_h L_h: cross-entropy of each head on the tokens it must predict.

  T5: targets int32 [B, T] decoder targets (0 = padding), the decoder input being them
  shifted right after the start token. Head j (2..h) at state t predicts targets[t + j - 1];
  with `freeze_model=False` head 1 (the model's own next-token loss) joins the sum and
  gradients reach the model too.
  Decoder-only: `inputs` None and targets the text [B, T] itself (right-padded
  with `pad_id`); the state at t (after reading targets[t]) predicts targets[t + j] with
  head j. Pad-id targets are not scored.
  Returns (loss [], per-head mean cross-entropy [h], per-head top-1 accuracy [h])
  (index 0: head 1).
  """
  deterministic = rngs is None
  if model.is_decoder_only:
    if inputs is not None:
      raise InputError("a decoder-only model's heads train on one token array: "
                       "heads_loss(model, heads, None, tokens)")
    states = model.hidden_states(targets, deterministic=deterministic, rngs=rngs)
    shift, pad = 1, model.config.pad_id
  else:
    if inputs is None:
      raise InputError("a T5 model's heads train on its encoder tokens and target tokens: "
                       "heads_loss(model, heads, inputs, targets)")
    dec_in = jnp.concatenate([jnp.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
    states = model.hidden_states(inputs, dec_in, deterministic=deterministic,
                                 rngs=rngs)
    shift, pad = 0, 0
  if freeze_model:
    states = jax.lax.stop_gradient(states)
  logits = jnp.concatenate([model.output_logits(states)[:, :, None],
                            head_logits(model, heads, states)], axis=2)       # [B, T, h, V]
  length, h = targets.shape[1], heads.num_heads
  ahead = jnp.arange(length)[:, None] + jnp.arange(h)[None, :] + shift         # [T, h]
  wanted = jnp.take_along_axis(jnp.pad(targets, ((0, 0), (0, h + shift)), constant_values=pad),
                               ahead.reshape(1, -1), axis=1).reshape(targets.shape + (h,))
  mask = (wanted != pad).astype(jnp.float32)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), wanted[..., None], -1)[..., 0]
  count = jnp.maximum(jnp.sum(mask, axis=(0, 1)), 1.0)
  per_head = jnp.sum(nll * mask, axis=(0, 1)) / count
  accuracy = jnp.sum((jnp.argmax(logits, -1) == wanted) * mask, axis=(0, 1)) / count
  lam = jnp.ones((h,), jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
  if freeze_model:
    lam = lam.at[0].set(0.0)                # head 1 is the frozen model: nothing to learn
  return jnp.sum(lam * per_head), per_head, accuracy
