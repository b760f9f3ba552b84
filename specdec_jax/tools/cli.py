"""The `specdec` command line: decode, convert, bench, train, eval.

    specdec decode --model config:t5_1_1_tiny "5 17 42 1"                 # token ids in, ids out
    specdec decode --model DIR --drafter DRAFT_DIR --tokenizer spiece.model "Hello." --stats
    specdec decode --model DIR --drafter prompt-lookup --input-file prompts.txt --json
    specdec convert t5x/checkpoint_1000000 out_dir --dtype bfloat16 [--to hf]
    specdec bench --target config:t5_1_1_small --drafter config:t5_1_1_tiny_drafter --out bench/
    specdec train --recipe configs/demo/train.json --workdir runs/demo --stages data,target
    specdec eval --model runs/demo/target/final --data runs/demo/data --drafter ngram --json

Every subcommand is registered by one `_add_<name>(subparsers)` function listed in
`COMMANDS`; it sets `func(args) -> int` on its parser.

Bad input (unknown model or config, invalid sampling or gamma, malformed prompts, a
drafter whose vocabulary differs from the target's, ...) prints one line
``specdec <command>: error: <message>`` on stderr and returns exit code 2, like
argparse's own usage errors. `main` returns the exit code instead of raising
SystemExit, so tests and scripts can call `main([...])` directly.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

EXIT_OK, EXIT_USAGE = 0, 2
DTYPES = ("float32", "bfloat16")
DRAFTER_KINDS = ("ngram", "prompt-lookup")


class CLIError(ValueError):
  """A command-line input the library would not catch itself (prompts, flag combinations)."""


def user_errors() -> tuple[type[BaseException], ...]:
  """Exception types that mean "bad input": reported in one line with exit code 2."""
  import specdec_jax as sd
  from specdec_jax.io.checkpoints.errors import CheckpointError
  from specdec_jax.io.tokenizer import TokenizerError
  from specdec_jax.tools import bench
  return (CLIError, sd.InputError, sd.SamplingError, sd.ConfigError, CheckpointError,
          TokenizerError, bench.BenchError, FileNotFoundError, IsADirectoryError,
          NotADirectoryError, PermissionError)


# ----------------------------------------------------------------------------- prompts


def read_prompt_lines(prompts: Sequence[str], input_file: str | None, stdin=None) -> list[str]:
  """Prompts from arguments, `--input-file FILE` ("-" = stdin), or stdin.

  Stdin is read when the only argument is "-", or when there are no prompt arguments
  and stdin is not a terminal. File and stdin input is one prompt per line; blank
  lines are skipped (so output line i answers the i-th non-blank input line).
  """
  stdin = sys.stdin if stdin is None else stdin
  prompts = list(prompts)
  if input_file is not None and prompts:
    raise CLIError("give prompts either as arguments or with --input-file, not both")
  if input_file is not None:
    if input_file == "-":
      text = stdin.read()
    else:
      with open(input_file, encoding="utf-8") as f:
        text = f.read()
  elif prompts == ["-"] or (not prompts and stdin is not None and not _isatty(stdin)):
    text = stdin.read()
  else:
    if "-" in prompts:
      raise CLIError('"-" (read stdin) must be the only prompt argument')
    if not prompts:
      raise CLIError("no prompts: give them as arguments, with --input-file, or on stdin")
    return prompts
  lines = [line for line in text.splitlines() if line.strip()]
  if not lines:
    where = "stdin" if input_file in (None, "-") else repr(input_file)
    raise CLIError(f"no prompts: {where} holds no non-blank lines")
  return lines


def _isatty(stream) -> bool:
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError, OSError):
    return True  # unknown or closed stream: do not block on it


def parse_token_ids(prompts: Sequence[str], vocab_size: int) -> np.ndarray:
  """Space- or comma-separated token ids per prompt -> int32 [B, L], right-padded with 0.

  Ids are used verbatim: no EOS is appended (end a prompt with 1 for T5's EOS).
  """
  rows = []
  for i, prompt in enumerate(prompts, 1):
    parts = prompt.replace(",", " ").split()
    if not parts:
      raise CLIError(f"prompt {i} is empty")
    row = []
    for part in parts:
      try:
        row.append(int(part))
      except ValueError:
        raise CLIError(f"prompt {i}: {part!r} is not an integer token id (without --tokenizer "
                       "prompts are space-separated token ids, e.g. \"5 17 42 1\")") from None
    bad = [t for t in row if not 0 <= t < vocab_size]
    if bad:
      raise CLIError(f"prompt {i}: token id {bad[0]} is outside the model vocabulary "
                     f"[0, {vocab_size})")
    rows.append(row)
  out = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def encode_prompts(prompts: Sequence[str], tokenizer, vocab_size: int) -> np.ndarray:
  """Text prompts -> int32 [B, L] (EOS-terminated, 0-padded) with `tokenizer`, or token ids."""
  if tokenizer is None:
    return parse_token_ids(prompts, vocab_size)
  if tokenizer.vocab_size > vocab_size:
    raise CLIError(f"tokenizer {tokenizer.path!r} has {tokenizer.vocab_size} pieces but the model "
                   f"vocabulary has only {vocab_size}: they do not belong together")
  return np.asarray(tokenizer.encode(list(prompts)), np.int32)


# ----------------------------------------------------------------------------- models


def note(message: str) -> None:
  print(f"specdec: note: {message}", file=sys.stderr)


# Random-weight "config:" models are deterministic (seed 0) and immutable, and building
# one compiles the initialiser: keep the last few, so that repeated `main([...])` calls in
# one process (tests, notebooks) pay for it once.
_CONFIG_MODELS: dict[tuple, Any] = {}
_CONFIG_MODELS_MAX = 4


def _config_model(name: str, overrides: dict[str, Any], dtype: str | None):
  import specdec_jax as sd
  config = sd.get_config(name, **overrides)
  key = (config, dtype)
  if key not in _CONFIG_MODELS:
    model = sd.init_model(config, 0)   # what sd.load("config:NAME") does
    while len(_CONFIG_MODELS) >= _CONFIG_MODELS_MAX:
      _CONFIG_MODELS.pop(next(iter(_CONFIG_MODELS)))
    _CONFIG_MODELS[key] = model if dtype is None else model.astype(dtype)
  return _CONFIG_MODELS[key]


def int_list(text: str) -> list[int]:
  """argparse type: "1,2,4" or "1-8" (or a mix, "1,4-6") -> positive ints."""
  values: list[int] = []
  try:
    for part in (p.strip() for p in text.split(",")):
      if "-" in part[1:]:
        lo, hi = part.split("-", 1)
        values += range(int(lo), int(hi) + 1)
      elif part:
        values.append(int(part))
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected integers like 1,2,4 or 1-8, got {text!r}") from None
  if not values or min(values) < 1:
    raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
  return values


def load_model(spec: str, dtype: str | None = "float32", what: str = "model",
               overrides: dict[str, Any] | None = None):
  """`sd.load` plus the CLI's notes; "config:NAME" may take architecture `overrides`.

  dtype None keeps the stored dtype (config:NAME models: float32).
  """
  import specdec_jax as sd
  if spec.startswith("config:"):
    model = _config_model(spec[len("config:"):], overrides or {}, dtype)
    extra = f" with overrides {overrides}" if overrides else ""
    note(f"{what} {spec}{extra} has RANDOM weights (seed 0): outputs are meaningless "
         "apart from speed")
    return model
  if overrides:
    raise CLIError(f"{what} overrides only apply to config:NAME models, not {spec!r}")
  return sd.load(spec, dtype=dtype)


def parse_overrides(text: str | None) -> dict[str, Any]:
  """"vocab_size=32128,num_decoder_layers=2" -> dict (values parsed as JSON, else strings)."""
  out: dict[str, Any] = {}
  if not text:
    return out
  for item in text.split(","):
    if not item.strip():
      continue
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
      raise CLIError(f"override {item!r} is not KEY=VALUE")
    try:
      out[key.strip()] = json.loads(value)
    except json.JSONDecodeError:
      out[key.strip()] = value.strip()
  return out


def make_drafter(spec: str | None, target, encoder_tokens: np.ndarray, dtype: str | None):
  """--drafter: None (baseline), "ngram", "prompt-lookup", or a model path / name."""
  import specdec_jax as sd
  from specdec_jax import drafters
  if spec is None:
    return None
  vocab = target.config.vocab_size
  if spec == "ngram":
    # No data here: fit the tables on the prompts' own tokens. A poor drafter (the
    # outputs are not the inputs), but a valid one; fit on target outputs in Python
    # (sd.NGramDrafter.fit) for a useful table.
    drafter = sd.NGramDrafter.fit([row[row > 0].tolist() for row in encoder_tokens],
                                  vocab_size=vocab)
  elif spec == "prompt-lookup":
    drafter = sd.PromptLookupDrafter(vocab_size=vocab)
  else:
    drafter = load_model(spec, dtype, what="drafter")
  return drafters.as_drafter(drafter, target)   # checks the vocabulary


def make_sampling(method: str | None, temperature, top_k, top_p):
  """--method/--temperature/--top-k/--top-p -> sd.Greedy() or sd.Sampling(...)."""
  import specdec_jax as sd
  given = [name for name, v in (("--temperature", temperature), ("--top-k", top_k),
                                ("--top-p", top_p)) if v is not None]
  if method is None:
    method = "sample" if given else "greedy"
  if method == "greedy":
    if given:
      raise CLIError(f"{', '.join(given)} only apply with --method sample")
    return sd.Greedy()
  return sd.Sampling(temperature=1.0 if temperature is None else temperature,
                     top_k=0 if top_k is None else top_k, top_p=1.0 if top_p is None else top_p)


# ----------------------------------------------------------------------------- JSON helpers


def to_jsonable(x: Any) -> Any:
  """Arrays -> lists, numpy/jax scalars -> Python numbers, non-finite floats -> None."""
  if isinstance(x, dict):
    return {str(k): to_jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [to_jsonable(v) for v in x]
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    x = np.asarray(x)
    return to_jsonable(x.tolist()) if x.ndim else to_jsonable(x.item())
  if isinstance(x, (bool, np.bool_)):
    return bool(x)
  if isinstance(x, (int, np.integer)):
    return int(x)
  if isinstance(x, (float, np.floating)):
    return float(x) if math.isfinite(x) else None
  return x


# ----------------------------------------------------------------------------- decode


def _decode_once(args, target, drafter, tokens, sampling, rng):
  import specdec_jax as sd
  if drafter is None:
    return sd.generate(target, tokens, max_new_tokens=args.max_new_tokens, sampling=sampling,
                       rng=rng)
  return sd.speculative_generate(target, drafter, tokens, gamma=args.gamma,
                                 max_new_tokens=args.max_new_tokens, sampling=sampling, rng=rng,
                                 lenience=args.lenience, adaptive=args.adaptive_gamma or None)


_SUMMED = ("target_calls", "rounds", "drafter_calls", "drafted", "accepted",
           "per_position_accepted")


def merge_stats(chunks: list[dict[str, Any]], lengths: list[np.ndarray]) -> dict[str, Any]:
  """Host stats of several decode batches as one: counters summed, `*_per_row` concatenated,
  ratios recomputed. alpha over several batches is the drafted-weighted mean of theirs."""
  chunks = [{k: np.asarray(v) for k, v in c.items()} for c in chunks]
  if len(chunks) == 1:
    return chunks[0]
  out: dict[str, Any] = {}
  for key in chunks[0]:
    values = [c[key] for c in chunks]
    if key.endswith("_per_row"):
      out[key] = np.concatenate(values)
    elif key in _SUMMED:
      out[key] = sum(values)
    else:
      out[key] = values[0]
  n = float(sum(int(np.sum(x)) for x in lengths))
  if "drafted" in out:
    drafted = [float(c["drafted"]) for c in chunks]
    out["acceptance_rate"] = float(out["accepted"]) / max(float(out["drafted"]), 1.0)
    out["tokens_per_target_call"] = n / max(float(out["target_calls"]), 1.0)
    out["alpha"] = (sum(float(c["alpha"]) * d for c, d in zip(chunks, drafted))
                    / max(sum(drafted), 1.0))
  else:  # baseline: target_calls counts batched calls, each serving every row of its batch
    out["tokens_per_target_call"] = n / max(
        sum(float(c["target_calls"]) * len(x) for c, x in zip(chunks, lengths)), 1.0)
  return out


def _trim_padding(tokens: np.ndarray) -> np.ndarray:
  """Drop all-pad trailing columns (a batch of short prompts need not pay for a long one)."""
  used = np.flatnonzero(np.any(tokens != 0, axis=0))
  return tokens[:, :int(used[-1]) + 1 if used.size else 1]


def _stats_block(stats: dict[str, Any], timing: dict[str, Any], speculative: bool) -> str:
  def f(x, digits=3):
    return "n/a" if x is None else f"{float(x):.{digits}f}"
  lines = ["-- specdec decode statistics --",
           f"method               {timing['method']}",
           f"prompts              {timing['prompts']} (batches of {timing['batch_size']})",
           f"generated tokens     {timing['generated_tokens']}",
           f"wall time            {timing['wall_s']:.3f} s"
           + ("" if timing["warmup"] else " (includes compilation; --warmup excludes it)"),
           f"tokens/s             {f(timing['tokens_per_s'], 1)}",
           f"ms/token             {f(timing['ms_per_token'], 2)}   (wall time / generated tokens,"
           " summed over rows)"]
  if speculative:
    lines += [f"target calls         {int(stats['target_calls'])} per-row verifier calls, "
              f"{int(stats['rounds'])} batched rounds",
              f"drafter calls        {int(stats['drafter_calls'])}",
              f"tokens/target call   {f(stats['tokens_per_target_call'])}",
              f"acceptance rate      {f(stats['acceptance_rate'])}   (accepted / drafted)",
              f"alpha                {f(stats['alpha'])}   (mean of sum_x min(p, q))"]
    if bool(stats.get("lossy", False)):
      lines.append(f"lenience             {stats['lenience']} (LOSSY: output distribution "
                   "differs from the target's)")
  else:
    lines += [f"target calls         {int(stats['target_calls'])} batched calls",
              f"tokens/target call   {f(stats['tokens_per_target_call'])}   (per row)"]
  return "\n".join(lines)


def _format_output(tokens: np.ndarray, length: int, tokenizer) -> str | list[int]:
  row = np.asarray(tokens[:length])
  if tokenizer is None:
    return [int(t) for t in row]
  # A model's embedding may be padded beyond the SentencePiece vocabulary (T5: 32128 vs
  # 32100); such ids have no text, show them as <unk>.
  row = np.where(row < tokenizer.vocab_size, row, tokenizer.unk_id)
  return tokenizer.decode_one(row)


def run_decode(args) -> int:
  import jax
  import specdec_jax as sd
  # Cheap checks first: no model is loaded for an invalid request.
  if args.gamma is not None and args.gamma < 1:
    raise CLIError(f"--gamma must be an integer >= 1, got {args.gamma}")
  if args.drafter is None:
    used = [flag for flag, on in (("--gamma", args.gamma is not None),
                                  ("--adaptive-gamma", args.adaptive_gamma),
                                  ("--lenience", args.lenience is not None)) if on]
    if used:
      raise CLIError(f"{', '.join(used)} only apply to speculative decoding: add --drafter")
  args.gamma = 5 if args.gamma is None else args.gamma
  args.lenience = 1.0 if args.lenience is None else args.lenience
  if not 0.0 < args.lenience <= 1.0:
    raise CLIError(f"--lenience must be in (0, 1] (1 = exact), got {args.lenience}")
  if args.max_new_tokens < 1:
    raise CLIError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
  if args.batch_size is not None and args.batch_size < 1:
    raise CLIError(f"--batch-size must be >= 1, got {args.batch_size}")
  sampling = make_sampling(args.method, args.temperature, args.top_k, args.top_p)
  prompts = read_prompt_lines(args.prompts, args.input_file)
  tokenizer = sd.load_tokenizer(args.tokenizer) if args.tokenizer else None

  t_load = time.perf_counter()
  target = load_model(args.model, args.dtype, what="model")
  tokens = encode_prompts(prompts, tokenizer, target.config.vocab_size)
  drafter = make_drafter(args.drafter, target, tokens, args.dtype)
  load_s = time.perf_counter() - t_load

  rng = jax.random.PRNGKey(args.seed)
  batch = args.batch_size or len(prompts)
  chunks = [_trim_padding(tokens[i:i + batch]) for i in range(0, len(prompts), batch)]
  if args.warmup:
    jax.block_until_ready(_decode_once(args, target, drafter, chunks[0], sampling, rng))
  t0 = time.perf_counter()
  outs = []
  for i, chunk in enumerate(chunks):
    key = rng if i == 0 else jax.random.fold_in(rng, i)   # one batch: exactly sd.*(rng=seed)
    out = _decode_once(args, target, drafter, chunk, sampling, key)
    outs.append(jax.device_get(out))
  wall = time.perf_counter() - t0

  lengths = [np.asarray(o.lengths) for o in outs]
  outputs = [_format_output(np.asarray(o.tokens)[r], int(o.lengths[r]), tokenizer)
             for o in outs for r in range(len(o.lengths))]
  stats = merge_stats([dict(o.stats) for o in outs], lengths)
  generated = int(sum(int(np.sum(x)) for x in lengths))
  speculative = drafter is not None
  method = "baseline (sd.generate)"
  if speculative:
    kind = args.drafter if args.drafter in DRAFTER_KINDS else "model"
    method = (f"speculative (drafter {kind}, gamma {args.gamma}"
              + (", adaptive" if args.adaptive_gamma else "") + ")")
  method += f", {'greedy' if sampling.is_greedy else 'sampling ' + repr(sampling)}"
  timing = {"method": method, "prompts": len(prompts), "batch_size": batch,
            "generated_tokens": generated, "wall_s": wall, "load_s": load_s,
            "warmup": bool(args.warmup), "includes_compile": not args.warmup,
            "tokens_per_s": generated / wall if wall > 0 else None,
            "ms_per_token": 1e3 * wall / generated if generated else None}

  if args.json:
    payload = {"outputs": outputs, "lengths": [int(x) for l in lengths for x in l],
               "stats": stats, "timing": timing,
               "settings": {"model": args.model, "drafter": args.drafter,
                            "tokenizer": args.tokenizer, "sampling": repr(sampling),
                            "gamma": args.gamma if speculative else None,
                            "adaptive_gamma": bool(args.adaptive_gamma),
                            "lenience": args.lenience, "max_new_tokens": args.max_new_tokens,
                            "seed": args.seed, "dtype": args.dtype}}
    print(json.dumps(to_jsonable(payload)))
  else:
    for o in outputs:
      print(o if isinstance(o, str) else " ".join(map(str, o)))
  if args.stats:
    print(_stats_block(stats, timing, speculative), file=sys.stderr)
  return EXIT_OK


def _add_decode(subparsers) -> None:
  p = subparsers.add_parser(
      "decode", help="decode prompts with a model (baseline or speculative)",
      description="Decode prompts with a T5 model, optionally speculatively with a drafter. "
      "Without --tokenizer, prompts are space-separated token ids used verbatim (no EOS is "
      "added) and outputs are token ids (EOS included); with one, prompts are text.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("prompts", nargs="*", metavar="PROMPT",
                 help='prompts; "-" or none (with stdin not a terminal) reads stdin, one per line')
  p.add_argument("--model", required=True, metavar="PATH_OR_NAME",
                 help="target model: checkpoint dir (T5X, HF, ours), bundled name, or "
                 "config:NAME for random weights")
  p.add_argument("--drafter", metavar="PATH_OR_NAME",
                 help="drafter model path/name, 'ngram' (bigram table fitted on the prompts' own "
                 "tokens: poor but valid) or 'prompt-lookup'; none: baseline decoding")
  p.add_argument("--tokenizer", metavar="PATH_OR_NAME",
                 help="SentencePiece model file/dir or bundled name; prompts become text")
  p.add_argument("--input-file", metavar="FILE", help='one prompt per line ("-" = stdin)')
  p.add_argument("--method", choices=("greedy", "sample"),
                 help="default: greedy, or sample if a sampling option is given")
  p.add_argument("--temperature", type=float, help="sampling temperature (>= 0; default 1)")
  p.add_argument("--top-k", type=int, help="keep the k most likely tokens (0 = off)")
  p.add_argument("--top-p", type=float, help="nucleus mass in (0, 1] (1 = off)")
  p.add_argument("--gamma", type=int, help="drafts per round (default 5)")
  p.add_argument("--adaptive-gamma", action="store_true",
                 help="per-row gamma in 1..GAMMA chosen on device each round")
  p.add_argument("--lenience", type=float,
                 help="(0, 1]; below 1 is LOSSY (Leviathan et al. A.5); default 1")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--batch-size", type=int, help="prompts per decode call (default: all)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--dtype", choices=DTYPES, default="float32",
                 help="parameter dtype (default float32, as T5X and HF load; bfloat16 "
                 "halves memory)")
  p.add_argument("--warmup", action="store_true",
                 help="run once before timing, so timing excludes compilation")
  p.add_argument("--stats", action="store_true", help="print decode statistics to stderr")
  p.add_argument("--json", action="store_true",
                 help='print one JSON object {"outputs", "stats", "timing", ...} instead of lines')
  p.set_defaults(func=run_decode)


# ----------------------------------------------------------------------------- convert


def run_convert(args) -> int:
  import shutil
  import specdec_jax as sd
  from specdec_jax.io import checkpoints
  from specdec_jax.io.tokenizer import MODEL_FILENAMES
  src_abs, dst_abs = os.path.abspath(args.src), os.path.abspath(args.dst)
  if src_abs == dst_abs:
    raise CLIError("SRC and DST are the same directory")
  if os.path.isfile(args.dst) or (os.path.isdir(args.dst) and os.listdir(args.dst)
                                  and not args.force):
    raise CLIError(f"{args.dst!r} exists and is not an empty directory (pass --force to "
                   "write into it)")
  model = load_model(args.src, dtype=None, what="source")   # convert keeps the stored dtype
  if args.to == "hf":
    if args.dtype is not None:
      model = model.astype(args.dtype)
    path = checkpoints.export_hf(args.dst, model.config, model.params)
  else:
    sd.save(args.dst, model, dtype=args.dtype)
    path = args.dst
  # Carry the tokenizer along when the source directory has one.
  if os.path.isdir(args.src):
    for name in MODEL_FILENAMES:
      if os.path.isfile(os.path.join(args.src, name)):
        shutil.copyfile(os.path.join(args.src, name), os.path.join(path, name))
        break
  print(f"wrote {args.to} checkpoint to {path} ({model.num_params():,} parameters, "
        f"dtype {args.dtype or 'as stored'})", file=sys.stderr)
  return EXIT_OK


def _add_convert(subparsers) -> None:
  p = subparsers.add_parser(
      "convert", help="convert a checkpoint to this package's format or Hugging Face's",
      description="Load any supported checkpoint (T5X legacy/Orbax, HF, ours, bundled name, "
      "config:NAME) and write it in our format (specdec_config.json + params.safetensors) or as "
      "a transformers T5 dir (config.json + model.safetensors). A spiece.model beside SRC is "
      "copied along.")
  p.add_argument("src", metavar="SRC")
  p.add_argument("dst", metavar="DST")
  p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                 help="cast floating params (default: as stored)")
  p.add_argument("--to", choices=("specdec", "hf"), default="specdec")
  p.add_argument("--force", action="store_true", help="write into a non-empty DST")
  p.set_defaults(func=run_convert)


# ----------------------------------------------------------------------------- bench


def _add_bench(subparsers) -> None:
  from specdec_jax.tools import bench
  p = subparsers.add_parser(
      "bench", help="time baseline vs speculative decoding side by side",
      description=bench.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
  bench.add_arguments(p)
  p.set_defaults(func=bench.run_from_args)


# ----------------------------------------------------------------------------- train


def parse_stages(text: str | None) -> tuple[str, ...]:
  """--stages: "all" or a comma-separated subset of demo.STAGES, kept in pipeline order."""
  from specdec_jax.tools import demo
  if text is None or text.strip() == "all":
    return tuple(demo.STAGES)
  names = [t.strip() for t in text.split(",") if t.strip()]
  unknown = [n for n in names if n not in demo.STAGES]
  if unknown or not names:
    raise CLIError(f"unknown stage(s) {', '.join(map(repr, unknown)) or repr(text)}; "
                   f"stages: {', '.join(demo.STAGES)} or all")
  return tuple(n for n in demo.STAGES if n in names)


def read_recipe(path: str, stages: Sequence[str]) -> dict[str, Any]:
  """The recipe JSON, checked to hold a section for every requested stage."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  try:
    recipe = json.loads(text)
  except json.JSONDecodeError as e:
    raise CLIError(f"recipe {path!r} is not valid JSON: {e}") from None
  if not isinstance(recipe, dict):
    raise CLIError(f"recipe {path!r} must hold a JSON object")
  needed = [s for s in stages if s != "bundle"]
  if {"aligned", "distilled"} & set(stages):
    needed += ["drafter"]   # their starting point and its architecture
  missing = sorted({s for s in needed if not isinstance(recipe.get(s), dict)})
  if missing:
    raise CLIError(f"recipe {path!r} has no section for stage(s) {', '.join(missing)}")
  for name in ("target", "drafter"):
    if name in needed and "config" not in recipe[name]:
      raise CLIError(f"recipe {path!r}: section {name!r} needs a \"config\" (model config JSON)")
  _check_recipe_arguments(path, recipe, needed)
  return recipe


def _check_recipe_arguments(path: str, recipe: dict[str, Any], sections: Sequence[str]) -> None:
  """Settings the pipeline would only reject mid-run: unknown prepare_de_en arguments, invalid
  TrainConfig values."""
  import dataclasses
  import inspect
  from specdec_jax.tools import training
  from specdec_jax.tools.data import prepare
  for name in sections:
    if name == "data":
      try:
        inspect.signature(prepare.prepare_de_en).bind("out_dir", **recipe["data"])
      except TypeError as e:
        raise CLIError(f"recipe {path!r}, section 'data': {e}") from None
      continue
    fields = {f.name for f in dataclasses.fields(training.TrainConfig)}
    unknown = sorted(set(recipe[name]) - fields - {"config"})
    if unknown:     # a typo must not silently train with the default
      raise CLIError(f"recipe {path!r}, section {name!r}: unknown key(s) {', '.join(unknown)}; "
                     f"known: config, {', '.join(sorted(fields))}")
    try:
      training.TrainConfig(**{k: v for k, v in recipe[name].items() if k in fields})
    except (TypeError, ValueError) as e:
      raise CLIError(f"recipe {path!r}, section {name!r}: {e}") from None


def run_train(args) -> int:
  from specdec_jax.tools import demo
  from specdec_jax.tools.data import DataError
  from specdec_jax.tools.training import TrainingError
  stages = parse_stages(args.stages)
  read_recipe(args.recipe, stages)
  data_ready = os.path.isfile(os.path.join(args.workdir, "data", "meta.json"))
  if "data" not in stages and not data_ready:   # every stage reads the train split
    raise CLIError(f"{os.path.join(args.workdir, 'data')!r} holds no prepared data: "
                   "add the 'data' stage")
  start = time.perf_counter()
  try:
    results = demo.run_pipeline(args.recipe, args.workdir, stages=stages)
  except DataError as e:   # an unusable dictionary file, too few pairs for the split sizes
    raise CLIError(str(e)) from e
  except TrainingError as e:  # a stage's checkpoints are past the recipe's steps
    raise CLIError(str(e)) from e
  for name, model in results.items():
    print(f"{name}: {os.path.join(args.workdir, name, 'final')} "
          f"({model.num_params():,} parameters)")
  if "bundle" in stages:
    print(f"bundle: {demo.ASSETS}")
  print(f"specdec train: stages {', '.join(stages)} done in {time.perf_counter() - start:.1f} s",
        file=sys.stderr)
  return EXIT_OK


def _add_train(subparsers) -> None:
  p = subparsers.add_parser(
      "train", help="run the demo training pipeline (data, target, drafters, bundle)",
      description="Run the De->En demo pipeline of a recipe JSON: 'data' prepares the "
      "dictionary (the recipe's \"data\" section is passed to prepare_de_en), 'target' and "
      "'drafter' train from scratch, 'aligned' / 'distilled' fine-tune the drafter on the "
      "target's greedy outputs / softmax, 'bundle' ships target + aligned drafter into the "
      "package assets. Finished stages are skipped and interrupted ones resume from their "
      "Orbax checkpoints; raising a stage's steps continues it from its last checkpoint, and "
      "a retrained target or drafter makes aligned / distilled start over.")
  p.add_argument("--recipe", required=True, metavar="JSON",
                 help="recipe file, e.g. configs/demo/train.json (model \"config\" paths are "
                 "relative to the repository root, or absolute)")
  p.add_argument("--workdir", required=True, metavar="DIR", help="where every stage writes")
  p.add_argument("--stages", default="all", metavar="LIST",
                 help="comma-separated subset of data,target,drafter,aligned,distilled,bundle, "
                 "or all")
  p.set_defaults(func=run_train)


# ----------------------------------------------------------------------------- eval


def _eval_drafter(spec: str | None, dtype: str | None):
  """--drafter for eval: None, the names evaluation resolves itself, or a loaded model."""
  if spec is None or spec in DRAFTER_KINDS:
    return spec
  return load_model(spec, dtype, what="drafter")


def _eval_report(result: dict[str, Any]) -> str:
  def f(x, digits=3):
    return "n/a" if x is None else f"{float(x):.{digits}f}"
  stats = result["stats"]
  lines = [f"BLEU                 {result['bleu']:.2f}",
           f"chrF                 {result['chrf']:.2f}",
           f"pairs                {result['pairs']} (batches of {result['batch_size']})",
           f"generated tokens     {result['generated_tokens']}",
           f"wall time            {result['wall_s']:.3f} s"
           + (" (includes compilation; --warmup excludes it)" if result["includes_compile"]
              else ""),
           f"ms/token             {f(result['ms_per_token'], 2)}",
           f"tokens/s             {f(result['tokens_per_s'], 1)}",
           f"tokens/target call   {f(stats['tokens_per_target_call'])}"]
  if result["speculative"]:
    lines += [f"acceptance rate      {f(stats['acceptance_rate'])}   (accepted / drafted)",
              f"alpha                {f(stats['alpha'])}",
              f"target calls         {stats['target_calls']} per-row verifier calls"]
  return "\n".join(lines)


def run_eval(args) -> int:
  from specdec_jax.tools import evaluation
  if args.gamma is not None and args.drafter is None:
    raise CLIError("--gamma only applies to speculative decoding: add --drafter")
  gamma = 5 if args.gamma is None else args.gamma
  for flag, value in (("--gamma", gamma), ("--batch-size", args.batch_size),
                      ("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens)):
    if value is not None and value < 1:
      raise CLIError(f"{flag} must be an integer >= 1, got {value}")
  sampling = make_sampling(args.method, args.temperature, args.top_k, args.top_p)
  if not os.path.isdir(args.data):
    raise CLIError(f"--data {args.data!r} is not a directory (prepare one with "
                   "`specdec train --stages data`)")
  tokenizer = None
  if args.tokenizer:
    import specdec_jax as sd
    tokenizer = sd.load_tokenizer(args.tokenizer)
  model = load_model(args.model, args.dtype, what="model")
  drafter = _eval_drafter(args.drafter, args.dtype)
  try:
    result = evaluation.evaluate(
        model, args.data, split=args.split, method="greedy" if sampling.is_greedy else "sample",
        sampling=sampling, drafter=drafter, gamma=gamma, batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens, limit=args.limit, tokenizer=tokenizer,
        seed=args.seed, warmup=args.warmup)
  except evaluation.EvaluationError as e:
    raise CLIError(str(e)) from e
  result.pop("references")
  if args.json:
    settings = {"model": args.model, "data": args.data, "split": args.split,
                "drafter": args.drafter, "dtype": args.dtype, "seed": args.seed}
    print(json.dumps(to_jsonable({**result, "settings": settings})))
  else:
    kind = ("baseline" if args.drafter is None else
            f"speculative (drafter {args.drafter}, gamma {gamma})")
    print(f"{args.model} on {args.data} [{args.split}]: {kind}, {result['sampling']}")
    print(_eval_report(result))
  return EXIT_OK


def _add_eval(subparsers) -> None:
  p = subparsers.add_parser(
      "eval", help="BLEU / chrF and speed of a model on a prepared data split",
      description="Translate a split of a prepared data directory (written by `specdec train "
      "--stages data`) with a model, baseline or speculative, and report sacrebleu corpus "
      "BLEU and chrF against its English side, with wall time and ms/token.")
  p.add_argument("--model", required=True, metavar="PATH_OR_NAME",
                 help="model: checkpoint dir, bundled name, or config:NAME")
  p.add_argument("--data", required=True, metavar="DIR",
                 help="prepared data dir (spiece.model, {split}.npz/.jsonl)")
  p.add_argument("--split", default="test", help="train, validation or test (default: test)")
  p.add_argument("--drafter", metavar="PATH_OR_NAME",
                 help="drafter model path/name, 'ngram' (bigram tables fitted on the data's "
                 "train targets) or 'prompt-lookup'; none: baseline decoding")
  p.add_argument("--gamma", type=int, help="drafts per round (default 5)")
  p.add_argument("--method", choices=("greedy", "sample"),
                 help="default: greedy, or sample if a sampling option is given")
  p.add_argument("--temperature", type=float, help="sampling temperature (>= 0; default 1)")
  p.add_argument("--top-k", type=int, help="keep the k most likely tokens (0 = off)")
  p.add_argument("--top-p", type=float, help="nucleus mass in (0, 1] (1 = off)")
  p.add_argument("--limit", type=int, help="evaluate only the first N pairs")
  p.add_argument("--batch-size", type=int, default=32,
                 help="rows per decode call; the last batch is padded to it (default: 32)")
  p.add_argument("--max-new-tokens", type=int, help="default: the split's target length")
  p.add_argument("--tokenizer", metavar="PATH_OR_NAME",
                 help="SentencePiece model (default: the data dir's spiece.model)")
  p.add_argument("--seed", type=int, default=0, help="PRNG seed for sampling (default: 0)")
  p.add_argument("--dtype", choices=DTYPES, default="float32",
                 help="parameter dtype (default float32, as T5X and HF load; bfloat16 "
                 "halves memory)")
  p.add_argument("--warmup", action="store_true",
                 help="decode the first batch once untimed, so timing excludes compilation")
  p.add_argument("--json", action="store_true",
                 help="print one JSON object (scores, timing, stats, hypotheses, settings)")
  p.set_defaults(func=run_eval)


# ----------------------------------------------------------------------------- main

#: One function per subcommand; each adds its parser and sets `func(args) -> int`.
COMMANDS: list[Callable[[Any], None]] = [_add_decode, _add_convert, _add_bench,
                                         _add_train, _add_eval]


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="specdec", description="Speculative decoding for T5 encoder-decoders in JAX.")
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
  for add in COMMANDS:
    add(subparsers)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  parser = build_parser()
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:   # argparse: usage errors (2) and --help (0)
    return e.code if isinstance(e.code, int) else EXIT_USAGE
  args.argv = list(sys.argv[1:] if argv is None else argv)
  try:
    return int(args.func(args) or EXIT_OK)
  except user_errors() as e:
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, OSError) and getattr(e, "filename", None) and e.strerror:
      message = f"{e.filename}: {e.strerror}"
    print(f"specdec {args.command}: error: {message}", file=sys.stderr)
    return EXIT_USAGE
  except KeyboardInterrupt:
    print("specdec: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
