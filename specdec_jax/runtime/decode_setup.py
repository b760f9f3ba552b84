"""`specdec decode` on typed settings, the one call its command makes between parsing and
printing: the mesh, the prompts read and encoded, the models loaded from the names typed,
the method placed on the mesh (`Run.on`), then the job decoded (`jobs.decode_job`) and,
with `compare`, timed beside its baseline (`jobs.compare_job`).

    setup, decoded, compared = decode_request(choice, DecodeRun(model="demo-de-en/target"))
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, NamedTuple

import jax

import specdec_jax as sd
from specdec_jax.flags import FlagError
from specdec_jax.flags.common import check_at_least_one
from specdec_jax.flags.mesh import check_batch, load_target, mesh_from_flag
from specdec_jax.io.prompts import Prompts, isatty, output_text, read_prompt_lines
from specdec_jax.loading import MethodChoice, drafter_loader, note, placed_method, resolve_drafter
from specdec_jax.models.model import family
from specdec_jax.runs import Run
from specdec_jax.runtime.distributed import Processes
from specdec_jax.runtime.jobs import Decoded, Job, compare_job, decode_job


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

  def __post_init__(self):
    check_at_least_one(max_new_tokens=self.max_new_tokens, batch_size=self.batch_size)
    if self.resume and not self.output:
      raise FlagError("--resume continues an --output file: give --output")


class Setup(NamedTuple):
  """The flags (`run`, its budget fitted to the model) and the drafter's name, the job
  (its budget, lines, settings and row format set), the mesh (None: one device), the input
  lines and their encoding, the tokenizer (None: token ids), the target, the method placed
  on the mesh and the seconds loading took."""

  run: DecodeRun
  drafter: str | None
  job: Job
  mesh: Any
  lines: list[str]
  prompts: Prompts
  tokenizer: Any
  target: sd.Model
  method: Run
  load_s: float


def _family_loader(load, target: sd.Model, flag: str):
  """`load` refusing a model of another kind than the target's (T5 vs decoder-only)."""
  def checked(name: str) -> sd.Model:
    model = load(name)
    if isinstance(model, sd.Model) and model.is_decoder_only != target.is_decoder_only:
      raise FlagError(f"{flag} {name} is {family(model)} but --model is {family(target)}: "
                     "an LM drafts for an LM, a T5 for a T5")
    return model
  return checked


def _place(choice: MethodChoice, run: DecodeRun, target: sd.Model, prompts: Prompts, mesh):
  """The method placed on the mesh, its drafter and rescorer loaded (refused if not of the
  target's family); the "ngram" drafter is fitted on the prompts' own tokens."""
  drafter = None
  if choice.drafter == "ngram":    # an LM's prompts are texts with no start token before them
    fit = sd.NGramDrafter.fit
    rows, vocab = prompts.ngram_rows(), target.config.vocab_size
    drafter = resolve_drafter(fit(rows, vocab_size=vocab) if prompts.lengths is None
                              else fit(rows, vocab_size=vocab, start_id=None), target)
  elif choice.drafter is not None and not choice.early_exit:
    drafter = resolve_drafter(choice.drafter, target,
                              load=_family_loader(drafter_loader(run.dtype), target, "--drafter"))
  rescorer_load = _family_loader(drafter_loader(run.dtype), target, "--rescorer")
  return placed_method(choice, target, run.model, drafter, rescorer_load, mesh)


def set_up(choice: MethodChoice, run: DecodeRun, job: Job) -> Setup:
  """The mesh, the prompts read and encoded (--max-new-tokens fitted to the model, with a
  note), the models loaded, the method placed, and the job completed with them."""
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
  prompts = Prompts.encode(lines, tokenizer, target.config)
  budget, said = prompts.fit(run.max_new_tokens, target.config)
  if said is not None:
    note(said)
  run = dataclasses.replace(run, max_new_tokens=budget)
  method = _place(choice, run, target, prompts, mesh)
  settings, description = method.settings(), method.describe()
  settings.update(model=run.model, drafter=choice.drafter, tokenizer=run.tokenizer,
                  max_new_tokens=budget, seed=run.seed, dtype=run.dtype,
                  mesh=run.mesh)    # what reports and --output record
  job = dataclasses.replace(job, max_new_tokens=budget, lines=tuple(lines), settings=settings,
                            description=description,
                            format_row=lambda row: output_text(row, tokenizer))
  return Setup(run, choice.drafter, job, mesh, lines, prompts, tokenizer, target, method,
               time.perf_counter() - t_load)


def job_of(run: DecodeRun) -> Job:
  """The `Job` of the settings: batch, warm-up, output, resume, processes."""
  return Job(max_new_tokens=run.max_new_tokens, seed=run.seed, batch_size=run.batch_size,
             warmup=run.warmup, output=run.output, resume=run.resume,
             processes=run.processes, stream=not (run.json or run.output),
             progress=run.input_file is not None or run.output is not None,
             compile_cache=run.compile_cache)


class Request(NamedTuple):
  """What `decode_request` did: its setup, the decoded job, the comparison (None: not asked
  for, nothing decoded, or the method is its own baseline)."""

  setup: Setup
  decoded: Decoded
  compared: dict[str, Any] | None


def decode_request(choice: MethodChoice, run: DecodeRun) -> Request:
  """Start the job (this process's side: compile cache, processes, output path), set it up
  (`set_up`), decode it and, with `run.compare`, time it beside its baseline."""
  s = set_up(choice, run, job_of(run).start(run.input_file, run.compare))
  d = decode_job(s.method, s.target, s.prompts, s.job)
  compared = (compare_job(s.method, s.target, d.plan, s.job)
              if run.compare and d.corpus.outputs else None)
  return Request(s, d, compared)
