"""`specdec eval`: BLEU / chrF and speed of a model on a prepared data split, or
(`--metric perplexity`) a decoder-only model's perplexity on texts (BiLD's LM metric).

    specdec eval --model runs/demo/target/final --data runs/demo/data --drafter ngram
    specdec eval --metric perplexity --model demo-en-lm/target --tokenizer demo-en-lm \
        --data texts.txt
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
from typing import Any

import numpy as np

import specdec_jax as sd
from specdec_jax.flags import FlagError
from specdec_jax.flags.common import add_drafter_flag, add_dtype_flag, check_at_least_one
from specdec_jax.flags.mesh import (
  add_mesh_flag,
  check_batch,
  load_target,
  mesh_from_flag,
)
from specdec_jax.flags.methods import (
  add_method_flags,
  method_from_args,
)
from specdec_jax.io.prompts import encode_lm_prompts, read_texts
from specdec_jax.io.reports import fmt, to_jsonable
from specdec_jax.io.streams import emit
from specdec_jax.loading import DRAFTER_KINDS, MethodChoice, drafter_loader, placed_method
from specdec_jax.runs import REPORTED
from specdec_jax_lab import evaluation
from specdec_jax_lab.errors import EvaluationError

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
           f"tokens/target call   {f(stats.get('tokens_per_target_call'))}",
           f"target calls         {stats['target_calls']} per-row verifier calls, "
           f"{stats['rounds']} batched rounds"]
  if "acceptance_rate" in stats:
    lines.append(f"acceptance rate      {f(stats['acceptance_rate'])}   (accepted / drafted)")
  # the method's own statistics (its value's `statistics`), as its stats carry them
  for key in REPORTED:
    if key in stats and key != "acceptance_rate":
      lines.append(f"{key:<20} {f(stats[key])}")
  return "\n".join(lines)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalRun:
  """What `specdec eval` scores and how, beside the method (`MethodChoice`).

  Attributes:
    metric: "bleu" (BLEU and chrF of translations) or "perplexity" (an LM's).
    model: the model: a checkpoint dir, a bundled name or config:NAME.
    data: a prepared data dir or a .jsonl file (perplexity: a text or .jsonl file).
    split: the split of a data dir.
    tokenizer: None: the data dir's spiece.model.
    limit: only the first `limit` pairs (texts).
    batch_size: rows per decode call.
    max_new_tokens: None: the split's target length.
    max_length: perplexity: texts cut at this many tokens (None: the model's positions).
    seed: the PRNG seed of sampling.
    dtype: the models' compute dtype.
    mesh: "data=D,model=M" (None: one device).
    warmup: decode the first batch once untimed, so the timing excludes compilation.
    json: print one JSON object instead of the report.
  """

  metric: str = "bleu"
  model: str
  data: str
  split: str = "test"
  tokenizer: str | None = None
  limit: int | None = None
  batch_size: int = 32
  max_new_tokens: int | None = None
  max_length: int | None = None
  seed: int = 0
  dtype: str = "float32"
  mesh: str | None = None
  warmup: bool = True
  json: bool = False

  def __post_init__(self):
    check_at_least_one(batch_size=self.batch_size, limit=self.limit,
                       max_new_tokens=self.max_new_tokens, max_length=self.max_length)


def from_args(args) -> tuple[MethodChoice | None, EvalRun]:
  """The typed settings of the flags (no method for perplexity), checked before any model
  is loaded: where the command line's namespace stops."""
  choice = None
  if args.metric == "perplexity":
    given = [flag for flag, value in (("--drafter", args.drafter), ("--method", args.method))
             if value is not None]
    if given:
      raise FlagError(f"{', '.join(given)}: --metric perplexity scores the model alone")
  else:
    choice = method_from_args(args)
  return choice, EvalRun(
      metric=args.metric, model=args.model, data=args.data, split=args.split,
      tokenizer=args.tokenizer, limit=args.limit, batch_size=args.batch_size,
      max_new_tokens=args.max_new_tokens, max_length=args.max_length, seed=args.seed,
      dtype=args.dtype, mesh=args.mesh, warmup=args.warmup, json=args.json)


def _drafter_flag(choice: MethodChoice) -> str:
  """--drafter, which speculative and BiLD need (a `MethodChoice` built in code may lack it)."""
  if choice.drafter is None:
    raise FlagError(f"--method {choice.name} needs --drafter")
  return choice.drafter


def _method(choice: MethodChoice, model, run: EvalRun, mesh):
  """The tools method of `choice`, its --drafter loaded as the value's `drafter_role` says: a
  drafter (a model, or "ngram" fitted on the data's train split, "prompt-lookup"), a small
  model (unless early-exit:K, the target itself); an n-gram rescorer named "data" is fitted
  on the data too."""
  load = drafter_loader(run.dtype)
  drafter, role = None, choice.value.drafter_role
  if role == "drafter":
    drafter = choice.drafter if choice.drafter in DRAFTER_KINDS else load(_drafter_flag(choice))
    data_dir = None if evaluation.is_jsonl(run.data) else pathlib.Path(run.data)
    drafter = evaluation.resolve_drafter(drafter, model, data_dir)
  elif role is not None and not choice.early_exit:
    drafter = load(_drafter_flag(choice))
  models = dict(choice.models)
  if (models.get("--rescorer") == "data" and isinstance(choice.value, sd.Blockwise)
      and choice.value.rescoring == "ngram"):
    models["--rescorer"] = run.data
    choice = dataclasses.replace(choice, models=tuple(models.items()))
  return placed_method(choice, model, run.model, drafter, load, mesh)


def perplexity(run: EvalRun) -> dict[str, Any]:
  """Per-token perplexity of --model on the texts of --data (`evaluation.perplexity`): each
  text encoded as a prompt is (BOS as the tokenizer has it, no EOS), cut at --max-length
  (default: the model's max_positions) tokens, every token after the first scored."""
  if not os.path.isfile(run.data):
    raise FlagError(f"--data {run.data!r}: --metric perplexity reads a text file (one text "
                   "per line) or a .jsonl file (one JSON string or {\"text\": ...} per line)")
  texts = read_texts(run.data)[:run.limit]
  if not texts:
    raise EvaluationError(f"--data {run.data!r} holds no texts")
  tokenizer = sd.load_tokenizer(run.tokenizer) if run.tokenizer else None
  model = load_target(run.model, run.dtype, None, what="model")
  if not isinstance(model.config, sd.LMConfig):   # not decoder-only
    raise FlagError("--metric perplexity scores decoder-only models (GPT-2, Llama); "
                   f"{run.model} is a T5 encoder-decoder: score it with BLEU / chrF")
  limit = run.max_length or model.config.max_positions
  tokens, lengths = encode_lm_prompts(texts, tokenizer, model.config)
  cut = int((lengths > limit).sum())
  tokens, lengths = tokens[:, :limit], np.minimum(lengths, limit)
  if tokens.shape[1] < 2:
    raise EvaluationError("every text is one token long: nothing to predict")
  result = evaluation.perplexity(model, tokens, lengths, batch_size=run.batch_size)
  return {**result, "truncated": cut, "max_length": limit}


def _run_perplexity(run: EvalRun) -> int:
  result = perplexity(run)
  if run.json:
    settings = {"metric": "perplexity", "model": run.model, "data": run.data,
                "tokenizer": run.tokenizer, "limit": run.limit, "dtype": run.dtype}
    emit(json.dumps(to_jsonable({**result, "settings": settings})))
  else:
    emit(f"{run.model} on {run.data}: perplexity")
    emit(f"perplexity           {result['perplexity']:.3f}")
    emit(f"nll                  {result['nll']:.4f}   (nats per token)")
    emit(f"tokens scored        {result['tokens']} (every token after each text's first)")
    emit(f"texts                {result['sequences']}"
         + (f" ({result['truncated']} cut at {result['max_length']} tokens)"
            if result["truncated"] else ""))
  return 0


def run(args) -> int:
  return evaluate(*from_args(args))


def evaluate(choice: MethodChoice | None, run: EvalRun) -> int:
  """`specdec eval` on typed settings: score, print the report (or JSON)."""
  if run.metric == "perplexity":
    return _run_perplexity(run)
  if choice is None:
    raise FlagError(f"--metric {run.metric} scores a decoding method: choice is None")
  mesh = mesh_from_flag(run.mesh)
  check_batch(run.batch_size, mesh)
  sampling = choice.sampling
  if evaluation.is_jsonl(run.data):
    if not os.path.isfile(run.data):
      raise FlagError(f"--data {run.data!r}: no such file")
    if choice.drafter == "ngram" or dict(choice.models).get("--rescorer") == "data":
      raise FlagError("the n-gram drafter / rescorer is fitted on a prepared data dir's train "
                     "split; a .jsonl file has none (use a model drafter, or --data DIR)")
  elif not os.path.isdir(run.data):
    raise FlagError(f"--data {run.data!r} is neither a .jsonl file of pairs nor a directory "
                   "(prepare one with `specdec train --stages data`)")
  evaluation.check_split(run.data, run.split)
  tokenizer = sd.load_tokenizer(run.tokenizer) if run.tokenizer else None
  model = load_target(run.model, run.dtype, mesh, what="model")
  if model.is_decoder_only:
    raise FlagError(f"{run.model} is a decoder-only LM: BLEU / chrF score translations of a "
                   "T5 data split; score an LM with --metric perplexity (or continuations "
                   "with specdec sweep-bild --tokenizer)")
  method = _method(choice, model, run, mesh)
  scored = evaluation.EvalSettings(
      split=run.split, method="greedy" if sampling.is_greedy else "sample", sampling=sampling,
      gamma=getattr(method, "gamma", 5), batch_size=run.batch_size,
      max_new_tokens=run.max_new_tokens, limit=run.limit, seed=run.seed, warmup=run.warmup)
  result = evaluation.evaluate(model, run.data, scored, decode_method=method,
                               tokenizer=tokenizer)
  result.pop("references")
  if run.json:
    settings = {**result.pop("settings"), "model": run.model, "data": run.data,
                "split": run.split, "drafter": choice.drafter, "dtype": run.dtype,
                "seed": run.seed, "mesh": run.mesh}
    emit(json.dumps(to_jsonable({**result, "settings": settings})))
  else:
    kind = method.describe().rsplit(",", 1)[0]
    emit(f"{run.model} on {run.data} [{run.split}]: {kind}, {result['sampling']}")
    emit(_report(result))
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
  p.add_argument("--split", default="test",
                 help="train, validation or test (default: test); a .jsonl file is one split, "
                 "test")
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
