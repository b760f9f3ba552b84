"""Prompt lookup: copy the continuation of a suffix n-gram found in the input.

The input is a T5 request's encoder tokens (0-padded), or a decoder-only request's
right-padded prompt with its lengths: there the suffix may include the prompt's last token
(`seq[:, 0]`), and only tokens within a row's length are copied.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.errors import InputError
from specdec_jax.rounds.buffer import last_tokens

Array = jax.Array
_NEG = -1e9  # log-probability of "impossible" (finite: no NaNs under scaling)


class LookupState(struct.PyTreeNode):
  inputs: Array  # [B, Le]
  pointer: Array         # [B] index into inputs of the next proposal, -1: none
  lengths: Array | None = None   # [B] a decoder-only prompt's lengths; None: T5 (0-padded)

  def real(self, index: Array) -> Array:
    """bool, index [B, ...] into the input: a real token there (not padding)."""
    length = self.inputs.shape[1]
    if self.lengths is not None:
      return (index >= 0) & (index < self.lengths.reshape((-1,) + (1,) * (index.ndim - 1)))
    token = jnp.take_along_axis(self.inputs, jnp.clip(index, 0, length - 1), axis=1)
    return (index >= 0) & (index < length) & (token > 0)


@struct.dataclass
class PromptLookupDrafter:
  """Copy the continuation of the longest suffix n-gram (<= max_ngram) found in the input.

  Proposals are one-hot: q(x) = 1 for the copied token. Without a match the
  drafter proposes from a uniform q (almost surely rejected under greedy).
  """

  vocab_size: int = struct.field(pytree_node=False)
  max_ngram: int = struct.field(pytree_node=False, default=3)
  kind: str = struct.field(pytree_node=False, default="table")

  def __post_init__(self):
    for name in ("vocab_size", "max_ngram"):
      v = getattr(self, name)
      if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise InputError(f"PromptLookupDrafter.{name} must be an integer >= 1, got {v!r}")

  def _logits(self, state: LookupState) -> Array:
    batch, length = state.inputs.shape
    ok = state.real(state.pointer[:, None])[:, 0]
    token = jnp.take_along_axis(state.inputs,
                                jnp.clip(state.pointer, 0, length - 1)[:, None], axis=1)[:, 0]
    one_hot = jax.nn.one_hot(token, self.vocab_size, dtype=jnp.bool_)
    return jnp.where(ok[:, None], jnp.where(one_hot, 0.0, _NEG), 0.0)

  def init(self, inputs: Array, capacity: int,
           lengths: Array | None = None) -> LookupState:
    return LookupState(inputs, jnp.full((inputs.shape[0],), -1, jnp.int32),
                       lengths)

  def first(self, state: LookupState, seq: Array, n: Array):
    enc = state.inputs
    batch, length = enc.shape
    # The suffix must be real tokens: emitted ones, and a prompt's last token at seq[:, 0]
    # (T5's start token there is not text).
    known = n + int(state.lengths is not None)
    pointer = jnp.full((batch,), -1, jnp.int32)
    for g in range(1, self.max_ngram + 1):   # longer matches override shorter ones
      suffix = last_tokens(seq, n, g)                       # [B, g]
      windows = jnp.stack([jnp.roll(enc, -j, axis=1) for j in range(g)], -1)  # [B, Le, g]
      starts = jnp.arange(length)
      match = jnp.all(windows == suffix[:, None, :], -1) & (starts + g < length)[None]
      match = match & state.real(jnp.broadcast_to(starts + g, (batch, length)))
      found = jnp.any(match, axis=1) & (known >= g)
      pointer = jnp.where(found, jnp.argmax(match, axis=1) + g, pointer)
    state = state.replace(pointer=pointer)
    return self._logits(state), state

  def next(self, state: LookupState, token: Array):
    length = state.inputs.shape[1]
    proposed = jnp.take_along_axis(state.inputs,
                                   jnp.clip(state.pointer, 0, length - 1)[:, None], 1)[:, 0]
    follows = (state.pointer >= 0) & (proposed == token)
    state = state.replace(pointer=jnp.where(follows, state.pointer + 1, -1))
    return self._logits(state), state
