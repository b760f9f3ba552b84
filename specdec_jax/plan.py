"""Per-device memory of a decode on a mesh, from shapes alone: no weight is ever made.

    shape = PlanSettings(max_input_len=512, max_new_tokens=64, gamma=5, dtype="bfloat16",
                         mesh={"data": 1, "model": 8})
    plan = memory_plan(sd.get_config("t5_1_1_xxl"), sd.get_config("t5_1_1_small"), 8, shape)
    plan.total_bytes                    # per device: parameters + caches + transients
    largest_batch(DEVICES["tpu-v5e"], target, drafter, shape, headroom=0.1)

Parameters: every leaf's abstract shape and logical axes (`jax.eval_shape` of the
model's init, as `sd.logical_axes` reads them), split by `sd.sharding.partition_spec`
under the rules (`RULES_1D` by default) on an abstract mesh of the requested shape, in
`dtype`. The target is split by the rules; the drafter is replicated
(`sd.sharding.replicate`: a full copy per device), as `specdec decode --mesh` places them.

Decoder caches (`cache.DecoderCache`), per model and decoder layer: self-attention K and
V [B, H, C, Dh] at capacity C = max_new_tokens + gamma + 1 (exact mode: max_new_tokens +
`engine.EXACT_WIDTH`; the baseline: max_new_tokens), cross-attention K and V
[B, H, Le, Dh] over Le = max_input_len, in the activation dtype, plus the encoder mask
[B, Le] and the lengths [B], laid out by batch over "data" and heads over "model" (the
target's; the drafter's heads stay whole, its weights being replicated); a dimension
the axis does not divide stays whole, as `partition_spec` does for parameters
(`cache_layout`). The decode engine pins its caches to this layout
(`sd.sharding.constrain_state`); where "model" does not divide the heads the plan counts
them whole, an upper bound (XLA may split them over parts of "model", docs/scale.md).

Transients, the largest live at once (an estimate: XLA may fuse or rematerialise):
the verify call's float32 logits [B, gamma + 1, V] (vocab over "model") with its
float32 attention scores over the cache [B, H, gamma + 1, C + Le], or the encoder's
float32 self-attention scores [B, H, Le, Le] with its MLP hidden [B, Le, n * M].
Framework overhead (XLA's scratch, the runtime, fragmentation) is not counted: keep a
margin (`headroom`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax.traverse_util import flatten_dict
from jax.sharding import AbstractMesh, PartitionSpec

from specdec_jax import sharding
from specdec_jax.cache import CrossKV, DecoderCache
from specdec_jax.config import T5Config, get_config
from specdec_jax.errors import ConfigError
from specdec_jax.models.model import module_for
from specdec_jax.rounds.engine import EXACT_WIDTH

GiB = 1 << 30

#: Device memory presets (bytes per device).
DEVICES = {"tpu-v4": 32 * GiB, "tpu-v5e": 16 * GiB, "a100-80g": 80 * GiB,
           "h100-80g": 80 * GiB}

RULES = {"1d": sharding.RULES_1D, "2d": sharding.RULES_2D}

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_memory(text: str) -> tuple[str, int]:
  """"16GiB" / "80GB" / "1e9" / a preset name -> (label, bytes).

  ConfigError: an unknown unit or preset.

  >>> parse_memory("16GiB"), parse_memory("tpu-v4")
  (('16GiB', 17179869184), ('tpu-v4', 34359738368))
  """
  key = text.strip().lower()
  if key in DEVICES:
    return key, DEVICES[key]
  match = re.fullmatch(r"([0-9.]+(?:e[0-9]+)?)\s*([a-z]*)", key)
  if not match or match.group(2) not in _UNITS:
    raise ConfigError(f"device memory {text!r}: expected a size such as 16GiB or 80GB, or a "
                      f"preset ({', '.join(DEVICES)})")
  value = float(match.group(1)) * _UNITS[match.group(2)]
  if value <= 0:
    raise ConfigError(f"device memory {text!r} must be positive")
  return text.strip(), int(value)


def abstract_mesh(data: int = 1, model: int = 1) -> AbstractMesh:
  """A mesh of the given shape without devices: planning needs only the axis sizes."""
  for name, size in (("data", data), ("model", model)):
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
      raise ConfigError(f"mesh axis {name!r} must be a positive integer, got {size!r}")
  return AbstractMesh((int(data), int(model)), sharding.MESH_AXES)


def _per_device(shape, spec, mesh) -> int:
  """Elements per device of an array [shape] split by `spec` (a PartitionSpec) on `mesh`."""
  n = 1
  for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
    n *= dim // mesh.shape[axis] if axis is not None else dim
  return n


def _split(size: int, mesh, axis: str) -> str | None:
  """`axis` if it divides `size`, else None (whole), as `partition_spec` decides."""
  return axis if size % mesh.shape[axis] == 0 else None


@functools.lru_cache(maxsize=16)
def abstract_params(config: T5Config) -> tuple[tuple[str, tuple[int, ...], tuple], ...]:
  """(path, shape, logical axes) of every parameter, from `jax.eval_shape` of the init."""
  dummy = jnp.ones((1, 2), jnp.int32)
  boxed = jax.eval_shape(module_for(config).init, jax.random.PRNGKey(0), dummy, dummy)["params"]
  shapes = flatten_dict(nn.unbox(boxed), sep="/")
  axes = flatten_dict(nn.get_partition_spec(boxed), sep="/")
  return tuple((path, tuple(leaf.shape), tuple(axes[path])) for path, leaf in
               sorted(shapes.items()))


def param_bytes(config: T5Config, dtype: str, mesh, rules=None, replicated: bool = False
                ) -> int:
  """Per-device bytes of a model's parameters in `dtype`, split by `rules` (or replicated)."""
  rules = sharding.RULES_1D if rules is None else rules
  itemsize = jnp.dtype(dtype).itemsize
  total = 0
  for path, shape, axes in abstract_params(config):
    spec = () if replicated else sharding.partition_spec(axes, mesh, rules, shape, path)
    total += _per_device(shape, spec, mesh) * itemsize
  return total


def capacity(max_new_tokens: int, gamma: int, exact: bool = False) -> int:
  """Cache positions of a decode (`engine.RoundConfig.capacity`).

  >>> capacity(64, 5), capacity(64, 5, exact=True), capacity(64, 0)
  (70, 80, 64)
  """
  if exact:
    return max_new_tokens + EXACT_WIDTH
  return max_new_tokens + gamma + 1 if gamma else max_new_tokens


def cache_layout(config: T5Config, batch: int, mesh, split_heads: bool = True
                 ) -> DecoderCache:
  """The `PartitionSpec` of every leaf of a `DecoderCache` in the planned layout: K/V
  [B, H, *, Dh] by batch over "data" and (`split_heads`) heads over "model", the encoder
  mask [B, Le] by batch, the lengths [B] whole. Place a cache with it, e.g.
  `jax.jit(model.start, out_shardings=...)` with `NamedSharding(mesh, spec)` per leaf."""
  b = _split(batch, mesh, "data")
  h = _split(config.num_heads, mesh, "model") if split_heads else None
  kv = (PartitionSpec(b, h),) * config.num_decoder_layers
  # (ignored arg-type: the cache's tree with a PartitionSpec at each array's place)
  cross = CrossKV(key=kv, value=kv, mask=PartitionSpec(b))  # type: ignore[arg-type]
  return DecoderCache(self_key=kv, self_value=kv, length=PartitionSpec(),  # type: ignore[arg-type]
                      cross=cross)


def cache_bytes(config: T5Config, batch: int, capacity: int, max_input_len: int, dtype: str,
                mesh, split_heads: bool = True) -> dict[str, int]:
  """Per-device bytes of a `DecoderCache`: {"self_kv", "cross_kv", "other"}."""
  itemsize = jnp.dtype(dtype).itemsize
  b = _split(batch, mesh, "data")
  h = _split(config.num_heads, mesh, "model") if split_heads else None
  layers = config.num_decoder_layers

  def kv(length):   # K and V of every layer: [B, H, length, Dh]
    return 2 * layers * _per_device((batch, config.num_heads, length, config.head_dim),
                                    (b, h), mesh) * itemsize

  return {"self_kv": kv(capacity), "cross_kv": kv(max_input_len),
          "other": _per_device((batch, max_input_len), (b,), mesh) + 4 * batch}


def transient_bytes(config: T5Config, batch: int, width: int, capacity: int,
                    max_input_len: int, dtype: str, mesh) -> dict[str, int]:
  """Per-device bytes of the largest transients: {"verify", "encode"} (see the module)."""
  b = _split(batch, mesh, "data")
  h = _split(config.num_heads, mesh, "model")
  v = _split(config.vocab_size, mesh, "model")
  m = _split(config.mlp_dim, mesh, "model")
  heads, le = config.num_heads, max_input_len
  logits = _per_device((batch, width, config.vocab_size), (b, None, v), mesh) * 4
  scores = _per_device((batch, heads, width, capacity + le), (b, h), mesh) * 4
  enc_scores = _per_device((batch, heads, le, le), (b, h), mesh) * 4
  hidden = (_per_device((batch, le, config.mlp_dim), (b, None, m), mesh)
            * len(config.mlp_activations) * jnp.dtype(dtype).itemsize)
  return {"verify": logits + scores, "encode": enc_scores + hidden}


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Per-device bytes of one request shape on one mesh (see the module docstring)."""

  batch: int
  mesh: dict[str, int]
  capacity: int
  target_params: int
  drafter_params: int
  target_cache: dict[str, int]
  drafter_cache: dict[str, int]
  transients: dict[str, int]
  target_params_whole: int = 0

  @property
  def target_split(self) -> str:
    """How the mesh's "model" axis splits the target's parameters: "one device" (no
    axis to split over), "split" (some or all of them), or "replicated" (the axis
    divides no parameter dimension the rules name: each device holds them whole)."""
    if self.mesh.get("model", 1) == 1:
      return "one device"
    return "replicated" if self.target_params >= self.target_params_whole else "split"

  @property
  def params_bytes(self) -> int:
    return self.target_params + self.drafter_params

  @property
  def cache_bytes(self) -> int:
    return sum(self.target_cache.values()) + sum(self.drafter_cache.values())

  @property
  def transient_bytes(self) -> int:
    return max(self.transients.values())

  @property
  def total_bytes(self) -> int:
    return self.params_bytes + self.cache_bytes + self.transient_bytes

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out.update(params_bytes=self.params_bytes, cache_bytes=self.cache_bytes,
               transient_bytes=self.transient_bytes, total_bytes=self.total_bytes,
               target_split=self.target_split)
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanSettings:
  """The request shape and layout `memory_plan` sizes (beside the models and the batch).

  Attributes:
    max_input_len: encoder tokens per row.
    max_new_tokens: tokens decoded per row at most.
    gamma: drafts per round of speculative decoding (ignored without a drafter).
    dtype: the parameters' and activations' dtype.
    mesh: the mesh's shape, {"data": D, "model": M} (None or a missing axis: 1).
    rules: the logical-axis rules splitting the target (None: `sharding.RULES_1D`).
    exact: exact mode (each call at `engine.EXACT_WIDTH` tokens).
  """

  max_input_len: int
  max_new_tokens: int
  gamma: int = 5
  dtype: str = "float32"
  mesh: Mapping[str, int] | None = None
  rules: Any = None
  exact: bool = False


def memory_plan(target: T5Config, drafter: T5Config | None, batch: int,
                settings: PlanSettings) -> MemoryPlan:
  """Per-device bytes of decoding `batch` rows with `target` (and `drafter`: speculative
  decoding with `settings.gamma` drafts per round; None: the baseline) on a mesh of shape
  `settings.mesh` ({"data": D, "model": M}, default one device)."""
  s = settings
  max_input_len, max_new_tokens, gamma, dtype = (s.max_input_len, s.max_new_tokens, s.gamma,
                                                 s.dtype)
  for name, value in (("batch", batch), ("max_input_len", max_input_len),
                      ("max_new_tokens", max_new_tokens)):
    if not isinstance(value, (int, np.integer)) or value < 1:
      raise ConfigError(f"{name} must be a positive integer, got {value!r}")
  if drafter is not None and (not isinstance(gamma, (int, np.integer)) or gamma < 1):
    raise ConfigError(f"gamma must be a positive integer, got {gamma!r}")
  sizes = {"data": 1, "model": 1, **dict(s.mesh or {})}
  abstract = abstract_mesh(sizes["data"], sizes["model"])
  if batch % sizes["data"]:
    raise ConfigError(f"batch {batch} is not divisible by the mesh's 'data' axis of size "
                      f"{sizes['data']}")
  g = gamma if drafter is not None else 0
  cap = capacity(max_new_tokens, g, s.exact)
  width = EXACT_WIDTH if s.exact else g + 1
  target_cache = cache_bytes(target, batch, cap, max_input_len, dtype, abstract)
  drafter_cache = ({} if drafter is None else
                   cache_bytes(drafter, batch, cap, max_input_len, dtype, abstract,
                               split_heads=False))
  return MemoryPlan(
      batch=batch, mesh=sizes, capacity=cap,
      target_params=param_bytes(target, dtype, abstract, s.rules),
      drafter_params=0 if drafter is None else param_bytes(drafter, dtype, abstract,
                                                           replicated=True),
      target_cache=target_cache, drafter_cache=drafter_cache,
      transients=transient_bytes(target, batch, width, cap, max_input_len, dtype, abstract),
      target_params_whole=param_bytes(target, dtype, abstract, replicated=True))


def largest_batch(device_bytes: int, target: T5Config, drafter: T5Config | None,
                  settings: PlanSettings, *, headroom: float = 0.0,
                  limit: int = 1 << 20) -> int:
  """The largest batch (a multiple of the mesh's "data" size) whose `memory_plan` fits in
  `device_bytes` * (1 - headroom); 0 if even the smallest does not."""
  budget = device_bytes * (1.0 - headroom)
  step = dict(settings.mesh or {}).get("data", 1)

  def fits(k: int) -> bool:
    return memory_plan(target, drafter, k * step, settings).total_bytes <= budget

  if not fits(1):
    return 0
  lo, hi = 1, 2
  while hi * step <= limit and fits(hi):
    lo, hi = hi, hi * 2
  hi = min(hi, limit // step + 1)
  while hi - lo > 1:          # fits(lo), not fits(hi): bytes grow with the batch
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
  return lo * step


def config_of(spec: str) -> T5Config:
  """A model's config without its weights: "config:NAME", a named config, a config JSON
  file, or a checkpoint directory / bundled name (its stored config.json)."""
  from specdec_jax.io.checkpoints import config_from_json_dict, native, resolve
  from specdec_jax.io.checkpoints.hf import config_from_hf_dict
  name = spec[len("config:"):] if spec.startswith("config:") else spec
  try:
    return get_config(name)
  except ConfigError:
    if spec.startswith("config:"):
      raise
  fmt, directory = resolve.locate(resolve.resolve(spec))
  if fmt == resolve.SPECDEC:
    return native.read_config(directory)
  if fmt == resolve.HF:
    hf_config = resolve.read_json(directory, "config.json")
    if hf_config is None:
      raise ConfigError(f"{directory}/config.json: not found (a Hugging Face dir needs it)")
    return config_from_hf_dict(hf_config, source=f"{directory}/config.json")
  # an Orbax state/ dir: its config.json is searched from the step dir up
  start = resolve.parent(directory) if resolve.has_file(directory, "_METADATA") else directory
  found = resolve.find_config_json(start)
  if found is None:
    raise ConfigError(f"{spec}: a T5X checkpoint without a config.json; plan from its "
                      f"architecture instead (config:NAME or a config JSON file)")
  return config_from_json_dict(found[1], found[0])


def fmt_bytes(n: int) -> str:
  """Bytes in GiB (or MiB below one GiB), for tables."""
  return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / (1 << 20):.1f} MiB"


__all__ = ["DEVICES", "MemoryPlan", "PlanSettings", "RULES", "abstract_mesh", "cache_bytes",
           "cache_layout", "capacity",
           "config_of", "fmt_bytes", "largest_batch", "memory_plan", "param_bytes",
           "parse_memory", "transient_bytes"]
