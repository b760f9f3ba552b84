"""The bench's method syntax (`--beam K:ALPHA`, `--bild FB:RB`, `--blockwise K:P`, or
NAME=VALUE settings) comes from the method values' fields: a setting added to a value is a
bench option with no other change. The library's side (run settings, CLI flags) is
tests/test_methods.py and tests/test_beam.py."""

import numpy as np
import pytest
from flax import struct

import specdec_jax as sd
from specdec_jax import cli
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
