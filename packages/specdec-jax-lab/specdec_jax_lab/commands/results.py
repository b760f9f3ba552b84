"""`specdec results ...` is `python -m specdec_jax_lab.results ...`: rebuild the tables under
results/ (see that module for the tables and flags)."""

from __future__ import annotations

import argparse


def add(subparsers) -> None:
  # no option prefix here: every argument (--help too) goes on to the results' own parser
  p = subparsers.add_parser(
      "results", add_help=False, prefix_chars="\0",
      help="rebuild the tables under results/ (--help for the flags)",
      description="python -m specdec_jax_lab.results")
  p.add_argument("rest", nargs=argparse.REMAINDER)
  p.set_defaults(func=run)


def run(args) -> int:
  from specdec_jax_lab.results.__main__ import main
  return main(args.rest)
