"""results.json, results.md, speedup.png and the README block from `run_results`' results."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import specdec_jax as sd
from specdec_jax.costs import VERIFY_NOISE_NOTE, shown_predictions, verify_cost_text
from specdec_jax.io.reports import atomic_write, fmt, read_text, write_json, write_plot
from specdec_jax_lab.errors import ResultsError
from specdec_jax_lab.results.quality import quality_markdown

START_MARKER = "<!-- results:start -->"
END_MARKER = "<!-- results:end -->"

TABLE_COLUMNS = ("batch", "decoding", "drafter", "γ", "α", "acceptance", "tokens/call",
                 "ms/token", "speedup", "c", "verify cost", "predicted", "measured/predicted",
                 "BLEU", "chrF")


def markdown_table(results: dict[str, Any]) -> str:
  lines = ["| " + " | ".join(TABLE_COLUMNS) + " |",
           "|" + "|".join(["---"] * 3 + ["--:"] * (len(TABLE_COLUMNS) - 3)) + "|"]
  for r in results["rows"]:
    spec = r["method"] == sd.Speculative.name
    decoding = (f"speculative {r['mode']}" if spec else
                "target greedy" if r["mode"] == "greedy" else "target sampling (T=1)")
    cells = [str(r["batch_size"]), decoding, r["drafter"] or "—",
             str(r["gamma"]) if spec else "—",
             fmt(r.get("alpha"), 3), fmt(r.get("acceptance_rate"), 3),
             fmt(r.get("block_efficiency")), fmt(r["ms_per_token"], 3),
             fmt(r["speedup"], 2, "x"), fmt(r.get("c"), 3), verify_cost_text(r.get("verify_cost")),
             fmt(shown_predictions(r)["predicted_speedup"], 2, "x"),
             fmt(shown_predictions(r)["measured_over_predicted"]), fmt(r["bleu"], 1),
             fmt(r["chrf"], 1)]
    lines.append("| " + " | ".join(cells) + " |")
  if any(r.get("verify_cost") is not None and r["verify_cost"] < 1.0 for r in results["rows"]):
    lines += ["", VERIFY_NOISE_NOTE + "."]
  return "\n".join(lines)


def _summary_lines(results: dict[str, Any]) -> list[str]:
  cfg, m = results["config"], results["machine"]
  params = cfg.get("drafter_params") or {}
  drafters = ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in params.items())
  mism = [r for r in results["rows"] if r.get("mismatching_rows")]
  lines = [
      f"{cfg['pairs']} sentences of the `{cfg['split']}` split of `{cfg['workdir']}/data`, "
      f"max_new_tokens {cfg['max_new_tokens']}, "
      f"batch size{'s' if len(cfg['batch_sizes']) > 1 else ''} "
      f"{', '.join(map(str, cfg['batch_sizes']))}; target {cfg['target_params'] / 1e6:.2f}M "
      f"params" + (f", drafters {drafters}" if drafters else "") + ".",
      f"Timing: median of {cfg['repeats']} alternating rounds after a compile call; "
      f"jax {m['jax_version']} ({m['backend']}, {m['device_kind']}), {m['cpu_count']} CPUs.",
  ]
  exact = {r["batch_size"]: r["exact_cost"] for r in results["rows"] if r.get("exact_cost")}
  lines.append("Speedups divide by target greedy at its natural call width (exact=False, the "
               "fastest plain decode)" + (
                   "; exact mode itself costs the target alone "
                   + ", ".join(f"{c:.2f}x at batch {b}" for b, c in sorted(exact.items()))
                   + " (not folded into any speedup)." if exact else "."))
  if results.get("command"):
    lines.append(f"Command: `{results['command']}`.")
  if results.get("skipped"):
    lines.append(f"Skipped (no checkpoint): {', '.join(results['skipped'])}.")
  lines.append("Greedy speculative outputs equal target greedy token for token in every row."
               if not mism else
               f"WARNING: {len(mism)} greedy rows differ from target greedy: "
               + ", ".join(r["key"] for r in mism))
  return lines


LEGEND = ("α: mean acceptance probability Σ min(p, q) over scored drafts; acceptance: accepted / "
          "drafted; tokens/call: tokens per target call, calls counted per row; speedup: "
          "target-greedy ms/token (timed alongside) / this row's; c: drafter step / target step "
          "time; verify cost: (γ+1)-token / 1-token target call time; predicted: "
          "E / (γc + verify cost), E = (1 - α^(γ+1)) / (1 - α).")


def markdown_report(results: dict[str, Any], image: str | None = "speedup.png") -> str:
  lines = ["# Demo pair: speculative decoding results", "",
           f"Created {results['created']}.", "", *_summary_lines(results), "",
           markdown_table(results), "", LEGEND]
  if image:
    lines += ["", f"![speedup vs gamma]({image})"]
  if results.get("costs"):
    lines += ["", *_costs_table(results["costs"])]
  return "\n".join(lines) + "\n"


def _costs_table(costs: dict[str, dict[str, Any]]) -> list[str]:
  lines = ["| batch | target step ms | drafter c | verify cost by γ |", "|---|---|---|---|"]
  for b, c in costs.items():
    ds = ", ".join(f"{k}: {v['c']:.3f}" for k, v in c["drafters"].items())
    vs = ", ".join(f"γ={g}: {verify_cost_text(v)}" for g, v in
                   sorted(c["verify_cost"].items(), key=lambda kv: int(kv[0])))
    lines.append(f"| {b} | {c['target_step_ms']:.3f} | {ds} | {vs} |")
  if any(v < 1.0 for c in costs.values() for v in c["verify_cost"].values()):
    lines += ["", VERIFY_NOISE_NOTE + "."]
  return lines


def readme_block(results: dict[str, Any], image_path: str | None = None,
                 readme_path: str | None = None, quality: dict[str, Any] | None = None) -> str:
  """The README section: [whole-split quality,] summary, table, legend, plot (linked
  relative to the README)."""
  lines = [quality_markdown(quality), ""] if quality else []
  lines += [*_summary_lines(results), "", markdown_table(results), "", LEGEND]
  if image_path:
    rel = image_path
    if readme_path:
      rel = os.path.relpath(image_path, os.path.dirname(os.path.abspath(readme_path)) or ".")
    lines += ["", f"![speedup vs gamma]({pathlib.PurePath(rel).as_posix()})"]
  return "\n".join(lines)


def splice_readme(readme_path: str | os.PathLike, block: str, start: str = START_MARKER,
                  end: str = END_MARKER) -> str:
  """Replace the text between `start` and `end` markers of the file with `block`.

  The markers stay, each on its own line; everything outside them is unchanged.
  Raises ResultsError unless each marker occurs exactly once, start before end.
  Returns the new text (also written to the file).
  """
  path = pathlib.Path(readme_path)
  text = read_text(path, "README")
  for marker in (start, end):
    n = text.count(marker)
    if n != 1:
      raise ResultsError(f"{path}: marker {marker!r} found {n} times (need exactly once)")
  i, j = text.index(start), text.index(end)
  if j < i:
    raise ResultsError(f"{path}: {end!r} comes before {start!r}")
  new = text[:i + len(start)] + "\n" + block.strip("\n") + "\n" + text[j:]
  atomic_write(path, new)
  return new


def plot(results: dict[str, Any], path: str) -> None:
  """Speedup vs gamma per drafter (solid, measured; dashed, predicted), one panel per batch."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  rows = [r for r in results["rows"] if r["method"] == sd.Speculative.name]
  batches = sorted({r["batch_size"] for r in rows}) or [None]
  fig = Figure(figsize=(6.5 * len(batches), 4.5), dpi=120)
  FigureCanvasAgg(fig)
  drafter_names = list(dict.fromkeys(r["drafter"] for r in rows))
  colors = {d: f"C{i % 10}" for i, d in enumerate(drafter_names)}
  for i, b in enumerate(batches):
    ax = fig.add_subplot(1, len(batches), i + 1)
    for d in drafter_names:
      rs = sorted((r for r in rows if r["batch_size"] == b and r["drafter"] == d),
                  key=lambda r: r["gamma"])
      if not rs:
        continue
      g = [r["gamma"] for r in rs]
      ax.plot(g, [r["speedup"] for r in rs], "o-", color=colors[d], label=f"{d}")
      ax.plot(g, [r["predicted_speedup"] for r in rs], "--", color=colors[d], alpha=0.7)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xlabel("γ (drafts per round)")
    ax.set_ylabel("speedup over target greedy")
    ax.set_title(f"batch {b} (dashed: predicted)" if b else "no speculative rows", fontsize=9)
    ax.grid(alpha=0.3)
    if rows:
      ax.set_xticks(sorted({r["gamma"] for r in rows}))
      ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path)


def write_outputs(results: dict[str, Any], out_dir: str) -> dict[str, str]:
  """results.json, results.md and speedup.png in `out_dir`; their paths."""
  paths = {"json": os.path.join(out_dir, "results.json"),
           "md": os.path.join(out_dir, "results.md"),
           "png": os.path.join(out_dir, "speedup.png")}
  write_json(paths["json"], results)
  atomic_write(paths["md"], markdown_report(results, "speedup.png"))
  write_plot(paths["png"], plot, results)
  return paths
