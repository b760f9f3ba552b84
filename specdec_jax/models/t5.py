"""T5 encoder-decoder in flax.linen with T5X's parameter tree and explicit caches.

Covers T5 1.0 (relu MLP, logits tied to the embedding and scaled by 1/sqrt(emb))
and T5 1.1 / Flan-T5 / mT5 (gated tanh-gelu MLP, untied `logits_dense`).
Every parameter carries logical axis names (T5X's: vocab, embed, joined_kv, mlp,
heads, relpos_buckets), so sharding is a rules table, not a code change.

Three entry points share the same layers:
  `__call__(encoder_input_tokens, decoder_input_tokens)`  full teacher-forced pass,
  `encode` + `init_cache`                           once per request,
  `decode(tokens [B, k], cache)`                    k tokens per row at per-row offsets.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import cache as cache_lib
from specdec_jax.config import T5Config
from specdec_jax.errors import InputError
from specdec_jax.models.layers import (
  Dense,
  Embed,
  Keys,
  MlpBlock,
  MultiHeadAttention,
  RelativePositionBias,
  RMSNorm,
  causal_keys,
  padded_keys,
  tree_keys,
)

Array = jax.Array


def _make_attention(cfg: T5Config, name: str | None, partitioner) -> MultiHeadAttention:
  return MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.emb_dim, cfg.activation_dtype,
                            partitioner=partitioner, name=name)


def _make_relpos(cfg: T5Config) -> RelativePositionBias:
  return RelativePositionBias(cfg.num_heads, cfg.relative_attention_num_buckets,
                              cfg.relative_attention_max_distance)


def _make_mlp(cfg: T5Config, name: str | None, fuse: bool, partitioner) -> MlpBlock:
  return MlpBlock(cfg.mlp_dim, cfg.mlp_activations, cfg.gelu_approximate, cfg.activation_dtype,
                  fuse, partitioner=partitioner, name=name)


# `partitioner` (every module below): a `sd.sharding.Partitioner` the layers constrain
# their activations by (`layers.with_logical_constraint`); None on one device.


class EncoderLayer(nn.Module):
  config: T5Config
  partitioner: Any = None

  @nn.compact
  def __call__(self, x: Array, keys: Keys, dropout: Callable) -> Array:
    cfg, dt = self.config, self.config.activation_dtype
    attn = _make_attention(cfg, "attention", self.partitioner)
    h = RMSNorm(cfg.layer_norm_epsilon, dt, name="pre_attention_layer_norm")(x)
    # The encoder runs once per call: unfused projections (see `fused_dense`).
    x = x + dropout(attn.attend(*attn.project_qkv(h, fuse=False), keys))
    h = RMSNorm(cfg.layer_norm_epsilon, dt, name="pre_mlp_layer_norm")(x)
    return x + dropout(_make_mlp(cfg, "mlp", False, self.partitioner)(h))


class DecoderLayer(nn.Module):
  """Self-attention -> cross-attention -> MLP, each pre-normed with a residual.

  With `kv_cache=(k_buf, v_buf)` and `write_pos` [B, k], the new self-attention
  K/V are written into the buffers and the queries attend over the buffers.
  """

  config: T5Config
  partitioner: Any = None

  def setup(self):
    cfg, dt = self.config, self.config.activation_dtype
    self.pre_self_attention_layer_norm = RMSNorm(cfg.layer_norm_epsilon, dt)
    self.self_attention = _make_attention(cfg, None, self.partitioner)
    self.pre_cross_attention_layer_norm = RMSNorm(cfg.layer_norm_epsilon, dt)
    self.encoder_decoder_attention = _make_attention(cfg, None, self.partitioner)
    self.pre_mlp_layer_norm = RMSNorm(cfg.layer_norm_epsilon, dt)
    self.mlp = _make_mlp(cfg, None, True, self.partitioner)

  def cross_kv(self, encoded: Array) -> tuple[Array, Array]:
    return self.encoder_decoder_attention.project_kv(encoded, fuse=False)   # once per call

  def __call__(self, x, cross_kv, self_keys, cross_keys, dropout, kv_cache=None, write_pos=None):
    h = self.pre_self_attention_layer_norm(x)
    q, k, v = self.self_attention.project_qkv(h)
    if kv_cache is not None:
      k = cache_lib.write(kv_cache[0], k, write_pos)
      v = cache_lib.write(kv_cache[1], v, write_pos)
    x = x + dropout(self.self_attention.attend(q, k, v, self_keys))
    h = self.pre_cross_attention_layer_norm(x)
    q = self.encoder_decoder_attention.project_q(h)
    x = x + dropout(self.encoder_decoder_attention.attend(q, *cross_kv, cross_keys))
    x = x + dropout(self.mlp(self.pre_mlp_layer_norm(x)))
    return x, (k, v)


class _Stack(nn.Module):
  """The fields of a layer stack (`Encoder`, `Decoder`); `shared_embedding` is the
  Transformer's token embedder."""

  config: T5Config
  shared_embedding: nn.Module
  partitioner: Any = None


def _stack_parts(cfg: T5Config, layer: type[nn.Module], num_layers: int,
                 partitioner) -> tuple[RelativePositionBias, list[nn.Module], RMSNorm,
                                       nn.Dropout]:
  """A stack's submodules, made in its `setup`: its relative position bias, its
  `num_layers` layers (named layers_0, ...), its final norm and its dropout."""
  return (_make_relpos(cfg),
          [layer(cfg, partitioner, name=f"layers_{i}") for i in range(num_layers)],
          RMSNorm(cfg.layer_norm_epsilon, cfg.activation_dtype),
          nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,)))


class Encoder(_Stack):

  def setup(self):
    self.relpos_bias, self.layers, self.encoder_norm, self.dropout = _stack_parts(
        self.config, EncoderLayer, self.config.num_encoder_layers, self.partitioner)

  def __call__(self, tokens: Array, deterministic: bool = True) -> Array:
    """[B, Le] int32 -> [B, Le, E]."""
    dropout = functools.partial(self.dropout, deterministic=deterministic)
    mask = tokens > 0
    keys = padded_keys(mask, tokens.shape[1], self.relpos_bias.bidirectional(tokens.shape[1]),
                       queries=mask)
    x = dropout(self.shared_embedding(tokens).astype(self.config.activation_dtype))
    for layer in self.layers:
      x = layer(x, keys, dropout)
    return dropout(self.encoder_norm(x))


class Decoder(_Stack):

  def setup(self):
    cfg = self.config
    self.relpos_bias, self.layers, self.decoder_norm, self.dropout = _stack_parts(
        cfg, DecoderLayer, cfg.num_decoder_layers, self.partitioner)
    if not cfg.logits_via_embedding:
      self.logits_dense = Dense(cfg.emb_dim, cfg.vocab_size, ("embed", "vocab"), jnp.float32)

  def _logits(self, x: Array) -> Array:
    if self.config.logits_via_embedding:
      x = x.astype(jnp.float32) / np.sqrt(self.config.emb_dim)
      return self.shared_embedding.attend(x)
    return self.logits_dense(x)

  def _run(self, tokens, cross_kvs, self_keys, cross_keys, dropout, kv_caches=None,
           write_pos=None, exits=None):
    """The decoder stack; returns (final-norm hidden states at each exit, new K/V per run layer).

    exits: 1-based layer counts after which to read the stack (default: all layers only).
    Only layers up to the deepest exit run (an early exit skips the rest).
    """
    exits = (len(self.layers),) if exits is None else tuple(exits)
    x = dropout(self.shared_embedding(tokens).astype(self.config.activation_dtype))
    hidden, new_caches = [], []
    for i, layer in enumerate(self.layers[:max(exits)]):
      x, kv = layer(x, cross_kvs[i], self_keys, cross_keys, dropout,
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
    self_keys = causal_keys(q_pos, self.relpos_bias.causal(q_pos, length))
    cross_keys = padded_keys(encoder_mask, length)
    hidden, _ = self._run(tokens, self.cross_kvs(encoded), self_keys, cross_keys, dropout,
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
      self_keys = causal_keys(slots, self.relpos_bias.causal(slots, cache.capacity))
    else:
      if visible is None:
        raise InputError("decode: tree positions= need visible= (which new tokens each sees)")
      k_pos = cache_lib.key_positions(slots, positions, cache.capacity)
      self_keys = tree_keys(cache.length, tokens.shape[1],
                            cache_lib.tree_mask(cache.length, slots, visible, cache.capacity),
                            self.relpos_bias.causal(positions, cache.capacity, k_pos))
    cross = cache.cross
    if cross is None:
      raise InputError("a T5 decode needs the cache `start` made (its encoder keys and values)")
    cross_keys = padded_keys(cross.mask, tokens.shape[1])
    kv_caches = list(zip(cache.self_key, cache.self_value, strict=True))
    exits = None if num_layers is None else (num_layers,)
    (hidden,), new = self._run(tokens, list(zip(cross.key, cross.value, strict=True)), self_keys,
                               cross_keys, lambda y: y, kv_caches, slots, exits)
    run = len(new)
    cache = cache.replace(self_key=tuple(k for k, _ in new) + cache.self_key[run:],
                          self_value=tuple(v for _, v in new) + cache.self_value[run:],
                          length=cache.length + tokens.shape[1])
    return self._logits(hidden), hidden, cache


class Transformer(nn.Module):
  """T5 encoder-decoder; the top-level names match T5X's `network.Transformer`."""

  config: T5Config
  partitioner: Any = None

  def setup(self):
    cfg, where = self.config, self.partitioner
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.activation_dtype, where)
    self.encoder = Encoder(cfg, self.token_embedder, where)
    self.decoder = Decoder(cfg, self.token_embedder, where)

  def __call__(self, encoder_input_tokens, decoder_input_tokens, deterministic: bool = True):
    """Full pass: [B, Le], [B, Ld] int32 -> logits float32 [B, Ld, V]."""
    encoded = self.encoder(encoder_input_tokens, deterministic)
    return self.decoder(decoder_input_tokens, encoded, encoder_input_tokens > 0, deterministic)

  def encode(self, encoder_input_tokens: Array) -> Array:
    return self.encoder(encoder_input_tokens)

  def init_cache(self, encoded: Array, encoder_input_tokens: Array, capacity: int):
    """Cross K/V of `encoded` [B, Le, E] and empty self-attention buffers of `capacity`."""
    cfg = self.config
    cross = self.decoder.cross_kvs(encoded)
    self_k, self_v = cache_lib.empty_self_kv(encoded.shape[0], capacity, cfg.num_heads,
                                             cfg.head_dim, cfg.activation_dtype,
                                             cfg.num_decoder_layers)
    return cache_lib.DecoderCache(
        self_key=self_k, self_value=self_v, length=jnp.zeros((encoded.shape[0],), jnp.int32),
        cross=cache_lib.CrossKV(key=tuple(k for k, _ in cross), value=tuple(v for _, v in cross),
                                mask=encoder_input_tokens > 0))

  def decode(self, tokens: Array, cache: cache_lib.DecoderCache, num_layers: int | None = None,
             positions: Array | None = None, visible: Array | None = None):
    return self.decoder.decode(tokens, cache, num_layers, positions, visible)

  def output_logits(self, hidden: Array) -> Array:
    """The output layer alone: final-norm decoder states [..., E] -> logits float32 [..., V]."""
    return self.decoder._logits(hidden)

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
