"""A decode job: one run over encoded prompts, batch by batch, to stdout or to a file.

    job = Job(max_new_tokens=32, batch_size=8, output="out.txt").start()
    decoded = decode_job(run.on(mesh), target, Prompts.encode(lines, tok, target.config), job)
    decoded.corpus.stats, decoded.wall, decoded.batch      # the outputs and their timing
    compared = compare_job(run, target, prompts, job)       # vs its baseline, timed

`Job` holds how the prompts are decoded beside the run: the batch size (None: all rows,
rounded to the mesh's "data" axis), the seed, the warm-up pass, the --output file and its
resume, the processes. The batch is sized here alone (`batch_size`), for every path.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, NamedTuple, cast

import jax

from specdec_jax.batching import Batch, padded_batches
from specdec_jax.compilation import announce_kernel_build, compiling, use_persistent_cache
from specdec_jax.costs import explain_method
from specdec_jax.errors import SpecdecError
from specdec_jax.flags import FlagError
from specdec_jax.io.prompts import Prompts
from specdec_jax.io.streams import emit
from specdec_jax.methods import Autoregressive
from specdec_jax.runs import Corpus, Run, decode_corpus, same_output
from specdec_jax.runtime import distributed, liveness, output_file
from specdec_jax.runtime.progress import Progress, deferred_signals, interrupts_kept
from specdec_jax.sharding import spans_processes
from specdec_jax.timing import is_exact, ms_per_token, time_rounds


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
    progress: a progress line on stderr (prompts from a file).
    format_row: a row's tokens as its output (text, or the ids themselves).
    lines: the input lines, fingerprinted in `output`'s sidecar with `settings`.
    settings: the run's settings, recorded in `output`'s sidecar.
    compile_cache: keep compiled programs in JAX's persistent cache.
    compile_cache_dir: where (`start` sets it; None: off).
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
  """A job's batches: `batch` rows each (this process's own block of rows when `split`),
  an LM's prompt lengths per batch (None: T5), the key index of the first batch; `spans`:
  the mesh spans every process's devices (one program over all of them)."""

  batch: int
  batches: list[Batch]
  lengths: list | None
  first_key: int = 0
  split: bool = False
  spans: bool = False


class Decoded(NamedTuple):
  """A job's corpus, its timing report (`timing`: wall seconds, tokens, ...) and batches
  (`plan`); `streamed`: its rows are on stdout already; `resumed`: the `output` row it
  started at (None: no output file)."""

  corpus: Corpus
  timing: dict[str, Any]
  plan: Plan
  streamed: bool = False
  resumed: int | None = None


def plan(run: Run, prompts: Prompts, job: Job, file: bool = False) -> Plan:
  """The batches of `job.batch_size` rows, or of all of them rounded up to a multiple of
  the mesh's "data" (the last rows repeat, as `padded_batches` pads). With several
  processes splitting the rows (each on a mesh of its own devices, or none; on a mesh over
  every process's devices all decode every batch as one program), each decodes its own
  block of rows, keyed apart; a `file`'s batches are every row's (`output_file` deals
  them out to the processes)."""
  n, processes, process = len(prompts), jax.process_count(), jax.process_index()
  spans = spans_processes(run.mesh)
  split = processes > 1 and not spans
  rows = distributed.process_rows(n, 0, processes)[2] if split else n
  data = 1 if run.mesh is None else run.mesh.shape["data"]
  batch = job.batch_size or -(-rows // data) * data
  own = split and not file
  blocks = ((lambda x, b: distributed.local_batches(x, b, process, processes)) if own
            else padded_batches)
  batches, lengths = prompts.batches(batch, blocks)
  return Plan(batch, batches, lengths, process * len(batches) if own else 0,   # keyed apart
              split, spans)


def _timing(run: Run, prompts: Prompts, job: Job, corpus: Corpus, wall: float,
            p: Plan) -> dict[str, Any]:
  """The job's timing report: one timed run (`output`: batch by batch, compiling included)."""
  generated = corpus.generated if corpus.outputs else 0    # --resume of a complete file: 0
  return {"method": run.describe(), "prompts": len(prompts), "batch_size": p.batch,
          "generated_tokens": generated, "wall_s": wall,
          "warmup": bool(job.warmup and not job.output),
          "includes_compile": not job.warmup or bool(job.output),
          "processes": jax.process_count(), "mesh_spans_processes": p.spans,
          "tokens_per_s": generated / wall if wall > 0 else None,
          "ms_per_token": 1e3 * wall / generated if generated else None}


def decode_job(run: Run, target, prompts: Prompts, job: Job) -> Decoded:
  """Decode `prompts` with `run` (placed on its mesh: `Run.on`) as `job` says: to its
  output file, or batch by batch (rows streamed as each finishes); the corpus and its
  timing. With several processes, a failure that is no `SpecdecError` (a lost peer) is
  named by `liveness`, not a trace."""
  try:
    p = plan(run, prompts, job, file=bool(job.output))
    if job.output:
      corpus, wall, streamed, resumed = _to_file(run, target, p, job, len(prompts))
    else:
      corpus, wall, streamed, resumed = _in_batches(run, target, p, job, len(prompts))
    if p.split:     # the slowest process's
      corpus, wall = (corpus if job.output else distributed.gather_corpus(corpus),
                      distributed.gather_max(wall))
  except Exception as e:
    if not isinstance(e, SpecdecError):
      liveness.after_failure()
    raise
  return Decoded(corpus, _timing(run, prompts, job, corpus, wall, p), p, streamed,
                 resumed)


def _in_batches(run: Run, target, p: Plan, job: Job, n: int):
  """(the corpus, wall seconds, streamed, None) of the `n` rows: batch by batch, each
  batch's rows streamed as it finishes (not with the rows split over processes), a
  progress line, an interrupt saying how many rows were kept."""
  rng = jax.random.PRNGKey(job.seed)

  def part(i: int) -> Corpus:     # batch i, with the key it has in the whole corpus
    return decode_corpus(run, target, [p.batches[i]], max_new_tokens=job.max_new_tokens,
                         rng=rng, prompt_lengths=None if p.lengths is None else [p.lengths[i]],
                         first_key=p.first_key + i)
  if job.warmup:    # each shape's first batch once, untimed: every program compiled
    shapes: dict[tuple, int] = {}
    for i, b in enumerate(p.batches):
      shapes.setdefault((b.tokens.shape, None if p.lengths is None else p.lengths[i].shape), i)
    with compiling(f"the decode programs for batch {p.batch}", job.compile_cache_dir,
                   quiet=jax.process_index() != 0):
      for i in sorted(shapes.values()):
        part(i)
  stream = job.stream and not p.split
  progress = (Progress(n, "specdec decode") if job.progress and jax.process_index() == 0
              and len(p.batches) > 1 else None)
  parts: list[Corpus] = []
  done = 0                                 # rows written (stdout) so far
  t0 = time.perf_counter()
  with interrupts_kept(lambda: None if not stream else (
      f"{done} of {n} rows kept (written above); --output FILE writes rows as they finish "
      "and --resume continues where a run stopped")):
    for i in range(len(p.batches)):
      decoded = part(i)
      with deferred_signals():             # its rows written and counted together
        parts.append(decoded)
        if stream:
          for row in decoded.token_rows():
            o = job.format_row(row)
            emit(o if isinstance(o, str) else " ".join(map(str, o)))
          done += decoded.real_rows[0]
      if progress is not None:
        progress.update(decoded.real_rows[0], decoded.generated)
  corpus = Corpus(tuple(o for c in parts for o in c.outputs),
                  tuple(r for c in parts for r in c.real_rows))
  return corpus, time.perf_counter() - t0, stream, None


def _to_file(run: Run, target, p: Plan, job: Job, n: int):
  """(the corpus, wall seconds, False, the row it started at) of the `n` rows, to
  `job.output` (`output_file`): the file's batches (keyed by their index in it), each
  decoded once and appended to the file as it finishes."""
  output, start = output_file.open_shared(
      str(job.output), job.lines, {**job.settings, "batch_size": p.batch},
      (target.params, run), job.resume)
  progress = (Progress(n, "specdec decode", done=output.rows) if output is not None
              and len(p.batches) > 1 else None)
  t0 = time.perf_counter()
  with interrupts_kept(lambda: None if output is None else (
      f"{output.rows} of {n} rows kept in {job.output!r}; the same command with --resume "
      "continues from there")):
    corpus = output_file.decode_to_file(
        run, target, p.batches, p.lengths, output, start,
        output_file.FileDecode(job.max_new_tokens, jax.random.PRNGKey(job.seed), p.split),
        format_row=job.format_row,
        on_batch=None if progress is None else
        lambda c: progress.update(sum(c.real_rows), c.generated))
  wall = time.perf_counter() - t0
  if output is not None:
    output.finish()
  return corpus, wall, False, start


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
  if is_exact(run):
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
                           exact=is_exact(run), cache_dir=job.compile_cache_dir)
    if costs is not None:
      out["costs"] = costs
  return out
