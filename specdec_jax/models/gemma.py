"""Gemma 4 text decoders (`config.gemma.GemmaConfig`) behind the decoder-only entry points.

`GemmaLM` is `lm.DecoderOnly` with Gemma's layer (`GemmaLayer`), embedding scale,
soft-capped logits and per-layer cache shapes; prompts, the prefill, the cache anchoring
and tree decodes are `models.lm`'s. The parameter tree adds to the LM's::

    decoder/layers_i/self_attention/{query_norm, key_norm}/scale    [Dh]   per-head norms
    decoder/layers_i/post_self_attention_layer_norm/scale          [E]
    decoder/layers_i/post_mlp_layer_norm/scale                     [E]
    decoder/layers_i/layer_scalar                                  [1]
    decoder/layers_i/mlp/{wi_0, wi_1, wo}/kernel                          gate, up, down

(no `self_attention/value` in a full layer with `attention_k_eq_v`; a full layer's Dh is
`global_head_dim`). A sliding layer's query at slot p reads the keys at slots
(p - sliding_window, p]: the attention seam's `Keys.window` (`kernels.shapes`); in a tree
decode, whose tokens' positions are not their slots, the window is folded into the mask.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp

from specdec_jax import cache as cache_lib
from specdec_jax.config.gemma import GemmaConfig
from specdec_jax.models import lm
from specdec_jax.models.layers import (
  NORM_SCALE_INIT,
  Dense,
  Embed,
  Keys,
  MlpBlock,
  MultiHeadAttention,
  RMSNorm,
  fused_dense,
  tree_keys,
)

Array = jax.Array


def scale_embedding(x: Array, config: GemmaConfig) -> Array:
  """Embedded tokens [..., E] times sqrt(emb_dim), in the activation dtype (as transformers'
  does, in the weights'). The assistant scales its target's embedding by it too."""
  dt = config.activation_dtype
  return x.astype(dt) * jnp.asarray(config.emb_dim ** 0.5, dt)


class GemmaAttention(MultiHeadAttention):
  """Grouped-query attention with RMSNorms over each head of the queries and keys
  (scaled) and of the values (unscaled); with `k_eq_v`, no value projection: the values
  are the projected keys before their norm."""

  epsilon: float = 1e-6
  k_eq_v: bool = False
  kv_shared: bool = False     # queries only: the K/V are another layer's

  def setup(self):
    joined, kv = self.num_heads * self.head_dim, self.kv_heads * self.head_dim
    dense = functools.partial(Dense, self.in_features, axes=("embed", "joined_kv"),
                              dtype=self.dtype)
    self.query = dense(joined)
    self.out = Dense(joined, self.in_features, ("joined_kv", "embed"), self.dtype)
    self.query_norm = RMSNorm(self.epsilon, self.dtype, axis="kv")
    if self.kv_shared:
      return
    self.key = dense(kv)
    if not self.k_eq_v:
      self.value = dense(kv)
    self.key_norm = RMSNorm(self.epsilon, self.dtype, axis="kv")
    self.value_norm = RMSNorm(self.epsilon, self.dtype, use_scale=False)

  def project_q(self, x: Array) -> Array:
    """[B, T, E] -> normed queries [B, H, T, Dh] (not yet rotated)."""
    return self.query_norm(self._split(self.query(x)))

  def project_qkv(self, x: Array, fuse: bool = True) -> tuple[Array, Array, Array]:
    """[B, T, E] -> normed q [B, H, T, Dh], k/v [B, Hkv, T, Dh] (not yet rotated)."""
    denses = [self.query, self.key] + ([] if self.k_eq_v else [self.value])
    parts = fused_dense(self, "qkv", x, denses, self.dtype, fuse)
    q, k = self._split(parts[0]), self._split(parts[1], self.kv_heads)
    v = k if self.k_eq_v else self._split(parts[2], self.kv_heads)
    return self.query_norm(q), self.key_norm(k), self.value_norm(v)


class GemmaLayer(nn.Module):
  """transformers' `Gemma4TextDecoderLayer`: norm -> attention -> norm, residual; norm ->
  gated MLP -> norm, residual; with per-layer inputs, gate -> gelu -> times the layer's
  input -> projection -> norm, residual; times the layer's scalar."""

  config: GemmaConfig
  index: int
  partitioner: Any = None

  @property
  def sliding(self) -> bool:
    return self.config.layer_types[self.index] == "sliding"

  @property
  def kv_shared(self) -> bool:
    return self.config.kv_source(self.index) != self.index

  def setup(self):
    cfg, dt = self.config, self.config.activation_dtype
    heads, head_dim = cfg.layer_shape(self.index)
    norm = functools.partial(RMSNorm, cfg.norm_epsilon, dt)
    self.pre_self_attention_layer_norm = norm()
    self.self_attention = GemmaAttention(
        cfg.num_heads, head_dim, cfg.emb_dim, dt, num_kv_heads=heads, query_init_scale=1.0,
        logit_softcap=cfg.attn_logit_softcap, partitioner=self.partitioner,
        epsilon=cfg.norm_epsilon,
        k_eq_v=cfg.attention_k_eq_v and not self.sliding, kv_shared=self.kv_shared)
    self.post_self_attention_layer_norm = norm()
    self.pre_mlp_layer_norm = norm()
    self.mlp = MlpBlock(cfg.layer_mlp_dim(self.index), lm.mlp_activations(cfg.mlp),
                        gelu_approximate=True, dtype=dt, partitioner=self.partitioner)
    self.post_mlp_layer_norm = norm()
    if cfg.per_layer_dim:
      p = cfg.per_layer_dim
      self.per_layer_input_gate = Dense(cfg.emb_dim, p, ("embed", "kv"), dt)
      self.per_layer_projection = Dense(p, cfg.emb_dim, ("kv", "embed"), dt)
      self.post_per_layer_input_norm = norm()
    self.layer_scalar = self.param("layer_scalar",
                                   nn.with_logical_partitioning(NORM_SCALE_INIT, (None,)),
                                   (1,), jnp.float32)

  def __call__(self, x, keys: Keys | dict, rope, dropout, kv_cache=None, write_pos=None,
               per_layer=None, shared_kv=None):
    """x [B, T, E], `keys` (one `Keys`, or one per layer type), rope (cos, sin) ->
    (x, (k, v)); as `lm.LMLayer`. per_layer [B, T, P]: this layer's input (per-layer
    inputs); shared_kv: a K/V-shared layer's (k, v), its source layer's as it returned them."""
    kind = self.config.layer_types[self.index]
    if isinstance(keys, dict):
      keys = keys[kind]
    elif self.sliding:
      keys = dataclasses.replace(keys, window=self.config.sliding_window)
    h = self.pre_self_attention_layer_norm(x)
    if self.kv_shared:
      q, (k, v) = lm.apply_rope(self.self_attention.project_q(h), *rope), shared_kv
    else:
      q, k, v = self.self_attention.project_qkv(h)
      q, k = lm.apply_rope(q, *rope), lm.apply_rope(k, *rope)   # queries unscaled
      if kv_cache is not None:
        k = cache_lib.write(kv_cache[0], k, write_pos)
        v = cache_lib.write(kv_cache[1], v, write_pos)
    x = x + dropout(self.post_self_attention_layer_norm(self.self_attention.attend(q, k, v, keys)))
    x = x + dropout(self.post_mlp_layer_norm(self.mlp(self.pre_mlp_layer_norm(x))))
    if self.config.per_layer_dim:
      g = nn.gelu(self.per_layer_input_gate(x), approximate=True) * per_layer
      x = x + dropout(self.post_per_layer_input_norm(self.per_layer_projection(g)))
    return x * jnp.asarray(self.layer_scalar, x.dtype), (k, v)


class GemmaDecoder(lm.Decoder):
  """`lm.Decoder` with Gemma's layers, embedding scale, rotary tables per layer type,
  windowed tree keys and soft-capped logits."""

  config: GemmaConfig

  def setup(self):
    cfg = self.config
    self.layers = [GemmaLayer(cfg, i, self.partitioner, name=f"layers_{i}")
                   for i in range(cfg.num_layers)]
    self.decoder_norm = RMSNorm(cfg.norm_epsilon, cfg.activation_dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.tie_embeddings:
      self.logits_dense = Dense(cfg.emb_dim, cfg.vocab_size, ("embed", "vocab"), jnp.float32)
    if cfg.per_layer_dim:
      packed, dt = cfg.num_layers * cfg.per_layer_dim, cfg.activation_dtype
      self.per_layer_embedder = Embed(cfg.vocab_size, packed, dt, self.partitioner)
      self.per_layer_model_projection = Dense(cfg.emb_dim, packed, ("embed", "layers"), dt)
      self.per_layer_projection_norm = RMSNorm(cfg.norm_epsilon, dt, axis="kv")

  def embed(self, tokens: Array, positions: Array) -> Array:
    """The tokens' embedding, scaled (`scale_embedding`)."""
    return scale_embedding(self.token_embedder(tokens), self.config)

  def per_layer_inputs(self, tokens: Array, embedded: Array) -> Array:
    """Tokens [B, T], their scaled embedding [B, T, E] -> each layer's input [B, T, L, P]:
    (norm(embedded @ projection / sqrt(E)) + table[token] * sqrt(P)) / sqrt(2), in
    transformers' order (`Gemma4TextModel.project_per_layer_inputs`)."""
    cfg, dt = self.config, self.config.activation_dtype
    shape = (*tokens.shape, cfg.num_layers, cfg.per_layer_dim)
    table = self.per_layer_embedder(tokens) * jnp.asarray(cfg.per_layer_dim ** 0.5, dt)
    projected = self.per_layer_model_projection(embedded) * jnp.asarray(cfg.emb_dim ** -0.5, dt)
    projected = self.per_layer_projection_norm(projected.reshape(shape))
    return (projected + table.reshape(shape)) * jnp.asarray(2 ** -0.5, dt)

  def layer_inputs(self, tokens: Array, embedded: Array) -> dict[str, Array]:
    """{"per_layer": [B, T, L, P]} with per-layer inputs (`per_layer_inputs`), else none."""
    if not self.config.per_layer_dim:
      return {}
    return {"per_layer": self.per_layer_inputs(tokens, embedded)}

  def kv_source(self, layer: int) -> int:
    """A K/V-shared layer reads the last cached layer of its type (`GemmaConfig.kv_source`):
    the cache holds the cached layers alone (`GemmaConfig.cached_layers`)."""
    return self.config.kv_source(layer)

  def rotary(self, positions: Array, num_slots: int) -> list:
    cfg = self.config
    tables = {
        "sliding": lambda: lm.rope_tables(positions, cfg.head_dim, cfg.rope_theta, num_slots,
                                          cfg.rope_fraction),
        "full": lambda: lm.rope_tables(positions, cfg.global_head_dim, cfg.global_rope_theta,
                                       num_slots, cfg.global_rope_fraction)}
    made = {kind: tables[kind]() for kind in set(cfg.layer_types)}
    return [made[kind] for kind in cfg.layer_types]

  def tree_keys(self, start: Array, slots: Array, positions: Array, visible: Array,
                capacity: int) -> Any:
    """One `Keys` per layer type: a sliding layer's tree mask also hides the keys whose
    logical position is sliding_window or more before the query's."""
    mask = cache_lib.tree_mask(start, slots, visible, capacity)              # [B, 1, k, C]
    key_pos = cache_lib.key_positions(slots, positions, capacity)            # [B, C]
    near = key_pos[:, None, :] > positions[:, :, None] - self.config.sliding_window
    k = slots.shape[1]
    return {"full": tree_keys(start, k, mask), "sliding": tree_keys(start, k, mask & near[:, None])}

  def logits(self, x: Array) -> Array:
    """Final-norm states [..., E] -> logits float32 [..., V], soft-capped where configured."""
    y = super().logits(x)
    cap = self.config.final_logit_softcap
    if cap is None:
      return y
    return jnp.tanh(y / cap) * cap


class GemmaLM(lm.DecoderOnly):
  """A Gemma 4 text decoder; the entry points of `lm.DecoderOnly`."""

  config: GemmaConfig

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.activation_dtype,
                                self.partitioner)
    self.position_embedder = None
    self.decoder = GemmaDecoder(cfg, self.token_embedder, None, self.partitioner)

  def init_cache(self, tokens: Array, lengths: Array, capacity: int) -> cache_lib.DecoderCache:
    """The prefill (`lm.DecoderOnly.init_cache`), each cached layer's K/V [B, Hkv, C, Dh]
    of its type (a K/V-shared layer has none: it reads its source layer's)."""
    cfg = self.config
    batch = tokens.shape[0]
    shapes = [(batch, heads, capacity, head_dim)
              for heads, head_dim in map(cfg.layer_shape, range(cfg.cached_layers))]
    zeros = lambda: tuple(jnp.zeros(shape, cfg.activation_dtype) for shape in shapes)
    cache = cache_lib.DecoderCache(self_key=zeros(), self_value=zeros(),
                                   length=jnp.zeros((batch,), jnp.int32))
    _, cache = self.decoder.decode(tokens, cache)
    return cache.with_length(lengths - 1)


def param_shapes(config: GemmaConfig) -> dict[str, tuple[int, ...]]:
  """Flat "/"-joined parameter name -> shape of every parameter `config` implies."""
  one = jnp.ones((1, 1), jnp.int32)
  abstract = nn.unbox(jax.eval_shape(GemmaLM(config).init, jax.random.PRNGKey(0), one)["params"])
  return {"/".join(path): tuple(leaf.shape)
          for path, leaf in flax.traverse_util.flatten_dict(abstract).items()}
