"""The autoregressive baseline (`sd.Autoregressive`): the round engine with no proposals, one
token per target call.

Each round feeds every row's last token (a 1-token cached call), samples the next
token from the adjusted distribution (`acceptance.TargetOnly`) and emits it. Semantics
follow T5X's `temperature_sample` from scratch: the decoder starts from token 0, a
row ends at its first EOS (kept) or after `max_new_tokens`, later positions are 0.

    out = sd.decode(model, Autoregressive(), inputs, max_new_tokens=32)
    # the same, from the pure pieces:
    config = round_config(max_new_tokens=32)
    out = engine.run(model, NoProposals(V), inputs, None, key, config=config)
"""

from __future__ import annotations

from typing import ClassVar

from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters.loop import NoProposals
from specdec_jax.methods.base import Method, check_exact, setting
from specdec_jax.rounds import engine, requests
from specdec_jax.rounds.acceptance import TargetOnly
from specdec_jax.rounds.stats import COMMON_STATS


def round_config(max_new_tokens: int, sampling=None, eos_id: int = 1,
                 exact: bool | None = None) -> engine.RoundConfig:
  width = engine.call_width(exact, sampling, 1)
  return engine.RoundConfig(
      max_new_tokens=requests.check_positive_int(max_new_tokens, "max_new_tokens"),
      max_proposals=0, sampling=sampling_lib.as_sampling(sampling), eos_id=eos_id,
      accept=TargetOnly(), call_width=width,
      info=(("method", Autoregressive.name), ("lossy", False)))


@struct.dataclass
class Autoregressive(Method):
  """The baseline: the target alone, one token per call (T5X's `temperature_sample`).

  Attributes:
    exact: every call at the width every drafter/verifier method uses
      (`engine.EXACT_WIDTH`), so their greedy output is bitwise this one; None: exact
      for greedy decoding.

  Example::

      >>> import specdec_jax as sd, numpy as np
      >>> model = sd.load("config:t5_1_1_tiny")
      >>> out = sd.decode(model, sd.Autoregressive(), np.array([[5, 6, 7, 1]]),
      ...                 max_new_tokens=4)
      >>> out.tokens.shape
      (1, 4)
  """

  name: ClassVar[str] = "autoregressive"
  summary: ClassVar[str] = "the target alone, one token per call (sd.generate)"
  statistics: ClassVar[tuple[str, ...]] = COMMON_STATS

  exact: bool | None = setting(None)

  def __post_init__(self):
    check_exact(self.exact)

  def baseline(self) -> Method:
    """Itself, at its default settings: the target alone."""
    return Autoregressive()

  def proposer(self, target, sampling):
    return NoProposals(target.config.vocab_size)

  def round_config(self, target, max_new_tokens, sampling, eos_id):
    return round_config(max_new_tokens, sampling, eos_id, self.exact)
