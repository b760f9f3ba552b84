"""The bench's method flags (`--beam K:ALPHA`, `--bild FB:RB`, `--heads-lattice K:P`) and
their syntax (or NAME=VALUE settings) come from the method values: a setting added to a
value is a bench option, a method with a `shorthand` a bench flag, with no other change.
The library's side (run settings, CLI flags) is tests/test_methods.py and
tests/test_beam.py."""

import argparse
from typing import ClassVar

import numpy as np
import pytest
import specdec_command as cli
from flax import struct

import specdec_jax as sd
from specdec_jax import experimental
from specdec_jax import methods as core
from specdec_jax_lab.bench import method_specs as bench_methods


def test_a_new_setting_is_a_bench_option():
  @struct.dataclass
  class Patient(core.BiLD):
    """BiLD that waits.

    Attributes:
      patience: rounds to wait before falling back.
    """

    patience: int = core.setting(3)

  assert bench_methods.parse_settings("patience=4,rollback_threshold=inf", Patient,
                                      "--bild") == {"patience": 4, "rollback_threshold": np.inf}


def test_bild_and_blockwise_bench_syntax():
  extras = bench_methods.extra_methods(
      {core.BiLD: ["0.5:3", "max_small_steps=4,batch_policy=sync"], core.Blockwise: ["", "2:2"]},
      models={core.Blockwise: (object(), "h")})
  assert list(extras) == ["bild fb=0.5 rb=3", "bild max_small_steps=4 batch_policy=sync",
                          "blockwise", "blockwise k=2 p=2"]
  made = extras["bild max_small_steps=4 batch_policy=sync"](sd.Greedy())
  assert made.method == sd.BiLD(None, max_small_steps=4, batch_policy="sync")
  for spec, message in [("0.5", "expected FALLBACK_THRESHOLD:ROLLBACK_THRESHOLD"),
                        ("gamma=3", "unknown setting 'gamma'"),
                        ("max_small_steps=two", "is not a int"),
                        ("fallback_threshold=2", r"fallback_threshold must be in \[0, 1\]")]:
    with pytest.raises(Exception, match=message):
      bench_methods.parse_settings(spec, core.BiLD, "--bild")


def test_beam_bench_syntax(capsys):
  extras = bench_methods.extra_methods({sd.Beam: ["4:0.6", "num_beams=2"]})
  assert list(extras) == ["beam K=4 alpha=0.6", "beam K=2"]
  assert extras["beam K=4 alpha=0.6"](sd.Greedy()).method == sd.Beam(num_beams=4, alpha=0.6)
  with pytest.raises(Exception, match="alpha .* must be >= 0"):
    bench_methods.parse_settings("4:-1", sd.Beam, "--beam")
  assert cli.main(["bench", "--beam", "4:0.6", "--modes", "greedy,sample"]) != 0
  assert "--beam times beam search" in capsys.readouterr().err


@struct.dataclass
class Eager(core.Speculative):
  """Speculative decoding that drafts eagerly.

  Attributes:
    eagerness: how eagerly it drafts.
  """

  name: ClassVar[str] = "eager"
  shorthand: ClassVar[tuple[str, ...]] = ("gamma", "eagerness")

  eagerness: float = core.setting(0.5, short="e")


def _flags(methods) -> dict[str, argparse.Action]:
  parser = argparse.ArgumentParser()
  bench_methods.add_spec_flags(parser, methods)
  return {a.option_strings[0]: a for a in parser._actions if a.dest != "help"}


def test_the_bench_flags_are_the_values():
  """--bild, --heads-lattice and --beam, spelled as before, from the values with a
  shorthand; speculative beam search rides on --beam (its `with_drafter_for`)."""
  flags = _flags(bench_methods.METHODS)
  assert {f: a.metavar for f, a in flags.items()} == {
      "--bild": "FB:RB", "--heads-lattice": "K:P", "--beam": "K:ALPHA"}
  assert {a.dest for a in flags.values()} == {"bild", "heads_lattice", "beam"}
  assert "--drafter is its small model" in flags["--bild"].help
  assert "needs --heads" in flags["--heads-lattice"].help
  assert "experimental.SpeculativeBeam at each of --gammas" in flags["--beam"].help
  assert bench_methods.drafted_form(sd.Beam) is experimental.SpeculativeBeam


def test_a_new_method_is_a_new_bench_flag():
  """A method value registered beside the others is a flag of its own: its name, its
  shorthand's short names, its drafter's checks, its entries' labels."""
  flags = _flags((*bench_methods.METHODS, Eager))
  assert flags["--eager"].metavar == "GAMMA:E" and flags["--eager"].dest == "eager"
  assert "--drafter is its drafter" in flags["--eager"].help
  with pytest.raises(Exception, match="--eager uses --drafter as Eager's drafter"):
    bench_methods.check_specs({Eager: ["3:0.2"]}, drafter=False, given=set(), modes=["greedy"])
  extras = bench_methods.extra_methods({Eager: ["3:0.2"]}, models={Eager: (object(), "d")})
  assert list(extras) == ["eager gamma=3 e=0.2"]
  assert extras["eager gamma=3 e=0.2"](sd.Greedy()).method == Eager(None, gamma=3, eagerness=0.2)


def test_the_bench_checks_each_methods_needs():
  with pytest.raises(Exception, match="--heads-lattice needs --heads"):
    bench_methods.check_specs({core.Blockwise: ["2:2"]}, drafter=True, given=set(),
                              modes=["greedy"])
  with pytest.raises(Exception, match="--beam times beam search.*add --modes greedy"):
    bench_methods.check_specs({core.Beam: ["4:0.6"]}, drafter=True, given=set(),
                              modes=["greedy", "sample"])
  bench_methods.check_specs({core.Blockwise: ["2:2"], core.Beam: ["4:0.6"]}, drafter=False,
                            given={"--heads"}, modes=["greedy"])
