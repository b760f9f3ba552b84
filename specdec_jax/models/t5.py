"""T5 encoder-decoder in flax.linen with T5X's parameter tree and explicit caches.

Covers T5 1.0 (relu MLP, logits tied to the embedding and scaled by 1/sqrt(emb))
and T5 1.1 / Flan-T5 / mT5 (gated tanh-gelu MLP, untied `logits_dense`).
Every parameter carries logical axis names (T5X's: vocab, embed, joined_kv, mlp,
heads, relpos_buckets), so sharding is a rules table, not a code change.

Three entry points share the same layers:
  `__call__(encoder_tokens, decoder_input_tokens)`  full teacher-forced pass,
  `encode` + `init_cache`                           once per request,
  `decode(tokens [B, k], cache)`                    k tokens per row at per-row offsets.
"""

from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import cache as cache_lib
from specdec_jax.config import T5Config

Array = jax.Array
_MASKED = -1e10  # T5X's bias for masked attention logits


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


def _kernel_init(scale: float = 1.0) -> Callable:
  base = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
  return lambda key, shape, dtype=jnp.float32: base(key, shape, dtype) * scale


class Dense(nn.Module):
  """y = x @ kernel, no bias; kernel [in, out] stored 2-D as in T5X checkpoints."""

  in_features: int
  features: int
  axes: tuple[str, str]
  dtype: jnp.dtype = jnp.float32
  init_scale: float = 1.0

  def setup(self):
    self.kernel = self.param("kernel",
                             nn.with_logical_partitioning(_kernel_init(self.init_scale), self.axes),
                             (self.in_features, self.features), jnp.float32)

  def __call__(self, x: Array) -> Array:
    return jnp.dot(x.astype(self.dtype), jnp.asarray(self.kernel, self.dtype))


def fused_dense(x: Array, denses: list[Dense], dtype, fuse: bool = True) -> list[Array]:
  """[x @ k_1, x @ k_2, ...], with `fuse` as ONE dot against the concatenated kernel.

  Same maths either way. Fuse in decode steps: there the concatenation is
  loop-invariant (XLA hoists it out of the while loop), and one wide GEMV streams
  the weights faster than several narrow ones (CPU batch-1 decode is
  bandwidth-bound: ~14% less time per token for T5 1.1 small). Don't fuse in
  passes that run once per call (encoder, cross K/V): there the concatenated copy
  of the kernels is paid on every call (~1 ms per layer for the demo target).
  """
  if not fuse:
    return [d(x) for d in denses]
  kernel = jnp.concatenate([jnp.asarray(d.kernel, dtype) for d in denses], axis=1)
  y = jnp.dot(x.astype(dtype), kernel)
  return jnp.split(y, np.cumsum([d.features for d in denses])[:-1].tolist(), axis=-1)


class RMSNorm(nn.Module):
  """T5 layer norm: x * rsqrt(mean(x^2) + eps) * scale, in float32; no bias, no centring."""

  epsilon: float = 1e-6
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                       (x.shape[-1],), jnp.float32)
    x = x.astype(jnp.float32)
    y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.epsilon)
    return y.astype(self.dtype) * jnp.asarray(scale, self.dtype)


class Embed(nn.Module):
  """Token embedding [vocab, emb]; `attend` gives tied logits."""

  vocab_size: int
  features: int
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0), ("vocab", "embed")),
        (self.vocab_size, self.features), jnp.float32)

  def __call__(self, tokens: Array) -> Array:
    return jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)

  def attend(self, x: Array) -> Array:
    return jnp.dot(x, jnp.asarray(self.embedding, x.dtype).T)


class RelativePositionBias(nn.Module):
  """One [heads, num_buckets] table per stack, shared by all its layers."""

  num_heads: int
  num_buckets: int
  max_distance: int

  def setup(self):
    self.rel_embedding = self.param(
        "rel_embedding",
        nn.with_logical_partitioning(
            nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
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


def attention_bias(mask: Array, bias: Array | None = None) -> Array:
  """bool mask [B, 1|H, q, k] (+ float bias [B|1, H, q, k]) -> additive float32 bias."""
  out = jnp.where(mask, 0.0, _MASKED).astype(jnp.float32)
  return out if bias is None else out + bias


class MultiHeadAttention(nn.Module):
  """T5 attention: no biases, no 1/sqrt(d) scaling (it lives in the query init).

  Heads-major layout: queries, keys and values are [B, H, T|S, Dh], the layout
  of the decoder caches, so attending over a cache needs no transposed copy.
  """

  num_heads: int
  head_dim: int
  in_features: int
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    joined = self.num_heads * self.head_dim
    dense = functools.partial(Dense, self.in_features, joined, ("embed", "joined_kv"),
                              self.dtype)
    self.query = dense(init_scale=self.head_dim ** -0.5)
    self.key = dense()
    self.value = dense()
    self.out = Dense(joined, self.in_features, ("joined_kv", "embed"), self.dtype)

  def _split(self, x: Array) -> Array:
    """[B, T, H * Dh] -> [B, H, T, Dh]."""
    return jnp.swapaxes(x.reshape(x.shape[:-1] + (self.num_heads, self.head_dim)), 1, 2)

  def project_q(self, x: Array) -> Array:
    """[B, T, E] -> [B, H, T, Dh]."""
    return self._split(self.query(x))

  def project_kv(self, x: Array, fuse: bool = True) -> tuple[Array, Array]:
    """[B, S, E] -> two [B, H, S, Dh] (`fuse`: see `fused_dense`)."""
    k, v = fused_dense(x, [self.key, self.value], self.dtype, fuse)
    return self._split(k), self._split(v)

  def project_qkv(self, x: Array, fuse: bool = True) -> tuple[Array, Array, Array]:
    """Self-attention projections: [B, T, E] -> three [B, H, T, Dh] (`fuse`: one dot)."""
    return tuple(map(self._split, fused_dense(x, [self.query, self.key, self.value],
                                               self.dtype, fuse)))

  def attend(self, q: Array, k: Array, v: Array, bias: Array) -> Array:
    """q [B, H, T, Dh], k/v [B, H, S, Dh], bias [B|1, H, T, S] -> [B, T, E]."""
    logits = jnp.einsum("bhtd,bhsd->bhts", q, k, preferred_element_type=jnp.float32) + bias
    weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
    y = jnp.swapaxes(jnp.einsum("bhts,bhsd->bhtd", weights, v), 1, 2)
    return self.out(y.reshape(y.shape[:2] + (self.num_heads * self.head_dim,)))


class MlpBlock(nn.Module):
  """Gated MLP: prod_i act_i(x @ wi_i) @ wo (T5 1.0: a single relu branch named `wi`)."""

  mlp_dim: int
  activations: tuple[str, ...]
  gelu_approximate: bool = True
  dtype: jnp.dtype = jnp.float32
  fuse: bool = True      # wi_* as one dot (see `fused_dense`)

  @nn.compact
  def __call__(self, x: Array) -> Array:
    acts = {"relu": nn.relu, "linear": lambda h: h, "silu": nn.silu,
            "gelu": functools.partial(nn.gelu, approximate=self.gelu_approximate),
            "gelu_exact": functools.partial(nn.gelu, approximate=False)}
    names = ["wi"] if len(self.activations) == 1 else [f"wi_{i}" for i in
                                                         range(len(self.activations))]
    wi = [Dense(x.shape[-1], self.mlp_dim, ("embed", "mlp"), self.dtype, name=n) for n in names]
    branches = fused_dense(x, wi, self.dtype, self.fuse)
    h = functools.reduce(jnp.multiply, [acts[a](y) for a, y in zip(self.activations, branches)])
    return Dense(self.mlp_dim, x.shape[-1], ("mlp", "embed"), self.dtype, name="wo")(h)


def _make_attention(cfg: T5Config, name: str | None) -> MultiHeadAttention:
  return MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.emb_dim, cfg.activation_dtype,
                            name=name)


def _make_relpos(cfg: T5Config) -> RelativePositionBias:
  return RelativePositionBias(cfg.num_heads, cfg.relative_attention_num_buckets,
                              cfg.relative_attention_max_distance)


def _make_mlp(cfg: T5Config, name: str | None = "mlp", fuse: bool = True) -> MlpBlock:
  return MlpBlock(cfg.mlp_dim, cfg.mlp_activations, cfg.gelu_approximate, cfg.activation_dtype,
                  fuse, name=name)


class EncoderLayer(nn.Module):
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, bias: Array, dropout: Callable) -> Array:
    cfg, dt = self.config, self.config.activation_dtype
    attn = _make_attention(cfg, "attention")
    h = RMSNorm(cfg.layer_norm_epsilon, dt, name="pre_attention_layer_norm")(x)
    # The encoder runs once per call: unfused projections (see `fused_dense`).
    x = x + dropout(attn.attend(*attn.project_qkv(h, fuse=False), bias))
    h = RMSNorm(cfg.layer_norm_epsilon, dt, name="pre_mlp_layer_norm")(x)
    return x + dropout(_make_mlp(cfg, fuse=False)(h))


class DecoderLayer(nn.Module):
  """Self-attention -> cross-attention -> MLP, each pre-normed with a residual.

  With `kv_cache=(k_buf, v_buf)` and `write_pos` [B, k], the new self-attention
  K/V are written into the buffers and the queries attend over the buffers.
  """

  config: T5Config

  def setup(self):
    cfg, dt = self.config, self.config.activation_dtype
    self.pre_self_attention_layer_norm = RMSNorm(cfg.layer_norm_epsilon, dt)
    self.self_attention = _make_attention(cfg, None)
    self.pre_cross_attention_layer_norm = RMSNorm(cfg.layer_norm_epsilon, dt)
    self.encoder_decoder_attention = _make_attention(cfg, None)
    self.pre_mlp_layer_norm = RMSNorm(cfg.layer_norm_epsilon, dt)
    self.mlp = _make_mlp(cfg, None)

  def cross_kv(self, encoded: Array) -> tuple[Array, Array]:
    return self.encoder_decoder_attention.project_kv(encoded, fuse=False)   # once per call

  def __call__(self, x, cross_kv, self_bias, cross_bias, dropout, kv_cache=None, write_pos=None):
    h = self.pre_self_attention_layer_norm(x)
    q, k, v = self.self_attention.project_qkv(h)
    if kv_cache is not None:
      k = cache_lib.write(kv_cache[0], k, write_pos)
      v = cache_lib.write(kv_cache[1], v, write_pos)
    x = x + dropout(self.self_attention.attend(q, k, v, self_bias))
    h = self.pre_cross_attention_layer_norm(x)
    q = self.encoder_decoder_attention.project_q(h)
    x = x + dropout(self.encoder_decoder_attention.attend(q, *cross_kv, cross_bias))
    x = x + dropout(self.mlp(self.pre_mlp_layer_norm(x)))
    return x, (k, v)


class Encoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = _make_relpos(cfg)
    self.layers = [EncoderLayer(cfg, name=f"layers_{i}") for i in range(cfg.num_encoder_layers)]
    self.encoder_norm = RMSNorm(cfg.layer_norm_epsilon, cfg.activation_dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def __call__(self, tokens: Array, deterministic: bool = True) -> Array:
    """[B, Le] int32 -> [B, Le, E]."""
    dropout = functools.partial(self.dropout, deterministic=deterministic)
    mask = tokens > 0
    bias = attention_bias(mask[:, None, None, :] & mask[:, None, :, None],
                          self.relpos_bias.bidirectional(tokens.shape[1]))
    x = dropout(self.shared_embedding(tokens).astype(self.config.activation_dtype))
    for layer in self.layers:
      x = layer(x, bias, dropout)
    return dropout(self.encoder_norm(x))


class Decoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = _make_relpos(cfg)
    self.layers = [DecoderLayer(cfg, name=f"layers_{i}") for i in range(cfg.num_decoder_layers)]
    self.decoder_norm = RMSNorm(cfg.layer_norm_epsilon, cfg.activation_dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.logits_via_embedding:
      self.logits_dense = Dense(cfg.emb_dim, cfg.vocab_size, ("embed", "vocab"), jnp.float32)

  def _logits(self, x: Array) -> Array:
    if self.config.logits_via_embedding:
      x = x.astype(jnp.float32) / np.sqrt(self.config.emb_dim)
      return self.shared_embedding.attend(x)
    return self.logits_dense(x)

  def _run(self, tokens, cross_kvs, self_bias, cross_bias, dropout, kv_caches=None,
           write_pos=None, exits=None):
    """The decoder stack; returns (final-norm hidden states at each exit, new K/V per run layer).

    exits: 1-based layer counts after which to read the stack (default: all layers only).
    Only layers up to the deepest exit run (an early exit skips the rest).
    """
    exits = (len(self.layers),) if exits is None else tuple(exits)
    x = dropout(self.shared_embedding(tokens).astype(self.config.activation_dtype))
    hidden, new_caches = [], []
    for i, layer in enumerate(self.layers[:max(exits)]):
      x, kv = layer(x, cross_kvs[i], self_bias, cross_bias, dropout,
                    None if kv_caches is None else kv_caches[i], write_pos)
      new_caches.append(kv)
      if i + 1 in exits:
        hidden.append(dropout(self.decoder_norm(x)))
    return hidden, new_caches

  def cross_kvs(self, encoded: Array) -> list[tuple[Array, Array]]:
    return [layer.cross_kv(encoded) for layer in self.layers]

  def hidden(self, tokens, encoded, encoder_mask, deterministic: bool = True,
             exits: tuple[int, ...] | None = None) -> list[Array]:
    """Teacher-forced final-norm states [B, Ld, E] after each exit (default: the last layer)."""
    dropout = functools.partial(self.dropout, deterministic=deterministic)
    length = tokens.shape[1]
    q_pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape)
    self_bias = attention_bias(cache_lib.causal_mask(q_pos, length),
                               self.relpos_bias.causal(q_pos, length))
    cross_bias = attention_bias(encoder_mask[:, None, None, :])
    hidden, _ = self._run(tokens, self.cross_kvs(encoded), self_bias, cross_bias, dropout,
                          exits=exits)
    return hidden

  def __call__(self, tokens, encoded, encoder_mask, deterministic: bool = True,
               exits: tuple[int, ...] | None = None):
    """Teacher-forced pass: tokens [B, Ld], encoded [B, Le, E] -> logits float32 [B, Ld, V].

    With `exits` (1-based layer counts), a tuple of logits, one per exit: the shared
    final norm and output layer read after that many layers (early-exit training).
    """
    hidden = self.hidden(tokens, encoded, encoder_mask, deterministic, exits)
    logits = tuple(self._logits(h) for h in hidden)
    return logits if exits is not None else logits[0]

  def decode(self, tokens: Array, cache: cache_lib.DecoderCache, num_layers: int | None = None,
             positions: Array | None = None, visible: Array | None = None):
    """Cached decode of k tokens per row at per-row offsets `cache.length`.

    tokens [B, k] -> (logits f32 [B, k, V], hidden [B, k, E], cache with length + k).
    `num_layers` < all: an early exit; only those layers' buffers are written.
    `positions` [B, k] and `visible` [B | 1, k, k]: the new tokens form a tree (parallel
    drafts): their logical positions, and which new tokens each may attend to.
    """
    slots = cache_lib.query_positions(cache.length, tokens.shape[1])
    if positions is None:
      self_bias = attention_bias(cache_lib.causal_mask(slots, cache.capacity),
                                 self.relpos_bias.causal(slots, cache.capacity))
    else:
      k_pos = cache_lib.key_positions(slots, positions, cache.capacity)
      self_bias = attention_bias(cache_lib.tree_mask(cache.length, slots, visible, cache.capacity),
                                 self.relpos_bias.causal(positions, cache.capacity, k_pos))
    cross = cache.cross
    cross_bias = attention_bias(cross.mask[:, None, None, :])
    kv_caches = list(zip(cache.self_key, cache.self_value))
    exits = None if num_layers is None else (num_layers,)
    (hidden,), new = self._run(tokens, list(zip(cross.key, cross.value)), self_bias, cross_bias,
                               lambda y: y, kv_caches, slots, exits)
    run = len(new)
    cache = cache.replace(self_key=tuple(k for k, _ in new) + cache.self_key[run:],
                          self_value=tuple(v for _, v in new) + cache.self_value[run:],
                          length=cache.length + tokens.shape[1])
    return self._logits(hidden), hidden, cache


class Transformer(nn.Module):
  """T5 encoder-decoder; the top-level names match T5X's `network.Transformer`."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.activation_dtype)
    self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder)

  def __call__(self, encoder_tokens, decoder_input_tokens, deterministic: bool = True):
    """Full pass: [B, Le], [B, Ld] int32 -> logits float32 [B, Ld, V]."""
    encoded = self.encoder(encoder_tokens, deterministic)
    return self.decoder(decoder_input_tokens, encoded, encoder_tokens > 0, deterministic)

  def encode(self, encoder_tokens: Array) -> Array:
    return self.encoder(encoder_tokens)

  def init_cache(self, encoded: Array, encoder_tokens: Array, capacity: int):
    """Cross K/V of `encoded` [B, Le, E] and empty self-attention buffers of `capacity`."""
    cfg = self.config
    cross = self.decoder.cross_kvs(encoded)
    self_k, self_v = cache_lib.empty_self_kv(encoded.shape[0], capacity, cfg.num_heads,
                                             cfg.head_dim, cfg.activation_dtype,
                                             cfg.num_decoder_layers)
    return cache_lib.DecoderCache(
        self_key=self_k, self_value=self_v, length=jnp.zeros((encoded.shape[0],), jnp.int32),
        cross=cache_lib.CrossKV(key=tuple(k for k, _ in cross), value=tuple(v for _, v in cross),
                                mask=encoder_tokens > 0))

  def decode(self, tokens: Array, cache: cache_lib.DecoderCache, num_layers: int | None = None,
             positions: Array | None = None, visible: Array | None = None):
    return self.decoder.decode(tokens, cache, num_layers, positions, visible)

  def output_logits(self, hidden: Array) -> Array:
    """The output layer alone: final-norm decoder states [..., E] -> logits float32 [..., V]."""
    return self.decoder._logits(hidden)

  def hidden_states(self, encoder_tokens, decoder_input_tokens, deterministic: bool = True):
    """Teacher-forced final-norm decoder states [B, Ld, E] (what the output layer reads)."""
    encoded = self.encoder(encoder_tokens, deterministic)
    return self.decoder.hidden(decoder_input_tokens, encoded, encoder_tokens > 0,
                               deterministic)[0]

  def exit_logits(self, encoder_tokens, decoder_input_tokens, exits: tuple[int, ...],
                  deterministic: bool = True):
    """Logits read after each of `exits` decoder layers (shared norm and head): a tuple."""
    encoded = self.encoder(encoder_tokens, deterministic)
    return self.decoder(decoder_input_tokens, encoded, encoder_tokens > 0, deterministic,
                        exits=exits)
