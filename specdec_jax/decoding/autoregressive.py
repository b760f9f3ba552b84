"""Autoregressive baseline: one token per model call, one jitted `lax.while_loop`.

Pure pieces, usable from research code (vmap them, or drive your own loop):

    state = init_state(model, encoder_tokens, max_new_tokens, rng)
    while cond(state): state = step(model, state, sampling, eos_id)
    out = finish(state)

`generate` is exactly that loop under `jax.jit`. Semantics follow T5X's
`temperature_sample` from scratch: the decoder starts from token 0, a row ends
at its first EOS (kept) or after `max_new_tokens`, later positions are 0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax.cache import DecoderCache
from specdec_jax.decoding import common
from specdec_jax.model import Model

Array = jax.Array


@struct.dataclass
class DecodeState:
  """Loop state of the baseline.

  Attributes:
    seq: int32 [B, T + 1], start token then emitted tokens (see `common`).
    n: int32 [B], tokens emitted per row.
    done: bool [B].
    cache: the model's decoder cache, length n (every emitted token but the last).
    rng: PRNG key, split once per step.
    calls: int32 [], model calls so far.
    log_prob: float32 [B], sum of log-probs of emitted tokens under the adjusted distribution.
  """

  seq: Array
  n: Array
  done: Array
  cache: DecoderCache
  rng: Array
  calls: Array
  log_prob: Array


def init_state(model: Model, encoder_tokens: Array, max_new_tokens: int, rng: Array
               ) -> DecodeState:
  batch = encoder_tokens.shape[0]
  return DecodeState(
      seq=common.init_sequence(batch, max_new_tokens, model.config.decoder_start_id),
      n=jnp.zeros((batch,), jnp.int32),
      done=jnp.zeros((batch,), jnp.bool_),
      cache=model.start(encoder_tokens, capacity=max_new_tokens),
      rng=rng,
      calls=jnp.zeros((), jnp.int32),
      log_prob=jnp.zeros((batch,), jnp.float32))


def step(model: Model, state: DecodeState, sampling: sampling_lib.SamplingMethod,
         eos_id: int) -> DecodeState:
  """Feed each row's last token, sample the next one, append it to live rows."""
  rng, key = jax.random.split(state.rng)
  last = common.last_tokens(state.seq, state.n, 1)                       # [B, 1]
  logits, cache = model.decode(last, state.cache.with_length(state.n))   # [B, 1, V]
  logits = logits[:, 0]
  token = sampling_lib.sample(key, logits, sampling)
  logp = jnp.take_along_axis(sampling_lib.log_probs(logits, sampling), token[:, None], 1)[:, 0]
  seq, n, done, emitted = common.emit(state.seq, state.n, state.done, token[:, None],
                                      jnp.ones_like(state.n), eos_id)
  return DecodeState(seq=seq, n=n, done=done, cache=cache.with_length(n), rng=rng,
                     calls=state.calls + 1,
                     log_prob=state.log_prob + jnp.where(emitted > 0, logp, 0.0))


def cond(state: DecodeState) -> Array:
  return ~jnp.all(state.done)


def finish(state: DecodeState) -> common.DecodeOutput:
  stats = {"target_calls": state.calls, "log_prob_per_row": state.log_prob,
           "tokens_per_target_call": jnp.sum(state.n) / jnp.maximum(
               state.calls * state.n.shape[0], 1)}
  return common.output_from(state.seq, state.n, stats)


@functools.partial(jax.jit, static_argnames=("max_new_tokens", "sampling", "eos_id"))
def _generate(model, encoder_tokens, rng, *, max_new_tokens, sampling, eos_id):
  state = init_state(model, encoder_tokens, max_new_tokens, rng)
  state = jax.lax.while_loop(cond, functools.partial(step, model, sampling=sampling,
                                                     eos_id=eos_id), state)
  return finish(state)


def generate(model: Model, encoder_tokens, max_new_tokens: int = 64,
             sampling: sampling_lib.SamplingMethod | None = None, rng=None,
             eos_id: int | None = None) -> common.DecodeOutput:
  """Decode up to `max_new_tokens` per row from `encoder_tokens` [B, Le] (0-padded).

  Returns `DecodeOutput(tokens [B, T], lengths [B], stats)`.
  """
  encoder_tokens = common.check_request(encoder_tokens, model.config, max_new_tokens)
  return _generate(model, encoder_tokens, common.as_rng(rng), max_new_tokens=int(max_new_tokens),
                   sampling=sampling_lib.as_method(sampling),
                   eos_id=common.resolve_eos(eos_id, model.config))
