"""Decoder-only Transformer language models (GPT-2, Llama) over the same cache machinery.

Built from T5's layers (`models.layers`: Dense, fused Q/K/V, attention, MLP, norms), so
every product of a decode request goes through `kernels.dispatch` and packs for the CPU
kernels as T5's do. The parameter tree uses T5X's decoder names::

    token_embedder/embedding                      [V, E]        (vocab, embed)
    position_embedder/embedding                   [P, E]        (abspos_buckets, embed)  learned
    decoder/layers_i/pre_self_attention_layer_norm/{scale, bias}
    decoder/layers_i/self_attention/{query, key, value, out}/{kernel, bias}
    decoder/layers_i/pre_mlp_layer_norm/{scale, bias}
    decoder/layers_i/mlp/{wi | wi_0, wi_1, wo}/{kernel, bias}
    decoder/decoder_norm/{scale, bias}
    decoder/logits_dense/kernel                   [E, V]        untied output

(biases only where the config has them; `wi_0` is Llama's gate, `wi_1` its up projection).
Queries are scaled by head_dim ** -0.5 in the attention, as Hugging Face does, so its
weights load unchanged. Rotary positions follow Hugging Face's rotate-half layout.

Prompt convention. Prompts are RIGHT-padded, [B, P] with per-row lengths P_b >= 1
(`prompt_lengths`: one past the last token that is not `pad_id`, unless given). The prefill
(`init_cache`) writes the K/V of all P prompt slots and sets ``cache.length[b] = P_b - 1``:
the cache holds every prompt token except the last, and the first token a decode call feeds
for row b is ``prompt[b, P_b - 1]`` (`first_tokens`; the role T5's decoder start token
plays). A token's position (learned table or rotary) is its slot index, so a row's stale
pad slots beyond its length are overwritten by later decode calls and never read.
The round engine anchors the prefilled cache (`DecoderCache.anchored`: offset P_b - 1,
length 0), so that its length counts tokens after the prompt as a T5 decoder's does;
`decode` writes at slot offset + length either way.

Entry points:
  `__call__(tokens [B, L])`                 full causal pass -> logits f32 [B, L, V],
  `init_cache(prompt, lengths, capacity)`   the prefill,
  `decode(tokens [B, k], cache)`            k tokens per row at per-row offsets (as T5's).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import cache as cache_lib
from specdec_jax.batching import prompt_lengths  # noqa: F401  (lm.prompt_lengths)
from specdec_jax.config.lm import LMConfig
from specdec_jax.errors import InputError
from specdec_jax.models.layers import (
  EMBEDDING_INIT,
  Dense,
  Embed,
  Keys,
  LayerNorm,
  MlpBlock,
  MultiHeadAttention,
  RMSNorm,
  causal_keys,
  tree_keys,
)

Array = jax.Array


# ----------------------------------------------------------------------------- prompts


def first_tokens(tokens: Array, lengths: Array) -> Array:
  """The first token each row feeds to `decode` after the prefill: prompt[b, P_b - 1], [B]."""
  return jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]


# ----------------------------------------------------------------------------- rotary positions


def rope_inverse_frequencies(head_dim: int, theta: float, fraction: float = 1.0,
                             factor: float = 1.0) -> np.ndarray:
  """[Dh / 2] float32: theta ** (-2i / Dh), computed as Hugging Face's Llama does; with
  `fraction` < 1 only the first int(fraction * Dh // 2) pairs turn, the rest get 0
  (transformers' "proportional" rope, Gemma 4's full layers); divided by `factor`
  (transformers' "linear" rope scaling, Gemma 3's global layers)."""
  turning = int(fraction * head_dim // 2)
  exponent = np.arange(0, 2 * turning, 2, dtype=np.float32) / np.float32(head_dim)
  turned = (np.float32(1.0) / np.power(np.float32(theta), exponent)).astype(np.float32)
  if factor != 1.0:
    turned = (turned / np.float32(factor)).astype(np.float32)
  return np.concatenate([turned, np.zeros(head_dim // 2 - turning, np.float32)])


def rope_tables(positions: Array, head_dim: int, theta: float,
                num_positions: int, fraction: float = 1.0,
                factor: float = 1.0) -> tuple[Array, Array]:
  """positions [B, T] in [0, num_positions) -> cos, sin [B, 1, T, Dh] float32 (the angles
  repeated over both halves; `fraction`, `factor`: `rope_inverse_frequencies`).

  cos and sin are computed for every slot 0..num_positions-1 (the cache capacity), fenced
  off from XLA's fusions, and gathered: their computation never depends on T, so a k-token
  call rotates each token by the bits a 1-token call does, whatever XLA fuses around them.
  """
  slots = jnp.arange(num_positions, dtype=jnp.float32)[:, None]
  angles = slots * rope_inverse_frequencies(head_dim, theta, fraction, factor)   # [N, Dh/2]
  cos, sin = jax.lax.optimization_barrier((jnp.cos(angles), jnp.sin(angles)))

  def gather(table):
    half = jnp.take(table, positions, axis=0, mode="clip")               # [B, T, Dh/2]
    return jnp.concatenate([half, half], axis=-1)[:, None]

  return gather(cos), gather(sin)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
  """Rotate x [B, H, T, Dh] by its positions' angles (cos, sin [B, 1, T, Dh]): Hugging Face's
  x cos + rotate_half(x) sin, where dimension i pairs with i + Dh/2.

  Written per half: the concatenated form (x cos + [-x2, x1] sin) rounded differently in
  k-token and 1-token decode calls under XLA's CPU fusions (last bit); this form does not
  (`tests/test_lm.py` checks the packed decode bitwise).
  """
  half = x.shape[-1] // 2
  xf = x.astype(jnp.float32)
  x1, x2 = xf[..., :half], xf[..., half:]
  c, s = cos[..., :half], sin[..., :half]
  return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


# ----------------------------------------------------------------------------- layers


def mlp_activations(mlp: str) -> tuple[str, ...]:
  """`MlpBlock`'s activations of an `LMConfig.mlp`: GPT-2's one tanh gelu; the gated
  (gate, up) pairs of Llama (silu) and Gemma (tanh gelu)."""
  return {"gelu_tanh": ("gelu",), "swiglu": ("silu", "linear"),
          "geglu": ("gelu", "linear")}[mlp]


def _norm(cfg: LMConfig, name: str | None = None) -> nn.Module:
  if cfg.norm == "layernorm":
    return LayerNorm(cfg.norm_epsilon, cfg.activation_dtype, name=name)
  return RMSNorm(cfg.norm_epsilon, cfg.activation_dtype, name=name)


class PositionEmbed(nn.Module):
  """A learned absolute position table [max_positions, E]."""

  num_positions: int
  features: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, positions: Array) -> Array:
    """[B, T] int -> [B, T, E]; positions past the table read its last row (never in a
    prompt or a decode within `max_positions`, which `Model.start` checks)."""
    table = self.param("embedding",
                       nn.with_logical_partitioning(EMBEDDING_INIT, ("abspos_buckets", "embed")),
                       (self.num_positions, self.features), jnp.float32)
    return jnp.take(jnp.asarray(table, self.dtype), positions, axis=0, mode="clip")


class LMLayer(nn.Module):
  """Pre-norm self-attention -> MLP, each with a residual (GPT-2 and Llama alike).

  With `kv_cache=(k_buf, v_buf)` and `write_pos` [B, k], the new K/V (rotated, for rope)
  are written into the buffers and the queries attend over the buffers.
  """

  config: LMConfig
  partitioner: Any = None     # `layers.with_logical_constraint`; None on one device

  def setup(self):
    cfg, dt = self.config, self.config.activation_dtype
    self.pre_self_attention_layer_norm = _norm(cfg)
    self.self_attention = MultiHeadAttention(
        cfg.num_heads, cfg.head_dim, cfg.emb_dim, dt, num_kv_heads=cfg.num_kv_heads,
        use_bias=cfg.attention_bias, query_init_scale=1.0,   # queries scaled in __call__
        partitioner=self.partitioner)
    self.pre_mlp_layer_norm = _norm(cfg)
    acts = mlp_activations(cfg.mlp)
    self.mlp = MlpBlock(cfg.mlp_dim, acts, gelu_approximate=True, dtype=dt,
                        use_bias=cfg.mlp_bias, partitioner=self.partitioner)

  def __call__(self, x, keys: Keys, rope, dropout, kv_cache=None, write_pos=None):
    """x [B, T, E], `keys` (lengths [B, T], bias), rope (cos, sin) or None -> (x, (k, v))."""
    h = self.pre_self_attention_layer_norm(x)
    q, k, v = self.self_attention.project_qkv(h)
    if rope is not None:
      q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    q = q * jnp.asarray(self.config.head_dim ** -0.5, q.dtype)
    if kv_cache is not None:
      k = cache_lib.write(kv_cache[0], k, write_pos)
      v = cache_lib.write(kv_cache[1], v, write_pos)
    x = x + dropout(self.self_attention.attend(q, k, v, keys))
    x = x + dropout(self.mlp(self.pre_mlp_layer_norm(x)))
    return x, (k, v)


class Decoder(nn.Module):
  """The layer stack, the final norm and the output layer."""

  config: LMConfig
  token_embedder: nn.Module
  position_embedder: nn.Module | None
  partitioner: Any = None

  def setup(self):
    cfg = self.config
    self.layers = [LMLayer(cfg, self.partitioner, name=f"layers_{i}")
                   for i in range(cfg.num_layers)]
    self.decoder_norm = _norm(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.tie_embeddings:
      self.logits_dense = Dense(cfg.emb_dim, cfg.vocab_size, ("embed", "vocab"), jnp.float32)

  def logits(self, x: Array) -> Array:
    """Final-norm states [..., E] -> logits float32 [..., V]."""
    if self.config.tie_embeddings:
      return self.token_embedder.attend(x.astype(jnp.float32))
    return self.logits_dense(x)

  def embed(self, tokens: Array, positions: Array) -> Array:
    """The residual stream's start [B, T, E]: the tokens' embedding (+ learned positions)."""
    x = self.token_embedder(tokens).astype(self.config.activation_dtype)
    if self.position_embedder is not None:
      x = x + self.position_embedder(positions)
    return x

  def rotary(self, positions: Array, num_slots: int) -> list:
    """Each layer's rotary tables (cos, sin) at `positions` [B, T] (`rope_tables`), or None."""
    cfg = self.config
    rope = (None if self.position_embedder is not None
            else rope_tables(positions, cfg.head_dim, cfg.rope_theta, num_slots))
    return [rope] * cfg.num_layers

  def tree_keys(self, start: Array, slots: Array, positions: Array, visible: Array,
                capacity: int) -> Keys:
    """The keys of a call whose new tokens at `slots` [B, k] form a tree (`cache.tree_mask`)."""
    return tree_keys(start, slots.shape[1],
                     cache_lib.tree_mask(start, slots, visible, capacity))

  def layer_inputs(self, tokens: Array, embedded: Array) -> dict[str, Array]:
    """Inputs of every layer beside the residual stream, each [B, T, L, ...] (layer i's at
    [:, :, i], passed as a keyword of that name): none here."""
    return {}

  def kv_source(self, layer: int) -> int:
    """The layer whose K/V `layer` attends to: here itself (every layer caches its own)."""
    return layer

  def run(self, tokens, positions, keys: Keys, dropout, kv_caches=None, write_pos=None,
          exits=None):
    """The stack; returns (final-norm states [B, T, E] at each exit, new K/V per run layer
    that caches its own).

    exits: 1-based layer counts after which to read the stack (default: all layers only);
    only layers up to the deepest exit run. A layer that reads another's K/V (`kv_source`)
    gets them as that layer returned them in this pass (keyword `shared_kv`) and has no
    cache: `kv_caches` and the K/V returned are the caching layers' alone, in order.
    """
    exits = (len(self.layers),) if exits is None else tuple(exits)
    # keys span the buffer (a cache's capacity, or the full pass's length)
    num_slots = tokens.shape[1] if kv_caches is None else kv_caches[0][0].shape[2]
    embedded = self.embed(tokens, positions)
    x = dropout(embedded)
    inputs = self.layer_inputs(tokens, embedded)
    ropes = self.rotary(positions, num_slots)
    hidden: list[Array] = []
    new_caches: list[tuple[Array, Array]] = []   # the caching layers', in order
    returned: dict[int, tuple[Array, Array]] = {}  # each caching layer's K/V, by index
    for i, layer in enumerate(self.layers[:max(exits)]):
      extra = {name: value[:, :, i] for name, value in inputs.items()}
      source = self.kv_source(i)
      if source != i:
        x, _ = layer(x, keys, ropes[i], dropout, None, write_pos,
                     shared_kv=returned[source], **extra)
      else:
        x, returned[i] = layer(x, keys, ropes[i], dropout,
                               None if kv_caches is None else kv_caches[len(new_caches)],
                               write_pos, **extra)
        new_caches.append(returned[i])
      if i + 1 in exits:
        hidden.append(dropout(self.decoder_norm(x)))
    return hidden, new_caches

  def hidden(self, tokens, deterministic: bool = True, exits=None) -> list[Array]:
    """Full causal pass: final-norm states [B, L, E] after each exit."""
    dropout = functools.partial(self.dropout, deterministic=deterministic)
    length = tokens.shape[1]
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape)
    hidden, _ = self.run(tokens, positions, causal_keys(positions), dropout, exits=exits)
    return hidden

  def decode(self, tokens, cache: cache_lib.DecoderCache, num_layers=None, positions=None,
             visible=None):
    """Cached pass of k tokens per row at slots `cache.next_slot` (offset + length):
    tokens [B, k] -> (final-norm states [B, k, E], cache with length + k).

    Tree `positions` [B, k] count after the cache's offset, as its length does.
    """
    start = cache.next_slot
    slots = cache_lib.query_positions(start, tokens.shape[1])
    if positions is None:
      positions, keys = slots, causal_keys(slots)
    else:
      if cache.offset is not None:
        positions = positions + cache.offset[:, None]
      keys = self.tree_keys(start, slots, positions, visible, cache.capacity)
    exits = None if num_layers is None else (num_layers,)
    (hidden,), new = self.run(tokens, positions, keys, lambda y: y,
                              list(zip(cache.self_key, cache.self_value, strict=True)), slots,
                              exits)
    run = len(new)
    cache = cache.replace(self_key=tuple(k for k, _ in new) + cache.self_key[run:],
                          self_value=tuple(v for _, v in new) + cache.self_value[run:],
                          length=cache.length + tokens.shape[1])
    return hidden, cache


class DecoderOnly(nn.Module):
  """A decoder-only LM; the entry points `models.model.Model` calls by name."""

  config: LMConfig
  partitioner: Any = None     # a `sd.sharding.Partitioner` on a mesh (`models.layers`)

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.activation_dtype,
                                self.partitioner)
    self.position_embedder = (PositionEmbed(cfg.max_positions, cfg.emb_dim, cfg.activation_dtype)
                              if cfg.positions == "learned" else None)
    self.decoder = Decoder(cfg, self.token_embedder, self.position_embedder, self.partitioner)

  def __call__(self, tokens: Array, deterministic: bool = True) -> Array:
    """Full causal pass: tokens [B, L] int32 -> logits float32 [B, L, V]."""
    return self.decoder.logits(self.decoder.hidden(tokens, deterministic)[0])

  def hidden_states(self, tokens: Array, deterministic: bool = True) -> Array:
    """Final-norm states [B, L, E] of the full causal pass (what the output layer reads)."""
    return self.decoder.hidden(tokens, deterministic)[0]

  def exit_logits(self, tokens: Array, exits: tuple[int, ...], deterministic: bool = True):
    """Logits [B, L, V] read after each of `exits` layers (shared norm and output): a tuple."""
    return tuple(self.decoder.logits(h)
                 for h in self.decoder.hidden(tokens, deterministic, tuple(exits)))

  def init_cache(self, tokens: Array, lengths: Array, capacity: int) -> cache_lib.DecoderCache:
    """The prefill: right-padded prompts [B, P], lengths [B] -> a cache of `capacity` slots
    holding slots 0..P-1, with length P_b - 1 (see the module docstring)."""
    cfg = self.config
    batch = tokens.shape[0]
    self_k, self_v = cache_lib.empty_self_kv(batch, capacity, cfg.num_kv_heads, cfg.head_dim,
                                             cfg.activation_dtype, cfg.num_layers)
    cache = cache_lib.DecoderCache(self_key=self_k, self_value=self_v,
                                   length=jnp.zeros((batch,), jnp.int32))
    _, cache = self.decoder.decode(tokens, cache)
    return cache.with_length(lengths - 1)

  def decode(self, tokens: Array, cache: cache_lib.DecoderCache, num_layers: int | None = None,
             positions: Array | None = None, visible: Array | None = None):
    """tokens [B, k] -> (logits f32 [B, k, V], final-norm states [B, k, E], cache + k);
    the same semantics as T5's `Decoder.decode` (early exit, trees of drafts)."""
    hidden, cache = self.decoder.decode(tokens, cache, num_layers, positions, visible)
    return self.decoder.logits(hidden), hidden, cache

  def output_logits(self, hidden: Array) -> Array:
    """The output layer alone: final-norm states [..., E] -> logits float32 [..., V]."""
    return self.decoder.logits(hidden)


def check_prompt(tokens, lengths, capacity: int, config: LMConfig) -> np.ndarray | Array:
  """Lengths [B] int32 of right-padded prompts [B, P] (given or `prompt_lengths`), checked
  against the prompt, the cache `capacity` and a learned position table."""
  shape = tokens.shape
  if capacity < shape[1]:
    raise InputError(f"cache capacity {capacity} is shorter than the prompt buffer "
                     f"({shape[1]} tokens): the prompt must fit the cache")
  if config.positions == "learned" and capacity > config.max_positions:
    raise InputError(f"cache capacity {capacity} exceeds the model's {config.max_positions} "
                     "learned positions (max_positions)")
  if lengths is None:
    return prompt_lengths(tokens, config.pad_id)
  if isinstance(lengths, jax.core.Tracer):
    return lengths
  arr = np.asarray(lengths)
  if arr.shape != (shape[0],) or not np.issubdtype(arr.dtype, np.integer):
    raise InputError(f"lengths must be an int array [{shape[0]}] (one per prompt row), got "
                     f"{arr.dtype} {list(arr.shape)}")
  if np.any(arr < 1) or np.any(arr > shape[1]):
    raise InputError(f"prompt lengths must lie in [1, {shape[1]}] (the prompt buffer), got "
                     f"{arr.tolist()[:8]}")
  return arr.astype(np.int32)



def param_shapes(config: LMConfig) -> dict[str, tuple[int, ...]]:
  """Flat "/"-joined parameter name -> shape of every parameter `config` implies."""
  module = DecoderOnly(config)
  one = jnp.ones((1, 1), jnp.int32)
  abstract = nn.unbox(jax.eval_shape(module.init, jax.random.PRNGKey(0), one)["params"])
  return {"/".join(path): tuple(leaf.shape)
          for path, leaf in flax.traverse_util.flatten_dict(abstract).items()}
