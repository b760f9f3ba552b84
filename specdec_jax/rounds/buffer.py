"""The token buffer every decoding loop shares, and the output of a decode call.

Convention: `seq` is int32 [B, T + 1] with `seq[:, 0]` the decoder start token (a
decoder-only model: each row's last prompt token) and `seq[:, 1 : n + 1]` the n tokens
emitted so far; `n` [B] counts them. A row
is `done` once it emitted a stop token (EOS) or T tokens; done rows never change.

Every model cache holds every emitted token except the last: the K/V of
`seq[:, :n]`, i.e. cache length n, and a round starts by feeding `seq[:, n]`. A decoder-only
model's cache holds the rest of the prompt before that, below its offset
(`DecoderCache.anchored`): its length counts from `seq[:, 0]` all the same.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.rounds.stats import DecodeStats, summarize

Array = jax.Array


@struct.dataclass
class DecodeOutput:
  """Result of a decode call.

  Attributes:
    tokens: int32 [B, max_new_tokens], 0 after EOS.
    lengths: int32 [B], tokens generated per row including EOS.
    counters: the `DecodeStats` counters, per row (merge several calls with `stats.merge`).
    info: static facts about the run (method, gamma, lossy, ...), as (key, value) pairs.
    statistics: the method's own readable statistics beside the common ones (its
      `statistics`; None: every one), what `.stats` shows.
  """

  tokens: Array
  lengths: Array
  counters: DecodeStats
  info: tuple[tuple[str, Any], ...] = struct.field(pytree_node=False, default=())
  statistics: tuple[str, ...] | None = struct.field(pytree_node=False, default=None)

  @functools.cached_property
  def stats(self) -> Mapping[str, Any]:
    """The readable statistics: host Python numbers (tokens, rounds, target_calls,
    tokens_per_target_call, alpha, acceptance_rate, ...; `stats.summarize` documents each
    name), plus `info`. Computed once per output. Per-row values: `counters` ([B] each),
    or `stats.summarize(out.counters, dict(out.info), raw=True)`."""
    return self.derive_stats(summarize(self.counters, dict(self.info),
                                       statistics=self.statistics), [self])

  @staticmethod
  def derive_stats(summary: dict[str, Any], outputs: Sequence[Any]) -> dict[str, Any]:
    """The readable statistics of `outputs` (one run's calls, e.g. a corpus's batches)
    from `summary`, `summarize` of their merged counters (`stats.merge_outputs` calls
    it). An output that carries counts beyond the per-row counters (speculative beam's
    steps) derives its statistics here, as ratios of totals; by default: `summary`."""
    return summary


def init_sequence(batch: int, max_new_tokens: int, start_id) -> Array:
  """[B, T + 1] buffer holding only the start token (`start_id`: one id, or [B] per row)."""
  seq = jnp.zeros((batch, max_new_tokens + 1), jnp.int32)
  return seq.at[:, 0].set(start_id)


def last_tokens(seq: Array, n: Array, k: int) -> Array:
  """The last k tokens of each row's prefix `seq[:, : n + 1]`: [B, k] (clamped at 0)."""
  idx = jnp.maximum(n[:, None] - (k - 1) + jnp.arange(k)[None, :], 0)
  return jnp.take_along_axis(seq, idx, axis=1)


def emit(seq: Array, n: Array, done: Array, candidates: Array, count: Array,
         eos_id: int | None = None, *, stops: Array | None = None,
         limit: Array | None = None) -> tuple[Array, Array, Array, Array]:
  """Append the first `count` [B] of `candidates` [B, k] to each live row.

  A row takes candidates up to and including its first stop token (by default
  a candidate equal to `eos_id`; `stops` [B, k] bool overrides), and no more
  than its `limit` [B] (default: the buffer's T) allows in total. It is then done.

  Worked example (T = 6, eos_id = 1; rows at n = 2, 2, 4, and row 3 done)::

      candidates       count   -> appended          n   done
      [7, 8, 9]        2          7 8               4   no
      [7, 1, 9]        3          7 1   (EOS: stop)  4   yes
      [7, 8, 9]        3          7 8   (T reached)  6   yes
      [7, 8, 9]        3          -     (done)       .   yes

  Returns:
    (seq, n, done, emitted [B]): the updated buffer and how many tokens each row took.
  """
  batch, k = candidates.shape
  if limit is None:
    limit = jnp.full_like(n, seq.shape[1] - 1)
  j = jnp.arange(k)[None, :]
  is_stop = (candidates == eos_id) if stops is None else stops
  is_stop = is_stop & (j < count[:, None])
  first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1, k + 1)
  emitted = jnp.minimum(jnp.minimum(count, first_stop), jnp.maximum(limit - n, 0))
  emitted = jnp.where(done, 0, emitted)
  # Candidates past `emitted` go to an out-of-range column and are dropped.
  cols = jnp.where(j < emitted[:, None], n[:, None] + 1 + j, seq.shape[1])
  seq = seq.at[jnp.arange(batch)[:, None], cols].set(candidates, mode="drop")
  n = n + emitted
  done = done | (first_stop <= emitted) | (n >= limit)
  return seq, n, done, emitted
