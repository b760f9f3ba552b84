"""The whole-split quality table: BLEU / chrF of every demo model decoding alone."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Sequence

import specdec_jax as sd
from specdec_jax.io.reports import atomic_write, utc_now, write_json
from specdec_jax_lab import evaluation
from specdec_jax_lab.errors import ResultsError
from specdec_jax_lab.results.run import SCHEMA_VERSION, VARIANTS, find_variants


def run_quality(workdir: str | os.PathLike, *, variants: Sequence[str] = VARIANTS,
                split: str = "test", limit: int | None = None, batch_size: int = 64,
                seed: int = 0, progress: bool = True,
                dtype: str = "float32") -> dict[str, Any]:
  """BLEU / chrF of every demo model decoding ALONE on the whole split (not just the
  timed subset): target greedy, target sampling (T = 1), each drafter variant greedy.

  Speculative greedy output equals target greedy, so it needs no row of its own here.
  """
  from tqdm import tqdm
  workdir = pathlib.Path(workdir)
  target_dir = workdir / "target" / "final"
  if not target_dir.is_dir():
    raise ResultsError(f"no target at {target_dir} (train it: specdec train)")
  jobs = [("target", target_dir, "greedy"), ("target", target_dir, "sample")]
  jobs += [(v, path, "greedy") for v, path in find_variants(workdir, variants).items()]
  rows, models = [], {}
  for name, path, method in tqdm(jobs, desc="quality", disable=not progress):
    if name not in models:
      models[name] = sd.load(str(path), dtype=dtype)
    settings = evaluation.EvalSettings(split=split, method=method, batch_size=batch_size,
                                       limit=limit, seed=seed)
    r = evaluation.evaluate(models[name], workdir / "data", settings)
    rows.append({"model": name, "params": models[name].num_params(),
                 "method": "greedy" if method == "greedy" else "sampling (T=1)",
                 "bleu": r["bleu"], "chrf": r["chrf"], "pairs": r["pairs"],
                 "generated_tokens": r["generated_tokens"]})
  return {"schema_version": SCHEMA_VERSION, "split": split, "limit": limit,
          "created": utc_now(), "dtype": dtype,
          "rows": rows}


def quality_markdown(quality: dict[str, Any]) -> str:
  pairs = quality["rows"][0]["pairs"] if quality["rows"] else 0
  scope = f"the first {pairs}" if quality.get("limit") is not None else f"all {pairs}"
  lines = [f"Quality on {scope} sentences of the `{quality['split']}` split, each model "
           "decoding alone (speculative greedy output is identical to target greedy):", "",
           "| model | parameters | decoding | BLEU | chrF |", "|---|--:|---|--:|--:|"]
  for r in quality["rows"]:
    lines.append(f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['method']} | "
                 f"{r['bleu']:.1f} | {r['chrf']:.1f} |")
  return "\n".join(lines)


def write_quality(quality: dict[str, Any], out_dir: str) -> dict[str, str]:
  """quality.json and quality.md in `out_dir`; their paths."""
  paths = {"json": os.path.join(out_dir, "quality.json"),
           "md": os.path.join(out_dir, "quality.md")}
  write_json(paths["json"], quality)
  atomic_write(paths["md"], quality_markdown(quality) + "\n")
  return paths
