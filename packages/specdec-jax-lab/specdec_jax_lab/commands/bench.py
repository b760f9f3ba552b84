"""`specdec bench`: baseline vs speculative decoding side by side (`specdec_jax_lab.bench`)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from typing import Any, Mapping

import specdec_jax as sd
from specdec_jax.flags.common import (
  check_at_least_one,
  int_list,
  mode_list,
  parse_overrides,
)
from specdec_jax.flags.mesh import add_mesh_flag, check_batch, load_target, mesh_from_flag
from specdec_jax.io.prompts import file_prompts
from specdec_jax.io.reports import check_output_dir, read_json, to_jsonable
from specdec_jax.io.streams import emit
from specdec_jax.loading import DRAFTER_KINDS, DTYPES, load_model, note
from specdec_jax.sampling import MODES
from specdec_jax_lab import bench
from specdec_jax_lab.bench import method_specs
from specdec_jax_lab.errors import BenchError

DEFAULT_TARGET = "config:t5_1_1_small"
DEFAULT_DRAFTER = "config:t5_1_1_tiny_drafter"
EXACT = {"auto": None, "on": True, "off": False}   # --exact

#: Named settings for one-command runs; flags given explicitly override them.
PRESETS = {
    # The accelerator benchmark: T5-XXL verifier / T5-small drafter shapes in bfloat16
    # (random weights), greedy at batch 1/8/32, verify cost for k = 2..16 tokens.
    "xxl-small": {"target": "config:t5_1_1_xxl", "drafter": "config:t5_1_1_small",
                  "dtype": "bfloat16", "batch_sizes": [1, 8, 32], "gammas": list(range(1, 16)),
                  "modes": ["greedy"], "prompt_len": 32, "max_new_tokens": 32,
                  "ignore_eos": True, "repeats": 5},
}


def apply_preset(args) -> None:
  """Fill the preset's settings into `args`, except those given on the command line."""
  if args.preset is None:
    return
  given = {a.split("=")[0] for a in getattr(args, "argv", []) if a.startswith("--")}
  for key, value in PRESETS[args.preset].items():
    if "--" + key.replace("_", "-") not in given:
      setattr(args, key, value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchRun:
  """What `specdec bench` loads and where it writes, beside what it measures.

  Attributes:
    target, drafter: model paths/names or config:NAME (drafter None: the baseline only).
    target_overrides, drafter_overrides: architecture overrides of a config: model.
    dtype: both models' compute dtype.
    mesh: "data=D,model=M" (None: one device).
    prompts_file: one prompt per line (None: random ids).
    tokenizer: the prompts file holds text for it (None: token ids).
    out: the directory of bench.json, bench.md, bench.png.
    resume: keep the entries of an existing bench.json made with the same settings.
    specs: {method name: its specs} of the methods' flags (`bench.method_specs`: --bild,
      --heads-lattice, --beam; with a drafter --beam times `experimental.SpeculativeBeam`
      too).
    heads: prediction heads to time blockwise decoding with.
    preset: the --preset name, for the report.
    command: the command line, for the report.
    measured: what is measured and how (`bench.BenchSettings`).
  """

  target: str
  drafter: str | None
  target_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  drafter_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  dtype: str = "float32"
  mesh: str | None = None
  prompts_file: str | None = None
  tokenizer: str | None = None
  out: str = "bench_out"
  resume: bool = False
  specs: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
  heads: str | None = None
  preset: str | None = None
  command: str = ""
  measured: bench.BenchSettings = bench.BenchSettings()


def from_args(args) -> BenchRun:
  """The `BenchRun` of the flags (the preset filled in), checked before any model is
  loaded: where the command line's namespace stops."""
  apply_preset(args)
  check_at_least_one(prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens,
                     repeats=args.repeats, timing_steps=args.timing_steps)
  if args.drafter in DRAFTER_KINDS and not args.baseline_only:
    raise BenchError("bench times model drafters only (c comes from timing drafter decode "
                     "steps); give a drafter model path/name or config:NAME")
  specs = {m: tuple(getattr(args, method_specs.dest_of(m)))
           for m in method_specs.spec_methods()}
  method_specs.check_specs(specs, drafter=not args.baseline_only,
                           given={"--heads"} if args.heads else set(), modes=args.modes)
  if args.compile_workers is not None and args.compile_workers < 1:
    raise BenchError(f"--compile-workers must be at least 1, got {args.compile_workers}")
  if args.tokenizer and not args.prompts_file:
    raise BenchError("--tokenizer is only used with --prompts-file")
  measured = bench.BenchSettings(
      batch_sizes=tuple(args.batch_sizes), gammas=tuple(args.gammas), modes=tuple(args.modes),
      prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
      seed=args.seed, baseline_only=args.baseline_only, ignore_eos=args.ignore_eos,
      timing_steps=args.timing_steps, compile_workers=args.compile_workers,
      exact=EXACT[args.exact], progress=not args.no_progress)
  argv = getattr(args, "argv", sys.argv[1:])
  return BenchRun(
      target=args.target, drafter=None if args.baseline_only else args.drafter,
      target_overrides=parse_overrides(args.target_overrides),
      drafter_overrides=parse_overrides(args.drafter_overrides), dtype=args.dtype,
      mesh=args.mesh, prompts_file=args.prompts_file, tokenizer=args.tokenizer, out=args.out,
      resume=args.resume, specs={m.name: texts for m, texts in specs.items() if texts},
      heads=args.heads, preset=args.preset,
      command="specdec " + " ".join(shlex.quote(a) for a in argv), measured=measured)


def _config(run: BenchRun, drafter_overrides: Mapping[str, Any]) -> dict[str, Any]:
  """The descriptive settings stored under bench.json's "config"."""
  return {"target": run.target, "drafter": run.drafter,
          "target_overrides": dict(run.target_overrides) or None, "dtype": run.dtype,
          "prompts_file": run.prompts_file, "tokenizer": run.tokenizer,
          "preset": run.preset, "exact": run.measured.exact, "mesh": run.mesh,
          "prompts": (f"lines of {run.prompts_file}" if run.prompts_file else
                      "uniform random ids in [3, vocab), last token EOS"),
          "command": run.command, "drafter_overrides": dict(drafter_overrides) or None}


def _load_drafter(run: BenchRun, target) -> tuple[Any, dict[str, Any]]:
  """The drafter model and its overrides; a config: drafter takes the target's vocab_size
  unless overridden."""
  if run.drafter is None:   # the caller loads one only when --drafter is given
    raise BenchError("no --drafter to load")
  overrides = dict(run.drafter_overrides)
  if (run.drafter.startswith("config:") and "vocab_size" not in overrides
      and sd.get_config(run.drafter[len("config:"):]).vocab_size != target.config.vocab_size):
    overrides["vocab_size"] = target.config.vocab_size
    note(f"drafter {run.drafter}: vocab_size set to the target's {target.config.vocab_size} "
         "(random weights; pass --drafter-overrides to choose)")
  return load_model(run.drafter, run.dtype, what="drafter", overrides=overrides), overrides


def _existing(run: BenchRun, config: dict[str, Any]) -> dict[str, Any] | None:
  """The bench.json to --resume from, checked to be made with the same settings."""
  json_path = os.path.join(run.out, "bench.json")
  if not (run.resume and os.path.exists(json_path)):
    return None
  existing = read_json(json_path, "--resume: bench file")
  old = existing.get("config", {})
  m = run.measured
  now = {**config, "prompt_len": m.prompt_len, "max_new_tokens": m.max_new_tokens,
         "seed": m.seed, "ignore_eos": m.ignore_eos, "temperature_sample": 1.0}
  diff = [k for k in bench.RESUME_KEYS if old.get(k) != to_jsonable(now.get(k))]
  if diff:
    raise BenchError(f"--resume: {json_path} was made with other settings ({', '.join(diff)});"
                     " drop --resume to overwrite it or choose another --out")
  return existing


def _extras(run: BenchRun, target, drafter, mesh) -> tuple[dict[str, Any], dict[str, str]]:
  """({label: sampling -> method} for each method's specs, {label: the label of its
  reference}). Each method takes the model its flag names (--drafter, --heads); one whose
  model only it uses (blockwise: --heads) is also timed at its defaults when that model is
  given; a method's drafted form (--beam: speculative beam search) is timed at each gamma
  when there is a drafter."""
  heads = sd.load_heads(run.heads, target) if run.heads else None
  if heads is not None and mesh is not None:
    heads = sd.sharding.replicate(heads, mesh)
  models = {method_specs.DRAFTER: (drafter, run.drafter), "--heads": (heads, run.heads)}
  specs: dict[type, list[str]] = {}
  given: dict[type, tuple[Any, str | None]] = {}
  references: dict[str, str] = {}
  for m in method_specs.spec_methods():
    texts = list(run.specs.get(m.name, ()))
    needs = method_specs.model_flag(m)
    if needs is not None:
      given[m] = models[needs]
      if needs != method_specs.DRAFTER and given[m][0] is not None:
        texts = [""] + texts
    specs[m] = texts
    drafted = method_specs.drafted_form(m)
    if drafted is not None and drafter is not None:
      specs[drafted], found = method_specs.drafted_specs(m, drafted, texts,
                                                         run.measured.gammas)
      given[drafted] = models[method_specs.DRAFTER]
      references.update(found)
  return method_specs.extra_methods(specs, models=given), references


def run(args) -> int:
  return benchmark(from_args(args))


def benchmark(run: BenchRun) -> int:
  """`specdec bench` on typed settings: time, write the report, print its table."""
  check_output_dir(run.out, "--out")
  mesh = mesh_from_flag(run.mesh)
  for b in run.measured.batch_sizes:
    check_batch(b, mesh, "--batch-sizes entry")
  tokenizer = sd.load_tokenizer(run.tokenizer) if run.tokenizer else None
  target = load_target(run.target, run.dtype, mesh, what="target",
                       overrides=dict(run.target_overrides))
  drafter, drafter_overrides = None, dict(run.drafter_overrides)
  if run.drafter is not None:
    drafter, drafter_overrides = _load_drafter(run, target)
    if mesh is not None:
      drafter = sd.sharding.replicate(drafter, mesh)
  config = _config(run, drafter_overrides)
  existing = _existing(run, config)
  prompts = None
  if run.prompts_file:
    prompts = file_prompts(run.prompts_file, run.measured.prompt_len, tokenizer,
                           target.config.vocab_size, config=target.config)
  extras, references = _extras(run, target, drafter, mesh)
  results = bench.run_bench(
      target, drafter, run.measured, prompts=prompts,
      record=bench.BenchRecord(config, existing),
      on_update=lambda r: bench.write_report(r, run.out), extras=extras,
      references=references,
      place_inputs=None if mesh is None else lambda x: sd.sharding.shard_batch(x, mesh))
  paths = bench.write_report(results, run.out)
  emit(bench.markdown_table(results))
  print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}", file=sys.stderr)
  return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--preset", choices=sorted(PRESETS),
                 help="named settings (xxl-small: T5-XXL / T5-small shapes in bfloat16, greedy, "
                 "batch 1/8/32, gamma 1-15; for an accelerator); explicit flags override them")
  p.add_argument("--target", default=DEFAULT_TARGET,
                 help=f"target model path/name or config:NAME (default {DEFAULT_TARGET})")
  p.add_argument("--drafter", default=DEFAULT_DRAFTER,
                 help=f"drafter model path/name or config:NAME (default {DEFAULT_DRAFTER}; a "
                 "config: drafter takes the target's vocab_size unless overridden)")
  p.add_argument("--target-overrides", metavar="K=V,...",
                 help="architecture overrides of a config: target, e.g. num_decoder_layers=4")
  p.add_argument("--drafter-overrides", metavar="K=V,...",
                 help="architecture overrides of a config: drafter, e.g. vocab_size=32128")
  p.add_argument("--batch-sizes", type=int_list, default=[1, 8], metavar="1,8",
                 help="batch sizes timed, comma-separated (default 1,8)")
  p.add_argument("--gammas", type=int_list, default=[1, 3, 5, 7], metavar="1,3,5,7",
                 help="drafts per round timed for speculative decoding (default 1,3,5,7)")
  p.add_argument("--modes", type=mode_list, default=list(MODES), metavar="greedy,sample",
                 help="greedy and/or sample (temperature 1)")
  p.add_argument("--prompt-len", type=int, default=32,
                 help="encoder length: random ids (last = EOS), or file prompts padded/cut")
  p.add_argument("--max-new-tokens", type=int, default=64,
                 help="tokens decoded per row (default 64)")
  p.add_argument("--repeats", type=int, default=5, help="timed rounds (median reported)")
  p.add_argument("--timing-steps", type=int, default=16,
                 help="decode steps per jitted loop when measuring c and verify cost")
  p.add_argument("--seed", type=int, default=0,
                 help="seed of the random prompts and of sampling (default 0)")
  p.add_argument("--dtype", choices=DTYPES, default="float32",
                 help="both models' compute dtype, parameters AND activations (default "
                 "float32; logits stay float32)")
  add_mesh_flag(p)
  p.add_argument("--ignore-eos", action="store_true",
                 help="always decode max_new_tokens per row (eos_id=-1)")
  p.add_argument("--prompts-file", metavar="FILE",
                 help="one prompt per line: text with --tokenizer, else token ids; every "
                 "non-blank line is decoded at every batch size")
  p.add_argument("--tokenizer", metavar="PATH_OR_NAME",
                 help="tokenizer of --prompts-file's text (default: random token ids)")
  p.add_argument("--out", default="bench_out", metavar="DIR",
                 help="writes bench.json, bench.md, bench.png (overwritten)")
  p.add_argument("--resume", action="store_true",
                 help="keep entries of an existing DIR/bench.json (same settings) and run only "
                 "the missing (batch, mode, gamma) ones")
  p.add_argument("--exact", choices=("auto", "on", "off"), default="auto",
                 help="greedy target calls at the exact width (on; auto = the library "
                 "default, exact for greedy) or at their natural width (off: faster on CPU)")
  p.add_argument("--baseline-only", action="store_true",
                 help="time the target alone (no drafter needed)")
  p.add_argument("--heads", metavar="PATH",
                 help="also time blockwise decoding with these prediction heads (a heads file, "
                 "a model dir or a bundled name such as demo-de-en/target)")
  method_specs.add_spec_flags(p)
  p.add_argument("--compile-workers", type=int, metavar="N",
                 help="concurrent warm-up (compile) calls before timing; default: up to 4 on "
                 "CPU, 1 on accelerators (each warm-up call holds device memory)")
  p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")


def add(subparsers) -> None:
  p = subparsers.add_parser(
      "bench", help="time baseline vs speculative decoding side by side",
      description=bench.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
  add_arguments(p)
  p.set_defaults(func=run)
