"""Methods as values: `sd.decode(target, method, ...)` against the `*_generate` calls and the
engine's own pieces, settings checked at construction, equality / hash by settings, jit."""

import dataclasses

import jax
import numpy as np
import pytest
from helpers import model_fixtures, ragged_tokens

import specdec_jax as sd
from specdec_jax import testing
from specdec_jax.methods import bild, blockwise, functional, speculative
from specdec_jax.methods.base import model_fields
from specdec_jax.rounds import engine, requests
from specdec_jax.rounds.acceptance import Rollback

MAX_NEW = 8


target, drafter, heads = model_fixtures(5.0, 2.5, drafter="drafter", heads="heads")


@pytest.fixture(scope="module")
def enc():
  return ragged_tokens(3, 8, 512, seed=4)


def _same(a, b):
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))


SAMPLE = sd.Sampling(temperature=0.8)


def _cases(drafter, heads):
  """(method value, the same run by keyword) with non-default settings."""
  return {
      "autoregressive": (sd.Autoregressive(exact=False),
                         lambda t, e, **kw: sd.generate(t, e, exact=False, **kw)),
      "speculative": (sd.Speculative(drafter, gamma=3, lenience=0.7),
                      lambda t, e, **kw: sd.speculative_generate(t, drafter, e, gamma=3,
                                                                 lenience=0.7, **kw)),
      "bild": (sd.BiLD(drafter, fallback_threshold=0.7, rollback_threshold=1.5,
                       max_small_steps=4, batch_policy="sync"),
               lambda t, e, **kw: sd.bild_generate(t, drafter, e, fallback_threshold=0.7,
                                                   rollback_threshold=1.5, max_small_steps=4,
                                                   batch_policy="sync", **kw)),
      "blockwise": (sd.Blockwise(heads, top_k=2, num_drafts=2),
                    lambda t, e, **kw: sd.blockwise_generate(t, heads, e, top_k=2,
                                                             num_drafts=2, **kw)),
  }


@pytest.mark.parametrize("kind", ["autoregressive", "speculative", "bild", "blockwise"])
def test_a_generate_call_decodes_the_method_value_of_its_keywords(monkeypatch, kind):
  """Each `*_generate` call is `sd.decode` of the value its keywords describe: an equal
  value (values compare by settings, non-default ones here), the same models, the same
  request. Model-free: `decode` is replaced by a recorder (the value's own decode is
  every other test's)."""
  calls = []
  monkeypatch.setattr(functional, "decode", lambda *args: calls.append(args) or "decoded")
  method, call = _cases("drafter", "heads")[kind]
  assert call("target", "enc", max_new_tokens=MAX_NEW, sampling=SAMPLE, rng=7) == "decoded"
  (args,) = calls
  assert args == ("target", method, "enc", MAX_NEW, SAMPLE, 7, None, None)
  assert type(args[1]) is type(method)
  for field in model_fields(type(method)):
    assert getattr(args[1], field.name) == getattr(method, field.name), field.name


@pytest.mark.slow
def test_decode_runs_the_wiring_its_settings_describe(target, drafter, enc):
  """The values build the same engine run as the wiring modules' own pieces."""
  method = sd.Speculative(drafter, gamma=2, lenience=0.6)
  config = speculative.round_config(2, MAX_NEW, SAMPLE, 1, lenience=0.6)
  ref = engine.run(target, speculative.proposer(drafter, target, 2), jax.numpy.asarray(enc),
                   jax.numpy.asarray(enc), requests.as_rng(3), config=config)
  out = sd.decode(target, method, enc, MAX_NEW, sampling=SAMPLE, rng=3)
  _same(out, ref)
  assert out.stats["gamma"] == 2 and out.stats["lenience"] == 0.6 and out.stats["lossy"]

  method = sd.BiLD(drafter, fallback_threshold=0.8, rollback_threshold=2.0, max_small_steps=3)
  config = bild.round_config(0.8, 2.0, 3, MAX_NEW, None, 1)
  assert config.accept == Rollback(2.0)
  ref = engine.run(target, bild.proposer(drafter, target, 0.8), jax.numpy.asarray(enc),
                   jax.numpy.asarray(enc), requests.as_rng(0), config=config)
  _same(sd.decode(target, method, enc, MAX_NEW), ref)


#: (method name, model field) of every model the registry's values carry (drafter, small
#: model, heads), found on values whose models are stand-ins.
CARRIED = [(name, f.name) for name, value in testing.examples(None, "drafter", "heads").items()
           for f in model_fields(type(value)) if getattr(value, f.name) is not None]


@pytest.mark.parametrize("name,field", CARRIED)
def test_a_missing_model_is_a_clear_error(target, drafter, heads, enc, name, field):
  """Every method of the registry, each model it carries left out: an InputError that
  names what is missing, before anything compiles."""
  method = testing.examples(target, drafter, heads)[name]
  with pytest.raises(sd.InputError, match=field):
    sd.decode(target, dataclasses.replace(method, **{field: None}), enc, MAX_NEW)


def test_wrong_models_and_wrong_methods_give_clear_errors(target, enc):
  with pytest.raises(sd.InputError, match="prediction heads"):
    sd.decode(target, sd.Blockwise(target), enc, MAX_NEW)
  with pytest.raises(sd.InputError, match="method must be one of sd.Autoregressive"):
    sd.decode(target, "speculative", enc, MAX_NEW)


def test_values_are_equal_and_hashable_by_settings(target, drafter, heads):
  a, b = sd.Speculative(target, gamma=3), sd.Speculative(drafter, gamma=3)
  assert a == b and hash(a) == hash(b)                 # the drafter is not a setting
  assert a != sd.Speculative(target, gamma=4)
  assert a != sd.Speculative(target, gamma=3, adaptive=True)
  assert sd.BiLD(drafter) == sd.BiLD(target) != sd.BiLD(target, batch_policy="sync")
  assert sd.Blockwise(heads, top_k=2) != sd.Blockwise(heads, top_k=3)
  assert sd.Autoregressive() != sd.Autoregressive(exact=False)
  assert len({sd.Autoregressive(), sd.Autoregressive(), sd.BiLD(None), a, b}) == 3
  with pytest.raises(dataclasses.FrozenInstanceError):
    a.gamma = 4
  assert dataclasses.replace(a, gamma=6).gamma == 6
  with pytest.raises(sd.InputError, match="gamma"):
    dataclasses.replace(a, gamma=-1)


@pytest.mark.slow
def test_a_method_value_passes_through_jit(target, drafter, enc):
  """Models in a value are traced leaves, settings are static: one program per settings."""
  traces = []

  @jax.jit
  def run(method):
    traces.append(method.gamma)
    out = sd.decode(target, method, enc, MAX_NEW)
    return out.tokens, out.lengths

  leaves = jax.tree_util.tree_leaves(sd.Speculative(drafter, gamma=3))
  assert len(leaves) == len(jax.tree_util.tree_leaves(drafter))
  ref = sd.decode(target, sd.Speculative(drafter, gamma=3), enc, MAX_NEW)
  tokens, lengths = run(sd.Speculative(drafter, gamma=3))
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(ref.tokens))
  np.testing.assert_array_equal(np.asarray(lengths), np.asarray(ref.lengths))
  run(sd.Speculative(target, gamma=3))     # other drafter weights: no new trace
  assert traces == [3]
  run(sd.Speculative(drafter, gamma=2))     # another setting: a new program
  assert traces == [3, 2]


@pytest.mark.slow
def test_oracle_runs_after_the_loop(target, heads, enc):
  out = sd.decode(target, sd.Blockwise(heads, top_k=2, oracle=True), enc, MAX_NEW)
  calls = blockwise.oracle_calls(target, heads, jax.numpy.asarray(enc), out.tokens,
                                 out.lengths, 2)
  np.testing.assert_array_equal(np.asarray(out.counters.oracle_calls), np.asarray(calls))
  assert "oracle_tokens_per_target_call" in out.stats


# ----------------------------------------------------------------------------- derived options


def test_tools_and_cli_derive_from_the_core_fields():
  """A setting added to a method value is a run setting and a CLI flag with no other change
  (and a bench option: the lab's tests/test_bench_method_specs.py): the value is the
  method's one home."""
  import argparse

  from flax import struct

  from specdec_jax import methods as core
  from specdec_jax import runs as tools
  from specdec_jax.flags import methods as method_args

  @struct.dataclass
  class Patient(core.BiLD):
    """BiLD that waits.

    Attributes:
      patience: rounds to wait before falling back.
    """

    patience: int = core.setting(3)

  parser = argparse.ArgumentParser()
  method_args.add_setting_flags(parser, Patient)
  args = parser.parse_args(["--patience", "7", "--batch-policy", "sync"])
  assert method_args.settings_from_args(args, Patient) == {"patience": 7, "batch_policy": "sync"}
  assert "rounds to wait before falling back (default 3)" in parser.format_help()
  with pytest.raises(SystemExit):                     # choices come from the field
    parser.parse_args(["--batch-policy", "later"])

  run = tools.Run(Patient(None, patience=5), label="aligned")
  assert run.settings()["patience"] == 5 and run.kind == "bild"
  assert run.describe() == "bild small=aligned patience=5, greedy"
  with pytest.raises(sd.InputError, match="batch_policy"):   # the value's own checks
    Patient(None, batch_policy="later")

  # the real flags of sd.BiLD / sd.Blockwise (their bench syntax: the lab's
  # tests/test_bench_method_specs.py)
  parser = argparse.ArgumentParser()
  method_args.add_method_flags(parser)
  args = parser.parse_args(["--lattice-k", "3", "--num-drafts", "2", "--oracle",
                            "--max-small-steps", "4"])
  assert method_args.settings_from_args(args, core.Blockwise) == {
      "top_k": 3, "num_drafts": 2, "oracle": True}
  assert method_args.settings_from_args(args, core.BiLD) == {"max_small_steps": 4}
