"""bench.json, bench.md and bench.png from the results of `run_bench`."""

from __future__ import annotations

import os
from typing import Any

import specdec_jax as sd
from specdec_jax.io.reports import atomic_write, created_line, fmt, write_json, write_plot

TABLE_COLUMNS = ("batch", "mode", "method", "γ", "ms/token", "tokens/s", "speedup", "α",
                 "acceptance", "tokens/call", "c", "verify cost", "predicted",
                 "measured/predicted")


def _cells(e: dict[str, Any]) -> list[str]:
  spec = e["method"] == sd.Speculative.name

  def s(text):   # speculative-only columns
    return text if spec else "—"
  method = e["method"] + (f" ({e['label']})" if e.get("label") else "")
  return [str(e["batch_size"]), e["mode"], method, s(str(e["gamma"])),
          fmt(e["ms_per_token"], 3), fmt(e["tokens_per_s"], 1), fmt(e.get("speedup"), 2, "x"),
          s(fmt(e.get("alpha"), 3)), s(fmt(e.get("acceptance_rate"), 3)),
          fmt(e.get("block_efficiency")), s(fmt(e.get("c"), 3)), s(fmt(e.get("verify_cost"))),
          s(fmt(e.get("predicted_speedup"), 2, "x")), s(fmt(e.get("measured_over_predicted")))]


def markdown_table(results: dict[str, Any]) -> str:
  lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
  lines += ["| " + " | ".join(_cells(e)) + " |" for e in results["results"]]
  return "\n".join(lines)


def _model_line(cfg: dict[str, Any], what: str) -> str:
  name = cfg.get(what) or "?"
  params = cfg.get(f"{what}_params")
  over = cfg.get(f"{what}_overrides")
  return (f"- {what}: `{name}`" + (f" with overrides `{over}`" if over else "")
          + (f", {params / 1e6:.1f}M params" if params else ""))


def _costs_table(costs: list[dict[str, Any]]) -> list[str]:
  lines = ["| batch | target step ms | drafter step ms | c | verify cost by γ |",
           "|---|---|---|---|---|"]
  for c in costs:
    verify = ", ".join(f"γ={v['gamma']}: {v['verify_cost']:.2f}" for v in c["verify"])
    lines.append(f"| {c['batch_size']} | {c['target_step_ms']:.3f} | "
                 f"{c['drafter_step_ms']:.3f} | {c['c']:.3f} | {verify} |")
  return lines


def markdown_report(results: dict[str, Any]) -> str:
  cfg, m = results["config"], results["machine"]
  lines = [
      "# specdec bench", "",
      created_line(results), "",
      _model_line(cfg, "target"), _model_line(cfg, "drafter"),
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
      "speedup = the method's baseline's ms/token / its ms/token (the target alone; "
      "speculative beam search: sd.Beam with its beams); tokens/call = tokens per target call, "
      "calls counted per row (baseline: 1); c = drafter step / target step time; verify cost = "
      "(γ+1)-token target call / 1-token call; predicted = E/(γc + verify cost), "
      "E = (1-α^(γ+1))/(1-α).",
  ]
  if any(e.get("reference") for e in results["results"]):
    lines += ["", *_reference_table(results["results"])]
  if results.get("costs"):
    lines += ["", *_costs_table(results["costs"])]
  if results.get("projections"):
    lines += ["", *_projections_table(results["projections"])]
  return "\n".join(lines) + "\n"


def _reference_table(entries: list[dict[str, Any]]) -> list[str]:
  """Entries timed against another entry (speculative beam search against `sd.Beam`)."""
  lines = ["Against their reference (speculative beam search: `sd.Beam` with the same settings, "
           "the same beams):", "",
           "| batch | mode | method | reference | ms/token | reference ms/token | speedup | "
           "steps/call | drafted nodes/round | c | verify cost | predicted |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for e in entries:
    if e.get("reference"):
      costs = e.get("beam_costs") or {}
      lines.append(f"| {e['batch_size']} | {e['mode']} | {e.get('label') or e['method']} | "
                   f"{e['reference']} | {fmt(e['ms_per_token'], 3)} | "
                   f"{fmt(e['reference_ms_per_token'], 3)} | "
                   f"{fmt(e['reference_speedup'], 2, 'x')} | "
                   f"{fmt(e.get('steps_per_target_call'))} | "
                   f"{fmt(e.get('drafted_nodes_per_round'), 1)} | {fmt(costs.get('c'), 3)} | "
                   f"{fmt(costs.get('verify_cost'))} | "
                   f"{fmt(e.get('predicted_reference_speedup'), 2, 'x')} |")
  lines += ["", "predicted = steps/call / (γc + verify cost) "
            "(`theory.beam_walltime_improvement`), c and verify cost measured at the beams' "
            "and chains' rows (bench.json: beam_costs)."]
  return lines


def _projections_table(projections: list[dict[str, Any]]) -> list[str]:
  lines = ["Projected speedup from the measured costs at other acceptance rates (best measured γ):",
           "", "| batch | α | best γ | verify cost | c | projected | Theorem 8 (free verify) |",
           "|---|---|---|---|---|---|---|"]
  for p in projections:
    lines.append(f"| {p['batch_size']} | {p['alpha']:.1f} | {p['gamma']} | "
                 f"{p['verify_cost']:.2f} | {p['c']:.3f} | {p['projected_speedup']:.2f}x | "
                 f"{p['theorem8_speedup']:.2f}x |")
  return lines


def _plot_speedups(ax, spec: list[dict[str, Any]]) -> None:
  groups = list(dict.fromkeys((e["mode"], e["batch_size"]) for e in spec))
  for i, (mode, b) in enumerate(groups):
    color = f"C{i % 10}"
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


def plot(results: dict[str, Any], path: str) -> None:
  """Speedup vs gamma per (mode, batch), predicted dashed; baseline-only: ms/token bars."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(7, 4.5), dpi=120)
  FigureCanvasAgg(fig)
  ax = fig.add_subplot(1, 1, 1)
  spec = [e for e in results["results"] if e["method"] == sd.Speculative.name]
  if spec:
    _plot_speedups(ax, spec)
  else:
    base = [e for e in results["results"] if e["method"] == sd.Autoregressive.name]
    ax.bar([f"{e['mode']}\nB={e['batch_size']}" for e in base], [e["ms_per_token"] for e in base])
    ax.set_ylabel("baseline ms/token")
  cfg = results["config"]
  ax.set_title(f"{cfg.get('target', 'target')} / {cfg.get('drafter', 'drafter')}", fontsize=9)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path)


def write_report(results: dict[str, Any], out_dir: str) -> dict[str, str]:
  """Write bench.json, bench.md and bench.png into `out_dir` (overwriting); their paths."""
  paths = {name: os.path.join(out_dir, f"bench.{name}") for name in ("json", "md", "png")}
  write_json(paths["json"], results)
  atomic_write(paths["md"], markdown_report(results))
  write_plot(paths["png"], plot, results)
  return paths
