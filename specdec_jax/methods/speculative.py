"""Speculative decoding (`sd.Speculative`; Leviathan et al., Algorithm 1) on the round engine.

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

from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import ModelDrafter, as_proposer
from specdec_jax.errors import InputError
from specdec_jax.methods.adaptive import Adaptive, AdaptiveGamma
from specdec_jax.methods.autoregressive import Autoregressive
from specdec_jax.methods.base import (
  Method,
  carried,
  check_accept,
  check_exact,
  check_number,
  setting,
)
from specdec_jax.models.model import Model
from specdec_jax.rounds import engine, requests
from specdec_jax.rounds.acceptance import SpeculativeSampling
from specdec_jax.rounds.phases import AcceptRule, Proposer
from specdec_jax.rounds.stats import COMMON_STATS, PROPOSED, SCORED

#: The most drafts per round: generous, but it keeps a mistyped value (gamma=100000
#: compiled for minutes into gigabytes) a clear error. A round keeps the drafter's
#: distributions q [B, gamma, V] and verifies gamma + 1 tokens in one call, while it gains
#: (1 - alpha^(gamma+1)) / (1 - alpha) < 1 / (1 - alpha) tokens (Leviathan et al.): at
#: alpha 0.9, gamma 64 is within 0.1% of that bound; papers use 3 to 10.
MAX_GAMMA = 64


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
      info=(("method", Speculative.name), ("gamma", gamma), ("lenience", float(lenience)),
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


@struct.dataclass
class Speculative(Method):
  """Speculative decoding (Leviathan et al.): a drafter proposes, the target verifies.

  Attributes:
    drafter: a `Model` of the target's kind (T5 or decoder-only) and vocabulary, a drafter
      of `specdec_jax.drafters` (`sd.NGramDrafter`, `sd.PromptLookupDrafter`), or one of
      your own: an `sd.Drafter` or an `sd.Proposer` (docs/extending/drafter.md).
    gamma: drafts per round (the maximum, with `adaptive`), >= 1.
    adaptive: True or an `sd.AdaptiveGamma`: per-row gamma in 1..gamma chosen on device.
    lenience: 1 is exact; in (0, 1) is their lossy variant (reported as lossy).
    drafter_inputs: int [B, Le'] the drafter's input if it differs from the
      target's (None: the same; a decoder-only drafter continues the target's prompt).
    accept: another acceptance rule (an `sd.AcceptRule`, docs/extending/acceptance.md),
      for research; None: the exact rule `acceptance.SpeculativeSampling(lenience)`.
    exact: every target call of `engine.EXACT_WIDTH` tokens: greedy output bitwise the
      baseline's on any backend and dtype. None: for greedy decoding.

  Example (a drafter with random weights: alpha ~ 0, output still the target's)::

      >>> import specdec_jax as sd, numpy as np
      >>> target = sd.load("config:t5_1_1_tiny")
      >>> method = sd.Speculative(target, gamma=3)
      >>> method == sd.Speculative(None, gamma=3)     # equal settings
      True
      >>> enc = np.array([[5, 6, 7, 1]])
      >>> out = sd.decode(target, method, enc, max_new_tokens=4)
      >>> bool((out.tokens == sd.decode(target, sd.Autoregressive(), enc,
      ...                                max_new_tokens=4).tokens).all())
      True
  """

  name: ClassVar[str] = "speculative"
  summary: ClassVar[str] = "speculative decoding: --drafter proposes, the target verifies"
  drafter_role: ClassVar[str | None] = "drafter"
  statistics: ClassVar[tuple[str, ...]] = (*COMMON_STATS, "drafter_calls", *PROPOSED,
                                           *SCORED)

  drafter: Any = carried(flag="--drafter")
  gamma: int = setting(5, cli_help="tokens drafted per round (with --adaptive-gamma: the most)")
  adaptive: AdaptiveGamma | bool | None = setting(
      None, flag="--adaptive-gamma",
      cli_help="choose each row's gamma in 1..--gamma on device, from its acceptance so far")
  lenience: float = setting(
      1.0, cli_help="1: exact; below 1: Leviathan et al.'s lenient acceptance (lossy)")
  drafter_inputs: Any = carried(per_call=True)
  accept: AcceptRule | None = setting(None, research=True)
  exact: bool | None = setting(None)

  def __post_init__(self):
    requests.check_positive_int(self.gamma, "gamma", MAX_GAMMA,
                              "drafts per round: a round gains fewer than 1 / (1 - alpha) "
                              "tokens, so longer drafts only add cost")
    lenience = check_number(self.lenience, "lenience")
    if not 0.0 < lenience <= 1.0:
      raise InputError(f"lenience must be in (0, 1] (1 = exact), got {self.lenience!r}")
    if self.adaptive is not None and not isinstance(self.adaptive, (bool, AdaptiveGamma)):
      raise InputError(f"adaptive must be True, False, None or an sd.AdaptiveGamma, "
                       f"got {self.adaptive!r}")
    check_accept(self.accept)
    check_exact(self.exact)

  def baseline(self) -> Method:
    """The target alone (`Autoregressive`), greedy or sampled as this run."""
    return Autoregressive()

  def proposer(self, target, sampling):
    if self.drafter is None:
      raise InputError("sd.Speculative needs a drafter: a Model with the target's vocabulary "
                       "or a drafter of specdec_jax.drafters")
    return proposer(self.drafter, target, self.gamma, self.adaptive)

  def round_config(self, target, max_new_tokens, sampling, eos_id):
    return round_config(self.gamma, max_new_tokens, sampling, eos_id, self.lenience,
                        self.accept, self.exact)

  def proposer_inputs(self, proposer, inputs, max_new_tokens):
    return drafter_inputs(proposer, self.drafter_inputs, inputs, max_new_tokens)


def drafter_inputs(proposer, own_tokens, inputs, max_new_tokens):
  """The drafting model's input [B, Le']: its own tokens if given, else the target's;
  checked against its config when the proposer wraps a `ModelDrafter`. A decoder-only
  drafter continues the target's own prompt (None: the target's)."""
  found = model_drafter(proposer)
  if found is not None and found.model.is_decoder_only:
    if own_tokens is not None:
      raise InputError("a decoder-only drafter continues the target's prompt: drop the "
                       "drafter's own input tokens")
    requests.check_prompt(inputs, found.model.config, max_new_tokens,
                        jnp.ones((inputs.shape[0],), jnp.int32))
    return None
  tokens = inputs if own_tokens is None else own_tokens
  if own_tokens is not None and np.shape(own_tokens)[:1] != np.shape(inputs)[:1]:
    raise InputError(f"the drafting model's own input tokens have {np.shape(own_tokens)[:1]} "
                     f"rows, the target's {np.shape(inputs)[:1]}: one row per row")
  if found is not None:
    return requests.check_request(tokens, found.model.config, max_new_tokens)
  return tokens
