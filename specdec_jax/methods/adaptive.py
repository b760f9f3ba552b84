"""Per-row adaptive gamma (beyond the paper): a proposer wrapper that picks each row's
number of proposals from that row's own acceptance history.

Each row keeps an exponential moving average of its alpha (the mean of
beta = sum_x min(p, q) over the positions the target scored in a round) and drafts
the gamma in 1..gamma_max that maximises Theorem 8's expected walltime improvement

    (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))

for the drafter's cost ratio c. E.g. with c = 0.05 (gamma_max 16): alpha 0.3 -> gamma 2,
0.6 -> 4, 0.8 -> 8, 0.9 -> 13. Where a (gamma+1)-token verify call costs more than a step
(a CPU at batch 8, say), `verify_cost` holds those measured ratios v(gamma+1), and the
policy maximises (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + v(gamma+1))) instead
(`theory.walltime_improvement_measured`; `tools.costs.measured_adaptive_gamma` measures c
and v on the machine).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.drafters import protocol
from specdec_jax.errors import InputError
from specdec_jax.rounds.phases import Proposal, RoundContext, RoundOutcome

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class AdaptiveGamma:
  """The policy: cost ratio `c`, EMA `decay`, the alpha assumed before any round, and the
  verify costs.

  Attributes:
    c: the drafter's cost coefficient: one drafter step over one target step (>= 0).
    decay: weight of a row's previous alpha estimate in its moving average, in [0, 1).
    initial_alpha: the alpha a row assumes before its first round.
    verify_cost: v(gamma+1) for gamma = 1, 2, ...: a (gamma+1)-token target call over a
      1-token call; a gamma past the tuple's end takes its last entry; () means 1
      (Theorem 8: verification as cheap as a step).

      >>> AdaptiveGamma(c=0.05).gammas([0.6], 8)                # Theorem 8
      [4]
      >>> AdaptiveGamma(c=0.05, verify_cost=(1.2, 1.5, 1.8, 2.1)).gammas([0.6], 8)
      [1]
  """

  c: float = 0.05
  decay: float = 0.7
  initial_alpha: float = 0.6
  verify_cost: tuple[float, ...] = ()

  def __post_init__(self):
    if not 0.0 <= self.decay < 1.0:
      raise InputError(f"AdaptiveGamma.decay must be in [0, 1), got {self.decay}")
    if not 0.0 <= self.initial_alpha <= 1.0:
      raise InputError(f"AdaptiveGamma.initial_alpha must be in [0, 1], got "
                       f"{self.initial_alpha}")
    if self.c < 0:
      raise InputError(f"AdaptiveGamma.c must be >= 0, got {self.c}")
    if not isinstance(self.verify_cost, tuple) or not all(
        isinstance(v, (int, float)) and v > 0 for v in self.verify_cost):
      raise InputError(f"AdaptiveGamma.verify_cost must be a tuple of numbers > 0 "
                       f"(v(2), v(3), ...), got {self.verify_cost!r}")

  def _verify(self, gamma_max: int) -> list[float]:
    """v(gamma+1) for gamma = 1..gamma_max."""
    v = list(self.verify_cost) or [1.0]
    return [float(v[min(g, len(v)) - 1]) for g in range(1, gamma_max + 1)]

  def choose(self, alpha: Array, gamma_max: int) -> Array:
    """[B] alpha -> [B] int32 gamma in 1..gamma_max."""
    g = jnp.arange(1, gamma_max + 1, dtype=jnp.float32)
    v = jnp.asarray(self._verify(gamma_max), jnp.float32)
    a = jnp.clip(alpha, 0.0, 0.999)[:, None]
    improvement = (1.0 - a ** (g + 1)) / ((1.0 - a) * (g * self.c + v))
    return (jnp.argmax(improvement, axis=1) + 1).astype(jnp.int32)

  def gammas(self, alphas, gamma_max: int) -> list[int]:
    """`choose` on host numbers: the gamma for each alpha."""
    return [int(x) for x in self.choose(jnp.asarray(alphas, jnp.float32), gamma_max)]


class AdaptiveState(struct.PyTreeNode):
  """inner: the wrapped proposer's state; alpha_ema: float32 [B]; gamma: int32 [B]."""

  inner: Any
  alpha_ema: Array
  gamma: Array


@struct.dataclass
class Adaptive:
  """Wraps a proposer: row b proposes at most gamma[b] tokens, re-chosen every round."""

  inner: Any
  policy: AdaptiveGamma = struct.field(pytree_node=False)
  gamma_max: int = struct.field(pytree_node=False)

  @property
  def vocab_size(self) -> int:
    return self.inner.vocab_size

  @property
  def kind(self) -> str:
    return protocol.kind(self.inner)

  def init(self, inputs: Array, capacity: int,
           lengths: Array | None = None) -> AdaptiveState:
    alpha = jnp.full((inputs.shape[0],), self.policy.initial_alpha, jnp.float32)
    inner = (self.inner.init(inputs, capacity) if lengths is None
             else self.inner.init(inputs, capacity, lengths=lengths))
    return AdaptiveState(inner=inner, alpha_ema=alpha,
                         gamma=self.policy.choose(alpha, self.gamma_max))

  def propose(self, state: AdaptiveState, ctx: RoundContext, key: Array) -> Proposal:
    ctx = ctx.replace(limit=jnp.minimum(ctx.limit, state.gamma))
    proposal = self.inner.propose(state.inner, ctx, key)
    return proposal.replace(state=state.replace(inner=proposal.state))

  def update(self, state: AdaptiveState, outcome: RoundOutcome) -> AdaptiveState:
    acc = outcome.acceptance
    beta_count = jnp.sum(acc.scored, axis=1)
    round_alpha = jnp.sum(jnp.where(acc.scored, acc.beta, 0.0), axis=1) / jnp.maximum(
        beta_count, 1)
    d = self.policy.decay
    alpha = jnp.where(outcome.live & (beta_count > 0),
                      d * state.alpha_ema + (1 - d) * round_alpha, state.alpha_ema)
    return AdaptiveState(inner=self.inner.update(state.inner, outcome), alpha_ema=alpha,
                         gamma=self.policy.choose(alpha, self.gamma_max))
