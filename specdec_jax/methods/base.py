"""What every method value is: `Method`, and the field helpers its settings are written with.

A method is a frozen dataclass holding the settings of one algorithm; `decode` runs it:

    sd.decode(target, sd.Autoregressive(), inputs)
    sd.decode(target, sd.Speculative(drafter, gamma=4), inputs, sampling=..., rng=key)
    sd.decode(large, sd.BiLD(small, fallback_threshold=0.6), inputs)
    sd.decode(target, sd.Blockwise(heads, top_k=3, num_drafts=2), inputs)

Each method is one module of `methods/` holding its value and its wiring onto the round
engine (`autoregressive`, `speculative`, `bild`, `blockwise`; beam search, a loop of its
own, `beam`). The value builds the two things the round engine needs (see `engine`): a
`RoundConfig` (`method.round_config(target, max_new_tokens, sampling, eos_id)`) and a
proposer (`method.proposer(target, sampling)`). `decode` checks the request, builds
both, and runs ONE jitted `engine.run`; the `*_generate` functions are calls of it.

The value is the method's one home: beside its settings it names itself (`name`, the
`specdec --method` and the statistics' "method", written there only), says what it is
(`summary`), what `--drafter` means for it (`drafter_role`), which readable statistics it
reports (`statistics`, computed by `rounds.stats`), its flags (`setting(flag=, cli_help=,
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
from typing import ClassVar, Mapping

import jax
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax.errors import InputError
from specdec_jax.models.model import Model
from specdec_jax.rounds import acceptance, engine, requests
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.rounds.phases import Proposer

Array = jax.Array


def check_exact(exact) -> None:
  if exact is not None and not isinstance(exact, bool):
    raise InputError(f"exact must be True, False or None (greedy: exact), got {exact!r}")


def check_accept(accept) -> None:
  if accept is not None:
    acceptance.check_rule(accept)


def check_number(value, name: str) -> float:
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
  """What every method value provides to `decode` (`sd.Autoregressive`, `sd.Speculative`, ...).

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
    derived_statistics: readable statistics its output computes beyond `stats.summarize`'s
      (speculative beam search's steps per target call); the reports show them too.
    shorthand: the settings of the bench's "A:B" short form (`--bild 0.5:3`); a method with
      one has a flag in the lab's bench.
    bench_flag: that flag where --NAME reads badly (`--heads-lattice`); None: --NAME.
  """

  name: ClassVar[str] = "method"
  summary: ClassVar[str] = ""
  drafter_role: ClassVar[str | None] = None
  greedy_only: ClassVar[bool] = False
  with_drafter_for: ClassVar[str | None] = None
  statistics: ClassVar[tuple[str, ...] | None] = None
  derived_statistics: ClassVar[tuple[str, ...]] = ()
  shorthand: ClassVar[tuple[str, ...]] = ()
  bench_flag: ClassVar[str | None] = None

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
    sampled decoding (`Autoregressive`) for the round engine's methods; beam search
    (`sd.Beam` of the same beams and penalty) for a beam method. An exact method's greedy
    output is its baseline's bitwise; `--compare`, the lab's tables and the tests'
    exactness checks read it here. Each method says its own (this module cannot import
    `Autoregressive`, which subclasses `Method`)."""
    raise NotImplementedError(f"{type(self).__name__}.baseline(): return the method its "
                              "output is measured against (sd.Autoregressive() for a method "
                              "on the round engine)")

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
