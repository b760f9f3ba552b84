"""Checks and defaults for decode requests: clear errors before anything is traced."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.config import T5Config
from specdec_jax.errors import InputError
from specdec_jax.models.model import check_tokens

Array = jax.Array


def check_request(encoder_tokens, config: T5Config, max_new_tokens: int) -> Array:
  """Validate a decode request and return the encoder tokens as int32 [B, Le]."""
  check_tokens(encoder_tokens, config, "encoder_tokens")
  check_positive_int(max_new_tokens, "max_new_tokens")
  limit = config.max_encoder_length
  if limit is not None and encoder_tokens.shape[1] > limit:
    raise InputError(f"encoder_tokens has length {encoder_tokens.shape[1]}, longer than the "
                     f"model allows (max_encoder_length={limit})")
  return jnp.asarray(encoder_tokens, jnp.int32)


def check_positive_int(value, name: str) -> int:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
    raise InputError(f"{name} must be an integer >= 1, got {value!r}")
  return int(value)


def check_same_vocabulary(target_vocab: int, drafter_vocab: int, what: str = "drafter") -> None:
  if drafter_vocab != target_vocab:
    raise InputError(
        f"vocabulary mismatch: {what} has vocab_size {drafter_vocab}, target has "
        f"{target_vocab}; drafter/verifier decoding needs the same vocabulary")


def resolve_eos(eos_id: int | None, config: T5Config) -> int:
  """None -> the model's EOS; a negative id disables stopping (T5X's eos_id=-1)."""
  return config.eos_id if eos_id is None else int(eos_id)


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
