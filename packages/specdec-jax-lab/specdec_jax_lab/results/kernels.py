"""The CPU-kernel tables: what a k-token decode call costs, and what exact greedy decoding costs.

    python -m specdec_jax_lab.results --only kernels
    # -> packages/specdec-jax-lab/results/cpu_kernels/: kernels.json, verify_cost.md,
    #    exactness_cost.md

Each half of the table runs in its own process, one with the CPU decode kernels
(`SPECDEC_CPU_KERNELS=1`) and one without (`SPECDEC_CPU_KERNELS=0`: XLA's own products, the
path accelerators run), since the switch is read when a model is first traced. Within a
process every timing is interleaved: each round calls every configuration once, in a shuffled
order, and the median over rounds is kept.

* Verify cost: one cached decode call of k tokens per row of the bundled demo target
  (`Model.decode`, dispatched from Python, after a 16-token prefix), as a ratio to the
  1-token call of the same round (each round: the median of `VERIFY_CALLS` calls).
  Theorem 8 assumes 1.0 for every k.
* Exactness cost: `sd.generate` and `sd.speculative_generate` (bundled drafter, gamma 2 and 4)
  on the first `limit` shipped test sentences (tests/data/demo_test_pairs.jsonl), greedy,
  ms per generated token, with `exact=None` (the default: exact greedy) and `exact=False`
  (every call at its natural width). Speedups are against the fastest baseline: the faster
  `generate` row of the same products and batch, timed in the same rounds.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from specdec_jax.io.reports import atomic_write, fmt, machine_info, utc_now, write_json
from specdec_jax_lab.errors import ResultsError

KERNEL_ENV = "SPECDEC_CPU_KERNELS"
VERIFY_WIDTHS = (1, 2, 3, 4, 5, 8, 16)
VERIFY_CALLS = 20          # calls per round of the verify-cost timing (median kept)
GAMMAS = (2, 4)
PAIRS = pathlib.Path(__file__).resolve().parents[4] / "tests" / "data" / "demo_test_pairs.jsonl"


def _interleaved(calls: dict[Any, Any], rounds: int, seed: int, per_round: int = 1
                 ) -> tuple[dict[Any, float], dict[Any, list[float]]]:
  """(median seconds, per-round seconds) of each zero-argument call over `rounds` shuffled
  rounds; a round's time is the median of `per_round` calls. Each call runs once first,
  untimed, to compile."""
  import jax
  for call in calls.values():
    jax.block_until_ready(call())
  times: dict[Any, list[float]] = {key: [] for key in calls}
  for r in range(rounds):
    order = list(calls)
    random.Random(seed + r).shuffle(order)
    for key in order:
      ts = []
      for _ in range(per_round):
        t0 = time.perf_counter()
        jax.block_until_ready(calls[key]())
        ts.append(time.perf_counter() - t0)
      times[key].append(statistics.median(ts))
  return {key: statistics.median(ts) for key, ts in times.items()}, times


def verify_costs(rounds: int, batch_sizes=(1, 8)) -> list[dict[str, Any]]:
  """Rows {batch, k, ms, ratio}: the demo target's k-token cached decode call."""
  import jax.numpy as jnp
  import numpy as np

  import specdec_jax as sd
  target = sd.load("demo-de-en/target")
  tok = sd.load_tokenizer("demo-de-en")
  rng = np.random.default_rng(0)
  vocab = target.config.vocab_size
  rows = []
  for b in batch_sizes:
    de = [json.loads(line)["de"] for line in PAIRS.read_text().splitlines()[:b]]
    cache = target.start(jnp.asarray(tok.encode(de), jnp.int32), capacity=64)
    _, cache = target.decode(jnp.asarray(rng.integers(2, vocab, (b, 16)), jnp.int32), cache)
    tokens = {k: jnp.asarray(rng.integers(2, vocab, (b, k)), jnp.int32) for k in VERIFY_WIDTHS}
    calls = {k: (lambda t=tokens[k], c=cache: target.decode(t, c)[0]) for k in VERIFY_WIDTHS}
    medians, times = _interleaved(calls, rounds, seed=b, per_round=VERIFY_CALLS)
    for k in VERIFY_WIDTHS:
      ratio = statistics.median(a / b1 for a, b1 in zip(times[k], times[1], strict=True))
      rows.append({"batch": b, "k": k, "ms": medians[k] * 1e3, "ratio": ratio})
  return rows


def exactness_costs(rounds: int, limit: int, max_new_tokens: int,
                    batch_sizes=(1, 8)) -> list[dict[str, Any]]:
  """Rows {batch, method, gamma, exact, ms_per_token, identical}: whole-split decodes."""
  import jax.numpy as jnp
  import numpy as np

  import specdec_jax as sd
  target, drafter = sd.load("demo-de-en/target"), sd.load("demo-de-en/drafter")
  tok = sd.load_tokenizer("demo-de-en")
  de = [json.loads(line)["de"] for line in PAIRS.read_text().splitlines()[:limit]]
  enc = np.asarray(tok.encode(de))     # one padded length: one compile per batch size
  rows = []
  for b in batch_sizes:
    batches = [jnp.asarray(enc[i:i + b], jnp.int32) for i in range(0, len(enc) - b + 1, b)]

    def decode_all(gamma, exact, batches=batches):
      if gamma is None:
        return [sd.generate(target, e, max_new_tokens=max_new_tokens, exact=exact)
                for e in batches]
      return [sd.speculative_generate(target, drafter, e, gamma=gamma,
                                      max_new_tokens=max_new_tokens, exact=exact)
              for e in batches]

    configs = [(g, x) for g in (None, *GAMMAS) for x in (None, False)]
    calls = {c: (lambda c=c: [o.tokens for o in decode_all(*c)]) for c in configs}
    medians, _ = _interleaved(calls, rounds, seed=100 + b)
    outputs = {c: decode_all(*c) for c in configs}
    for gamma, exact in configs:
      outs = outputs[(gamma, exact)]
      base = outputs[(None, exact)]
      n_tokens = sum(int(np.sum(np.asarray(o.lengths))) for o in outs)
      identical = all(np.array_equal(np.asarray(o.tokens), np.asarray(g.tokens))
                      for o, g in zip(outs, base, strict=True))
      rows.append({"batch": b, "method": "generate" if gamma is None else sd.Speculative.name,
                   "gamma": gamma, "exact": "default" if exact is None else "False",
                   "ms_per_token": medians[(gamma, exact)] * 1e3 / n_tokens,
                   "identical_to_generate": identical})
  return rows


def worker(rounds: int, limit: int, max_new_tokens: int) -> dict[str, Any]:
  """One process's half of the table (its kernel setting is already in the environment)."""
  from specdec_jax import kernels
  status = kernels.status()
  return {"kernels": bool(status.available), "kernel_status": str(status),
          "verify": verify_costs(rounds),
          "e2e": exactness_costs(rounds, limit, max_new_tokens)}


def run_kernels(rounds: int = 7, limit: int = 32, max_new_tokens: int = 32,
                command: str | None = None) -> dict[str, Any]:
  """Both halves, each in a subprocess with the kernels switched on / off."""
  if not PAIRS.is_file():
    raise ResultsError(f"{PAIRS} is missing: the kernel tables decode the test pairs shipped "
                       "in a clone of the repository (tests/data), not in the wheel")
  halves = {}
  for name, value in (("kernels", "1"), ("xla", "0")):
    env = dict(os.environ, **{KERNEL_ENV: value})
    proc = subprocess.run(
        [sys.executable, "-m", "specdec_jax_lab.results.kernels", str(rounds), str(limit),
         str(max_new_tokens)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
      raise ResultsError(f"the {name} half of the kernel tables failed:\n{proc.stderr[-3000:]}")
    halves[name] = json.loads(proc.stdout.strip().splitlines()[-1])
  if not halves["kernels"]["kernels"]:
    raise ResultsError("the CPU decode kernels are not available on this machine "
                       f"({halves['kernels']['kernel_status']}); nothing to compare")
  return {"created": utc_now(), "command": command, "machine": machine_info(),
          "cpu_model": _cpu_model(),
          "settings": {"rounds": rounds, "limit": limit, "max_new_tokens": max_new_tokens,
                       "target": "demo-de-en/target", "drafter": "demo-de-en/drafter"},
          "halves": halves}


def _cpu_model() -> str | None:
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    return None
  return None


def _created(results: dict[str, Any]) -> str:
  m = results["machine"]
  return (f"Created {results['created'][:10]} on {results.get('cpu_model') or m['processor']}, "
          f"{m['cpu_count']} cores, jax {m['jax_version']}"
          + (f", by `{results['command']}`" if results.get("command") else "") + ".")


def verify_markdown(results: dict[str, Any]) -> str:
  """The verify-cost table: k-token call time, kernels vs XLA."""
  s, h = results["settings"], results["halves"]
  lines = [_created(results), "",
           "One cached decode call of k tokens per row of the demo target (after a 16-token "
           "prefix), ms per call and as a ratio to the 1-token call; per round the median of "
           f"{VERIFY_CALLS} calls, then the median of {s['rounds']} interleaved rounds; the "
           "kernels and XLA halves ran in separate processes.", "",
           "| batch | k | kernels ms | kernels k / 1 | XLA ms | XLA k / 1 |",
           "|---:|---:|---:|---:|---:|---:|"]
  xla = {(r["batch"], r["k"]): r for r in h["xla"]["verify"]}
  for r in h["kernels"]["verify"]:
    x = xla[(r["batch"], r["k"])]
    lines.append(f"| {r['batch']} | {r['k']} | {fmt(r['ms'], 3)} | {fmt(r['ratio'], 2, 'x')} | "
                 f"{fmt(x['ms'], 3)} | {fmt(x['ratio'], 2, 'x')} |")
  return "\n".join(lines) + "\n"


def exactness_markdown(results: dict[str, Any]) -> str:
  """The exactness-cost table: generate and speculative decoding, exact=None vs False."""
  s, h = results["settings"], results["halves"]
  lines = [_created(results), "",
           f"ms per generated token, greedy, the first {s['limit']} shipped test sentences "
           f"(`tests/data/demo_test_pairs.jsonl`), at most {s['max_new_tokens']} new tokens, "
           f"the bundled pair, median of {s['rounds']} interleaved rounds of whole-set decodes; "
           "in parentheses the speedup against the fastest baseline (the faster `generate` "
           "row of the same products and batch, timed in the same rounds); identical: the "
           "speculative tokens equal `generate`'s with the same `exact`.", "",
           "| batch | products | exact | generate | speculative γ 2 | speculative γ 4 | "
           "identical |",
           "|---:|---|---|---:|---:|---:|---|"]
  for name, label in (("kernels", "kernels"), ("xla", "XLA")):
    rows = h[name]["e2e"]
    for b in sorted({r["batch"] for r in rows}):
      # Where exact greedy needs no padding (the kernels) both generate rows run the same
      # program: the faster of the two is the baseline, not the one a noisy round slowed.
      fastest = min(r["ms_per_token"] for r in rows if r["batch"] == b
                    and r["method"] == "generate")
      for exact in ("default", "False"):
        sel = {r["gamma"]: r for r in rows if r["batch"] == b and r["exact"] == exact}
        cells = [_with_speedup(sel[g]["ms_per_token"], fastest) for g in (None, *GAMMAS)]
        same = all(sel[g]["identical_to_generate"] for g in GAMMAS)
        lines.append(f"| {b} | {label} | `{'None' if exact == 'default' else 'False'}` | "
                     + " | ".join(cells) + f" | {'yes' if same else '**no**'} |")
  return "\n".join(lines) + "\n"


def _with_speedup(ms: float, fastest: float) -> str:
  return f"{fmt(ms, 3)} ({fmt(fastest / ms, 2, 'x')})"


def write_outputs(results: dict[str, Any], out: str) -> dict[str, str]:
  paths = {"json": os.path.join(out, "kernels.json"),
           "verify": os.path.join(out, "verify_cost.md"),
           "exactness": os.path.join(out, "exactness_cost.md")}
  write_json(paths["json"], results)
  atomic_write(paths["verify"], verify_markdown(results))
  atomic_write(paths["exactness"], exactness_markdown(results))
  return paths


if __name__ == "__main__":
  rounds, limit, max_new = (int(a) for a in sys.argv[1:4])
  print(json.dumps(worker(rounds, limit, max_new)))
