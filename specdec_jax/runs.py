"""Decode methods for the tools: the core method values (`sd.Speculative`, ...) plus what a
tool needs around them (the sampling mode, a display name for the drafter / heads, a
report of the settings). Every tool builds one and runs it; none dispatches itself.

    method = Speculative(drafter=drafter, gamma=4)          # or Baseline(sampling=sd.Sampling())
    out = method.decode(target, encoder_tokens, max_new_tokens=32, rng=key)   # a DecodeOutput
    method.value()      # sd.Speculative(drafter, gamma=4): what `sd.decode` runs
    corpus = decode_corpus(method, target, padded_batches(inputs, 8), max_new_tokens=32)
    corpus.stats        # stats.merge_outputs over the real rows of every batch
    corpus.token_rows() # each real row's tokens, cut at its length

The tools' classes are DERIVED from the core dataclasses: their settings fields are the
core's (`methods.settings_fields`: defaults, checks and docs included), their
model fields the core's models, plus `sampling` and a `*_name` for reports. A setting
added to `sd.BiLD` is a field here, a CLI flag (`cli.method_args`) and a bench option
with no other change. Settings the tools leave at their defaults: research hooks
(`accept`) and per-call inputs (a drafter's own encoder tokens).

`sampling` (greedy or sd.Sampling) and `exact` (None: the library's default, exact
greedy calls; False: each call at its natural width, faster on CPU) are common to all.
A method the core does not know is one subclass of `DecodeMethod` with its own `decode`
(the CLI, benchmarks, results and evaluation take any method as it is, and report its
`settings()`).

Statistics of several batches are aggregated once, here, with `stats.merge_outputs`:
alpha = sum(beta_sum) / sum(beta_count), target_calls counted per row (so
tokens_per_target_call is the block efficiency: 1.0 for the baseline).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar, Mapping, Sequence

import jax
import numpy as np

from specdec_jax import methods as core
from specdec_jax import sampling as sampling_lib
from specdec_jax.batching import Batch
from specdec_jax.methods import Method
from specdec_jax.rounds import stats as stats_lib
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.rounds.inputs import as_rng
from specdec_jax.sharding import to_host


def finite(x) -> float | None:
  """float(x), or None for None, NaN and infinities (JSON has no NaN)."""
  if x is None:
    return None
  x = float(x)
  return x if math.isfinite(x) else None


def sampling_label(sampling: sampling_lib.SamplingSettings) -> str:
  """"greedy", or "sampling Sampling(temperature=..., ...)"."""
  return "greedy" if sampling.is_greedy else f"sampling {sampling!r}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeMethod:
  """One decoding algorithm and its settings (subclasses add fields and `decode`)."""

  sampling: sampling_lib.SamplingSettings = sampling_lib.Greedy()
  exact: bool | None = None
  kind: ClassVar[str] = "method"
  uses_drafter: ClassVar[bool] = False

  def decode(self, target, encoder_tokens, *, max_new_tokens: int, rng=None,
             eos_id: int | None = None, prompt_lengths=None) -> DecodeOutput:
    """`encoder_tokens`: a decoder-only target's right-padded prompts [B, P], with
    `prompt_lengths` [B] (as `sd.decode`)."""
    raise NotImplementedError

  def settings(self) -> dict[str, Any]:
    """JSON-friendly settings: {"method": kind, <field>: value, ...}; objects (and the
    models, fields not compared) left out."""
    out: dict[str, Any] = {"method": self.kind}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if not f.compare:
        continue
      if f.name == "sampling":
        out[f.name] = repr(value)
      elif isinstance(value, (bool, int, float, str, type(None))):
        out[f.name] = value
    return out

  def describe(self) -> str:
    return f"{self.kind}, {sampling_label(self.sampling)}"


class CoreMethod(DecodeMethod):
  """A tool method whose settings are those of a core method value (`core`)."""

  core: ClassVar[type] = core.Autoregressive

  def value(self) -> Method:     # (core.Method: `core` is the class variable here)
    """The core method value (`sd.decode`'s argument) of these settings."""
    names = [f.name for f in core.settings_fields(self.core) + core.model_fields(self.core)]
    return self.core(**{n: getattr(self, n) for n in names})

  def decode(self, target, encoder_tokens, *, max_new_tokens: int, rng=None,
             eos_id: int | None = None, prompt_lengths=None) -> DecodeOutput:
    return core.decode(target, self.value(), encoder_tokens, max_new_tokens=max_new_tokens,
                       sampling=self.sampling, rng=rng, eos_id=eos_id,
                       prompt_lengths=prompt_lengths)


def derive(core_type: type, name_field: str | None = None) -> type:
  """The frozen, keyword-only dataclass of `core_type`'s settings and models for the tools:
  `sampling`, `exact`, `<name_field>` (how reports name the model fields' objects), every
  model field (not compared, not reported) and every setting (same default), checked by
  building the core value."""
  fields: list[tuple] = []
  if name_field is not None:
    fields.append((name_field, str | None, dataclasses.field(default=None)))
  for f in core.model_fields(core_type):
    fields.append((f.name, Any, dataclasses.field(default=None, compare=False, repr=False)))
  for f in core.settings_fields(core_type):
    if f.name != "exact":                      # DecodeMethod's, common to all
      fields.append((f.name, f.type, dataclasses.field(default=f.default)))

  def __post_init__(self):
    self.value()                               # the core's checks, at construction

  cls = dataclasses.make_dataclass(
      f"{core_type.__name__}Settings", fields, bases=(CoreMethod,), frozen=True, kw_only=True,
      namespace={"core": core_type, "__post_init__": __post_init__})
  cls.__module__ = __name__
  return cls


class Baseline(derive(core.Autoregressive)):  # type: ignore[misc]  # built from the core fields
  """Autoregressive decoding of the target alone (`sd.Autoregressive`, `sd.generate`)."""

  kind: ClassVar[str] = "baseline"

  def describe(self) -> str:
    return f"baseline (sd.generate), {sampling_label(self.sampling)}"


class Speculative(derive(core.Speculative, "drafter_name")):  # type: ignore[misc]  # built from the core fields
  """Speculative decoding with a drafter (`sd.Speculative`); `drafter_name`: how reports
  name the drafter ("ngram", a path, ...)."""

  kind: ClassVar[str] = "speculative"
  uses_drafter: ClassVar[bool] = True

  def describe(self) -> str:
    name = self.drafter_name or "model"
    return (f"speculative (drafter {name}, gamma {self.gamma}"
            + (", adaptive" if self.adaptive else "") + f"), {sampling_label(self.sampling)}")


class Bild(derive(core.BiLD, "small_name")):  # type: ignore[misc]  # built from the core fields
  """BiLD, the Big Little Decoder (`sd.BiLD`); the target is the large model. `small_name`:
  how reports name the small model ("aligned", "early-exit:1", a path, ...)."""

  kind: ClassVar[str] = "bild"
  uses_drafter: ClassVar[bool] = True

  def describe(self) -> str:
    return (f"bild (small {self.small_name or 'model'}, fallback {self.fallback_threshold}, "
            f"rollback {self.rollback_threshold}), {sampling_label(self.sampling)}")


class Blockwise(derive(core.Blockwise, "heads_name")):  # type: ignore[misc]  # built from the core fields
  """Blockwise parallel decoding with prediction heads (`sd.Blockwise`); `heads_name`: how
  reports name the heads."""

  kind: ClassVar[str] = "blockwise"

  def describe(self) -> str:
    extra = "".join([f", top-{self.top_k}" if self.top_k > 1 else "",
                     f", {self.num_drafts} drafts" if self.num_drafts > 1 else "",
                     f", {self.rescoring} rescoring" if self.rescoring else ""])
    return (f"blockwise ({self.heads.num_heads if self.heads is not None else '?'} heads{extra}),"
            f" {sampling_label(self.sampling)}")


class Beam(derive(core.Beam)):  # type: ignore[misc]  # built from the core fields
  """Beam search, T5X's `beam_search` (`sd.Beam`); greedy only (it is deterministic)."""

  kind: ClassVar[str] = "beam"

  def describe(self) -> str:
    return f"beam ({self.num_beams} beams, alpha {self.alpha})"


#: Every method by its `kind`.
METHODS: dict[str, type[DecodeMethod]] = {m.kind: m for m in (Baseline, Speculative, Bild,
                                                             Blockwise, Beam)}


# ----------------------------------------------------------------------------- corpora


def batch_key(rng, i: int) -> jax.Array:
  """The PRNG key of batch i: `rng` itself for batch 0 (one batch decodes exactly as
  `method.decode(rng=rng)`), fold_in(rng, i) after. `rng` may be an int seed or None (0)."""
  key = as_rng(rng)   # an int seed's key is built once and cached
  return key if i == 0 else jax.random.fold_in(key, i)


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A corpus decoded batch by batch: outputs on the host and the real rows of each."""

  outputs: tuple[DecodeOutput, ...]
  real_rows: tuple[int, ...]

  @functools.cached_property
  def stats(self) -> dict[str, Any]:
    """`stats.merge_outputs` over the real rows: one run's statistics."""
    return stats_lib.merge_outputs(self.outputs, self.real_rows)

  @functools.cached_property
  def lengths(self) -> np.ndarray:
    """int [N] tokens generated per real row (EOS included)."""
    return np.concatenate([np.asarray(o.lengths)[:r] for o, r in zip(self.outputs,
                                                                      self.real_rows, strict=True)])

  @property
  def generated(self) -> int:
    return int(self.lengths.sum())

  def tokens(self) -> np.ndarray:
    """int [N, max_new_tokens] of the real rows (0 after EOS)."""
    return np.concatenate([np.asarray(o.tokens)[:r] for o, r in zip(self.outputs,
                                                                    self.real_rows, strict=True)])

  def token_rows(self) -> list[list[int]]:
    """Each real row's tokens, cut at its length."""
    return [row[:n].tolist() for row, n in zip(self.tokens(), self.lengths, strict=True)]


def decode_corpus(method: DecodeMethod, target, batches: Sequence[Batch], *,
                  max_new_tokens: int, rng=0, eos_id: int | None = None,
                  prompt_lengths: Sequence | None = None, first_key: int = 0) -> Corpus:
  """Decode every batch with `method` (batch i with `batch_key(rng, first_key + i)`).
  `prompt_lengths`: a decoder-only target's int [B] prompt lengths of each batch;
  `first_key`: the index of the first batch in a larger corpus (one process's block)."""
  # only passed when given: a method of the tools' users may not take it
  lengths = [{} if prompt_lengths is None else {"prompt_lengths": n}
             for n in (prompt_lengths or [None] * len(batches))]
  # to_host: on a mesh spanning processes each output is gathered whole on every process
  outputs = [to_host(method.decode(target, b.tokens, max_new_tokens=max_new_tokens,
                                   rng=batch_key(rng, first_key + i), eos_id=eos_id,
                                   **lengths[i]))
             for i, b in enumerate(batches)]
  return Corpus(tuple(outputs), tuple(int(b.real) for b in batches))


# ----------------------------------------------------------------------------- report views


def totals(stats: Mapping[str, Any]) -> dict[str, Any]:
  """The statistics without their `*_per_row` entries."""
  return {k: v for k, v in stats.items() if not k.endswith("_per_row")}


#: Statistics a method reports beside the common ones (`stats_row(..., extra=)`).
EXTRA_STATS = {
    "bild": ("fallback_rate", "rollback_rate", "drafter_tokens", "target_tokens"),
    "blockwise": ("repeated_draft_rate", "mean_max_run", "oracle_tokens_per_target_call"),
}


def stats_row(stats: Mapping[str, Any], speculative: bool,
              extra: Sequence[str] = ()) -> dict[str, Any]:
  """The columns the reports show: target_calls (per row), rounds, block_efficiency
  (tokens per target call), for speculative methods alpha (clipped to [0, 1]),
  acceptance_rate, drafted, accepted, drafter_calls, and the `extra` statistics."""
  row = {"target_calls": int(stats["target_calls"]), "rounds": int(stats["rounds"]),
         "block_efficiency": finite(stats["tokens_per_target_call"])}
  if speculative:
    row.update({"alpha": float(np.clip(stats["alpha"], 0.0, 1.0)),
                "acceptance_rate": finite(stats["acceptance_rate"]),
                "drafted": int(stats["drafted"]), "accepted": int(stats["accepted"]),
                "drafter_calls": int(stats["drafter_calls"])})
  row.update({k: finite(stats[k]) for k in extra if k in stats})
  return row
