"""`specdec decode`: decode prompts with a model: baseline, speculative, BiLD or blockwise.

A T5 model translates each prompt (its encoder input); a decoder-only model (GPT-2,
Llama-style) continues it: the prompt is encoded without EOS (BOS as the tokenizer's
convention has it), batches are right-padded, each row's prompt length is passed on
(`prompt_lengths`), and the output is the continuation alone.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from typing import Any, NamedTuple

import jax
import numpy as np

import specdec_jax as sd
from specdec_jax.tools.batching import Batch, padded_batches, trim_padding
from specdec_jax.tools.cli.args import DefaultsHelpFormatter, add_drafter_flag, add_dtype_flag
from specdec_jax.tools.cli.distributed import (add_distributed_flags, gather_corpus,
                                               gather_max, initialize_from_args,
                                               local_batches, process_rows)
from specdec_jax.tools.cli.mesh_args import (add_mesh_flag, check_batch, mesh_batch,
                                             mesh_from_args, place_method, load_target)
from specdec_jax.tools.cli.method_args import (EARLY_EXIT, add_method_flags, build_method,
                                               check_method_flags, sampling_from_method_args)
from specdec_jax.tools.errors import CLIError
from specdec_jax.tools.methods import EXTRA_STATS, Baseline, decode_corpus
from specdec_jax.tools.models import drafter_loader, resolve_drafter
from specdec_jax.tools.options import check_at_least_one
from specdec_jax.tools.prompts import (encode_lm_prompts, encode_prompts, lm_batches,
                                       read_prompt_lines)
from specdec_jax.tools.report import fmt, to_jsonable
from specdec_jax.tools.timing import is_exact, ms_per_token, time_rounds


def _check(args) -> None:
  """Cheap checks first: no model is loaded for an invalid request. Fills the defaults."""
  check_method_flags(args)
  check_at_least_one(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)


def _stats_block(stats: dict[str, Any], timing: dict[str, Any], method) -> str:
  def f(x, digits=3):
    return fmt(x, digits, missing="n/a")
  lines = ["-- specdec decode statistics --",
           f"method               {timing['method']}",
           f"prompts              {timing['prompts']} (batches of {timing['batch_size']})",
           f"generated tokens     {timing['generated_tokens']}",
           f"wall time            {timing['wall_s']:.3f} s"
           + (" (compilation excluded)" if timing["warmup"] else
              " (INCLUDES compilation: --no-warmup)"),
           f"tokens/s             {f(timing['tokens_per_s'], 1)}",
           f"ms/token             {f(timing['ms_per_token'], 2)}   (wall time / generated tokens,"
           " summed over rows)",
           f"target calls         {int(stats['target_calls'])} per-row verifier calls, "
           f"{int(stats['rounds'])} batched rounds",
           f"tokens/target call   {f(stats['tokens_per_target_call'])}   (per row)"]
  if method.kind == "speculative":
    lines += [f"drafter calls        {int(stats['drafter_calls'])}",
              f"acceptance rate      {f(stats['acceptance_rate'])}   (accepted / drafted)",
              f"alpha                {f(stats['alpha'])}   (mean of sum_x min(p, q))"]
    if bool(stats.get("lossy", False)):
      lines.append(f"lenience             {stats['lenience']} (LOSSY: output distribution "
                   "differs from the target's)")
  for key in EXTRA_STATS.get(method.kind, ()):
    if key in stats:
      lines.append(f"{key:<20} {f(stats[key])}")
  if method.kind == "bild":
    lines.append(f"small-model calls    {int(stats['drafter_calls'])}   (BiLD is LOSSY by design)")
  return "\n".join(lines)


def _format_output(row: list[int], tokenizer) -> str | list[int]:
  if tokenizer is None:
    return row
  # A model's embedding may be padded beyond the tokenizer's vocabulary (T5: 32128 vs
  # 32100); such ids have no text, show them as <unk> (dropped if it has none).
  row = np.asarray(row, np.int64)
  if tokenizer.unk_id is None:
    row = row[row < tokenizer.vocab_size]
  row = np.where(row < tokenizer.vocab_size, row, tokenizer.unk_id)
  return tokenizer.decode_continuations(row[None])[0]


class Prompts(NamedTuple):
  """The encoded prompts: T5 encoder tokens [N, L] (0-padded, `lengths` None), or a
  decoder-only model's right-padded prompts [N, P] and their lengths [N]."""

  tokens: np.ndarray
  lengths: np.ndarray | None = None


def _encode(texts: list[str], tokenizer, target: sd.Model) -> Prompts:
  if target.is_decoder_only:
    return Prompts(*encode_lm_prompts(texts, tokenizer, target.config))
  return Prompts(encode_prompts(texts, tokenizer, target.config.vocab_size))


def _batches(prompts: Prompts, batch: int) -> tuple[list[Batch], list | None]:
  """Padded batches (trimmed to their longest prompt) and, for an LM, their lengths."""
  if prompts.lengths is not None:
    return lm_batches(prompts.tokens, prompts.lengths, batch)
  return [Batch(trim_padding(b.tokens), b.real)
          for b in padded_batches(prompts.tokens, batch)], None


def _ngram_drafter(prompts: Prompts, target: sd.Model):
  """The "ngram" drafter: bigram tables of the prompts' own tokens. An LM's prompts are
  texts with no start token before them, cut at their lengths."""
  vocab = target.config.vocab_size
  if prompts.lengths is None:
    return sd.NGramDrafter.fit([r[r > 0] for r in prompts.tokens], vocab_size=vocab)
  return sd.NGramDrafter.fit([r[:n] for r, n in zip(prompts.tokens, prompts.lengths)],
                             vocab_size=vocab, start_id=None)


def _family_loader(load, target: sd.Model, flag: str):
  """`load` refusing a model of another kind than the target's (T5 vs decoder-only)."""
  kind = lambda m: "a decoder-only LM" if m.is_decoder_only else "a T5 encoder-decoder"

  def checked(name: str) -> sd.Model:
    model = load(name)
    if isinstance(model, sd.Model) and model.is_decoder_only != target.is_decoder_only:
      raise CLIError(f"{flag} {name} is {kind(model)} but --model is {kind(target)}: "
                     "an LM drafts for an LM, a T5 for a T5")
    return model
  return checked


def _local_batches(prompts: Prompts, batch: int, process: int, processes: int):
  """This process's block of rows in padded batches (and, for an LM, their lengths)."""
  blocks = local_batches(prompts.tokens, batch, process, processes)
  if prompts.lengths is None:
    return [Batch(trim_padding(b.tokens), b.real) for b in blocks], None
  sizes = [np.asarray(b.tokens[:, 0], np.int32) for b in
           local_batches(prompts.lengths[:, None], batch, process, processes)]
  return [Batch(b.tokens[:, :int(n.max())], b.real) for b, n in zip(blocks, sizes)], sizes


def _decode(args, method, target, prompts: Prompts, mesh):
  """(corpus, wall seconds, batch size) of decoding the prompts in padded batches. With
  several processes and a mesh of each one's own devices (or none), each decodes its block
  of rows and all rows are gathered (the wall time is the slowest process's); on a mesh
  over every process's devices, all of them decode every batch as one program."""
  rng = jax.random.PRNGKey(args.seed)
  processes, process = jax.process_count(), jax.process_index()
  n = len(prompts.tokens)
  split_rows = processes > 1 and not sd.sharding.spans_processes(mesh)
  if split_rows:
    batch = args.batch_size or mesh_batch(process_rows(n, process, processes)[2], mesh)
    batches, lengths = _local_batches(prompts, batch, process, processes)
    first_key = process * len(batches)      # no two batches of the file share a key
  else:
    batch = args.batch_size or mesh_batch(n, mesh)
    batches, lengths = _batches(prompts, batch)
    first_key = 0
  call = functools.partial(decode_corpus, method, target, batches,
                           max_new_tokens=args.max_new_tokens, rng=rng,
                           prompt_lengths=lengths, first_key=first_key)
  if args.warmup:   # every batch once: trimmed batches may differ in shape
    call()
  t0 = time.perf_counter()
  corpus = call()
  wall = time.perf_counter() - t0
  if split_rows:
    corpus, wall = gather_corpus(corpus), gather_max(wall)
  return corpus, wall, batch


def _compare(args, method, target, prompts: Prompts, mesh,
             repeats: int = 3) -> dict[str, Any]:
  """The method vs the target alone on the same inputs: all compiled first, then timed in
  `repeats` alternating rounds; speedup of the medians over the FASTEST plain baseline
  (`Baseline(exact=False)`: natural call width). An exact method's padding cost shows in
  its own figure (`exact_cost`: the exact baseline over the plain one), not in the speedup."""
  rng = jax.random.PRNGKey(args.seed)
  batch = args.batch_size or mesh_batch(len(prompts.tokens), mesh)
  batches, lengths = _batches(prompts, batch)
  methods = {"method": method,
             "baseline": place_method(Baseline(sampling=method.sampling, exact=False), mesh)}
  if is_exact(method):
    methods["exact baseline"] = place_method(Baseline(sampling=method.sampling, exact=True),
                                             mesh)
  calls = {name: functools.partial(decode_corpus, m, target, batches,
                                   max_new_tokens=args.max_new_tokens, rng=rng,
                                   prompt_lengths=lengths)
           for name, m in methods.items()}
  for call in calls.values():
    call()
  timed = time_rounds(calls, repeats)
  ms = {name: ms_per_token(t) for name, t in timed.items()}
  exact_ms = ms.get("exact baseline")
  out = {"ms_per_token": ms["method"], "baseline_ms_per_token": ms["baseline"],
         "speedup": ms["baseline"] / ms["method"], "rounds": repeats,
         "exact_baseline_ms_per_token": exact_ms,
         "exact_cost": None if exact_ms is None else exact_ms / ms["baseline"],
         "same_tokens": bool(np.array_equal(timed["method"]["output"].tokens(),
                                            timed["baseline"]["output"].tokens()))}
  if (method.kind == "speculative" and mesh is None
      and not getattr(method.drafter, "shares_target_cache", False)):   # not an early exit
    out["costs"] = _costs(args, method, target, batches[0].tokens, timed["method"]["output"])
  return out


def _costs(args, method, target, encoder_tokens, corpus) -> dict[str, Any]:
  """The step costs behind a speculative run's speedup (`costs.explain_run`), measured
  at its batch size, with its verify calls' width (exact mode pads them off the kernels)."""
  from specdec_jax.decoding.engine import EXACT_WIDTH
  from specdec_jax.tools.costs import explain_run
  padded = is_exact(method) and not target.pack().width_invariant_decode
  return explain_run(target, method.drafter, method.gamma, encoder_tokens, corpus.stats,
                     capacity=args.max_new_tokens + EXACT_WIDTH + 1,
                     call_tokens=EXACT_WIDTH if padded else method.gamma + 1)


def _payload(args, outputs, corpus, timing, method, prompts: Prompts) -> dict[str, Any]:
  return {"outputs": outputs, "lengths": corpus.lengths, "stats": corpus.stats,
          "prompt_lengths": prompts.lengths, "timing": timing,
          "settings": {**method.settings(), "model": args.model, "drafter": args.drafter,
                       "tokenizer": args.tokenizer, "max_new_tokens": args.max_new_tokens,
                       "seed": args.seed, "dtype": args.dtype, "mesh": args.mesh}}


def run(args) -> int:
  _check(args)
  if initialize_from_args(args) and args.compare:
    raise CLIError("--compare times one process: drop it with several processes")
  mesh = mesh_from_args(args)
  if args.batch_size is not None:
    check_batch(args.batch_size, mesh)
  sampling = sampling_from_method_args(args)
  prompts = read_prompt_lines(args.prompts, args.input_file)
  tokenizer = sd.load_tokenizer(args.tokenizer) if args.tokenizer else None
  t_load = time.perf_counter()
  target = load_target(args.model, args.dtype, mesh, what="model")
  encoded = _encode(prompts, tokenizer, target)
  load = _family_loader(drafter_loader(args.dtype), target, "--drafter")
  drafter = None
  if args.drafter == "ngram":
    drafter = resolve_drafter(_ngram_drafter(encoded, target), target)
  elif args.drafter is not None and not args.drafter.startswith(EARLY_EXIT):
    drafter = resolve_drafter(args.drafter, target, load=load)
  early_exit = args.drafter is not None and args.drafter.startswith(EARLY_EXIT)
  rescorer_load = _family_loader(drafter_loader(args.dtype), target, "--rescorer")
  method = place_method(build_method(args, target, sampling, drafter, rescorer_load), mesh,
                        keep=("small",) if early_exit else ())
  load_s = time.perf_counter() - t_load
  corpus, wall, batch = _decode(args, method, target, encoded, mesh)
  generated = corpus.generated
  timing = {"method": method.describe(), "prompts": len(prompts), "batch_size": batch,
            "generated_tokens": generated, "wall_s": wall, "load_s": load_s,
            "warmup": bool(args.warmup), "includes_compile": not args.warmup,
            "processes": jax.process_count(),
            "mesh_spans_processes": sd.sharding.spans_processes(mesh),
            "tokens_per_s": generated / wall if wall > 0 else None,
            "ms_per_token": 1e3 * wall / generated if generated else None}
  compare = None
  if args.compare and method.kind != "baseline":
    compare = timing["compare"] = _compare(args, method, target, encoded, mesh)
  if jax.process_index() != 0:   # process 0 prints every process's rows
    return 0
  outputs = [_format_output(row, tokenizer) for row in corpus.token_rows()]
  if args.json:
    print(json.dumps(to_jsonable(_payload(args, outputs, corpus, timing, method,
                                                encoded))))
  else:
    for o in outputs:
      print(o if isinstance(o, str) else " ".join(map(str, o)))
  if args.stats:
    print(_stats_block(corpus.stats, timing, method), file=sys.stderr)
  if compare is not None:
    print(f"speedup vs baseline  {compare['speedup']:.2f}x   (sd.generate alone, exact=False, "
          f"on the same inputs, after compilation, median of {compare['rounds']} alternating "
          f"rounds: {compare['ms_per_token']:.2f} vs {compare['baseline_ms_per_token']:.2f} "
          f"ms/token; same tokens: {'yes' if compare['same_tokens'] else 'no'})",
          file=sys.stderr)
    if "costs" in compare:
      k = compare["costs"]
      print(f"why                  {k['tokens_per_target_call']:.2f} tokens per target call "
            f"/ ({k['drafts_per_target_call']:.2f} drafts x c {k['c']:.3f} + verify cost "
            f"{k['verify_cost']:.2f}) = {k['expected_speedup']:.2f}x expected from the calls "
            f"alone (c: a drafter step over a target step; verify cost: a "
            f"{k['call_tokens']}-token target call over a 1-token one)", file=sys.stderr)
    if compare["exact_cost"] is not None:
      print(f"exact mode's cost    {compare['exact_cost']:.2f}x   (the target alone in exact "
            f"mode: {compare['exact_baseline_ms_per_token']:.2f} ms/token)", file=sys.stderr)
  return 0


def add(subparsers) -> None:
  p = subparsers.add_parser(
      "decode", help="decode prompts with a model (baseline, speculative, BiLD, blockwise)",
      description="Decode prompts with a model, optionally speculatively with a drafter: a "
      "T5 model translates each prompt, a decoder-only model (GPT-2, Llama) continues it and "
      "prints the continuation. Without --tokenizer, prompts are space-separated token ids "
      "used verbatim (no EOS is added) and outputs are token ids (EOS included); with one, "
      "prompts are text (a decoder-only model's prompt: no EOS, BOS as the tokenizer "
      "prepends it).",
      formatter_class=DefaultsHelpFormatter)
  p.add_argument("prompts", nargs="*", metavar="PROMPT",
                 help='prompts; "-" or none (with stdin not a terminal) reads stdin, one per line')
  p.add_argument("--model", required=True, metavar="PATH_OR_NAME",
                 help="target model: checkpoint dir (T5X, HF, ours), bundled name, or "
                 "config:NAME for random weights")
  add_drafter_flag(p, "bigram table fitted on the prompts' own tokens: poor but valid")
  p.add_argument("--tokenizer", metavar="PATH_OR_NAME",
                 help="SentencePiece model file/dir, Hugging Face tokenizer.json (or its dir) "
                 "or bundled name; prompts become text")
  p.add_argument("--input-file", metavar="FILE", help='one prompt per line ("-" = stdin)')
  add_method_flags(p)
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--batch-size", type=int,
                 help="prompts per decode call (default: all; the last call is padded)")
  p.add_argument("--seed", type=int, default=0)
  add_dtype_flag(p)
  add_mesh_flag(p)
  p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                 help="decode once untimed before timing, so timing excludes compilation; "
                 "--no-warmup times the compiling call too")
  p.add_argument("--stats", action="store_true", help="print decode statistics to stderr")
  p.add_argument("--compare", action="store_true",
                 help="also time the target alone on the same inputs (both compiled first, 3 "
                 "alternating rounds) and print the speedup")
  p.add_argument("--json", action="store_true",
                 help='print one JSON object {"outputs", "stats", "timing", ...} instead of lines')
  add_distributed_flags(p)
  p.set_defaults(func=run)
