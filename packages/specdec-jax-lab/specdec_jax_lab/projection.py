"""Scale projection: measured step costs of large shapes + a measured alpha -> speedup per gamma.

    python -m specdec_jax_lab.projection --out packages/specdec-jax-lab/results/projection

A PROJECTION, not a measurement of speculative decoding at scale. Two things are measured
and combined through `sd.theory`:

- the step costs of the t5_1_1 shapes (random weights, bfloat16) on this machine:
  `t_k`, the time of one k-token decode call of a started cache (k = 1..8, batch 1 and 8;
  `costs.StepTimer`), giving the drafter's cost ratio `c = t_1(drafter) / t_1(target)`
  and the verify-cost curve `v(k) = t_k / t_1` of each target;
- alpha, the acceptance rate of the bundled demo pair (`demo-de-en/target` with
  `demo-de-en/drafter`), from a short greedy run on `tests/data/demo_test_pairs.jsonl`.

The projected speedup of gamma drafts per round is
`theory.walltime_improvement_measured(alpha, gamma, c, v(gamma + 1))`
= E / (gamma c + v(gamma + 1)) with E = (1 - alpha^(gamma+1)) / (1 - alpha): what a
t5_1_1 pair would give IF its drafter agreed with its target as often as the demo
drafter agrees with the demo target. Random weights only set the step costs (they do not
depend on the values); the alpha of real t5_1_1 checkpoints is not measured here.

Timing: every timer of one (shape, batch) is compiled first, then timed in alternating
rounds (`timing.time_rounds`, the order rotated per round), each round `steps` calls in
one jitted loop; the figures are medians over rounds. On a shared machine other jobs
add noise: the ratios (c, v(k)) drift less than the absolute times, and the load average
at measurement time is recorded.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import sys
from typing import Any, Sequence

import jax

from specdec_jax import theory
from specdec_jax.batching import random_prompts
from specdec_jax.costs import StepTimer, started_cache
from specdec_jax.timing import time_rounds
from specdec_jax_lab.errors import BenchError

#: (name, target, drafter): the pairs projected. A model is a `config:` name (random
#: weights) or a checkpoint name/path for `sd.load`.
DEFAULT_PAIRS = (
    ("demo", "demo-de-en/target", "demo-de-en/drafter"),
    ("t5_1_1 base + small", "config:t5_1_1_base", "config:t5_1_1_small"),
    ("t5_1_1 large + small", "config:t5_1_1_large", "config:t5_1_1_small"),
)
DEFAULT_BATCHES = (1, 8)
MAX_K = 8
DEMO_PAIRS_FILE = pathlib.Path(__file__).resolve().parents[3] / "tests/data/demo_test_pairs.jsonl"


def load_model(name: str, dtype: str):
  """`config:NAME` -> random weights straight in `dtype`; otherwise `sd.load(name, dtype)`."""
  import specdec_jax as sd
  if name.startswith("config:"):
    return sd.init_model(sd.get_config(name[len("config:"):]), dtype=dtype)
  return sd.load(name, dtype=dtype)


def _load_average() -> list[float] | None:
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return None


def measure_step_costs(model, batch: int, ks: Sequence[int] = tuple(range(1, MAX_K + 1)), *,
                       encoder_len: int = 64, capacity: int = 128, steps: int = 4,
                       repeats: int = 5, seed: int = 0) -> dict[str, Any]:
  """Median seconds per k-token decode call of `model` at batch `batch`, for each k in `ks`.

  Encoder tokens: random [batch, encoder_len]; self-attention cache of `capacity`
  positions, every call writing at its middle. Returns {"batch_size", "seconds": {k: s},
  "verify_cost": {k: t_k / t_1}, the same from the fastest round ("min_seconds",
  "min_verify_cost"), "spread": {k: (max - min) / median}, "load_average"} (needs 1 in `ks`).
  """
  ks = sorted(set(int(k) for k in ks))
  if not ks or ks[0] < 1 or 1 not in ks:
    raise BenchError(f"ks must be positive and include 1, got {ks}")
  if capacity < 2 * ks[-1]:
    raise BenchError(f"capacity {capacity} too small for k up to {ks[-1]}")
  enc = random_prompts(batch, encoder_len, model.config.vocab_size, seed)
  cache = started_cache(model, enc, capacity)
  timers = {k: StepTimer(model, cache, k, steps, seed).compile() for k in ks}
  load = _load_average()
  timed = time_rounds({k: t._run for k, t in timers.items()}, repeats)
  seconds = {k: timed[k]["median_s"] / steps for k in ks}
  fastest = {k: min(timed[k]["times_s"]) / steps for k in ks}
  return {"batch_size": batch, "seconds": seconds,
          "verify_cost": {k: seconds[k] / seconds[1] for k in ks},
          # noise on a shared machine only adds time: the fastest round, as a cross-check
          "min_seconds": fastest,
          "min_verify_cost": {k: fastest[k] / fastest[1] for k in ks},
          "spread": {k: (max(timed[k]["times_s"]) - min(timed[k]["times_s"]))
                     / timed[k]["median_s"] for k in ks},
          "load_average": load}


def measure_alpha(target, drafter, texts: Sequence[str], tokenizer, gamma: int = 4,
                  max_new_tokens: int = 20, batch: int = 8) -> dict[str, Any]:
  """Greedy speculative decoding of `texts`: alpha (mean sum_x min(p, q) over scored
  drafts, merged over all rows) and tokens per target call."""
  import specdec_jax as sd
  from specdec_jax.rounds import stats as stats_lib
  outputs = []
  for i in range(0, len(texts), batch):
    enc = tokenizer.encode(list(texts[i:i + batch]))
    outputs.append(sd.speculative_generate(target, drafter, enc, gamma=gamma,
                                           max_new_tokens=max_new_tokens))
  summary = stats_lib.merge_outputs(outputs)
  return {"alpha": float(summary["alpha"]), "gamma": gamma, "rows": len(texts),
          "max_new_tokens": max_new_tokens,
          "tokens_per_target_call": float(summary["tokens_per_target_call"])}


def demo_alpha(limit: int = 64, gamma: int = 4, max_new_tokens: int = 20) -> dict[str, Any]:
  """`measure_alpha` of the bundled demo pair on the first `limit` test sentences."""
  import specdec_jax as sd
  if not DEMO_PAIRS_FILE.is_file():
    raise BenchError(f"{DEMO_PAIRS_FILE} not found: pass --alpha instead")
  texts = [json.loads(s)["de"] for s in DEMO_PAIRS_FILE.read_text().splitlines() if s.strip()]
  out = measure_alpha(sd.load("demo-de-en/target"), sd.load("demo-de-en/drafter"),
                      texts[:limit], sd.load_tokenizer("demo-de-en"), gamma, max_new_tokens)
  out["source"] = f"demo-de-en target + drafter, {DEMO_PAIRS_FILE.name}, float32, greedy"
  return out


def project(alpha: float, c: float, verify_cost: dict[int, float]) -> list[dict[str, Any]]:
  """Per gamma with a measured v(gamma + 1): E, projected speedup (verify cost measured)
  and Theorem 8's (verification free)."""
  rows = []
  for k in sorted(verify_cost):
    g = k - 1
    if g < 1:
      continue
    rows.append({"gamma": g, "verify_cost": verify_cost[k],
                 "expected_tokens": float(theory.expected_tokens_per_call(alpha, g)),
                 "projected_speedup": float(theory.walltime_improvement_measured(
                     alpha, g, c, verify_cost[k])),
                 "theorem8_speedup": float(theory.walltime_improvement(alpha, g, c))})
  return rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProjectionSettings:
  """How `run_projection` measures the step costs.

  Attributes:
    dtype: the models' dtype.
    max_k: the widest decode call timed (k = 1..max_k; gamma up to max_k - 1).
    encoder_len: encoder tokens per row.
    capacity: the decoder caches' length (positions).
    steps: calls per round, in one jitted loop.
    repeats: timed rounds; the median is reported.
  """

  dtype: str = "bfloat16"
  max_k: int = MAX_K
  encoder_len: int = 64
  capacity: int = 128
  steps: int = 4
  repeats: int = 5


def run_projection(pairs=DEFAULT_PAIRS, batches=DEFAULT_BATCHES,
                   settings: ProjectionSettings = ProjectionSettings(), *,
                   alpha: dict[str, Any] | float | None = None,
                   log=lambda msg: None) -> dict[str, Any]:
  """Measure every distinct model of `pairs` at each batch, then project each pair.

  settings: how the step costs are measured (`ProjectionSettings`).
  alpha: a number, a `demo_alpha()`-style dict, or None (measure `demo_alpha()`).
  """
  s = settings
  if alpha is None:
    log("measuring alpha of the demo pair")
    alpha = demo_alpha()
  if not isinstance(alpha, dict):
    alpha = {"alpha": float(alpha), "source": "given"}
  a = alpha["alpha"]
  if not 0.0 <= a < 1.0:
    raise BenchError(f"alpha must be in [0, 1), got {a}")
  ks = tuple(range(1, s.max_k + 1))
  names = list(dict.fromkeys(m for _, t, d in pairs for m in (t, d)))
  measured: dict[str, dict[int, dict[str, Any]]] = {}
  models_info = {}
  for name in names:
    model = load_model(name, s.dtype)
    leaves = jax.tree_util.tree_leaves(model.params)
    models_info[name] = {"params": int(sum(x.size for x in leaves)),
                         "dtype": str(leaves[0].dtype)}
    measured[name] = {}
    for b in batches:
      log(f"timing {name} at batch {b}")
      measured[name][b] = measure_step_costs(model, b, ks, encoder_len=s.encoder_len,
                                             capacity=s.capacity, steps=s.steps,
                                             repeats=s.repeats)
    del model
  projections = []
  for label, t, d in pairs:
    for b in batches:
      tm, dm = measured[t][b], measured[d][b]
      c = dm["seconds"][1] / tm["seconds"][1]
      rows = project(a, c, tm["verify_cost"])
      best = max(rows, key=lambda r: r["projected_speedup"])
      projections.append({"pair": label, "target": t, "drafter": d, "batch_size": b,
                          "target_step_ms": 1e3 * tm["seconds"][1],
                          "drafter_step_ms": 1e3 * dm["seconds"][1], "c": c,
                          "verify_cost": tm["verify_cost"], "gammas": rows,
                          "best_gamma": best["gamma"],
                          "best_speedup": best["projected_speedup"],
                          "alpha_grid": [{"alpha": x, **_best(x, c, tm["verify_cost"])}
                                         for x in (0.6, 0.7, 0.8, 0.9)]})
  return {"kind": "projection",
          "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "machine": {"backend": jax.default_backend(), "cpu_count": os.cpu_count(),
                      "jax_version": jax.__version__},
          "config": {"dtype": s.dtype, "batches": list(batches), "max_k": s.max_k,
                     "encoder_len": s.encoder_len, "capacity": s.capacity, "steps": s.steps,
                     "repeats": s.repeats},
          "alpha": alpha, "models": models_info,
          "measured": {n: {str(b): _jsonable(m) for b, m in per.items()}
                       for n, per in measured.items()},
          "projections": projections}


def _best(alpha: float, c: float, verify_cost: dict[int, float]) -> dict[str, Any]:
  best = max(project(alpha, c, verify_cost), key=lambda r: r["projected_speedup"])
  return {"gamma": best["gamma"], "projected_speedup": best["projected_speedup"]}


def _jsonable(m: dict[str, Any]) -> dict[str, Any]:
  return {k: ({str(kk): vv for kk, vv in v.items()} if isinstance(v, dict) else v)
          for k, v in m.items()}


def markdown(res: dict[str, Any], png: str | None = "projection.png") -> str:
  """The projection as Markdown: step costs, verify-cost curves, speedups per gamma."""
  a = res["alpha"]
  cfg = res["config"]
  gam = [r["gamma"] for r in res["projections"][0]["gammas"]] if res["projections"] else []
  lines = [
      "# Scale projection (a projection, not a measurement at scale)", "",
      f"Created {res['created']}; {res['machine']['backend']}, "
      f"{res['machine']['cpu_count']} CPUs, jax {res['machine']['jax_version']}.", "",
      f"Step costs measured on this machine ({cfg['dtype']}, random weights for `config:` "
      f"models; encoder {cfg['encoder_len']} tokens, cache {cfg['capacity']} positions; median "
      f"of {cfg['repeats']} alternating rounds of {cfg['steps']} calls). alpha = "
      f"{a['alpha']:.3f} ({a.get('source', 'given')}"
      + (f", γ {a['gamma']}, {a['rows']} rows" if "rows" in a else "") + "). "
      "Projected speedup = E / (γc + v(γ+1)), E = (1 - α^(γ+1)) / (1 - α) "
      "(`theory.walltime_improvement_measured`): what each pair would give if its drafter "
      "agreed with its target as often as the demo pair's do.", "",
      "## Step costs", "",
      "| model | params | batch | t_1 ms | " + " | ".join(f"v({k})" for k in
                                                     range(2, cfg["max_k"] + 1))
      + " | spread | load |",
      "|---|--:|--:|--:|" + "--:|" * (cfg["max_k"] - 1) + "--:|---|"]
  for name, per in res["measured"].items():
    for b, m in per.items():
      v = m["verify_cost"]
      load = m.get("load_average")
      lines.append(f"| `{name}` | {res['models'][name]['params'] / 1e6:.1f}M | {b} | "
                   f"{1e3 * m['seconds']['1']:.2f} | "
                   + " | ".join(f"{v[str(k)]:.2f}" for k in range(2, cfg["max_k"] + 1))
                   + f" | {100 * max(m['spread'].values()):.0f}% | {load[0] if load else '—'} |")
  lines += ["", "v(k) = t_k / t_1: one k-token target call over a 1-token call. spread: the "
            "largest (max - min) / median over the rounds of any k of the row (timing noise). "
            "load: 1-minute load average when the timing started.", "",
            "## Projected speedup per γ", "",
            "| pair | batch | c | " + " | ".join(f"γ={g}" for g in gam)
            + " | best | best γ at α 0.6 / 0.7 / 0.8 / 0.9 |",
            "|---|--:|--:|" + "--:|" * len(gam) + "--:|---|"]
  for p in res["projections"]:
    grid = " / ".join(f"{x['gamma']}: {x['projected_speedup']:.2f}x" for x in p["alpha_grid"])
    lines.append(f"| {p['pair']} | {p['batch_size']} | {p['c']:.3f} | "
                 + " | ".join(f"{r['projected_speedup']:.2f}x" for r in p["gammas"])
                 + f" | {p['best_speedup']:.2f}x (γ {p['best_gamma']}) | {grid} |")
  lines += ["", "c: drafter 1-token call / target 1-token call at the same batch. "
            "Last column: the best γ and its projected speedup at other acceptance rates."]
  if png:
    lines += ["", f"![verify cost and projected speedup]({png})"]
  return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: str) -> None:
  """Left: v(k) per model and batch; right: projected speedup per gamma per pair and batch."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(12, 4.5), dpi=110)
  FigureCanvasAgg(fig)
  ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
  styles = {b: s for b, s in zip(res["config"]["batches"], ("-", "--", ":", "-."), strict=False)}
  for i, (name, per) in enumerate(res["measured"].items()):
    for b, m in per.items():
      ks = sorted(int(k) for k in m["verify_cost"])
      ax1.plot(ks, [m["verify_cost"][str(k)] for k in ks], "o" + styles[int(b)],
               color=f"C{i}", label=f"{name} B={b}", markersize=3)
  ax1.set_xlabel("k (tokens per call)")
  ax1.set_ylabel("v(k) = t_k / t_1")
  ax1.set_title("verify cost (measured, this CPU)", fontsize=9)
  pairs = list(dict.fromkeys(p["pair"] for p in res["projections"]))
  for p in res["projections"]:
    i = pairs.index(p["pair"])
    ax2.plot([r["gamma"] for r in p["gammas"]], [r["projected_speedup"] for r in p["gammas"]],
             "o" + styles[p["batch_size"]], color=f"C{i}", markersize=3,
             label=f"{p['pair']} B={p['batch_size']}")
  ax2.axhline(1.0, color="gray", linewidth=0.8)
  ax2.set_xlabel("γ")
  ax2.set_ylabel("projected speedup")
  ax2.set_title(f"projection at α = {res['alpha']['alpha']:.3f}", fontsize=9)
  for ax in (ax1, ax2):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path)


def write_outputs(res: dict[str, Any], out_dir: str) -> dict[str, str]:
  """projection.json, projection.md and projection.png in `out_dir`; their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {e: os.path.join(out_dir, f"projection.{e}") for e in ("json", "md", "png")}
  with open(paths["json"], "w") as f:
    json.dump(res, f, indent=1)
  with open(paths["md"], "w") as f:
    f.write(markdown(res))
  plot(res, paths["png"])
  return paths


def _pair(text: str) -> tuple[str, str, str]:
  parts = text.split(",")
  if len(parts) != 3:
    raise argparse.ArgumentTypeError(f"--pair takes LABEL,TARGET,DRAFTER, got {text!r}")
  return parts[0], parts[1], parts[2]


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m specdec_jax_lab.projection",
                              description=__doc__.split("\n")[0])
  p.add_argument("--out", default="packages/specdec-jax-lab/results/projection")
  p.add_argument("--pair", type=_pair, action="append",
                 help="LABEL,TARGET,DRAFTER (repeatable; default: demo, t5_1_1 base and "
                      "large with t5_1_1_small)")
  p.add_argument("--batch-sizes", default="1,8")
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--alpha", type=float, help="use this alpha instead of measuring the demo's")
  p.add_argument("--alpha-limit", type=int, default=64, help="demo sentences for alpha")
  p.add_argument("--max-k", type=int, default=MAX_K)
  p.add_argument("--encoder-len", type=int, default=64)
  p.add_argument("--capacity", type=int, default=128)
  p.add_argument("--steps", type=int, default=4)
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args(argv)
  log = lambda msg: print(msg, file=sys.stderr, flush=True)
  alpha = args.alpha if args.alpha is not None else demo_alpha(args.alpha_limit)
  res = run_projection(args.pair or DEFAULT_PAIRS,
                       tuple(int(b) for b in args.batch_sizes.split(",")),
                       ProjectionSettings(dtype=args.dtype, max_k=args.max_k,
                                          encoder_len=args.encoder_len, capacity=args.capacity,
                                          steps=args.steps, repeats=args.repeats),
                       alpha=alpha, log=log)
  paths = write_outputs(res, args.out)
  print(markdown(res, None))
  log(f"wrote {', '.join(paths.values())}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
