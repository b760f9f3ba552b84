"""The round engine: every decoding method here is one wiring of the same four phases.

    propose   proposer.propose(state, ctx, key)      up to G tokens per row   (Proposal)
    verify    config.verify(target, state, ...)       ONE cached (G+1)-token call (Verified)
    accept    config.accept(logits, proposal, ...)    a rule passed as a value  (Acceptance)
    commit    commit(...)                             emit, EOS, lengths, cache rollback, stats

A round for a row at n emitted tokens (caches of length n, see `buffer`):

    x_1..x_c  = proposals (c = count <= G)
    logits    = target([seq[n], x_1 .. x_G])           positions n .. n+G written in its cache
    m, t      = rule(logits, proposal)                 keep x_1..x_m, then the target's t
    emit        x_1 .. x_m, t                          (cut after EOS and at max_new_tokens)
    cache       length n + m + 1: the stale positions beyond are never read

Pure pieces, to call from research code (vmap them, or drive your own loop):

    state = init_state(target, proposer, inputs, config, rng)
    while cond(state): state = round_step(target, proposer, state, config)
    out = finish(state, config)

`run` is exactly that loop under `jax.jit` (one program per shapes and config). To
change one phase, pass another value: `dataclasses.replace(config, accept=MyRule())`,
another `verify`, or another proposer; the loop is never copied.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax import sharding
from specdec_jax.cache import DecoderCache
from specdec_jax.errors import InputError
from specdec_jax.kernels import backends
from specdec_jax.models.model import Model
from specdec_jax.rounds import acceptance, buffer
from specdec_jax.rounds.acceptance import SpeculativeSampling
from specdec_jax.rounds.phases import (
  Acceptance,
  AcceptRule,
  Proposal,
  Proposer,
  RoundContext,
  RoundOutcome,
  Verified,
)
from specdec_jax.rounds.stats import DecodeStats

Array = jax.Array


# ----------------------------------------------------------------------------- state


class RoundState(struct.PyTreeNode):
  """Loop state; every field has a fixed shape for the whole loop.

  Attributes:
    seq: int32 [B, T + 1] start token, then emitted tokens (see `buffer`).
    n: int32 [B] tokens emitted per row.
    done: bool [B] rows that emitted EOS or T tokens.
    cache: the target's `DecoderCache`, length n (every emitted token but the last).
    proposer: the proposer's own state (a drafter's cache, heads' hidden state, ...).
    rng: PRNG key, split once per round.
    stats: `DecodeStats` counters, per row.
  """

  seq: Array
  n: Array
  done: Array
  cache: DecoderCache
  proposer: Any
  rng: Array
  stats: DecodeStats


def verify(target: Model, state: RoundState, proposal: Proposal,
           call_width: int = 0) -> Verified:
  """ONE cached call of the target over [last emitted token, x_1 .. x_G], for every row.

  call_width > 0 (exact mode): the call carries `call_width` tokens, the proposals padded with
  0 (written beyond the row's valid length: never read), so that every target call
  of a run has ONE shape and a position's numerics cannot depend on how many tokens
  its call carried. Not padded where the target's decode is width-invariant
  (`Model.width_invariant_decode`: cpu or gpu kernels): there a position's logits already
  do not depend on it, and the shared cache capacity (`RoundConfig.capacity`) keeps
  the attention's shapes the same. The final decoder states come along (prediction
  heads draft from them; XLA drops them when nothing reads them).
  """
  cache = state.cache if proposal.target_cache is None else proposal.target_cache
  tokens = jnp.concatenate([buffer.last_tokens(state.seq, state.n, 1), proposal.tokens], 1)
  real = tokens.shape[1]
  if call_width and not target.width_invariant_decode:
    tokens = jnp.pad(tokens, ((0, 0), (0, call_width - real)))
  logits, hidden, cache = target.decode_with_hidden(tokens, cache.with_length(state.n))
  return Verified(logits=logits[:, :real], hidden=hidden[:, :real], cache=cache,
                  ran=jnp.ones((), jnp.bool_))


#: Tokens per target call in exact mode: gamma + 1 (+ tree drafts) must fit.
EXACT_WIDTH = 16


def call_width(exact: bool | None, sampling, needed: int) -> int:
  """`RoundConfig.call_width` for a run whose rounds need `needed` tokens per call.

  exact None: exact for greedy decoding when the rounds fit in `EXACT_WIDTH`.
  """
  if exact is None:
    exact = sampling_lib.as_sampling(sampling).is_greedy and needed <= EXACT_WIDTH
  return EXACT_WIDTH if exact else 0


@dataclasses.dataclass(frozen=True)
class RoundConfig:
  """Static settings of a run (hashable: a jit static argument).

  Attributes:
    max_new_tokens: T, tokens per row at most.
    max_proposals: G, proposal slots per round (gamma; 0 for the baseline).
    sampling: the transform applied to target (and proposer) logits.
    eos_id: a row stops after emitting it (negative: never).
    accept: the acceptance rule (a frozen dataclass, see `acceptance`).
    verify: the verify phase, `verify(target, state, proposal, call_width) -> Verified`.
    info: static facts reported with the statistics, as (key, value) pairs.
    extra_capacity: cache slots beyond T + G + 1 a verify phase needs (a tree of drafts).
    call_width: 0, or W for EXACT mode: every target call carries W tokens (padded) and
      every method's cache has capacity T + W, so the target computes each position with
      the same program whatever the method, gamma or round: greedy output is then
      bitwise the baseline's on every backend and dtype (`EXACT_WIDTH`). A target with
      `width_invariant_decode` keeps the capacity but its calls are not padded.
  """

  max_new_tokens: int
  max_proposals: int
  sampling: sampling_lib.SamplingSettings = sampling_lib.Greedy()
  eos_id: int = 1
  accept: AcceptRule = SpeculativeSampling()
  verify: Callable[[Model, RoundState, Proposal, int], Verified] = verify
  info: tuple[tuple[str, Any], ...] = ()
  extra_capacity: int = 0
  call_width: int = 0

  def __post_init__(self):
    if self.max_proposals < 0:
      raise InputError(f"max_proposals must be >= 0, got {self.max_proposals}")
    # research code builds configs by hand (dataclasses.replace(config, accept=...)): the
    # rule is jit's static argument, so refuse one it cannot hash before any tracing
    acceptance.check_rule(self.accept)
    needed = self.max_proposals + 1 + self.extra_capacity
    if self.call_width and self.call_width < needed:
      raise InputError(f"exact mode verifies at most {self.call_width - 1} proposals per call; "
                       f"this run needs {needed - 1} (use exact=False)")

  @property
  def capacity(self) -> int:
    """Cache positions: T, plus slack for the proposals a last round writes."""
    if self.call_width:
      return self.max_new_tokens + self.call_width
    if not self.max_proposals:
      return self.max_new_tokens
    return self.max_new_tokens + self.max_proposals + 1 + self.extra_capacity


def init_state(target: Model, proposer: Proposer, inputs: Array, config: RoundConfig,
               rng: Array, proposer_inputs: Array | None = None,
               prompt_lengths: Array | None = None) -> RoundState:
  """Start a request: the target's encoder (T5) or prompt prefill (decoder-only), the
  caches, and the proposer's first state.

  A decoder-only target's prompt [B, P] (right-padded, `prompt_lengths` [B]) is prefilled
  into a cache of `cache_capacity(...)` slots, anchored after each row's prompt but its
  last token (`DecoderCache.anchored`): from there on its length counts the tokens after
  the prompt, as a T5 decoder's counts them after its start token, so every phase below
  is the same for both. The last prompt token is `seq[:, 0]`, where T5 has its start token.
  """
  batch = inputs.shape[0]
  proposer_start = inputs if proposer_inputs is None else proposer_inputs
  first, cache, capacity = target.begin(inputs, config.capacity, prompt_lengths)
  # a proposer continuing a decoder-only target's prompt is told where each row's ends
  lengths = {} if prompt_lengths is None else {"lengths": prompt_lengths}
  return RoundState(
      seq=buffer.init_sequence(batch, config.max_new_tokens, first),
      n=jnp.zeros((batch,), jnp.int32), done=jnp.zeros((batch,), jnp.bool_),
      cache=cache, proposer=proposer.init(proposer_start, capacity, **lengths), rng=rng,
      stats=DecodeStats.zeros(batch, config.max_proposals))


def cache_capacity(model: Model, config: RoundConfig, prompt_length: int) -> int:
  """Cache slots of a decoder-only model decoding after a prompt buffer of `prompt_length`:
  the prompt, then `config.capacity` (T and the rounds' slack).

  A learned position table caps it at `max_positions`: slots past the cap only ever
  receive tokens beyond the T-th (a last round's surplus drafts, exact mode's padding),
  whose writes are dropped and whose logits are never used; every token up to the T-th
  fits when prompt_length + T <= max_positions (`requests.check_prompt` checks it). Every
  method's target cache has the same capacity for the same (prompt, T, call width).
  """
  return model.decode_capacity(config.capacity, prompt_length)


# ----------------------------------------------------------------------------- one round


def context(state: RoundState, config: RoundConfig) -> RoundContext:
  limit = jnp.where(state.done, 0, config.max_proposals).astype(jnp.int32)
  return RoundContext(seq=state.seq, n=state.n, limit=limit, cache=state.cache,
                      max_proposals=config.max_proposals, sampling=config.sampling,
                      eos_id=config.eos_id, max_new_tokens=config.max_new_tokens)


def round_keys(rng: Array) -> tuple[Array, Array, Array]:
  """The round's keys from the state's: (next round's, propose, accept). A verify phase
  that applies the acceptance rule (`blockwise.ParallelVerify`) uses the same accept key."""
  rng, k_propose, k_accept = jax.random.split(rng, 3)
  return rng, k_propose, k_accept


def round_step(target: Model, proposer: Proposer, state: RoundState,
               config: RoundConfig) -> RoundState:
  """propose -> verify -> accept -> commit, for every live row at once."""
  rng, k_propose, k_accept = round_keys(state.rng)
  proposal = proposer.propose(state.proposer, context(state, config), k_propose)
  verified = config.verify(target, state, proposal, config.call_width)
  if verified.proposal is not None:     # the verify phase chose one of several drafts
    proposal = verified.proposal
  acceptance = config.accept(verified.logits, proposal, config.sampling, k_accept)
  return commit(proposer, state.replace(rng=rng), proposal, verified, acceptance, config)


def commit(proposer: Proposer, state: RoundState, proposal: Proposal, verified: Verified,
           acceptance: Acceptance, config: RoundConfig) -> RoundState:
  """Emit x_1..x_m and the target's token, roll the cache back by length, count."""
  live = ~state.done
  m = jnp.where(proposal.final, proposal.count, acceptance.m)
  g = config.max_proposals
  candidates = jnp.where(jnp.arange(g + 1)[None] < m[:, None],
                         jnp.pad(proposal.tokens, ((0, 0), (0, 1))),
                         acceptance.next_token[:, None])                    # [B, G + 1]
  # A final proposal is committed as it is: the target adds no token after it.
  seq, n, done, emitted = buffer.emit(state.seq, state.n, state.done, candidates,
                                      m + (~proposal.final), config.eos_id)
  stats = count_round(state.stats, live, proposal, verified, acceptance, m, candidates,
                      emitted, config.sampling, config.eos_id)
  outcome = RoundOutcome(live=live, m=m, acceptance=acceptance, verified=verified)
  return RoundState(seq=seq, n=n, done=done, cache=verified.cache.with_length(n),
                    proposer=proposer.update(proposal.state, outcome), rng=state.rng,
                    stats=stats)


def count_round(stats: DecodeStats, live: Array, proposal: Proposal, verified: Verified,
                acceptance: Acceptance, m: Array, candidates: Array, emitted: Array,
                sampling: sampling_lib.SamplingSettings, eos_id: int = -1) -> DecodeStats:
  """Add one round to the counters (meanings: `stats.DecodeStats`).

  A row's sentence ends at its first EOS: drafts the rule accepted after an accepted EOS
  draft continue a finished sentence (`buffer.emit` drops them), so they are neither
  accepted nor scored. (Drafts cut only by max_new_tokens were verified as usual and count.)
  """
  g = proposal.tokens.shape[1]
  verified_rows = live & ~proposal.final & verified.ran
  eos = (candidates == eos_id) & (jnp.arange(g + 1)[None] < (m + 1)[:, None])   # [B, G+1]
  sentence = jnp.where(jnp.any(eos, axis=1), jnp.argmax(eos, axis=1) + 1, g + 1)  # [B]
  scored = acceptance.scored & verified_rows[:, None] & (jnp.arange(g)[None]
                                                         < sentence[:, None])
  drafter_tokens = jnp.minimum(m, emitted)
  m = jnp.minimum(m, sentence)
  repeats = ((proposal.tokens[:, 1:] == proposal.tokens[:, :-1])
             & (jnp.arange(1, g)[None] < proposal.count[:, None]))          # [B, G-1]
  drafting = (live & (proposal.count > 0)).astype(jnp.int32)
  token_log_p = sampling_lib.token_log_probs(verified.logits, candidates, sampling)  # [B, G+1]
  kept = jnp.arange(g + 1)[None] < emitted[:, None]
  return stats.add(
      rounds=verified.ran.astype(jnp.int32),
      target_calls=verified_rows.astype(jnp.int32),
      drafter_calls=proposal.calls * live,
      drafted=proposal.count * live,
      accepted=m * live,
      rejections=(verified_rows & (acceptance.m < proposal.count)
                  & (acceptance.m < sentence)).astype(jnp.int32),
      fallbacks=(proposal.fallback & live).astype(jnp.int32),
      per_position_accepted=((jnp.arange(g)[None] < m[:, None])
                             & live[:, None]).astype(jnp.int32),
      beta_sum=jnp.sum(jnp.where(scored, acceptance.beta, 0.0), axis=1),
      beta_count=jnp.sum(scored, axis=1).astype(jnp.int32),
      drafter_tokens=drafter_tokens,
      log_prob=jnp.sum(jnp.where(kept, token_log_p, 0.0), axis=1),
      draft_pairs=jnp.maximum(proposal.count - 1, 0) * live,
      repeated_drafts=jnp.sum(repeats, axis=1) * live,
      max_run=longest_run(repeats) * drafting,
      drafting_rounds=drafting)


def longest_run(repeats: Array) -> Array:
  """bool [B, G-1] "proposal i+1 equals proposal i" -> int32 [B] longest run of equal
  proposals (1 for none repeated). E.g. proposals [5, 5, 5, 2, 2] -> 3."""
  run = best = jnp.ones(repeats.shape[:1], jnp.int32)
  for i in range(repeats.shape[1]):        # G is small and static
    run = jnp.where(repeats[:, i], run + 1, 1)
    best = jnp.maximum(best, run)
  return best


def cond(state: RoundState) -> Array:
  return ~jnp.all(state.done)


def finish(state: RoundState, config: RoundConfig) -> buffer.DecodeOutput:
  return buffer.DecodeOutput(tokens=state.seq[:, 1:], lengths=state.n,
                             counters=state.stats.replace(emitted=state.n),
                             info=config.info + (("exact", bool(config.call_width)),))


# ----------------------------------------------------------------------------- driver


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
  """One call of a jitted function: `program()` runs it; `program.lower(platforms)` lowers
  the same call (the same function, the same arguments) for `platforms`, compiling
  nothing (`sd.lower`).

  Attributes:
    fn: the `jax.jit`-wrapped function.
    args, kwargs: its arguments.
  """

  fn: Any
  args: tuple
  kwargs: dict

  def __call__(self):
    return self.fn(*self.args, **self.kwargs)

  def lower(self, platforms: tuple[str, ...]) -> jax.stages.Lowered:
    """The call traced and lowered for `platforms` ("cpu", "cuda", "rocm", "tpu"); the
    kernels are traced as they run there (`backends.lowering`)."""
    with backends.lowering(platforms):
      traced = self.fn.trace(*self.args, **self.kwargs)
      return traced.lower(lowering_platforms=tuple(platforms))


def program(target: Model, proposer: Proposer, inputs: Array,
            proposer_inputs: Array | None, rng: Array, *, config: RoundConfig,
            prompt_lengths: Array | None = None) -> Program:
  """The call `run` makes: the jitted decode loop and its arguments (`Program`)."""
  if target.is_decoder_only and prompt_lengths is None:
    raise InputError("a decoder-only target needs prompt_lengths (requests.check_prompt)")
  return Program(_run, (target, proposer, inputs, proposer_inputs, rng),
                 {"config": config, "prompt_lengths": prompt_lengths,
                  "layout": sharding.decode_layout(target, inputs)})


def run(target: Model, proposer: Proposer, inputs: Array, proposer_inputs: Array | None,
        rng: Array, *, config: RoundConfig,
        prompt_lengths: Array | None = None) -> buffer.DecodeOutput:
  """The whole decode as ONE jitted `lax.while_loop` of `round_step`, on the models as
  given: packed ones (`sd.pack`, `sd.load`) on their backend's kernels, others on XLA.

  A decoder-only target takes its prompts [B, P] as `inputs`, with their lengths
  `prompt_lengths` [B] (required: `requests.check_prompt` gives them).
  """
  return program(target, proposer, inputs, proposer_inputs, rng, config=config,
                 prompt_lengths=prompt_lengths)()


@functools.partial(jax.jit, static_argnames=("config", "layout"))
def _run(target: Model, proposer: Proposer, inputs: Array, proposer_inputs: Array | None,
         rng: Array, *, config: RoundConfig, prompt_lengths: Array | None = None,
         layout=None) -> buffer.DecodeOutput:
  state = init_state(target, proposer, inputs, config, rng, proposer_inputs,
                     prompt_lengths)
  if layout is not None:     # on a mesh: caches by batch and heads (`sd.sharding`)
    state = sharding.constrain_state(state, layout)
  state = jax.lax.while_loop(
      cond, functools.partial(round_step, target, proposer, config=config), state)
  return finish(state, config)


# `run` as a jitted function: `lower` (AOT, HLO) is `_run`'s (an attribute set on a plain
# function, which mypy cannot type: hence the ignore).
run.lower = lambda target, proposer, *args, **kwargs: _run.lower(  # type: ignore[attr-defined]
    target, proposer, *args, **kwargs,
    layout=sharding.decode_layout(target, args[0] if args else kwargs.get("inputs")))
