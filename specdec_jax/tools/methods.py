"""Decode methods as values: every tool builds one and runs it; none dispatches itself.

    method = Speculative(drafter=drafter, gamma=4)          # or Baseline(sampling=sd.Sampling())
    out = method.decode(target, encoder_tokens, max_new_tokens=32, rng=key)   # a DecodeOutput
    corpus = decode_corpus(method, target, padded_batches(inputs, 8), max_new_tokens=32)
    corpus.stats        # stats.merge_outputs over the real rows of every batch
    corpus.token_rows() # each real row's tokens, cut at its length

A method is a frozen dataclass holding the settings of one decoding algorithm, with
`decode(target, encoder_tokens, *, max_new_tokens, rng, eos_id) -> DecodeOutput`;
`sampling` (greedy or sd.Sampling) and `exact` (None: the library's default, exact
greedy calls; False: each call at its natural width, faster on CPU) are common to all. To add one (BiLD with
fallback / rollback thresholds, blockwise decoding with prediction heads) write one
more subclass and add it to `METHODS`: the CLI, benchmarks, results and evaluation
take any method as it is, and report its `settings()`.

Statistics of several batches are aggregated once, here, with `stats.merge_outputs`:
alpha = sum(beta_sum) / sum(beta_count), target_calls counted per row (so
tokens_per_target_call is the block efficiency: 1.0 for the baseline).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Mapping, Sequence

import jax
import numpy as np

from specdec_jax import sampling as sampling_lib
from specdec_jax.decoding import stats as stats_lib
from specdec_jax.decoding.autoregressive import generate
from specdec_jax.decoding.bild import bild_generate
from specdec_jax.decoding.blockwise import blockwise_generate
from specdec_jax.decoding.buffer import DecodeOutput
from specdec_jax.decoding.inputs import as_rng
from specdec_jax.decoding.speculative import speculative_generate
from specdec_jax.tools.batching import Batch
from specdec_jax.tools.report import finite


def sampling_label(sampling: sampling_lib.SamplingMethod) -> str:
  """"greedy", or "sampling Sampling(temperature=..., ...)"."""
  return "greedy" if sampling.is_greedy else f"sampling {sampling!r}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeMethod:
  """One decoding algorithm and its settings (subclasses add fields and `decode`)."""

  sampling: sampling_lib.SamplingMethod = sampling_lib.Greedy()
  exact: bool | None = None
  kind: ClassVar[str] = "method"
  uses_drafter: ClassVar[bool] = False

  def decode(self, target, encoder_tokens, *, max_new_tokens: int, rng=None,
             eos_id: int | None = None) -> DecodeOutput:
    raise NotImplementedError

  def settings(self) -> dict[str, Any]:
    """JSON-friendly settings: {"method": kind, <field>: value, ...}; objects left out."""
    out: dict[str, Any] = {"method": self.kind}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name == "sampling":
        out[f.name] = repr(value)
      elif isinstance(value, (bool, int, float, str, type(None))):
        out[f.name] = value
    return out

  def describe(self) -> str:
    return f"{self.kind}, {sampling_label(self.sampling)}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Baseline(DecodeMethod):
  """Autoregressive decoding of the target alone (`sd.generate`)."""

  kind: ClassVar[str] = "baseline"

  def decode(self, target, encoder_tokens, *, max_new_tokens: int, rng=None,
             eos_id: int | None = None) -> DecodeOutput:
    return generate(target, encoder_tokens, max_new_tokens=max_new_tokens,
                    sampling=self.sampling, rng=rng, eos_id=eos_id, exact=self.exact)

  def describe(self) -> str:
    return f"baseline (sd.generate), {sampling_label(self.sampling)}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Speculative(DecodeMethod):
  """Speculative decoding with a drafter (`sd.speculative_generate`).

  Attributes:
    drafter: a Model or a drafter object (not compared, not reported).
    drafter_name: how reports name the drafter ("ngram", a path, ...).
    gamma: drafts per round (the maximum with `adaptive`).
    lenience: 1 is exact; below 1 is lossy.
    adaptive: per-row gamma in 1..gamma chosen on device.
  """

  drafter: Any = dataclasses.field(compare=False, repr=False)
  drafter_name: str | None = None
  gamma: int = 5
  lenience: float = 1.0
  adaptive: bool = False
  kind: ClassVar[str] = "speculative"
  uses_drafter: ClassVar[bool] = True

  def decode(self, target, encoder_tokens, *, max_new_tokens: int, rng=None,
             eos_id: int | None = None) -> DecodeOutput:
    return speculative_generate(target, self.drafter, encoder_tokens, gamma=self.gamma,
                                max_new_tokens=max_new_tokens, sampling=self.sampling, rng=rng,
                                eos_id=eos_id, lenience=self.lenience,
                                adaptive=self.adaptive or None, exact=self.exact)

  def describe(self) -> str:
    name = self.drafter_name or "model"
    return (f"speculative (drafter {name}, gamma {self.gamma}"
            + (", adaptive" if self.adaptive else "") + f"), {sampling_label(self.sampling)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bild(DecodeMethod):
  """BiLD, the Big Little Decoder (`sd.bild_generate`); the target is the large model.

  Attributes:
    small: the small model (a Model or `sd.early_exit(target, k)`; not compared).
    small_name: how reports name it ("aligned", "early-exit:1", a path, ...).
    fallback_threshold, rollback_threshold, max_small_steps, batch_policy: as
      `sd.bild_generate`.
  """

  small: Any = dataclasses.field(compare=False, repr=False)
  small_name: str | None = None
  fallback_threshold: float = 0.5
  rollback_threshold: float = 5.0
  max_small_steps: int = 10
  batch_policy: str = "wait"
  kind: ClassVar[str] = "bild"
  uses_drafter: ClassVar[bool] = True

  def decode(self, target, encoder_tokens, *, max_new_tokens: int, rng=None,
             eos_id: int | None = None) -> DecodeOutput:
    return bild_generate(target, self.small, encoder_tokens,
                         fallback_threshold=self.fallback_threshold,
                         rollback_threshold=self.rollback_threshold,
                         max_small_steps=self.max_small_steps, max_new_tokens=max_new_tokens,
                         sampling=self.sampling, rng=rng, eos_id=eos_id,
                         batch_policy=self.batch_policy, exact=self.exact)

  def describe(self) -> str:
    return (f"bild (small {self.small_name or 'model'}, fallback {self.fallback_threshold}, "
            f"rollback {self.rollback_threshold}), {sampling_label(self.sampling)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Blockwise(DecodeMethod):
  """Blockwise parallel decoding with prediction heads (`sd.blockwise_generate`).

  Attributes:
    heads: `sd.Heads` for the target (not compared); heads_name: how reports name them.
    top_k, num_drafts, rescoring, rescoring_weight, oracle: as `sd.blockwise_generate`.
    rescorer: the n-gram LM or small model of `rescoring` (not compared).
  """

  heads: Any = dataclasses.field(compare=False, repr=False)
  heads_name: str | None = None
  top_k: int = 1
  num_drafts: int = 1
  rescoring: str | None = None
  rescorer: Any = dataclasses.field(default=None, compare=False, repr=False)
  rescoring_weight: float = 1.0
  oracle: bool = False
  kind: ClassVar[str] = "blockwise"

  def decode(self, target, encoder_tokens, *, max_new_tokens: int, rng=None,
             eos_id: int | None = None) -> DecodeOutput:
    return blockwise_generate(target, self.heads, encoder_tokens, max_new_tokens=max_new_tokens,
                              top_k=self.top_k, rescoring=self.rescoring,
                              num_drafts=self.num_drafts,
                              rescoring_weight=self.rescoring_weight, rescorer=self.rescorer,
                              sampling=self.sampling, rng=rng, eos_id=eos_id,
                              oracle=self.oracle, exact=self.exact)

  def describe(self) -> str:
    extra = "".join([f", top-{self.top_k}" if self.top_k > 1 else "",
                     f", {self.num_drafts} drafts" if self.num_drafts > 1 else "",
                     f", {self.rescoring} rescoring" if self.rescoring else ""])
    return (f"blockwise ({self.heads.num_heads if self.heads is not None else '?'} heads{extra}),"
            f" {sampling_label(self.sampling)}")


#: Every method by its `kind`.
METHODS: dict[str, type[DecodeMethod]] = {m.kind: m for m in (Baseline, Speculative, Bild,
                                                             Blockwise)}


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
                                                                      self.real_rows)])

  @property
  def generated(self) -> int:
    return int(self.lengths.sum())

  def tokens(self) -> np.ndarray:
    """int [N, max_new_tokens] of the real rows (0 after EOS)."""
    return np.concatenate([np.asarray(o.tokens)[:r] for o, r in zip(self.outputs,
                                                                    self.real_rows)])

  def token_rows(self) -> list[list[int]]:
    """Each real row's tokens, cut at its length."""
    return [row[:n].tolist() for row, n in zip(self.tokens(), self.lengths)]


def decode_corpus(method: DecodeMethod, target, batches: Sequence[Batch], *,
                  max_new_tokens: int, rng=0, eos_id: int | None = None) -> Corpus:
  """Decode every batch with `method` (batch i with `batch_key(rng, i)`)."""
  outputs = [jax.device_get(method.decode(target, b.tokens, max_new_tokens=max_new_tokens,
                                          rng=batch_key(rng, i), eos_id=eos_id))
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
