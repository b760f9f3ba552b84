"""The `specdec` command line: decode, convert, plan; with the lab installed
(specdec-jax-lab) also bench, train, eval, sweep-bild, sweep-blockwise and results.

    specdec decode --model config:t5_1_1_tiny "5 17 42 1"                 # token ids in, ids out
    specdec decode --model DIR --drafter DRAFT_DIR --tokenizer spiece.model "Hello." --stats
    specdec decode --model DIR --drafter prompt-lookup --input-file prompts.txt --json
    specdec decode --model DIR --drafter DRAFT_DIR --sampling sample --temperature 0.7 ...
    specdec convert t5x/checkpoint_1000000 out_dir --dtype bfloat16 [--to hf]
    specdec bench --target config:t5_1_1_small --drafter config:t5_1_1_tiny_drafter --out bench/
    specdec train --recipe configs/demo/train.json --workdir runs/demo --stages data,target
    specdec eval --model runs/demo/target/final --data runs/demo/data --drafter ngram --json
    specdec decode --model demo-de-en/target --method bild --drafter demo-de-en/drafter ...
    specdec decode --model demo-de-en/target --method blockwise --lattice-k 4 --num-drafts 4 ...
    specdec sweep-bild --data runs/demo/data --small aligned=demo-de-en/drafter --out DIR
    specdec sweep-blockwise --data runs/demo/data --out DIR
    specdec decode --model DIR --drafter DRAFT_DIR --mesh data=2,model=4 ...   # on 8 devices
    specdec plan --target config:t5_1_1_xxl --drafter config:t5_1_1_small --dtype bfloat16 \
        --batch 8 --mesh model=8 --device-memory tpu-v5e

Each subcommand is a module whose `add(subparsers)` adds its parser and sets
`func(args) -> int`: this package's are in `COMMANDS`; a companion distribution adds its
own through the entry-point group `specdec_jax.commands` (`plugins`), as the lab does.
A subcommand parses its flags and calls library functions.

Exit codes: 0 done; 1 a `specdec_jax.errors.SpecdecError` (bad input found anywhere:
an unknown model or config, invalid sampling or gamma, malformed prompts, a drafter whose
vocabulary differs from the target's, a missing file, ...), reported as one line
``specdec <command>: error: <message>`` on stderr; 2 a command line that does not parse
(argparse's usage errors); 130 interrupted (Ctrl-C), 143 terminated (SIGTERM), either
with one line saying how many rows were kept and how to go on. Anything else is a bug and keeps its
traceback. `main` returns the exit code instead of raising SystemExit, so tests and
scripts can call `main([...])` directly.

`specdec decode` with several processes (the distributed flags) decodes in a supervised
child process (`supervise`, Linux), so that a process that JAX aborts from C++ (its
coordinator lost) still ends with one line and exit code 1; `main(argv)` called from
Python decodes in its own process.

stdout carries only a command's results (decode: the outputs, or one JSON object with
--json); every log, ours, JAX's and C++ libraries' (Gloo's connection lines with several
processes), goes to stderr (`streams.results_stdout`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from typing import Sequence

from specdec_jax.cli import convert, decode, plan
from specdec_jax.errors import SpecdecError
from specdec_jax.flags import FlagError
from specdec_jax.io.streams import results_stdout
from specdec_jax.runtime import distributed, progress, supervise

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143

#: The library's own subcommands, in the order `specdec --help` lists them.
COMMANDS = (decode, convert, plan)

#: Entry-point group of companion distributions' subcommands: each entry point names a
#: module with `add(subparsers)` (the lab's `bench`, `train`, `eval`, `sweep-*`, `results`).
PLUGIN_GROUP = "specdec_jax.commands"

#: The lab's subcommands: named even where the lab is not installed, to say how to get them.
LAB_COMMANDS = ("bench", "train", "eval", "sweep-bild", "sweep-blockwise", "results")
LAB_INSTALL = "pip install ./packages/specdec-jax-lab (docs/install.md)"


def plugins() -> list:
  """The subcommand modules companions register under `PLUGIN_GROUP`, by entry-point name
  (one whose module cannot be imported is left out, as if not installed: its distribution's
  metadata without its code, or code missing a dependency)."""
  found = sorted(importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda e: e.name)
  modules = []
  for entry in found:
    try:
      modules.append(entry.load())
    except ImportError:
      continue
  return modules


def _not_installed(name: str):
  def run(args) -> int:
    raise FlagError(f"`specdec {name}` comes with the lab, specdec-jax-lab, which is not "
                   f"installed (or cannot be imported): {LAB_INSTALL}")
  return run


def version() -> str:
  """The installed specdec-jax distribution's version."""
  try:
    return importlib.metadata.version("specdec-jax")
  except importlib.metadata.PackageNotFoundError:
    return "unknown (specdec-jax is not installed: run from a source tree)"


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="specdec",
      description="Speculative decoding in JAX (speculative sampling, BiLD, blockwise parallel "
      "drafts, the autoregressive baseline, T5X's beam search) for T5 encoder-decoders and "
      "decoder-only LMs "
      "(GPT-2, Llama-style): T5X and Hugging Face checkpoints, ours, or the bundled pairs "
      "demo-de-en (T5, De->En), demo-de-en-large (a larger T5 De->En pair, README's) and "
      "demo-en-lm (a Llama-style English LM).")
  parser.add_argument("--version", action="version", version=f"specdec {version()}")
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
  for command in (*COMMANDS, *plugins()):
    command.add(subparsers)
  for name in LAB_COMMANDS:
    if name not in subparsers.choices:
      # no option prefix: every argument (flags too) is the stub's, to be refused by it
      stub = subparsers.add_parser(name, add_help=False, prefix_chars="\0",
                                   help=f"(the lab: {LAB_INSTALL})")
      stub.add_argument("rest", nargs=argparse.REMAINDER)
      stub.set_defaults(func=_not_installed(name))
  return parser


def error_line(e: SpecdecError) -> str:
  """The first line of the message (the class name if it has none)."""
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def _supervised(args, processes: distributed.Processes) -> int:
  """This multi-process command (its `processes`), run again as a supervised child
  (`supervise`)."""
  who = supervise.Who(processes.process_id, processes.num_processes, processes.coordinator)
  return supervise.run([sys.executable, "-m", "specdec_jax.cli", *args.argv], who,
                       program=f"specdec {args.command}")


def main(argv: Sequence[str] | None = None) -> int:
  parser = build_parser()
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:   # argparse: usage errors (2) and --help (0)
    return e.code if isinstance(e.code, int) else EXIT_USAGE
  args.argv = list(sys.argv[1:] if argv is None else argv)
  if argv is None:
    progress.unblock_interrupts()   # a parent's blocked mask must not swallow Ctrl-C
    supervise.as_child()      # a supervised child: a SIGINT sent twice is one interrupt
    progress.on_sigterm()     # SIGTERM ends the run as Ctrl-C does: with what was kept
  try:
    if argv is None and args.command == "decode":
      processes = distributed.processes_from_args(args)
      if supervise.wanted(distributed.requested(processes)):
        return _supervised(args, processes)
    with results_stdout(keep=argv is None):   # the process entry: stdout stays results-only
      return int(args.func(args) or EXIT_OK)
  except SpecdecError as e:
    print(f"specdec {args.command}: error: {error_line(e)}", file=sys.stderr)
    return EXIT_ERROR
  except KeyboardInterrupt as e:
    terminated = isinstance(e, progress.Terminated) or getattr(e, "terminated", False)
    detail = getattr(e, "detail", "")
    print(f"specdec {args.command}: {'terminated' if terminated else 'interrupted'}"
          + (f": {detail}" if detail else ""), file=sys.stderr)
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
