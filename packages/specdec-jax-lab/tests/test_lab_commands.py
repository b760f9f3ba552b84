"""The lab's commands join `specdec` (entry points `specdec_jax.commands`): their flags are
explained, their method flags derived from the method values as the library's commands'
are, and their usage errors come before any work."""

import pytest
import specdec_command as cli
from helpers import DEMO_PAIRS_FILE as PAIRS

from specdec_jax import methods as core
from specdec_jax.flags import methods as method_args


def test_the_lab_commands_join_specdec_and_explain_every_flag(capsys):
  """`specdec --help` lists the lab's commands (through the entry-point group, not as the
  stubs of an absent lab); `specdec <command> --help` explains each option, `python -m
  specdec_jax_lab.results`'s included (the library's commands: tests/test_plan_split.py)."""
  from specdec_jax_lab.results.__main__ import parser as results_parser
  assert cli.main(["--help"]) == 0
  listed = capsys.readouterr().out
  commands = cli.build_parser()._subparsers._group_actions[0].choices
  assert {"bench", "train", "eval", "sweep-bild", "sweep-blockwise", "results"} == set(commands)
  assert all(name in listed for name in commands) and "(the lab:" not in listed
  parsers = {name: p for name, p in commands.items() if name != "results"}
  parsers["results"] = results_parser()
  bare = [(name, a.option_strings) for name, p in parsers.items() for a in p._actions
          if a.option_strings and not a.help]
  assert bare == []


def test_eval_help_has_the_method_values_flags():
  """As `decode`'s (tests/test_cli.py): the flags and their help come from the values."""
  flags = {flag for flag, _ in method_args.setting_flags(core.Speculative)}
  sub = cli.build_parser()._subparsers._group_actions[0].choices["eval"]
  text = " ".join(sub.format_help().split())
  assert all(flag in text for flag in flags)
  assert "the small model hands over when" in text   # help from the class's Attributes
  assert "tokens drafted per round" in text          # or written for the command line
  options = text.split("options:", 1)[1]
  assert not any(python in options for python in ("`", "True or", "default None")), options


def test_specdec_results_passes_its_flags_on(capsys):
  """`specdec results --only theory --help` reaches the results' own parser (its flags are
  not specdec's)."""
  with pytest.raises(SystemExit) as e:
    cli.main(["results", "--only", "theory", "--help"])
  shown = capsys.readouterr()
  assert e.value.code == 0 and "--only theory,kernels,demo" in shown.out + shown.err


def test_sweep_bild_without_small_exits_nonzero(capsys, tmp_path):
  code = cli.main(["sweep-bild", "--data", str(PAIRS), "--limit", "2", "--out",
                   str(tmp_path / "sweep")])
  err = capsys.readouterr().err
  assert code == 1
  assert "needs a small model to sweep: --small NAME=PATH" in err
  assert not (tmp_path / "sweep").exists()
