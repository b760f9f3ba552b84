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
from specdec_jax.decoding import engine, inputs
from specdec_jax.decoding.acceptance import SpeculativeSampling
from specdec_jax.decoding.adaptive import Adaptive, AdaptiveGamma
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.drafters import ModelDrafter, as_proposer
from specdec_jax.models.model import Model


def round_config(gamma: int, max_new_tokens: int, sampling=None, eos_id: int = 1,
                 lenience: float = 1.0, accept=None, exact: bool | None = None
                 ) -> engine.RoundConfig:
  """The engine settings of speculative decoding; `accept` replaces the rule (research)."""
  gamma = inputs.check_positive_int(gamma, "gamma")
  rule = SpeculativeSampling(lenience=float(lenience)) if accept is None else accept
  width = engine.call_width(exact, sampling, gamma + 1)
  return engine.RoundConfig(
      max_new_tokens=inputs.check_positive_int(max_new_tokens, "max_new_tokens"),
      max_proposals=gamma, sampling=sampling_lib.as_sampling(sampling), eos_id=eos_id,
      accept=rule, call_width=width,
      info=(("method", "speculative"), ("gamma", gamma), ("lenience", float(lenience)),
            ("lossy", bool(getattr(rule, "lossy", False)))))


def proposer(drafter: Any, target: Model, gamma: int,
             adaptive: AdaptiveGamma | bool | None = None) -> Any:
  """The drafter as a proposer, optionally with per-row adaptive gamma (1..gamma)."""
  p = as_proposer(drafter, target)
  if adaptive:
    p = Adaptive(p, AdaptiveGamma() if adaptive is True else adaptive, gamma)
  return p


def speculative_generate(target: Model, drafter, encoder_tokens, gamma: int = 5,
                         max_new_tokens: int = 64,
                         sampling: sampling_lib.SamplingSettings | None = None, rng=None,
                         eos_id: int | None = None, lenience: float = 1.0,
                         adaptive: AdaptiveGamma | bool | None = None,
                         drafter_encoder_tokens=None, accept=None,
                         exact: bool | None = None, prompt_lengths=None) -> DecodeOutput:
  """Speculative decoding of `encoder_tokens` [B, Le] (0-padded) with a drafter.

  Args:
    target: the verifier model.
    drafter: a `Model` with the same vocabulary, a drafter from `specdec_jax.drafters`,
      or any `Proposer`.
    gamma: drafts per round (the maximum, with `adaptive`).
    sampling: `sd.Greedy()` (default) or `sd.Sampling(temperature, top_k, top_p)`,
      applied identically to target and drafter distributions.
    lenience: 1 is exact; < 1 is lossy (reported in stats["lossy"]).
    adaptive: `True` or an `AdaptiveGamma` for per-row gamma chosen on device.
    drafter_encoder_tokens: the drafter's input if it differs (defaults to the target's).
    accept: another acceptance rule (a frozen dataclass; see `acceptance`), for research.
    exact: every target call with `engine.EXACT_WIDTH` tokens, as `generate(exact=True)`:
      greedy output bitwise the baseline's on any backend and dtype. None: for greedy.
    prompt_lengths: a decoder-only target's prompt lengths [B] (`sd.decode`).
  Returns:
    DecodeOutput(tokens [B, max_new_tokens], lengths [B], counters; `.stats` mapping).
  """
  from specdec_jax.decoding import methods   # methods builds on this module
  method = methods.Speculative(drafter, gamma=gamma, adaptive=adaptive, lenience=lenience,
                               drafter_encoder_tokens=drafter_encoder_tokens, accept=accept,
                               exact=exact)
  return methods.decode(target, method, encoder_tokens, max_new_tokens, sampling, rng, eos_id,
                        prompt_lengths)


def model_drafter(p: Any) -> ModelDrafter | None:
  """The `ModelDrafter` inside proposer wrappers (adaptive gamma, draft loop), if any."""
  while p is not None and not isinstance(p, ModelDrafter):
    p = getattr(p, "inner", None) or getattr(p, "drafter", None)
  return p
