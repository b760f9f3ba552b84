"""Running the benchmark: plan the missing entries, compile everything, time, fill bench.json.

See the package docstring for what is measured and how.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import specdec_jax as sd
from specdec_jax import costs as costs_lib
from specdec_jax import experimental
from specdec_jax.batching import Batch, cycled_rows, padded_batches, random_prompts
from specdec_jax.costs import CostTiming
from specdec_jax.io.reports import machine_info, utc_now
from specdec_jax.loading import resolve_drafter
from specdec_jax.rounds.engine import EXACT_WIDTH
from specdec_jax.runs import Run, decode_corpus, same_output, stats_row
from specdec_jax.sampling import MODES, make_sampling
from specdec_jax.timing import default_compile_workers, run_parallel, time_rounds, timed_call
from specdec_jax_lab.errors import BenchError

SCHEMA_VERSION = 1

DEFINITIONS = {
    "ms_per_token": "median wall time of one batched decode call / generated tokens summed over "
                    "rows (EOS included)",
    "tokens_per_s": "generated row-tokens per second (1000 / ms_per_token)",
    "speedup": "the method's baseline's ms_per_token / its ms_per_token, same batch size and "
               "mode; the baseline is Method.baseline(): the target alone (greedy or sampling "
               "alike), sd.Beam with the same beams for a beam method",
    "alpha": "stats['alpha'] = sum(beta_sum) / sum(beta_count): mean over scored draft "
             "positions of sum_x min(p, q)",
    "acceptance_rate": "accepted drafts / drafted tokens",
    "block_efficiency": "generated tokens per target call, calls counted per row (1.0 for the "
                        "baseline)",
    "target_calls": "verifier calls counted per row: a row live in a call adds 1",
    "rounds": "batched verifier calls (loop iterations)",
    "c": "1-token drafter decode time / 1-token target decode time (jitted fori_loop, same "
         "batch size and cache capacity)",
    "verify_cost": "(gamma+1)-token target decode time / 1-token target decode time",
    "predicted_speedup": "theory.walltime_improvement_measured(alpha, gamma, c, verify_cost)",
    "predicted_speedup_theorem8": "theory.walltime_improvement(alpha, gamma, c) (verification "
                                  "assumed free)",
    "expected_block_efficiency": "theory.expected_tokens_per_call(alpha, gamma)",
    "measured_over_predicted": "speedup / predicted_speedup",
    "projected_speedup": "at alpha 0.6-0.9: the best measured gamma's "
                         "theory.walltime_improvement_measured(alpha, gamma, c, verify_cost)",
    "reference_speedup": "the reference entry's ms_per_token / this entry's, same batch "
                         "size and mode (speculative beam search: sd.Beam with its settings)",
    "predicted_reference_speedup": "speculative beam search: theory.beam_walltime_improvement("
                                   "steps_per_target_call, gamma, c, verify_cost) with its "
                                   "beam_costs: c = drafter step / target step over the B*K "
                                   "beams' rows, verify_cost = target call over the B*M "
                                   "chains' rows of gamma+1 tokens / that step",
    "steps_per_target_call": "speculative beam search: beam steps (sd.Beam's target calls) "
                             "per target call, total steps / total rounds",
    "drafted_nodes_per_round": "speculative beam search: drafted tree nodes per row and "
                               "round",
    "same_tokens": "greedy: the entry's tokens equal its baseline's (decoded in the same group)",
    "same_beams": "a beam method: every beam and score equal sd.Beam's with its settings",
    "first_call_s": "duration of the warm-up call (mostly compilation; concurrent with other "
                    "warm-ups when compile_workers > 1)",
}

# Settings that must match for --resume to reuse entries of an existing bench.json.
RESUME_KEYS = ("target", "drafter", "target_overrides", "drafter_overrides", "dtype", "exact",
               "prompt_len", "max_new_tokens", "seed", "ignore_eos", "prompts_file",
               "tokenizer", "temperature_sample", "mesh")


def _noop() -> None:
  pass


# ----------------------------------------------------------------------------- step costs


def measure_costs(target, drafter, batch: int, gammas: Iterable[int], timing: CostTiming, *,
                  inputs, timers: dict[tuple, Any] | None = None,
                  tick: Callable[[], None] = _noop) -> dict[str, Any]:
  """c and verify costs at one batch size (see the package docstring).

  `timers` (from `costs.cost_timers(target, {"drafter": drafter}, ...)`, possibly
  compiled already) are built when not given.
  """
  gammas = sorted(set(gammas))
  capacity, steps = timing.capacity, timing.steps
  if timers is None:
    timers = costs_lib.cost_timers(target, {"drafter": drafter}, gammas,
                                   inputs=inputs, capacity=capacity, steps=steps)
  seconds = costs_lib.time_costs(timers, timing.repeats, tick)
  target_s, drafter_s = seconds[("target", 1)], seconds[("drafter", "drafter")]
  verify = [{"gamma": g, "tokens": g + 1, "ms": 1e3 * seconds[("target", g + 1)],
             "verify_cost": seconds[("target", g + 1)] / target_s} for g in gammas]
  return {"batch_size": batch, "target_step_ms": 1e3 * target_s,
          "drafter_step_ms": 1e3 * drafter_s, "c": drafter_s / target_s,
          "capacity": capacity, "steps": steps, "verify": verify}


def measure_beam_costs(target, drafter, inputs, method, timing: CostTiming,
                       place_inputs=None) -> dict[str, Any]:
  """The cost model's inputs of speculative beam search `method` (`experimental.SpeculativeBeam`)
  at the batch of `inputs` [B, L] (`theory.beam_walltime_improvement`):
  c = one drafter step / one target step over the B*K beams' rows (`sd.Beam`'s step),
  verify_cost = one target call over the B*M chains' rows of gamma + 1 tokens / that
  step (in exact mode on a target that is not width-invariant both calls are
  `EXACT_WIDTH` tokens wide, as the methods' are)."""
  k = method.num_beams
  padded = bool(method.exact) and not target.width_invariant_decode
  chains = method.chains or (k if padded else 3 * k)
  call = EXACT_WIDTH if padded else method.gamma + 1
  enc = np.asarray(inputs)
  place = (lambda x: jnp.asarray(x)) if place_inputs is None else (
      lambda x: place_inputs(jnp.asarray(x)))
  beams, rows = place(np.repeat(enc, k, axis=0)), place(np.repeat(enc, chains, axis=0))
  capacity, steps = max(timing.capacity, 2 * call), timing.steps
  timers = {"target": costs_lib.StepTimer(target, costs_lib.started_cache(target, beams, capacity),
                                          EXACT_WIDTH if padded else 1, steps),
            "drafter": costs_lib.drafter_timer(drafter, beams, capacity, steps),
            "verify": costs_lib.StepTimer(target, costs_lib.started_cache(target, rows, capacity),
                                          call, steps)}
  sec = costs_lib.time_costs(timers, timing.repeats)
  return {"batch_size": int(enc.shape[0]), "num_beams": k, "chains": chains,
          "gamma": method.gamma, "beam_rows": int(beams.shape[0]),
          "verify_rows": int(rows.shape[0]),
          "verify_tokens": call, "target_step_ms": 1e3 * sec["target"],
          "drafter_step_ms": 1e3 * sec["drafter"], "verify_ms": 1e3 * sec["verify"],
          "c": sec["drafter"] / sec["target"], "verify_cost": sec["verify"] / sec["target"]}


def _verify_cost(costs: dict[str, Any], gamma: int) -> float | None:
  return next((v["verify_cost"] for v in costs.get("verify", []) if v["gamma"] == gamma), None)


# ----------------------------------------------------------------------------- settings


def _check_settings(target, drafter, settings: BenchSettings, batch_sizes: list[int],
                    gammas: list[int], modes: list[str]) -> None:
  """Raise BenchError on bad `settings`; `batch_sizes`, `gammas`, `modes` are its lists as
  `run_bench` normalised them."""
  s = settings
  if not batch_sizes or min(batch_sizes) < 1:
    raise BenchError(f"batch sizes must be >= 1, got {batch_sizes}")
  if not s.baseline_only and (not gammas or min(gammas) < 1):
    raise BenchError(f"gammas must be integers >= 1, got {gammas}")
  bad = [m for m in modes if m not in MODES]
  if bad:
    raise BenchError(f"unknown mode {bad[0]!r}; use {', '.join(MODES)}")
  if s.repeats < 1 or s.max_new_tokens < 1 or s.timing_steps < 1:
    raise BenchError("repeats, max_new_tokens and timing_steps must be >= 1")
  if not s.baseline_only:
    if drafter is None:
      raise BenchError("a drafter is needed unless baseline_only")
    resolve_drafter(drafter, target)   # checks the vocabulary


def _start_results(config: dict[str, Any], existing: dict[str, Any] | None):
  """The results dict (kept entries of `existing` in it) and the kept costs by batch."""
  kept = list(existing.get("results", [])) if existing else []
  kept_costs = {c["batch_size"]: c for c in (existing.get("costs", []) if existing else [])}
  if existing:  # the lists describe every entry in the file, old and new
    for name in ("batch_sizes", "gammas", "modes"):
      old = existing.get("config", {}).get(name, [])
      merged = list(dict.fromkeys([*old, *config[name]]))
      config[name] = merged if name == "modes" else sorted(merged)
  results = {"schema_version": SCHEMA_VERSION, "created": utc_now(),
             "command": config.pop("command", None), "machine": machine_info(),
             "config": config, "definitions": DEFINITIONS, "results": kept,
             "costs": list(kept_costs.values())}
  return results, kept_costs


def _key(entry: dict[str, Any]) -> tuple:
  """(batch, mode, item): item None (baseline), gamma (speculative) or an extra's label."""
  return (entry["batch_size"], entry["mode"], entry.get("label") or entry["gamma"])


def _plan(batch_sizes, modes, items, have) -> list[tuple[int, str, list[int | str | None]]]:
  """(batch, mode, [None for the baseline, gammas, extra labels]) of every group with
  missing entries."""
  plan = []
  for b in batch_sizes:
    for mode in modes:
      todo = [g for g in [None, *items] if (b, mode, g) not in have]
      if todo:
        plan.append((b, mode, todo))
  return plan


def _cost_batches(plan, kept_costs, gammas) -> list[int]:
  """Batch sizes whose step costs must be (re)measured."""
  out = set()
  for b, _, todo in plan:
    if any(isinstance(g, int) for g in todo):
      old = kept_costs.get(b)
      if old is None or any(_verify_cost(old, g) is None for g in gammas):
        out.add(b)
  return sorted(out)


# ----------------------------------------------------------------------------- entries


def _entry(batch: int, mode: str, method: Run, timed: dict[str, Any],
           first_call_s: float, label: str | None = None) -> dict[str, Any]:
  out = timed["output"]
  generated = int(np.sum(np.asarray(out.lengths)))
  wall = timed["median_s"]
  entry = {"batch_size": batch, "mode": mode, "method": method.kind,
           "gamma": getattr(method.method, "gamma", None) if label is None else None,
           "label": label,
           "generated_tokens": generated, "wall_s_median": wall, "wall_s": timed["times_s"],
           "first_call_s": first_call_s, "ms_per_token": 1e3 * wall / max(generated, 1),
           "tokens_per_s": generated / wall if wall > 0 else None}
  entry.update(stats_row(out.stats))
  if type(method.method.baseline()) is type(method.method):   # its own baseline
    entry["speedup"] = 1.0
  return entry


def _sort_key(modes: Sequence[str], labels: Sequence[str] = ()):
  order = {m: i for i, m in enumerate(modes)}
  extra = {label: 1000 + i for i, label in enumerate(labels)}
  return lambda e: (e["batch_size"], order.get(e["mode"], len(order)),
                    extra.get(e.get("label"), 2000) if e.get("label") else e["gamma"] or 0)


# ----------------------------------------------------------------------------- run


class _Run:
  """One benchmark run: the models, its settings, and the compiled pieces."""

  def __init__(self, target, drafter, prompts, gammas: list[int], settings: BenchSettings, *,
               extras=None, references=None, place_inputs=None, every_row=False):
    """`gammas`: the checked, sorted gammas timed (none with `settings.baseline_only`);
    `every_row`: every row of `prompts` is decoded at every batch size (a prompts file),
    else batch B decodes the first B; the rest of the run's settings come from `settings`."""
    self.target, self.drafter, self.prompts = target, drafter, prompts
    self.every_row = every_row
    self.place_inputs = place_inputs
    self.exact = settings.exact
    self.extras = dict(extras or {})
    self.references = dict(references or {})
    self.gammas, self.max_new_tokens = gammas, settings.max_new_tokens
    self.timing_steps = settings.timing_steps
    self.cost_repeats = settings.repeats
    self.rng = jax.random.PRNGKey(settings.seed)
    self.eos_id = -1 if settings.ignore_eos else None
    self.capacity = settings.max_new_tokens + (max(gammas) if gammas else 0) + 1

  def encoder(self, batch: int):
    enc = jnp.asarray(cycled_rows(self.prompts, batch))
    return enc if self.place_inputs is None else self.place_inputs(enc)

  def batches(self, batch: int) -> list[Batch]:
    """What a call at batch size `batch` decodes: every prompt in batches of `batch` rows
    (the last padded, its padding not counted), or the first `batch` rows."""
    if not self.every_row:
      return [Batch(self.encoder(batch), batch)]
    place = (lambda x: x) if self.place_inputs is None else self.place_inputs
    return [Batch(place(jnp.asarray(b.tokens)), b.real)
            for b in padded_batches(self.prompts, batch)]

  def method(self, item, sampling) -> Run:
    """The baseline (None), speculative decoding (a gamma) or an extra (its label)."""
    if item is None:
      return Run(sd.Autoregressive(exact=self.exact), sampling)
    if isinstance(item, str):
      run = self.extras[item](sampling)
      return dataclasses.replace(run, method=dataclasses.replace(run.method, exact=self.exact))
    return Run(sd.Speculative(self.drafter, gamma=item, exact=self.exact), sampling)

  def methods(self, batch: int, mode: str, todo) -> Mapping[str, Callable[[], Any]]:
    """{"baseline" / "gamma=G" / label: a call decoding the group's batch} for the missing
    entries."""
    sampling, batches, out = make_sampling(mode), self.batches(batch), {}
    for g in todo:
      out[_name(g)] = functools.partial(
          decode_corpus, self.method(g, sampling), self.target, batches,
          max_new_tokens=self.max_new_tokens, rng=self.rng, eos_id=self.eos_id)
    return out

  def baseline_label(self, item, sampling) -> str | None:
    """The label of the entry `item` (a gamma or an extra's label) is measured against
    (`Method.baseline()`): None for the target alone, else the extra with the baseline's
    settings (`sd.Beam` of a beam method's beams); KeyError if none is timed."""
    base = self.method(item, sampling).method.baseline()
    if isinstance(base, sd.Autoregressive):
      return None
    for label in self.extras:
      value = self.method(label, sampling).method
      if type(value) is type(base) and (dataclasses.replace(value, exact=None)
                                        == dataclasses.replace(base, exact=None)):
        return label
    raise KeyError(item)

  def warm_up(self, groups, cost_batches, workers, tick):
    """Compile every step-cost loop and method, `workers` at a time; (timers by batch,
    first-call seconds by (group, method))."""
    timers = dict(zip(cost_batches, run_parallel(
        [functools.partial(costs_lib.cost_timers, self.target, {"drafter": self.drafter},
                           self.gammas, inputs=self.encoder(b), capacity=self.capacity,
                           steps=self.timing_steps) for b in cost_batches], workers, tick),
                         strict=True))
    warm = [(key, name, fn) for key, methods in groups.items() for name, fn in methods.items()]
    tasks = [timer.compile for b in cost_batches for timer in timers[b].values()]
    n_timers = len(tasks)
    tasks += [functools.partial(timed_call, fn) for _, _, fn in warm]
    done = run_parallel(tasks, workers, tick)[n_timers:]
    return timers, {(key, name): s for (key, name, _), (s, _) in zip(warm, done, strict=True)}

  def group_entries(self, batch, mode, todo, timed, first, results, costs):
    """The group's new entries (its baseline from `results` when already there)."""
    new = []
    sampling = make_sampling(mode)
    if "baseline" in timed:
      new.append(_entry(batch, mode, self.method(None, sampling), timed["baseline"],
                        first["baseline"]))
    base = next(e for e in results["results"] + new if _key(e) == (batch, mode, None))
    for g in (g for g in todo if g is not None):
      name = _name(g)
      entry = _entry(batch, mode, self.method(g, sampling), timed[name], first[name],
                     label=g if isinstance(g, str) else None)
      if "speedup" not in entry:      # over its own baseline, not always the target alone
        entry.update(self.speedup(g, sampling, entry, [*results["results"], *new], base,
                                  (batch, mode)))
        entry.update(self.agreement(g, sampling, timed))
      if isinstance(g, int):
        entry.update(costs_lib.predictions(entry["alpha"], g, costs["c"],
                                           _verify_cost(costs, g), entry["speedup"]))
      new.append(entry)
    for entry in new:       # an extra timed against another entry of its group
      ref_label = self.references.get(entry.get("label"))
      ref = next((e for e in results["results"] + new
                  if ref_label is not None and _key(e) == (batch, mode, ref_label)), None)
      if ref is not None:
        entry.update(reference=ref_label, reference_ms_per_token=ref["ms_per_token"],
                     reference_speedup=ref["ms_per_token"] / entry["ms_per_token"])
      method = self.method(entry.get("label"), sampling).method if entry.get("label") else None
      if isinstance(method, experimental.SpeculativeBeam) and "steps_per_target_call" in entry:
        entry.update(self.beam_prediction(batch, method, entry["steps_per_target_call"]))
    return new

  def speedup(self, item, sampling, entry, entries, base, group) -> dict[str, Any]:
    """{speedup, baseline_ms_per_token, baseline} of `entry` over its baseline's entry
    (`baseline_label`; `base`: the group's target alone); speedup None when that
    baseline is not timed."""
    try:
      label = self.baseline_label(item, sampling)
    except KeyError:
      return {"speedup": None, "baseline": "not timed"}
    ref = base if label is None else next(
        (e for e in entries if _key(e) == (*group, label)), None)
    if ref is None:
      return {"speedup": None, "baseline": "not timed"}
    return {"speedup": ref["ms_per_token"] / entry["ms_per_token"],
            "baseline_ms_per_token": ref["ms_per_token"], "baseline": label or "target alone"}

  def agreement(self, item, sampling, timed) -> dict[str, Any]:
    """Greedy: {same_tokens, and for beams same_beams} of `item`'s output and its
    baseline's, where both were decoded in this group (`runs.same_output`)."""
    try:
      label = self.baseline_label(item, sampling)
    except KeyError:
      return {}
    base = timed.get(_name(label))
    if not sampling.is_greedy or base is None:
      return {}
    return same_output(timed[_name(item)]["output"], base["output"])

  def beam_prediction(self, batch: int, method, steps_per_call: float) -> dict[str, Any]:
    """Speculative beam search's step costs at this batch (`measure_beam_costs`) and the
    speedup over `sd.Beam` they predict with the measured steps per target call."""
    costs = measure_beam_costs(self.target, method.drafter, cycled_rows(self.prompts, batch),
                               method, CostTiming(self.capacity, self.timing_steps,
                                                  self.cost_repeats), self.place_inputs)
    return {"beam_costs": costs,
            "predicted_reference_speedup": float(sd.theory.beam_walltime_improvement(
                max(steps_per_call, 1.0), method.gamma, costs["c"],
                max(costs["verify_cost"], 1e-9)))}


def _name(item) -> str:
  """The timing name of a plan item: "baseline", "gamma=G" or the extra's label."""
  return "baseline" if item is None else item if isinstance(item, str) else f"gamma={item}"


def _config(settings, target, drafter, prompts, **values) -> dict[str, Any]:
  config = dict(settings or {})
  config.update(values)
  config.update({"prompt_len": int(prompts.shape[1]), "temperature_sample": 1.0,
                 "target_config": target.config.to_dict(),
                 "target_params": int(target.num_params()),
                 "drafter_config": None if drafter is None else drafter.config.to_dict(),
                 "drafter_params": None if drafter is None else int(drafter.num_params())})
  return config


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchSettings:
  """What `run_bench` measures and how.

  Attributes:
    batch_sizes: rows per decode call, each timed on its own.
    gammas: drafts per round of speculative decoding (none with `baseline_only`).
    modes: "greedy" and/or "sample" (temperature 1).
    prompt_len: random prompts' length (encoder tokens, the last one EOS).
    max_new_tokens: tokens decoded per row at most.
    repeats: timed rounds; the median is reported.
    seed: the random prompts' and sampling's seed.
    baseline_only: time the target alone (no drafter needed).
    ignore_eos: decode exactly `max_new_tokens` per row (eos_id=-1) in every method.
    timing_steps: decode steps per jitted loop when measuring c and verify costs.
    compile_workers: concurrent warm-up (compiling) calls before any timing; None:
      `default_compile_workers()`. Timed calls always run one at a time.
    exact: every method's `exact` (None: the library default, exact greedy calls; False:
      natural call widths, faster on CPU).
    progress: show a progress bar (stderr).
  """

  batch_sizes: Sequence[int] = (1, 8)
  gammas: Sequence[int] = (1, 3, 5, 7)
  modes: Sequence[str] = MODES
  prompt_len: int = 32
  max_new_tokens: int = 64
  repeats: int = 5
  seed: int = 0
  baseline_only: bool = False
  ignore_eos: bool = False
  timing_steps: int = 16
  compile_workers: int | None = None
  exact: bool | None = None
  progress: bool = True


@dataclasses.dataclass(frozen=True)
class BenchRecord:
  """What bench.json records beside the measurements, and the file it resumes.

  Attributes:
    config: descriptive settings stored under "config" (model names, overrides, ...).
    existing: a previous bench.json dict; its entries with the same (batch, mode, gamma)
      are kept and not re-run (--resume). Its baselines serve the speedups of new gammas.
  """

  config: dict[str, Any] | None = None
  existing: dict[str, Any] | None = None


def run_bench(target, drafter=None, settings: BenchSettings = BenchSettings(), *,
              prompts: np.ndarray | None = None, record: BenchRecord = BenchRecord(),
              on_update: Callable[[dict[str, Any]], object] | None = None,
              extras: dict[str, Callable[[Any], Run]] | None = None,
              references: Mapping[str, str] | None = None,
              place_inputs: Callable[[jax.Array], jax.Array] | None = None) -> dict[str, Any]:
  """Benchmark baseline vs speculative decoding (and `extras`); returns the bench.json dict.

  Args:
    target, drafter: `Model`s (drafter may be None with `settings.baseline_only`).
    settings: what is measured and how (`BenchSettings`).
    prompts: [N, L] encoder tokens (a prompts file's), every row decoded at every batch
      size; default `random_prompts(max batch, prompt_len, V, seed)`, batch B the first B.
    record: the descriptive "config" to store and the bench.json to resume (`BenchRecord`).
    on_update: called with the results so far after each (batch, mode) group.
    extras: {label: sampling -> Run}, more methods timed in every (batch, mode)
      group beside the baseline (BiLD, blockwise decoding, ...); entries carry the label.
    references: {extra label: the label of another extra}: the entry's speedup over that
      one's (`reference_speedup`; speculative beam search over `sd.Beam`).
    place_inputs: encoder tokens [B, L] -> placed (e.g. `sd.sharding.shard_batch` on a
      mesh); None: as they are.
  """
  s = settings
  extras = dict(extras or {})
  batch_sizes = [int(b) for b in s.batch_sizes]
  gammas = [] if s.baseline_only else sorted({int(g) for g in s.gammas})
  modes = list(s.modes)
  _check_settings(target, drafter, s, batch_sizes, gammas, modes)
  prompts_given = prompts is not None
  if prompts is None:
    prompts = random_prompts(max(batch_sizes), s.prompt_len, target.config.vocab_size, s.seed)
  prompts = np.asarray(prompts, np.int32)
  workers = (default_compile_workers() if s.compile_workers is None
             else max(1, s.compile_workers))
  config = _config(record.config, target, drafter, prompts, batch_sizes=batch_sizes, gammas=gammas,
                   modes=modes, max_new_tokens=s.max_new_tokens, repeats=s.repeats,
                   seed=s.seed, baseline_only=s.baseline_only, ignore_eos=s.ignore_eos,
                   timing_steps=s.timing_steps, compile_workers=workers,
                   extras=list(extras), exact=s.exact)
  results, kept_costs = _start_results(config, record.existing)
  plan = _plan(batch_sizes, modes, [*gammas, *extras], {_key(e) for e in results["results"]})
  run = _Run(target, drafter, prompts, gammas, s, extras=extras, references=references,
             place_inputs=place_inputs, every_row=prompts_given)
  _execute(run, plan, results, kept_costs, s.repeats, workers, s.progress, on_update)
  results["results"].sort(key=_sort_key(results["config"]["modes"], list(extras)))
  results["projections"] = [p for c in results["costs"] for p in costs_lib.projections(c)]
  return results


def _execute(run: _Run, plan, results, kept_costs, repeats, workers, progress, on_update):
  """Warm up, then time every planned group and add its entries to `results`."""
  from tqdm import tqdm
  groups = {(b, mode): run.methods(b, mode, todo) for b, mode, todo in plan}
  cost_batches = _cost_batches(plan, kept_costs, run.gammas)
  n_timers = len(cost_batches) * (2 + len(run.gammas))
  total = (len(cost_batches) + 2 * n_timers
           + sum(len(m) * (repeats + 1) for m in groups.values()))
  bar = tqdm(total=total, desc="bench: compiling", unit="call", disable=not progress,
             file=sys.stderr, dynamic_ncols=True)
  tick = lambda: bar.update(1)
  say = (lambda text: None) if progress else (lambda text: print(text, file=sys.stderr,
                                                                 flush=True))
  say(f"bench: compiling {len(cost_batches) * (2 + len(run.gammas))} step-cost loops and "
      f"{sum(map(len, groups.values()))} decode calls, then timing {len(plan)} (batch, mode) "
      f"group{'s' if len(plan) != 1 else ''} of {repeats} rounds")
  t0 = time.perf_counter()
  try:
    timers, first_call_s = run.warm_up(groups, cost_batches, workers, tick)
    say(f"bench: compiled in {time.perf_counter() - t0:.0f} s")
    t_timing = time.perf_counter()
    for i, (b, mode, todo) in enumerate(plan):
      if b in timers:
        bar.set_description(f"bench B={b} step costs")
        kept_costs[b] = measure_costs(run.target, run.drafter, b, run.gammas,
                                      CostTiming(run.capacity, run.timing_steps),
                                      inputs=None, timers=timers.pop(b), tick=tick)
        results["costs"] = [kept_costs[k] for k in sorted(kept_costs)]
      bar.set_description(f"bench B={b} {mode}")
      timed = time_rounds(groups[(b, mode)], repeats, tick)
      first = {name: first_call_s[((b, mode), name)] for name in timed}
      results["results"] += run.group_entries(b, mode, todo, timed, first, results,
                                              kept_costs.get(b))
      results["results"].sort(key=_sort_key(results["config"]["modes"], list(run.extras)))
      if on_update is not None:
        on_update(results)
      say(_group_line(i + 1, len(plan), b, mode, time.perf_counter() - t_timing))
  finally:
    bar.close()


def _group_line(done: int, total: int, batch: int, mode: str, seconds: float) -> str:
  """A timed group's progress line, with the time the rest will take at this pace (groups
  differ in batch size, so a rough estimate)."""
  left = seconds / done * (total - done)
  return (f"bench: B={batch} {mode} timed ({done} of {total}, {seconds:.0f} s"
          + (f"; about {left:.0f} s left)" if done < total else ")"))
