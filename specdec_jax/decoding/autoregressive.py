"""Autoregressive baseline: the round engine with no proposals, one token per target call.

Each round feeds every row's last token (a 1-token cached call), samples the next
token from the adjusted distribution (`acceptance.TargetOnly`) and emits it. Semantics
follow T5X's `temperature_sample` from scratch: the decoder starts from token 0, a
row ends at its first EOS (kept) or after `max_new_tokens`, later positions are 0.

    out = generate(model, encoder_tokens, max_new_tokens=32)
    # the same, from the pure pieces:
    config = round_config(max_new_tokens=32)
    out = engine.run(model, NoProposals(V), encoder_tokens, None, key, config=config)
"""

from __future__ import annotations

from specdec_jax import sampling as sampling_lib
from specdec_jax.decoding import engine, inputs
from specdec_jax.decoding.acceptance import TargetOnly
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.models.model import Model


def round_config(max_new_tokens: int, sampling=None, eos_id: int = 1,
                 exact: bool | None = None) -> engine.RoundConfig:
  width = engine.call_width(exact, sampling, 1)
  return engine.RoundConfig(
      max_new_tokens=inputs.check_positive_int(max_new_tokens, "max_new_tokens"),
      max_proposals=0, sampling=sampling_lib.as_sampling(sampling), eos_id=eos_id,
      accept=TargetOnly(), call_width=width,
      info=(("method", "autoregressive"), ("lossy", False)))


def generate(model: Model, encoder_tokens, max_new_tokens: int = 64,
             sampling: sampling_lib.SamplingSettings | None = None, rng=None,
             eos_id: int | None = None, exact: bool | None = None,
             prompt_lengths=None) -> DecodeOutput:
  """Decode up to `max_new_tokens` per row from `encoder_tokens` [B, Le] (0-padded), or
  continue a decoder-only model's right-padded prompts [B, P] (`prompt_lengths` [B]: their
  lengths; None: one past each row's last non-pad token).

  exact: compute every step with the call shape every drafter/verifier method uses
  (`engine.EXACT_WIDTH` tokens; unpadded on a `Model.width_invariant_decode` target,
  whose rows do not depend on the call's width), so their greedy output is bitwise
  this one on any backend and dtype; None: exact for greedy decoding (see README,
  "Exactness").
  Returns `DecodeOutput(tokens [B, T], lengths [B], counters)`; `.stats` has the mapping.
  """
  from specdec_jax.decoding import methods   # methods builds on this module
  return methods.decode(model, methods.Autoregressive(exact=exact), encoder_tokens,
                        max_new_tokens, sampling, rng, eos_id, prompt_lengths)
