"""Project exact speculative beam search's speedup over `sd.Beam` for T5-XXL / T5-small shapes.

    python packages/specdec-jax-lab/scripts/project_speculative_beam.py \
        --out packages/specdec-jax-lab/results/speculative_beam

A PROJECTION from the cost model, not a measurement on an accelerator. One quantity is
measured here, on this machine, and the others are inputs recorded on a device:

- s, beam steps per target call (`out.stats["steps_per_target_call"]`, merged over the
  sentences: total steps / total rounds), of `experimental.SpeculativeBeam` on the bundled demo pair
  (`demo-de-en/target` verifying, `demo-de-en/drafter` drafting, bfloat16; trained
  weights), held-out sentences of tests/data/demo_test_pairs.jsonl, beam 4 / alpha 0.6, at
  batch 1 and 8, for each gamma and chain count M. s depends on how often the drafter's
  tree holds the target's next beams, not on the hardware.
- c and the verify cost for T5-XXL / T5-small shapes on one NVIDIA H200 (XLA's ops,
  bfloat16, random weights; docs/exactness.md "What it costs", docs/accelerators.md):
  c = 0.107 (one T5-small step / one T5-XXL step at batch 1, taken for the K beams' rows
  too: both are bandwidth-bound there), and the measured cost of a padded 16-token call
  over a 1-token call of the same rows: 1.04x (1 row), 1.61x (8 rows), 3.02x (32 rows).
  A call of N row-tokens is modelled as costing t(N) ~ 1 + N / N0 (weights read once,
  work per row-token), N0 fitted to those three ratios; the verify call of B * M rows of
  gamma + 1 tokens then costs v = t(B M (gamma + 1)) / t(B K) of `sd.Beam`'s step (B K
  rows of 1 token).

s depends on the drafter: how often its tree holds the target's next K beams, which asks
more than its greedy agreement (alpha: how often its argmax is the target's, `sd.Speculative`
at gamma 1) but rises with it. `--drafter NAME` measures another drafter (any `sd.load`
name or path); `--noised-target 0.15,0.3` adds, as proxies of a chosen agreement, the
demo target itself with Gaussian noise on every weight (sigma x the leaf's std; `noised`):
each row records the drafter's alpha, so the projection can be read at a pair's published
agreement (T5-small drafting T5-XXL on WMT En-De: alpha 0.75 at t = 0, Leviathan et al.
2023, Table 2). A noised copy of the target ranks the target's alternatives more like the
target than an independently trained drafter of the same alpha does (measured: it takes
more steps per call at a lower alpha), so its rows are an optimistic proxy, not a pair.

With `--costs BENCH_JSON` (a `specdec bench --preset xxl-small --beam 4:0.6 --gammas 2,3,4`
run on a device, whose speculative beam entries carry `beam_costs`: c and v measured at
the beams' and chains' rows), each row takes c and v measured there (same batch, gamma
and M) instead of the recorded H200 inputs; rows the file lacks keep them.

projected speedup over `sd.Beam` = `theory.beam_walltime_improvement(s, gamma, c, v)` =
s / (gamma c + v), beside the same with the verify call free (v = 1, the bound). What
the cost model leaves out: the rounds' own work (the drafter's top-k over the tree, the
replay, the cache gathers; on CPU, measured, they are visible), per-row cache reads that
grow with M at large batches, and the T5-XXL / T5-small pair's own agreement (the demo
pair's is used).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

import specdec_jax as sd
from specdec_jax import experimental, theory
from specdec_jax.io.reports import atomic_write, machine_info, utc_now, write_json
from specdec_jax.rounds.stats import merge_outputs

LAB = pathlib.Path(__file__).resolve().parents[1]
PAIRS = LAB.parents[1] / "tests" / "data" / \
    "demo_test_pairs.jsonl"
K, ALPHA = 4, 0.6
#: Recorded on one NVIDIA H200 (jax 0.11.2, XLA's ops, T5-XXL / T5-small shapes, bfloat16,
#: random weights, prompt 32, 32 new tokens): docs/exactness.md, docs/accelerators.md.
H200 = {"device": "one NVIDIA H200", "jax": "0.11.2", "kernels": "xla",
        "shapes": "T5-XXL target, T5-small drafter, bfloat16, random weights",
        "c": 0.107, "target_step_ms_batch1": 3.80,
        "padded_call_ratio": {1: 1.04, 8: 1.61, 32: 3.02}, "padded_tokens": 16,
        "source": "docs/exactness.md (What it costs); docs/accelerators.md"}


def fit_n0(ratios: dict[int, float], tokens: int) -> float:
  """N0 of t(N) ~ 1 + N / N0 closest (log squares) to the measured t(B tokens) / t(B)."""
  grid = np.exp(np.linspace(math.log(10.0), math.log(1e5), 4000))
  err = [sum((math.log((1 + b * tokens / n0) / (1 + b / n0)) - math.log(r)) ** 2
             for b, r in ratios.items()) for n0 in grid]
  return float(grid[int(np.argmin(err))])


def verify_cost(n0: float, batch: int, chains: int, gamma: int) -> float:
  """t(B M (gamma + 1)) / t(B K): the verify call in `sd.Beam` steps."""
  return (1 + batch * chains * (gamma + 1) / n0) / (1 + batch * K / n0)


def steps_per_call(target, drafter, enc, batch: int, gamma: int, chains: int | None,
                   max_new_tokens: int, width: int | None = None) -> dict:
  """s merged over the sentences (batches of `batch`), and the beams checked."""
  method = experimental.SpeculativeBeam(drafter, num_beams=K, alpha=ALPHA, gamma=gamma,
                                        chains=chains, width=width)
  outs, same = [], True
  for i in range(0, len(enc), batch):
    part = enc[i:i + batch]
    out = sd.decode(target, method, part, max_new_tokens=max_new_tokens)
    ref = sd.decode(target, sd.Beam(num_beams=K, alpha=ALPHA), part,
                    max_new_tokens=max_new_tokens)
    same &= bool(np.array_equal(np.asarray(out.beams), np.asarray(ref.beams)))
    outs.append(out)
  stats = merge_outputs(outs)
  return {"steps": stats["steps"], "rounds": stats["rounds"],
          "steps_per_target_call": stats["steps_per_target_call"],
          "drafted_nodes_per_round": stats["drafted_nodes_per_round"], "beams_equal": same}


def noised(model, sigma: float, seed: int = 7):
  """`model` with N(0, (sigma x std(leaf))^2) added to every weight (in float32, cast back):
  a drafter that agrees with it often but not always, its agreement set by sigma."""
  leaves, tree = jax.tree_util.tree_flatten(model.params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  out = []
  for x, key in zip(leaves, keys, strict=True):
    x32 = x.astype(jnp.float32)
    out.append((x32 + sigma * jnp.std(x32) * jax.random.normal(key, x.shape)).astype(x.dtype))
  return model.replace(params=jax.tree_util.tree_unflatten(tree, out))


def greedy_agreement(target, drafter, enc, max_new_tokens: int) -> float:
  """alpha at t = 0: the share of the target's greedy tokens that the drafter, fed the
  target's prefix, predicts (`sd.Speculative` at gamma 1, one sentence at a time: every
  drafted token is conditioned on the target's own prefix)."""
  outs = [sd.decode(target, sd.Speculative(drafter, gamma=1), enc[i:i + 1],
                    max_new_tokens=max_new_tokens) for i in range(len(enc))]
  return float(merge_outputs(outs)["acceptance_rate"])


def perfect(row: dict) -> dict:
  """The bound of the same round shape: every round takes all gamma + 1 steps (a drafter
  whose chains always hold the target's beams; the target drafting itself comes close
  with M = 3K chains, not with M = K), at the same c and v: what agreement is worth."""
  return {"speedup_perfect_drafter": float(theory.beam_walltime_improvement(
      row["gamma"] + 1, row["gamma"], row["c"], row["verify_cost"]))}


def bench_costs(path: str) -> dict[tuple[int, int, int], tuple[float, float]]:
  """{(batch, gamma, M): (c, v)} of a bench.json's speculative beam entries."""
  with open(path) as f:
    results = json.load(f)["results"]
  return {(b["batch_size"], b["gamma"], b["chains"]): (b["c"], max(b["verify_cost"], 1e-9))
          for b in (e.get("beam_costs") for e in results) if b}


def markdown(res: dict) -> str:
  h = res["inputs"]
  lines = [
      "# Exact speculative beam search over `sd.Beam`: a projection for T5-XXL / T5-small",
      "", f"Created {res['created']} by `{res['command']}`.", "",
      "**A projection from the cost model, not a measurement on an accelerator**: "
      "projected speedup = s / (γc + v) (`theory.beam_walltime_improvement`), with",
      "",
      f"- s, beam steps per target call: MEASURED here ({res['machine']['device_kind']}, "
      f"{res['machine']['cpu_count']} CPUs) with the bundled demo target in bfloat16 "
      f"(demo-de-en/target verifying; the drafter of each row, its greedy agreement "
      f"alpha measured on the same sentences), "
      f"{res['sentences']} held-out sentences, beam {K} / alpha {ALPHA}, the tree's first "
      f"level {res.get('width', 2 * K)} wide, "
      f"{res['max_new_tokens']} new tokens at most; every beam equal to `sd.Beam`'s: "
      f"{all(r['beams_equal'] for r in res['rows'])};",
      f"- c = {h['c']}: T5-small step / T5-XXL step measured on {h['device']} (jax "
      f"{h['jax']}, XLA's ops, batch 1; taken for the beams' rows too);",
      f"- v, the verify call of B·M rows of γ + 1 tokens over `sd.Beam`'s step (B·K rows "
      f"of 1 token): t(N) ∝ 1 + N/N0 for a call of N row-tokens, N0 = {res['n0']:.0f} "
      f"fitted to the padded-call ratios measured there (16-token / 1-token call: "
      + ", ".join(f"{r}x at {b} row{'s' * (b > 1)}" for b, r in
                  h["padded_call_ratio"].items()) + "; the fit gives "
      + ", ".join(f"{r:.2f}x" for r in res["fit_check"].values()) + ").",
      *([] if all(r.get("costs_from", "recorded H200") == "recorded H200" for r in res["rows"])
        else [f"- c and v of the rows marked *: measured by `specdec bench` "
              f"({res.get('costs')}), at the beams' and chains' rows."]),
      "", "| drafter | alpha | batch | γ | chains M | s (steps/call) | drafted nodes/round | "
      "v | projected speedup | with verify free (v = 1) | bound: every round γ + 1 steps |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in res["rows"]:
    mark = "" if r.get("costs_from", "recorded H200") == "recorded H200" else "*"
    lines.append(f"| {r.get('drafter', 'demo-de-en/drafter')} | "
                 f"{r.get('greedy_agreement', float('nan')):.2f} | "
                 f"{r['batch']}{mark} | {r['gamma']} | {r['chains']} | "
                 f"{r['steps_per_target_call']:.2f} | {r['drafted_nodes_per_round']:.0f} | "
                 f"{r['verify_cost']:.2f} | **{r['projected_speedup']:.2f}x** | "
                 f"{r['speedup_verify_free']:.2f}x | {r['speedup_perfect_drafter']:.2f}x |")
  lines += ["", "Left out of the model: the rounds' own work (the drafter's top-k over the "
            "tree, the replay, the cache gathers), per-row cache reads that grow with M at "
            "larger batches, and the agreement of a real T5-XXL / T5-small pair (the demo "
            "target's s with each drafter is used; a noised target is an optimistic proxy "
            "of a drafter of its alpha). On a device, `specdec bench --preset xxl-small "
            "--beam 4:0.6` measures the speedup itself (random weights: s near 1)."]
  return "\n".join(lines) + "\n"


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sentences", type=int, default=8)
  parser.add_argument("--max-new-tokens", type=int, default=32)
  parser.add_argument("--gammas", default="2,3,4")
  parser.add_argument("--chains", default=f"{K},{3 * K}", help="chain counts M, e.g. 4,8,12")
  parser.add_argument("--width", type=int, help="the tree's first level (default 2K)")
  parser.add_argument("--batch-sizes", default="1,8")
  parser.add_argument("--costs", metavar="BENCH_JSON",
                      help="a device's bench.json with speculative beam entries (beam_costs)")
  parser.add_argument("--drafter", default="demo-de-en/drafter",
                      help="the drafter (an sd.load name or path; loaded in bfloat16)")
  parser.add_argument("--noised-target", metavar="SIGMAS", default="",
                      help="also proxies: the target with this much noise on its weights, "
                      "e.g. 0.15,0.3 (see the docstring)")
  parser.add_argument("--out", default=str(LAB / "results" / "speculative_beam"))
  args = parser.parse_args()
  measured = {} if args.costs is None else bench_costs(args.costs)
  target = sd.load("demo-de-en/target", dtype="bfloat16")
  tok = sd.load_tokenizer("demo-de-en")
  lines = PAIRS.read_text().splitlines()[:args.sentences]
  enc = np.asarray(tok.encode([json.loads(line)["de"] for line in lines]))   # one width
  n0 = fit_n0(H200["padded_call_ratio"], H200["padded_tokens"])
  drafters = [(args.drafter, sd.load(args.drafter, dtype="bfloat16"))] + [
      (f"target noised {sigma}", noised(target, float(sigma)))
      for sigma in args.noised_target.split(",") if sigma]
  rows = []
  for name, drafter in drafters:
    alpha = greedy_agreement(target, drafter, enc, args.max_new_tokens)
    print(f"{name}: greedy agreement {alpha:.3f}", file=sys.stderr)
    rows += project(target, drafter, enc, args, n0, measured,
                    {"drafter": name, "greedy_agreement": alpha})
  fit = {b: (1 + b * H200["padded_tokens"] / n0) / (1 + b / n0)
         for b in H200["padded_call_ratio"]}
  res = {"created": utc_now(), "kind": "projection (cost model), not a measurement",
         "command": "python packages/specdec-jax-lab/scripts/project_speculative_beam.py "
                    + " ".join(sys.argv[1:]),
         "machine": machine_info(), "inputs": H200, "n0": n0, "fit_check": fit,
         "costs": args.costs, "num_beams": K, "alpha": ALPHA, "sentences": len(lines),
         "width": args.width or 2 * K,
         "max_new_tokens": args.max_new_tokens, "rows": rows}
  os.makedirs(args.out, exist_ok=True)
  write_json(os.path.join(args.out, "projection.json"), res)
  atomic_write(os.path.join(args.out, "projection.md"), markdown(res))
  print(markdown(res))
  return 0


def project(target, drafter, enc, args, n0: float, measured: dict, label: dict) -> list[dict]:
  """One drafter's rows: s measured at every batch size, gamma and M, and its projection."""
  rows = []
  for batch in (int(b) for b in args.batch_sizes.split(",")):
    for gamma in (int(g) for g in args.gammas.split(",")):
      for chains in (int(m) for m in args.chains.split(",")):
        r = steps_per_call(target, drafter, enc, batch, gamma, chains, args.max_new_tokens,
                           args.width)
        c, v, source = H200["c"], verify_cost(n0, batch, chains, gamma), "recorded H200"
        if (batch, gamma, chains) in measured:
          c, v, source = *measured[batch, gamma, chains], args.costs
        s = r["steps_per_target_call"]
        rows.append({**label, "batch": batch, "gamma": gamma, "chains": chains, **r,
                     "verify_cost": v, "c": c, "costs_from": source,
                     "projected_speedup": float(theory.beam_walltime_improvement(
                         s, gamma, c, v)),
                     "speedup_verify_free": float(theory.beam_walltime_improvement(
                         s, gamma, c, 1.0))})
        rows[-1].update(perfect(rows[-1]))
        print(rows[-1], file=sys.stderr)
  return rows


if __name__ == "__main__":
  sys.exit(main())
