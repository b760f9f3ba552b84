"""The pieces every tool shares (the CLI and the lab): one aggregator, padded batches, the
decode-method dispatch, sampling options, drafter names, timing rotation, files, errors."""

import inspect
import json
import statistics
from typing import ClassVar

import jax
import numpy as np
import pytest
from helpers import peaked, perturbed, ragged_tokens

import specdec_jax as sd
from specdec_jax import errors, timing
from specdec_jax import loading as models
from specdec_jax import runs as methods
from specdec_jax import sampling as sampling_lib
from specdec_jax.batching import Batch, cycled_rows, pad_rows, padded_batches, trim_padding
from specdec_jax.flags import FlagError
from specdec_jax.flags import common as options
from specdec_jax.io import reports as report
from specdec_jax.rounds import stats as stats_lib

GAMMA, MAX_NEW = 3, 8


@pytest.fixture(scope="module")
def pair():
  """A peaked tiny target and a drafter that agrees with it about half the time."""
  target = peaked(sd.init_model(sd.get_config("t5_1_1_tiny"), 0))
  return target, perturbed(target, 0.1, 1)


@pytest.fixture(scope="module")
def inputs():
  return ragged_tokens(5, 7, 512, 0)


# ----------------------------------------------------------------------------- one aggregator


AGGREGATES = ("alpha", "acceptance_rate", "tokens_per_target_call", "target_calls", "drafted",
              "accepted", "beta_sum", "beta_count", "tokens", "drafter_calls", "rejections",
              "per_position_accepted")


@pytest.mark.slow
def test_corpus_of_padded_batches_has_the_stats_of_one_big_batch(pair, inputs):
  """Greedy speculative decoding of 5 rows in batches of 2 (the last padded) aggregates to
  exactly the statistics of one batch of 5: alpha from summed beta sums and counts,
  target_calls per row, padding rows dropped."""
  target, drafter = pair
  method = methods.Run(sd.Speculative(drafter, gamma=GAMMA))
  whole = method.decode(target, inputs, max_new_tokens=MAX_NEW)
  batches = padded_batches(inputs, 2)
  corpus = methods.decode_corpus(method, target, batches, max_new_tokens=MAX_NEW)
  assert corpus.real_rows == (2, 2, 1)
  np.testing.assert_array_equal(corpus.tokens(), np.asarray(whole.tokens))
  np.testing.assert_array_equal(corpus.lengths, np.asarray(whole.lengths))
  merged, expected = corpus.stats, whole.stats
  assert 0.0 < float(expected["alpha"]) < 1.0          # a meaningful mix of accepts/rejects
  assert 0 < int(expected["accepted"]) < int(expected["drafted"])
  raw_merged = stats_lib.merge_outputs(corpus.outputs, corpus.real_rows, raw=True)
  raw_whole = stats_lib.summarize(whole.counters, dict(whole.info), raw=True)
  for key in AGGREGATES:
    np.testing.assert_allclose(merged[key], expected[key], rtol=1e-6, err_msg=key)
    row_key = f"{'emitted' if key == 'tokens' else key}_per_row"
    np.testing.assert_allclose(raw_merged[row_key], raw_whole[row_key], rtol=1e-6, err_msg=key)
  assert float(merged["alpha"]) == pytest.approx(
      float(merged["beta_sum"]) / float(merged["beta_count"]))
  assert float(merged["tokens_per_target_call"]) == pytest.approx(
      corpus.generated / int(merged["target_calls"]))
  # rounds (batched verifier calls) add up over the calls: what wall time follows
  assert int(merged["rounds"]) == sum(int(o.stats["rounds"]) for o in corpus.outputs)
  assert merged["gamma"] == GAMMA and merged["method"] == "speculative"


@pytest.mark.slow
def test_baseline_counts_one_target_call_per_row_and_token(pair, inputs):
  target, _ = pair
  corpus = methods.decode_corpus(methods.Run(sd.Autoregressive()), target,
                                 padded_batches(inputs, 2), max_new_tokens=MAX_NEW)
  row = methods.stats_row(corpus.stats)
  assert row["target_calls"] == corpus.generated and row["block_efficiency"] == 1.0
  assert set(row) == {"target_calls", "rounds", "block_efficiency"}
  assert "_per_row" not in "".join(methods.totals(corpus.stats))


@pytest.mark.slow
def test_out_stats_is_a_readable_summary_of_host_numbers(pair, inputs):
  """out.stats: documented names, Python ints / floats (no device arrays, no per-row keys);
  the per-row counters stay on out.counters and in summarize(raw=True), also under jit."""
  target, drafter = pair
  out = sd.speculative_generate(target, drafter, inputs, gamma=GAMMA, max_new_tokens=MAX_NEW)
  s = out.stats
  doc = stats_lib.summarize.__doc__
  numbers = {k: v for k, v in s.items() if k not in dict(out.info)}
  # the common statistics and speculative decoding's own (tests/test_method_stats.py)
  assert set(numbers) == set(stats_lib.shown(sd.Speculative.statistics)) and len(numbers) == 17
  for name, value in numbers.items():
    assert f"{name} " in doc or f"{name}," in doc, f"{name} is not documented"
    assert type(value) in (int, float, list), (name, type(value))
  assert s["tokens"] == int(np.asarray(out.lengths).sum()) and s["rows"] == len(inputs)
  assert s["tokens_per_target_call"] == pytest.approx(s["tokens"] / s["target_calls"])
  assert s["alpha"] == pytest.approx(s["beta_sum"] / s["beta_count"])
  assert sum(s["per_position_accepted"]) == s["accepted"]
  assert s["method"] == "speculative" and s["gamma"] == GAMMA
  calls = np.asarray(out.counters.target_calls)
  assert calls.shape == (len(inputs),) and calls.sum() == s["target_calls"]
  raw = stats_lib.summarize(out.counters, dict(out.info), raw=True)
  np.testing.assert_array_equal(raw["target_calls_per_row"], calls)
  jitted = jax.jit(lambda c: stats_lib.summarize(c, raw=True)["alpha"])(out.counters)
  assert float(jitted) == pytest.approx(s["alpha"], rel=1e-6)
  with pytest.raises(sd.InputError, match="raw=True"):
    jax.jit(lambda c: stats_lib.summarize(c)["alpha"])(out.counters)


# ----------------------------------------------------------------------------- batching


def test_padded_batches_repeat_the_last_row():
  rows = np.arange(10, dtype=np.int32).reshape(5, 2)
  batches = padded_batches(rows, 2)
  assert [b.real for b in batches] == [2, 2, 1]
  assert all(isinstance(b, Batch) and b.tokens.shape == (2, 2) for b in batches)
  np.testing.assert_array_equal(batches[-1].tokens, [[8, 9], [8, 9]])
  np.testing.assert_array_equal(np.concatenate([t[:r] for t, r in batches]), rows)
  assert [b.real for b in padded_batches(rows, 8)] == [5]       # one batch, 3 padding rows
  assert padded_batches(rows, 8)[0].tokens.shape == (8, 2)


def test_row_helpers():
  np.testing.assert_array_equal(pad_rows([[5, 6, 1], [7, 1]]), [[5, 6, 1], [7, 1, 0]])
  np.testing.assert_array_equal(pad_rows([[5, 6, 1]], 2), [[5, 6]])
  assert pad_rows([]).shape == (0, 1)
  np.testing.assert_array_equal(cycled_rows(np.array([[1], [2]]), 5)[:, 0], [1, 2, 1, 2, 1])
  # trailing pad columns go down to a bucket width (powers of two from 8, within the input)
  wide = np.zeros((2, 20), np.int32)
  wide[0, :2], wide[1, 0] = (5, 1), 7
  np.testing.assert_array_equal(trim_padding(wide), wide[:, :8])
  wide[1, 8] = 3
  np.testing.assert_array_equal(trim_padding(wide), wide[:, :16])
  np.testing.assert_array_equal(trim_padding(wide[:, :5]), wide[:, :5])   # never past it


# ----------------------------------------------------------------------------- dispatch


@pytest.mark.slow
def test_methods_run_the_library_functions(pair, inputs):
  target, drafter = pair
  key = jax.random.PRNGKey(3)
  sampling = sd.Sampling(temperature=0.8, top_k=20)
  cases = [
      (methods.Run(sd.Autoregressive(), sampling),
       sd.generate(target, inputs, max_new_tokens=MAX_NEW, sampling=sampling, rng=key)),
      (methods.Run(sd.Speculative(drafter, gamma=2, lenience=0.5), sampling),
       sd.speculative_generate(target, drafter, inputs, gamma=2, max_new_tokens=MAX_NEW,
                               sampling=sampling, rng=key, lenience=0.5)),
  ]
  for method, expected in cases:
    out = method.decode(target, inputs, max_new_tokens=MAX_NEW, rng=key)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(expected.tokens))
    assert dict(out.info) == dict(expected.info)
  # batch 0 of a corpus decodes with the key itself: one batch is exactly one call
  method, expected = cases[0]
  corpus = methods.decode_corpus(method, target, [Batch(inputs, len(inputs))],
                                 max_new_tokens=MAX_NEW, rng=key)
  np.testing.assert_array_equal(corpus.tokens(), np.asarray(expected.tokens))


def test_run_settings_and_description(pair):
  _, drafter = pair
  spec = methods.Run(sd.Speculative(drafter, gamma=4, adaptive=True), label="ngram")
  settings = spec.settings()
  assert settings == {"method": "speculative", "label": "ngram", "sampling": "Greedy()",
                      "exact": None, "gamma": 4, "lenience": 1.0, "adaptive": True}
  json.dumps(settings)   # JSON-friendly: the drafter object is left out
  assert spec.describe() == "speculative drafter=ngram gamma=4 adaptive=True, greedy"
  alone = methods.Run(sd.Autoregressive())
  assert alone.describe() == "autoregressive, greedy" and alone.kind == "autoregressive"
  assert methods.Run(sd.Autoregressive(), sd.Sampling()).settings()["method"] == "autoregressive"
  assert methods.Run(sd.Autoregressive(exact=False)).settings()["exact"] is False
  never = methods.Run(sd.BiLD(None, rollback_threshold=float("inf")))   # JSON has no inf
  assert never.settings()["rollback_threshold"] is None
  assert spec.method.drafter_role == "drafter" and alone.method.drafter_role is None
  with pytest.raises(TypeError, match="a method value"):
    methods.Run("speculative")
  with pytest.raises(sd.SamplingError, match="deterministic"):
    methods.Run(sd.Beam(), sd.Sampling())


def test_a_new_method_is_one_value(pair, inputs):
  """A method the library does not know (here: speculative decoding whose drafter is
  always prompt lookup) is one value class; runs, corpora and the aggregator take it
  unchanged, and it names and describes itself."""
  from flax import struct

  from specdec_jax import methods as core
  target, _ = pair

  @struct.dataclass
  class PromptLookup(core.Speculative):
    """Speculative decoding drafting by prompt lookup.

    Attributes:
      ngram: unused here, shows in the description.
    """

    name: ClassVar[str] = "prompt-lookup"
    ngram: int = core.setting(3)

    def proposer(self, target, sampling):
      return core.Speculative(sd.PromptLookupDrafter(target.config.vocab_size),
                              gamma=self.gamma).proposer(target, sampling)

  run = methods.Run(PromptLookup(None, gamma=2, ngram=2))
  corpus = methods.decode_corpus(run, target, padded_batches(inputs, 2), max_new_tokens=MAX_NEW)
  baseline = methods.decode_corpus(methods.Run(sd.Autoregressive()), target,
                                   padded_batches(inputs, 2), max_new_tokens=MAX_NEW)
  assert corpus.token_rows() == baseline.token_rows()          # greedy: exact
  assert int(corpus.stats["drafted"]) > 0 and corpus.stats["method"] == "prompt-lookup"
  assert run.settings()["method"] == "prompt-lookup" and run.settings()["ngram"] == 2
  assert run.describe() == "prompt-lookup gamma=2 ngram=2, greedy"


# ----------------------------------------------------------------------------- options


def test_make_sampling():
  assert sampling_lib.make_sampling() == sd.Greedy()
  assert sampling_lib.make_sampling("greedy") == sd.Greedy()
  assert sampling_lib.make_sampling("sample") == sd.Sampling(temperature=1.0)
  assert sampling_lib.make_sampling(None, temperature=0.7) == sd.Sampling(temperature=0.7)
  assert sampling_lib.make_sampling("sample", top_k=5, top_p=0.9) == sd.Sampling(top_k=5, top_p=0.9)
  with pytest.raises(errors.SamplingError, match="--temperature only apply with --method sample"):
    sampling_lib.make_sampling("greedy", temperature=0.5)
  with pytest.raises(errors.SamplingError, match="sampling method must be one of"):
    sampling_lib.make_sampling("beam")
  with pytest.raises(sd.SamplingError):
    sampling_lib.make_sampling("sample", top_p=0.0)


def test_int_list_overrides_and_modes():
  import argparse
  assert options.int_list("1-3,8") == [1, 2, 3, 8]
  assert options.parse_overrides("vocab_size=300, name=x,") == {"vocab_size": 300, "name": "x"}
  assert options.mode_list("sample,greedy,sample") == ["sample", "greedy"]
  with pytest.raises(FlagError, match="KEY=VALUE"):
    options.parse_overrides("vocab_size")
  with pytest.raises(argparse.ArgumentTypeError):
    options.mode_list("beam")
  with pytest.raises(FlagError, match="--batch-size must be an integer >= 1, got 0"):
    options.check_at_least_one(gamma=None, batch_size=0)


@pytest.mark.slow
def test_resolve_drafter_names(pair):
  target, drafter = pair
  assert models.resolve_drafter(None, target) is None
  assert isinstance(models.resolve_drafter(drafter, target), sd.ModelDrafter)
  assert isinstance(models.resolve_drafter("prompt-lookup", target), sd.PromptLookupDrafter)
  rows = np.array([[5, 17, 42, 1, 0]])
  calls = []
  ngram = models.resolve_drafter("ngram", target, ngram_rows=lambda: calls.append(1) or rows)
  assert isinstance(ngram, sd.NGramDrafter) and calls == [1]
  assert int(np.argmax(ngram.logits_after(np.asarray([17]))[0])) == 42
  loaded = models.resolve_drafter("config:t5_1_1_tiny_drafter", target, load=models.load_model)
  assert isinstance(loaded, sd.ModelDrafter)
  with pytest.raises(errors.InputError, match="drafter must be"):
    models.resolve_drafter("some/path", target)            # no loader: names only
  with pytest.raises(errors.InputError, match="token rows"):
    models.resolve_drafter("ngram", target)
  with pytest.raises(sd.InputError, match="vocabulary mismatch"):
    models.resolve_drafter(sd.PromptLookupDrafter(vocab_size=100), target)


def test_config_models_compute_in_the_requested_dtype():
  # `--dtype bfloat16` on a config: model (bench's xxl-small preset) means what sd.load's
  # dtype means: params AND activations, drawn straight in bfloat16. Casting the params
  # of a float32 init left the activations in float32 (and built XXL in float32 first).
  f32 = models.load_model("config:t5_1_1_tiny")
  bf16 = models.load_model("config:t5_1_1_tiny", "bfloat16")
  assert f32.config.dtype == "float32" and bf16.config.dtype == "bfloat16"
  floats = lambda m: {str(x.dtype) for x in jax.tree_util.tree_leaves(m.params)}
  assert floats(f32) == {"float32"} and floats(bf16) == {"bfloat16"}
  assert bf16.config.replace(dtype="float32") == f32.config


# ----------------------------------------------------------------------------- timing, files


def test_time_rounds_rotates_the_order():
  calls = []
  methods_ = {name: (lambda name=name: calls.append(name) or name) for name in "abc"}
  timed = timing.time_rounds(methods_, repeats=4)
  assert calls == list("abc" "bca" "cab" "abc")
  for name, t in timed.items():
    assert len(t["times_s"]) == 4 and t["output"] == name
    assert t["median_s"] == statistics.median(t["times_s"])


def test_atomic_writes_and_file_errors(tmp_path):
  path = tmp_path / "deep" / "out.json"
  report.write_json(path, {"a": np.float32(1.5), "b": np.arange(2), "c": float("nan")})
  assert json.loads(path.read_text()) == {"a": 1.5, "b": [0, 1], "c": None}
  assert not (tmp_path / "deep" / "out.json.tmp").exists()
  with pytest.raises(errors.FileAccessError, match=r"prompt file '.*nope.txt': No such file"):
    report.read_text(tmp_path / "nope.txt", "prompt file")
  (tmp_path / "bad.json").write_text("{")
  with pytest.raises(errors.FileAccessError, match="not valid JSON"):
    report.read_json(tmp_path / "bad.json", "recipe")
  (tmp_path / "file").write_text("")
  with pytest.raises(errors.FileAccessError, match="file"):
    report.atomic_write(tmp_path / "file" / "x.md", "text")   # a file where a dir must be


def test_every_tool_error_is_a_specdec_error():
  """Each of the library's errors, and the flags', is an `sd.SpecdecError` and a
  ValueError (the lab's: its tests/test_lab_common.py); the tools' errors are not the
  library's."""
  from specdec_jax.runtime import distributed
  classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
             if c.__module__ == errors.__name__ and not issubclass(c, Warning)]
  assert len(classes) >= 8
  assert not {"ToolError", "CLIError", "OptionError", "BenchError"} & set(vars(errors))
  classes += [FlagError, distributed.CoordinatorError]
  assert issubclass(errors.InputWarning, UserWarning)     # the one warning: not an error
  for cls in classes:
    assert issubclass(cls, sd.SpecdecError), cls
    assert cls is sd.SpecdecError or issubclass(cls, ValueError), cls
