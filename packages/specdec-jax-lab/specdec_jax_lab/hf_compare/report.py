"""hf_compare.json and hf_compare.md from the results of `compare`."""

from __future__ import annotations

import os
from typing import Any

from specdec_jax.io.reports import atomic_write, created_line, fmt, write_json

TABLE_COLUMNS = ("method", "batch", "γ", "ms/token", "tokens/s", "speedup vs HF greedy",
                 "speedup vs our greedy (B=1)", "speedup vs our greedy (same B)",
                 "tokens/target call", "identical to HF greedy")


def markdown_table(results: dict[str, Any]) -> str:
  lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
  n = results["config"]["num_prompts"]
  for r in results["methods"]:
    if r.get("error") or r.get("ms_per_token") is None:
      err = (r.get("error") or "not timed").replace("|", "\\|").replace("\n", " ")
      lines.append(f"| {r['label']} | {r['batch_size']} | {r['gamma'] or '—'} | failed: "
                   f"{err[:300]} |" + " — |" * (len(TABLE_COLUMNS) - 4))
      continue
    ident = r.get("identical_to_hf_greedy")
    ident = ("—" if ident is None else "yes" if ident else
             f"no ({r['mismatching_prompts_vs_hf_greedy']}/{n} prompts differ)")
    lines.append("| " + " | ".join([
        r["label"], str(r["batch_size"]), str(r["gamma"] or "—"), fmt(r["ms_per_token"], 3),
        fmt(r["tokens_per_s"], 1), fmt(r.get("speedup_vs_hf_greedy"), 2, "x"),
        fmt(r.get("speedup_vs_ours_greedy"), 2, "x"),
        fmt(r.get("speedup_vs_ours_greedy_same_batch"), 2, "x"),
        fmt(r.get("tokens_per_target_call")), ident]) + " |")
  return "\n".join(lines)


def per_prompt_table(results: dict[str, Any]) -> str:
  """One row per prompt, one column per timed method: its tokens equal HF greedy's (yes/no);
  empty when HF greedy did not run."""
  timed = [r for r in results["methods"] if r.get("identical_per_prompt") is not None]
  if not timed:
    return ""
  lines = ["| prompt | " + " | ".join(r["name"] for r in timed) + " |",
           "|" + "---|" * (len(timed) + 1)]
  for i in range(results["config"]["num_prompts"]):
    lines.append(f"| {i} | " + " | ".join("yes" if r["identical_per_prompt"][i] else "no"
                                         for r in timed) + " |")
  return "\n".join(lines)


def markdown_report(results: dict[str, Any]) -> str:
  cfg, m = results["config"], results["machine"]
  lines = [
      "# specdec vs Hugging Face transformers (same weights)", "",
      created_line(results), "",
      f"- target: {cfg['target']['source']} ({cfg['target']['params'] / 1e6:.2f}M params); "
      f"drafter: {cfg['drafter']['source']} ({cfg['drafter']['params'] / 1e6:.2f}M params)",
      f"- {cfg['num_prompts']} prompts (lengths {min(cfg['prompt_lengths'])}–"
      f"{max(cfg['prompt_lengths'])}), max_new_tokens {cfg['max_new_tokens']}, gamma "
      f"{cfg['gamma']}; median of {cfg['repeats']} alternating rounds after a warm-up call",
      f"- HF assisted settings: {cfg.get('hf_assisted')}; "
      f"{cfg.get('hf_default_assisted_source', 'transformers defaults')}: "
      f"{cfg.get('hf_default_assisted')}",
      f"- machine: jax {m['jax_version']} ({m['backend']}), torch {m.get('torch_version')} "
      f"({m.get('torch_num_threads')} threads), transformers {m.get('transformers_version')}, "
      f"{m['cpu_count']} CPUs", "",
      markdown_table(results), "",
      "ms/token = median wall time of decoding all prompts / tokens generated (EOS included). "
      "tokens/target call: ours from our statistics (target calls counted per row), HF's from "
      "its own target forward passes (batch 1). HF assisted generation supports batch 1 only; "
      "batch > 1 rows are ours alone.",
  ]
  table = per_prompt_table(results)
  if table:
    lines += ["", "Same tokens as HF greedy, per prompt:", "", table]
  if cfg.get("notes"):
    lines += ["", "Notes:", ""] + [f"- {note}" for note in cfg["notes"]]
  if results.get("errors"):
    lines += ["", "Errors:", ""]
    lines += [f"- `{k}`: {v}" for k, v in results["errors"].items()]
  return "\n".join(lines) + "\n"


def write_report(results: dict[str, Any], out_dir: str) -> dict[str, str]:
  """Write hf_compare.json and hf_compare.md into `out_dir`; their paths."""
  paths = {k: os.path.join(out_dir, f"hf_compare.{k}") for k in ("json", "md")}
  write_json(paths["json"], results)
  atomic_write(paths["md"], markdown_report(results))
  return paths
