"""Wall-clock timing shared by every benchmark: alternating rounds and medians.

    warm = run_parallel([partial(timed_call, f) for f in methods.values()], workers)
    timed = time_rounds(methods, repeats=5)     # {name: {"times_s", "median_s", "output"}}

`time_rounds` calls every method once per round, the order rotated by one method per
round, and reports each method's median: alternating spreads slow drifts of the
machine (thermal, other processes) over all methods instead of whichever ran last.
Compile (warm up) first: no call is excluded here. Each call is timed up to
`jax.block_until_ready` of its result, so a method should return device arrays or a
small object, not a large nest of Python values.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import jax


def _noop() -> None:
  pass


def timed_call(fn: Callable[[], Any]) -> tuple[float, Any]:
  """(seconds, result) of one call of `fn`, until its result is ready."""
  t0 = time.perf_counter()
  result = jax.block_until_ready(fn())
  return time.perf_counter() - t0, result


def median_call_seconds(run: Callable[[], Any], repeats: int) -> float:
  """Median wall time in seconds of `repeats` calls of `run` (already compiled)."""
  return statistics.median(timed_call(run)[0] for _ in range(repeats))


def time_rounds(methods: Mapping[Any, Callable[[], Any]], repeats: int,
                tick: Callable[[], None] = _noop) -> dict[Any, dict[str, Any]]:
  """Time each method `repeats` times, rotating the order by one method per round.

  Returns {name: {"times_s": [...], "median_s": float, "output": its last result}}.
  """
  names = list(methods)
  out: dict[str, dict[str, Any]] = {name: {"times_s": []} for name in names}
  for r in range(repeats):
    for name in names[r % len(names):] + names[:r % len(names)]:
      seconds, out[name]["output"] = timed_call(methods[name])
      out[name]["times_s"].append(seconds)
      tick()
  for name in names:
    out[name]["median_s"] = statistics.median(out[name]["times_s"])
  return out


def ms_per_token(timed: dict[str, Any]) -> float:
  """Median ms per generated token of one `time_rounds` entry (its output a `Corpus`)."""
  return 1e3 * timed["median_s"] / max(timed["output"].generated, 1)


def default_compile_workers() -> int:
  """Concurrent warm-up calls: up to 4 on CPU; 1 on accelerators (each holds device memory)."""
  return max(1, min(4, os.cpu_count() or 1)) if jax.default_backend() == "cpu" else 1


def run_parallel(fns: Sequence[Callable[[], Any]], workers: int,
                 tick: Callable[[], None] = _noop) -> list[Any]:
  """Call `fns` (in `workers` threads when > 1); their results in order.

  For warm-up only: compilation releases the GIL, so compiles overlap. Timed calls
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
