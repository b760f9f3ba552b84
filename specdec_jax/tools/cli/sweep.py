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
import os
import pathlib
import shlex
import sys
from typing import Any

import numpy as np

import specdec_jax as sd
from specdec_jax.drafters.lattice import NGramLM
from specdec_jax.tools import evaluation
from specdec_jax.tools.cli.method_args import early_exit_layer, fit_ngram
from specdec_jax.tools.cli.streams import emit
from specdec_jax.tools.data import prepare
from specdec_jax.tools.decode_methods import Bild, Blockwise, Speculative
from specdec_jax.tools.errors import CLIError
from specdec_jax.tools.models import load_model
from specdec_jax.tools.prompts import encode_lm_prompts, read_texts
from specdec_jax.tools.report import check_output_dir, read_json, to_jsonable
from specdec_jax.tools.sweep import (
  Point,
  Split,
  lattice_cost_ms,
  load_split,
  run_points,
  write_outputs,
)

BILD_SETTINGS = ("model", "data", "split", "limit", "batch_size", "seed", "small", "early_exit",
                 "top_p")


def float_list(text: str) -> list[float]:
  """argparse type: "0.5,0.7,inf" -> floats."""
  try:
    return [float(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected numbers like 0.5,0.7, got {text!r}") from None


def _sampling(args):
  return sd.Greedy() if args.top_p is None else sd.Sampling(top_p=args.top_p)


EXACT = {"auto": None, "on": True, "off": False}


def _named(spec: str) -> tuple[str, str]:
  name, sep, path = spec.partition("=")
  if not sep or not name or not path:
    raise CLIError(f"--small {spec!r} is not NAME=PATH (e.g. aligned=demo-de-en/drafter)")
  return name, path


def bild_points(args, target) -> list[Point]:
  """The BiLD grid per small model, the early-exit grid, speculative decoding's points."""
  sampling, points = _sampling(args), []
  bad = [p for p in args.batch_policies if p not in ("wait", "sync")]
  if bad:
    raise CLIError(f"--batch-policies: unknown policy {bad[0]!r} (wait, sync)")
  grid = [(f, r) for f in args.fallback for r in args.rollback]
  smalls = [(name, _same_kind(load_model(path, args.dtype, what="drafter"), target,
                              f"--small {name}={path}"))
            for name, path in map(_named, args.small)]
  for name, small in smalls:
    for policy in args.batch_policies:
      tag = "" if policy == "wait" else f" ({policy})"
      for f, r in grid:
        points.append(Point(f"{name}/fb{f:g}/rb{r:g}" + ("" if policy == "wait" else
                                                         f"/{policy}"),
                            f"BiLD {name}{tag}",
                            Bild(small=small, small_name=name, fallback_threshold=f,
                                 rollback_threshold=r, sampling=sampling,
                                 batch_policy=policy, exact=EXACT[args.exact])))
  for name, small in smalls:
    for g in args.gammas:
      points.append(Point(f"speculative/{name}/g{g}", f"speculative {name} (exact)",
                          Speculative(drafter=small, drafter_name=name, gamma=g,
                                      sampling=sampling, exact=EXACT[args.exact])))
  if args.early_exit:
    path, _, k = args.early_exit.rpartition(":")
    large = load_model(path, args.dtype, what="early-exit model")
    small = sd.early_exit(large, early_exit_layer(f"early-exit:{k}", large))
    for f, r in grid:
      points.append(Point(f"early-exit{k}/fb{f:g}/rb{r:g}", f"BiLD early exit (layer {k})",
                          Bild(small=small, small_name=f"early-exit:{k}",
                               fallback_threshold=f, rollback_threshold=r, sampling=sampling,
                               exact=EXACT[args.exact]),
                          target=large, target_name=path))
  return points


def _same_kind(model, target, flag: str):
  """`model`, refused when it is not of the target's kind (T5 vs decoder-only)."""
  kind = lambda m: "a decoder-only LM" if m.is_decoder_only else "a T5 encoder-decoder"
  if model.is_decoder_only != target.is_decoder_only:
    raise CLIError(f"{flag} is {kind(model)} but --model is {kind(target)}: an LM drafts for "
                   "an LM, a T5 for a T5")
  return model


def lm_split(args, tokenizer, config) -> Split:
  """A decoder-only sweep's split: each text's first --prompt-len tokens (the prompt) and
  the text of its next --max-new-tokens tokens (the reference continuation)."""
  texts = read_texts(args.data)
  tokens, lengths = encode_lm_prompts(texts, tokenizer, config)
  p, t = args.prompt_len, args.max_new_tokens
  keep = np.flatnonzero(lengths >= p + t)[:args.limit]
  if not keep.size:
    raise CLIError(f"--data {args.data!r}: no text has --prompt-len {p} + --max-new-tokens "
                   f"{t} tokens")
  references = tokenizer.decode(tokens[keep, p:p + t])
  return Split(tokens[keep, :p], tuple(references), t)


def _ngram(args, vocab_size: int, split: Split | None = None):
  """The bigram rescorer: a prepared dir's train targets, or a .jsonl file's English side;
  for a decoder-only model the evaluated prompts (`split`)."""
  if split is not None:
    print("sweep-blockwise: the n-gram rescorer is fitted on the evaluated prompts",
          file=sys.stderr)
    return NGramLM.fit(list(split.inputs), vocab_size=vocab_size)
  if not evaluation.is_jsonl(args.data):
    return fit_ngram(args.data, vocab_size)
  targets = prepare.load_jsonl_split(args.data)["targets"]
  print("sweep-blockwise: the n-gram rescorer is fitted on the evaluated references of "
        f"{args.data} (in-sample: no train split in a .jsonl file)", file=sys.stderr)
  return NGramLM.fit([r[r > 0] for r in targets], vocab_size=vocab_size)


def blockwise_points(args, target, split: Split | None = None) -> list[Point]:
  """Table 4 of Kim et al. 2024: base, n-gram, neural, parallel base / n-gram, oracle.
  `split`: a decoder-only sweep's split (the n-gram rescorer's texts)."""
  heads = sd.load_heads(args.heads or args.model, target)
  lm = _ngram(args, target.config.vocab_size, split if target.is_decoder_only else None)
  rescorer = _same_kind(load_model(args.rescorer, args.dtype, what="rescorer"), target,
                        f"--rescorer {args.rescorer}")
  k, p, w = args.lattice_k, args.num_drafts, args.rescoring_weight
  rows = [("base", {}), ("ngram", dict(top_k=k, rescoring="ngram", rescorer=lm)),
          ("neural", dict(top_k=k, rescoring="neural", rescorer=rescorer)),
          (f"parallel base p={p}", dict(top_k=k, num_drafts=p)),
          (f"parallel ngram p={p}", dict(top_k=k, num_drafts=p, rescoring="ngram",
                                         rescorer=lm)),
          (f"oracle k={k}", dict(top_k=k, oracle=True))]
  return [Point(label, "blockwise", Blockwise(heads=heads, heads_name=args.heads or args.model,
                                              rescoring_weight=w, exact=EXACT[args.exact], **kw))
          for label, kw in rows]


def _existing(args, config: dict[str, Any], kind: str) -> dict[str, Any] | None:
  path = os.path.join(args.out, f"{kind}.json")
  if not (args.resume and os.path.exists(path)):
    return None
  old = read_json(path, "--resume: sweep file")
  now = to_jsonable(config)
  diff = [k for k in now if k != "command" and old.get("config", {}).get(k) != now[k]]
  if diff:
    raise CLIError(f"--resume: {path} was made with other settings ({', '.join(diff)}); drop "
                   "--resume or choose another --out")
  return old


def _config(args, names) -> dict[str, Any]:
  config = {n: getattr(args, n) for n in names if hasattr(args, n)}
  config["command"] = "specdec " + " ".join(shlex.quote(a) for a in getattr(args, "argv", []))
  return config


def _run(args, kind: str, build) -> int:
  if args.limit is not None and args.limit < 1 or args.batch_size < 1 or args.repeats < 1:
    raise CLIError("--limit, --batch-size and --repeats must be >= 1")
  if kind == "bild" and not args.small and not args.early_exit:
    raise CLIError("sweep-bild needs a small model to sweep: --small NAME=PATH (e.g. "
                   "aligned=demo-de-en/drafter; repeatable) or --early-exit MODEL:K")
  check_output_dir(args.out, "--out")
  target = load_model(args.model, args.dtype, what="target")
  names: tuple[str, ...] = BILD_SETTINGS + ("exact", "heads", "lattice_k", "num_drafts", "rescorer",
                           "rescoring_weight", "fallback", "rollback", "gammas")
  if target.is_decoder_only:
    if not args.tokenizer:
      raise CLIError("a decoder-only --model needs --tokenizer: --data holds texts")
    args.max_new_tokens = 32 if args.max_new_tokens is None else args.max_new_tokens
    if args.max_new_tokens < 1 or args.prompt_len < 1:
      raise CLIError("--prompt-len and --max-new-tokens must be >= 1")
    tokenizer = sd.load_tokenizer(args.tokenizer)
    split = lm_split(args, tokenizer, target.config)
    names += ("tokenizer", "prompt_len", "max_new_tokens")
  else:
    given = [f for f, v in (("--tokenizer", args.tokenizer),
                            ("--max-new-tokens", args.max_new_tokens)) if v is not None]
    if given:
      raise CLIError(f"{', '.join(given)}: only for a decoder-only --model (a prepared "
                     "split holds its tokenizer and target length)")
    split = load_split(args.data, args.split, args.limit)
    tokenizer = evaluation.data_tokenizer(args.data, pathlib.Path(args.data))
  config = _config(args, names)
  if kind == "blockwise" and (evaluation.is_jsonl(args.data) or target.is_decoder_only):
    config["ngram_data"] = (f"{args.data} (the evaluated prompts)" if target.is_decoder_only
                            else f"{args.data} (in-sample: the evaluated references)")
  existing = _existing(args, config, kind)
  points = (blockwise_points(args, target, split) if kind == "blockwise"
            else build(args, target))
  results = run_points(target, split, tokenizer, points, batch_size=args.batch_size,
                       repeats=args.repeats, seed=args.seed, config=config, existing=existing,
                       progress=not args.no_progress,
                       on_update=lambda r: write_outputs(r, args.out, kind))
  if kind == "blockwise":
    # (ignored union-attr: the tool Blockwise is derived at import time from the core fields)
    g = next(p.method.heads.num_drafts for p in points)  # type: ignore[union-attr]
    lm = next(p.method.rescorer for p in points  # type: ignore[union-attr]
              if p.method.rescoring == "ngram")  # type: ignore[union-attr]
    results["lattice_ms"] = {
        f"p={p}": lattice_cost_ms(args.batch_size, g, args.lattice_k, p, lm)
        for p in sorted({1, args.num_drafts})}
  paths = write_outputs(results, args.out, kind)
  emit(open(paths["md"], encoding="utf-8").read())
  print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}", file=sys.stderr)
  return 0


def _common(p: argparse.ArgumentParser, default_out: str) -> None:
  p.add_argument("--model", default="demo-de-en/target", help="the target (large) model")
  p.add_argument("--data", required=True, metavar="DIR_OR_JSONL",
                 help="prepared data dir, or a .jsonl file of {\"de\", \"en\"} pairs (e.g. "
                 "tests/data/demo_test_pairs.jsonl)")
  p.add_argument("--split", default="test")
  p.add_argument("--limit", type=int, default=100, help="first N pairs (default 100)")
  p.add_argument("--batch-size", type=int, default=1, help="rows per decode call (default 1)")
  p.add_argument("--repeats", type=int, default=3, help="timed rounds (median)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  p.add_argument("--out", default=default_out, metavar="DIR")
  p.add_argument("--resume", action="store_true",
                 help="keep the points of DIR's earlier run with the same settings")
  p.add_argument("--exact", choices=sorted(EXACT), default="auto",
                 help="greedy target calls at the exact width (on), at their natural width "
                 "(off: faster on CPU), or the library default (auto: exact for greedy); "
                 "speedups are over the target alone at its natural width, the exact "
                 "baseline's cost is a column of its own")
  p.add_argument("--no-progress", action="store_true")
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
  p.add_argument("--fallback", type=float_list, default=[0.5, 0.7, 0.9], metavar="0.5,0.7,0.9")
  p.add_argument("--rollback", type=float_list, default=[2.0, 3.0, 5.0], metavar="2,3,5",
                 help="rollback thresholds (inf: never roll back)")
  p.add_argument("--gammas", type=lambda t: [int(x) for x in t.split(",")], default=[2, 4],
                 help="speculative decoding's gammas for each small model (default 2,4)")
  p.add_argument("--top-p", type=float, help="nucleus sampling for every point (paper: 0.8)")
  p.add_argument("--batch-policies", type=lambda t: [x.strip() for x in t.split(",")],
                 default=["wait"], metavar="wait,sync",
                 help="BiLD's batched semantics to compare (see sd.bild_generate; default wait)")
  p.set_defaults(func=lambda a: _run(a, "bild", bild_points))

  q = subparsers.add_parser("sweep-blockwise", help="blockwise drafts: Kim et al.'s Table 4",
                            description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  _common(q, "sweep_blockwise")
  q.add_argument("--heads", help="heads file or dir (default: saved with --model)")
  q.add_argument("--lattice-k", type=int, default=16)
  q.add_argument("--num-drafts", type=int, default=4)
  q.add_argument("--rescorer", default="demo-de-en/drafter", help="neural rescorer model")
  q.add_argument("--rescoring-weight", type=float, default=1.0)
  q.set_defaults(func=lambda a: _run(a, "blockwise", blockwise_points))

