"""Side-by-side decoding benchmark: baseline vs speculative decoding in ONE process.

For every batch size and sampling mode, the baseline (`sd.generate`) and speculative
decoding at each gamma run on the same prompts with the same PRNG key. First every
method (and every step-cost loop) is called once to compile it, excluded from the
numbers; these warm-up calls run `compile_workers` at a time, since XLA compiles in
parallel threads. Then, one call at a time, `repeats` rounds each run every method of a
(batch, mode) group once, the order rotated by one method per round, and the median wall
time over rounds is reported. Alternating methods spreads slow drifts of the machine
(thermal, other processes) over all methods instead of whichever ran last.

Definitions (also written into bench.json under "definitions"):

* ms/token: median wall time of one batched decode call (encoder included) divided by
  the tokens it generated summed over rows (EOS included). At batch 8 this is the
  amortised cost of one row-token, not the latency of a step.
* tokens/s: the inverse, generated row-tokens per second.
* speedup: baseline ms/token / speculative ms/token (same batch size and mode).
* alpha: stats["alpha"], mean over scored draft positions of beta = sum_x min(p, q).
* acceptance rate: accepted drafts / drafted tokens.
* block efficiency: generated tokens per target (verifier) call, per row.
* c: time of one 1-token drafter `decode` / one 1-token target `decode`, each measured
  as a jitted `lax.fori_loop` of `timing_steps` calls on a started cache of the bench's
  capacity at the same batch size (each step also takes an argmax over the vocabulary).
* verify cost: time of one (gamma+1)-token target `decode` / one 1-token call, measured
  the same way.
* predicted: `theory.walltime_improvement_measured(alpha, gamma, c, verify_cost)`
  = E / (gamma c + verify_cost) with E = (1 - alpha^(gamma+1)) / (1 - alpha).

Prompts are uniform random token ids in [3, vocab) of length `prompt_len` whose last
token is EOS (1), the same rows for every batch size (batch B takes the first B rows);
or lines of `--prompts-file` (text with `--tokenizer`, else token ids), padded or cut
to `prompt_len`, cycled when the file has fewer lines than the batch. Random-weight
models ("config:NAME") give alpha ~ 0: the numbers then measure the machinery's cost.

    results = run_bench(target, drafter, batch_sizes=(1,), gammas=(1, 3), modes=("greedy",))
    write_report(results, "bench_out")     # bench.json, bench.md, bench.png
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.tools import cli

SCHEMA_VERSION = 1
MODES = ("greedy", "sample")
DEFAULT_TARGET = "config:t5_1_1_small"
DEFAULT_DRAFTER = "config:t5_1_1_tiny_drafter"

DESCRIPTION = __doc__.split("\n\n    results =")[0]

DEFINITIONS = {
    "ms_per_token": "median wall time of one batched decode call / generated tokens summed over "
                    "rows (EOS included)",
    "tokens_per_s": "generated row-tokens per second (1000 / ms_per_token)",
    "speedup": "baseline ms_per_token / speculative ms_per_token, same batch size and mode",
    "alpha": "stats['alpha']: mean over scored draft positions of sum_x min(p, q)",
    "acceptance_rate": "accepted drafts / drafted tokens",
    "block_efficiency": "generated tokens per target call, per row",
    "c": "1-token drafter decode time / 1-token target decode time (jitted fori_loop, same "
         "batch size and cache capacity)",
    "verify_cost": "(gamma+1)-token target decode time / 1-token target decode time",
    "predicted_speedup": "theory.walltime_improvement_measured(alpha, gamma, c, verify_cost)",
    "predicted_speedup_theorem8": "theory.walltime_improvement(alpha, gamma, c) (verification "
                                  "assumed free)",
    "expected_block_efficiency": "theory.expected_tokens_per_call(alpha, gamma)",
    "measured_over_predicted": "speedup / predicted_speedup",
    "first_call_s": "duration of the warm-up call (mostly compilation; concurrent with other "
                    "warm-ups when compile_workers > 1)",
}

# Settings that must match for --resume to reuse entries of an existing bench.json.
_RESUME_KEYS = ("target", "drafter", "target_overrides", "drafter_overrides", "dtype",
                "prompt_len", "max_new_tokens", "seed", "ignore_eos", "prompts_file",
                "tokenizer", "temperature_sample")


class BenchError(ValueError):
  """Invalid benchmark settings (reported by the CLI as a one-line error, exit 2)."""


# ----------------------------------------------------------------------------- machine, prompts


def machine_info() -> dict[str, Any]:
  import jaxlib
  devices = jax.devices()
  return {
      "jax_version": jax.__version__,
      "jaxlib_version": getattr(jaxlib, "__version__", None),
      "backend": jax.default_backend(),
      "devices": [str(d) for d in devices],
      "device_kind": devices[0].device_kind if devices else None,
      "device_count": len(devices),
      "cpu_count": os.cpu_count(),
      "platform": platform.platform(),
      "processor": platform.processor() or platform.machine(),
      "python": platform.python_version(),
      "numpy_version": np.__version__,
  }


def random_prompts(batch: int, length: int, vocab_size: int, seed: int = 0) -> np.ndarray:
  """int32 [batch, length]: uniform ids in [3, vocab) (no pad/EOS/unk), last token EOS (1)."""
  if length < 1:
    raise BenchError(f"prompt length must be >= 1, got {length}")
  if vocab_size < 4:
    raise BenchError(f"vocab_size {vocab_size} too small for random prompts")
  rng = np.random.RandomState(seed)
  tokens = rng.randint(3, vocab_size, size=(batch, length)).astype(np.int32)
  tokens[:, -1] = 1
  return tokens


def rows_for_batch(prompts: np.ndarray, batch: int) -> np.ndarray:
  """The first `batch` rows of `prompts`, cycling when there are fewer."""
  return np.asarray(prompts)[np.arange(batch) % len(prompts)]


def file_prompts(path: str, length: int, tokenizer, vocab_size: int) -> np.ndarray:
  """Lines of `path` -> [N, length] (text via `tokenizer`, else token ids), padded or cut."""
  with open(path, encoding="utf-8") as f:
    lines = [line for line in f.read().splitlines() if line.strip()]
  if not lines:
    raise BenchError(f"prompts file {path!r} holds no non-blank lines")
  if tokenizer is not None:
    if tokenizer.vocab_size > vocab_size:
      raise BenchError(f"tokenizer has {tokenizer.vocab_size} pieces, the target only "
                       f"{vocab_size}")
    return np.asarray(tokenizer.encode(lines, max_length=length, truncate=True), np.int32)
  ids = cli.parse_token_ids(lines, vocab_size)
  out = np.zeros((len(ids), length), np.int32)
  out[:, :min(length, ids.shape[1])] = ids[:, :length]
  return out


# ----------------------------------------------------------------------------- step costs


@functools.partial(jax.jit, static_argnames=("steps",))
def _decode_loop(model, cache, tokens, steps):
  """`steps` k-token decodes, each at the same cache offset; feeds back its argmax."""
  start = cache.length

  def body(_, carry):
    cache, tok = carry
    logits, cache = model.decode(tok, cache.with_length(start))
    return cache, jnp.argmax(logits, axis=-1).astype(jnp.int32)

  _, tok = jax.lax.fori_loop(0, steps, body, (cache, tokens))
  return tok


class StepTimer:
  """Times `steps` k-token `model.decode` calls in one jitted `lax.fori_loop`.

  Every call writes at the same offset of a started cache (so it never fills; a
  fixed-shape cache costs the same at every offset) and feeds its argmax back as the
  next input (each step includes that argmax over the vocabulary). `compile()` may run
  in a worker thread; `time()` must not run concurrently with anything else.
  """

  def __init__(self, model, cache, k: int, steps: int = 16, seed: int = 0):
    if k < 1 or steps < 1:
      raise BenchError(f"StepTimer needs k >= 1 and steps >= 1, got {k}, {steps}")
    if cache.capacity < k:
      raise BenchError(f"cache capacity {cache.capacity} < k {k}")
    batch = cache.batch_size
    self.model, self.k, self.steps = model, k, steps
    self.cache = cache.with_length(jnp.full((batch,), (cache.capacity - k) // 2, jnp.int32))
    self.tokens = jnp.asarray(random_prompts(batch, k, model.config.vocab_size, seed + 1))
    self.compiled = False

  def _run(self):
    return jax.block_until_ready(_decode_loop(self.model, self.cache, self.tokens, self.steps))

  def compile(self) -> "StepTimer":
    self._run()
    self.compiled = True
    return self

  def time(self, repeats: int = 5) -> float:
    """Median seconds per decode call over `repeats` timed loops."""
    if repeats < 1:
      raise BenchError(f"repeats must be >= 1, got {repeats}")
    if not self.compiled:
      self.compile()
    return median_call_seconds(self._run, repeats) / self.steps


def median_call_seconds(run: Callable[[], Any], repeats: int) -> float:
  """Median wall time in seconds of `repeats` calls of `run` (already compiled)."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def started_cache(model, encoder_tokens, capacity: int):
  """`model.start` on `encoder_tokens` [B, Le] with `capacity` positions."""
  return model.start(jnp.asarray(encoder_tokens, jnp.int32), capacity)


def time_decode_step(model, batch: int, k: int, *, encoder_tokens=None, encoder_len: int = 32,
                     capacity: int = 128, steps: int = 16, repeats: int = 5,
                     seed: int = 0) -> float:
  """Seconds per call of `model.decode` with k tokens per row at batch size `batch`.

  Starts a cache of `capacity` positions on `encoder_tokens` (default: random prompts
  of `encoder_len`), compiles a jitted `lax.fori_loop` of `steps` k-token decodes
  (see `StepTimer`) and returns the median over `repeats` timed loops / `steps`.
  """
  if repeats < 1:
    raise BenchError(f"repeats must be >= 1, got {repeats}")
  if encoder_tokens is None:
    encoder_tokens = random_prompts(batch, encoder_len, model.config.vocab_size, seed)
  cache = started_cache(model, rows_for_batch(np.asarray(encoder_tokens), batch), capacity)
  return StepTimer(model, cache, k, steps, seed).compile().time(repeats)


def cost_timers(target, drafter, gammas: Iterable[int], *, encoder_tokens, capacity: int,
                steps: int = 16) -> dict[Any, StepTimer]:
  """Uncompiled timers at one batch size: ("target", 1), ("drafter", 1), ("target", g+1)."""
  t_cache = started_cache(target, encoder_tokens, capacity)
  d_cache = started_cache(drafter, encoder_tokens, capacity)
  timers = {("target", 1): StepTimer(target, t_cache, 1, steps),
            ("drafter", 1): StepTimer(drafter, d_cache, 1, steps)}
  for g in sorted(set(gammas)):
    timers[("target", g + 1)] = StepTimer(target, t_cache, g + 1, steps)
  return timers


def measure_costs(target, drafter, batch: int, gammas: Iterable[int], *, encoder_tokens,
                  capacity: int, steps: int = 16, repeats: int = 5,
                  timers: dict[Any, StepTimer] | None = None,
                  tick: Callable[[], None] = lambda: None) -> dict[str, Any]:
  """c and verify costs at one batch size (see the module docstring).

  `timers` (from `cost_timers`, possibly compiled already) are built when not given.
  """
  gammas = sorted(set(gammas))
  if timers is None:
    timers = cost_timers(target, drafter, gammas, encoder_tokens=encoder_tokens,
                         capacity=capacity, steps=steps)
  target_s = timers[("target", 1)].time(repeats)
  tick()
  drafter_s = timers[("drafter", 1)].time(repeats)
  tick()
  verify = []
  for g in gammas:
    v = timers[("target", g + 1)].time(repeats)
    tick()
    verify.append({"gamma": g, "tokens": g + 1, "ms": 1e3 * v, "verify_cost": v / target_s})
  return {"batch_size": batch, "target_step_ms": 1e3 * target_s,
          "drafter_step_ms": 1e3 * drafter_s, "c": drafter_s / target_s,
          "capacity": capacity, "steps": steps, "verify": verify}


def default_compile_workers() -> int:
  """Concurrent warm-up calls: up to 4 on CPU; 1 on accelerators (each holds device memory)."""
  return max(1, min(4, os.cpu_count() or 1)) if jax.default_backend() == "cpu" else 1


def run_parallel(fns: Sequence[Callable[[], Any]], workers: int,
                 tick: Callable[[], None] = lambda: None) -> list[Any]:
  """Call `fns` (in `workers` threads when > 1); their results in order.

  Used for warm-up only: compilation releases the GIL, so compiles overlap. Timed calls
  never run this way.
  """
  if workers <= 1 or len(fns) <= 1:
    out = []
    for fn in fns:
      out.append(fn())
      tick()
    return out
  from concurrent.futures import ThreadPoolExecutor, as_completed
  with ThreadPoolExecutor(max_workers=workers) as pool:
    futures = {pool.submit(fn): i for i, fn in enumerate(fns)}
    out = [None] * len(fns)
    for future in as_completed(futures):
      out[futures[future]] = future.result()
      tick()
  return out


def _verify_cost(costs: dict[str, Any], gamma: int) -> float | None:
  for v in costs.get("verify", []):
    if v["gamma"] == gamma:
      return v["verify_cost"]
  return None


# ----------------------------------------------------------------------------- timing methods


def _timed_call(fn: Callable[[], Any]) -> tuple[float, Any]:
  t0 = time.perf_counter()
  result = jax.block_until_ready(fn())
  return time.perf_counter() - t0, result


def time_methods(methods: dict[str, Callable[[], Any]], repeats: int,
                 tick: Callable[[], None] = lambda: None,
                 first_call_s: dict[str, float] | None = None) -> dict[str, dict[str, Any]]:
  """Time every method: `repeats` rounds of all, the order rotated by one per round.

  Methods are called once first (compilation) unless `first_call_s` gives the duration
  of an earlier warm-up call of each. Returns per method {"first_call_s", "times_s",
  "median_s", "output"} (the output of its last call, on the host).
  """
  names = list(methods)
  out = {}
  for name in names:
    if first_call_s is not None and name in first_call_s:
      first = first_call_s[name]
    else:
      first, _ = _timed_call(methods[name])
      tick()
    out[name] = {"first_call_s": first, "times_s": []}
  last = {}
  for r in range(repeats):
    for name in names[r % len(names):] + names[:r % len(names)]:
      seconds, last[name] = _timed_call(methods[name])
      out[name]["times_s"].append(seconds)
      tick()
  for name in names:
    out[name]["median_s"] = statistics.median(out[name]["times_s"])
    out[name]["output"] = jax.device_get(last[name])
  return out


def _key(entry: dict[str, Any]) -> tuple:
  return (entry["batch_size"], entry["mode"], entry["gamma"])


def _finite(x) -> float | None:
  x = float(x)
  return x if math.isfinite(x) else None


def _sampling(mode: str):
  import specdec_jax as sd
  if mode == "greedy":
    return sd.Greedy()
  if mode == "sample":
    return sd.Sampling(temperature=1.0)
  raise BenchError(f"unknown mode {mode!r}; use {', '.join(MODES)}")


# ----------------------------------------------------------------------------- run


def run_bench(target, drafter=None, *, batch_sizes: Sequence[int] = (1, 8),
              gammas: Sequence[int] = (1, 3, 5, 7), modes: Sequence[str] = MODES,
              prompt_len: int = 32, max_new_tokens: int = 64, repeats: int = 5, seed: int = 0,
              prompts: np.ndarray | None = None, baseline_only: bool = False,
              ignore_eos: bool = False, timing_steps: int = 16,
              settings: dict[str, Any] | None = None, existing: dict[str, Any] | None = None,
              progress: bool = True, compile_workers: int | None = None,
              on_update: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
  """Benchmark baseline vs speculative decoding; returns the bench.json dict.

  Args:
    target, drafter: `Model`s (drafter may be None with `baseline_only`).
    prompts: [N, L] encoder tokens; default `random_prompts(max batch, prompt_len, V, seed)`.
    ignore_eos: decode exactly `max_new_tokens` per row (eos_id=-1) in every method.
    settings: descriptive settings stored under "config" (model names, overrides, ...).
    existing: a previous bench.json dict; its entries with the same (batch, mode, gamma)
      are kept and not re-run (--resume). Its baselines serve the speedups of new gammas.
    on_update: called with the results so far after each (batch, mode) group.
    compile_workers: concurrent warm-up (compiling) calls before any timing; default
      `default_compile_workers()`. Timed calls always run one at a time.
  """
  import specdec_jax as sd
  from specdec_jax import theory
  from tqdm import tqdm

  batch_sizes = [int(b) for b in batch_sizes]
  gammas = [] if baseline_only else sorted({int(g) for g in gammas})
  modes = list(modes)
  if not batch_sizes or min(batch_sizes) < 1:
    raise BenchError(f"batch sizes must be >= 1, got {batch_sizes}")
  if not baseline_only and (not gammas or min(gammas) < 1):
    raise BenchError(f"gammas must be integers >= 1, got {gammas}")
  for mode in modes:
    _sampling(mode)
  if repeats < 1 or max_new_tokens < 1 or timing_steps < 1:
    raise BenchError("repeats, max_new_tokens and timing_steps must be >= 1")
  if not baseline_only:
    if drafter is None:
      raise BenchError("a drafter is needed unless baseline_only")
    from specdec_jax import drafters
    drafters.check_compatible(target, drafters.as_drafter(drafter, target))
  vocab = target.config.vocab_size
  if prompts is None:
    prompts = random_prompts(max(batch_sizes), prompt_len, vocab, seed)
  prompts = np.asarray(prompts, np.int32)

  config = dict(settings or {})
  config.update({"batch_sizes": batch_sizes, "gammas": gammas, "modes": modes,
                 "prompt_len": int(prompts.shape[1]), "max_new_tokens": max_new_tokens,
                 "repeats": repeats, "seed": seed, "baseline_only": baseline_only,
                 "ignore_eos": ignore_eos, "timing_steps": timing_steps,
                 "temperature_sample": 1.0,
                 "target_config": target.config.to_dict(),
                 "target_params": int(target.num_params()),
                 "drafter_config": None if drafter is None else drafter.config.to_dict(),
                 "drafter_params": None if drafter is None else int(drafter.num_params())})
  kept = list(existing.get("results", [])) if existing else []
  kept_costs = {c["batch_size"]: c for c in (existing.get("costs", []) if existing else [])}
  if existing:  # the lists describe every entry in the file, old and new
    for name in ("batch_sizes", "gammas", "modes"):
      old = existing.get("config", {}).get(name, [])
      merged = list(dict.fromkeys([*old, *config[name]]))
      config[name] = merged if name == "modes" else sorted(merged)
  results = {"schema_version": SCHEMA_VERSION,
             "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                 timespec="seconds"),
             "command": config.pop("command", None),
             "machine": machine_info(), "config": config, "definitions": DEFINITIONS,
             "results": kept, "costs": list(kept_costs.values())}
  have = {_key(e) for e in kept}
  eos_id = -1 if ignore_eos else None
  capacity = max_new_tokens + (max(gammas) if gammas else 0) + 1
  rng = jax.random.PRNGKey(seed)

  plan = []  # (batch, mode, [gamma or None to run])
  for b in batch_sizes:
    for mode in modes:
      todo = [g for g in [None, *gammas] if (b, mode, g) not in have]
      if todo:
        plan.append((b, mode, todo))
  cost_plan = {}
  for b, _, todo in plan:
    if any(g is not None for g in todo):
      old = kept_costs.get(b)
      if old is None or any(_verify_cost(old, g) is None for g in gammas):
        cost_plan[b] = True
  workers = default_compile_workers() if compile_workers is None else max(1, compile_workers)
  config["compile_workers"] = workers

  def encoder(b):
    return jnp.asarray(rows_for_batch(prompts, b))

  def make_methods(b, mode, todo):
    sampling, enc, methods = _sampling(mode), encoder(b), {}
    for g in todo:
      if g is None:
        methods["baseline"] = functools.partial(
            sd.generate, target, enc, max_new_tokens=max_new_tokens, sampling=sampling,
            rng=rng, eos_id=eos_id)
      else:
        methods[f"gamma={g}"] = functools.partial(
            sd.speculative_generate, target, drafter, enc, gamma=g,
            max_new_tokens=max_new_tokens, sampling=sampling, rng=rng, eos_id=eos_id)
    return methods

  group_methods = {(b, mode): make_methods(b, mode, todo) for b, mode, todo in plan}
  cost_batches = sorted(cost_plan)
  n_warm = sum(len(m) for m in group_methods.values())
  n_timers = sum(2 + len(gammas) for _ in cost_batches)
  total = (len(cost_batches) + n_warm + n_timers + sum(len(m) * repeats
                                                       for m in group_methods.values())
           + n_timers)
  bar = tqdm(total=total, desc="bench", unit="call", disable=not progress, file=sys.stderr,
             dynamic_ncols=True)
  tick = lambda: bar.update(1)

  try:
    # 1. Warm-up: compile everything first, `workers` calls at a time.
    bar.set_description("bench: compiling")
    timers = dict(zip(cost_batches, run_parallel(
        [functools.partial(cost_timers, target, drafter, gammas, encoder_tokens=encoder(b),
                           capacity=capacity, steps=timing_steps) for b in cost_batches],
        workers, tick)))
    warm = [(key, name, fn) for key, methods in group_methods.items()
            for name, fn in methods.items()]
    tasks = [timer.compile for b in cost_batches for timer in timers[b].values()]
    tasks += [functools.partial(_timed_call, fn) for _, _, fn in warm]
    done = run_parallel(tasks, workers, tick)[n_timers:]
    first_call_s = {(key, name): seconds for (key, name, _), (seconds, _) in zip(warm, done)}
    del done

    # 2. Timing, one call at a time.
    for b, mode, todo in plan:
      if b in cost_plan:
        bar.set_description(f"bench B={b} step costs")
        kept_costs[b] = measure_costs(target, drafter, b, gammas, encoder_tokens=None,
                                      capacity=capacity, steps=timing_steps, timers=timers[b],
                                      tick=tick)
        del cost_plan[b], timers[b]
        results["costs"] = [kept_costs[k] for k in sorted(kept_costs)]
      bar.set_description(f"bench B={b} {mode}")
      methods = group_methods[(b, mode)]
      timed = time_methods(methods, repeats, tick,
                           first_call_s={name: first_call_s[((b, mode), name)]
                                         for name in methods})

      base = timed.get("baseline")
      if base is not None:
        generated = int(np.sum(base["output"].lengths))
        entry = _entry(b, mode, None, base, generated)
        entry["target_calls"] = int(base["output"].stats["target_calls"])
        entry["block_efficiency"] = _finite(base["output"].stats["tokens_per_target_call"])
        entry["speedup"] = 1.0
        results["results"].append(entry)
      base_entry = next(e for e in results["results"] if _key(e) == (b, mode, None))
      for g in todo:
        if g is None:
          continue
        t = timed[f"gamma={g}"]
        stats = t["output"].stats
        generated = int(np.sum(t["output"].lengths))
        entry = _entry(b, mode, g, t, generated)
        alpha = float(np.clip(stats["alpha"], 0.0, 1.0))
        costs = kept_costs[b]
        c, verify = costs["c"], _verify_cost(costs, g)
        predicted = float(theory.walltime_improvement_measured(alpha, g, c, verify))
        speedup = base_entry["ms_per_token"] / entry["ms_per_token"]
        entry.update({
            "speedup": speedup,
            "alpha": alpha,
            "acceptance_rate": _finite(stats["acceptance_rate"]),
            "block_efficiency": _finite(stats["tokens_per_target_call"]),
            "expected_block_efficiency": float(theory.expected_tokens_per_call(alpha, g)),
            "target_calls": int(stats["target_calls"]),
            "rounds": int(stats["rounds"]),
            "drafter_calls": int(stats["drafter_calls"]),
            "c": c, "verify_cost": verify,
            "predicted_speedup": predicted,
            "predicted_speedup_theorem8": float(theory.walltime_improvement(alpha, g, c)),
            "measured_over_predicted": speedup / predicted,
            "baseline_ms_per_token": base_entry["ms_per_token"],
        })
        results["results"].append(entry)
      results["results"].sort(key=_sort_key(modes))
      if on_update is not None:
        on_update(results)
  finally:
    bar.close()
  results["results"].sort(key=_sort_key(results["config"]["modes"]))
  return results


def _entry(batch: int, mode: str, gamma: int | None, timed: dict[str, Any],
           generated: int) -> dict[str, Any]:
  wall = timed["median_s"]
  return {"batch_size": batch, "mode": mode,
          "method": "baseline" if gamma is None else "speculative", "gamma": gamma,
          "generated_tokens": generated, "wall_s_median": wall, "wall_s": timed["times_s"],
          "first_call_s": timed["first_call_s"],
          "ms_per_token": 1e3 * wall / max(generated, 1),
          "tokens_per_s": generated / wall if wall > 0 else None}


def _sort_key(modes: Sequence[str]):
  order = {m: i for i, m in enumerate(modes)}
  return lambda e: (e["batch_size"], order.get(e["mode"], len(order)), e["gamma"] or 0)


# ----------------------------------------------------------------------------- report

TABLE_COLUMNS = ("batch", "mode", "method", "γ", "ms/token", "tokens/s", "speedup", "α",
                 "acceptance", "tokens/call", "c", "verify cost", "predicted",
                 "measured/predicted")


def markdown_table(results: dict[str, Any]) -> str:
  def f(x, digits=2):
    return "—" if x is None else f"{x:.{digits}f}"
  lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
  for e in results["results"]:
    spec = e["method"] == "speculative"
    cells = [str(e["batch_size"]), e["mode"], e["method"], str(e["gamma"]) if spec else "—",
             f(e["ms_per_token"], 3), f(e["tokens_per_s"], 1), f(e.get("speedup")) + "x",
             f(e.get("alpha"), 3) if spec else "—",
             f(e.get("acceptance_rate"), 3) if spec else "—",
             f(e.get("block_efficiency")),
             f(e.get("c"), 3) if spec else "—", f(e.get("verify_cost")) if spec else "—",
             f(e.get("predicted_speedup")) + "x" if spec else "—",
             f(e.get("measured_over_predicted")) if spec else "—"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def markdown_report(results: dict[str, Any]) -> str:
  cfg, m = results["config"], results["machine"]

  def model_line(what):
    name = cfg.get(what) or "?"
    params = cfg.get(f"{what}_params")
    over = cfg.get(f"{what}_overrides")
    return (f"- {what}: `{name}`" + (f" with overrides `{over}`" if over else "")
            + (f", {params / 1e6:.1f}M params" if params else ""))
  lines = [
      "# specdec bench", "",
      f"Created {results['created']}" + (f" by `{results['command']}`"
                                         if results.get("command") else "") + ".", "",
      model_line("target"), model_line("drafter"),
      f"- prompts: {cfg.get('prompts', 'random ids')}, length {cfg['prompt_len']}; "
      f"max_new_tokens {cfg['max_new_tokens']}" + (" (EOS ignored)" if cfg.get("ignore_eos")
                                                   else "")
      + f"; dtype {cfg.get('dtype') or 'as stored'}; seed {cfg['seed']}",
      f"- timing: median of {cfg['repeats']} alternating rounds after one compile call per "
      f"method; step costs from {cfg['timing_steps']}-step jitted loops",
      f"- machine: jax {m['jax_version']} ({m['backend']}), {m['device_count']} × "
      f"{m['device_kind']}, {m['cpu_count']} CPUs, {m['platform']}", "",
      markdown_table(results), "",
      "ms/token = median wall time of a batched decode call / tokens generated summed over rows; "
      "speedup = baseline ms/token / speculative ms/token; tokens/call = tokens per target call "
      "per row; c = drafter step / target step time; verify cost = (γ+1)-token target call / "
      "1-token call; predicted = E/(γc + verify cost), E = (1-α^(γ+1))/(1-α).",
  ]
  if results.get("costs"):
    lines += ["", "| batch | target step ms | drafter step ms | c | verify cost by γ |",
              "|---|---|---|---|---|"]
    for c in results["costs"]:
      verify = ", ".join(f"γ={v['gamma']}: {v['verify_cost']:.2f}" for v in c["verify"])
      lines.append(f"| {c['batch_size']} | {c['target_step_ms']:.3f} | "
                   f"{c['drafter_step_ms']:.3f} | {c['c']:.3f} | {verify} |")
  return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: str) -> None:
  """Speedup vs gamma per (mode, batch), predicted dashed; baseline-only: ms/token bars."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(7, 4.5), dpi=120)
  FigureCanvasAgg(fig)
  ax = fig.add_subplot(1, 1, 1)
  spec = [e for e in results["results"] if e["method"] == "speculative"]
  if spec:
    groups = list(dict.fromkeys((e["mode"], e["batch_size"]) for e in spec))
    colors = [f"C{i % 10}" for i in range(len(groups))]
    for (mode, b), color in zip(groups, colors):
      es = sorted((e for e in spec if (e["mode"], e["batch_size"]) == (mode, b)),
                  key=lambda e: e["gamma"])
      g = [e["gamma"] for e in es]
      ax.plot(g, [e["speedup"] for e in es], "o-", color=color, label=f"{mode}, batch {b}")
      ax.plot(g, [e["predicted_speedup"] for e in es], "--", color=color, alpha=0.8,
              label=f"{mode}, batch {b} (predicted)")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xlabel("γ (drafts per round)")
    ax.set_ylabel("speedup over baseline (ms/token)")
    ax.set_xticks(sorted({e["gamma"] for e in spec}))
    ax.legend(fontsize=7)
  else:
    base = [e for e in results["results"] if e["method"] == "baseline"]
    ax.bar([f"{e['mode']}\nB={e['batch_size']}" for e in base], [e["ms_per_token"] for e in base])
    ax.set_ylabel("baseline ms/token")
  cfg = results["config"]
  ax.set_title(f"{cfg.get('target', 'target')} / {cfg.get('drafter', 'drafter')}", fontsize=9)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path)


def time_rounds(methods: dict[str, Callable[[], Any]], repeats: int,
                tick: Callable[[], None] = lambda: None) -> dict[str, dict[str, Any]]:
  """Time each method `repeats` times, rotating the order by one method per round.

  Returns {name: {"times_s": [...], "median_s": float, "output": last result}}.
  """
  names = list(methods)
  out = {name: {"times_s": []} for name in names}
  for r in range(repeats):
    for name in names[r % len(names):] + names[:r % len(names)]:
      t0 = time.perf_counter()
      result = methods[name]()
      out[name]["times_s"].append(time.perf_counter() - t0)
      out[name]["output"] = result
      tick()
  for name in names:
    out[name]["median_s"] = statistics.median(out[name]["times_s"])
  return out


def atomic_write(path: str, text: str) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def write_report(results: dict[str, Any], out_dir: str) -> dict[str, str]:
  """Write bench.json, bench.md and bench.png into `out_dir` (overwriting); their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {name: os.path.join(out_dir, f"bench.{name}") for name in ("json", "md", "png")}
  atomic_write(paths["json"], json.dumps(cli.to_jsonable(results), indent=1) + "\n")
  atomic_write(paths["md"], markdown_report(results))
  tmp_png = paths["png"] + ".tmp.png"
  plot(results, tmp_png)
  os.replace(tmp_png, paths["png"])
  return paths


# ----------------------------------------------------------------------------- command line


def _mode_list(text: str) -> list[str]:
  modes = [m.strip() for m in text.split(",") if m.strip()]
  bad = [m for m in modes if m not in MODES]
  if bad or not modes:
    raise argparse.ArgumentTypeError(f"modes must be among {', '.join(MODES)}, got {text!r}")
  return list(dict.fromkeys(modes))


def add_arguments(p: argparse.ArgumentParser) -> None:
  p.add_argument("--target", default=DEFAULT_TARGET,
                 help=f"target model path/name or config:NAME (default {DEFAULT_TARGET})")
  p.add_argument("--drafter", default=DEFAULT_DRAFTER,
                 help=f"drafter model path/name or config:NAME (default {DEFAULT_DRAFTER}; a "
                 "config: drafter takes the target's vocab_size unless overridden)")
  p.add_argument("--target-overrides", metavar="K=V,...",
                 help="architecture overrides of a config: target, e.g. num_decoder_layers=4")
  p.add_argument("--drafter-overrides", metavar="K=V,...",
                 help="architecture overrides of a config: drafter, e.g. vocab_size=32128")
  p.add_argument("--batch-sizes", type=cli.int_list, default=[1, 8], metavar="1,8")
  p.add_argument("--gammas", type=cli.int_list, default=[1, 3, 5, 7], metavar="1,3,5,7")
  p.add_argument("--modes", type=_mode_list, default=list(MODES), metavar="greedy,sample",
                 help="greedy and/or sample (temperature 1)")
  p.add_argument("--prompt-len", type=int, default=32,
                 help="encoder length: random ids (last = EOS), or file prompts padded/cut")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--repeats", type=int, default=5, help="timed rounds (median reported)")
  p.add_argument("--timing-steps", type=int, default=16,
                 help="decode steps per jitted loop when measuring c and verify cost")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                 help="both models' parameter dtype (default float32)")
  p.add_argument("--ignore-eos", action="store_true",
                 help="always decode max_new_tokens per row (eos_id=-1)")
  p.add_argument("--prompts-file", metavar="FILE",
                 help="one prompt per line: text with --tokenizer, else token ids")
  p.add_argument("--tokenizer", metavar="PATH_OR_NAME")
  p.add_argument("--out", default="bench_out", metavar="DIR",
                 help="writes bench.json, bench.md, bench.png (overwritten)")
  p.add_argument("--resume", action="store_true",
                 help="keep entries of an existing DIR/bench.json (same settings) and run only "
                 "the missing (batch, mode, gamma) ones")
  p.add_argument("--baseline-only", action="store_true")
  p.add_argument("--compile-workers", type=int, metavar="N",
                 help="concurrent warm-up (compile) calls before timing; default: up to 4 on "
                 "CPU, 1 on accelerators (each warm-up call holds device memory)")
  p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")


def run_from_args(args) -> int:
  import specdec_jax as sd
  for name in ("prompt_len", "max_new_tokens", "repeats", "timing_steps"):
    if getattr(args, name) < 1:
      raise BenchError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
  if args.drafter in ("ngram", "prompt-lookup") and not args.baseline_only:
    raise BenchError("bench times model drafters only (c comes from timing drafter decode "
                     "steps); give a drafter model path/name or config:NAME")
  if args.tokenizer and not args.prompts_file:
    raise BenchError("--tokenizer is only used with --prompts-file")
  target_over = cli.parse_overrides(args.target_overrides)
  drafter_over = cli.parse_overrides(args.drafter_overrides)

  existing = None
  json_path = os.path.join(args.out, "bench.json")
  settings = {"target": args.target, "drafter": None if args.baseline_only else args.drafter,
              "target_overrides": target_over or None, "dtype": args.dtype,
              "prompts_file": args.prompts_file, "tokenizer": args.tokenizer,
              "prompts": (f"lines of {args.prompts_file}" if args.prompts_file else
                          "uniform random ids in [3, vocab), last token EOS"),
              "command": "specdec " + " ".join(shlex.quote(a) for a in
                                               getattr(args, "argv", sys.argv[1:]))}

  tokenizer = sd.load_tokenizer(args.tokenizer) if args.tokenizer else None
  target = cli.load_model(args.target, args.dtype, what="target", overrides=target_over)
  drafter = None
  if not args.baseline_only:
    if (args.drafter.startswith("config:") and "vocab_size" not in drafter_over
        and sd.get_config(args.drafter[len("config:"):]).vocab_size
        != target.config.vocab_size):
      drafter_over["vocab_size"] = target.config.vocab_size
      cli.note(f"drafter {args.drafter}: vocab_size set to the target's "
               f"{target.config.vocab_size} (random weights; pass --drafter-overrides to "
               "choose)")
    drafter = cli.load_model(args.drafter, args.dtype, what="drafter", overrides=drafter_over)
  settings["drafter_overrides"] = drafter_over or None

  if args.resume and os.path.exists(json_path):
    with open(json_path, encoding="utf-8") as f:
      try:
        existing = json.load(f)
      except json.JSONDecodeError as e:
        raise BenchError(f"--resume: {json_path} is not valid JSON: {e}") from e
    old = existing.get("config", {})
    now = {**settings, "prompt_len": args.prompt_len, "max_new_tokens": args.max_new_tokens,
           "seed": args.seed, "ignore_eos": args.ignore_eos, "temperature_sample": 1.0}
    diff = [k for k in _RESUME_KEYS if old.get(k) != cli.to_jsonable(now.get(k))]
    if diff:
      raise BenchError(f"--resume: {json_path} was made with other settings ({', '.join(diff)});"
                       " drop --resume to overwrite it or choose another --out")

  prompts = None
  if args.prompts_file:
    prompts = file_prompts(args.prompts_file, args.prompt_len, tokenizer,
                           target.config.vocab_size)
  results = run_bench(
      target, drafter, batch_sizes=args.batch_sizes, gammas=args.gammas, modes=args.modes,
      prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
      seed=args.seed, prompts=prompts, baseline_only=args.baseline_only,
      ignore_eos=args.ignore_eos, timing_steps=args.timing_steps, settings=settings,
      existing=existing, progress=not args.no_progress, compile_workers=args.compile_workers,
      on_update=lambda r: write_report(r, args.out))
  paths = write_report(results, args.out)
  print(markdown_table(results))
  print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}", file=sys.stderr)
  return 0
