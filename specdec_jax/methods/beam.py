"""Beam search with T5X's semantics (`t5x.decoding.beam_search`, cc342d4), as `sd.Beam`.

    out = sd.decode(model, sd.Beam(num_beams=4, alpha=0.6), inputs, max_new_tokens=T)
    out.tokens [B, T] the best beam, out.beams [B, K, T], out.scores [B, K] (ascending:
    best LAST, T5X's order), out.lengths [B] (the best beam's tokens, EOS included)

What T5X computes, per step, for each row's K live beams (log-probs summed, no penalty):

    candidates  the K x V one-token extensions; keep the top 2K by log-prob
    live        the best K of them that do not end in EOS (so K stay live even if the
                best K all ended)
    finished    the best K of (finished so far, the 2K candidates that end in EOS), by
                score = log-prob / ((5 + length) / 6) ** alpha (the brevity penalty)
    stop        at T steps; when no live beam, divided by the largest possible penalty,
                beats the worst finished score of every row; when no live beam's log-prob
                passes `min_log_prob` (divided alike); after `max_decode_step` steps

The answer is the finished set (tokens after EOS are 0); a row with no finished beam
returns its live beams and their log-probs. Ties fall to the lower candidate index
(`lax.top_k`), as in T5X (its two-stage top-k keeps that order).

Why a loop of its own, not a wiring of the round engine (`engine`): a round commits ONE
sequence per row (propose, verify, accept a prefix, roll its cache back by length), while
a beam step re-ranks K sequences per row and PERMUTES whole cache rows (a live beam may
continue any parent). Its state (K live and K finished sequences, their scores) and its
stopping rule share nothing with a round's. So beam search is one jitted `lax.while_loop`
here (`search`), driven by the same model calls (`Model.start` / `Model.decode`, the
caches of `specdec_jax.cache`) and helpers (`sampling.top_k`, `engine.cache_capacity`)
as the engine, and by the T5X drop-in (`t5x_compat.beam_search`, a T5X callback).

Layout: the K beams of row b are rows b*K .. b*K+K-1 of one flat [B*K, ...] batch (T5X's
order), so the model runs once per step over B*K rows; a cache reorder is a gather WITHIN
each row's block of K ([B, K, ...] -> take along the beam axis), which on a mesh keeps a
row's beams on its "data" shard (the batch axis stays split, the gather is per block).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax import sharding
from specdec_jax.cache import DecoderCache
from specdec_jax.errors import InputError, SamplingError
from specdec_jax.methods.base import Method, check_exact, check_number, setting
from specdec_jax.models.model import Model
from specdec_jax.rounds import engine, requests
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.rounds.stats import OWN_LOOP_STATS, DecodeStats

Array = jax.Array
NEG_INF = -1.0e7     # T5X's NEG_INF: finite, so NEG_INF * 0 stays 0
#: The most beams per row: the model runs over B * K rows with a cache each, and every step
#: ranks K x V candidates per row. T5X's default is 4; n-best lists rarely pass 100.
MAX_BEAMS = 128


def brevity_penalty(alpha: float, length) -> Array:
  """((5 + length) / 6) ** alpha (Wu et al. 2016), T5X's: `length` an int or int array."""
  return jnp.power(((5.0 + length) / 6.0), alpha)


class BeamState(struct.PyTreeNode):
  """Loop state (T5X's field names). B rows, K beams, L = T + 1 (slot 0: the start token).

  Attributes:
    cur_index: [] int32 steps taken; slot cur_index + 1 is written next.
    live_logprobs: f32 [B, K] summed log-probs of the live beams (ascending: best last).
    finished_scores: f32 [B, K] penalized scores of the finished beams (NEG_INF: empty).
    live_seqs, finished_seqs: int32 [B, K, L].
    finished_flags: bool [B, K] which finished slots hold a sequence.
    cache: the model's cache over the flat [B*K] batch (beam k of row b at b*K + k).
  """

  cur_index: Array
  live_logprobs: Array
  finished_scores: Array
  live_seqs: Array
  finished_seqs: Array
  finished_flags: Array
  cache: Any


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """Static settings of one search (hashable).

  Attributes:
    num_beams: K.
    alpha: the brevity penalty's exponent (0: none).
    eos_id: a beam finishes when it emits it (negative: never).
    max_decode_len: T5X's `max_decode_len + 1`: the slots L of a sequence; the loop stops
      at step L - 1 - min(initial_index).
    max_decode_step: stop after this many steps (<= 0: no limit).
    min_log_prob: stop when no live beam's log-prob, over the largest penalty, passes it.
    penalty_len: the length whose penalty bounds every live beam's (T5X: max_decode_len).
  """

  num_beams: int
  alpha: float
  eos_id: int
  max_decode_len: int
  max_decode_step: int = -1
  min_log_prob: float = NEG_INF
  penalty_len: int | None = None


def gather_beams(x: Array, index: Array, axis: int = 0) -> Array:
  """Rows of `x` [..., B*K, ...] (the flat batch at `axis`) reordered within each row's
  block of K: new beam k of row b = old beam index[b, k]. index: int [B, K]."""
  batch, beams = index.shape
  shape = x.shape
  x = x.reshape(shape[:axis] + (batch, beams) + shape[axis + 1:])
  idx = index.reshape((1,) * axis + (batch, beams) + (1,) * (x.ndim - axis - 2))
  return jnp.take_along_axis(x, idx, axis=axis + 1).reshape(shape)


def gather_cache(cache: DecoderCache, index: Array) -> DecoderCache:
  """A model's cache over the flat [B*K] batch with its beams reordered by index [B, K]
  (`gather_beams`): only the self-attention buffers differ between a row's beams."""
  kv = lambda xs: tuple(gather_beams(x, index) for x in xs)
  return cache.replace(self_key=kv(cache.self_key), self_value=kv(cache.self_value))


def _take(x: Array, index: Array) -> Array:
  """x [B, N, ...] -> [B, K, ...] at index [B, K] (along axis 1)."""
  return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def init_state(live_seqs: Array, cache: Any, num_beams: int) -> BeamState:
  """live_seqs int32 [B, K, L] (slot 0 filled); cache over the flat [B*K] batch."""
  batch = live_seqs.shape[0]
  first = jnp.array([0.0] + [NEG_INF] * (num_beams - 1), jnp.float32)
  return BeamState(
      cur_index=jnp.zeros((), jnp.int32),
      live_logprobs=jnp.tile(first, (batch, 1)),
      finished_scores=jnp.full((batch, num_beams), NEG_INF, jnp.float32),
      live_seqs=live_seqs, finished_seqs=jnp.zeros_like(live_seqs),
      finished_flags=jnp.zeros((batch, num_beams), jnp.bool_), cache=cache)


def row_flags(state: BeamState, config: SearchConfig) -> tuple[Array, Array]:
  """(settled, hopeless), bool [B] each: the rows `cond`'s early stops read. Settled: no
  live beam, over the largest penalty, beats the row's worst finished score; hopeless: no
  live beam's log-prob (over it) passes `min_log_prob`."""
  bound = brevity_penalty(config.alpha, config.penalty_len or config.max_decode_len)
  best_live = state.live_logprobs[:, -1:] / bound
  worst_finished = jnp.min(state.finished_scores, axis=1, keepdims=True)
  worst_finished = jnp.where(state.finished_flags, worst_finished, NEG_INF)
  settled = jnp.all(worst_finished > best_live, axis=1)
  hopeless = best_live[:, 0] < config.min_log_prob / bound
  return settled, hopeless


def cond(state: BeamState, config: SearchConfig, start: Array) -> Array:
  """Go on? `start`: [] the least initial index (0 without a prompt in the cache). Stops
  when every row is settled, or every row hopeless after the first step (`row_flags`)."""
  not_at_end = state.cur_index + start < config.max_decode_len - 1
  over_steps = (config.max_decode_step > 0) & jnp.all(state.cur_index >= config.max_decode_step)
  settled, hopeless = row_flags(state, config)
  hopeless = jnp.all(hopeless) & (state.cur_index > 0)
  return not_at_end & ~jnp.all(settled) & ~hopeless & ~over_steps


def step(state: BeamState, logits: Array, cache: Any, config: SearchConfig,
         gather_cache: Callable[[Any, Array], Any], forced: Array | None = None,
         initial_index: Array | None = None) -> BeamState:
  """One beam step from the model's next-token logits f32 [B*K, V] (and its cache after
  the call). forced: int [B, L'] tokens forced at slot cur_index + 1 where non-zero (T5X's
  `inputs`; None: none); initial_index: [B] positions before slot 0 (the penalty's length
  counts them; None: 0). gather_cache(cache, index [B, K]) reorders the cache's beams."""
  batch, k = state.live_logprobs.shape
  log_probs = jax.nn.log_softmax(logits.reshape(batch, k, -1)) + state.live_logprobs[..., None]
  vocab = log_probs.shape[-1]
  top_log_probs, top_indices = sampling_lib.top_k(log_probs.reshape(batch, k * vocab), 2 * k)
  top_ids = top_indices % vocab                                        # [B, 2K]
  top_beams = top_indices // vocab
  if forced is not None:
    # Inside a forced prompt only the best candidate stays, at log-prob 0 (T5X's rule:
    # beams with one prefix would decode the same sequences).
    token = jnp.take(forced, state.cur_index + 1, axis=1, mode="clip")[:, None]   # [B, 1]
    inside = jnp.concatenate([jnp.zeros((batch, 1), jnp.float32),
                              jnp.full((batch, 2 * k - 1), NEG_INF, jnp.float32)], axis=1)
    top_log_probs = jnp.where(token == 0, top_log_probs, inside)
    top_ids = jnp.where(token == 0, top_ids, token)
  slot = state.cur_index + 1
  top_seqs = _take(state.live_seqs, top_beams)                          # [B, 2K, L]
  top_seqs = jax.lax.dynamic_update_slice(top_seqs, top_ids[:, :, None], (0, 0, slot))
  ended = top_ids == config.eos_id                                      # [B, 2K]

  # Live: the best K that did not end (ascending, best last).
  live_log_probs = top_log_probs + ended * NEG_INF
  keep = jnp.flip(jax.lax.top_k(live_log_probs, k)[1], axis=1)           # [B, K]
  parents = jnp.take_along_axis(top_beams, keep, axis=1)
  cache = gather_cache(cache, parents)

  # Finished: the best K of the old finished and the 2K that ended, by penalized score.
  offset = 0 if initial_index is None else initial_index[:, None]
  lengths = jnp.zeros((batch, 2 * k), jnp.int32) + offset + slot
  scores = top_log_probs / brevity_penalty(config.alpha, lengths)
  scores += (~ended) * NEG_INF
  all_scores = jnp.concatenate([state.finished_scores, scores], axis=1)    # [B, 3K]
  best = jnp.flip(jax.lax.top_k(all_scores, k)[1], axis=1)
  return BeamState(
      cur_index=slot,
      live_logprobs=jnp.take_along_axis(live_log_probs, keep, axis=1),
      finished_scores=jnp.take_along_axis(all_scores, best, axis=1),
      live_seqs=_take(top_seqs, keep),
      finished_seqs=_take(jnp.concatenate([state.finished_seqs, top_seqs], axis=1), best),
      finished_flags=jnp.take_along_axis(
          jnp.concatenate([state.finished_flags, ended], axis=1), best, axis=1),
      cache=cache)


def result(state: BeamState) -> tuple[Array, Array]:
  """(sequences int32 [B, K, L], scores f32 [B, K]) ascending: the finished beams, or a
  row's live beams and log-probs when none of its beams finished."""
  any_finished = jnp.any(state.finished_flags, axis=1)
  seqs = jnp.where(any_finished[:, None, None], state.finished_seqs, state.live_seqs)
  scores = jnp.where(any_finished[:, None], state.finished_scores, state.live_logprobs)
  return seqs, scores


def search(state: BeamState, logits_fn: Callable[[BeamState], tuple[Array, Any]],
           config: SearchConfig, gather_cache: Callable[[Any, Array], Any],
           forced: Array | None = None, initial_index: Array | None = None,
           pin: Callable[[BeamState], BeamState] = lambda s: s,
           start: Array | None = None) -> BeamState:
  """`step` until `cond` fails, as one `lax.while_loop`. logits_fn(state) -> (logits f32
  [B*K, V], cache): the model's call on each beam's token at slot cur_index. pin: a
  layout constraint on the loop's state (a mesh's). start: [] positions counted before
  the first step by the length limit (None: T5X's min(initial_index), else 0)."""
  if start is None:
    start = jnp.zeros((), jnp.int32) if initial_index is None else jnp.min(initial_index)

  def body(s: BeamState) -> BeamState:
    logits, cache = logits_fn(s)
    return pin(step(s, logits, cache, config, gather_cache, forced, initial_index))

  return jax.lax.while_loop(functools.partial(cond, config=config, start=start), body,
                            pin(state))


def right_align(prompts: Array) -> Array:
  """int [N, L] prompts moved right so each row's last non-zero token is at L - 1."""
  width = prompts.shape[1]
  pos = jnp.arange(width)
  last = jnp.argmax((prompts != 0) * pos[None], axis=1)
  src = pos[None] - (width - 1 - last)[:, None]
  return jnp.where(src >= 0, jnp.take_along_axis(prompts, jnp.maximum(src, 0), axis=1), 0)


def left_align(seqs: Array) -> Array:
  """int [N, L] rows moved left so each row's first non-zero token is at 0."""
  width = seqs.shape[1]
  pos = jnp.arange(width)
  first = jnp.argmin(jnp.where(seqs != 0, pos[None], width), axis=1)
  src = pos[None] + first[:, None]
  return jnp.where(src < width, jnp.take_along_axis(seqs, jnp.minimum(src, width - 1), 1), 0)


# ----------------------------------------------------------------------------- sd.Beam


@struct.dataclass
class BeamOutput(DecodeOutput):
  """`DecodeOutput` (tokens: the best beam, lengths, counters) plus every beam.

  Attributes:
    beams: int32 [B, K, T] every returned beam, 0 after EOS, ascending by score.
    scores: f32 [B, K] their scores (T5X's: summed log-probs over the brevity penalty;
      a row with no finished beam: its live beams' log-probs). Best LAST.
  """

  beams: Array | None = None
  scores: Array | None = None


@struct.dataclass
class Beam(Method):
  """Beam search, T5X's `beam_search` (cc342d4): K beams, brevity penalty, early stop.

  Attributes:
    num_beams: K, beams per row (>= 1).
    alpha: the brevity penalty's exponent: scores are log p / ((5 + length) / 6) ** alpha
      (0: plain log-probability; T5X's default 0.6).
    min_log_prob: stop once no live beam's log-prob (over the largest penalty) passes it.
    exact: every model call of `engine.EXACT_WIDTH` tokens (the call shape of the other
      methods' exact mode) so its logits are bitwise theirs; None: False.

  `out.beams` [B, K, T] and `out.scores` [B, K] in T5X's order (best last); `out.tokens`
  the best beam. A decoder-only target's penalty counts its prompt (T5X's DecoderOnlyModel).

  Example::

      >>> import specdec_jax as sd, numpy as np
      >>> model = sd.load("config:t5_1_1_tiny")
      >>> out = sd.decode(model, sd.Beam(num_beams=2), np.array([[5, 6, 7, 1]]),
      ...                 max_new_tokens=4)
      >>> out.beams.shape, out.scores.shape
      ((1, 2, 4), (1, 2))
      >>> sd.Beam(num_beams=0)
      Traceback (most recent call last):
      ...
      specdec_jax.errors.InputError: num_beams must be an integer >= 1, got 0
  """

  name: ClassVar[str] = "beam"
  summary: ClassVar[str] = "beam search, T5X's beam_search (greedy only)"
  greedy_only: ClassVar[bool] = True
  statistics: ClassVar[tuple[str, ...]] = OWN_LOOP_STATS
  shorthand: ClassVar[tuple[str, ...]] = ("num_beams", "alpha")

  num_beams: int = setting(4, short="K")
  alpha: float = setting(0.6)
  min_log_prob: float = setting(NEG_INF)
  exact: bool | None = setting(None)

  def baseline(self) -> Method:
    """Plain beam search of the same beams, penalty and call shape (`exact`): itself."""
    return Beam(num_beams=self.num_beams, alpha=self.alpha, min_log_prob=self.min_log_prob,
                exact=self.exact)

  def __post_init__(self):
    requests.check_positive_int(self.num_beams, "num_beams", MAX_BEAMS,
                              "beams per row: the model runs over batch x num_beams rows")
    if check_number(self.alpha, "alpha") < 0:
      raise InputError(f"alpha (the brevity penalty's exponent) must be >= 0, got {self.alpha!r}")
    check_number(self.min_log_prob, "min_log_prob")
    check_exact(self.exact)

  def program(self, target, inputs, max_new_tokens, sampling, rng, eos_id,
              prompt_lengths):
    return program(target, inputs, **self._search(max_new_tokens, sampling, eos_id),
                   prompt_lengths=prompt_lengths)

  def run(self, target, inputs, max_new_tokens, sampling, rng, eos_id,
          prompt_lengths):
    return run(target, inputs, **self._search(max_new_tokens, sampling, eos_id),
               prompt_lengths=prompt_lengths)

  def _search(self, max_new_tokens, sampling, eos_id) -> dict:
    """The static settings of `run` / `program`: {config, exact}."""
    return {"config": search_config(self, max_new_tokens, sampling, eos_id),
            "exact": bool(self.exact)}


def search_config(method: Any, max_new_tokens: int, sampling: sampling_lib.SamplingSettings,
                  eos_id: int) -> SearchConfig:
  """T5X's search settings of one request for a beam method value (`sd.Beam`,
  `experimental.SpeculativeBeam`: its num_beams, alpha and min_log_prob); sampling is refused."""
  if not sampling.is_greedy:
    raise SamplingError(f"beam search is deterministic: drop sampling "
                        f"(sd.{type(method).__name__} takes no temperature, top-k or top-p), "
                        f"got {sampling!r}")
  return SearchConfig(num_beams=method.num_beams, alpha=float(method.alpha), eos_id=eos_id,
                      max_decode_len=max_new_tokens + 1,
                      min_log_prob=float(method.min_log_prob))


def program(target: Model, inputs: Array, *, config: SearchConfig, exact: bool = False,
            prompt_lengths: Array | None = None) -> engine.Program:
  """The call `run` makes: the jitted search and its arguments (`engine.Program`)."""
  return engine.Program(_run, (target, inputs, prompt_lengths),
                        {"config": config, "exact": exact,
                         "layout": sharding.decode_layout(target, inputs)})


def run(target: Model, inputs: Array, *, config: SearchConfig, exact: bool = False,
        prompt_lengths: Array | None = None) -> BeamOutput:
  """Beam search of `target` over `inputs` [B, Le] (a decoder-only target: prompts
  [B, P] with `prompt_lengths` [B]) as ONE jitted program, on the model as given (packed
  ones, `sd.pack` / `sd.load`, on their backend's kernels; others on XLA)."""
  return program(target, inputs, config=config, exact=exact,
                 prompt_lengths=prompt_lengths)()


@functools.partial(jax.jit, static_argnames=("config", "exact", "layout"))
def _run(target: Model, inputs: Array, prompt_lengths: Array | None, *,
         config: SearchConfig, exact: bool, layout=None) -> BeamOutput:
  k, steps = config.num_beams, config.max_decode_len - 1
  batch = inputs.shape[0]
  width = engine.EXACT_WIDTH if exact and not target.width_invariant_decode else 1
  rounds = engine.RoundConfig(max_new_tokens=steps, max_proposals=0,
                              call_width=engine.EXACT_WIDTH if exact else 0)
  initial_index = None
  if target.is_decoder_only:
    capacity = engine.cache_capacity(target, rounds, inputs.shape[1])
    cache = target.start(inputs, capacity, prompt_lengths).anchored()
    # The penalty counts the prompt, as T5X's decoder-only beam search (initial_index).
    initial_index = prompt_lengths
    config = dataclasses.replace(config, penalty_len=inputs.shape[1] + steps + 1)
  else:
    cache = target.start(inputs, rounds.capacity)
  first = target.first_tokens(inputs, prompt_lengths)
  cache = jax.tree_util.tree_map(lambda x: jnp.repeat(x, k, axis=0), cache)   # [B*K, ...]
  seqs = jnp.zeros((batch, k, steps + 1), jnp.int32).at[:, :, 0].set(first[:, None])

  def logits_fn(s: BeamState):
    tokens = jax.lax.dynamic_slice_in_dim(s.live_seqs, s.cur_index, 1, axis=2)
    tokens = jnp.pad(tokens.reshape(batch * k, 1), ((0, 0), (0, width - 1)))
    logits, cache = target.decode(tokens, s.cache)
    return logits[:, 0], cache.with_length(s.cache.length + 1)

  def pin(s: BeamState) -> BeamState:
    if layout is None:
      return s
    p = layout.with_logical_constraint
    seq = lambda x: p(x, ("batch", None, "length"))
    row = lambda x: p(x, ("batch", None))
    return s.replace(live_logprobs=row(s.live_logprobs), finished_scores=row(s.finished_scores),
                     live_seqs=seq(s.live_seqs), finished_seqs=seq(s.finished_seqs),
                     finished_flags=row(s.finished_flags),
                     cache=sharding.constrain_cache(s.cache, layout, "heads"))

  final = search(init_state(seqs, cache, k), logits_fn, config, gather_cache,
                 initial_index=initial_index, pin=pin, start=jnp.zeros((), jnp.int32))
  beams, scores = result(final)
  beams = beams[:, :, 1:]                                              # [B, K, T]
  is_eos = beams[:, -1] == config.eos_id
  lengths = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1,
                      final.cur_index).astype(jnp.int32)
  counters = DecodeStats.zeros(batch, 0)
  counters = counters.replace(rounds=final.cur_index, emitted=lengths,
                              target_calls=jnp.full((batch,), final.cur_index, jnp.int32))
  return BeamOutput(tokens=beams[:, -1], lengths=lengths, counters=counters,
                    info=(("method", Beam.name), ("lossy", False), ("num_beams", k),
                          ("beam_alpha", config.alpha), ("exact", exact)),
                    beams=beams, scores=scores)
