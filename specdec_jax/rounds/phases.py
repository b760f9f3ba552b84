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

from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class Proposer(Protocol):
  """Anything that proposes tokens for the target to verify: the proposer protocol.

  A proposer is a JAX pytree (a `@flax.struct.dataclass`: it passes through `jax.jit` as
  an argument), with a state of its own threaded through the rounds (any pytree of fixed
  shapes). A token-level drafter (`drafters.Drafter`) becomes one in `drafters.DraftLoop`;
  write a proposer from scratch when drafts do not come one token at a time (prediction
  heads read the verifier's hidden states in `update`; a lattice proposes several paths).

      state    = proposer.init(inputs [B, Le], capacity)   (decoder-only: lengths=)
      proposal = proposer.propose(state, ctx, key)     Proposal: tokens [B, G], count [B], ...
      state    = proposer.update(proposal.state, RoundOutcome(...))   after the commit

  `propose` makes at most `ctx.limit[b]` proposals for row b (0 for finished rows) in
  G = `ctx.max_proposals` slots; the slots at or beyond `count` hold 0. Under sampling it
  sets `Proposal.q` [B, G, V], the distributions the proposals were drawn from after the
  run's transform (`sampling.probs(logits, ctx.sampling)`): the exact rule needs them.
  Optional: `kind`, a short label for reports.
  """

  @property
  def vocab_size(self) -> int:
    """V, the vocabulary it proposes from (a field or a property): the target's (checked)."""

  def init(self, inputs: Array, capacity: int, lengths: Array | None = None) -> Any:
    """State before the first round (e.g. a drafter's cache of `capacity` positions).

    A decoder-only target's request passes its right-padded prompts [B, P] as
    `inputs` and their lengths [B] as `lengths` (a T5 request: no `lengths`).
    """

  def propose(self, state: Any, ctx: RoundContext, key: Array) -> Proposal:
    """Up to ctx.limit[b] proposals for each row; `Proposal.state` is the state after."""

  def update(self, state: Any, outcome: RoundOutcome) -> Any:
    """State after the round is committed (most proposers return it unchanged)."""


@runtime_checkable
class AcceptRule(Protocol):
  """An acceptance rule: which proposals to keep, and the target's token after them.

  A rule is a value the engine takes as a static `jax.jit` argument, so it must be
  hashable and compare by its settings: a frozen dataclass
  (`@dataclasses.dataclass(frozen=True)`) whose fields are settings (numbers, strings),
  never arrays. Equal settings then compile to the same program. B rows, G proposal slots,
  V vocabulary:

      acceptance = rule(logits [B, G + 1, V] float32, proposal, sampling, key)

  `logits[:, i]` scores the token after proposal i (i = 0: after the last emitted token);
  `proposal.tokens` int32 [B, G], `proposal.count` int32 [B] real slots, `proposal.q`
  the proposer's distributions [B, G, V] (None under greedy decoding). The rule returns an
  `Acceptance`: `m` [B] a prefix of the real proposals (0 <= m <= count), `next_token`
  [B] the target's token at position m (a correction, or a bonus token if m == count),
  `beta` [B, G] and `scored` [B, G] for the statistics (alpha).
  A rule that may keep what the target would not have chosen sets a class attribute
  `lossy = True` (the statistics report it).
  """

  def __call__(self, logits: Array, proposal: Proposal, sampling: SamplingSettings,
               key: Array) -> Acceptance:
    """logits: float32 [B, G + 1, V] of the target at [last, x_1 .. x_G]."""
