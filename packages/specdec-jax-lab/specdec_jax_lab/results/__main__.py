"""Rebuild every table under the lab's results/ (packages/specdec-jax-lab/results: the ones
README and the docs embed), from the repository root.

    python -m specdec_jax_lab.results                          # all tables
    python -m specdec_jax_lab.results --only theory,kernels    # those that need no training
    python -m specdec_jax_lab.results --only demo --name demo-large \\
        --workdir runs/demo-large --variants aligned_small,aligned_mid --dtype bfloat16

Tables:
  theory   results/theory/table1.md: Leviathan et al.'s Table 1 from `sd.theory` (instant).
  kernels  results/cpu_kernels/{verify_cost,exactness_cost}.md: what a k-token decode call
           costs, and what exact greedy decoding costs, with and without the CPU decode
           kernels (the bundled pair; about 4 minutes on a 2-core CPU).
  demo     results/demo/{quality,results}.md + speedup.png: quality on the whole test split
           and speculative decoding with every drafter, measured vs predicted (needs the
           trained workdir of `specdec train --recipe configs/demo/train.json --workdir
           runs/demo`; about 12 minutes with --limit 100 --batch-sizes 1,8 --gammas 1-4).
           `--name demo-large` writes results/demo-large/ instead (the larger target of
           configs/demo-large/train.json and its drafters).

After a demo run, README.md's headline tables (between `<!-- results:start -->` and
`<!-- results:end -->`) are rebuilt from results/<name> (`--no-readme` leaves README alone;
`--only theory,kernels` never touches it).
Each table records its command, date and machine; `--only demo --resume` continues an
interrupted demo run. See the modules of `specdec_jax_lab.results` for the definitions.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from specdec_jax.errors import SpecdecError
from specdec_jax.flags.common import int_list

TABLES = ("theory", "kernels", "demo")
#: The lab's committed tables, from the repository root (docs/hooks/results.py reads them).
RESULTS_DIR = "packages/specdec-jax-lab/results"


def _names(choices):
  def parse(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in choices]
    if bad:
      raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
    return names
  return parse


def parser() -> argparse.ArgumentParser:
  from specdec_jax_lab import results as R
  p = argparse.ArgumentParser(prog="python -m specdec_jax_lab.results",
                              description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=__doc__.split("\n\n", 1)[1])
  p.add_argument("--only", type=_names(TABLES), default=list(TABLES),
                 metavar=",".join(TABLES), help="rebuild only these tables")
  p.add_argument("--results-dir", default=RESULTS_DIR, help="where the tables go")
  p.add_argument("--readme", default="README.md", help="the README whose headline it rebuilds")
  p.add_argument("--no-readme", action="store_true", help="leave the README alone")
  g = p.add_argument_group("kernels")
  g.add_argument("--kernel-rounds", type=int, default=7, help="interleaved timing rounds")
  g.add_argument("--kernel-limit", type=int, default=32, help="test sentences decoded")
  g.add_argument("--kernel-max-new-tokens", type=int, default=32,
                 help="tokens decoded per sentence in the kernels' tables (default 32)")
  g = p.add_argument_group("demo")
  g.add_argument("--workdir", default="runs/demo", help="the trained demo workdir")
  g.add_argument("--name", default="demo", help="the tables' directory under --results-dir, "
                 "which README's headline is built from (e.g. demo-large)")
  g.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                 help="compute dtype of every model (bfloat16: as the bundled weights are "
                 "stored, half the bytes per decode step)")
  g.add_argument("--split", default="test", help="the data split decoded (default test)")
  g.add_argument("--limit", type=int, default=100, help="sentences timed (quality: all)")
  g.add_argument("--batch-sizes", type=int_list, default=[1, 8], metavar="1,8",
                 help="batch sizes timed (default 1,8)")
  g.add_argument("--gammas", type=int_list, default=[1, 2, 3, 4], metavar="1-4",
                 help="gammas for the model drafters")
  g.add_argument("--table-gammas", type=int_list, default=list(R.DEFAULT_TABLE_GAMMAS),
                 metavar="2,4", help="gammas for the n-gram and prompt-lookup drafters")
  g.add_argument("--variants", type=_names(R.KNOWN_VARIANTS), default=list(R.VARIANTS),
                 metavar=",".join(R.VARIANTS),
                 help="drafter variants under --workdir (also: aligned_small, aligned_mid)")
  g.add_argument("--table-drafters", type=_names(R.TABLE_DRAFTERS),
                 default=list(R.TABLE_DRAFTERS), metavar=",".join(R.TABLE_DRAFTERS),
                 help="the drafters of the speedup table")
  g.add_argument("--no-sampling", action="store_true", help="skip the target sampling row")
  g.add_argument("--max-new-tokens", type=int, help="default: the split's target width")
  g.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported)")
  g.add_argument("--timing-steps", type=int, default=16,
                 help="decode steps per jitted loop when measuring c and verify costs")
  g.add_argument("--seed", type=int, default=0, help="PRNG seed of sampling (default 0)")
  g.add_argument("--compile-workers", type=int, help="concurrent warm-up (compile) calls")
  g.add_argument("--resume", action="store_true",
                 help="keep the rows of an existing results.json (same settings)")
  g.add_argument("--quality-limit", type=int,
                 help="sentences for the quality table (default: the whole split)")
  g.add_argument("--no-quality", action="store_true", help="skip the quality table")
  p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
  return p


def theory_table(out_dir: str, command: str) -> str:
  """results/theory/table1.{md,json}: the paper's Table 1 recomputed by `sd.theory`."""
  from specdec_jax import theory
  from specdec_jax.io.reports import atomic_write, utc_now, write_json
  rows = theory.table1()
  lines = [f"Created {utc_now()[:10]} by `{command}` (`sd.theory.table1()`: "
           "Theorem 10 with ĉ = 0, Theorem 8 with c = 0).", "",
           "| α | γ | operations | speed |", "|---:|---:|---:|---:|"]
  lines += [f"| {r.alpha} | {r.gamma} | {r.ops:.2f}x | {r.speed:.2f}x |" for r in rows]
  path = os.path.join(out_dir, "theory", "table1")
  write_json(path + ".json", {"rows": [r._asdict() for r in rows], "command": command})
  atomic_write(path + ".md", "\n".join(lines) + "\n")
  return path + ".md"


def demo_tables(args, out_dir: str, command: str) -> list[str]:
  from specdec_jax_lab import results as R
  out = os.path.join(out_dir, args.name)
  if not os.path.isdir(os.path.join(args.workdir, "target")):
    recipe = "demo-large" if args.name == "demo-large" else "demo"
    raise R.ResultsError(
        f"no trained demo workdir at {args.workdir!r} (it needs target/, the drafters and "
        f"data/): run `specdec train --recipe configs/{recipe}/train.json --workdir "
        f"{args.workdir}` first, or leave the demo tables out with --only theory,kernels")
  existing = R.load_existing(out) if args.resume else None
  settings = R.ResultsSettings(
      batch_sizes=args.batch_sizes, variants=args.variants, gammas=args.gammas,
      table_drafters=args.table_drafters, table_gammas=args.table_gammas, split=args.split,
      limit=args.limit, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
      timing_steps=args.timing_steps, seed=args.seed, include_sampling=not args.no_sampling,
      compile_workers=args.compile_workers, progress=not args.no_progress, dtype=args.dtype)
  results = R.run_results(args.workdir, settings, existing=existing,
                          config={"command": command},
                          on_update=lambda r: R.write_outputs(r, out))
  paths = R.write_outputs(results, out)
  written = [paths["md"], paths["png"]]
  if not args.no_quality:
    quality = R.run_quality(args.workdir, variants=args.variants, split=args.split,
                            limit=args.quality_limit, seed=args.seed,
                            progress=not args.no_progress, dtype=args.dtype)
    written.append(R.write_quality(quality, out)["md"])
  return written


def main(argv=None) -> int:
  args = parser().parse_args(argv)
  command = "python -m specdec_jax_lab.results " + " ".join(
      shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
  written = []
  try:
    if "theory" in args.only:
      written.append(theory_table(args.results_dir, command.strip()))
    if "kernels" in args.only:
      from specdec_jax_lab.results import kernels
      res = kernels.run_kernels(args.kernel_rounds, args.kernel_limit,
                                args.kernel_max_new_tokens, command=command.strip())
      paths = kernels.write_outputs(res, os.path.join(args.results_dir, "cpu_kernels"))
      written += [paths["verify"], paths["exactness"]]
    if "demo" in args.only:
      written += demo_tables(args, args.results_dir, command.strip())
    if not args.no_readme and "demo" in args.only:   # the headline is the demo tables'
      from specdec_jax_lab.results import headline, splice_readme
      splice_readme(args.readme, headline.headline(args.results_dir, args.name))
      written.append(args.readme)
  except SpecdecError as e:
    print(f"results: error: {e}", file=sys.stderr)
    return 2
  print("wrote " + ", ".join(written), file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
