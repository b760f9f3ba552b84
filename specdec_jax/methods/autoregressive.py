"""Autoregressive baseline: the round engine with no proposals, one token per target call.

Each round feeds every row's last token (a 1-token cached call), samples the next
token from the adjusted distribution (`acceptance.TargetOnly`) and emits it. Semantics
follow T5X's `temperature_sample` from scratch: the decoder starts from token 0, a
row ends at its first EOS (kept) or after `max_new_tokens`, later positions are 0.

    out = generate(model, inputs, max_new_tokens=32)
    # the same, from the pure pieces:
    config = round_config(max_new_tokens=32)
    out = engine.run(model, NoProposals(V), inputs, None, key, config=config)
"""

from __future__ import annotations

from specdec_jax import sampling as sampling_lib
from specdec_jax.rounds import engine, requests
from specdec_jax.rounds.acceptance import TargetOnly


def round_config(max_new_tokens: int, sampling=None, eos_id: int = 1,
                 exact: bool | None = None) -> engine.RoundConfig:
  width = engine.call_width(exact, sampling, 1)
  return engine.RoundConfig(
      max_new_tokens=requests.check_positive_int(max_new_tokens, "max_new_tokens"),
      max_proposals=0, sampling=sampling_lib.as_sampling(sampling), eos_id=eos_id,
      accept=TargetOnly(), call_width=width,
      info=(("method", "autoregressive"), ("lossy", False)))


