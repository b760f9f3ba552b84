"""`specdec decode`: decode prompts with a model: baseline, speculative, BiLD or blockwise.

A T5 model translates each prompt (its encoder input); a decoder-only model (GPT-2,
Llama-style) continues it: the prompt is encoded without EOS (BOS as the tokenizer's
convention has it), batches are right-padded, each row's prompt length is passed on
(`prompt_lengths`), and the output is the continuation alone.
"""

from __future__ import annotations

import argparse
import warnings

import specdec_jax as sd
from specdec_jax.cli.decode_report import print_report
from specdec_jax.flags.common import DefaultsHelpFormatter, add_drafter_flag, add_dtype_flag
from specdec_jax.flags.mesh import add_mesh_flag
from specdec_jax.flags.methods import (
  METHOD_NAMES,
  add_method_flags,
  method_from_args,
)
from specdec_jax.loading import MethodChoice
from specdec_jax.runtime.decode_setup import DecodeRun, decode_request
from specdec_jax.runtime.distributed import add_distributed_flags, processes_from_args


def from_args(args) -> tuple[MethodChoice, DecodeRun]:
  """The typed settings of the flags, checked before any model is loaded: where the
  command line's namespace stops."""
  method = method_from_args(args)
  return method, DecodeRun(
      model=args.model, tokenizer=args.tokenizer, prompts=tuple(args.prompts),
      input_file=args.input_file, max_new_tokens=args.max_new_tokens,
      batch_size=args.batch_size, seed=args.seed, dtype=args.dtype, mesh=args.mesh,
      warmup=args.warmup, stats=args.stats, compare=args.compare, json=args.json,
      processes=processes_from_args(args), output=args.output, resume=args.resume,
      compile_cache=args.compile_cache)


def run(args) -> int:
  """Parse (`from_args`), decode (`decode_setup.decode_request`), print (`print_report`)."""
  with warnings.catch_warnings():   # a T5 input without EOS: noted per prompt, below
    warnings.simplefilter("ignore", sd.InputWarning)
    choice, settings = from_args(args)
    request = decode_request(choice, settings)
    return print_report(*request)


def decode(choice: MethodChoice, run: DecodeRun) -> int:
  """`specdec decode` on typed settings: decode (`decode_setup.decode_request`), print the
  outputs (stdout) and the requested reports (stderr)."""
  return print_report(*decode_request(choice, run))


def add(subparsers) -> None:
  p = subparsers.add_parser(
      "decode", help=f"decode prompts with a model ({', '.join(METHOD_NAMES)})",
      description="Decode prompts with a model, optionally speculatively with a drafter: a "
      "T5 model translates each prompt, a decoder-only model (GPT-2, Llama) continues it and "
      "prints the continuation. Without --tokenizer, prompts are space-separated token ids "
      "used verbatim (no EOS is added: end a T5 prompt with 1, or a note says it lacks one) "
      "and outputs are token ids (EOS included); with one, "
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
  p.add_argument("--input-file", metavar="FILE",
                 help='one prompt per line ("-" = stdin); an empty line is an empty input, '
                 "answered by its own output line")
  add_method_flags(p)
  p.add_argument("--max-new-tokens", type=int, default=64,
                 help="new tokens per prompt at most; a decoder-only model's budget is "
                 "lowered (with a note) so the longest prompt and it fit its max_positions")
  p.add_argument("--batch-size", type=int,
                 help="prompts per decode call (default: all; the last call is padded)")
  p.add_argument("--seed", type=int, default=0, help="PRNG seed of sampling")
  add_dtype_flag(p)
  add_mesh_flag(p)
  p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                 help="decode once untimed before timing, so timing excludes compilation; "
                 "--no-warmup times the compiling call too")
  p.add_argument("--compile-cache", action=argparse.BooleanOptionalAction, default=True,
                 help="keep compiled programs in JAX's persistent cache (per user: "
                 "$XDG_CACHE_HOME/specdec_jax/jax, ~/.cache/... by default), so a second run "
                 "compiles nothing; SPECDEC_COMPILE_CACHE=0 also turns it off")
  p.add_argument("--stats", action="store_true", help="print decode statistics to stderr")
  p.add_argument("--compare", action="store_true",
                 help="also time the target alone on the same inputs (both compiled first, 3 "
                 "alternating rounds) and print the speedup")
  p.add_argument("--json", action="store_true",
                 help='print one JSON object {"outputs", "stats", "timing", ...} instead of lines')
  p.add_argument("--output", metavar="FILE",
                 help="write the outputs to FILE, one line per input line, each batch appended "
                 "and fsync'd as it finishes (no warm-up pass: the timing includes compilation)"
                 "; FILE.specdec.json records the settings. Line breaks inside an output are "
                 "written as \\n, backslashes doubled")
  p.add_argument("--resume", action="store_true",
                 help="continue an interrupted --output FILE: its complete lines are kept, a "
                 "cut last line dropped, and decoding restarts at the first missing row "
                 "(refused if FILE was written with other settings or input)")
  add_distributed_flags(p)
  p.set_defaults(func=run)
