"""`specdec` in this process, found as a shell finds it (its console script), and a parser
of the lab's subcommands: the lab's tests run its commands as users do, and import no
module of the library's CLI (the lab's package imports none either).

    code = specdec_command.main(["bench", "--out", "dir", ...])   # specdec's exit code
    args = specdec_command.build_parser().parse_args(["bench", "--preset", "xxl-small"])
"""

from __future__ import annotations

import argparse
import importlib.metadata

(_SCRIPT,) = importlib.metadata.entry_points(group="console_scripts", name="specdec")
#: `specdec`'s `main(argv) -> exit code` (its console script's target).
main = _SCRIPT.load()

#: The entry-point group through which `specdec` takes companions' subcommands.
COMMANDS = "specdec_jax.commands"


def build_parser() -> argparse.ArgumentParser:
  """A parser of the lab's subcommands, each added by its entry point's module
  (`add(subparsers)`), as `specdec` adds them."""
  parser = argparse.ArgumentParser(prog="specdec")
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
  for entry in sorted(importlib.metadata.entry_points(group=COMMANDS), key=lambda e: e.name):
    entry.load().add(subparsers)
  return parser
