"""The functional API: each method as one function of keyword arguments, a thin call of
`decode` with the method's value (`generate(model, x) == decode(model, Autoregressive(), x)`)."""

from __future__ import annotations

from typing import Any

from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters.heads import Heads
from specdec_jax.methods.adaptive import AdaptiveGamma
from specdec_jax.methods.autoregressive import Autoregressive
from specdec_jax.methods.bild import BiLD
from specdec_jax.methods.blockwise import Blockwise
from specdec_jax.methods.decode import decode
from specdec_jax.methods.speculative import Speculative
from specdec_jax.models.model import Model
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.rounds.phases import AcceptRule


def generate(model: Model, inputs, max_new_tokens: int = 64,
             sampling: sampling_lib.SamplingSettings | None = None, rng=None,
             eos_id: int | None = None, exact: bool | None = None,
             prompt_lengths=None) -> DecodeOutput:
  """Decode up to `max_new_tokens` per row from `inputs` [B, Le] (0-padded), or
  continue a decoder-only model's right-padded prompts [B, P] (`prompt_lengths` [B]: their
  lengths; None: one past each row's last non-pad token).

  exact: compute every step with the call shape every drafter/verifier method uses
  (`engine.EXACT_WIDTH` tokens; unpadded on a `Model.width_invariant_decode` target,
  whose rows do not depend on the call's width), so their greedy output is bitwise
  this one on any backend and dtype; None: exact for greedy decoding (see README,
  "Exactness").
  Returns `DecodeOutput(tokens [B, T], lengths [B], counters)`; `.stats` has the mapping.
  """
  return decode(model, Autoregressive(exact=exact), inputs,
                max_new_tokens, sampling, rng, eos_id, prompt_lengths)


def speculative_generate(target: Model, drafter, inputs, gamma: int = 5,
                         max_new_tokens: int = 64,
                         sampling: sampling_lib.SamplingSettings | None = None, rng=None,
                         eos_id: int | None = None, lenience: float = 1.0,
                         adaptive: AdaptiveGamma | bool | None = None,
                         drafter_inputs=None, accept: AcceptRule | None = None,
                         exact: bool | None = None, prompt_lengths=None) -> DecodeOutput:
  """Speculative decoding of `inputs` [B, Le] (0-padded) with a drafter.

  Args:
    target: the verifier model.
    drafter: a `Model` with the same vocabulary, a drafter from `specdec_jax.drafters`,
      or any `Proposer`.
    gamma: drafts per round (the maximum, with `adaptive`).
    sampling: `sd.Greedy()` (default) or `sd.Sampling(temperature, top_k, top_p)`,
      applied identically to target and drafter distributions.
    lenience: 1 is exact; < 1 is lossy (reported in stats["lossy"]).
    adaptive: `True` or an `AdaptiveGamma` for per-row gamma chosen on device.
    drafter_inputs: the drafter's input if it differs (defaults to the target's).
    accept: another acceptance rule (a frozen dataclass; see `acceptance`), for research.
    exact: every target call with `engine.EXACT_WIDTH` tokens, as `generate(exact=True)`:
      greedy output bitwise the baseline's on any backend and dtype. None: for greedy.
    prompt_lengths: a decoder-only target's prompt lengths [B] (`sd.decode`).
  Returns:
    DecodeOutput(tokens [B, max_new_tokens], lengths [B], counters; `.stats` mapping).
  """
  method = Speculative(drafter, gamma=gamma, adaptive=adaptive, lenience=lenience,
                              drafter_inputs=drafter_inputs, accept=accept,
                              exact=exact)
  return decode(target, method, inputs, max_new_tokens, sampling, rng, eos_id,
                prompt_lengths)


def bild_generate(large: Model, small: Any, inputs, fallback_threshold: float = 0.5,
                  rollback_threshold: float = 5.0, max_small_steps: int = 10,
                  max_new_tokens: int = 64, sampling: sampling_lib.SamplingSettings | None = None,
                  rng=None, eos_id: int | None = None, batch_policy: str = "wait",
                  small_inputs=None, exact: bool | None = None,
                  prompt_lengths=None) -> DecodeOutput:
  """BiLD decoding of `inputs` [B, Le] (0-padded). Lossy by design.

  Args:
    large: the large model (it verifies and corrects).
    small: a `Model` with the same vocabulary, or `EarlyExitDrafter(large, exit_layer)`
      (`sd.early_exit(large, k)`) for the early-exit variant.
    fallback_threshold: in [0, 1]; the small model hands over when max p_S <= it
      (1.0: the large model decides every token; 0.0: the small model never hands over).
    rollback_threshold: > 0; roll back a small token y when -log p_L(y) > it (inf: never).
    max_small_steps: most consecutive small-model tokens before the large model runs.
    sampling: `sd.Greedy()` (default) or `sd.Sampling(...)` for both models' tokens
      (the paper's sampling variant uses top_p=0.8).
    batch_policy: "wait" or "sync" (module doc).
    small_inputs: the small model's input if it differs (default: the large's).
    exact: large-model calls of `engine.EXACT_WIDTH` tokens (as `generate(exact=True)`),
      so fallback_threshold=1.0 is bitwise the large model's greedy output. None: greedy.
    prompt_lengths: a decoder-only model's prompt lengths [B] (`sd.decode`).
  Returns:
    DecodeOutput(tokens [B, max_new_tokens], lengths [B], counters; `.stats` mapping).
  """
  method = BiLD(small, fallback_threshold=fallback_threshold,
                       rollback_threshold=rollback_threshold, max_small_steps=max_small_steps,
                       batch_policy=batch_policy, small_inputs=small_inputs,
                       exact=exact)
  return decode(large, method, inputs, max_new_tokens, sampling, rng, eos_id,
                prompt_lengths)


def blockwise_generate(model: Model, heads: Heads, inputs, max_new_tokens: int = 64,
                       top_k: int = 1, rescoring: str | None = None, num_drafts: int = 1,
                       rescoring_weight: float = 1.0, rescorer: Any = None,
                       sampling: sampling_lib.SamplingSettings | None = None, rng=None,
                       eos_id: int | None = None, oracle: bool = False,
                       accept: AcceptRule | None = None, exact: bool | None = None,
                       prompt_lengths=None) -> DecodeOutput:
  """Blockwise parallel decoding of `inputs` [B, Le] with `heads` on `model`.

  Args:
    top_k: candidates per head in the lattice (1: each head's argmax).
    rescoring: None, "ngram" (`rescorer` = `lattice.NGramLM`) or "neural" (`rescorer` =
      a small `Model` with the same vocabulary, e.g. the demo drafter).
    num_drafts: p best lattice paths verified together in one call (parallel BPD).
    rescoring_weight: the weight of the rescorer's log-probs against the heads'.
    sampling: greedy (default; output == `generate(model)`) or `Sampling(...)`
      (exact: the output has the model's distribution).
    oracle: also compute the oracle top-k block efficiency (one extra teacher-forced pass).
    accept: another acceptance rule (research; see `acceptance`).
    exact: verifier calls of `engine.EXACT_WIDTH` tokens (as `generate(exact=True)`), so
      greedy output is bitwise the baseline's on any backend. None: greedy, if it fits.
    prompt_lengths: a decoder-only model's prompt lengths [B] (`sd.decode`).
  """
  method = Blockwise(heads, top_k=top_k, num_drafts=num_drafts, rescoring=rescoring,
                            rescorer=rescorer, rescoring_weight=rescoring_weight,
                            oracle=oracle, accept=accept, exact=exact)
  return decode(model, method, inputs, max_new_tokens, sampling, rng, eos_id,
                prompt_lengths)
