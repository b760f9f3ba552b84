"""`specdec eval`: BLEU / chrF and speed of a model on a prepared data split, or
(`--metric perplexity`) a decoder-only model's perplexity on texts (BiLD's LM metric).

    specdec eval --model runs/demo/target/final --data runs/demo/data --drafter ngram
    specdec eval --metric perplexity --model hf-gpt2 --tokenizer hf-gpt2 --data wiki.txt
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
from typing import Any

import numpy as np

import specdec_jax as sd
from specdec_jax.tools import evaluation
from specdec_jax.tools.cli.args import add_drafter_flag, add_dtype_flag
from specdec_jax.tools.cli.mesh_args import (add_mesh_flag, check_batch, mesh_from_args,
                                             place_method, load_target)
from specdec_jax.tools.cli.method_args import (EARLY_EXIT, add_method_flags, build_method,
                                               check_method_flags, sampling_from_method_args)
from specdec_jax.tools.errors import CLIError, EvaluationError
from specdec_jax.tools.methods import EXTRA_STATS
from specdec_jax.tools.models import DRAFTER_KINDS, drafter_loader
from specdec_jax.tools.options import check_at_least_one
from specdec_jax.tools.prompts import encode_lm_prompts, read_texts
from specdec_jax.tools.report import fmt, to_jsonable

METRICS = ("bleu", "perplexity")


def _report(result: dict[str, Any]) -> str:
  def f(x, digits=3):
    return fmt(x, digits, missing="n/a")
  stats = result["stats"]
  lines = [f"BLEU                 {result['bleu']:.2f}",
           f"chrF                 {result['chrf']:.2f}",
           f"pairs                {result['pairs']} (batches of {result['batch_size']})",
           f"generated tokens     {result['generated_tokens']}",
           f"wall time            {result['wall_s']:.3f} s"
           + (" (INCLUDES compilation: --no-warmup)" if result["includes_compile"]
              else " (compilation excluded)"),
           f"ms/token             {f(result['ms_per_token'], 2)}",
           f"tokens/s             {f(result['tokens_per_s'], 1)}",
           f"tokens/target call   {f(stats['tokens_per_target_call'])}",
           f"target calls         {stats['target_calls']} per-row verifier calls, "
           f"{stats['rounds']} batched rounds"]
  if result["speculative"]:
    lines += [f"acceptance rate      {f(stats['acceptance_rate'])}   (accepted / drafted)",
              f"alpha                {f(stats['alpha'])}"]
  for key in EXTRA_STATS.get(result["method"], ()):
    if key in stats:
      lines.append(f"{key:<20} {f(stats[key])}")
  return "\n".join(lines)


def _method(args, model, data: str, mesh):
  """The method of the flags; an "ngram" drafter is fitted on the data's train split."""
  load = drafter_loader(args.dtype)
  drafter = None
  if args.method == "speculative":
    drafter = args.drafter if args.drafter in DRAFTER_KINDS else load(args.drafter)
    data_dir = None if evaluation.is_jsonl(data) else pathlib.Path(data)
    drafter = evaluation.resolve_drafter(drafter, model, data_dir)
  elif args.method == "bild" and not args.drafter.startswith(EARLY_EXIT):
    drafter = load(args.drafter)
  if args.rescoring == "ngram" and args.rescorer == "data":
    args.rescorer = data
  method = build_method(args, model, sampling_from_method_args(args), drafter, load)
  early_exit = args.method == "bild" and args.drafter.startswith(EARLY_EXIT)
  return place_method(method, mesh, keep=("small",) if early_exit else ())


def perplexity(args) -> dict[str, Any]:
  """Per-token perplexity of --model on the texts of --data (`evaluation.perplexity`): each
  text encoded as a prompt is (BOS as the tokenizer has it, no EOS), cut at --max-length
  (default: the model's max_positions) tokens, every token after the first scored."""
  if not os.path.isfile(args.data):
    raise CLIError(f"--data {args.data!r}: --metric perplexity reads a text file (one text "
                   "per line) or a .jsonl file (one JSON string or {\"text\": ...} per line)")
  texts = read_texts(args.data)[:args.limit]
  if not texts:
    raise EvaluationError(f"--data {args.data!r} holds no texts")
  tokenizer = sd.load_tokenizer(args.tokenizer) if args.tokenizer else None
  model = load_target(args.model, args.dtype, None, what="model")
  if not model.is_decoder_only:
    raise CLIError("--metric perplexity scores decoder-only models (GPT-2, Llama); "
                   f"{args.model} is a T5 encoder-decoder: score it with BLEU / chrF")
  limit = args.max_length or model.config.max_positions
  tokens, lengths = encode_lm_prompts(texts, tokenizer, model.config)
  cut = int((lengths > limit).sum())
  tokens, lengths = tokens[:, :limit], np.minimum(lengths, limit)
  if tokens.shape[1] < 2:
    raise EvaluationError("every text is one token long: nothing to predict")
  result = evaluation.perplexity(model, tokens, lengths, batch_size=args.batch_size)
  return {**result, "truncated": cut, "max_length": limit}


def _run_perplexity(args) -> int:
  given = [flag for flag, value in (("--drafter", args.drafter), ("--method", args.method))
           if value is not None]
  if given:
    raise CLIError(f"{', '.join(given)}: --metric perplexity scores the model alone")
  check_at_least_one(batch_size=args.batch_size, limit=args.limit,
                     max_length=args.max_length)
  result = perplexity(args)
  if args.json:
    settings = {"metric": "perplexity", "model": args.model, "data": args.data,
                "tokenizer": args.tokenizer, "limit": args.limit, "dtype": args.dtype}
    print(json.dumps(to_jsonable({**result, "settings": settings})))
  else:
    print(f"{args.model} on {args.data}: perplexity")
    print(f"perplexity           {result['perplexity']:.3f}")
    print(f"nll                  {result['nll']:.4f}   (nats per token)")
    print(f"tokens scored        {result['tokens']} (every token after each text's first)")
    print(f"texts                {result['sequences']}"
          + (f" ({result['truncated']} cut at {result['max_length']} tokens)"
             if result["truncated"] else ""))
  return 0


def run(args) -> int:
  if args.metric == "perplexity":
    return _run_perplexity(args)
  check_method_flags(args)
  check_at_least_one(batch_size=args.batch_size, limit=args.limit,
                     max_new_tokens=args.max_new_tokens)
  mesh = mesh_from_args(args)
  check_batch(args.batch_size, mesh)
  sampling = sampling_from_method_args(args)
  if evaluation.is_jsonl(args.data):
    if not os.path.isfile(args.data):
      raise CLIError(f"--data {args.data!r}: no such file")
    if args.drafter == "ngram" or getattr(args, "rescorer", None) == "data":
      raise CLIError("the n-gram drafter / rescorer is fitted on a prepared data dir's train "
                     "split; a .jsonl file has none (use a model drafter, or --data DIR)")
  elif not os.path.isdir(args.data):
    raise CLIError(f"--data {args.data!r} is neither a .jsonl file of pairs nor a directory "
                   "(prepare one with `specdec train --stages data`)")
  tokenizer = sd.load_tokenizer(args.tokenizer) if args.tokenizer else None
  model = load_target(args.model, args.dtype, mesh, what="model")
  if model.is_decoder_only:
    raise CLIError(f"{args.model} is a decoder-only LM: BLEU / chrF score translations of a "
                   "T5 data split; score an LM with --metric perplexity (or continuations "
                   "with specdec sweep-bild --tokenizer)")
  method = _method(args, model, args.data, mesh)
  result = evaluation.evaluate(
      model, args.data, split=args.split, method="greedy" if sampling.is_greedy else "sample",
      sampling=sampling, gamma=getattr(method, "gamma", 5), batch_size=args.batch_size,
      max_new_tokens=args.max_new_tokens, limit=args.limit, tokenizer=tokenizer,
      seed=args.seed, warmup=args.warmup, decode_method=method)
  result.pop("references")
  if args.json:
    settings = {**result.pop("settings"), "model": args.model, "data": args.data,
                "split": args.split, "drafter": args.drafter, "dtype": args.dtype,
                "seed": args.seed, "mesh": args.mesh}
    print(json.dumps(to_jsonable({**result, "settings": settings})))
  else:
    kind = method.describe().rsplit(",", 1)[0]
    print(f"{args.model} on {args.data} [{args.split}]: {kind}, {result['sampling']}")
    print(_report(result))
  return 0


def add(subparsers) -> None:
  p = subparsers.add_parser(
      "eval", help="BLEU / chrF and speed of a model on a prepared data split, or an LM's "
      "perplexity",
      description="Translate a split of a prepared data directory (written by `specdec train "
      "--stages data`) with a model, baseline or speculative, and report sacrebleu corpus "
      "BLEU and chrF against its English side, with wall time and ms/token. With --metric "
      "perplexity: a decoder-only model's per-token perplexity on the texts of --data (a "
      "text file, one text per line, or .jsonl), BiLD's LM metric.")
  p.add_argument("--metric", choices=METRICS, default="bleu",
                 help="bleu: BLEU and chrF of decoded translations (default); perplexity: "
                 "exp(mean NLL) of every token after each text's first")
  p.add_argument("--model", required=True, metavar="PATH_OR_NAME",
                 help="model: checkpoint dir, bundled name, or config:NAME")
  p.add_argument("--data", required=True, metavar="DIR_OR_JSONL",
                 help="prepared data dir (spiece.model, {split}.npz/.jsonl), or a .jsonl file "
                 "of {\"de\", \"en\"} pairs such as tests/data/demo_test_pairs.jsonl "
                 "(tokenised with --tokenizer, default the bundled demo-de-en one)")
  p.add_argument("--split", default="test", help="train, validation or test (default: test)")
  add_drafter_flag(p, "bigram tables fitted on the data's train targets")
  add_method_flags(p)
  p.add_argument("--limit", type=int, help="evaluate only the first N pairs")
  p.add_argument("--batch-size", type=int, default=32,
                 help="rows per decode call; the last batch is padded to it (default: 32)")
  p.add_argument("--max-new-tokens", type=int, help="default: the split's target length")
  p.add_argument("--max-length", type=int,
                 help="--metric perplexity: texts cut at this many tokens (default: the "
                 "model's max_positions)")
  p.add_argument("--tokenizer", metavar="PATH_OR_NAME",
                 help="SentencePiece model (default: the data dir's spiece.model)")
  p.add_argument("--seed", type=int, default=0, help="PRNG seed for sampling (default: 0)")
  add_dtype_flag(p)
  add_mesh_flag(p)
  p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                 help="decode the first batch once untimed, so timing excludes compilation "
                 "(default); --no-warmup times the compiling first call too")
  p.add_argument("--json", action="store_true",
                 help="print one JSON object (scores, timing, stats, hypotheses, settings)")
  p.set_defaults(func=run)
