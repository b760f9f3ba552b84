"""T5's layers in flax.linen, with T5X's parameter names and logical axis names.

Dense (no bias in T5), fused products for decode steps, RMSNorm, the shared embedding,
relative position buckets and bias, multi-head attention (heads-major, no 1/sqrt(d)
scaling: it lives in the query init), and the (gated) MLP. The decoder-only LMs
(`models.lm`) reuse them with biases, grouped-query attention and `LayerNorm`.

Every product of a decode request (a Dense, a fused Q/K/V / K/V / wi_*, the tied
output layer, an RMSNorm's sum of squares, an attention) goes through
`specdec_jax.kernels.dispatch`, which runs it on a CPU kernel when the request carries
its packed operand (`models.packing.pack`) and on XLA's ops otherwise.

On a mesh, activations are constrained by logical axis names where T5X's layers
constrain them (`with_logical_constraint`): the embedded tokens, queries / keys /
values, the MLP's hidden layer. A layer without a `partitioner` adds nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.config import mlp_kernel_names
from specdec_jax.kernels import dispatch
from specdec_jax.kernels.shapes import additive, dense_bias, soft_cap

Array = jax.Array


# ----------------------------------------------------------------------------- position buckets


def relative_position_bucket(relative_position: np.ndarray, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> np.ndarray:
  """T5's bucketing of relative positions (key position - query position).

  Half the buckets are exact offsets, the rest log-spaced up to `max_distance`;
  bidirectional splits the buckets between the two signs. Computed in numpy
  float32 exactly as T5X does, so bucket boundaries agree with T5X checkpoints.
  """
  n = -np.asarray(relative_position, np.int64)
  bucket = np.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    bucket += (n < 0).astype(np.int64) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  log_ratio = np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
  large = max_exact + (log_ratio / np.log(max_distance / max_exact)
                       * (num_buckets - max_exact)).astype(np.int32)
  large = np.minimum(large, num_buckets - 1)
  return (bucket + np.where(n < max_exact, n, large)).astype(np.int32)


@functools.lru_cache(maxsize=64)
def _causal_bucket_table(size: int, num_buckets: int, max_distance: int) -> np.ndarray:
  """Bucket of the distance n = query - key >= 0, for n in [0, size)."""
  return relative_position_bucket(-np.arange(size), False, num_buckets, max_distance)


# ----------------------------------------------------------------------------- layers


def with_logical_constraint(x: Array, axes: tuple[str | None, ...], partitioner) -> Array:
  """T5X's activation constraint: `x` pinned to the layout its logical `axes` (one name
  per dimension) map to under `partitioner` (`sd.sharding.Partitioner`: a mesh and
  rules). Without one (one device, the CPU kernels) `x` itself: no op is added, so the
  program off a mesh is unchanged."""
  return x if partitioner is None else partitioner.with_logical_constraint(x, axes)


@dataclasses.dataclass(frozen=True)
class Init:
  """A parameter initializer as a hashable value (equal inits share compiled code).

  kind: "fan_in_normal" (T5X's dense kernels; queries scaled by head_dim ** -0.5),
  "normal" (the embedding, stddev `scale`), "ones" (norm scales), "zeros" (biases),
  "fan_avg_uniform" (relative position tables).
  """

  kind: str
  scale: float = 1.0

  def __call__(self, key: Array, shape, dtype=jnp.float32) -> Array:
    if self.kind == "ones":
      return jnp.ones(shape, dtype)
    if self.kind == "zeros":
      return jnp.zeros(shape, dtype)
    if self.kind == "normal":
      return jax.random.normal(key, shape, dtype) * self.scale
    modes: dict[str, tuple[Literal["fan_in", "fan_avg"], Literal["normal", "uniform"]]] = {
        "fan_in_normal": ("fan_in", "normal"), "fan_avg_uniform": ("fan_avg", "uniform")}
    mode, distribution = modes[self.kind]
    return nn.initializers.variance_scaling(1.0, mode, distribution)(key, shape, dtype) \
        * self.scale


def kernel_init(scale: float = 1.0) -> Init:
  """T5X's dense init: fan-in normal, times `scale` (queries: head_dim ** -0.5)."""
  return Init("fan_in_normal", scale)


EMBEDDING_INIT = Init("normal")
NORM_SCALE_INIT = Init("ones")
BIAS_INIT = Init("zeros")
REL_EMBEDDING_INIT = Init("fan_avg_uniform")


def initializer_for(path: tuple[str, ...], head_dim: int) -> Callable:
  """The initializer of the parameter at `path` (T5X tree names), as the layers below use
  it: lets a model be initialised one parameter at a time (`models.model.init_model`)."""
  name = path[-1]
  if name == "kernel":
    return kernel_init(head_dim ** -0.5 if path[-2] == "query" else 1.0)
  table = {"embedding": EMBEDDING_INIT, "scale": NORM_SCALE_INIT,
           "rel_embedding": REL_EMBEDDING_INIT, "bias": BIAS_INIT,
           "layer_scalar": NORM_SCALE_INIT, "eoi_embedding": BIAS_INIT}
  if name not in table:
    raise KeyError(f"no initializer known for parameter {'/'.join(path)}")
  return table[name]


class Dense(nn.Module):
  """y = x @ kernel (+ bias with `use_bias`; T5 has none); kernel [in, out] stored 2-D as in
  T5X checkpoints, bias [out]."""

  in_features: int
  features: int
  axes: tuple[str, str]
  dtype: jnp.dtype = jnp.float32
  init_scale: float = 1.0
  use_bias: bool = False

  def setup(self):
    self.kernel = self.param("kernel",
                             nn.with_logical_partitioning(kernel_init(self.init_scale), self.axes),
                             (self.in_features, self.features), jnp.float32)
    if self.use_bias:
      self.bias = self.param("bias", nn.with_logical_partitioning(BIAS_INIT, self.axes[1:]),
                             (self.features,), jnp.float32)

  def __call__(self, x: Array) -> Array:
    """[..., in] -> [..., features] in `dtype`."""
    dt = self.dtype
    y = dispatch.dot(self, "kernel", x, (dispatch.param_path(self, "kernel"),), self.features,
                     dt, lambda: jnp.dot(x.astype(dt), jnp.asarray(self.kernel, dt)))
    return y + jnp.asarray(self.bias, dt) if self.use_bias else y


def fused_dense(module: nn.Module, name: str, x: Array, denses: list[Dense], dtype,
                fuse: bool = True) -> list[Array]:
  """[x @ k_1, x @ k_2, ...], with `fuse` as ONE dot against the concatenated kernel.

  Same maths either way. Fuse in decode steps: there the concatenation is
  loop-invariant (XLA hoists it out of the while loop), and one wide GEMV streams
  the weights faster than several narrow ones (CPU batch-1 decode is
  bandwidth-bound: ~14% less time per token for T5 1.1 small). Don't fuse in
  passes that run once per call (encoder, cross K/V): there the concatenated copy
  of the kernels is paid on every call (~1 ms per layer for the demo target).
  On the CPU kernel (product `name` of `module`) the kernels are packed joined, once
  per model: one skinny product either way.
  """
  sizes = np.cumsum([d.features for d in denses])
  kernels = lambda: [jnp.asarray(d.kernel, dtype) for d in denses]

  def xla():
    if fuse:
      return jnp.dot(x.astype(dtype), jnp.concatenate(kernels(), axis=1))
    # XLA folds these slices of a concatenation back into the separate dots.
    return jnp.concatenate([jnp.dot(x.astype(dtype), k) for k in kernels()], axis=-1)

  sources = tuple(dispatch.param_path(d, "kernel") for d in denses)
  y = dispatch.dot(module, name, x, sources, int(sizes[-1]), dtype, xla)
  if any(d.use_bias for d in denses):   # an elementwise add after the product
    y = y + jnp.concatenate([jnp.asarray(d.bias, dtype) if d.use_bias
                             else jnp.zeros((d.features,), dtype) for d in denses])
  return jnp.split(y, sizes[:-1].tolist(), axis=-1)


class RMSNorm(nn.Module):
  """T5 layer norm: x * rsqrt(mean(x^2) + eps) * scale, in float32; no bias, no centring.

  Gemma's norms over each attention head set `axis` "kv" (the scale [Dh]); its values'
  norm has no scale (`use_scale` False). Gemma 2 and 3 (and T5Gemma 2) multiply by
  1 + scale (`scale_offset` 1; their scales are stored around 0); Gemma 4 by the scale.
  """

  epsilon: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  use_scale: bool = True
  axis: str = "embed"          # the scale's logical axis
  scale_offset: float = 0.0

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = x.astype(jnp.float32)
    if not self.use_scale:
      y = x * jax.lax.rsqrt(dispatch.mean_square(self, x, None) + self.epsilon)
      return y.astype(self.dtype)
    scale = self.param("scale", nn.with_logical_partitioning(NORM_SCALE_INIT, (self.axis,)),
                       (x.shape[-1],), jnp.float32)
    y = x * jax.lax.rsqrt(dispatch.mean_square(self, x) + self.epsilon)
    if self.scale_offset:     # in float32, as transformers' Gemma 3 norm
      return (y * (self.scale_offset + jnp.asarray(scale, jnp.float32))).astype(self.dtype)
    return y.astype(self.dtype) * jnp.asarray(scale, self.dtype)


class LayerNorm(nn.Module):
  """GPT-2's layer norm: (x - mean) * rsqrt(var + eps) * scale + bias, in float32.

  The variance is `dispatch.mean_square` of the centred x, as RMSNorm's sum of squares.
  """

  epsilon: float = 1e-5
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param("scale", nn.with_logical_partitioning(NORM_SCALE_INIT, ("embed",)),
                       (x.shape[-1],), jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(BIAS_INIT, ("embed",)),
                      (x.shape[-1],), jnp.float32)
    x = x.astype(jnp.float32)
    x = x - jnp.mean(x, axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(dispatch.mean_square(self, x) + self.epsilon)
    return (y * jnp.asarray(scale) + jnp.asarray(bias)).astype(self.dtype)


class Embed(nn.Module):
  """Token embedding [vocab, emb]; `attend` gives tied logits."""

  vocab_size: int
  features: int
  dtype: jnp.dtype = jnp.float32
  partitioner: Any = None       # `with_logical_constraint`

  def setup(self):
    self.embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(EMBEDDING_INIT, ("vocab", "embed")),
        (self.vocab_size, self.features), jnp.float32)

  def __call__(self, tokens: Array) -> Array:
    """[B, T] int -> [B, T, E] in `dtype`."""
    x = jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)
    # T5X's Embed: the residual stream starts split by batch ('embed' per the rules)
    return with_logical_constraint(x, ("batch", "length", "embed"), self.partitioner)

  def attend(self, x: Array) -> Array:
    """Tied logits: [..., emb] -> [..., vocab] in x's dtype."""
    return dispatch.dot(self, "logits", x, (dispatch.param_path(self, "embedding"),),
                        self.vocab_size, x.dtype,
                        lambda: jnp.dot(x, jnp.asarray(self.embedding, x.dtype).T), True)


class RelativePositionBias(nn.Module):
  """One [heads, num_buckets] table per stack, shared by all its layers."""

  num_heads: int
  num_buckets: int
  max_distance: int

  def setup(self):
    self.rel_embedding = self.param(
        "rel_embedding",
        nn.with_logical_partitioning(
            REL_EMBEDDING_INIT,
            ("heads", "relpos_buckets")),
        (self.num_heads, self.num_buckets), jnp.float32)

  def from_buckets(self, buckets: Array) -> Array:
    """[B, q, k] int bucket ids -> [B, H, q, k] float32 bias."""
    table = jnp.asarray(self.rel_embedding, jnp.float32).T  # [buckets, H]
    return jnp.moveaxis(jnp.take(table, buckets, axis=0), -1, 1)

  def bidirectional(self, length: int) -> Array:
    """Encoder bias for positions 0..length-1: [1, H, L, L]."""
    pos = np.arange(length)
    buckets = relative_position_bucket(pos[None, :] - pos[:, None], True, self.num_buckets,
                                       self.max_distance)
    return self.from_buckets(jnp.asarray(buckets)[None])

  def causal(self, q_pos: Array, num_keys: int, k_pos: Array | None = None) -> Array:
    """Decoder bias for per-row query positions [B, q] against keys 0..num_keys-1: [B, H, q, C].

    k_pos [B, C]: the keys' logical positions when they are not their slots (a tree of
    drafts); distances below 0 (masked keys) read bucket 0.
    """
    size = max(num_keys, self.max_distance) + 1
    table = jnp.asarray(_causal_bucket_table(size, self.num_buckets, self.max_distance))
    if k_pos is None:
      k_pos = jnp.arange(num_keys, dtype=jnp.int32)[None, :]
    distance = q_pos[:, :, None] - k_pos[:, None, :]
    return self.from_buckets(jnp.take(table, jnp.clip(distance, 0, size - 1), axis=0))


@struct.dataclass
class Keys:
  """The keys each query row attends to (the attention seam, `kernels.shapes`).

  lengths [B, T] int32: row (b, t) sees keys s < lengths[b, t] only: the keys past it
    are never read (a causal decode over a fixed-shape cache reads its valid prefix).
  bias None | [B|1, H|1, T|1, S] float32: added to the logits: what a length cannot say
    (T5's relative position bias, padding holes, a draft tree's hidden branches as -1e10).
  window None | int (static): row (b, t) sees the keys s >= lengths[b, t] - window only
    (a sliding-window layer).
  """
  lengths: Array
  bias: Array | None = None
  window: int | None = struct.field(pytree_node=False, default=None)


def causal_keys(q_pos: Array, bias: Array | None = None) -> Keys:
  """Queries at positions q_pos [B, T] see the keys at positions <= theirs."""
  return Keys(q_pos.astype(jnp.int32) + 1, bias)


def padded_keys(mask: Array, num_queries: int, bias: Array | None = None,
                queries: Array | None = None) -> Keys:
  """Every query row sees the keys where mask [B, S] (bool: an encoder's non-padding);
  rows where `queries` [B, T] is False see none (all masked, as T5X's
  `make_attention_mask(mask, mask)`). The length is the row's extent (its last valid key
  + 1; S for a row with none or a masked query), the mask stays in the bias: a padding
  hole inside the extent is masked as T5X masks it."""
  s = mask.shape[1]
  last = s - jnp.argmax(mask[:, ::-1], axis=1)
  extent = jnp.where(mask.any(axis=1), last, s).astype(jnp.int32)[:, None]
  full = mask[:, None, None, :]
  if queries is None:
    lengths = jnp.broadcast_to(extent, (mask.shape[0], num_queries))
  else:
    lengths = jnp.where(queries, extent, s).astype(jnp.int32)
    full = full & queries[:, None, :, None]
  return Keys(lengths, additive(full, bias))


def tree_keys(length: Array, num_new: int, mask: Array, bias: Array | None = None) -> Keys:
  """A call of `num_new` tokens forming a tree after a valid prefix of `length` [B]:
  every row reads up to the last new token; `mask` [B, 1, k, C] (`cache.tree_mask`)
  hides the branches it may not see."""
  lengths = jnp.broadcast_to((length.astype(jnp.int32) + num_new)[:, None],
                             (length.shape[0], num_new))
  return Keys(lengths, additive(mask, bias))


def xla_attention(q: Array, k: Array, v: Array, bias: Array, dtype,
                  softcap: float | None = None) -> Array:
  """XLA's attention: q [B, H, T, Dh], k/v [B, Hkv, S, Dh] (Hkv divides H: query head h
  reads K/V head h // (H / Hkv), not copied), bias [B|1, H|1, T|1, S] -> [B, H, T, Dh]:
  softmax(soft_cap(q . k, softcap) + bias) @ v, the logits and softmax in float32, the
  probabilities cast to `dtype` (`kernels.shapes.soft_cap`: Gemma 2's soft-capping)."""
  b, h, t, d = q.shape
  hkv = k.shape[1]
  if hkv == h:
    logits = jnp.einsum("bhtd,bhsd->bhts", q, k, preferred_element_type=jnp.float32)
    weights = jax.nn.softmax(soft_cap(logits, softcap) + bias, axis=-1).astype(dtype)
    return jnp.einsum("bhts,bhsd->bhtd", weights, v)
  qg = q.reshape(b, hkv, h // hkv, t, d)
  bias = (bias[:, :, None] if bias.shape[1] == 1
          else bias.reshape(bias.shape[0], hkv, h // hkv, *bias.shape[2:]))
  logits = jnp.einsum("bkgtd,bksd->bkgts", qg, k, preferred_element_type=jnp.float32)
  weights = jax.nn.softmax(soft_cap(logits, softcap) + bias, axis=-1).astype(dtype)
  return jnp.einsum("bkgts,bksd->bkgtd", weights, v).reshape(b, h, t, d)


class MultiHeadAttention(nn.Module):
  """T5 attention: no biases, no 1/sqrt(d) scaling (it lives in the query init).

  Heads-major layout: queries, keys and values are [B, H, T|S, Dh], the layout
  of the decoder caches, so attending over a cache needs no transposed copy.
  Decoder-only LMs set `num_kv_heads` < num_heads (grouped-query attention: keys and
  values [B, Hkv, S, Dh], each shared by num_heads / Hkv query heads), `use_bias`, and
  `query_init_scale` 1 (they scale the queries in the attention instead). Gemma's
  attention may soft-cap its logits (`logit_softcap`, `kernels.shapes.soft_cap`).
  """

  num_heads: int
  head_dim: int
  in_features: int
  dtype: jnp.dtype = jnp.float32
  num_kv_heads: int | None = None      # None: num_heads
  use_bias: bool = False
  query_init_scale: float | None = None  # None: head_dim ** -0.5 (T5)
  logit_softcap: float | None = None     # None: no attention-logit soft-cap
  partitioner: Any = None                # `with_logical_constraint`

  @property
  def kv_heads(self) -> int:
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  def setup(self):
    joined, kv = self.num_heads * self.head_dim, self.kv_heads * self.head_dim
    dense = functools.partial(Dense, self.in_features, axes=("embed", "joined_kv"),
                              dtype=self.dtype, use_bias=self.use_bias)
    scale = self.head_dim ** -0.5 if self.query_init_scale is None else self.query_init_scale
    self.query = dense(joined, init_scale=scale)
    self.key = dense(kv)
    self.value = dense(kv)
    self.out = Dense(joined, self.in_features, ("joined_kv", "embed"), self.dtype,
                     use_bias=self.use_bias)

  def _split(self, x: Array, heads: int | None = None) -> Array:
    """[B, T, H * Dh] -> [B, H, T, Dh] (H: `heads`, default num_heads)."""
    heads = self.num_heads if heads is None else heads
    x = jnp.swapaxes(x.reshape(x.shape[:-1] + (heads, self.head_dim)), 1, 2)
    # T5X constrains q, k and v (its ('batch', 'length', 'heads', 'kv'), heads-major here):
    # by batch and whole heads, so each device attends over its own heads.
    return with_logical_constraint(x, ("batch", "heads", "length", "kv"), self.partitioner)

  def project_q(self, x: Array) -> Array:
    """[B, T, E] -> [B, H, T, Dh]."""
    return self._split(self.query(x))

  def project_kv(self, x: Array, fuse: bool = True) -> tuple[Array, Array]:
    """[B, S, E] -> two [B, Hkv, S, Dh] (`fuse`: see `fused_dense`)."""
    k, v = fused_dense(self, "kv", x, [self.key, self.value], self.dtype, fuse)
    return self._split(k, self.kv_heads), self._split(v, self.kv_heads)

  def project_qkv(self, x: Array, fuse: bool = True) -> tuple[Array, Array, Array]:
    """Self-attention projections: [B, T, E] -> q [B, H, T, Dh], k/v [B, Hkv, T, Dh]
    (`fuse`: one dot)."""
    q, k, v = fused_dense(self, "qkv", x, [self.query, self.key, self.value], self.dtype, fuse)
    return self._split(q), self._split(k, self.kv_heads), self._split(v, self.kv_heads)

  def attend(self, q: Array, k: Array, v: Array, keys: Keys) -> Array:
    """q [B, H, T, Dh], k/v [B, Hkv, S, Dh], `keys` (lengths [B, T], bias) -> [B, T, E].

    With Hkv < H each key/value head serves H / Hkv consecutive query heads (Hugging
    Face's `repeat_kv` order).

    On the kernels (`dispatch.attention`) every query row is computed alike whatever
    T, B and the number of masked keys are. XLA computes T >= 2 rows with other kernels
    than T = 1: the rows of a k-token call would round differently from 1-token calls,
    and a sentence's encoding would depend on the padded length of its batch.
    """
    # XLA's ops read every key: the lengths become the mask of the bias.
    xla = lambda: xla_attention(q, k, v, dense_bias(keys.bias, keys.lengths, q.shape[0],
                                                    q.shape[2], k.shape[2], keys.window),
                                self.dtype, self.logit_softcap)
    # [B, T, H, Dh]: the transposes around it cancel with `_split`'s. The kernels take the
    # K/V grouped as cached (query head h reads K/V head h // (H / Hkv)): no repeated copy.
    y = dispatch.attention(self, q, k, v, keys.bias, keys.lengths, self.dtype,
                           lambda: jnp.swapaxes(xla(), 1, 2), keys.window, self.logit_softcap)
    return self.out(y.reshape(y.shape[:2] + (self.num_heads * self.head_dim,)))



class MlpBlock(nn.Module):
  """Gated MLP: prod_i act_i(x @ wi_i) @ wo (T5 1.0: a single relu branch named `wi`)."""

  mlp_dim: int
  activations: tuple[str, ...]
  gelu_approximate: bool = True
  dtype: jnp.dtype = jnp.float32
  fuse: bool = True      # wi_* as one dot (see `fused_dense`)
  use_bias: bool = False
  partitioner: Any = None       # `with_logical_constraint`

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """[B, T, E] -> [B, T, E]."""
    acts: dict[str, Callable[[Array], Array]] = {
            "relu": nn.relu, "linear": lambda h: h, "silu": nn.silu,
            "gelu": functools.partial(nn.gelu, approximate=self.gelu_approximate),
            "gelu_exact": functools.partial(nn.gelu, approximate=False)}
    wi = [Dense(x.shape[-1], self.mlp_dim, ("embed", "mlp"), self.dtype, use_bias=self.use_bias,
                name=n) for n in mlp_kernel_names(self.activations)]
    branches = fused_dense(self, "wi", x, wi, self.dtype, self.fuse)
    h = functools.reduce(jnp.multiply, [acts[a](y) for a, y in zip(self.activations, branches,
                                                                   strict=True)])
    # T5X's MlpBlock: the hidden layer split as wi's columns, so wo sums partial products
    h = with_logical_constraint(h, ("batch", "length", "mlp"), self.partitioner)
    return Dense(self.mlp_dim, x.shape[-1], ("mlp", "embed"), self.dtype, use_bias=self.use_bias,
                 name="wo")(h)
