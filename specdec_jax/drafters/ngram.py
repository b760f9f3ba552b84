"""Interpolated bigram/unigram tables as drafter (cost c ~ 0)."""

from __future__ import annotations

from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.errors import InputError

Array = jax.Array


class NGramDrafter(struct.PyTreeNode):
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
          lam: float = 0.9, start_id: int | None = 0, smoothing: float = 0.01) -> "NGramDrafter":
    """Estimate tables from decoder token sequences (each implicitly preceded by `start_id`;
    None: by nothing, as a decoder-only LM's texts, whose first token follows no token)."""
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k:
      raise InputError(f"NGramDrafter.fit: top_k must be an integer >= 1, got {top_k!r}")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
      raise InputError(f"NGramDrafter.fit: vocab_size must be an integer >= 1, "
                       f"got {vocab_size!r}")
    pairs: Any
    pairs, unigram = [], np.full(vocab_size, smoothing, np.float64)
    for s in sequences:
      s = np.asarray([t for t in s if t != 0] if start_id == 0 else list(s), np.int64)
      if s.size and (s.min() < 0 or s.max() >= vocab_size):
        raise InputError(f"n-gram training data has ids outside [0, {vocab_size})")
      np.add.at(unigram, s, 1.0)
      full = s if start_id is None else np.concatenate([[start_id], s])
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

  def init(self, inputs: Array, capacity: int, lengths: Array | None = None) -> Array:
    return jnp.zeros((inputs.shape[0],), jnp.int32)

  def first(self, state: Array, seq: Array, n: Array):
    prev = jnp.take_along_axis(seq, n[:, None], axis=1)[:, 0]
    return self.logits_after(prev), prev

  def next(self, state: Array, token: Array):
    return self.logits_after(token), token
