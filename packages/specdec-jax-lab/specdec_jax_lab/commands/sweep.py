"""`specdec sweep-bild` and `specdec sweep-blockwise`: quality and speed of many settings.

    specdec sweep-bild --data runs/demo/data --small aligned=demo-de-en/drafter \\
        --small unaligned=runs/demo/drafter/final --early-exit demo-de-en/early-exit:1 \\
        --fallback 0.5,0.7,0.9 --rollback 2,3,5 --out results/bild
    specdec sweep-blockwise --data runs/demo/data --lattice-k 16 --num-drafts 4 \\
        --out results/blockwise
    specdec sweep-bild --data tests/data/demo_test_pairs.jsonl --small aligned=demo-de-en/drafter

--data is a prepared data dir or a .jsonl file of {"de", "en"} pairs (tokenised with the
bundled demo tokenizer); with a .jsonl file sweep-blockwise fits its n-gram rescorer on
the file's own English side (in-sample, recorded as `ngram_data` in the results).

With a decoder-only --model (GPT-2, Llama), --data is a text file (one text per line) or
a .jsonl file of texts (`prompts.read_texts`), --tokenizer their tokenizer: each text's
first --prompt-len tokens are the prompt (no EOS, BOS as the tokenizer has it), its next
--max-new-tokens tokens the reference continuation that BLEU / chrF score against; texts
too short for both are skipped. The n-gram rescorer is fitted on the texts themselves
(in-sample), the drafting models must be decoder-only too.

    specdec sweep-bild --model demo-en-lm/target --tokenizer demo-en-lm --data texts.txt \
        --small base=demo-en-lm/drafter --prompt-len 4 --max-new-tokens 8

Every point is timed beside the target alone in alternating rounds (`tools.sweep`);
both write JSON, Markdown and a BLEU-vs-speedup PNG, with a progress bar, and
--resume keeps the points an earlier run of the same settings measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shlex
import sys
from typing import Any, ClassVar

import numpy as np

import specdec_jax as sd
from specdec_jax.cli.method_args import early_exit_layer, fit_ngram
from specdec_jax.cli.models import load_model
from specdec_jax.cli.prompts import encode_lm_prompts, read_texts
from specdec_jax.drafters.lattice import NGramLM
from specdec_jax.errors import CLIError
from specdec_jax.models.model import family
from specdec_jax.runs import Run
from specdec_jax.runtime.report import check_output_dir, read_json, to_jsonable
from specdec_jax.runtime.streams import emit
from specdec_jax.sampling import SamplingSettings
from specdec_jax_lab import evaluation
from specdec_jax_lab.data import prepare
from specdec_jax_lab.sweep import (
  Point,
  Split,
  Timing,
  lattice_cost_ms,
  load_split,
  run_points,
  write_outputs,
)

# The settings recorded in the results' `config` (those a sweep has, in this order), which
# --resume compares; a decoder-only sweep adds LM_RECORDED.
RECORDED = ("model", "data", "split", "limit", "batch_size", "seed", "small", "early_exit",
            "top_p", "exact", "heads", "lattice_k", "num_drafts", "rescorer", "rescoring_weight",
            "fallback", "rollback", "gammas")
LM_RECORDED = ("tokenizer", "prompt_len", "max_new_tokens")
LM_NEW_TOKENS = 32      # a decoder-only sweep's --max-new-tokens by default
EXACT = {"auto": None, "on": True, "off": False}
BATCH_POLICIES = ("wait", "sync")


def float_list(text: str) -> list[float]:
  """argparse type: "0.5,0.7,inf" -> floats."""
  try:
    return [float(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected numbers like 0.5,0.7, got {text!r}") from None


def _named(spec: str) -> tuple[str, str]:
  name, sep, path = spec.partition("=")
  if not sep or not name or not path:
    raise CLIError(f"--small {spec!r} is not NAME=PATH (e.g. aligned=demo-de-en/drafter)")
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
      raise CLIError("--limit, --batch-size and --repeats must be >= 1")
    if self.exact not in EXACT:
      raise CLIError(f"--exact {self.exact!r}: one of {', '.join(sorted(EXACT))}")

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

  kind: ClassVar[str] = "bild"

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
      raise CLIError("sweep-bild needs a small model to sweep: --small NAME=PATH (e.g. "
                     "aligned=demo-de-en/drafter; repeatable) or --early-exit MODEL:K")
    bad = [p for p in self.batch_policies if p not in BATCH_POLICIES]
    if bad:
      raise CLIError(f"--batch-policies: unknown policy {bad[0]!r} ({', '.join(BATCH_POLICIES)})")
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

  kind: ClassVar[str] = "blockwise"

  heads: str | None = None
  lattice_k: int = 16
  num_drafts: int = 4
  rescorer: str = "demo-de-en/drafter"
  rescoring_weight: float = 1.0


def _common_from_args(args) -> dict[str, Any]:
  return dict(model=args.model, data=args.data, out=args.out, split=args.split,
              limit=args.limit, batch_size=args.batch_size, repeats=args.repeats,
              seed=args.seed, dtype=args.dtype, resume=args.resume, exact=args.exact,
              progress=not args.no_progress, tokenizer=args.tokenizer,
              prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens,
              argv=tuple(getattr(args, "argv", ())))


def bild_from_args(args) -> BildSweep:
  """The typed settings of `sweep-bild`'s flags, checked before any model is loaded: where
  the command line's namespace stops."""
  return BildSweep(**_common_from_args(args), small=tuple(args.small),
                   early_exit=args.early_exit, fallback=tuple(args.fallback),
                   rollback=tuple(args.rollback), gammas=tuple(args.gammas), top_p=args.top_p,
                   batch_policies=tuple(args.batch_policies))


def blockwise_from_args(args) -> BlockwiseSweep:
  """The typed settings of `sweep-blockwise`'s flags (see `bild_from_args`)."""
  return BlockwiseSweep(**_common_from_args(args), heads=args.heads, lattice_k=args.lattice_k,
                        num_drafts=args.num_drafts, rescorer=args.rescorer,
                        rescoring_weight=args.rescoring_weight)


def bild_points(s: BildSweep, target) -> list[Point]:
  """The BiLD grid per small model, the early-exit grid, speculative decoding's points."""
  sampling, points, exact = s.sampling, [], s.exact_mode
  grid = [(f, r) for f in s.fallback for r in s.rollback]
  smalls = [(name, _same_kind(load_model(path, s.dtype, what="drafter"), target,
                              f"--small {name}={path}"))
            for name, path in s.smalls()]
  for name, small in smalls:
    for policy in s.batch_policies:
      tag = "" if policy == "wait" else f" ({policy})"
      for f, r in grid:
        points.append(Point(f"{name}/fb{f:g}/rb{r:g}" + ("" if policy == "wait" else
                                                         f"/{policy}"),
                            f"BiLD {name}{tag}",
                            Run(sd.BiLD(small, fallback_threshold=f, rollback_threshold=r,
                                        batch_policy=policy, exact=exact), sampling, name)))
  for name, small in smalls:
    for g in s.gammas:
      points.append(Point(f"speculative/{name}/g{g}", f"speculative {name} (exact)",
                          Run(sd.Speculative(small, gamma=g, exact=exact), sampling, name)))
  if s.early_exit:
    path, _, k = s.early_exit.rpartition(":")
    large = load_model(path, s.dtype, what="early-exit model")
    small = sd.early_exit(large, early_exit_layer(f"early-exit:{k}", large))
    for f, r in grid:
      points.append(Point(f"early-exit{k}/fb{f:g}/rb{r:g}", f"BiLD early exit (layer {k})",
                          Run(sd.BiLD(small, fallback_threshold=f, rollback_threshold=r,
                                      exact=exact), sampling, f"early-exit:{k}"),
                          target=large, target_name=path))
  return points


def _same_kind(model, target, flag: str):
  """`model`, refused when it is not of the target's kind (T5 vs decoder-only)."""
  if model.is_decoder_only != target.is_decoder_only:
    raise CLIError(f"{flag} is {family(model)} but --model is {family(target)}: an LM drafts "
                   "for an LM, a T5 for a T5")
  return model


def lm_split(s: SweepSettings, tokenizer, config) -> Split:
  """A decoder-only sweep's split: each text's first --prompt-len tokens (the prompt) and
  the text of its next --max-new-tokens tokens (the reference continuation)."""
  texts = read_texts(s.data)
  tokens, lengths = encode_lm_prompts(texts, tokenizer, config)
  p, t = s.prompt_len, s.lm_new_tokens
  keep = np.flatnonzero(lengths >= p + t)[:s.limit]
  if not keep.size:
    raise CLIError(f"--data {s.data!r}: no text has --prompt-len {p} + --max-new-tokens "
                   f"{t} tokens")
  references = tokenizer.decode(tokens[keep, p:p + t])
  return Split(tokens[keep, :p], tuple(references), t)


def _ngram(data: str, vocab_size: int, split: Split | None = None):
  """The bigram rescorer: a prepared dir's train targets, or a .jsonl file's English side;
  for a decoder-only model the evaluated prompts (`split`)."""
  if split is not None:
    print("sweep-blockwise: the n-gram rescorer is fitted on the evaluated prompts",
          file=sys.stderr)
    return NGramLM.fit(list(split.inputs), vocab_size=vocab_size)
  if not evaluation.is_jsonl(data):
    return fit_ngram(data, vocab_size)
  targets = prepare.load_jsonl_split(data)["targets"]
  print("sweep-blockwise: the n-gram rescorer is fitted on the evaluated references of "
        f"{data} (in-sample: no train split in a .jsonl file)", file=sys.stderr)
  return NGramLM.fit([r[r > 0] for r in targets], vocab_size=vocab_size)


def blockwise_points(s: BlockwiseSweep, target, split: Split | None = None) -> list[Point]:
  """Table 4 of Kim et al. 2024: base, n-gram, neural, parallel base / n-gram, oracle.
  `split`: a decoder-only sweep's split (the n-gram rescorer's texts)."""
  heads = sd.load_heads(s.heads or s.model, target)
  lm = _ngram(s.data, target.config.vocab_size, split if target.is_decoder_only else None)
  rescorer = _same_kind(load_model(s.rescorer, s.dtype, what="rescorer"), target,
                        f"--rescorer {s.rescorer}")
  k, p, w = s.lattice_k, s.num_drafts, s.rescoring_weight
  rows = [("base", {}), ("ngram", dict(top_k=k, rescoring="ngram", rescorer=lm)),
          ("neural", dict(top_k=k, rescoring="neural", rescorer=rescorer)),
          (f"parallel base p={p}", dict(top_k=k, num_drafts=p)),
          (f"parallel ngram p={p}", dict(top_k=k, num_drafts=p, rescoring="ngram",
                                         rescorer=lm)),
          (f"oracle k={k}", dict(top_k=k, oracle=True))]
  return [Point(label, "blockwise", Run(sd.Blockwise(heads, rescoring_weight=w,
                                                     exact=s.exact_mode, **kw),
                                        label=s.heads or s.model))
          for label, kw in rows]


def _existing(s: SweepSettings, config: dict[str, Any]) -> dict[str, Any] | None:
  path = os.path.join(s.out, f"{s.kind}.json")
  if not (s.resume and os.path.exists(path)):
    return None
  old = read_json(path, "--resume: sweep file")
  now = to_jsonable(config)
  diff = [k for k in now if k != "command" and old.get("config", {}).get(k) != now[k]]
  if diff:
    raise CLIError(f"--resume: {path} was made with other settings ({', '.join(diff)}); drop "
                   "--resume or choose another --out")
  return old


def _config(s: SweepSettings, decoder_only: bool) -> dict[str, Any]:
  """The settings recorded in the results (`RECORDED`), and the command."""
  fields = {f.name for f in dataclasses.fields(s)}
  names = RECORDED + (LM_RECORDED if decoder_only else ())
  config = {n: getattr(s, n) for n in names if n in fields}
  config["command"] = "specdec " + " ".join(shlex.quote(a) for a in s.argv)
  return config


def sweep(s: SweepSettings) -> int:
  """`specdec sweep-bild` / `sweep-blockwise` on typed settings: measure every point, write
  the reports (JSON, Markdown, PNG) and print the Markdown."""
  if not isinstance(s, (BildSweep, BlockwiseSweep)):
    raise CLIError(f"no points to sweep for {type(s).__name__}: a BildSweep or BlockwiseSweep")
  check_output_dir(s.out, "--out")
  target = load_model(s.model, s.dtype, what="target")
  if target.is_decoder_only:
    if not s.tokenizer:
      raise CLIError("a decoder-only --model needs --tokenizer: --data holds texts")
    s = dataclasses.replace(s, max_new_tokens=s.lm_new_tokens)
    if s.lm_new_tokens < 1 or s.prompt_len < 1:
      raise CLIError("--prompt-len and --max-new-tokens must be >= 1")
    tokenizer = sd.load_tokenizer(s.tokenizer)
    split = lm_split(s, tokenizer, target.config)
  else:
    given = [f for f, v in (("--tokenizer", s.tokenizer),
                            ("--max-new-tokens", s.max_new_tokens)) if v is not None]
    if given:
      raise CLIError(f"{', '.join(given)}: only for a decoder-only --model (a prepared "
                     "split holds its tokenizer and target length)")
    split = load_split(s.data, s.split, s.limit)
    tokenizer = evaluation.data_tokenizer(s.data, pathlib.Path(s.data))
  config = _config(s, target.is_decoder_only)
  if isinstance(s, BlockwiseSweep) and (evaluation.is_jsonl(s.data) or target.is_decoder_only):
    config["ngram_data"] = (f"{s.data} (the evaluated prompts)" if target.is_decoder_only
                            else f"{s.data} (in-sample: the evaluated references)")
  existing = _existing(s, config)
  points = (blockwise_points(s, target, split) if isinstance(s, BlockwiseSweep)
            else bild_points(s, target))
  results = run_points(target, split, tokenizer, points,
                       Timing(s.batch_size, s.repeats, s.seed, s.progress),
                       config=config, existing=existing,
                       on_update=lambda r: write_outputs(r, s.out, s.kind))
  if isinstance(s, BlockwiseSweep):
    methods = [p.method.method for p in points if isinstance(p.method.method, sd.Blockwise)]
    g = methods[0].heads.num_drafts
    lm = next(m.rescorer for m in methods if m.rescoring == "ngram")
    results["lattice_ms"] = {
        f"p={p}": lattice_cost_ms(s.batch_size, g, s.lattice_k, p, lm)
        for p in sorted({1, s.num_drafts})}
  paths = write_outputs(results, s.out, s.kind)
  emit(open(paths["md"], encoding="utf-8").read())
  print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}", file=sys.stderr)
  return 0


def _common(p: argparse.ArgumentParser, default_out: str) -> None:
  p.add_argument("--model", default="demo-de-en/target", help="the target (large) model")
  p.add_argument("--data", required=True, metavar="DIR_OR_JSONL",
                 help="prepared data dir, or a .jsonl file of {\"de\", \"en\"} pairs (e.g. "
                 "tests/data/demo_test_pairs.jsonl)")
  p.add_argument("--split", default="test", help="the data split decoded (default test)")
  p.add_argument("--limit", type=int, default=100, help="first N pairs (default 100)")
  p.add_argument("--batch-size", type=int, default=1, help="rows per decode call (default 1)")
  p.add_argument("--repeats", type=int, default=3, help="timed rounds (median)")
  p.add_argument("--seed", type=int, default=0, help="PRNG seed of sampling (default 0)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                 help="the models' compute dtype (default float32)")
  p.add_argument("--out", default=default_out, metavar="DIR",
                 help=f"where the JSON, Markdown and PNG go (default {default_out})")
  p.add_argument("--resume", action="store_true",
                 help="keep the points of DIR's earlier run with the same settings")
  p.add_argument("--exact", choices=sorted(EXACT), default="auto",
                 help="greedy target calls at the exact width (on), at their natural width "
                 "(off: faster on CPU), or the library default (auto: exact for greedy); "
                 "speedups are over the target alone at its natural width, the exact "
                 "baseline's cost is a column of its own")
  p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
  p.add_argument("--tokenizer", metavar="PATH_OR_NAME",
                 help="a decoder-only --model: the tokenizer of --data's texts")
  p.add_argument("--prompt-len", type=int, default=32,
                 help="a decoder-only --model: prompt tokens per text (default 32)")
  p.add_argument("--max-new-tokens", type=int,
                 help="a decoder-only --model: continuation tokens generated and scored "
                 "(default 32)")


def add(subparsers) -> None:
  p = subparsers.add_parser("sweep-bild", help="BiLD threshold grid: BLEU vs speedup",
                            description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  _common(p, "sweep_bild")
  p.add_argument("--small", action="append", default=[], metavar="NAME=PATH",
                 help="a small model (repeatable), e.g. aligned=demo-de-en/drafter")
  p.add_argument("--early-exit", metavar="MODEL:K",
                 help="the early-exit variant: MODEL read after K decoder layers")
  p.add_argument("--fallback", type=float_list, default=[0.5, 0.7, 0.9], metavar="0.5,0.7,0.9",
                 help="fallback thresholds (1.0: the large model alone, exact)")
  p.add_argument("--rollback", type=float_list, default=[2.0, 3.0, 5.0], metavar="2,3,5",
                 help="rollback thresholds (inf: never roll back)")
  p.add_argument("--gammas", type=lambda t: [int(x) for x in t.split(",")], default=[2, 4],
                 help="speculative decoding's gammas for each small model (default 2,4)")
  p.add_argument("--top-p", type=float, help="nucleus sampling for every point (paper: 0.8)")
  p.add_argument("--batch-policies", type=lambda t: [x.strip() for x in t.split(",")],
                 default=["wait"], metavar="wait,sync",
                 help="BiLD's batched semantics to compare (see sd.bild_generate; default wait)")
  p.set_defaults(func=lambda a: sweep(bild_from_args(a)))

  q = subparsers.add_parser("sweep-blockwise", help="blockwise drafts: Kim et al.'s Table 4",
                            description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  _common(q, "sweep_blockwise")
  q.add_argument("--heads", help="heads file or dir (default: saved with --model)")
  q.add_argument("--lattice-k", type=int, default=16,
                 help="candidates per head in the lattice (default 16)")
  q.add_argument("--num-drafts", type=int, default=4,
                 help="lattice paths verified together by the parallel rows (default 4)")
  q.add_argument("--rescorer", default="demo-de-en/drafter", help="neural rescorer model")
  q.add_argument("--rescoring-weight", type=float, default=1.0,
                 help="the rescorer's log-prob weight against the heads' (default 1.0)")
  q.set_defaults(func=lambda a: sweep(blockwise_from_args(a)))

