"""From a token-level drafter to a proposer: the autoregressive drafting loop of a round.

A token-level drafter (`protocol.Drafter`) is a pytree with a `vocab_size` and three pure
methods:

    state = drafter.init(inputs [B, Le], capacity)     # a decoder-only target's
                                                                # prompt: lengths=[B] too
    logits, state = drafter.first(state, seq [B, T+1], n [B])   # logits after seq[:, :n+1]
    logits, state = drafter.next(state, token [B])               # append a draft, logits after it

`first` starts a round from the emitted prefix (so any rollback of the previous
round is implicit), `next` extends the round's own drafts.

`DraftLoop(drafter)` drafts up to `ctx.limit[b]` tokens per row, one batched drafter
call per step, and stops early per row on `stop` (BiLD's fallback: the drafter is
unsure, so its proposal is discarded) and, with `final_at_eos`, on EOS or a full
buffer (BiLD's small model ends the sentence itself). The loop runs while any row
is still drafting; the last draft needs no further drafter call.

Worked example (limit 3 for both rows; row 1 unsure at its 2nd step)::

    step 1   first()  row 0 drafts a    row 1 drafts d
    step 2   next()   row 0 drafts b    row 1 unsure: stops (fallback), count 1
    step 3   next()   row 0 drafts c    -> count [3, 1], calls [3, 2]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import protocol
from specdec_jax.rounds.phases import Proposal, RoundContext, RoundOutcome

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Unsure:
  """BiLD's fallback test: the drafter is unsure when max_x softmax(logits)(x) <= threshold."""

  fallback_threshold: float

  def __call__(self, logits: Array) -> Array:
    """logits [B, V] -> bool [B]."""
    return jnp.max(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), axis=-1) \
        <= self.fallback_threshold


@struct.dataclass
class DraftState:
  """The state of `DraftLoop`'s drafting loop within one round (a `lax.while_loop` carry).

  Attributes:
    step: int32 [] drafting steps taken (the next draft's slot).
    logits: [B, V] the drafter's next-token logits.
    drafter: the drafter's own state (its cache; the target's, for an early exit).
    active: bool [B] rows still drafting.
    tokens: int32 [B, G] drafts so far (0 in unused slots).
    count: int32 [B] drafts per row.
    calls: int32 [B] drafter calls per row.
    fallback: bool [B] rows that stopped because the drafter was unsure.
    final: bool [B] rows whose drafts are committed unverified (EOS or a full buffer).
    q: float32 [B, G, V] the drafter's distributions (exact sampling), or None.
  """

  step: Array
  logits: Array
  drafter: Any
  active: Array
  tokens: Array
  count: Array
  calls: Array
  fallback: Array
  final: Array
  q: Array | None


@struct.dataclass
class DraftLoop:
  """A proposer that runs a token-level `drafter` autoregressively (see module doc).

  Attributes:
    drafter: the token-level drafter (a pytree: a model drafter carries its params).
      One with `shares_target_cache = True` (an early exit of the target) drafts in
      the target's own cache: its state is `ctx.cache`, returned as the proposal's
      `target_cache` for the verify call to complete.
    stop: optional static predicate logits [B, V] -> bool [B]: stop drafting, discard.
    final_at_eos: a row whose draft is EOS, or whose drafts fill the buffer, commits
      them unverified (BiLD; speculative decoding verifies everything).
    stop_together: when one row stops on `stop`, every row stops after this step (its
      drafts so far are verified early) instead of waiting for the others.
    keep_q: keep the drafter's distributions (the exact sampling rule needs them).
  """

  drafter: Any
  stop: Callable[[Array], Array] | None = struct.field(pytree_node=False, default=None)
  final_at_eos: bool = struct.field(pytree_node=False, default=False)
  stop_together: bool = struct.field(pytree_node=False, default=False)
  keep_q: bool = struct.field(pytree_node=False, default=True)

  @property
  def vocab_size(self) -> int:
    return self.drafter.vocab_size

  @property
  def kind(self) -> str:
    return protocol.kind(self.drafter)

  def init(self, inputs: Array, capacity: int, lengths: Array | None = None) -> Any:
    if lengths is None:       # a T5 target (token-level drafters written for T5 take 2 args)
      return self.drafter.init(inputs, capacity)
    return self.drafter.init(inputs, capacity, lengths=lengths)

  def update(self, state: Any, outcome: RoundOutcome) -> Any:
    return state

  def propose(self, state: Any, ctx: RoundContext, key: Array) -> Proposal:
    g, sampling = ctx.max_proposals, ctx.sampling
    shared = getattr(self.drafter, "shares_target_cache", False)
    first = self.drafter.first(ctx.cache if shared else state, ctx.seq, ctx.n)
    protocol.check_step(self.drafter, "first", first, ctx.n.shape[0],
                        state_like=None if shared else state, state_of="init")
    logits, drafter_state = first
    batch, vocab = logits.shape
    keys = jax.random.split(key, g)
    active = ctx.limit > 0
    no = jnp.zeros((batch,), jnp.bool_)
    start = DraftState(step=jnp.zeros((), jnp.int32), logits=logits, drafter=drafter_state,
                       active=active, tokens=jnp.zeros((batch, g), jnp.int32),
                       count=jnp.zeros((batch,), jnp.int32), calls=active.astype(jnp.int32),
                       fallback=no, final=no,
                       q=(None if sampling.is_greedy or not self.keep_q
                          else jnp.zeros((batch, g, vocab), jnp.float32)))

    def draft_one(d: DraftState) -> DraftState:
      active, fallback = d.active, d.fallback
      unsure = jnp.zeros_like(active)
      if self.stop is not None:
        unsure = active & self.stop(d.logits)
        fallback, active = fallback | unsure, active & ~unsure
      x = sampling_lib.draw(keys[d.step], d.logits, sampling)
      tokens = d.tokens.at[:, d.step].set(jnp.where(active, x, 0))
      q = d.q
      if q is not None:
        q = q.at[:, d.step].set(sampling_lib.probs(d.logits, sampling))
      count = d.count + active
      final = d.final
      if self.final_at_eos:
        ends = active & ((x == ctx.eos_id) | (ctx.n + count >= ctx.max_new_tokens))
        final, active = final | ends, active & ~ends
      active = active & (count < ctx.limit)
      if self.stop_together:
        active = active & ~jnp.any(unsure)
      def step():
        out = self.drafter.next(d.drafter, x)
        protocol.check_step(self.drafter, "next", out, batch, d.logits, d.drafter, "first")
        return out

      # The last draft of every row needs no drafter call after it.
      logits, drafter_state = jax.lax.cond(jnp.any(active), step,
                                           lambda: (d.logits, d.drafter))
      return DraftState(step=d.step + 1, logits=logits, drafter=drafter_state, active=active,
                        tokens=tokens, count=count, calls=d.calls + active,
                        fallback=fallback, final=final, q=q)

    d = jax.lax.while_loop(lambda d: (d.step < g) & jnp.any(d.active), draft_one, start)
    return Proposal(tokens=d.tokens, count=d.count, q=d.q, calls=d.calls,
                    fallback=d.fallback, final=d.final,
                    state=state if shared else d.drafter,
                    target_cache=d.drafter if shared else None)


@struct.dataclass
class NoProposals:
  """The proposer of the autoregressive baseline: nothing to propose, ever."""

  vocab_size: int = struct.field(pytree_node=False)
  kind: str = struct.field(pytree_node=False, default="none")

  def init(self, inputs: Array, capacity: int, lengths: Array | None = None) -> Array:
    return jnp.zeros((), jnp.int32)

  def update(self, state: Any, outcome: RoundOutcome) -> Any:
    return state

  def propose(self, state: Any, ctx: RoundContext, key: Array) -> Proposal:
    batch = ctx.n.shape[0]
    zeros = jnp.zeros((batch,), jnp.int32)
    no = jnp.zeros((batch,), jnp.bool_)
    return Proposal(tokens=jnp.zeros((batch, 0), jnp.int32), count=zeros, q=None, calls=zeros,
                    fallback=no, final=no, state=state)
