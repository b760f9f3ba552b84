"""Fixed-shape decoder caches as explicit pytrees.

A `DecoderCache` holds, per decoder layer, self-attention K/V buffers of a fixed
capacity C, and as a separate part (`CrossKV`) the cross-attention K/V of the
encoder output (computed once per request).
Each row b has its own `length[b]`: positions ``0 .. length[b]-1`` are valid.

A decoder-only model's cache also holds its prompt. An ANCHORED cache (`anchored`) keeps
the prompt before a per-row `offset[b]` and counts `length[b]` from there: the row's
valid slots are ``0 .. offset[b] + length[b] - 1`` and a decode call writes at slot
``offset[b] + length[b]``. So `length` means "positions after the prompt" for every model,
and code that rolls a cache back by length (the round engine, the drafters) is the same
for a T5 decoder (no offset: None, i.e. 0) and a decoder-only LM.

A decode call with k tokens per row writes their K/V at positions
``length[b] .. length[b]+k-1`` (OVERWRITING whatever was there), attends
causally among them and to the row's valid prefix, and returns the cache with
``length + k``. Rolling back is lowering `length`: stale entries beyond it are
never read, because a query at position t only sees keys at positions <= t,
and every position <= t was (re)written before that query ran.

Worked example (one row, C = 6; `.` = never written, lower case = stale)::

    decode([a, b, c])   buffer [a b c . . .]  length 3
    rollback to 1       buffer [a b c . . .]  length 1  (b, c stale)
    decode([x, y])      buffer [a x y . . .]  length 3  (overwritten)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.errors import InputError


class CrossKV(struct.PyTreeNode):
  """Cross-attention K/V of one encoder output, computed once per request.

  Attributes:
    key, value: per layer, [B, H, Le, Dh].
    mask: [B, Le] bool, True at real (non-pad) encoder tokens.
  """

  key: tuple[jax.Array, ...]
  value: tuple[jax.Array, ...]
  mask: jax.Array


class DecoderCache(struct.PyTreeNode):
  """Decoder state for cached decoding. L = layers, C = capacity.

  Attributes:
    self_key, self_value: per layer, [B, H, C, Dh] self-attention buffers (heads-major,
      as attention consumes them: reading a buffer needs no transpose).
    length: [B] int32, number of valid positions per row (after `offset`).
    cross: the cross-attention part (an encoder-decoder's), or None for a decoder alone.
    offset: [B] int32 slots before position 0 of `length` (a decoder-only model's prompt,
      see `anchored`), or None: 0 (T5).
  """

  self_key: tuple[jax.Array, ...]
  self_value: tuple[jax.Array, ...]
  length: jax.Array
  cross: CrossKV | None = None
  offset: jax.Array | None = None

  @property
  def capacity(self) -> int:
    return self.self_key[0].shape[2]

  @property
  def batch_size(self) -> int:
    return self.length.shape[0]

  def with_length(self, length: jax.Array) -> "DecoderCache":
    """Rollback (or set) every row's valid length: nothing is copied."""
    return self.replace(length=jnp.asarray(length, jnp.int32))

  @property
  def next_slot(self) -> jax.Array:
    """[B] int32 the slot the next decoded token is written to: offset + length."""
    return self.length if self.offset is None else self.offset + self.length

  def anchored(self) -> "DecoderCache":
    """The same buffers with every row's valid prefix moved into `offset` (length 0).

    A decoder-only prefill (`Model.start`) leaves length P_b - 1; anchored, `length`
    counts the tokens decoded after the prompt, as a T5 decoder's does from its start.
    """
    if self.cross is not None:
      raise InputError("anchored() is for decoder-only caches: a T5 decoder starts empty")
    return self.replace(offset=self.next_slot, length=jnp.zeros_like(self.length))


def write(buffer: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
  """Overwrite `buffer` [B, H, C, Dh] with `new` [B, H, k, Dh] at `positions` [B, k].

  Positions >= C are dropped (a finished row may point past its buffer); they are
  never read, since the causal mask only admits positions < C.
  """
  rows = jnp.arange(buffer.shape[0])[:, None, None]
  heads = jnp.arange(buffer.shape[1])[None, :, None]
  return buffer.at[rows, heads, positions[:, None, :]].set(new.astype(buffer.dtype),
                                                            mode="drop")


def query_positions(length: jax.Array, k: int) -> jax.Array:
  """[B] lengths -> [B, k] absolute positions of the k new tokens of each row."""
  return length[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]


def tree_mask(length: jax.Array, slots: jax.Array, visible: jax.Array,
              num_keys: int) -> jax.Array:
  """Mask of a call whose new tokens form a tree (several drafts behind one shared token).

  length [B]: valid prefix; slots [B, k]: where the k new tokens are written;
  visible [B | 1, k, k] bool: new token i may attend to new token j.
  Returns [B, 1, k, C] bool: the whole valid prefix, plus the visible new tokens.
  """
  keys = jnp.arange(num_keys, dtype=jnp.int32)
  prefix = keys[None, None, :] < length[:, None, None]                      # [B, 1, C]
  is_slot = keys[None, None, :] == slots[:, :, None]                         # [B, k, C]
  new = jnp.any(visible[..., None] & is_slot[:, None, :, :], axis=2)         # [B, k, C]
  return (prefix | new)[:, None]


def key_positions(slots: jax.Array, positions: jax.Array, num_keys: int) -> jax.Array:
  """[B, C] logical position of every key: its slot, except new tokens' given positions."""
  keys = jnp.broadcast_to(jnp.arange(num_keys, dtype=jnp.int32), (slots.shape[0], num_keys))
  return keys.at[jnp.arange(slots.shape[0])[:, None], slots].set(positions, mode="drop")


def move(cache: DecoderCache, src: jax.Array, dst: jax.Array) -> DecoderCache:
  """Copy every layer's K/V at positions `src` [B, g] to positions `dst` [B, g], both
  counted after the cache's offset (parallel drafts: the accepted draft's entries move to
  where a single draft would have written them)."""
  if cache.offset is not None:
    src, dst = src + cache.offset[:, None], dst + cache.offset[:, None]
  idx = src[:, None, :, None]

  def moved(buffer):
    return write(buffer, jnp.take_along_axis(buffer, idx, axis=2, mode="clip"), dst)

  return cache.replace(self_key=tuple(map(moved, cache.self_key)),
                       self_value=tuple(map(moved, cache.self_value)))


def empty_self_kv(batch: int, capacity: int, num_heads: int, head_dim: int, dtype,
                  num_layers: int) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
  shape = (batch, num_heads, capacity, head_dim)
  zeros = tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))
  return zeros, tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))


def cache_bytes(cache: DecoderCache) -> int:
  return int(sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(cache)))
