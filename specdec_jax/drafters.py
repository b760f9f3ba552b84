"""Drafters: anything that proposes next-token logits from a prefix, behind one small interface.

A drafter is a pytree (so it passes through `jit`) with three pure methods:

    state = drafter.init(encoder_tokens [B, Le], capacity)
    logits, state = drafter.first(state, seq [B, T+1], n [B])   # next-token logits after seq[:, :n+1]
    logits, state = drafter.next(state, token [B])               # append a draft, logits after it

`first` starts a round from the emitted prefix (so any rollback of the previous
round is implicit), `next` extends the round's own drafts. Logits are
standardised by the caller with the same sampling transform as the target's.

    ModelDrafter(model)            a smaller T5 with the same vocabulary
    NGramDrafter.fit(sequences)    unigram / bigram tables (cost c ~ 0)
    PromptLookupDrafter()          copies continuations of matching n-grams from the input
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.cache import DecoderCache
from specdec_jax.decoding import common
from specdec_jax.model import InputError, Model

Array = jax.Array
_NEG = -1e9  # log-probability of "impossible" in table drafters (finite: no NaNs under scaling)


class Drafter(Protocol):
  vocab_size: int
  kind: str  # "model" drafters cost a forward pass per call; "table" drafters ~ nothing

  def init(self, encoder_tokens: Array, capacity: int) -> Any: ...
  def first(self, state: Any, seq: Array, n: Array) -> tuple[Array, Any]: ...
  def next(self, state: Any, token: Array) -> tuple[Array, Any]: ...


def check_compatible(target: Model, drafter: Drafter) -> None:
  if drafter.vocab_size != target.config.vocab_size:
    raise InputError(
        f"vocabulary mismatch: drafter has vocab_size {drafter.vocab_size}, target has "
        f"{target.config.vocab_size}; speculative decoding needs the same vocabulary")


# ----------------------------------------------------------------------------- model drafter


@struct.dataclass
class ModelDrafter:
  """A smaller T5 as drafter. Its cache follows the target's convention (length n).

  When the previous round accepted all gamma drafts, the drafter never saw the
  last draft; `first` therefore feeds the last TWO emitted tokens at offset
  n - 1 (re-writing position n - 1 with the same token is idempotent), which
  keeps one fixed shape [B, 2] whatever happened in the previous round.
  """

  model: Model
  kind: str = struct.field(pytree_node=False, default="model")

  @property
  def vocab_size(self) -> int:
    return self.model.config.vocab_size

  def init(self, encoder_tokens: Array, capacity: int) -> DecoderCache:
    return self.model.start(encoder_tokens, capacity)

  def first(self, cache: DecoderCache, seq: Array, n: Array):
    two = common.last_tokens(seq, n, 2)                     # [B, 2]: seq[n-1], seq[n]
    has_prev = n > 0
    # A row with nothing emitted has only the start token: feed it at position 0
    # and read logits there (position 1 holds junk until the first draft overwrites it).
    two = jnp.where(has_prev[:, None], two, seq[:, :1])
    logits, cache = self.model.decode(two, cache.with_length(jnp.maximum(n - 1, 0)))
    logits = jnp.where(has_prev[:, None], logits[:, 1], logits[:, 0])
    return logits, cache.with_length(n + 1)

  def next(self, cache: DecoderCache, token: Array):
    logits, cache = self.model.decode(token[:, None], cache)
    return logits[:, 0], cache


# ----------------------------------------------------------------------------- n-gram drafter


@struct.dataclass
class NGramDrafter:
  """Interpolated bigram/unigram table: q(.|a) = lam * bigram(.|a) + (1 - lam) * unigram.

  The bigram table is stored sparsely (the `top_k` most frequent followers of
  each token) so large vocabularies fit: ids [V, K], probs [V, K].
  `lam = 0` is a unigram drafter.
  """

  unigram: Array        # [V] float32 probabilities
  bigram_ids: Array     # [V, K] int32
  bigram_probs: Array   # [V, K] float32, rows sum to <= 1 (mass beyond top-K dropped)
  lam: float = struct.field(pytree_node=False, default=0.9)
  kind: str = struct.field(pytree_node=False, default="table")

  @property
  def vocab_size(self) -> int:
    return self.unigram.shape[0]

  @classmethod
  def fit(cls, sequences: Iterable[Iterable[int]], vocab_size: int, top_k: int = 16,
          lam: float = 0.9, start_id: int = 0, smoothing: float = 0.01) -> "NGramDrafter":
    """Estimate tables from decoder token sequences (each implicitly preceded by `start_id`)."""
    pairs, unigram = [], np.full(vocab_size, smoothing, np.float64)
    for s in sequences:
      s = np.asarray([t for t in s if t != 0] if start_id == 0 else list(s), np.int64)
      if s.size and (s.min() < 0 or s.max() >= vocab_size):
        raise InputError(f"n-gram training data has ids outside [0, {vocab_size})")
      np.add.at(unigram, s, 1.0)
      full = np.concatenate([[start_id], s])
      pairs.append(np.stack([full[:-1], full[1:]], 1))
    pairs = np.concatenate(pairs) if pairs else np.zeros((0, 2), np.int64)
    ids = np.zeros((vocab_size, top_k), np.int32)
    probs = np.zeros((vocab_size, top_k), np.float32)
    if len(pairs):
      uniq, counts = np.unique(pairs, axis=0, return_counts=True)
      totals = np.bincount(uniq[:, 0], weights=counts, minlength=vocab_size)
      order = np.lexsort((-counts, uniq[:, 0]))       # by prev token, then count desc
      uniq, counts = uniq[order], counts[order]
      starts = np.searchsorted(uniq[:, 0], np.arange(vocab_size))
      rank = np.arange(len(uniq)) - starts[uniq[:, 0]]
      keep = rank < top_k
      ids[uniq[keep, 0], rank[keep]] = uniq[keep, 1]
      probs[uniq[keep, 0], rank[keep]] = counts[keep] / totals[uniq[keep, 0]]
    return cls(unigram=jnp.asarray(unigram / unigram.sum(), jnp.float32),
               bigram_ids=jnp.asarray(ids), bigram_probs=jnp.asarray(probs), lam=lam)

  def logits_after(self, prev: Array) -> Array:
    """[B] previous tokens -> [B, V] log q."""
    batch = prev.shape[0]
    dense = jnp.zeros((batch, self.vocab_size), jnp.float32)
    dense = dense.at[jnp.arange(batch)[:, None], self.bigram_ids[prev]].add(
        self.bigram_probs[prev])
    has_bigram = jnp.sum(self.bigram_probs[prev], axis=-1, keepdims=True) > 0
    lam = jnp.where(has_bigram, self.lam, 0.0)
    q = lam * dense + (1.0 - lam) * self.unigram[None, :]
    return jnp.log(jnp.maximum(q, 1e-30))

  def init(self, encoder_tokens: Array, capacity: int) -> Array:
    return jnp.zeros((encoder_tokens.shape[0],), jnp.int32)

  def first(self, state: Array, seq: Array, n: Array):
    prev = jnp.take_along_axis(seq, n[:, None], axis=1)[:, 0]
    return self.logits_after(prev), prev

  def next(self, state: Array, token: Array):
    return self.logits_after(token), token


# ----------------------------------------------------------------------------- prompt lookup


@struct.dataclass
class LookupState:
  encoder_tokens: Array  # [B, Le]
  pointer: Array         # [B] index into encoder_tokens of the next proposal, -1: none


@struct.dataclass
class PromptLookupDrafter:
  """Copy the continuation of the longest suffix n-gram (<= max_ngram) found in the input.

  Proposals are one-hot: q(x) = 1 for the copied token. Without a match the
  drafter proposes from a uniform q (almost surely rejected under greedy).
  """

  vocab_size: int = struct.field(pytree_node=False)
  max_ngram: int = struct.field(pytree_node=False, default=3)
  kind: str = struct.field(pytree_node=False, default="table")

  def _logits(self, state: LookupState) -> Array:
    batch, length = state.encoder_tokens.shape
    ok = (state.pointer >= 0) & (state.pointer < length)
    token = jnp.take_along_axis(state.encoder_tokens,
                                jnp.clip(state.pointer, 0, length - 1)[:, None], axis=1)[:, 0]
    ok = ok & (token > 0)
    one_hot = jax.nn.one_hot(token, self.vocab_size, dtype=jnp.bool_)
    return jnp.where(ok[:, None], jnp.where(one_hot, 0.0, _NEG), 0.0)

  def init(self, encoder_tokens: Array, capacity: int) -> LookupState:
    return LookupState(encoder_tokens, jnp.full((encoder_tokens.shape[0],), -1, jnp.int32))

  def first(self, state: LookupState, seq: Array, n: Array):
    enc = state.encoder_tokens
    batch, length = enc.shape
    pointer = jnp.full((batch,), -1, jnp.int32)
    for g in range(1, self.max_ngram + 1):   # longer matches override shorter ones
      suffix = common.last_tokens(seq, n, g)                       # [B, g]
      windows = jnp.stack([jnp.roll(enc, -j, axis=1) for j in range(g)], -1)  # [B, Le, g]
      starts = jnp.arange(length)
      match = jnp.all(windows == suffix[:, None, :], -1) & (starts + g < length)[None]
      match = match & (jnp.take_along_axis(enc, jnp.minimum(starts + g, length - 1)[None]
                                           .repeat(batch, 0), axis=1) > 0)
      found = jnp.any(match, axis=1) & (n >= g)      # the suffix must be emitted tokens
      pointer = jnp.where(found, jnp.argmax(match, axis=1) + g, pointer)
    state = LookupState(enc, pointer)
    return self._logits(state), state

  def next(self, state: LookupState, token: Array):
    length = state.encoder_tokens.shape[1]
    proposed = jnp.take_along_axis(state.encoder_tokens,
                                   jnp.clip(state.pointer, 0, length - 1)[:, None], 1)[:, 0]
    follows = (state.pointer >= 0) & (proposed == token)
    state = LookupState(state.encoder_tokens, jnp.where(follows, state.pointer + 1, -1))
    return self._logits(state), state


def as_drafter(drafter, target: Model) -> Drafter:
  """A `Model` becomes a `ModelDrafter`; drafters pass through. Checks the vocabulary."""
  if isinstance(drafter, Model):
    drafter = ModelDrafter(drafter)
  if not all(hasattr(drafter, a) for a in ("init", "first", "next", "vocab_size")):
    raise InputError(f"not a drafter: {type(drafter).__name__} (need init/first/next)")
  check_compatible(target, drafter)
  return drafter
