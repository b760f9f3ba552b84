"""T5Gemma 2 encoder-decoders (`config.t5gemma2.T5Gemma2Config`), text only.

The entry points are T5's (`models.t5.Transformer`): `encode` + `init_cache` once per
request, `decode(tokens [B, k], cache)` at per-row offsets, trees of drafts and early
exits alike. What differs is inside the layers (Gemma 3's: see the config's docstring)
and the decoder's MERGED attention: each decoder query attends, in one softmax, to the
encoder's keys (normed, not rotated) followed by its own cached keys. So each layer's
cache buffer [B, Hkv, Le + C, Dh] holds the cross K/V at slots [0, Le), written once by
`init_cache`, and the decoder's own after them: the cache is offset by Le
(`DecoderCache.offset`, as a decoder-only model's is by its prompt; `length` counts the
decoded tokens) and `cache.cross` keeps only the encoder's mask. The cross mask and a
sliding layer's window (which narrows the own keys only) are the attention seam's bias
(`layers.Keys`), the causal bound its row lengths (Le + the query's position + 1). The
teacher-forced pass joins the cross K/V and its own likewise. The parameter tree::

    token_embedder/{embedding [V, E], eoi_embedding [E]}       shared and tied
    {encoder, decoder}/layers_i/pre_self_attention_layer_norm/scale   (Gemma 3 norms:
    {encoder, decoder}/layers_i/post_self_attention_layer_norm/scale   x 1 + scale)
    {encoder, decoder}/layers_i/self_attention/{query, key, value, out}/kernel
    {encoder, decoder}/layers_i/self_attention/{query_norm, key_norm}/scale   [Dh]
    {encoder, decoder}/layers_i/{pre,post}_mlp_layer_norm/scale
    {encoder, decoder}/layers_i/mlp/{wi_0, wi_1, wo}/kernel     gate, up, down
    encoder/encoder_norm/scale, decoder/decoder_norm/scale
    decoder/logits_dense/kernel [E, V]                           untied output only
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import cache as cache_lib
from specdec_jax.config.t5gemma2 import T5Gemma2Config
from specdec_jax.errors import InputError
from specdec_jax.kernels.shapes import additive
from specdec_jax.models import lm
from specdec_jax.models.layers import (
  BIAS_INIT,
  Dense,
  Embed,
  Keys,
  MlpBlock,
  MultiHeadAttention,
  RMSNorm,
  padded_keys,
)

Array = jax.Array


def _norm(cfg: T5Gemma2Config, axis: str = "embed") -> RMSNorm:
  """Gemma 3's RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + scale), in float32."""
  return RMSNorm(cfg.layer_norm_epsilon, cfg.activation_dtype, axis=axis, scale_offset=1.0)


class T5GemmaEmbed(Embed):
  """`Embed` scaled by sqrt(E), with the end-of-image token's own unscaled vector."""

  eoi_id: int = -1

  def setup(self):
    super().setup()
    self.eoi_embedding = self.param(
        "eoi_embedding", nn.with_logical_partitioning(BIAS_INIT, ("embed",)), (self.features,),
        jnp.float32)

  def __call__(self, tokens: Array) -> Array:
    """[B, T] int -> [B, T, E] in `dtype` (as transformers', in the weights' dtype)."""
    x = super().__call__(tokens) * jnp.asarray(self.features ** 0.5, self.dtype)
    return jnp.where((tokens == self.eoi_id)[..., None],
                     jnp.asarray(self.eoi_embedding, self.dtype), x)


class T5GemmaAttention(MultiHeadAttention):
  """Grouped-query attention with Gemma 3's RMSNorms over each head of the queries and
  keys; the values unnormed."""

  epsilon: float = 1e-6

  def setup(self):
    super().setup()
    norm = functools.partial(RMSNorm, self.epsilon, self.dtype, axis="kv", scale_offset=1.0)
    self.query_norm = norm()
    self.key_norm = norm()

  def project_qkv(self, x: Array, fuse: bool = True) -> tuple[Array, Array, Array]:
    """[B, T, E] -> normed q [B, H, T, Dh], k/v [B, Hkv, T, Dh] (not yet rotated)."""
    q, k, v = super().project_qkv(x, fuse)
    return self.query_norm(q), self.key_norm(k), v

  def project_kv(self, x: Array, fuse: bool = True) -> tuple[Array, Array]:
    """The cross K/V of encoder states [B, S, E]: normed k, v [B, Hkv, S, Dh] (unrotated)."""
    k, v = super().project_kv(x, fuse)
    return self.key_norm(k), v


class T5GemmaLayer(nn.Module):
  """transformers' `T5Gemma2EncoderLayer` / `T5Gemma2DecoderLayer`: norm -> attention ->
  norm, residual; norm -> gated MLP -> norm, residual. A decoder layer's attention reads
  the cross K/V before its own: joined to them (`__call__`'s `cross_kv`, the full pass),
  or already in its cache buffer (a decode)."""

  config: T5Gemma2Config
  fuse: bool                      # decode steps fuse their products (`fused_dense`)
  partitioner: Any = None

  def setup(self):
    cfg, dt = self.config, self.config.activation_dtype
    self.pre_self_attention_layer_norm = _norm(cfg)
    self.self_attention = T5GemmaAttention(
        cfg.num_heads, cfg.head_dim, cfg.emb_dim, dt, num_kv_heads=cfg.num_kv_heads,
        query_init_scale=1.0, logit_softcap=cfg.attn_logit_softcap,
        partitioner=self.partitioner, epsilon=cfg.layer_norm_epsilon)
    self.post_self_attention_layer_norm = _norm(cfg)
    self.pre_mlp_layer_norm = _norm(cfg)
    self.mlp = MlpBlock(cfg.mlp_dim, cfg.mlp_activations, True, dt, self.fuse,
                        partitioner=self.partitioner)
    self.post_mlp_layer_norm = _norm(cfg)

  def cross_kv(self, encoded: Array) -> tuple[Array, Array]:
    return self.self_attention.project_kv(encoded, fuse=False)   # once per request

  def __call__(self, x: Array, keys: Keys, rope, dropout: Callable,
               cross_kv: tuple[Array, Array] | None = None, kv_cache=None, write_pos=None):
    """x [B, T, E], `keys`, rope (cos, sin) -> (x, (k, v)). With `cross_kv` (a decoder
    layer's full pass) the keys are the cross keys then the own; with `kv_cache`, the
    buffers with the new K/V written at `write_pos` [B, T] (a decode)."""
    h = self.pre_self_attention_layer_norm(x)
    q, k, v = self.self_attention.project_qkv(h, fuse=self.fuse)
    q, k = lm.apply_rope(q, *rope), lm.apply_rope(k, *rope)
    q = q * jnp.asarray(self.config.query_pre_attn_scalar ** -0.5, q.dtype)
    if kv_cache is not None:
      k = cache_lib.write(kv_cache[0], k, write_pos)
      v = cache_lib.write(kv_cache[1], v, write_pos)
    keys_k, keys_v = k, v
    if cross_kv is not None:
      keys_k = jnp.concatenate([cross_kv[0], k.astype(cross_kv[0].dtype)], axis=2)
      keys_v = jnp.concatenate([cross_kv[1], v.astype(cross_kv[1].dtype)], axis=2)
    y = self.self_attention.attend(q, keys_k, keys_v, keys)
    x = x + dropout(self.post_self_attention_layer_norm(y))
    x = x + dropout(self.post_mlp_layer_norm(self.mlp(self.pre_mlp_layer_norm(x))))
    return x, (k, v)


def _rope(cfg: T5Gemma2Config, types: tuple[str, ...], positions: Array,
          num_slots: int) -> list:
  """Each layer's rotary tables (cos, sin) at `positions` [B, T], by its type's base."""
  tables = {
      "sliding": lambda: lm.rope_tables(positions, cfg.head_dim, cfg.rope_theta, num_slots),
      "full": lambda: lm.rope_tables(positions, cfg.head_dim, cfg.global_rope_theta, num_slots,
                                     factor=cfg.global_rope_factor)}
  made = {kind: tables[kind]() for kind in set(types)}
  return [made[kind] for kind in types]


def encoder_window(length: int, window: int) -> np.ndarray:
  """[L, L] bool: transformers' bidirectional sliding window of `window` keys, query p
  seeing the keys at [p - (window - 1) // 2, p + window // 2]."""
  distance = np.arange(length)[:, None] - np.arange(length)[None, :]     # query - key
  return (distance <= (window - 1) // 2) & (-distance <= window // 2)


def merged_keys(cross_mask: Array, q_pos: Array, own: Array, ends: Array, key_pos: Array,
                window: int | None) -> Keys:
  """The keys of a decoder call's merged attention, over [cross keys Le; own keys C].

  cross_mask [B, Le] bool: the encoder's real tokens. q_pos [B, T]: the queries' logical
  positions. own [B, T, C] bool: the own keys each query may see (causal, or a tree's).
  ends [B, T]: one past the last own slot a row may read. key_pos [B, C]: the own keys'
  logical positions. window: a sliding layer's (its own keys at (q - window, q]); None.
  """
  if window is not None:
    own = own & (key_pos[:, None, :] > q_pos[:, :, None] - window)
  le = cross_mask.shape[1]
  cross = jnp.broadcast_to(cross_mask[:, None, :], own.shape[:2] + (le,))
  keep = jnp.concatenate([cross, own], axis=-1)
  return Keys((le + ends).astype(jnp.int32), additive(keep[:, None]))


class T5GemmaEncoder(nn.Module):

  config: T5Gemma2Config
  shared_embedding: nn.Module
  partitioner: Any = None

  def setup(self):
    cfg = self.config
    self.layers = [T5GemmaLayer(cfg, False, self.partitioner, name=f"layers_{i}")
                   for i in range(cfg.num_encoder_layers)]
    self.encoder_norm = _norm(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def __call__(self, tokens: Array, deterministic: bool = True) -> Array:
    """[B, Le] int32 (right-padded with 0) -> [B, Le, E]."""
    cfg = self.config
    dropout = functools.partial(self.dropout, deterministic=deterministic)
    length = tokens.shape[1]
    mask = tokens > 0
    window = additive(jnp.asarray(encoder_window(length, cfg.sliding_window))[None, None])
    keys = {"full": padded_keys(mask, length, queries=mask),
            "sliding": padded_keys(mask, length, window, queries=mask)}
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape)
    ropes = _rope(cfg, cfg.encoder_layer_types, positions, length)
    x = dropout(self.shared_embedding(tokens).astype(cfg.activation_dtype))
    for layer, kind, rope in zip(self.layers, cfg.encoder_layer_types, ropes, strict=True):
      x, _ = layer(x, keys[kind], rope, dropout)
    return dropout(self.encoder_norm(x))


class T5GemmaDecoder(nn.Module):

  config: T5Gemma2Config
  shared_embedding: nn.Module
  partitioner: Any = None

  def setup(self):
    cfg = self.config
    self.layers = [T5GemmaLayer(cfg, True, self.partitioner, name=f"layers_{i}")
                   for i in range(cfg.num_decoder_layers)]
    self.decoder_norm = _norm(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.logits_via_embedding:
      self.logits_dense = Dense(cfg.emb_dim, cfg.vocab_size, ("embed", "vocab"), jnp.float32)

  def logits(self, x: Array) -> Array:
    """Final-norm states [..., E] -> logits float32 [..., V], soft-capped where configured."""
    if self.config.logits_via_embedding:
      y = self.shared_embedding.attend(x.astype(jnp.float32))
    else:
      y = self.logits_dense(x)
    cap = self.config.final_logit_softcap
    return y if cap is None else jnp.tanh(y / cap) * cap

  def cross_kvs(self, encoded: Array) -> list[tuple[Array, Array]]:
    return [layer.cross_kv(encoded) for layer in self.layers]

  def _run(self, tokens, positions, cross_kvs, keys: dict[str, Keys], dropout, num_slots: int,
           kv_caches=None, write_pos=None, exits=None):
    """The stack; (final-norm states at each exit (1-based layer counts; default: all
    layers), new K/V per run layer). Only layers up to the deepest exit run."""
    cfg = self.config
    exits = (len(self.layers),) if exits is None else tuple(exits)
    x = dropout(self.shared_embedding(tokens).astype(cfg.activation_dtype))
    ropes = _rope(cfg, cfg.decoder_layer_types, positions, num_slots)
    hidden, new_caches = [], []
    for i, layer in enumerate(self.layers[:max(exits)]):
      kind = cfg.decoder_layer_types[i]
      x, kv = layer(x, keys[kind], ropes[i], dropout, cross_kvs[i],
                    None if kv_caches is None else kv_caches[i], write_pos)
      new_caches.append(kv)
      if i + 1 in exits:
        hidden.append(dropout(self.decoder_norm(x)))
    return hidden, new_caches

  def _keys(self, cross_mask, q_pos, own, ends, key_pos) -> dict[str, Keys]:
    kinds = set(self.config.decoder_layer_types)
    window = {"full": None, "sliding": self.config.sliding_window}
    return {kind: merged_keys(cross_mask, q_pos, own, ends, key_pos, window[kind])
            for kind in kinds}

  def hidden(self, tokens, encoded, encoder_mask, deterministic: bool = True,
             exits: tuple[int, ...] | None = None) -> list[Array]:
    """Teacher-forced final-norm states [B, Ld, E] after each exit (default: the last)."""
    dropout = functools.partial(self.dropout, deterministic=deterministic)
    length = tokens.shape[1]
    pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape)
    own = pos[:, None, :] <= pos[:, :, None]
    keys = self._keys(encoder_mask, pos, own, pos + 1, pos)
    hidden, _ = self._run(tokens, pos, self.cross_kvs(encoded), keys, dropout, length,
                          exits=exits)
    return hidden

  def __call__(self, tokens, encoded, encoder_mask, deterministic: bool = True,
               exits: tuple[int, ...] | None = None):
    """Teacher-forced pass: tokens [B, Ld], encoded [B, Le, E] -> logits float32 [B, Ld, V]
    (with `exits`, a tuple of them, one per exit)."""
    logits = tuple(self.logits(h) for h in self.hidden(tokens, encoded, encoder_mask,
                                                        deterministic, exits))
    return logits if exits is not None else logits[0]

  def decode(self, tokens: Array, cache: cache_lib.DecoderCache, num_layers: int | None = None,
             positions: Array | None = None, visible: Array | None = None):
    """T5's `Decoder.decode`: k tokens per row at offsets `cache.length` -> (logits f32
    [B, k, V], final-norm states [B, k, E], cache with length + k); `num_layers`: an early
    exit; `positions` [B, k] / `visible` [B | 1, k, k]: the new tokens form a tree."""
    cross = cache.cross
    if cross is None:
      raise InputError("a T5Gemma 2 decode needs the cache `start` made (its encoder keys "
                       "and values)")
    # The buffers hold the cross K/V at slots [0, Le) (`init_cache`, offset Le); the own
    # keys' slots below count from Le, as `length` does.
    le = cross.mask.shape[1]
    k, capacity = tokens.shape[1], cache.capacity - le
    slots = cache_lib.query_positions(cache.length, k)
    if positions is None:
      positions = slots
      own = jnp.arange(capacity)[None, None, :] <= slots[:, :, None]
      ends, key_pos = slots + 1, jnp.broadcast_to(jnp.arange(capacity), (slots.shape[0],
                                                                         capacity))
    else:
      if visible is None:
        raise InputError("decode: tree positions= need visible= (which new tokens each sees)")
      own = cache_lib.tree_mask(cache.length, slots, visible, capacity)[:, 0]
      ends = jnp.broadcast_to((cache.length + k)[:, None], slots.shape)
      key_pos = cache_lib.key_positions(slots, positions, capacity)
    keys = self._keys(cross.mask, positions, own, ends, key_pos)
    exits = None if num_layers is None else (num_layers,)
    (hidden,), new = self._run(tokens, positions, [None] * len(self.layers), keys, lambda y: y,
                               capacity, list(zip(cache.self_key, cache.self_value, strict=True)),
                               slots + le, exits)
    run = len(new)
    cache = cache.replace(self_key=tuple(k for k, _ in new) + cache.self_key[run:],
                          self_value=tuple(v for _, v in new) + cache.self_value[run:],
                          length=cache.length + tokens.shape[1])
    return self.logits(hidden), hidden, cache


class T5Gemma2(nn.Module):
  """A T5Gemma 2 text encoder-decoder: `models.t5.Transformer`'s entry points."""

  config: T5Gemma2Config
  partitioner: Any = None

  def setup(self):
    cfg, where = self.config, self.partitioner
    self.token_embedder = T5GemmaEmbed(cfg.vocab_size, cfg.emb_dim, cfg.activation_dtype, where,
                                       eoi_id=cfg.eoi_id)
    self.encoder = T5GemmaEncoder(cfg, self.token_embedder, where)
    self.decoder = T5GemmaDecoder(cfg, self.token_embedder, where)

  def __call__(self, encoder_input_tokens, decoder_input_tokens, deterministic: bool = True):
    """Full pass: [B, Le], [B, Ld] int32 -> logits float32 [B, Ld, V]."""
    encoded = self.encoder(encoder_input_tokens, deterministic)
    return self.decoder(decoder_input_tokens, encoded, encoder_input_tokens > 0, deterministic)

  def encode(self, encoder_input_tokens: Array) -> Array:
    return self.encoder(encoder_input_tokens)

  def init_cache(self, encoded: Array, encoder_input_tokens: Array, capacity: int):
    """The cache of a request: per layer one K/V buffer [B, Hkv, Le + capacity, Dh] holding
    the cross K/V of `encoded` [B, Le, E] at slots [0, Le), then `capacity` empty slots for
    the decoder's own; offset Le (`DecoderCache.next_slot`), length 0. The merged attention
    reads each buffer as it is (no copy per call); `cross` keeps only the encoder's mask."""
    batch, le = encoded.shape[:2]
    cfg = self.config
    empty = jnp.zeros((batch, cfg.num_kv_heads, capacity, cfg.head_dim), cfg.activation_dtype)
    join = lambda x: jnp.concatenate([x.astype(cfg.activation_dtype), empty], axis=2)
    cross = self.decoder.cross_kvs(encoded)
    return cache_lib.DecoderCache(
        self_key=tuple(join(k) for k, _ in cross), self_value=tuple(join(v) for _, v in cross),
        length=jnp.zeros((batch,), jnp.int32),
        cross=cache_lib.CrossKV(key=(), value=(), mask=encoder_input_tokens > 0),
        offset=jnp.full((batch,), le, jnp.int32))

  def decode(self, tokens: Array, cache: cache_lib.DecoderCache, num_layers: int | None = None,
             positions: Array | None = None, visible: Array | None = None):
    return self.decoder.decode(tokens, cache, num_layers, positions, visible)

  def output_logits(self, hidden: Array) -> Array:
    """The output layer alone: final-norm decoder states [..., E] -> logits float32 [..., V]."""
    return self.decoder.logits(hidden)

  def hidden_states(self, encoder_input_tokens, decoder_input_tokens, deterministic: bool = True):
    """Teacher-forced final-norm decoder states [B, Ld, E] (what the output layer reads)."""
    encoded = self.encoder(encoder_input_tokens, deterministic)
    return self.decoder.hidden(decoder_input_tokens, encoded, encoder_input_tokens > 0,
                               deterministic)[0]

  def exit_logits(self, encoder_input_tokens, decoder_input_tokens, exits: tuple[int, ...],
                  deterministic: bool = True):
    """Logits read after each of `exits` decoder layers (shared norm and head): a tuple."""
    encoded = self.encoder(encoder_input_tokens, deterministic)
    return self.decoder(decoder_input_tokens, encoded, encoder_input_tokens > 0, deterministic,
                        exits=exits)


def param_shapes(config: T5Gemma2Config) -> dict[str, tuple[int, ...]]:
  """Flat "/"-joined parameter name -> shape of every parameter `config` implies."""
  one = jnp.ones((1, 1), jnp.int32)
  abstract = nn.unbox(jax.eval_shape(T5Gemma2(config).init, jax.random.PRNGKey(0), one,
                                     one)["params"])
  return {"/".join(path): tuple(leaf.shape)
          for path, leaf in flax.traverse_util.flatten_dict(abstract).items()}
