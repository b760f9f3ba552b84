"""`decode`: the one entry point that runs any method value (see `values`)."""

from __future__ import annotations

from specdec_jax import sampling as sampling_lib
from specdec_jax.config.lm import LMConfig
from specdec_jax.errors import InputError
from specdec_jax.methods.beam import Beam
from specdec_jax.methods.speculative_beam import SpeculativeBeam
from specdec_jax.methods.values import Autoregressive, BiLD, Blockwise, Method, Speculative
from specdec_jax.models.model import Model
from specdec_jax.rounds import inputs
from specdec_jax.rounds.buffer import DecodeOutput

#: The package's method types (`decode` runs any `Method`; its error for another value names
#: these).
METHODS = (Autoregressive, Speculative, BiLD, Blockwise, Beam, SpeculativeBeam)


def decode(target: Model, method: Method, encoder_tokens, max_new_tokens: int = 64,
           sampling: sampling_lib.SamplingSettings | None = None, rng=None,
           eos_id: int | None = None, prompt_lengths=None) -> DecodeOutput:
  """Decode `encoder_tokens` int [B, Le] (0-padded) with `method`; the target verifies.

  A decoder-only target continues prompts: `encoder_tokens` are right-padded prompts
  [B, P], row b's first P_b tokens real (docs/decoder-only.md); P + max_new_tokens must fit
  its `max_positions` (learned or rotary). A T5 target's ids are used verbatim: end each
  row with EOS as the tokenizer's `encode` does, or its output differs (no EOS is added).

  Args:
    target: the model whose output (or distribution) the method reproduces.
    method: `sd.Autoregressive()`, `sd.Speculative(drafter, ...)`, `sd.BiLD(small, ...)`,
      `sd.Blockwise(heads, ...)`, `sd.Beam(num_beams, alpha)` (its own loop: `beam`) or
      `sd.SpeculativeBeam(drafter, num_beams, alpha, gamma)` (`speculative_beam`).
    max_new_tokens: T, tokens per row at most.
    sampling: `sd.Greedy()` (default) or `sd.Sampling(temperature, top_k, top_p)`, applied
      alike to the target's and the proposer's distributions.
    rng: a PRNG key or an int seed (sampling).
    eos_id: a row stops after it (None: the target's EOS; negative: never).
    prompt_lengths: int [B] a decoder-only target's prompt lengths P_b (None: one past
      each row's last token that is not the pad id).
  Returns:
    DecodeOutput(tokens int [B, T] (0 after EOS), lengths int [B], counters; `.stats`).

  Example::

      >>> import specdec_jax as sd, numpy as np
      >>> target = sd.load("config:t5_1_1_tiny")
      >>> out = sd.decode(target, sd.Speculative(target, gamma=2), np.array([[5, 6, 1]]),
      ...                 max_new_tokens=3, sampling=sd.Sampling(temperature=0.7), rng=0)
      >>> out.tokens.shape, out.lengths.shape
      ((1, 3), (1,))
  """
  if not isinstance(method, Method):
    names = [m.__name__ for m in METHODS]
    raise InputError(f"method must be one of sd.{', sd.'.join(names)}, "
                     f"got {type(method).__name__}")
  inputs.check_target(target)
  if isinstance(target.config, LMConfig):   # decoder-only
    encoder_tokens, prompt_lengths = inputs.check_prompt(encoder_tokens, target.config,
                                                         max_new_tokens, prompt_lengths)
  elif prompt_lengths is not None:
    raise InputError("prompt_lengths is for decoder-only targets; a T5 encoder input is "
                     "masked by its pad tokens")
  else:
    encoder_tokens = inputs.check_request(encoder_tokens, target.config, max_new_tokens)
  sampling = sampling_lib.as_sampling(sampling)
  return method.run(target, encoder_tokens, max_new_tokens, sampling, rng,
                    inputs.resolve_eos(eos_id, target.config), prompt_lengths)
