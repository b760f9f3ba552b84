"""Speculative sampling (Leviathan et al., Algorithm 1) as a wiring of the round engine.

One round, per row (p = target, q = drafter, both standardised by the same
sampling transform; n = tokens emitted so far):

  1. propose  x_1..x_gamma ~ q_1..q_gamma     (gamma drafter calls, q kept when sampling)
  2. verify   p_1..p_{gamma+1} = target([seq[n], x_1..x_gamma])     (ONE call)
  3. accept   `acceptance.SpeculativeSampling`: x_i while r_i q_i(x_i) < p_i(x_i) -> m accepted,
              then t ~ norm(max(0, p_{m+1} - q_{m+1})), or t ~ p_{gamma+1} if all accepted
  4. commit   emit x_1..x_m, t; both caches roll back by length only

Under `Greedy` p and q are one-hot: the rule keeps the drafts that equal the
target's argmax and t is the target's argmax, so the output is the target's greedy
output token for token. Under sampling the output has the target's distribution
(tests/test_distribution.py checks it by exact enumeration).

    config = speculative.round_config(gamma=4, max_new_tokens=32)
    out = engine.run(target, speculative.proposer(drafter, target), enc, None, key,
                     config=config)          # == speculative_generate(target, drafter, enc, 4, 32)
"""

from __future__ import annotations

from typing import Any

from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import ModelDrafter, as_proposer
from specdec_jax.methods.adaptive import Adaptive, AdaptiveGamma
from specdec_jax.models.model import Model
from specdec_jax.rounds import engine, requests
from specdec_jax.rounds.acceptance import SpeculativeSampling
from specdec_jax.rounds.phases import AcceptRule, Proposer


def round_config(gamma: int, max_new_tokens: int, sampling=None, eos_id: int = 1,
                 lenience: float = 1.0, accept: AcceptRule | None = None,
                 exact: bool | None = None
                 ) -> engine.RoundConfig:
  """The engine settings of speculative decoding; `accept` replaces the rule (research)."""
  gamma = requests.check_positive_int(gamma, "gamma")
  rule = SpeculativeSampling(lenience=float(lenience)) if accept is None else accept
  width = engine.call_width(exact, sampling, gamma + 1)
  return engine.RoundConfig(
      max_new_tokens=requests.check_positive_int(max_new_tokens, "max_new_tokens"),
      max_proposals=gamma, sampling=sampling_lib.as_sampling(sampling), eos_id=eos_id,
      accept=rule, call_width=width,
      info=(("method", "speculative"), ("gamma", gamma), ("lenience", float(lenience)),
            ("lossy", bool(getattr(rule, "lossy", False)))))


def proposer(drafter: Any, target: Model, gamma: int,
             adaptive: AdaptiveGamma | bool | None = None) -> Proposer:
  """The drafter as a proposer, optionally with per-row adaptive gamma (1..gamma)."""
  p = as_proposer(drafter, target)
  if adaptive:
    p = Adaptive(p, AdaptiveGamma() if adaptive is True else adaptive, gamma)
  return p


def model_drafter(p: Any) -> ModelDrafter | None:
  """The `ModelDrafter` inside proposer wrappers (adaptive gamma, draft loop), if any."""
  while p is not None and not isinstance(p, ModelDrafter):
    p = getattr(p, "inner", None) or getattr(p, "drafter", None)
  return p
