"""Decoding methods as values: the settings of one algorithm each, run by `decode.decode`.

A method is a frozen dataclass holding the settings of one algorithm; `decode` runs it:

    sd.decode(target, sd.Autoregressive(), encoder_tokens)
    sd.decode(target, sd.Speculative(drafter, gamma=4), encoder_tokens, sampling=..., rng=key)
    sd.decode(large, sd.BiLD(small, fallback_threshold=0.6), encoder_tokens)
    sd.decode(target, sd.Blockwise(heads, top_k=3, num_drafts=2), encoder_tokens)

Each value builds the two things the round engine needs (see `engine`): a
`RoundConfig` (`method.round_config(target, max_new_tokens, sampling, eos_id)`) and a
proposer (`method.proposer(target, sampling)`). `decode` checks the request, builds
both, and runs ONE jitted `engine.run`; the `*_generate` functions are calls of it.

Settings are checked when the value is made (a bad gamma fails at `sd.Speculative(...)`,
before any model is touched). The values are `flax.struct` dataclasses: the models they
carry (drafter, small model, heads, rescorer, a drafter's own input) are pytree leaves,
the settings are static, so a method value passes through `jax.jit`; equality and hash
compare the settings only (two runs with equal settings compile to the same program for
the same shapes).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import as_drafter
from specdec_jax.drafters.head_drafter import RESCORING, HeadDrafter
from specdec_jax.drafters.heads import Heads
from specdec_jax.drafters.loop import NoProposals
from specdec_jax.errors import InputError
from specdec_jax.methods import autoregressive, bild, blockwise, speculative
from specdec_jax.methods.adaptive import AdaptiveGamma
from specdec_jax.models.model import Model
from specdec_jax.rounds import engine, inputs
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.rounds.phases import AcceptRule, Proposer

Array = jax.Array


#: Upper bounds of the size settings: generous, but each keeps a mistyped value (gamma=100000
#: compiled for minutes into gigabytes) a clear error. gamma: a round keeps the drafter's
#: distributions q [B, gamma, V] and verifies gamma + 1 tokens in one call, while a round
#: gains (1 - alpha^(gamma+1)) / (1 - alpha) < 1 / (1 - alpha) tokens (Leviathan et al.):
#: at alpha 0.9, gamma 64 is within 0.1% of that bound; papers use 3 to 10. top_k,
#: num_drafts: the lattice keeps [B, heads, top_k] candidates and one verifier call holds
#: 1 + num_drafts * heads tokens.
MAX_GAMMA = 64
MAX_LATTICE_K = 64
MAX_NUM_DRAFTS = 64


def _check_exact(exact) -> None:
  if exact is not None and not isinstance(exact, bool):
    raise InputError(f"exact must be True, False or None (greedy: exact), got {exact!r}")


def _check_accept(accept) -> None:
  if accept is not None and not callable(accept):
    raise InputError(f"accept must be an acceptance rule (see rounds.acceptance), "
                     f"got {accept!r}")


def _check_number(value, name: str) -> float:
  if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
    raise InputError(f"{name} must be a number, got {value!r}")
  return float(value)


def setting(default, choices: tuple | None = None, research: bool = False):
  """A static field: part of the treedef (and of equality / hash), never traced.

  `choices`: the values it takes (the CLI offers them); `research`: a hook the tools
  leave at its default (another acceptance rule).
  """
  metadata = {"choices": choices, "research": research}
  return struct.field(pytree_node=False, default=default, metadata=metadata)


def carried(default=None, per_call: bool = False):
  """A field holding models or arrays: a pytree leaf, left out of equality and hash.

  `per_call`: an input of one call (a drafter's own encoder tokens), not a setting.
  """
  return struct.field(default=default, compare=False, metadata={"per_call": per_call})


class Method:
  """What every method value provides to `decode` (the subclasses below)."""

  def proposer(self, target: Model, sampling: sampling_lib.SamplingSettings) -> Proposer:
    raise NotImplementedError

  def round_config(self, target: Model, max_new_tokens: int,
                   sampling: sampling_lib.SamplingSettings, eos_id: int) -> engine.RoundConfig:
    raise NotImplementedError

  def proposer_inputs(self, proposer: Proposer, encoder_tokens: Array,
                      max_new_tokens: int) -> Array | None:
    """The proposer's own encoder input [B, Le'] (None: the target's)."""
    return None

  def finish(self, target: Model, encoder_tokens: Array, out: DecodeOutput,
             prompt_lengths: Array | None = None) -> DecodeOutput:
    """Work after the loop (blockwise decoding's oracle); the output as is by default."""
    return out

  def run(self, target: Model, encoder_tokens: Array, max_new_tokens: int,
          sampling: sampling_lib.SamplingSettings, rng, eos_id: int,
          prompt_lengths: Array | None) -> DecodeOutput:
    """The checked request through the round engine (a method with a loop of its own,
    such as beam search, overrides this)."""
    proposer = self.proposer(target, sampling)
    config = self.round_config(target, max_new_tokens, sampling, eos_id)
    proposer_inputs = self.proposer_inputs(proposer, encoder_tokens, max_new_tokens)
    out = engine.run(target, proposer, encoder_tokens, proposer_inputs,
                     inputs.as_rng(rng, sampling), config=config, prompt_lengths=prompt_lengths)
    return self.finish(target, encoder_tokens, out, prompt_lengths)


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

  exact: bool | None = setting(None)

  def __post_init__(self):
    _check_exact(self.exact)

  def proposer(self, target, sampling):
    return NoProposals(target.config.vocab_size)

  def round_config(self, target, max_new_tokens, sampling, eos_id):
    return autoregressive.round_config(max_new_tokens, sampling, eos_id, self.exact)


@struct.dataclass
class Speculative(Method):
  """Speculative decoding (Leviathan et al.): a drafter proposes, the target verifies.

  Attributes:
    drafter: a `Model` of the target's kind (T5 or decoder-only) and vocabulary, a drafter
      of `specdec_jax.drafters` (`sd.NGramDrafter`, `sd.PromptLookupDrafter`), or any
      proposer.
    gamma: drafts per round (the maximum, with `adaptive`), >= 1.
    adaptive: True or an `sd.AdaptiveGamma`: per-row gamma in 1..gamma chosen on device.
    lenience: 1 is exact; in (0, 1) is their lossy variant (reported as lossy).
    drafter_encoder_tokens: int [B, Le'] the drafter's input if it differs from the
      target's (None: the same; a decoder-only drafter continues the target's prompt).
    accept: another acceptance rule (see `acceptance`), for research; None: the exact
      rule `acceptance.SpeculativeSampling(lenience)`.
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

  drafter: Any = carried()
  gamma: int = setting(5)
  adaptive: AdaptiveGamma | bool | None = setting(None)
  lenience: float = setting(1.0)
  drafter_encoder_tokens: Any = carried(per_call=True)
  accept: AcceptRule | None = setting(None, research=True)
  exact: bool | None = setting(None)

  def __post_init__(self):
    inputs.check_positive_int(self.gamma, "gamma", MAX_GAMMA,
                              "drafts per round: a round gains fewer than 1 / (1 - alpha) "
                              "tokens, so longer drafts only add cost")
    lenience = _check_number(self.lenience, "lenience")
    if not 0.0 < lenience <= 1.0:
      raise InputError(f"lenience must be in (0, 1] (1 = exact), got {self.lenience!r}")
    if self.adaptive is not None and not isinstance(self.adaptive, (bool, AdaptiveGamma)):
      raise InputError(f"adaptive must be True, False, None or an sd.AdaptiveGamma, "
                       f"got {self.adaptive!r}")
    _check_accept(self.accept)
    _check_exact(self.exact)

  def proposer(self, target, sampling):
    if self.drafter is None:
      raise InputError("sd.Speculative needs a drafter: a Model with the target's vocabulary "
                       "or a drafter of specdec_jax.drafters")
    return speculative.proposer(self.drafter, target, self.gamma, self.adaptive)

  def round_config(self, target, max_new_tokens, sampling, eos_id):
    return speculative.round_config(self.gamma, max_new_tokens, sampling, eos_id,
                                    self.lenience, self.accept, self.exact)

  def proposer_inputs(self, proposer, encoder_tokens, max_new_tokens):
    return _drafter_inputs(proposer, self.drafter_encoder_tokens, encoder_tokens, max_new_tokens)


def _drafter_inputs(proposer, own_tokens, encoder_tokens, max_new_tokens):
  """The drafting model's input [B, Le']: its own tokens if given, else the target's;
  checked against its config when the proposer wraps a `ModelDrafter`. A decoder-only
  drafter continues the target's own prompt (None: the target's)."""
  model_drafter = speculative.model_drafter(proposer)
  if model_drafter is not None and model_drafter.model.is_decoder_only:
    if own_tokens is not None:
      raise InputError("a decoder-only drafter continues the target's prompt: drop the "
                       "drafter's own input tokens")
    inputs.check_prompt(encoder_tokens, model_drafter.model.config, max_new_tokens,
                        jnp.ones((encoder_tokens.shape[0],), jnp.int32))
    return None
  tokens = encoder_tokens if own_tokens is None else own_tokens
  if own_tokens is not None and np.shape(own_tokens)[:1] != np.shape(encoder_tokens)[:1]:
    raise InputError(f"the drafting model's own input tokens have {np.shape(own_tokens)[:1]} "
                     f"rows, the target's {np.shape(encoder_tokens)[:1]}: one row per row")
  if model_drafter is not None:
    return inputs.check_request(tokens, model_drafter.model.config, max_new_tokens)
  return tokens


@struct.dataclass
class BiLD(Method):
  """BiLD, the Big Little Decoder (Kim et al. 2023); the target is the large model. Lossy
  (`stats["lossy"]`), except at fallback_threshold=1.0: the large model's output, exactly.

  Attributes:
    small: a `Model` of the large one's kind with the same vocabulary, or
      `sd.early_exit(large, k)`.
    fallback_threshold: in [0, 1]; the small model hands over when max p_S <= it.
    rollback_threshold: > 0; roll back a small token y when -log p_L(y) > it (inf: never).
    max_small_steps: most consecutive small-model tokens before the large model runs.
    batch_policy: "wait" (each row as if alone) or "sync" (see `bild`).
    small_encoder_tokens: int [B, Le'] the small model's input if it differs.
    exact: large-model calls of `engine.EXACT_WIDTH` tokens: fallback_threshold=1.0 is
      then bitwise the large model's greedy output. None: for greedy decoding.

  Example::

      >>> import specdec_jax as sd, numpy as np
      >>> large = sd.load("config:t5_1_1_tiny")
      >>> out = sd.decode(large, sd.BiLD(sd.early_exit(large, 1), fallback_threshold=0.6),
      ...                 np.array([[5, 6, 7, 1]]), max_new_tokens=4)
      >>> bool(out.stats["lossy"])
      True
      >>> sd.BiLD(None, batch_policy="later")
      Traceback (most recent call last):
      ...
      specdec_jax.errors.InputError: batch_policy must be one of ('wait', 'sync'), got 'later'
  """

  small: Any = carried()
  fallback_threshold: float = setting(0.5)
  rollback_threshold: float = setting(5.0)
  max_small_steps: int = setting(10)
  batch_policy: str = setting("wait", choices=bild.BATCH_POLICIES)
  small_encoder_tokens: Any = carried(per_call=True)
  exact: bool | None = setting(None)

  def __post_init__(self):
    bild.check_thresholds(self.fallback_threshold, self.rollback_threshold,
                          self.max_small_steps)
    bild.check_batch_policy(self.batch_policy)
    _check_exact(self.exact)

  def proposer(self, target, sampling):
    if self.small is None:
      raise InputError("sd.BiLD needs the small model: a Model with the large model's "
                       "vocabulary or sd.early_exit(large, k)")
    return bild.proposer(self.small, target, self.fallback_threshold, self.batch_policy)

  def round_config(self, target, max_new_tokens, sampling, eos_id):
    return bild.round_config(self.fallback_threshold, self.rollback_threshold,
                             self.max_small_steps, max_new_tokens, sampling, eos_id,
                             self.batch_policy, as_drafter(self.small, target).kind, self.exact)

  def proposer_inputs(self, proposer, encoder_tokens, max_new_tokens):
    return _drafter_inputs(proposer, self.small_encoder_tokens, encoder_tokens, max_new_tokens)


@struct.dataclass
class Blockwise(Method):
  """Blockwise parallel decoding (Stern et al. 2018; Kim et al. 2024): prediction heads on
  the target draft, the target verifies. Greedy output is the target's.

  Attributes:
    heads: `sd.Heads` for the target (`sd.init_heads`, `sd.load_heads`).
    top_k: candidates per head in the lattice (1: each head's argmax).
    num_drafts: the p best lattice paths verified together in one call (parallel BPD).
    rescoring: None, "ngram" (rescorer: `lattice.NGramLM`) or "neural" (rescorer: a small
      `Model` with the same vocabulary).
    rescorer: the n-gram LM or model of `rescoring`.
    rescoring_weight: the weight of the rescorer's log-probs against the heads'.
    oracle: also count the oracle top-k block efficiency (one teacher-forced pass).
    accept: another acceptance rule (research); it also picks the winning draft when
      `num_drafts > 1`. None: `acceptance.SpeculativeSampling()`.
    exact: verifier calls of `engine.EXACT_WIDTH` tokens. None: greedy, if it fits.

  Example::

      >>> import specdec_jax as sd, numpy as np
      >>> model = sd.load("config:t5_1_1_tiny")
      >>> heads = sd.init_heads(model, 3)
      >>> out = sd.decode(model, sd.Blockwise(heads), np.array([[5, 6, 7, 1]]),
      ...                 max_new_tokens=4)
      >>> out.lengths.shape
      (1,)
  """

  heads: Any = carried()
  top_k: int = setting(1)
  num_drafts: int = setting(1)
  rescoring: str | None = setting(None, choices=RESCORING)
  rescorer: Any = carried()
  rescoring_weight: float = setting(1.0)
  oracle: bool = setting(False)
  accept: AcceptRule | None = setting(None, research=True)
  exact: bool | None = setting(None)

  def __post_init__(self):
    inputs.check_positive_int(self.top_k, "top_k", MAX_LATTICE_K, "lattice candidates per head")
    inputs.check_positive_int(self.num_drafts, "num_drafts", MAX_NUM_DRAFTS,
                              "drafts verified together in one target call")
    blockwise.check_rescoring(self.rescoring, self.rescorer, self.num_drafts)
    _check_number(self.rescoring_weight, "rescoring_weight")
    if not isinstance(self.oracle, bool):
      raise InputError(f"oracle must be True or False, got {self.oracle!r}")
    _check_accept(self.accept)
    _check_exact(self.exact)

  def proposer(self, target, sampling):
    inputs.check_heads_value(self.heads)
    if not isinstance(self.heads, Heads):
      raise InputError(f"sd.Blockwise needs the target's prediction heads (sd.Heads from "
                       f"sd.init_heads / sd.load_heads), got {type(self.heads).__name__}")
    blockwise.check_settings(target, self.heads, self.top_k, self.num_drafts, self.rescoring,
                             self.rescorer, sampling)
    neural = as_drafter(self.rescorer, target) if self.rescoring == "neural" else None
    return HeadDrafter(target, self.heads, lm=self.rescorer if self.rescoring == "ngram"
                       else None, rescorer=neural, top_k=self.top_k,
                       num_drafts=self.num_drafts, rescoring=self.rescoring,
                       weight=float(self.rescoring_weight))

  def round_config(self, target, max_new_tokens, sampling, eos_id):
    return blockwise.round_config(self.heads, max_new_tokens, sampling, eos_id, self.top_k,
                                  self.num_drafts, self.rescoring, self.oracle, self.accept,
                                  self.exact)

  def finish(self, target, encoder_tokens, out, prompt_lengths=None):
    if not self.oracle:
      return out
    calls = blockwise.oracle_calls(target, self.heads, encoder_tokens, out.tokens, out.lengths,
                                   self.top_k, prompt_lengths)
    return out.replace(counters=out.counters.replace(oracle_calls=calls))




def settings_fields(method_type: type) -> tuple:
  """The `dataclasses.Field`s of a method's settings (static, not research hooks): what
  the tools, the CLI and the bench expose."""
  return tuple(f for f in dataclasses.fields(method_type)
               if not f.metadata.get("pytree_node", True) and not f.metadata.get("research"))


def model_fields(method_type: type) -> tuple:
  """The fields that carry models (drafter, small, heads, rescorer), not per-call inputs."""
  return tuple(f for f in dataclasses.fields(method_type)
               if f.metadata.get("pytree_node", True) and not f.metadata.get("per_call"))


def field_docs(method_type: type) -> dict[str, str]:
  """{field: its description} from the "Attributes:" of the class docstrings (a subclass's
  own first, then its bases')."""
  docs: dict[str, str] = {}
  for cls in method_type.__mro__[::-1]:
    name, indent = None, None
    text = (cls.__dict__.get("__doc__") or "").split("Attributes:", 1)
    for line in (text[1].split("\n\n", 1)[0] if len(text) > 1 else "").splitlines()[1:]:
      head, sep, rest = line.strip().partition(": ")
      indent = len(line) - len(line.lstrip()) if indent is None else indent
      if sep and head.isidentifier() and len(line) - len(line.lstrip()) == indent:
        name = head
        docs[name] = rest
      elif name is not None and line.strip():
        docs[name] += " " + line.strip()
  return docs
