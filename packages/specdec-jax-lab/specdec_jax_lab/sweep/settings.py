"""What a sweep measures and how: `SweepSettings` and its two sweeps, `BildSweep` (BiLD's
threshold grid) and `BlockwiseSweep` (Kim et al.'s Table 4), checked when made.

    s = BildSweep(data="pairs.jsonl", out="results/bild", small=("aligned=demo-de-en/drafter",))
    recorded_config(s, decoder_only=False)   # what the results record and --resume compares
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any, ClassVar

import specdec_jax as sd
from specdec_jax.flags import FlagError
from specdec_jax.sampling import SamplingSettings

# The settings recorded in the results' `config` (those a sweep has, in this order), which
# --resume compares; a decoder-only sweep adds LM_RECORDED.
RECORDED = ("model", "data", "split", "limit", "batch_size", "seed", "small", "early_exit",
            "top_p", "exact", "heads", "lattice_k", "num_drafts", "rescorer", "rescoring_weight",
            "fallback", "rollback", "gammas")
LM_RECORDED = ("tokenizer", "prompt_len", "max_new_tokens")
LM_NEW_TOKENS = 32      # a decoder-only sweep's --max-new-tokens by default
EXACT = {"auto": None, "on": True, "off": False}
BATCH_POLICIES = ("wait", "sync")



def _named(spec: str) -> tuple[str, str]:
  name, sep, path = spec.partition("=")
  if not sep or not name or not path:
    raise FlagError(f"--small {spec!r} is not NAME=PATH (e.g. aligned=demo-de-en/drafter)")
  return name, path


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepSettings:
  """What a sweep measures and how, beside its points (`BildSweep`, `BlockwiseSweep`).

  Attributes:
    model: the target: a checkpoint dir, a bundled name or config:NAME.
    data: a prepared data dir or a .jsonl file of pairs (a decoder-only model: a text
      or .jsonl file of texts).
    out: the directory the JSON, Markdown and PNG reports are written to.
    split: the split of a data dir.
    limit: only the first `limit` pairs (texts); None: all of them.
    batch_size: rows per decode call.
    repeats: timed rounds; the median is reported.
    seed: the PRNG seed of sampling.
    dtype: the models' compute dtype.
    resume: keep the points of `out`'s earlier run with the same settings.
    exact: "auto" (the library default), "on" or "off": every method's exact mode (`EXACT`).
    progress: show a progress bar (stderr).
    tokenizer: a decoder-only model: the tokenizer of the texts (a T5 split holds its own).
    prompt_len: a decoder-only model: prompt tokens per text.
    max_new_tokens: a decoder-only model: continuation tokens generated and scored (None:
      `LM_NEW_TOKENS`).
    argv: the command line's words, recorded in the results as their `command`.
  """

  kind: ClassVar[str]     # the reports' name: bild.json, blockwise.json, ...

  model: str = "demo-de-en/target"
  data: str
  out: str
  split: str = "test"
  limit: int | None = 100
  batch_size: int = 1
  repeats: int = 3
  seed: int = 0
  dtype: str = "float32"
  resume: bool = False
  exact: str = "auto"
  progress: bool = True
  tokenizer: str | None = None
  prompt_len: int = 32
  max_new_tokens: int | None = None
  argv: tuple[str, ...] = ()

  def __post_init__(self):
    if self.limit is not None and self.limit < 1 or self.batch_size < 1 or self.repeats < 1:
      raise FlagError("--limit, --batch-size and --repeats must be >= 1")
    if self.exact not in EXACT:
      raise FlagError(f"--exact {self.exact!r}: one of {', '.join(sorted(EXACT))}")

  @property
  def exact_mode(self) -> bool | None:
    """The methods' `exact` of the --exact flag."""
    return EXACT[self.exact]

  @property
  def lm_new_tokens(self) -> int:
    """A decoder-only sweep's continuation tokens: `max_new_tokens`, or its default."""
    return LM_NEW_TOKENS if self.max_new_tokens is None else self.max_new_tokens


@dataclasses.dataclass(frozen=True, kw_only=True)
class BildSweep(SweepSettings):
  """`specdec sweep-bild`: the BiLD grid of each small model, an early exit's, and
  speculative decoding's points.

  Attributes:
    small: the small models, "NAME=PATH" each.
    early_exit: "MODEL:K": MODEL read after K decoder layers as the small model (None: none).
    fallback: BiLD's fallback thresholds.
    rollback: BiLD's rollback thresholds (inf: never roll back).
    gammas: speculative decoding's gammas for each small model.
    top_p: nucleus sampling for every point (None: greedy).
    batch_policies: BiLD's batched semantics compared ("wait", "sync").
  """

  kind: ClassVar[str] = sd.BiLD.name

  small: tuple[str, ...] = ()
  early_exit: str | None = None
  fallback: tuple[float, ...] = (0.5, 0.7, 0.9)
  rollback: tuple[float, ...] = (2.0, 3.0, 5.0)
  gammas: tuple[int, ...] = (2, 4)
  top_p: float | None = None
  batch_policies: tuple[str, ...] = ("wait",)

  def __post_init__(self):
    super().__post_init__()
    if not self.small and not self.early_exit:
      raise FlagError("sweep-bild needs a small model to sweep: --small NAME=PATH (e.g. "
                     "aligned=demo-de-en/drafter; repeatable) or --early-exit MODEL:K")
    bad = [p for p in self.batch_policies if p not in BATCH_POLICIES]
    if bad:
      raise FlagError(f"--batch-policies: unknown policy {bad[0]!r} ({', '.join(BATCH_POLICIES)})")
    self.smalls()

  def smalls(self) -> list[tuple[str, str]]:
    """(name, path) of each small model."""
    return [_named(spec) for spec in self.small]

  @property
  def sampling(self) -> SamplingSettings:
    """Greedy, or nucleus sampling with `top_p`."""
    return sd.Greedy() if self.top_p is None else sd.Sampling(top_p=self.top_p)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockwiseSweep(SweepSettings):
  """`specdec sweep-blockwise`: Table 4 of Kim et al. 2024 (base, n-gram, neural, parallel
  base / n-gram, oracle).

  Attributes:
    heads: the prediction heads, a file or dir (None: those saved with `model`).
    lattice_k: the top-k tokens per head the lattice rescores.
    num_drafts: the parallel rows' drafts per round.
    rescorer: the neural rescorer model.
    rescoring_weight: the rescorer's weight beside the heads' scores.
  """

  kind: ClassVar[str] = sd.Blockwise.name

  heads: str | None = None
  lattice_k: int = 16
  num_drafts: int = 4
  rescorer: str = "demo-de-en/drafter"
  rescoring_weight: float = 1.0


def recorded_config(s: SweepSettings, decoder_only: bool) -> dict[str, Any]:
  """The settings recorded in the results (`RECORDED`), and the command."""
  fields = {f.name for f in dataclasses.fields(s)}
  names = RECORDED + (LM_RECORDED if decoder_only else ())
  config = {n: getattr(s, n) for n in names if n in fields}
  config["command"] = "specdec " + " ".join(shlex.quote(a) for a in s.argv)
  return config
