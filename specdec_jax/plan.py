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
A decoder-only model (`LMConfig`, Gemma 4's `GemmaConfig`) has no encoder: its cache
holds the prompt (max_input_len tokens) before the decode, C + max_input_len slots
(`Model.decode_capacity`), each layer's K/V of its own [key/value heads, head size]
(Gemma 4's full layers differ from its sliding ones), and no cross-attention. A T5Gemma 2
model (`T5Gemma2Config`) caches grouped K/V [B, Hkv, Le + C, Dh] per decoder layer: one
buffer holding the cross K/V at slots [0, Le) and its own after them (its merged
attention, `models.t5gemma2`), its first Le slots counted as "cross_kv", the rest as
"self_kv", plus the mask, the lengths and the offset; its verify call's scores span the
same Le + C keys. A Gemma 4 assistant (`GemmaAssistantConfig`) caches nothing: it reads
the target's cache; it keeps the target's state [B, E_t] between rounds.

Transients, the largest live at once (an estimate: XLA may fuse or rematerialise):
the verify call's float32 logits [B, gamma + 1, V] (vocab over "model") with its
float32 attention scores over the cache [B, H, gamma + 1, C + Le], or the encoder's
float32 self-attention scores [B, H, Le, Le] with its MLP hidden [B, Le, n * M]; a
decoder-only model's prefill in place of the encoder: scores [B, H, Le, C + Le] and the
MLP hidden [B, Le, n * M] (its logits are unused, and XLA drops them).

`speedup_projection` projects the speedup of a pair from the same shapes: Theorem 8 of
Leviathan et al. (`theory.walltime_improvement`) with c the ratio of the weight
multiply-accumulates of a draft step to a target step (what a step bound by reading
weights costs), at assumed acceptance rates: a projection, never a measurement.
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

from specdec_jax import sharding, theory
from specdec_jax.cache import CrossKV, DecoderCache
from specdec_jax.config import LMConfig, T5Config, get_config
from specdec_jax.config.gemma import GemmaAssistantConfig, GemmaConfig
from specdec_jax.config.t5gemma2 import T5Gemma2Config
from specdec_jax.errors import ConfigError
from specdec_jax.models import gemma_assistant
from specdec_jax.models.model import module_for
from specdec_jax.rounds.engine import EXACT_WIDTH

#: A model `memory_plan` sizes: T5, a decoder-only LM (Gemma 4 included); as a drafter
#: also a Gemma 4 assistant.
PlanConfig = T5Config | LMConfig | GemmaAssistantConfig

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


def _decoder_only(config) -> bool:
  return isinstance(config, GemmaAssistantConfig) or config.is_decoder_only


def _kind(config) -> str:
  if isinstance(config, GemmaAssistantConfig):
    return "a Gemma 4 assistant (decoder-only)"
  return "decoder-only" if config.is_decoder_only else "an encoder-decoder (T5)"


def kv_shapes(config: T5Config | LMConfig) -> tuple[tuple[int, int], ...]:
  """[key/value heads, head size] of each decoder layer's self-attention cache (a Gemma 4
  K/V-shared layer has none)."""
  if isinstance(config, GemmaConfig):
    return tuple(map(config.layer_shape, range(config.cached_layers)))
  if isinstance(config, LMConfig):
    return ((config.num_kv_heads, config.head_dim),) * config.num_layers
  if isinstance(config, T5Gemma2Config):   # grouped K/V heads, as the decoder's buffers hold
    return ((config.num_kv_heads, config.head_dim),) * config.num_decoder_layers
  return ((config.num_heads, config.head_dim),) * config.num_decoder_layers


@functools.lru_cache(maxsize=16)
def abstract_params(config: T5Config | LMConfig
                    ) -> tuple[tuple[str, tuple[int, ...], tuple], ...]:
  """(path, shape, logical axes) of every parameter, from `jax.eval_shape` of the init."""
  dummy = jnp.ones((1, 2), jnp.int32)
  tokens = (dummy,) if isinstance(config, LMConfig) else (dummy, dummy)
  boxed = jax.eval_shape(module_for(config).init, jax.random.PRNGKey(0), *tokens)["params"]
  shapes = flatten_dict(nn.unbox(boxed), sep="/")
  axes = flatten_dict(nn.get_partition_spec(boxed), sep="/")
  return tuple((path, tuple(leaf.shape), tuple(axes[path])) for path, leaf in
               sorted(shapes.items()))


@functools.lru_cache(maxsize=16)
def _assistant_shapes(config: GemmaAssistantConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
  return tuple(sorted(gemma_assistant.param_shapes(config).items()))


@functools.lru_cache(maxsize=64)
def param_bytes(config: PlanConfig, dtype: str, mesh, rules=None, replicated: bool = False
                ) -> int:
  """Per-device bytes of a model's parameters in `dtype`, split by `rules` (or replicated;
  a Gemma 4 assistant always is: it is placed whole on every device). Memoised: a search
  for the largest batch asks again for each batch."""
  rules = sharding.RULES_1D if rules is None else rules
  itemsize = jnp.dtype(dtype).itemsize
  if isinstance(config, GemmaAssistantConfig):   # its token ordering is int32
    return sum(int(np.prod(shape)) * (4 if path == "token_ordering" else itemsize)
               for path, shape in _assistant_shapes(config))
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


def cache_slots(config: PlanConfig, capacity: int, max_input_len: int) -> int:
  """Self-attention slots of a model's cache: `capacity` for T5; a decoder-only model's
  holds its prompt first (`Model.decode_capacity`), capped at a learned position table."""
  if not isinstance(config, LMConfig):
    return capacity
  slots = capacity + max_input_len
  return min(slots, config.max_positions) if config.positions == "learned" else slots


def cache_layout(config: T5Config | LMConfig, batch: int, mesh, split_heads: bool = True
                 ) -> DecoderCache:
  """The `PartitionSpec` of every leaf of a `DecoderCache` in the planned layout: K/V
  [B, Hkv, *, Dh] by batch over "data" and (`split_heads`) each layer's heads over "model"
  (whole where the axis does not divide them), the encoder mask [B, Le] by batch, the
  lengths [B] whole; a decoder-only model's cache has no cross-attention; a T5Gemma 2
  cache keeps the cross K/V in its own buffers (`cross` the mask alone; the offset [B]
  whole). Place a cache with it, e.g. `jax.jit(model.start, out_shardings=...)` with
  `NamedSharding(mesh, spec)` per leaf."""
  b = _split(batch, mesh, "data")
  kv = tuple(PartitionSpec(b, _split(heads, mesh, "model") if split_heads else None)
             for heads, _ in kv_shapes(config))
  merged = isinstance(config, T5Gemma2Config)
  cross_kv = () if merged else kv
  # (ignored arg-type: the cache's tree with a PartitionSpec at each array's place)
  cross = (None if isinstance(config, LMConfig) else
           CrossKV(key=cross_kv, value=cross_kv, mask=PartitionSpec(b)))  # type: ignore[arg-type]
  offset = PartitionSpec() if merged else None
  return DecoderCache(self_key=kv, self_value=kv, length=PartitionSpec(),  # type: ignore[arg-type]
                      cross=cross, offset=offset)  # type: ignore[arg-type]


def cache_bytes(config: PlanConfig, batch: int, capacity: int, max_input_len: int, dtype: str,
                mesh, split_heads: bool = True) -> dict[str, int]:
  """Per-device bytes of a `DecoderCache`: {"self_kv", "cross_kv", "other"} (`capacity`:
  `cache_slots`); a Gemma 4 assistant's state between rounds: {"state"}."""
  itemsize = jnp.dtype(dtype).itemsize
  b = _split(batch, mesh, "data")
  if isinstance(config, GemmaAssistantConfig):   # the target's state [B, E_t] and ready [B]
    return {"state": _per_device((batch, config.backbone_dim), (b,), mesh) * itemsize + batch}

  def kv(length):   # K and V of every layer: [B, Hkv, length, Dh]
    return sum(2 * _per_device((batch, heads, length, dim),
                               (b, _split(heads, mesh, "model") if split_heads else None),
                               mesh) * itemsize for heads, dim in kv_shapes(config))

  if isinstance(config, LMConfig):   # the prompt sits in the self-attention cache; no encoder
    return {"self_kv": kv(capacity), "cross_kv": 0, "other": 4 * batch}
  # T5Gemma 2: one buffer per layer, Le cross slots then `capacity` own (bytes are linear in
  # the slots, so the split sums to the buffer), and an offset [B] beside the lengths
  counters = 8 * batch if isinstance(config, T5Gemma2Config) else 4 * batch
  return {"self_kv": kv(capacity), "cross_kv": kv(max_input_len),
          "other": _per_device((batch, max_input_len), (b,), mesh) + counters}


def transient_bytes(config: T5Config | LMConfig, batch: int, width: int, capacity: int,
                    max_input_len: int, dtype: str, mesh) -> dict[str, int]:
  """Per-device bytes of the largest transients: {"verify", "encode"} (T5) or {"verify",
  "prefill"} (decoder-only; `capacity` its `cache_slots`, the prompt included)."""
  b = _split(batch, mesh, "data")
  h = _split(config.num_heads, mesh, "model")
  v = _split(config.vocab_size, mesh, "model")
  m = _split(config.mlp_dim, mesh, "model")
  heads, le = config.num_heads, max_input_len
  lm = isinstance(config, LMConfig)
  keys = capacity if lm else capacity + le
  mlp_inputs = ((1 if config.mlp == "gelu_tanh" else 2) if isinstance(config, LMConfig)
                else len(config.mlp_activations))
  logits = _per_device((batch, width, config.vocab_size), (b, None, v), mesh) * 4
  scores = _per_device((batch, heads, width, keys), (b, h), mesh) * 4
  first_scores = _per_device((batch, heads, le, capacity if lm else le), (b, h), mesh) * 4
  hidden = (_per_device((batch, le, config.mlp_dim), (b, None, m), mesh)
            * mlp_inputs * jnp.dtype(dtype).itemsize)
  return {"verify": logits + scores, "prefill" if lm else "encode": first_scores + hidden}


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
  slots: int = 0

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


def memory_plan(target: T5Config | LMConfig, drafter: PlanConfig | None, batch: int,
                settings: PlanSettings) -> MemoryPlan:
  """Per-device bytes of decoding `batch` rows with `target` (and `drafter`: speculative
  decoding with `settings.gamma` drafts per round; None: the baseline) on a mesh of shape
  `settings.mesh` ({"data": D, "model": M}, default one device)."""
  s = settings
  if isinstance(target, GemmaAssistantConfig):
    raise ConfigError("a Gemma 4 assistant is a drafter: plan it as --drafter beside its Gemma 4 "
                      "target")
  if drafter is not None and target.is_decoder_only != _decoder_only(drafter):
    raise ConfigError(f"the target is {_kind(target)} and the drafter {_kind(drafter)}: a "
                      "drafter is of its target's kind")
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
  target_cache = cache_bytes(target, batch, cache_slots(target, cap, max_input_len),
                             max_input_len, dtype, abstract)
  drafter_cache = ({} if drafter is None else
                   cache_bytes(drafter, batch, cache_slots(drafter, cap, max_input_len),
                               max_input_len, dtype, abstract, split_heads=False))
  return MemoryPlan(
      batch=batch, mesh=sizes, capacity=cap, slots=cache_slots(target, cap, max_input_len),
      target_params=param_bytes(target, dtype, abstract, s.rules),
      drafter_params=0 if drafter is None else param_bytes(drafter, dtype, abstract,
                                                           replicated=True),
      target_cache=target_cache, drafter_cache=drafter_cache,
      transients=transient_bytes(target, batch, width, cache_slots(target, cap, max_input_len),
                                 max_input_len, dtype, abstract),
      target_params_whole=param_bytes(target, dtype, abstract, replicated=True))


def largest_batch(device_bytes: int, target: T5Config | LMConfig, drafter: PlanConfig | None,
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


def draft_macs_per_step(config: PlanConfig) -> int:
  """Weight multiply-accumulates of one draft step: a model's `decode_macs_per_token`; a
  Gemma 4 assistant's projections, query-only layers and logits (with centroids: the
  centroid scores and the kept tokens' logits alone)."""
  if not isinstance(config, GemmaAssistantConfig):
    return config.decode_macs_per_token()
  e = config.decoder.emb_dim
  skip = ("token_embedder/embedding", "centroids/kernel")
  total = sum(int(np.prod(shape)) for path, shape in _assistant_shapes(config)
              if len(shape) == 2 and path not in skip)
  if config.num_centroids is None:
    return total + e * config.vocab_size
  kept = config.centroid_top_k * (config.vocab_size // config.num_centroids)
  return total + e * (config.num_centroids + kept)


def speedup_projection(target: T5Config | LMConfig, drafter: PlanConfig, gamma: int,
                       alphas=theory.PROJECTION_ALPHAS) -> dict[str, Any]:
  """A PROJECTION of the pair's speedup from shapes alone (see the module docstring): c =
  `draft_macs_per_step(drafter)` / the target's, then for each assumed acceptance rate alpha
  Theorem 8's speedup at `gamma` and at its best gamma (`theory.optimal_gamma`), with the
  expected tokens per target call (Equation 1). Nothing is measured."""
  c = draft_macs_per_step(drafter) / target.decode_macs_per_token()
  rows = []
  for alpha in alphas:
    best = theory.optimal_gamma(alpha, c, max_gamma=16)
    rows.append({"alpha": alpha, "gamma": gamma,
                 "tokens_per_target_call": float(theory.expected_tokens_per_call(alpha, gamma)),
                 "speedup": float(theory.walltime_improvement(alpha, gamma, c)),
                 "best_gamma": best.gamma, "best_speedup": best.improvement})
  return {"kind": "projection", "c": c,
          "basis": "Theorem 8 (Leviathan et al. 2023: a verify call costs one target step); "
                   "c = weight multiply-accumulates of a draft step / a target step; alpha "
                   "assumed, not measured",
          "rows": rows}


def config_of(spec: str) -> PlanConfig:
  """A model's config without its weights: "config:NAME", a named config, a config JSON
  file, or a checkpoint directory / bundled name (its stored config.json)."""
  from specdec_jax.io.checkpoints import _hf_reader, config_from_json_dict, native, resolve
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
    return _hf_reader(hf_config).config_from_hf_dict(hf_config,
                                                     source=f"{directory}/config.json")
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


__all__ = ["DEVICES", "MemoryPlan", "PlanConfig", "PlanSettings", "RULES", "abstract_mesh",
           "cache_bytes", "cache_layout", "cache_slots", "capacity", "config_of",
           "draft_macs_per_step", "fmt_bytes", "kv_shapes", "largest_batch", "memory_plan",
           "param_bytes", "parse_memory", "speedup_projection", "transient_bytes"]
