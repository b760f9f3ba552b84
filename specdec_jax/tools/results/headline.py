"""README's headline tables, built from the result files (never typed by hand).

    block = headline("results")                 # Markdown
    splice_readme("README.md", block)           # between <!-- results:start / end -->

From results/demo/quality.json (each model alone on the test split) and
results/demo/results.json (per batch size and drafter, the gamma with the best measured
speedup), each table with the command that wrote it, its date and its machine.
"""

from __future__ import annotations

import os
from typing import Any

from specdec_jax.tools.errors import ResultsError
from specdec_jax.tools.report import fmt, read_json


def _load(results_dir: str, rel: str) -> dict[str, Any]:
  path = os.path.join(results_dir, rel)
  if not os.path.isfile(path):
    raise ResultsError(f"{path} is missing: rebuild it with `python -m specdec_jax.tools.results`")
  return read_json(path, "results file")


def _machine(m: dict[str, Any]) -> str:
  return f"{m['backend'].upper()}, {m['cpu_count']} cores, jax {m['jax_version']}"


def quality_table(results_dir: str, command: str | None) -> list[str]:
  q = _load(results_dir, "demo/quality.json")
  rows = q["rows"]
  lines = [f"Quality, each model decoding all {rows[0]['pairs']} sentences of the "
           f"`{q['split']}` split alone ({q['created'][:10]}"
           + (f"; `{command}`" if command else "") + "):", "",
           "| model | parameters | decoding | BLEU | chrF |", "|---|--:|---|--:|--:|"]
  for r in rows:
    lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['method']} | "
                 f"{fmt(r['bleu'], 1)} | {fmt(r['chrf'], 1)} |")
  return lines


def speed_table(results_dir: str) -> list[str]:
  res = _load(results_dir, "demo/results.json")
  cfg = res["config"]
  best: dict[tuple[int, str], dict[str, Any]] = {}
  for r in res["rows"]:
    if r["method"] != "speculative":
      continue
    key = (r["batch_size"], r["drafter"])
    if key not in best or r["speedup"] > best[key]["speedup"]:
      best[key] = r
  base = {r["batch_size"]: r for r in res["rows"]
          if r["method"] != "speculative" and r["mode"] == "greedy"}
  lines = [f"Speed, greedy, the first {cfg['pairs']} test sentences, at most "
           f"{cfg['max_new_tokens']} new tokens; per drafter the γ with the best measured "
           f"speedup over the target alone timed in the same rounds ({res['created'][:10]}, "
           f"{_machine(res['machine'])}, CPU decode kernels; `{res['command']}`):", "",
           "| batch | drafter | γ | α | tokens / target call | ms / token | speedup | "
           "predicted |", "|--:|---|--:|--:|--:|--:|--:|--:|"]
  for b in sorted(base):
    lines.append(f"| {b} | none (target alone) | — | — | 1.00 | "
                 f"{fmt(base[b]['ms_per_token'], 3)} | 1.00x | — |")
    for (bb, drafter), r in sorted(best.items()):
      if bb == b:
        lines.append(f"| {b} | {drafter} | {r['gamma']} | {fmt(r.get('alpha'), 2)} | "
                     f"{fmt(r.get('block_efficiency'))} | {fmt(r['ms_per_token'], 3)} | "
                     f"{fmt(r['speedup'], 2, 'x')} | {fmt(r.get('predicted_speedup'), 2, 'x')} |")
  lines += ["", "Drafters: `drafter` trained on the references; `aligned` (the bundled one) "
            "fine-tuned on the target's greedy outputs; `distilled` on the target's soft "
            "labels; `ngram` a bigram table; `prompt-lookup` copies from the input. "
            "Predicted: Theorem 8 with the measured drafter and verify costs."]
  return lines


def headline(results_dir: str = "results") -> str:
  """The Markdown block README shows between its results markers."""
  command = _load(results_dir, "demo/results.json").get("command")
  return "\n".join([*quality_table(results_dir, command), "", *speed_table(results_dir)]) + "\n"
