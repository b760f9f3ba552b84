"""Decoding methods as values: the settings of one algorithm each, run by `decode.decode`.

A method is a frozen dataclass holding the settings of one algorithm; `decode` runs it:

    sd.decode(target, sd.Autoregressive(), inputs)
    sd.decode(target, sd.Speculative(drafter, gamma=4), inputs, sampling=..., rng=key)
    sd.decode(large, sd.BiLD(small, fallback_threshold=0.6), inputs)
    sd.decode(target, sd.Blockwise(heads, top_k=3, num_drafts=2), inputs)

Each value builds the two things the round engine needs (see `engine`): a
`RoundConfig` (`method.round_config(target, max_new_tokens, sampling, eos_id)`) and a
proposer (`method.proposer(target, sampling)`). `decode` checks the request, builds
both, and runs ONE jitted `engine.run`; the `*_generate` functions are calls of it.

The value is the method's one home: beside its settings it names itself (`name`, the
`specdec --method` and the statistics' "method"), says what it is (`summary`), what
`--drafter` means for it (`drafter_role`), which readable statistics it reports
(`statistics`, computed by `rounds.stats`), its flags (`setting(flag=, cli_help=,
short=)`, `carried(flag=)`) and its bench shorthand (`shorthand`). The CLI, the runs of
`specdec_jax.runs` and the lab derive everything from these: a new method is one module
(its value and its wiring) and its docs page.

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
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import as_drafter, protocol
from specdec_jax.drafters.head_drafter import RESCORING, HeadDrafter
from specdec_jax.drafters.heads import Heads
from specdec_jax.drafters.loop import NoProposals
from specdec_jax.errors import InputError
from specdec_jax.methods import autoregressive, bild, blockwise, speculative
from specdec_jax.methods.adaptive import AdaptiveGamma
from specdec_jax.models.model import Model
from specdec_jax.rounds import acceptance, engine, requests
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.rounds.phases import AcceptRule, Proposer
from specdec_jax.rounds.stats import COMMON_STATS, PROPOSED, SCORED

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
  if accept is not None:
    acceptance.check_rule(accept)


def _check_number(value, name: str) -> float:
  if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
    raise InputError(f"{name} must be a number, got {value!r}")
  return float(value)


def setting(default, choices: tuple | None = None, research: bool = False, *,
            flag: str | None = None, cli_help: str | None = None, short: str | None = None):
  """A static field: part of the treedef (and of equality / hash), never traced.

  `choices`: the values it takes (the CLI offers them); `research`: a hook the tools
  leave at its default (another acceptance rule); `flag`: its command-line flag where
  `--<field-name>` would clash or read badly (`--lattice-k`); `cli_help`: its help there
  where the "Attributes:" text names Python values; `short`: its name in run labels
  ("fb" for fallback_threshold: "bild fb=0.5").
  """
  metadata = {"choices": choices, "research": research, "flag": flag, "cli_help": cli_help,
              "short": short}
  return struct.field(pytree_node=False, default=default, metadata=metadata)


def carried(default=None, per_call: bool = False, *, flag: str | None = None):
  """A field holding models or arrays: a pytree leaf, left out of equality and hash.

  `per_call`: an input of one call (a drafter's own encoder tokens), not a setting;
  `flag`: the command-line flag that names the model (`--drafter`, `--heads`).
  """
  return struct.field(default=default, compare=False,
                      metadata={"per_call": per_call, "flag": flag})


class Method:
  """What every method value provides to `decode` (the subclasses below).

  Class attributes (the method's one home; the CLI, the runs and the lab read them):
    name: the method's name: `specdec decode --method NAME`, out.stats["method"].
    summary: one line saying what it is (the CLI's help).
    drafter_role: what `--drafter` is for it ("drafter", "small model"); None: it takes
      none (the target alone, or prediction heads).
    greedy_only: deterministic (beam search): sampling is refused.
    with_drafter_for: the method whose name, given a `--drafter`, means this one
      (`--method beam --drafter X` is exact speculative beam search).
    statistics: its readable statistics (names documented in `stats.summarize`, which
      computes them; the round engine's methods start from `stats.COMMON_STATS`); None:
      every statistic (a research method).
    shorthand: the settings of the bench's "A:B" short form (`--bild 0.5:3`).
  """

  name: ClassVar[str] = "method"
  summary: ClassVar[str] = ""
  drafter_role: ClassVar[str | None] = None
  greedy_only: ClassVar[bool] = False
  with_drafter_for: ClassVar[str | None] = None
  statistics: ClassVar[tuple[str, ...] | None] = None
  shorthand: ClassVar[tuple[str, ...]] = ()

  def describe(self, names: Mapping[str, str | None] | None = None) -> str:
    """How reports name this run: its name, then its settings that differ from their
    defaults, in their short names where they have one ("bild fb=0.4"); `names`: how to
    name its models ({"drafter": "ngram"}), shown first."""
    parts = [self.name]
    parts += [f"{f}={n}" for f, n in (names or {}).items() if n]
    for f in settings_fields(type(self)):
      value = getattr(self, f.name)
      if value != f.default:
        show = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"{f.metadata.get('short') or f.name}={show}")
    return " ".join(parts)

  def baseline(self) -> Method:
    """The method whose output this one's is measured against: the target's greedy or
    sampled decoding (`Autoregressive`) by default; beam search (`sd.Beam` of the same
    beams and penalty) for a beam method. An exact method's greedy output is its
    baseline's bitwise; `--compare`, the lab's tables and the tests' exactness checks
    read it here."""
    return Autoregressive()

  def proposer(self, target: Model, sampling: sampling_lib.SamplingSettings) -> Proposer:
    raise NotImplementedError

  def round_config(self, target: Model, max_new_tokens: int,
                   sampling: sampling_lib.SamplingSettings, eos_id: int) -> engine.RoundConfig:
    raise NotImplementedError

  def proposer_inputs(self, proposer: Proposer, inputs: Array,
                      max_new_tokens: int) -> Array | None:
    """The proposer's own encoder input [B, Le'] (None: the target's)."""
    return None

  def finish(self, target: Model, inputs: Array, out: DecodeOutput,
             prompt_lengths: Array | None = None) -> DecodeOutput:
    """Work after the loop (blockwise decoding's oracle); the output as is by default."""
    return out

  def program(self, target: Model, inputs: Array, max_new_tokens: int,
              sampling: sampling_lib.SamplingSettings, rng, eos_id: int,
              prompt_lengths: Array | None) -> engine.Program:
    """The jitted program `run` calls, with its arguments (`engine.program`): what
    `sd.lower` lowers. A method with a loop of its own (beam search) overrides this and
    `run`."""
    return self._engine(engine.program, target, inputs, max_new_tokens, sampling, rng,
                        eos_id, prompt_lengths)

  def run(self, target: Model, inputs: Array, max_new_tokens: int,
          sampling: sampling_lib.SamplingSettings, rng, eos_id: int,
          prompt_lengths: Array | None) -> DecodeOutput:
    """The checked request through the round engine (`engine.run`: `program`'s call),
    then `finish`."""
    out = self._engine(engine.run, target, inputs, max_new_tokens, sampling, rng,
                       eos_id, prompt_lengths)
    return self.finish(target, inputs, out, prompt_lengths)

  def _engine(self, call, target, inputs, max_new_tokens, sampling, rng, eos_id,
              prompt_lengths):
    """`call` (`engine.run` or `engine.program`) on this method's proposer and config."""
    proposer = self.proposer(target, sampling)
    config = self.round_config(target, max_new_tokens, sampling, eos_id)
    proposer_inputs = self.proposer_inputs(proposer, inputs, max_new_tokens)
    return call(target, proposer, inputs, proposer_inputs, requests.as_rng(rng, sampling),
                config=config, prompt_lengths=prompt_lengths)


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

  def proposer_inputs(self, proposer, inputs, max_new_tokens):
    return _drafter_inputs(proposer, self.drafter_inputs, inputs, max_new_tokens)


def _drafter_inputs(proposer, own_tokens, inputs, max_new_tokens):
  """The drafting model's input [B, Le']: its own tokens if given, else the target's;
  checked against its config when the proposer wraps a `ModelDrafter`. A decoder-only
  drafter continues the target's own prompt (None: the target's)."""
  model_drafter = speculative.model_drafter(proposer)
  if model_drafter is not None and model_drafter.model.is_decoder_only:
    if own_tokens is not None:
      raise InputError("a decoder-only drafter continues the target's prompt: drop the "
                       "drafter's own input tokens")
    requests.check_prompt(inputs, model_drafter.model.config, max_new_tokens,
                        jnp.ones((inputs.shape[0],), jnp.int32))
    return None
  tokens = inputs if own_tokens is None else own_tokens
  if own_tokens is not None and np.shape(own_tokens)[:1] != np.shape(inputs)[:1]:
    raise InputError(f"the drafting model's own input tokens have {np.shape(own_tokens)[:1]} "
                     f"rows, the target's {np.shape(inputs)[:1]}: one row per row")
  if model_drafter is not None:
    return requests.check_request(tokens, model_drafter.model.config, max_new_tokens)
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
    small_inputs: int [B, Le'] the small model's input if it differs.
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

  name: ClassVar[str] = "bild"
  summary: ClassVar[str] = "BiLD: the small model (--drafter) writes, the target falls back"
  drafter_role: ClassVar[str | None] = "small model"
  statistics: ClassVar[tuple[str, ...]] = (*COMMON_STATS, "drafter_calls", *PROPOSED,
                                           "fallbacks", "fallback_rate", "rollback_rate")
  shorthand: ClassVar[tuple[str, ...]] = ("fallback_threshold", "rollback_threshold")

  small: Any = carried(flag="--drafter")
  fallback_threshold: float = setting(0.5, short="fb")
  rollback_threshold: float = setting(5.0, short="rb")
  max_small_steps: int = setting(10)
  batch_policy: str = setting(
      "wait", choices=bild.BATCH_POLICIES,
      cli_help="wait: each row decodes as if alone; sync: the first row to hand over ends "
      "every row's drafting (fewer small calls)")
  small_inputs: Any = carried(per_call=True)
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
                             self.batch_policy, protocol.kind(as_drafter(self.small, target)),
                             self.exact)

  def proposer_inputs(self, proposer, inputs, max_new_tokens):
    return _drafter_inputs(proposer, self.small_inputs, inputs, max_new_tokens)


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
    accept: another acceptance rule (research, an `sd.AcceptRule`); it also picks the
      winning draft when `num_drafts > 1`. None: `acceptance.SpeculativeSampling()`.
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

  name: ClassVar[str] = "blockwise"
  summary: ClassVar[str] = "blockwise parallel decoding: prediction heads draft"
  statistics: ClassVar[tuple[str, ...]] = (*COMMON_STATS, *PROPOSED, *SCORED,
                                           "repeated_draft_rate", "mean_max_run",
                                           "oracle_tokens_per_target_call")
  shorthand: ClassVar[tuple[str, ...]] = ("top_k", "num_drafts")

  heads: Any = carried(flag="--heads")
  top_k: int = setting(1, flag="--lattice-k", short="k")
  num_drafts: int = setting(1, short="p")
  rescoring: str | None = setting(
      None, choices=RESCORING,
      cli_help="rescore the lattice's paths with a bigram LM (ngram) or a small model "
      "(neural), given by --rescorer")
  rescorer: Any = carried(flag="--rescorer")
  rescoring_weight: float = setting(1.0)
  oracle: bool = setting(False)
  accept: AcceptRule | None = setting(None, research=True)
  exact: bool | None = setting(None)

  def __post_init__(self):
    requests.check_positive_int(self.top_k, "top_k", MAX_LATTICE_K, "lattice candidates per head")
    requests.check_positive_int(self.num_drafts, "num_drafts", MAX_NUM_DRAFTS,
                              "drafts verified together in one target call")
    blockwise.check_rescoring(self.rescoring, self.rescorer, self.num_drafts)
    _check_number(self.rescoring_weight, "rescoring_weight")
    if not isinstance(self.oracle, bool):
      raise InputError(f"oracle must be True or False, got {self.oracle!r}")
    _check_accept(self.accept)
    _check_exact(self.exact)

  def proposer(self, target, sampling):
    requests.check_heads_value(self.heads)
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

  def finish(self, target, inputs, out, prompt_lengths=None):
    if not self.oracle:
      return out
    calls = blockwise.oracle_calls(target, self.heads, inputs, out.tokens, out.lengths,
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
