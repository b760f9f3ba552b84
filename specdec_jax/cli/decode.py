"""`specdec decode`: decode prompts with a model: baseline, speculative, BiLD or blockwise.

A T5 model translates each prompt (its encoder input); a decoder-only model (GPT-2,
Llama-style) continues it: the prompt is encoded without EOS (BOS as the tokenizer's
convention has it), batches are right-padded, each row's prompt length is passed on
(`prompt_lengths`), and the output is the continuation alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
import warnings
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

import specdec_jax as sd
from specdec_jax.batching import Batch, bucket_width, padded_batches, trim_padding
from specdec_jax.cli.args import DefaultsHelpFormatter, add_drafter_flag, add_dtype_flag
from specdec_jax.cli.decode_report import compare_block, stats_block
from specdec_jax.cli.demo_notes import demo_note
from specdec_jax.cli.mesh_args import (
  add_mesh_flag,
  check_batch,
  load_target,
  mesh_batch,
  mesh_from_flag,
  place_method,
)
from specdec_jax.cli.method_args import (
  METHOD_NAMES,
  MethodChoice,
  add_method_flags,
  method_from_args,
  placed_method,
)
from specdec_jax.cli.models import drafter_loader, note, resolve_drafter
from specdec_jax.cli.options import check_at_least_one
from specdec_jax.cli.prompts import (
  encode_lm_prompts,
  encode_prompts,
  isatty,
  lm_batches,
  lm_token_budget,
  read_prompt_lines,
)
from specdec_jax.compilation import announce_kernel_build, compiling, use_persistent_cache
from specdec_jax.costs import CostTiming, explain_run
from specdec_jax.errors import CLIError
from specdec_jax.models.model import family
from specdec_jax.rounds.requests import rows_without_eos
from specdec_jax.runs import Corpus, Run, decode_corpus, same_output
from specdec_jax.runtime import liveness, output_file
from specdec_jax.runtime.distributed import (
  Processes,
  add_distributed_flags,
  gather_corpus,
  gather_max,
  initialize,
  local_batches,
  process_rows,
  processes_from_args,
)
from specdec_jax.runtime.progress import Progress, deferred_signals, interrupts_kept
from specdec_jax.runtime.report import to_jsonable
from specdec_jax.runtime.streams import emit
from specdec_jax.timing import is_exact, ms_per_token, time_rounds


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeRun:
  """What `specdec decode` decodes and how, beside the method (`MethodChoice`).

  Attributes:
    model: the target: a checkpoint dir, a bundled name or config:NAME.
    tokenizer: prompts are text for it (None: token ids).
    prompts: the prompts given as arguments ("-": stdin).
    input_file: a file of prompts, one per line ("-": stdin).
    max_new_tokens: tokens decoded per prompt at most.
    batch_size: prompts per decode call (None: all of them).
    seed: the PRNG seed of sampling.
    dtype: the models' compute dtype.
    mesh: "data=D,model=M" (None: one device).
    warmup: decode once untimed first, so the timing excludes compilation.
    stats: print the decode statistics (stderr).
    compare: also time the target alone on the same inputs.
    json: print one JSON object instead of lines.
    processes: how this process joins others (`jax.distributed`).
    output: write the outputs to this file as each batch finishes (None: stdout).
    resume: continue an interrupted `output` file.
    compile_cache: keep compiled programs in JAX's persistent cache (per user).
    compile_cache_dir: where (set by `decode` from `compile_cache`; None: off).
  """

  model: str
  tokenizer: str | None = None
  prompts: tuple[str, ...] = ()
  input_file: str | None = None
  max_new_tokens: int = 64
  batch_size: int | None = None
  seed: int = 0
  dtype: str = "float32"
  mesh: str | None = None
  warmup: bool = True
  stats: bool = False
  compare: bool = False
  json: bool = False
  processes: Processes = Processes()
  output: str | None = None
  resume: bool = False
  compile_cache: bool = True
  compile_cache_dir: str | None = None

  def __post_init__(self):
    check_at_least_one(max_new_tokens=self.max_new_tokens, batch_size=self.batch_size)
    if self.resume and not self.output:
      raise CLIError("--resume continues an --output file: give --output")


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


def _emit_rows(corpus: Corpus, tokenizer) -> None:
  """Each real row's output on stdout, one line each (flushed: a pipe sees them now)."""
  for row in corpus.token_rows():
    o = _format_output(row, tokenizer)
    emit(o if isinstance(o, str) else " ".join(map(str, o)))


def _format_output(row: list[int], tokenizer) -> str | list[int]:
  if tokenizer is None:
    return row
  # A model's embedding may be padded beyond the tokenizer's vocabulary (T5: 32128 vs
  # 32100); such ids have no text, show them as <unk> (dropped if it has none).
  ids = np.asarray(row, np.int64)
  if tokenizer.unk_id is None:
    ids = ids[ids < tokenizer.vocab_size]
  ids = np.where(ids < tokenizer.vocab_size, ids, tokenizer.unk_id)
  return tokenizer.decode_continuations(ids[None])[0]


class Prompts(NamedTuple):
  """The encoded prompts: T5 encoder tokens [N, L] (0-padded, `lengths` None), or a
  decoder-only model's right-padded prompts [N, P] and their lengths [N]."""

  tokens: np.ndarray
  lengths: np.ndarray | None = None


def _encode(texts: list[str], tokenizer, target: sd.Model) -> Prompts:
  if target.is_decoder_only:
    return Prompts(*encode_lm_prompts(texts, tokenizer, target.config))
  return Prompts(encode_prompts(texts, tokenizer, target.config.vocab_size,
                                config=target.config))


def _batches(prompts: Prompts, batch: int) -> tuple[list[Batch], list | None]:
  """Padded batches (trimmed to their longest prompt) and, for an LM, their lengths."""
  if prompts.lengths is not None:
    return lm_batches(prompts.tokens, prompts.lengths, batch)
  return [Batch(trim_padding(b.tokens), b.real)
          for b in padded_batches(prompts.tokens, batch)], None


def _fit_budget(run: DecodeRun, prompts: Prompts, target: sd.Model, tokenizer) -> DecodeRun:
  """The run, for a decoder-only model with --max-new-tokens lowered (with a note) so the
  longest prompt and the new tokens fit its positions; a prompt alone past them is an
  error. T5 token ids without a final EOS: a note, since they are decoded verbatim (no EOS
  is added)."""
  if prompts.lengths is not None and isinstance(target.config, sd.LMConfig):   # decoder-only
    budget = lm_token_budget(prompts.lengths, target.config, run.max_new_tokens)
    if budget < run.max_new_tokens:
      note(f"--max-new-tokens {run.max_new_tokens} lowered to {budget}: the model has "
           f"{target.config.max_positions} positions and the longest prompt holds "
           f"{int(np.max(prompts.lengths))} tokens")
      return dataclasses.replace(run, max_new_tokens=budget)
  elif tokenizer is None:
    rows = rows_without_eos(prompts.tokens, target.config.eos_id, target.config.pad_id)
    if rows:
      shown = ", ".join(str(i + 1) for i in rows[:8]) + (", ..." if len(rows) > 8 else "")
      note(f"prompt{'s' if len(rows) > 1 else ''} {shown} {'do' if len(rows) > 1 else 'does'} "
           f"not end in EOS ({target.config.eos_id}): token ids are used verbatim, and T5 "
           "reads EOS-terminated inputs (the tokenizer appends it), so the output differs "
           f"from the same prompt ending in {target.config.eos_id}")
  return run


def _ngram_drafter(prompts: Prompts, target: sd.Model):
  """The "ngram" drafter: bigram tables of the prompts' own tokens. An LM's prompts are
  texts with no start token before them, cut at their lengths."""
  vocab = target.config.vocab_size
  if prompts.lengths is None:
    return sd.NGramDrafter.fit([r[r > 0] for r in prompts.tokens], vocab_size=vocab)
  return sd.NGramDrafter.fit([r[:n] for r, n in zip(prompts.tokens, prompts.lengths, strict=True)],
                             vocab_size=vocab, start_id=None)


def _family_loader(load, target: sd.Model, flag: str):
  """`load` refusing a model of another kind than the target's (T5 vs decoder-only)."""
  def checked(name: str) -> sd.Model:
    model = load(name)
    if isinstance(model, sd.Model) and model.is_decoder_only != target.is_decoder_only:
      raise CLIError(f"{flag} {name} is {family(model)} but --model is {family(target)}: "
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
  width = lambda n: bucket_width(int(n.max()), prompts.tokens.shape[1])
  return [Batch(b.tokens[:, :width(n)], b.real) for b, n in zip(blocks, sizes, strict=True)], sizes


def _first_of_each_shape(batches, lengths) -> list[int]:
  """The index of the first batch of each shape: decoding those compiles every program."""
  seen: dict[tuple, int] = {}
  for i, b in enumerate(batches):
    seen.setdefault((np.shape(b.tokens), None if lengths is None else np.shape(lengths[i])), i)
  return sorted(seen.values())


class _Setup(NamedTuple):
  """What `decode` decodes with: the run (its budget fitted to the model), the mesh (None:
  one device), the input lines and their encoding, the tokenizer (None: token ids), the
  target, the method placed on the mesh (a `Run`) and the seconds loading took."""

  run: DecodeRun
  mesh: Any
  lines: list[str]
  prompts: Prompts
  tokenizer: Any
  target: sd.Model
  method: Any
  load_s: float


class _Decoded(NamedTuple):
  """A decode's corpus, wall seconds and batch size; `streamed`: its rows are on stdout
  already; `resumed`: the --output row it started at (None: not --output)."""

  corpus: Corpus
  wall: float
  batch: int
  streamed: bool = False
  resumed: int | None = None


class _Plan(NamedTuple):
  """This process's batches of `batch` rows (its own block of rows when `split_rows`), an
  LM's prompt lengths per batch (None: T5), and the key index of its first batch."""

  batch: int
  batches: list[Batch]
  lengths: list | None
  first_key: int
  split_rows: bool


def _splits_rows(mesh) -> bool:
  """Several processes, each decoding its own block of rows (on a mesh of its own devices,
  or none), gathered after; on a mesh over every process's devices, all of them decode
  every batch as one program."""
  return jax.process_count() > 1 and not sd.sharding.spans_processes(mesh)


def _plan(run: DecodeRun, prompts: Prompts, mesh) -> _Plan:
  processes, process = jax.process_count(), jax.process_index()
  n = len(prompts.tokens)
  if _splits_rows(mesh):
    batch = run.batch_size or mesh_batch(process_rows(n, process, processes)[2], mesh)
    batches, lengths = _local_batches(prompts, batch, process, processes)
    # no two batches of the corpus share a key
    return _Plan(batch, batches, lengths, process * len(batches), True)
  batch = run.batch_size or mesh_batch(n, mesh)
  batches, lengths = _batches(prompts, batch)
  return _Plan(batch, batches, lengths, 0, False)


def _start(run: DecodeRun) -> DecodeRun:
  """This process's side, before any prompt or model: the compile cache (the run with its
  directory), the kernel build's note, `jax.distributed`, --output's path checked."""
  run = dataclasses.replace(run, compile_cache_dir=use_persistent_cache(run.compile_cache))
  announce_kernel_build()
  if initialize(run.processes) and run.compare:
    raise CLIError("--compare times one process: drop it with several processes")
  if run.output and jax.process_index() == 0:
    output_file.check_output_path(run.output, run.input_file, run.resume)
  return run


def _set_up(choice: MethodChoice, run: DecodeRun) -> _Setup:
  """The mesh, the prompts read and encoded, the models loaded and the method placed."""
  mesh = mesh_from_flag(run.mesh)
  if run.batch_size is not None:
    check_batch(run.batch_size, mesh)
  lines = read_prompt_lines(list(run.prompts), run.input_file)
  # a person at a terminal waits: say what happens before the model loads
  if jax.process_index() == 0 and isatty(sys.stderr, unknown=False):
    print(f"specdec: loading {run.model}" + (f" and {choice.drafter}" if choice.drafter
                                             else ""), file=sys.stderr, flush=True)
  tokenizer = sd.load_tokenizer(run.tokenizer) if run.tokenizer else None
  t_load = time.perf_counter()
  target = load_target(run.model, run.dtype, mesh, what="model")
  prompts = _encode(lines, tokenizer, target)
  run = _fit_budget(run, prompts, target, tokenizer)
  method = _place(choice, run, target, prompts, mesh)
  return _Setup(run, mesh, lines, prompts, tokenizer, target, method,
                time.perf_counter() - t_load)


def _place(choice: MethodChoice, run: DecodeRun, target: sd.Model, prompts: Prompts, mesh):
  """The method placed on the mesh, its drafter and rescorer loaded (refused if not of the
  target's family); the "ngram" drafter is fitted on the prompts."""
  load = _family_loader(drafter_loader(run.dtype), target, "--drafter")
  drafter = None
  if choice.drafter == "ngram":
    drafter = resolve_drafter(_ngram_drafter(prompts, target), target)
  elif choice.drafter is not None and not choice.early_exit:
    drafter = resolve_drafter(choice.drafter, target, load=load)
  rescorer_load = _family_loader(drafter_loader(run.dtype), target, "--rescorer")
  return placed_method(choice, target, run.model, drafter, rescorer_load, mesh)


def _decode_any(choice: MethodChoice, s: _Setup) -> _Decoded:
  """Decode to --output's file, or to stdout (each batch's rows as it finishes, unless
  --json). With several processes, a failure that is no `SpecdecError` (a lost peer) is
  named by `liveness`, not a trace."""
  try:
    if s.run.output:
      return _decode_to_file(choice, s)
    return _decode(s, None if s.run.json else (lambda part: _emit_rows(part, s.tokenizer)))
  except Exception as e:
    if not isinstance(e, sd.SpecdecError):
      liveness.after_failure()
    raise


def _warm_up(part: Callable[[int], Corpus], plan: _Plan, run: DecodeRun) -> None:
  """Each shape's first batch decoded once, untimed (trimmed batches may differ): every
  program compiled."""
  with compiling(f"the decode programs for batch {plan.batch}", run.compile_cache_dir,
                 quiet=jax.process_index() != 0):
    for i in _first_of_each_shape(plan.batches, plan.lengths):
      part(i)


def _decode(s: _Setup, stream: Callable[[Corpus], None] | None = None) -> _Decoded:
  """Decoding the prompts in padded batches, batch by batch: `stream` gets each batch's
  corpus as it finishes (its rows printed then; not with several processes splitting the
  rows: `streamed` False), a file's progress goes to stderr, and an interrupt says how many
  rows were kept. With several processes splitting the rows (`_splits_rows`), each decodes
  its block and all rows are gathered (the wall time is the slowest process's)."""
  run, n = s.run, len(s.prompts.tokens)
  plan = _plan(run, s.prompts, s.mesh)
  rng = jax.random.PRNGKey(run.seed)

  def part(i: int) -> Corpus:     # batch i, with the key it has in the whole corpus
    return decode_corpus(s.method, s.target, [plan.batches[i]],
                         max_new_tokens=run.max_new_tokens, rng=rng,
                         prompt_lengths=None if plan.lengths is None else [plan.lengths[i]],
                         first_key=plan.first_key + i)
  if run.warmup:
    _warm_up(part, plan, run)
  stream = None if plan.split_rows else stream
  progress = (Progress(n, "specdec decode") if run.input_file is not None
              and jax.process_index() == 0 and len(plan.batches) > 1 else None)
  parts: list[Corpus] = []
  done = 0                                 # rows written (stdout) so far
  t0 = time.perf_counter()
  with interrupts_kept(lambda: None if stream is None else (
      f"{done} of {n} rows kept (written above); --output FILE writes rows as they finish "
      "and --resume continues where a run stopped")):
    for i in range(len(plan.batches)):
      decoded = part(i)
      with deferred_signals():             # its rows written and counted together
        parts.append(decoded)
        if stream is not None:
          stream(decoded)
          done += decoded.real_rows[0]
      if progress is not None:
        progress.update(decoded.real_rows[0], decoded.generated)
  wall = time.perf_counter() - t0
  corpus = Corpus(tuple(o for p in parts for o in p.outputs),
                  tuple(r for p in parts for r in p.real_rows))
  if plan.split_rows:
    corpus, wall = gather_corpus(corpus), gather_max(wall)
  return _Decoded(corpus, wall, plan.batch, streamed=stream is not None)


def _open_output(choice: MethodChoice, s: _Setup, path: str, batch: int):
  """(--output's file `path`, opened or resumed by process 0, None on the others; the row decoding
  starts at, on every process). The sidecar fingerprints the input lines, the settings and
  the weights; process 0's error stops every process."""
  output, error = None, None
  if jax.process_index() == 0:
    meta = output_file.fingerprint(
        s.lines, {**_settings(s.run, choice, s.method), "batch_size": batch},
        output_file.weights_digest(s.target.params, s.method))
    try:
      output = output_file.open_output(path, meta, s.run.resume)
    except sd.SpecdecError as e:
      error = e
  start = output_file.shared_start(output, error)
  if error is not None:
    raise error
  return output, start


def _decode_to_file(choice: MethodChoice, s: _Setup) -> _Decoded:
  """`_decode` for --output (`output_file`): the file's batches (keyed by their index in
  it), each decoded once and appended to the file as it finishes."""
  run = s.run
  if run.output is None:   # the caller decodes to a file only with --output
    raise CLIError("decoding to a file needs --output FILE")
  n = len(s.prompts.tokens)
  split_rows = _splits_rows(s.mesh)
  batch = run.batch_size or mesh_batch(
      process_rows(n, 0, jax.process_count())[2] if split_rows else n, s.mesh)
  batches, lengths = _batches(s.prompts, batch)
  output, start = _open_output(choice, s, run.output, batch)
  progress = (Progress(n, "specdec decode", done=output.rows) if output is not None
              and len(batches) > 1 else None)
  t0 = time.perf_counter()
  with interrupts_kept(lambda: None if output is None else (
      f"{output.rows} of {n} rows kept in {run.output!r}; the same command with --resume "
      "continues from there")):
    corpus = output_file.decode_to_file(
        s.method, s.target, batches, lengths, output, start,
        output_file.FileDecode(run.max_new_tokens, jax.random.PRNGKey(run.seed), split_rows),
        format_row=lambda r: _format_output(r, s.tokenizer),
        on_batch=None if progress is None else
        lambda c: progress.update(sum(c.real_rows), c.generated))
  wall = time.perf_counter() - t0
  if output is not None:
    output.finish()
  return _Decoded(corpus, gather_max(wall) if split_rows else wall, batch, resumed=start)


def _baseline(method, exact: bool) -> Run:
  """The run `method` (a `Run`) is measured against, at `exact`: its value's `baseline()`
  (the target alone; `sd.Beam` of the same beams for a beam method), with its sampling."""
  base = method.method.baseline()
  return Run(dataclasses.replace(base, exact=exact), method.sampling)


def _compare(s: _Setup, repeats: int = 3) -> dict[str, Any]:
  """The method vs its baseline (`Method.baseline()`: the target alone, greedy or with the
  same sampling; `sd.Beam` of the same beams for a beam method) on the same inputs: all
  compiled first, then timed in `repeats` alternating rounds; speedup of the medians over
  the FASTEST plain baseline (exact=False: natural call width). An exact method's padding
  cost shows in its own figure (`exact_cost`: the exact baseline over the plain one), not
  in the speedup."""
  run, method, mesh = s.run, s.method, s.mesh
  rng = jax.random.PRNGKey(run.seed)
  batch = run.batch_size or mesh_batch(len(s.prompts.tokens), mesh)
  batches, lengths = _batches(s.prompts, batch)
  base = method.method.baseline()
  alone = lambda exact: place_method(_baseline(method, exact), mesh)
  methods = {"method": method, "baseline": alone(False)}
  if is_exact(method):
    methods["exact baseline"] = alone(True)
  calls = {name: functools.partial(decode_corpus, m, s.target, batches,
                                   max_new_tokens=run.max_new_tokens, rng=rng,
                                   prompt_lengths=lengths)
           for name, m in methods.items()}
  with compiling(f"the baseline ({base.name}) for --compare", run.compile_cache_dir):
    for call in calls.values():
      call()
  timed = time_rounds(calls, repeats)
  ms = {name: ms_per_token(t) for name, t in timed.items()}
  exact_ms = ms.get("exact baseline")
  out: dict[str, Any] = {
      "baseline": "target alone" if isinstance(base, sd.Autoregressive)
      else f"sd.{type(base).__name__}", "baseline_run": _baseline(method, False).describe(),
      "sampled": not method.sampling.is_greedy,
      "ms_per_token": ms["method"], "baseline_ms_per_token": ms["baseline"],
      "speedup": ms["baseline"] / ms["method"], "rounds": repeats,
      "exact_baseline_ms_per_token": exact_ms,
      "exact_cost": None if exact_ms is None else exact_ms / ms["baseline"],
      **same_output(timed["method"]["output"], timed["baseline"]["output"])}
  value = method.method
  if (isinstance(value, sd.Speculative) and mesh is None   # the theory of its 'why' line
      and not getattr(value.drafter, "shares_target_cache", False)):   # not an early exit
    with compiling("the model-step timers of the 'why' line", run.compile_cache_dir):
      out["costs"] = _costs(run, method, s.target, batches[0].tokens,
                            timed["method"]["output"])
  return out


def _costs(run: DecodeRun, method, target, inputs, corpus) -> dict[str, Any]:
  """The step costs behind a speculative run's speedup (`costs.explain_run`), measured
  at its batch size, with its verify calls' width (exact mode pads them off the kernels)."""
  from specdec_jax.rounds.engine import EXACT_WIDTH
  padded = is_exact(method) and not target.width_invariant_decode
  gamma = method.method.gamma
  return explain_run(target, method.method.drafter, gamma, inputs, corpus.stats,
                     CostTiming(capacity=run.max_new_tokens + EXACT_WIDTH + 1),
                     call_tokens=EXACT_WIDTH if padded else gamma + 1)


def _settings(run: DecodeRun, choice: MethodChoice, method) -> dict[str, Any]:
  return {**method.settings(), "model": run.model, "drafter": choice.drafter,
          "tokenizer": run.tokenizer, "max_new_tokens": run.max_new_tokens,
          "seed": run.seed, "dtype": run.dtype, "mesh": run.mesh}


def _payload(run: DecodeRun, choice: MethodChoice, outputs, corpus, timing, method,
             prompts: Prompts, resumed: int | None) -> dict[str, Any]:
  payload = {"outputs": outputs, "lengths": corpus.lengths, "stats": corpus.stats,
             "prompt_lengths": prompts.lengths, "timing": timing,
             "settings": _settings(run, choice, method)}
  if run.output:    # the outputs are in the file; the rest covers this run's batches
    payload.update(outputs=None, lengths=None, output=run.output,
                   resumed_at_row=resumed)
  return payload


def _timing(s: _Setup, d: _Decoded) -> dict[str, Any]:
  """The run's timing report: one timed run (--output: batch by batch, compiling included)."""
  run, generated, wall = s.run, d.corpus.generated, d.wall
  return {"method": s.method.describe(), "prompts": len(s.lines), "batch_size": d.batch,
          "generated_tokens": generated, "wall_s": wall, "load_s": s.load_s,
          "warmup": bool(run.warmup and not run.output),
          "includes_compile": not run.warmup or bool(run.output),
          "processes": jax.process_count(),
          "mesh_spans_processes": sd.sharding.spans_processes(s.mesh),
          "tokens_per_s": generated / wall if wall > 0 else None,
          "ms_per_token": 1e3 * wall / generated if generated else None}


def _print_outputs(choice: MethodChoice, s: _Setup, d: _Decoded, timing: dict[str, Any]) -> None:
  """Stdout: one JSON object (--json), or the rows not printed yet (neither streamed nor in
  --output's file: several processes, process 0 prints every row)."""
  run = s.run
  if run.json:
    outputs = [] if run.output else [_format_output(row, s.tokenizer)
                                     for row in d.corpus.token_rows()]
    emit(json.dumps(to_jsonable(_payload(run, choice, outputs, d.corpus, timing, s.method,
                                         s.prompts, d.resumed))))
  elif not (run.output or d.streamed):
    _emit_rows(d.corpus, s.tokenizer)


def _print_reports(choice: MethodChoice, s: _Setup, stats: dict[str, Any],
                   timing: dict[str, Any]) -> None:
  """Stderr: a bundled demo's note, --stats and --compare's blocks."""
  about = demo_note(s.run.model, choice.drafter)
  if about is not None:
    note(about)
  if s.run.stats:
    print(stats_block(stats, timing, s.method), file=sys.stderr)
  if "compare" in timing:
    print(compare_block(timing["compare"], s.method.kind), file=sys.stderr)


def run(args) -> int:
  with warnings.catch_warnings():   # a T5 input without EOS: noted per prompt, below
    warnings.simplefilter("ignore", sd.InputWarning)
    return decode(*from_args(args))


def decode(choice: MethodChoice, run: DecodeRun) -> int:
  """`specdec decode` on typed settings: decode, print the outputs (stdout) and the
  requested reports (stderr)."""
  s = _set_up(choice, _start(run))
  d = _decode_any(choice, s)
  if not d.corpus.outputs:     # --resume of a complete file
    if jax.process_index() == 0:
      print(f"specdec decode: {s.run.output!r} already holds all {len(s.lines)} outputs: "
            "nothing to decode", file=sys.stderr)
    return 0
  timing = _timing(s, d)
  if s.run.compare and type(s.method.method.baseline()) is not type(s.method.method):
    timing["compare"] = _compare(s)
  if jax.process_index() == 0:   # process 0 prints every process's rows
    _print_outputs(choice, s, d, timing)
    _print_reports(choice, s, d.corpus.stats, timing)
  return 0


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
