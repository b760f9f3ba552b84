"""What the four phases of a round hand to each other, and the two protocols a method plugs in.

Shapes: B rows, G = the round's proposal slots (gamma, static), V vocabulary,
E the model's hidden size. `count` [B] says how many of a row's G proposal slots are real;
slots at or beyond it hold 0 and are never accepted.

    ctx          = RoundContext(...)                  what a proposer may read
    proposal     = proposer.propose(state, ctx, key)  Proposal   [B, G]
    verified     = verify(target, cache, ctx, proposal)   Verified   [B, G + 1, V]
    acceptance   = rule(verified.logits, proposal, sampling, key)   Acceptance  m [B]
    state        = proposer.update(state, RoundOutcome(...))        after commit
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
from flax import struct

from specdec_jax.cache import DecoderCache
from specdec_jax.sampling import SamplingSettings

Array = jax.Array


class RoundContext(struct.PyTreeNode):
  """What a proposer may read at the start of a round.

  Attributes:
    seq: int32 [B, T + 1] token buffer (see `buffer`); n: int32 [B] tokens emitted.
    limit: int32 [B] most proposals the row may make this round (0 for done rows).
    cache: the target's cache (length n); a proposer that shares it (early exit) may
      write into it and return it as `Proposal.target_cache`.
    max_proposals: G (static); sampling, eos_id, max_new_tokens: the run's settings.
  """

  seq: Array
  n: Array
  limit: Array
  cache: DecoderCache
  max_proposals: int = struct.field(pytree_node=False)
  sampling: SamplingSettings = struct.field(pytree_node=False)
  eos_id: int = struct.field(pytree_node=False)
  max_new_tokens: int = struct.field(pytree_node=False)

  @property
  def live(self) -> Array:
    """bool [B]: rows still decoding."""
    return self.limit > 0


class Proposal(struct.PyTreeNode):
  """Up to G proposed tokens per row.

  Attributes:
    tokens: int32 [B, G]; slots >= count hold 0.
    count: int32 [B] proposals made (0: the target alone decides this round's token).
    q: float32 [B, G, V] the proposer's standardised distributions (what the exact
      sampling rule needs), or None when no rule of this run reads them (greedy).
    calls: int32 [B] proposer invocations in which the row was drafting.
    fallback: bool [B] the proposer stopped early because it was unsure (BiLD).
    final: bool [B] commit these proposals WITHOUT verification: the proposer ended
      the sentence (BiLD's small model emitting EOS, or filling the buffer).
    state: the proposer's state after proposing.
    target_cache: the target's cache if the proposer wrote into it (early exit), else None.
  """

  tokens: Array
  count: Array
  q: Array | None
  calls: Array
  fallback: Array
  final: Array
  state: Any
  target_cache: DecoderCache | None = None


@struct.dataclass
class Verified:
  """The target's verdict material: ONE cached call over [last token, proposals].

  Attributes:
    logits: float32 [B, G + 1, V]; position i scores the token after proposal i
      (position 0: after the last emitted token).
    hidden: [B, G + 1, E] final decoder states at the same positions (prediction
      heads draft from them), or None when nobody asked.
    cache: the target's cache with those G + 1 positions written (commit rolls it back).
    ran: bool [] whether the target actually ran (a method may skip the call when no
      live row needs it).
    proposal: the proposal actually verified, when the verify phase chose it among
      several (parallel drafts); None: the proposal it was given.
  """

  logits: Array
  hidden: Array | None
  cache: DecoderCache
  ran: Array
  proposal: Proposal | None = None


@struct.dataclass
class Acceptance:
  """An acceptance rule's decision.

  Attributes:
    m: int32 [B] proposals accepted (a prefix: 0 <= m <= count).
    next_token: int32 [B] the target's token after them (a correction if m < count,
      a bonus token if all were accepted).
    beta: float32 [B, G] acceptance probability of each proposal, for alpha.
    scored: bool [B, G] proposals the target scored on its own path (i <= m, i < count).
  """

  m: Array
  next_token: Array
  beta: Array
  scored: Array


@struct.dataclass
class RoundOutcome:
  """What a proposer learns after the round (`Proposer.update`).

  Attributes:
    live: bool [B] rows that took part; m: int32 [B] proposals kept;
    acceptance: the rule's decision; verified: the target's call (hidden states).
  """

  live: Array
  m: Array
  acceptance: Acceptance
  verified: Verified


class Proposer(Protocol):
  """Anything that proposes tokens for the target to verify (a pytree: it passes through jit)."""

  @property
  def vocab_size(self) -> int:
    """V, the vocabulary it proposes from (a field or a property)."""

  def init(self, encoder_tokens: Array, capacity: int, lengths: Array | None = None) -> Any:
    """State before the first round (e.g. a drafter's cache of `capacity` positions).

    A decoder-only target's request passes its right-padded prompts [B, P] as
    `encoder_tokens` and their lengths [B] as `lengths` (a T5 request: no `lengths`).
    """

  def propose(self, state: Any, ctx: RoundContext, key: Array) -> Proposal:
    """Up to ctx.limit[b] proposals for each row."""

  def update(self, state: Any, outcome: RoundOutcome) -> Any:
    """State after the round is committed (most proposers return it unchanged)."""


class AcceptRule(Protocol):
  """A frozen, hashable dataclass: the engine receives the rule as a value."""

  def __call__(self, logits: Array, proposal: Proposal, sampling: SamplingSettings,
               key: Array) -> Acceptance:
    """logits: float32 [B, G + 1, V] of the target at [last, x_1 .. x_G]."""
