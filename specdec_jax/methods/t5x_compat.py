"""A drop-in for `t5x.decoding.temperature_sample`, driven by a T5X-style callback.

Same signature and semantics as T5X (cc342d4), so T5X users can swap our
baseline in, or drive OUR cached models from T5X code:

    cache = model.start(inputs, capacity=L)
    seqs, log_probs = temperature_sample(
        jnp.zeros((B, L), jnp.int32), cache, tokens_to_logits_for(model),
        eos_id=1, temperature=0.0)             # seqs [B, 1, L], log_probs [B, 1]

Also `beam_search`, T5X's beam search over the same callback (its loop: `beam`).

Semantics (T5X's): `inputs[:, 0]` is the BOS slot; other non-zero entries are a
forced prompt (teacher forcing, no log-prob); a row ends when it emits more
`eos_id`s than its prompt holds or reaches the end, ended rows emit 0, the loop
stops when every row has ended; `temperature <= 1e-4` is argmax; `topk` and
`topp` both non-zero is a ValueError; `num_decodes > 1` repeats rows as
[e0, e0, e1, e1, ...] and returns decodes sorted by log-prob ASCENDING (best
last); with `rescale_log_probs` the log-probs are those of the adjusted
distribution (zero for greedy), otherwise of the raw logits.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
from flax import struct, traverse_util

from specdec_jax import sampling as sampling_lib
from specdec_jax.cache import DecoderCache
from specdec_jax.errors import InputError
from specdec_jax.methods import beam
from specdec_jax.rounds import buffer

Array = jax.Array
MIN_TEMPERATURE = 1e-4
NEG_INF = -1.0e7
_EXTRA_INPUT_TOKENS = 2  # sequences are padded by 2 so index i + 1 is always in range


@struct.dataclass
class DecodingState:
  """What `tokens_to_logits` receives (T5X field names)."""

  cur_index: Array   # [B*n] int32
  sequences: Array   # [B*n, L]
  cur_token: Array   # [B*n, 1]
  cache: Any


@struct.dataclass
class SamplingLoopState:
  """While-loop state (T5X field names, so `state_callback_fn`s port unchanged)."""

  step: Array
  cur_index: Array
  sequences: Array
  cache: Any
  cur_token: Array
  ended: Array
  rng: Array
  log_prob: Array


def _repeat_rows(x: Array, n: int, axis: int = 0) -> Array:
  """[..., B, ...] -> [..., B*n, ...] as [e0, e0, e1, e1, ...]."""
  return jnp.repeat(x, n, axis=axis)


def cache_map(fn: Callable[[Array], Array], cache: Any, apply_to_index: bool = False) -> Any:
  """Map `fn` over a cache's arrays.

  T5X flax caches (nested dicts) follow T5X: `cache_index` only with
  `apply_to_index`, never `cached_bias` / `position_embedder_index`. Any other
  pytree (such as our `DecoderCache`, whose `length` is per row) maps every leaf.
  """
  if not isinstance(cache, Mapping):
    return jax.tree_util.tree_map(fn, cache)
  frozen = isinstance(cache, flax.core.FrozenDict)
  flat = traverse_util.flatten_dict(flax.core.unfreeze(cache)
                                    if isinstance(cache, flax.core.FrozenDict) else dict(cache))
  skip = {"cached_bias", "position_embedder_index"} | (set() if apply_to_index
                                                       else {"cache_index"})
  flat = {k: (v if k[-1] in skip else fn(v)) for k, v in flat.items()}
  out = traverse_util.unflatten_dict(flat)
  return flax.core.freeze(out) if frozen else out


def _is_tracer(x) -> bool:
  return isinstance(x, jax.core.Tracer)


def _capacity(cache: Any) -> int | None:
  """Self-attention slots of `cache`: our `DecoderCache`'s capacity, or the length axis
  (last) of a T5X flax cache's `cached_key` [..., heads, head_dim, length]; None for a
  cache of another kind (a callback's own state)."""
  if isinstance(cache, DecoderCache):
    return cache.capacity
  if isinstance(cache, Mapping):
    flat = traverse_util.flatten_dict(flax.core.unfreeze(cache)
                                      if isinstance(cache, flax.core.FrozenDict) else dict(cache))
    lengths = [v.shape[-1] for k, v in flat.items()
               if k[-1] == "cached_key" and getattr(v, "ndim", 0) >= 3]
    return min(lengths) if lengths else None
  return None


def _max_offset(cache: Any) -> int:
  """The largest slot before position 0 of a `DecoderCache` row (`offset`: an anchored
  prompt); 0 when it has none, or when it is traced (then only the static part is checked)."""
  offset = getattr(cache, "offset", None) if isinstance(cache, DecoderCache) else None
  if offset is None or _is_tracer(offset):
    return 0
  return int(jnp.max(offset))


def check_capacity(cache: Any, positions: int, fn: str) -> None:
  """InputError when `cache` holds fewer slots than the decode writes.

  A write past the last slot is dropped (`cache.write`; T5X's one-hot update likewise):
  that token attends to no key of its own and later tokens never see it, so the decode
  runs on and returns other tokens without any error. `positions`: the slots the decode
  writes, counted from slot 0.
  """
  capacity = _capacity(cache)
  if capacity is not None and capacity < positions:
    raise InputError(f"{fn}: the cache holds {capacity} positions, the decode needs "
                     f"{positions} (its length); make the cache with capacity >= {positions} "
                     f"(ours: model.start(inputs, capacity={positions}))")


def _adjusted_logits(logits: Array, temperature: Array, topk, topp) -> Array:
  scaled = logits / jnp.maximum(temperature, MIN_TEMPERATURE)
  if topk:
    scaled = sampling_lib.top_k_mask(scaled, topk)
  if _is_tracer(topp):        # a dynamic decode parameter (T5X takes it traced under jit)
    scaled = jnp.where(topp > 0, sampling_lib.top_p_mask(scaled, topp), scaled)
  elif topp:
    scaled = sampling_lib.top_p_mask(scaled, topp)
  return jnp.where(jnp.isneginf(scaled), NEG_INF, scaled)


def _sample_step(rng, logits, temperature, topk, topp, rescale_log_probs):
  """One token per row and its log-prob. logits [N, V] -> ([N] int32, [N] float32)."""
  raw_log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  temperature = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), logits.shape[:1])
  scaled = _adjusted_logits(logits.astype(jnp.float32), temperature[:, None], topk, topp)
  sampled = jax.random.categorical(rng, scaled, axis=-1).astype(jnp.int32)
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  is_greedy = temperature <= MIN_TEMPERATURE
  token = jnp.where(is_greedy, greedy, sampled)
  adjusted = jax.nn.log_softmax(scaled, axis=-1) if rescale_log_probs else raw_log_probs
  logp = jnp.take_along_axis(adjusted, token[:, None], axis=-1)[:, 0]
  if rescale_log_probs:
    logp = jnp.where(is_greedy, 0.0, logp)
  return token, logp


def _single_trial(inputs, cache, tokens_to_logits, eos_id, rng, temperature, topk, topp,
                  initial_index, max_decode_steps, rescale_log_probs, state_callback_fn,
                  logit_callback_fn):
  batch, length = inputs.shape
  max_decode_len = jnp.full((batch,), length, jnp.int32)
  if max_decode_steps is not None:
    max_decode_len = jnp.minimum(length, jnp.sum(inputs != 0, axis=1) + max_decode_steps)
  sequences0 = jnp.pad(inputs, ((0, 0), (0, _EXTRA_INPUT_TOKENS)))
  if initial_index is None:
    i0 = jnp.zeros((batch,), jnp.int32)
    token0 = jnp.zeros((batch, 1), jnp.int32)
  else:
    i0 = jnp.asarray(initial_index, jnp.int32)
    token0 = jnp.take_along_axis(sequences0, i0[:, None], axis=1)
  state0 = SamplingLoopState(step=jnp.zeros((), jnp.int32), cur_index=i0, sequences=sequences0,
                             cache=cache, cur_token=token0,
                             ended=jnp.zeros((batch, 1), jnp.bool_), rng=rng,
                             log_prob=jnp.zeros((batch,), jnp.float32))

  def body(state: SamplingLoopState) -> SamplingLoopState:
    if state_callback_fn is not None:
      state = state_callback_fn(state)
    key, next_rng = jax.random.split(state.rng)
    logits, new_cache = tokens_to_logits(DecodingState(
        cur_index=state.cur_index, sequences=state.sequences[:, :-_EXTRA_INPUT_TOKENS],
        cur_token=state.cur_token, cache=state.cache))
    if isinstance(state.cache, flax.core.FrozenDict):
      new_cache = flax.core.freeze(new_cache)
    if logit_callback_fn is not None:
      logits = logit_callback_fn(logits, state)
    token, logp = _sample_step(key, logits, temperature, topk, topp, rescale_log_probs)
    forced = jnp.take_along_axis(state.sequences, (state.cur_index + 1)[:, None], axis=1)[:, 0]
    free = forced == 0                      # outside the forced prompt
    token = jnp.where(free, token, forced)
    live = ~state.ended[:, 0]
    # T5X's end rule through the shared `emit`: a row ends at a generated (not forced)
    # EOS, or when its cur_index reaches max_decode_len; ended rows write nothing more.
    sequences, cur_index, ended, _ = buffer.emit(
        state.sequences, state.cur_index, state.ended[:, 0], token[:, None], jnp.ones_like(i0),
        stops=(free & (token == eos_id))[:, None], limit=max_decode_len)
    return SamplingLoopState(step=state.step + 1, cur_index=cur_index, sequences=sequences,
                             cache=new_cache, cur_token=jnp.where(live, token, 0)[:, None],
                             ended=ended[:, None], rng=next_rng,
                             log_prob=state.log_prob + jnp.where(free & live, logp, 0.0))

  final = jax.lax.while_loop(lambda s: ~jnp.all(s.ended), body, state0)
  if state_callback_fn is not None:
    final = state_callback_fn(final)
  return final.sequences[:, 1:-1], final.log_prob


def temperature_sample(
    inputs: Array,
    cache: Mapping[str, Array],
    tokens_to_logits: Callable[[DecodingState], Tuple[Array, Mapping[str, Array]]],
    eos_id: int,
    decode_rng: Optional[Array] = None,
    num_decodes: int = 1,
    temperature: Union[float, Array] = 1.0,
    topk: int = 1,
    topp: float = 0.0,
    cache_offset: int = 0,
    initial_index: Optional[Array] = None,
    max_decode_steps: Optional[Union[int, Array]] = None,
    max_decode_steps_hard_limit: Optional[int] = None,
    rescale_log_probs: bool = True,
    state_callback_fn: Optional[Callable[[SamplingLoopState], SamplingLoopState]] = None,
    logit_callback_fn: Optional[Callable[[Array, SamplingLoopState], Array]] = None,
) -> Tuple[Array, Array]:
  """Temperature sampling with T5X's contract: returns (sequences [B, n, L], log_probs [B, n]).

  Example (T5X docstring, Example 2): inputs [[0, 5, 1, 0, 0], [0, 8, 0, 0, 0]] force
  `5, 1` on row 0 (its eos is part of the prompt, so it continues) and `8` on row 1.
  """
  if not _is_tracer(topp) and not _is_tracer(topk) and topp and topk:
    raise ValueError("At most one of `topp` or `topk` may be non-zero.")
  # Positions 0 .. L-1 are fed (each call predicts the next slot), after any anchored prompt.
  check_capacity(cache, inputs.shape[1] + _max_offset(cache), "temperature_sample")
  if decode_rng is None:
    decode_rng = jax.random.PRNGKey(0)
  if max_decode_steps is not None:
    # T5X clamps to the hard limit first, then checks what is left (when concrete).
    if max_decode_steps_hard_limit is not None and max_decode_steps_hard_limit > 0:
      max_decode_steps = jnp.minimum(max_decode_steps, max_decode_steps_hard_limit)
    if not _is_tracer(max_decode_steps) and max_decode_steps > inputs.shape[1]:
      raise ValueError("Cannot decode more steps than the sequence length.")
  if num_decodes > 1:
    inputs = _repeat_rows(inputs, num_decodes)
    cache = cache_map(lambda x: _repeat_rows(x, num_decodes, cache_offset)
                      if getattr(x, "ndim", 0) > cache_offset else x,
                      cache, apply_to_index=initial_index is not None)
    if initial_index is not None:
      initial_index = _repeat_rows(initial_index, num_decodes)
  temperature = jnp.asarray(temperature, jnp.float32)
  if temperature.ndim == 1 and num_decodes > 1:
    temperature = _repeat_rows(temperature, num_decodes)
  seqs, log_probs = _single_trial(inputs, cache, tokens_to_logits, eos_id, decode_rng,
                                  temperature, topk, topp, initial_index, max_decode_steps,
                                  rescale_log_probs, state_callback_fn, logit_callback_fn)
  batch = seqs.shape[0] // num_decodes
  seqs = seqs.reshape((batch, num_decodes) + seqs.shape[1:])
  log_probs = log_probs.reshape((batch, num_decodes))
  order = jnp.argsort(log_probs, axis=-1)
  return (jnp.take_along_axis(seqs, order[:, :, None], axis=1),
          jnp.take_along_axis(log_probs, order, axis=1))


def tokens_to_logits_for(model) -> Callable[[DecodingState], Tuple[Array, Any]]:
  """T5X callback over one of our models: its `DecoderCache` is indexed by `cur_index`.

  Our cache takes per-row offsets, so the cache length is simply set to
  `cur_index` [B] before each one-token call (T5X's own cache keeps a scalar index).
  Beam search passes a scalar `cur_index`: there every row advances one position per
  step, so the cache keeps its own per-row lengths (a prefilled prompt's included).
  """
  def tokens_to_logits(state: DecodingState):
    cache = state.cache
    if jnp.ndim(state.cur_index):
      cache = cache.with_length(state.cur_index)
    logits, cache = model.decode(state.cur_token, cache)
    return logits[:, 0], cache
  return tokens_to_logits


def _beam_positions(cache: Any, length: int, initial_index) -> int:
  """The slots a beam search of `length` slots (L) writes: L - 1 steps, L - 1 - min(initial
  index) with one (`beam.cond`). Our cache writes each row from its own next slot (a
  prefilled prompt's end); a T5X cache, or a traced length or index: slots 0 .. L - 2."""
  if not isinstance(cache, DecoderCache):
    return length - 1
  first, start = cache.next_slot, 0
  if initial_index is not None:
    if _is_tracer(initial_index):
      return length - 1
    start = int(jnp.min(jnp.asarray(initial_index)))
  return length - 1 if _is_tracer(first) else int(jnp.max(first)) + length - 1 - start


def beam_search(
    inputs: Array,
    cache: Mapping[str, Array],
    tokens_to_logits: Callable[[DecodingState], Tuple[Array, Mapping[str, Array]]],
    eos_id: int,
    num_decodes: int = 4,
    alpha: float = 0.6,
    max_decode_len: Optional[int] = None,
    max_decode_step: int = -1,
    min_log_prob: float = beam.NEG_INF,
    decode_rng: Optional[Array] = None,
    cache_offset: int = 0,
    initial_index: Optional[Array] = None,
) -> Tuple[Array, Array]:
  """Beam search with T5X's contract: returns (sequences [B, K, L], scores [B, K]),
  ascending by score (best last); K = num_decodes, L = max_decode_len or inputs' width.

  Non-zero `inputs` after column 0 are a forced prefix (kept on one beam, no log-prob);
  with `initial_index` [B] the cache already holds each row's prompt and decoding starts
  from its last token; the prompt leads the returned sequences. The loop is
  `beam.search`; `decode_rng` is unused (as in T5X).
  """
  del decode_rng
  batch = inputs.shape[0]
  length = (inputs.shape[1] if max_decode_len is None else max_decode_len) + 1
  check_capacity(cache, _beam_positions(cache, length, initial_index), "beam_search")
  aligned = None
  first = jnp.zeros((batch,), jnp.int32)
  if initial_index is not None:
    aligned = beam.right_align(jnp.asarray(inputs, jnp.int32))
    first = aligned[:, -1]
    inputs = jnp.zeros_like(aligned).at[:, 0].set(first)     # nothing left to force
    initial_index = jnp.asarray(initial_index, jnp.int32)
  cache = cache_map(lambda x: _repeat_rows(x, num_decodes, cache_offset)
                    if getattr(x, "ndim", 0) > cache_offset else x,
                    cache, apply_to_index=initial_index is not None)
  seqs = jnp.zeros((batch, num_decodes, length), jnp.int32).at[:, :, 0].set(first[:, None])
  config = beam.SearchConfig(num_beams=num_decodes, alpha=alpha, eos_id=eos_id,
                             max_decode_len=length, max_decode_step=max_decode_step,
                             min_log_prob=min_log_prob)

  def logits_fn(state: beam.BeamState):
    flat = state.live_seqs.reshape(batch * num_decodes, length)
    logits, new_cache = tokens_to_logits(DecodingState(
        cur_index=state.cur_index, sequences=flat,
        cur_token=jax.lax.dynamic_slice_in_dim(flat, state.cur_index, 1, axis=1),
        cache=state.cache))
    if isinstance(state.cache, flax.core.FrozenDict):
      new_cache = flax.core.freeze(new_cache)
    return logits, new_cache

  def gather_cache(c, index):
    return cache_map(lambda x: beam.gather_beams(x, index, cache_offset)
                     if getattr(x, "ndim", 0) > cache_offset else x, c)

  final = beam.search(beam.init_state(seqs, cache, num_decodes), logits_fn, config,
                      gather_cache, jnp.asarray(inputs, jnp.int32), initial_index)
  seqs, scores = beam.result(final)
  seqs = seqs[:, :, 1:]
  if aligned is not None:       # the prompt, then the decoded tokens, left-aligned
    whole = jnp.concatenate([jnp.broadcast_to(aligned[:, None], (batch, num_decodes,
                                                                 aligned.shape[1])), seqs], 2)
    seqs = beam.left_align(whole.reshape(batch * num_decodes, -1)).reshape(whole.shape)
    seqs = seqs[:, :, :length - 1]
  return seqs, scores
