"""README's headline tables, built from the result files (never typed by hand).

    block = headline("results")                 # Markdown, from results/demo
    block = headline("results", "demo-large")   # from results/demo-large
    splice_readme("README.md", block)           # between <!-- results:start / end -->

From <name>/quality.json (each model alone on the test split) and <name>/results.json (per
batch size and drafter, the gamma with the best measured speedup, with the drafter's
measured cost c and the verify cost behind it), each table with the command that wrote
it, its date and its machine.
"""

from __future__ import annotations

import os
from typing import Any

import specdec_jax as sd
from specdec_jax.costs import VERIFY_NOISE_NOTE, shown_predictions, verify_cost_text
from specdec_jax.io.reports import fmt, read_json
from specdec_jax_lab.errors import ResultsError


def _load(results_dir: str, rel: str) -> dict[str, Any]:
  path = os.path.join(results_dir, rel)
  if not os.path.isfile(path):
    raise ResultsError(f"{path} is missing: rebuild it with `python -m specdec_jax_lab.results`")
  return read_json(path, "results file")


def _machine(m: dict[str, Any]) -> str:
  return f"{m['backend'].upper()}, {m['cpu_count']} cores, jax {m['jax_version']}"


#: What each drafter is, for the line under the speed table.
DRAFTERS = {
    "drafter": "`drafter` trained on the references",
    "aligned": "`aligned` fine-tuned on the target's greedy outputs",
    "distilled": "`distilled` on the target's soft labels",
    "aligned_small": "`aligned_small` the bundled 2M drafter, fine-tuned on this target's "
                     "greedy outputs",
    "aligned_mid": "`aligned_mid` the small pair's 13.5M target, fine-tuned on this target's "
                   "greedy outputs",
    "ngram": "`ngram` a bigram table",
    "prompt-lookup": "`prompt-lookup` copies from the input",
}


def quality_table(results_dir: str, command: str | None, name: str = "demo") -> list[str]:
  q = _load(results_dir, f"{name}/quality.json")
  rows = q["rows"]
  lines = [f"Quality, each model decoding all {rows[0]['pairs']} sentences of the "
           f"`{q['split']}` split alone ({q['created'][:10]}"
           + (f"; `{command}`" if command else "") + "):", "",
           "| model | parameters | decoding | BLEU | chrF |", "|---|--:|---|--:|--:|"]
  for r in rows:
    lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['method']} | "
                 f"{fmt(r['bleu'], 1)} | {fmt(r['chrf'], 1)} |")
  return lines


def speed_table(results_dir: str, name: str = "demo") -> list[str]:
  res = _load(results_dir, f"{name}/results.json")
  cfg = res["config"]
  best: dict[tuple[int, str], dict[str, Any]] = {}
  for r in res["rows"]:
    if r["method"] != sd.Speculative.name:
      continue
    key = (r["batch_size"], r["drafter"])
    if key not in best or r["speedup"] > best[key]["speedup"]:
      best[key] = r
  base = {r["batch_size"]: r for r in res["rows"]
          if r["method"] != sd.Speculative.name and r["mode"] == "greedy"}
  lines = [f"Speed, greedy, the first {cfg['pairs']} test sentences, at most "
           f"{cfg['max_new_tokens']} new tokens; per drafter the γ with the best measured "
           f"speedup over the target alone timed in the same rounds ({res['created'][:10]}, "
           f"{_machine(res['machine'])}, CPU decode kernels; `{res['command']}`):", "",
           "| batch | drafter | γ | α | tokens / target call | c | verify cost | ms / token | "
           "speedup | predicted |", "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
  for b in sorted(base):
    lines.append(f"| {b} | none (target alone) | — | — | 1.00 | — | — | "
                 f"{fmt(base[b]['ms_per_token'], 3)} | 1.00x | — |")
    for (bb, drafter), r in sorted(best.items()):
      if bb == b:
        lines.append(f"| {b} | {drafter} | {r['gamma']} | {fmt(r.get('alpha'), 2)} | "
                     f"{fmt(r.get('block_efficiency'))} | {fmt(r.get('c'), 3)} | "
                     f"{verify_cost_text(r.get('verify_cost'))} | "
                     f"{fmt(r['ms_per_token'], 3)} | {fmt(r['speedup'], 2, 'x')} | "
                     f"{fmt(shown_predictions(r)['predicted_speedup'], 2, 'x')} |")
  shown = sorted({d for _, d in best}, key=lambda d: list(DRAFTERS).index(d)
                 if d in DRAFTERS else len(DRAFTERS))
  lines += ["", "Drafters: " + "; ".join(DRAFTERS.get(d, f"`{d}`") for d in shown) + ". "
            "c: drafter step / target step time; verify cost: (γ+1)-token / 1-token target "
            "call time; predicted: Theorem 8 with these measured costs."]
  if any(r.get("verify_cost") is not None and r["verify_cost"] < 1.0 for r in best.values()):
    lines[-1] += " " + VERIFY_NOISE_NOTE + "."
  return lines


def headline(results_dir: str = "results", name: str = "demo") -> str:
  """The Markdown block README shows between its results markers, from results_dir/name."""
  command = _load(results_dir, f"{name}/results.json").get("command")
  return "\n".join([*quality_table(results_dir, command, name), "",
                    *speed_table(results_dir, name)]) + "\n"
