#!/usr/bin/env python
"""Regenerate the README results of the demo pair (quality, acceptance, measured vs predicted).

    python scripts/demo_results.py --workdir runs/demo --out results/demo --readme README.md

    # quicker: 200 test sentences, two batch sizes, continue an interrupted run
    python scripts/demo_results.py --workdir runs/demo --out results/demo --limit 200 \
        --batch-sizes 1,8 --resume

Rows: target greedy and target sampling (temperature 1) alone; speculative greedy with
each drafter variant found in the workdir (drafter, aligned, distilled) at gamma 1..8;
the n-gram (bigram, fitted on the train targets) and prompt-lookup drafters at gammas
2 and 4. Default batch size 8 (speculative decoding's speedup shrinks as the batch
grows; pass --batch-sizes 1,8 to see both). Writes OUT/results.json, OUT/results.md
and OUT/speedup.png; with --readme, replaces the README's block between
`<!-- results:start -->` and `<!-- results:end -->` with the table. See
`specdec_jax/tools/results/` for the definitions of the columns.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from specdec_jax.errors import SpecdecError
from specdec_jax.tools.options import int_list


def _names(choices):
  def parse(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in choices]
    if bad:
      raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
    return names
  return parse


def main(argv=None) -> int:
  from specdec_jax.tools import results as R
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=__doc__.split("\n\n", 1)[1])
  p.add_argument("--workdir", default="runs/demo")
  p.add_argument("--out", default="results/demo")
  p.add_argument("--split", default="test")
  p.add_argument("--limit", type=int, help="only the first N sentences of the split")
  p.add_argument("--batch-sizes", "--batch-size", type=int_list, default=[8], metavar="8",
                 help="comma-separated batch sizes (default 8)")
  p.add_argument("--gammas", type=int_list, default=list(R.DEFAULT_GAMMAS), metavar="1-8",
                 help="gammas for the model drafters (default 1-8)")
  p.add_argument("--table-gammas", type=int_list, default=list(R.DEFAULT_TABLE_GAMMAS),
                 metavar="2,4", help="gammas for the n-gram and prompt-lookup drafters")
  p.add_argument("--variants", type=_names(R.VARIANTS), default=list(R.VARIANTS),
                 metavar="drafter,aligned,distilled")
  p.add_argument("--table-drafters", type=_names(R.TABLE_DRAFTERS),
                 default=list(R.TABLE_DRAFTERS), metavar="ngram,prompt-lookup")
  p.add_argument("--no-sampling", action="store_true", help="skip the target sampling row")
  p.add_argument("--max-new-tokens", type=int, help="default: the split's target width")
  p.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported)")
  p.add_argument("--timing-steps", type=int, default=16,
                 help="decode steps per jitted loop when measuring c and verify costs")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--compile-workers", type=int, help="concurrent warm-up (compile) calls")
  p.add_argument("--resume", action="store_true",
                 help="keep the rows of an existing OUT/results.json (same settings)")
  p.add_argument("--readme", metavar="README.md",
                 help="splice the table into this file between the results markers")
  p.add_argument("--no-progress", action="store_true")
  p.add_argument("--quality-limit", type=int,
                 help="sentences for the quality table (default: the whole split)")
  p.add_argument("--no-quality", action="store_true",
                 help="skip the whole-split quality table (each model decoding alone)")
  args = p.parse_args(argv)

  command = "python scripts/demo_results.py " + " ".join(
      shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
  try:
    existing = R.load_existing(args.out) if args.resume else None
    results = R.run_results(
        args.workdir, batch_sizes=args.batch_sizes, variants=args.variants, gammas=args.gammas,
        table_drafters=args.table_drafters, table_gammas=args.table_gammas, split=args.split,
        limit=args.limit, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
        timing_steps=args.timing_steps, seed=args.seed, include_sampling=not args.no_sampling,
        existing=existing, settings={"command": command}, progress=not args.no_progress,
        compile_workers=args.compile_workers,
        on_update=lambda r: R.write_outputs(r, args.out))
    paths = R.write_outputs(results, args.out)
    quality = None
    if not args.no_quality:
      quality = R.run_quality(args.workdir, variants=args.variants, split=args.split,
                              limit=args.quality_limit, seed=args.seed,
                              progress=not args.no_progress)
      R.write_quality(quality, args.out)
    if args.readme:
      R.splice_readme(args.readme, R.readme_block(results, paths["png"], args.readme,
                                                  quality))
  except SpecdecError as e:
    print(f"demo_results: error: {e}", file=sys.stderr)
    return 2
  print(R.markdown_table(results))
  if quality:
    print(R.quality_markdown(quality))
  print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}"
        + (f"; updated {args.readme}" if args.readme else ""), file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
