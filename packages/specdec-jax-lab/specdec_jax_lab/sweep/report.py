"""Sweep reports: every point as Markdown, the paper-style summaries, a Pareto plot.

    pick(results, group, max_drop=0.1)   # fastest point of a group within 0.1 BLEU of the target
    table1_markdown(results)             # BiLD Table 1 layout: no drop / ~1 BLEU drop per group
    write_outputs(results, out_dir, "bild")   # bild.json, bild.md, bild.png
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import specdec_jax as sd
from specdec_jax.io.reports import (
  atomic_write,
  created_line,
  fmt,
  make_dirs,
  write_json,
  write_plot,
)

#: "no BLEU drop" and "~1 BLEU drop" as the BiLD paper reads them.
NO_DROP, ONE_DROP = 0.1, 1.0


def _cols(points: Sequence[dict[str, Any]]) -> list[str]:
  extra = [k for k in ("fallback_rate", "rollback_rate", "alpha", "repeated_draft_rate",
                       "mean_max_run", "oracle_tokens_per_target_call")
           if any(p.get(k) is not None for p in points)]
  exact = ["exact_cost"] if any(p.get("exact_cost") is not None for p in points) else []
  return ["bleu", "speedup", "block_efficiency", "ms_per_token", *exact, *extra]


_HEAD = {"bleu": "BLEU", "speedup": "speedup", "block_efficiency": "tokens/large call",
         "ms_per_token": "ms/token", "exact_cost": "exact baseline / plain",
         "fallback_rate": "fallback rate",
         "rollback_rate": "rollback rate", "alpha": "alpha",
         "repeated_draft_rate": "% consec", "mean_max_run": "max run",
         "oracle_tokens_per_target_call": "oracle tokens/call"}


def _value(point: dict[str, Any], col: str) -> str:
  x = point.get(col)
  if col == "repeated_draft_rate" and x is not None:
    return fmt(100 * x, 1)
  return fmt(x, 2 if col in ("bleu", "ms_per_token", "speedup", "exact_cost") else 3)


def points_markdown(points: Sequence[dict[str, Any]]) -> str:
  cols = _cols(points)
  lines = ["| point | " + " | ".join(_HEAD[c] for c in cols) + " |",
           "|---|" + "---:|" * len(cols)]
  for p in points:
    lines.append(f"| {p['label']} | " + " | ".join(_value(p, c) for c in cols) + " |")
  return "\n".join(lines)


def pick(results: dict[str, Any], group: str, max_drop: float) -> dict[str, Any] | None:
  """The fastest point of `group` whose BLEU is at most `max_drop` below the target's."""
  ok = [p for p in results["points"] if p["group"] == group and p["bleu_drop"] <= max_drop]
  return max(ok, key=lambda p: p["speedup"], default=None)


def _groups(results: dict[str, Any]) -> list[str]:
  return list(dict.fromkeys(p["group"] for p in results["points"]))


def table1_markdown(results: dict[str, Any]) -> str:
  """BiLD's Table 1 layout: per group the best point with no drop and with ~1 BLEU drop."""
  base = results["baselines"]
  lines = ["| | BLEU | speedup | fallback rate | rollback rate | point |",
           "|---|---:|---:|---:|---:|---|"]
  for label, scores in base.items():
    lines.append(f"| target alone ({label}) | {scores['bleu']:.2f} | 1.00 | | | |")
  for group in _groups(results):
    for name, drop in (("no BLEU drop", NO_DROP), ("~1 BLEU drop", ONE_DROP)):
      p = pick(results, group, drop)
      if p is None:
        lines.append(f"| {group}, {name} | — | — | | | none within {drop} BLEU |")
        continue
      lines.append(f"| {group}, {name} | {p['bleu']:.2f} | {p['speedup']:.2f} | "
                   f"{fmt(p.get('fallback_rate'), 3)} | {fmt(p.get('rollback_rate'), 3)} | "
                   f"{p['label']} |")
  return "\n".join(lines)


def markdown_report(results: dict[str, Any], kind: str, image: str | None) -> str:
  c = results["config"]
  head = [f"# {kind} sweep", "", created_line(results), "",
          f"{c['pairs']} pairs of {c.get('data', 'the split')} [{c.get('split', 'test')}], "
          f"batch size {c['batch_size']}, median of {c['repeats']} alternating rounds, "
          "compilation excluded; speedup over the target alone at its natural call width "
          "(exact=False, the fastest plain decode); `exact baseline / plain` is what exact "
          "mode costs the target alone; "
          f"command: `{c.get('command', '')}`", ""]
  if kind == sd.BiLD.name:
    head += ["## Table 1 layout (best point per group)", "", table1_markdown(results), ""]
  head += ["## Every point", "", points_markdown(results["points"]), ""]
  if results.get("lattice_ms"):
    costs = ", ".join(f"{k}: {v:.3f} ms" for k, v in results["lattice_ms"].items())
    head += [f"On-device lattice dynamic program per round (jitted `lattice.best_paths`, "
             f"batch {c['batch_size']}, bigram LM): {costs}. The oracle row's time includes "
             "its extra teacher-forced pass: read its tokens/call, not its speed.", ""]
  if image:
    head += [f"![BLEU vs speedup]({image})", ""]
  return "\n".join(head)


def plot(results: dict[str, Any], path: str) -> None:
  """BLEU vs speedup, one series per group; the target alone at speedup 1."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.5, 4.5))
  for group in _groups(results):
    pts = [p for p in results["points"] if p["group"] == group]
    ax.scatter([p["speedup"] for p in pts], [p["bleu"] for p in pts], label=group, s=22)
  for label, scores in results["baselines"].items():
    ax.scatter([1.0], [scores["bleu"]], marker="*", s=120, color="black")
    ax.annotate(f"target alone ({label})", (1.0, scores["bleu"]), fontsize=7,
                xytext=(4, 4), textcoords="offset points")
  ax.axvline(1.0, color="grey", lw=0.5)
  ax.set_xlabel("speedup over the target alone (measured)")
  ax.set_ylabel("BLEU")
  ax.set_title(f"BLEU vs speedup, batch size {results['config']['batch_size']}")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_outputs(results: dict[str, Any], out_dir: str, kind: str) -> dict[str, str]:
  """`kind`.json, `kind`.md and `kind`.png in `out_dir`."""
  make_dirs(out_dir)
  paths = {ext: os.path.join(out_dir, f"{kind}.{ext}") for ext in ("json", "md", "png")}
  write_json(paths["json"], results)
  if results["points"]:
    write_plot(paths["png"], plot, results)
  atomic_write(paths["md"], markdown_report(results, kind, os.path.basename(paths["png"])))
  return paths
