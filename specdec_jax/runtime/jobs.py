"""A decode job: one run over encoded prompts, batch by batch, to stdout or to a file.

    job = Job(max_new_tokens=32, batch_size=8, output="out.txt").start()
    decoded = decode_job(run.on(mesh), target, Prompts.encode(lines, tok, target.config), job)
    decoded.corpus.stats, decoded.timing["wall_s"]     # the outputs and their timing
    compared = compare_job(run, target, decoded.plan, job)     # vs its baseline, timed

`Job` holds how the prompts are decoded beside the run: the batch size (None: all rows,
rounded to the mesh's "data" axis), the seed, the warm-up pass, the --output file and its
resume, the processes. The batch is sized here alone (`plan`), for every path, and one
loop (`decode_plan`) decodes to stdout and to the file alike: the plan says which batch
each process decodes at each step and keys every batch by its index.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, NamedTuple, cast

import jax
import numpy as np

from specdec_jax.batching import Batch, padded_batches, prompt_batches
from specdec_jax.compilation import announce_kernel_build, compiling, use_persistent_cache
from specdec_jax.costs import explain_method
from specdec_jax.errors import SpecdecError
from specdec_jax.flags import FlagError
from specdec_jax.io.prompts import Prompts
from specdec_jax.io.streams import emit
from specdec_jax.methods import Autoregressive
from specdec_jax.runs import Corpus, Run, decode_corpus, same_output
from specdec_jax.runtime import distributed, liveness, output_file
from specdec_jax.runtime.output_file import OutputFile
from specdec_jax.runtime.progress import Progress, deferred_signals, interrupts_kept
from specdec_jax.sharding import spans_processes
from specdec_jax.timing import ms_per_token, time_rounds


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
  """How prompts are decoded, beside the run.

  Attributes:
    max_new_tokens: tokens decoded per prompt at most.
    seed: the PRNG seed (batch i keyed `runs.batch_key(seed, i)`).
    batch_size: rows per decode call (None: all of them, rounded to the mesh's "data").
    warmup: decode each shape once untimed first (not with `output`).
    output: write the rows to this file as each batch finishes (`output_file`).
    resume: continue an interrupted `output` file.
    processes: how this process joins others (`jax.distributed`).
    stream: print each batch's rows (`format_row`) on stdout as it finishes.
    progress: a progress line on stderr (prompts from a file, or an `output` file).
    format_row: a row's tokens as its output (text, or the ids themselves).
    lines: the input lines, fingerprinted in `output`'s sidecar with `settings`.
    settings: the run's settings, recorded in `output`'s sidecar.
    compile_cache: keep compiled programs in JAX's persistent cache.
    compile_cache_dir: where (`start` sets it; None: off).
    description: the run as the timing report names it (`Run.describe`).
  """

  max_new_tokens: int
  seed: int = 0
  batch_size: int | None = None
  warmup: bool = True
  output: str | None = None
  resume: bool = False
  processes: distributed.Processes = distributed.Processes()
  stream: bool = False
  progress: bool = False
  format_row: Callable[[list[int]], str | list[int]] = list
  lines: tuple[str, ...] = ()
  settings: dict[str, Any] = dataclasses.field(default_factory=dict)
  compile_cache: bool = True
  compile_cache_dir: str | None = None
  description: str = ""

  def start(self, input_file: str | None = None, compare: bool = False) -> Job:
    """This process's side, before any prompt or model: the compile cache (the job with its
    directory), the kernel build's note, `jax.distributed`, `output`'s path checked."""
    job = dataclasses.replace(self, compile_cache_dir=use_persistent_cache(self.compile_cache))
    announce_kernel_build()
    if distributed.initialize(job.processes) and compare:
      raise FlagError("--compare times one process: drop it with several processes")
    if job.output and jax.process_index() == 0:
      output_file.check_output_path(job.output, input_file, job.resume)
    return job


class Plan(NamedTuple):
  """A job's batches and which process decodes which. `batches`: every batch of `batch`
  rows, their real rows the input's in order; `lengths`: an LM's prompt lengths per batch
  (None: T5). At step s the processes decode batches `steps[s]` (this process the one at
  `me`; past the end: the last batch again, its rows all padding), each keyed by its
  index, and gather them in that order. `spans`: the mesh spans every process's devices
  (one program over all of them).

  Two layouts: a file's batches dealt out, batch g to process g mod P (a step's batches
  are consecutive rows, written as they finish); stdout's split by blocks of rows, each
  process decoding its own. One process, or a mesh over all of them: every batch in turn."""

  batch: int
  batches: list[Batch]
  lengths: list | None
  steps: list[tuple[int, ...]]
  me: int = 0
  spans: bool = False

  @property
  def split(self) -> bool:
    """Several processes, each decoding batches of its own."""
    return len(self.steps[0]) > 1 if self.steps else False


class Decoded(NamedTuple):
  """A job's corpus, its timing report (`timing`: wall seconds, tokens, ...) and batches
  (`plan`); `streamed`: its rows are on stdout already; `resumed`: the `output` row it
  started at (None: no output file)."""

  corpus: Corpus
  timing: dict[str, Any]
  plan: Plan
  streamed: bool = False
  resumed: int | None = None


def plan(run: Run, prompts: Prompts, job: Job) -> Plan:
  """The batches of `job.batch_size` rows, or of all of them rounded up to a multiple of
  the mesh's "data" (the last rows repeat, as `padded_batches` pads). With several
  processes splitting the rows (each on a mesh of its own devices, or none; on a mesh over
  every process's devices all decode every batch as one program), a file's batches are
  dealt out (`output_file`), stdout's are each process's own block of rows."""
  n, processes = len(prompts), jax.process_count()
  spans = spans_processes(run.mesh)
  shares = processes if processes > 1 and not spans else 1
  data = 1 if run.mesh is None else run.mesh.shape["data"]
  batch = job.batch_size or -(-distributed.process_rows(n, 0, shares)[2] // data) * data
  me = jax.process_index() if shares > 1 else 0
  if shares > 1 and not job.output:    # stdout: process q decodes its block of rows
    blocks = lambda x, b: [c for q in range(shares)
                           for c in distributed.local_batches(x, b, q, shares)]
    batches, lengths = prompt_batches(prompts.tokens, prompts.lengths, batch, blocks)
    count = len(batches) // shares
    return Plan(batch, batches, lengths,
                [tuple(q * count + s for q in range(shares)) for s in range(count)], me, spans)
  batches, lengths = prompt_batches(prompts.tokens, prompts.lengths, batch, padded_batches)
  return Plan(batch, batches, lengths,
              [tuple(range(s, s + shares)) for s in range(0, len(batches), shares)], me, spans)


class Stdout:
  """stdout as a job's rows' sink (`OutputFile`'s twin): each output on a line of its
  own as it finishes; `rows` printed."""

  rows = 0

  def append(self, lines: list[str]) -> None:
    with deferred_signals():             # the rows written and counted together
      for line in lines:
        emit(line)
      self.rows += len(lines)

  @staticmethod
  def line(output: str | list[int]) -> str:
    return output if isinstance(output, str) else " ".join(map(str, output))

  def kept(self, total: int) -> str:
    return (f"{self.rows} of {total} rows kept (written above); --output FILE writes rows "
            "as they finish and --resume continues where a run stopped")


def decode_job(run: Run, target, prompts: Prompts, job: Job) -> Decoded:
  """Decode `prompts` with `run` (placed on its mesh: `Run.on`) as `job` says (`plan`):
  to its output file (opened, or resumed, by `output_file.open_shared`), or batch by batch
  with each batch's rows streamed as it finishes (`decode_plan`); the corpus and its
  timing (one timed run; with `output` batch by batch, compiling included). With several
  processes, a failure that is no `SpecdecError` (a lost peer) is named by `liveness`,
  not a trace."""
  try:
    corpus, wall, p, sink, start = decode_plan(run, target, prompts, job)
  except Exception as e:
    if not isinstance(e, SpecdecError):
      liveness.after_failure()
    raise
  generated = corpus.generated if corpus.outputs else 0    # --resume of a complete file: 0
  return Decoded(corpus, {
      "method": job.description, "prompts": len(prompts), "batch_size": p.batch,
      "generated_tokens": generated, "wall_s": wall,
      "warmup": bool(job.warmup and not job.output),
      "includes_compile": not job.warmup or bool(job.output),
      "processes": jax.process_count(), "mesh_spans_processes": p.spans,
      "tokens_per_s": generated / wall if wall > 0 else None,
      "ms_per_token": 1e3 * wall / generated if generated else None},
      p, isinstance(sink, Stdout), start if job.output else None)


def decode_plan(run: Run, target, prompts: Prompts, job: Job
                ) -> tuple[Corpus, float, Plan, Stdout | OutputFile | None, int]:
  """(the corpus of the job's batches from the one holding its first row not yet written,
  in input order; its wall seconds; its `plan`; the sink its rows went to; that row):
  each step's batch decoded (keyed by its index), the processes' gathered, the rows that
  complete the input's next rows handed to the sink (`Stdout`, unless the rows are split
  over processes; the `output` file) as they finish. An interrupt says what it kept."""
  p = plan(run, prompts, job)
  sink: Stdout | OutputFile | None = Stdout() if job.stream and not p.split else None
  start = 0
  if job.output:
    sink, start = output_file.open_shared(
        str(job.output), job.lines, {**job.settings, "batch_size": p.batch},
        (target.params, run), job.resume)
  rng = jax.random.PRNGKey(job.seed)
  last = len(p.batches) - 1
  starts = np.cumsum([0] + [b.real for b in p.batches])     # each batch's first row
  first = next((s for s, gs in enumerate(p.steps)   # the first step with a row to write
                if any(g <= last and starts[g + 1] > start for g in gs)), len(p.steps))

  def part(g: int) -> Corpus:     # batch g, keyed by its index (past the end: padding)
    c = decode_corpus(run, target, [p.batches[min(g, last)]], max_new_tokens=job.max_new_tokens,
                      rng=rng, first_key=min(g, last),
                      prompt_lengths=None if p.lengths is None else [p.lengths[min(g, last)]])
    return c if g <= last else Corpus(c.outputs, (0,))
  if job.warmup and not job.output:   # each shape's first batch once, untimed
    shapes = {(p.batches[g].tokens.shape, None if p.lengths is None else p.lengths[g].shape): g
              for g in reversed([gs[p.me] for gs in p.steps[first:]]) if g <= last}
    with compiling(f"the decode programs for batch {p.batch}", job.compile_cache_dir,
                   quiet=jax.process_index() != 0):
      for g in sorted(shapes.values()):
        part(g)
  done: dict[int, Corpus] = {}
  following = p.steps[first][0] if first < len(p.steps) else 0
  progress = (Progress(len(prompts), "specdec decode", done=start)
              if job.progress and jax.process_index() == 0 and len(p.batches) > 1 else None)
  t0 = time.perf_counter()
  with interrupts_kept(lambda: None if sink is None else sink.kept(len(prompts))):
    for gs in p.steps[first:]:
      decoded = part(gs[p.me])
      if p.split:
        decoded = distributed.gather_corpus(decoded)     # the step's batches, in order
      done.update((g, Corpus((o,), (r,))) for g, o, r in
                  zip(gs, decoded.outputs, decoded.real_rows, strict=True))
      if sink is not None:     # the input's next rows, once every row before them is in
        lines = []
        while following in done and following <= last:
          lines += [sink.line(job.format_row(row))
                    for i, row in enumerate(done[following].token_rows())
                    if starts[following] + i >= sink.rows]
          following += 1
        sink.append(lines)
      if progress is not None:
        progress.update(sum(decoded.real_rows), decoded.generated)
  wall = time.perf_counter() - t0
  if p.split:     # the slowest process's
    wall = distributed.gather_max(wall)
  if isinstance(sink, OutputFile):
    sink.finish()
  corpus = [done[g] for g in sorted(done)]
  return (Corpus(tuple(c.outputs[0] for c in corpus), tuple(c.real_rows[0] for c in corpus)),
          wall, p, sink, start)


def compare_job(run: Run, target, p: Plan, job: Job,
                repeats: int = 3) -> dict[str, Any] | None:
  """The run vs its baseline (`Method.baseline()`: the target alone, greedy or with the
  same sampling; `sd.Beam` of the same beams for a beam method) on the batches of `p` (a
  job's `plan`, one process): all compiled first, then timed in `repeats` alternating
  rounds; speedup of the medians over the FASTEST plain baseline (exact=False: natural
  call width). An exact method's padding cost shows in its own figure (`exact_cost`: the
  exact baseline over the plain one), not in the speedup; the method's step costs
  (`costs.explain_method`) where it has a cost model, on one device. None: the method is
  its own baseline (the target alone)."""
  base = run.method.baseline()
  if type(base) is type(run.method):
    return None
  alone = lambda exact: Run(dataclasses.replace(cast(Any, base), exact=exact),
                            run.sampling).on(run.mesh)
  runs = {"method": run, "baseline": alone(False)}
  if run.exact_mode:
    runs["exact baseline"] = alone(True)
  calls = {name: functools.partial(decode_corpus, r, target, p.batches,
                                   max_new_tokens=job.max_new_tokens,
                                   rng=jax.random.PRNGKey(job.seed), prompt_lengths=p.lengths)
           for name, r in runs.items()}
  with compiling(f"the baseline ({base.name}) for --compare", job.compile_cache_dir):
    for call in calls.values():
      call()
  timed = time_rounds(calls, repeats)
  ms = {name: ms_per_token(t) for name, t in timed.items()}
  exact_ms = ms.get("exact baseline")
  out: dict[str, Any] = {
      "baseline": "target alone" if isinstance(base, Autoregressive)
      else f"sd.{type(base).__name__}", "baseline_run": alone(False).describe(),
      "sampled": not run.sampling.is_greedy,
      "ms_per_token": ms["method"], "baseline_ms_per_token": ms["baseline"],
      "speedup": ms["baseline"] / ms["method"], "rounds": repeats,
      "exact_baseline_ms_per_token": exact_ms,
      "exact_cost": None if exact_ms is None else exact_ms / ms["baseline"],
      **same_output(timed["method"]["output"], timed["baseline"]["output"])}
  if run.mesh is None:     # the theory of its 'why' line, on one device
    costs = explain_method(target, run.method, p.batches[0].tokens,
                           timed["method"]["output"].stats, job.max_new_tokens,
                           exact=run.exact_mode, cache_dir=job.compile_cache_dir)
    if costs is not None:
      out["costs"] = costs
  return out
