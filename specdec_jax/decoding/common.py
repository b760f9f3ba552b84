"""Pieces shared by every decoding loop: the token buffer, emission, outputs, input checks.

Token buffer convention: `seq` is int32 [B, T + 1] with `seq[:, 0]` the decoder
start token and `seq[:, 1 : n + 1]` the n tokens emitted so far; `n` [B] counts
them. A row is `done` once it emitted EOS or T tokens; done rows never change.

Both models' caches hold every emitted token except the last: the K/V of
`seq[:, :n]`, i.e. cache length n, and a round starts by feeding `seq[:, n]`.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.config import T5Config
from specdec_jax.model import InputError, check_tokens

Array = jax.Array


@struct.dataclass
class DecodeOutput:
  """Result of a decode call.

  Attributes:
    tokens: int32 [B, max_new_tokens], 0 after EOS.
    lengths: int32 [B], tokens generated per row including EOS.
    stats: mapping of statistics (scalars, and per-row arrays under `*_per_row`).
  """

  tokens: Array
  lengths: Array
  stats: Mapping[str, Any]


def init_sequence(batch: int, max_new_tokens: int, start_id: int) -> Array:
  seq = jnp.zeros((batch, max_new_tokens + 1), jnp.int32)
  return seq.at[:, 0].set(start_id)


def last_tokens(seq: Array, n: Array, k: int) -> Array:
  """The last k tokens of each row's prefix `seq[:, : n + 1]`: [B, k] (clamped at 0)."""
  idx = jnp.maximum(n[:, None] - (k - 1) + jnp.arange(k)[None, :], 0)
  return jnp.take_along_axis(seq, idx, axis=1)


def emit(seq: Array, n: Array, done: Array, candidates: Array, count: Array,
         eos_id: int) -> tuple[Array, Array, Array, Array]:
  """Append the first `count` [B] of `candidates` [B, k] to each live row.

  Emission stops after the first EOS and at the buffer's end (T tokens).
  Returns (seq, n, done, emitted [B]).
  """
  batch, k = candidates.shape
  capacity = seq.shape[1] - 1
  j = jnp.arange(k)[None, :]
  is_eos = (candidates == eos_id) & (j < count[:, None])
  first_eos = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1, k + 1)
  emitted = jnp.minimum(jnp.minimum(count, first_eos), capacity - n)
  emitted = jnp.where(done, 0, emitted)
  # Candidates past `emitted` go to an out-of-range column and are dropped.
  cols = jnp.where(j < emitted[:, None], n[:, None] + 1 + j, seq.shape[1])
  seq = seq.at[jnp.arange(batch)[:, None], cols].set(candidates, mode="drop")
  hit_eos = first_eos <= emitted
  n = n + emitted
  done = done | hit_eos | (n >= capacity)
  return seq, n, done, emitted


def output_from(seq: Array, n: Array, stats: Mapping[str, Any]) -> DecodeOutput:
  return DecodeOutput(tokens=seq[:, 1:], lengths=n, stats=stats)


def resolve_eos(eos_id: int | None, config: T5Config) -> int:
  """None -> the model's EOS; a negative id disables stopping (T5X's eos_id=-1)."""
  return config.eos_id if eos_id is None else int(eos_id)


def check_request(encoder_tokens, config: T5Config, max_new_tokens: int) -> Array:
  """Validate a decode request and return the encoder tokens as int32."""
  check_tokens(encoder_tokens, config, "encoder_tokens")
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
    raise InputError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
  limit = config.max_encoder_length
  if limit is not None and encoder_tokens.shape[1] > limit:
    raise InputError(f"encoder_tokens has length {encoder_tokens.shape[1]}, longer than the "
                     f"model allows (max_encoder_length={limit})")
  return jnp.asarray(encoder_tokens, jnp.int32)


@functools.lru_cache(maxsize=64)
def _seed_key(seed: int) -> Array:
  # Building a key is a dispatched computation (~0.5 ms on CPU): pay it once per seed.
  return jax.random.PRNGKey(seed)


def as_rng(rng) -> Array:
  """None -> the key of seed 0; an int -> its key; a key passes through."""
  if rng is None:
    return _seed_key(0)
  if isinstance(rng, (int, np.integer)):
    return _seed_key(int(rng))
  return rng
