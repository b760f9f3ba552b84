"""Runs: a method value, its sampling and how reports name it; a run over a corpus.

    run = Run(sd.Speculative(drafter, gamma=4), label="ngram")   # or Run(sd.Autoregressive())
    out = run.decode(target, inputs, max_new_tokens=32, rng=key)  # sd.decode: a DecodeOutput
    run.kind, run.describe()      # "speculative", "speculative drafter=ngram gamma=4, greedy"
    corpus = decode_corpus(run, target, padded_batches(inputs, 8), max_new_tokens=32)
    corpus.stats                  # stats.merge_outputs over the real rows of every batch
    corpus.token_rows()           # each real row's tokens, cut at its length

A `Run` holds no settings of its own: the method value carries its name, settings,
statistics and description (`Method`), the run adds the sampling (greedy or
`sd.Sampling`) and a `label` naming the method's model for reports ("ngram", a path,
"early-exit:1"). The CLI, the lab's benchmarks, sweeps, results and evaluation take any
run as it is and report its `settings()`; anything with the same `decode` and `settings`
(a research method of one's own) runs there too.

Statistics of several batches are aggregated once, here, with `stats.merge_outputs`:
alpha = sum(beta_sum) / sum(beta_count), target_calls counted per row (so
tokens_per_target_call is the block efficiency: 1.0 for the baseline).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, Sequence, cast

import jax
import numpy as np

from specdec_jax import experimental, sharding
from specdec_jax import methods as core
from specdec_jax import sampling as sampling_lib
from specdec_jax.batching import Batch
from specdec_jax.errors import SamplingError
from specdec_jax.methods import Method
from specdec_jax.rounds import stats as stats_lib
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.rounds.requests import as_rng
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


@dataclasses.dataclass(frozen=True)
class Run:
  """One method as the tools run and report it.

  Attributes:
    method: the method value (`sd.Speculative(drafter, gamma=4)`, ...): what `sd.decode`
      runs, with its settings (`exact` among them).
    sampling: `sd.Greedy()` or `sd.Sampling(...)`.
    label: how reports name the method's model ("ngram", a path, "early-exit:1"); None
      for a method without one or unnamed.
    mesh: the `jax.sharding.Mesh` it decodes on (`on(mesh)`: its inputs split by rows over
      "data"); None: one device.
  """

  method: Method
  sampling: sampling_lib.SamplingSettings = sampling_lib.Greedy()
  label: str | None = None
  mesh: Any = None

  def __post_init__(self):
    if not isinstance(self.method, Method):
      raise TypeError(f"Run(method): a method value (sd.Speculative(...), ...), got "
                      f"{type(self.method).__name__}")
    if self.method.greedy_only and not self.sampling.is_greedy:
      raise SamplingError(f"{self.method.name} is deterministic: it takes no sampling, "
                               f"got {self.sampling!r}")

  @property
  def kind(self) -> str:
    """The method's name ("autoregressive", "speculative", ...)."""
    return self.method.name

  @property
  def exact(self) -> bool | None:
    return getattr(self.method, "exact", None)

  @property
  def exact_mode(self) -> bool:
    """Whether it decodes in exact mode (`exact` None: the library's default, exact for
    greedy). Speedups divide by the plain baseline (`exact=False`); an exact method's
    padding cost is reported beside it, as the exact baseline over the plain one."""
    return self.sampling.is_greedy if self.exact is None else bool(self.exact)

  def on(self, mesh, keep: tuple[str, ...] = ()) -> Run:
    """This run on `mesh` (None: as it is): the models its method carries copied to every
    device (`sharding.replicate`; `keep`: model fields left as they are, e.g. BiLD's
    early-exit small model, the sharded target itself), its inputs split by rows."""
    if mesh is None:
      return self
    value = self.method
    models = {f.name: sharding.replicate(getattr(value, f.name), mesh)
              for f in core.model_fields(type(value))
              if getattr(value, f.name) is not None and f.name not in keep}
    placed = dataclasses.replace(cast(Any, value), **models)   # a flax.struct dataclass
    return dataclasses.replace(self, method=placed, mesh=mesh)

  def decode(self, target, inputs, *, max_new_tokens: int, rng=None,
             eos_id: int | None = None, prompt_lengths=None) -> DecodeOutput:
    """`sd.decode` of this run; `inputs`: T5 encoder tokens [B, Le], or a decoder-only
    target's right-padded prompts [B, P] with `prompt_lengths` [B] (on a mesh, split by
    rows over its "data" axis)."""
    if self.mesh is not None:
      inputs = sharding.shard_batch(inputs, self.mesh)
    return core.decode(target, self.method, inputs, max_new_tokens=max_new_tokens,
                       sampling=self.sampling, rng=rng, eos_id=eos_id,
                       prompt_lengths=prompt_lengths)

  def settings(self) -> dict[str, Any]:
    """JSON values: {"method": name, "label": ..., "sampling": repr, <setting>: value, ...}
    (the models themselves left out; a float that is not finite, e.g. BiLD's
    rollback_threshold inf, as None: JSON has none)."""
    out: dict[str, Any] = {"method": self.kind}
    if self.label is not None:
      out["label"] = self.label
    out["sampling"] = repr(self.sampling)
    for f in core.settings_fields(type(self.method)):
      value = getattr(self.method, f.name)
      if isinstance(value, (bool, int, float, str, type(None))):
        out[f.name] = finite(value) if isinstance(value, float) else value
    return out

  def describe(self) -> str:
    """"speculative drafter=ngram gamma=4, greedy": the method's own description (its
    settings that differ from their defaults), then the sampling."""
    names = {f.name: self.label for f in core.model_fields(type(self.method))[:1]}
    return f"{self.method.describe(names)}, {sampling_label(self.sampling)}"


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


def decode_corpus(method: Run, target, batches: Sequence[Batch], *,
                  max_new_tokens: int, rng=0, eos_id: int | None = None,
                  prompt_lengths: Sequence | None = None, first_key: int = 0) -> Corpus:
  """Decode every batch with `method` (batch i with `batch_key(rng, first_key + i)`).
  `prompt_lengths`: a decoder-only target's int [B] prompt lengths of each batch;
  `first_key`: the index of the first batch in a larger corpus (one process's block)."""
  # only passed when given: a method of the tools' users may not take it
  lengths = [{} if prompt_lengths is None else {"prompt_lengths": n}
             for n in (prompt_lengths or [None] * len(batches))]
  outputs = [method.decode(target, b.tokens, max_new_tokens=max_new_tokens,
                           rng=batch_key(rng, first_key + i), eos_id=eos_id, **lengths[i])
             for i, b in enumerate(batches)]
  # to_host: on a mesh spanning processes each output is gathered whole on every process
  return Corpus(tuple(to_host(o) for o in outputs), tuple(int(b.real) for b in batches))


def same_output(a: Corpus, b: Corpus) -> dict[str, bool]:
  """Whether two decodes of the same rows agree: {"same_tokens"}, and for beam outputs
  (`sd.BeamOutput`) {"same_beams"}: every beam and its score equal, bitwise."""
  same = {"same_tokens": bool(np.array_equal(a.tokens(), b.tokens()))}
  if all(getattr(o, "beams", None) is not None for o in (*a.outputs, *b.outputs)):
    real = lambda c, name: np.concatenate([np.asarray(getattr(o, name))[:n] for o, n in
                                           zip(c.outputs, c.real_rows, strict=True)])
    same["same_beams"] = all(np.array_equal(real(a, k), real(b, k)) for k in ("beams", "scores"))
  return same


# ----------------------------------------------------------------------------- report views


def totals(stats: Mapping[str, Any]) -> dict[str, Any]:
  """The statistics without their `*_per_row` entries."""
  return {k: v for k, v in stats.items() if not k.endswith("_per_row")}


#: Statistics that are no column of their own: the fixed ones (`stats_row`), the run's
#: sizes and log-prob, alpha's parts, per-position lists, and counts whose rates are shown.
NOT_COLUMNS = ("rows", "tokens", "rounds", "target_calls", "tokens_per_target_call",
               "log_prob", "beta_sum", "beta_count", "per_position_accepted",
               "acceptance_by_depth", "rejections", "fallbacks")


def reported(methods: Sequence[type[Method]] = core.METHODS + experimental.METHODS
             ) -> tuple[str, ...]:
  """The statistics the reports show as columns: every method's own (its value's
  `statistics`, then its `derived_statistics`), in the methods' order, but `NOT_COLUMNS`.
  A new method's statistics are new columns with no other change."""
  names = [k for m in methods for k in (*stats_lib.shown(m.statistics), *m.derived_statistics)]
  return tuple(k for k in dict.fromkeys(names) if k not in NOT_COLUMNS)


#: The statistics the reports show as columns, when the run's method reports them.
REPORTED = reported()
_INTEGERS = ("drafted", "accepted", "drafter_calls", "drafter_tokens", "target_tokens",
             "steps")


def stats_row(stats: Mapping[str, Any]) -> dict[str, Any]:
  """The columns the reports show: target_calls (per row), rounds, block_efficiency
  (tokens per target call), then those of `REPORTED` the run's statistics carry (its
  method's own: alpha for speculative decoding, fallback_rate for BiLD, beam steps per
  target call for speculative beam search, ...); alpha clipped to [0, 1]."""
  row = {"target_calls": int(stats["target_calls"]), "rounds": int(stats["rounds"]),
         "block_efficiency": finite(stats.get("tokens_per_target_call"))}
  for k in REPORTED:
    if k in stats:
      row[k] = (int(stats[k]) if k in _INTEGERS else
                float(np.clip(stats[k], 0.0, 1.0)) if k == "alpha" else finite(stats[k]))
  return row
