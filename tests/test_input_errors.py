"""Inputs a new user gets wrong: each raises a specific error that names the problem,
before anything is traced (the engine is never reached)."""

import json

import jax
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax.io import checkpoints as ckpt
from specdec_jax.rounds import engine, requests

ENC = np.array([[5, 17, 42, 1], [7, 8, 1, 0]], np.int32)


@pytest.fixture(scope="module")
def model():
  return sd.load("config:t5_1_1_tiny")


@pytest.fixture
def no_trace(monkeypatch):
  """Fail the test if a decode reaches the jitted engine: the error must come first."""
  def reached(*args, **kwargs):
    raise AssertionError("the request reached engine.run: checked too late")
  monkeypatch.setattr(engine, "run", reached)


@pytest.mark.slow
def test_sampling_without_rng_is_an_error_naming_rng(model, no_trace):
  with pytest.raises(sd.InputError, match=r"needs rng"):
    sd.generate(model, ENC, 4, sampling=sd.Sampling(temperature=1.0))
  with pytest.raises(sd.InputError, match=r"needs rng"):
    sd.speculative_generate(model, model, ENC, gamma=2, max_new_tokens=4,
                            sampling=sd.Sampling(top_p=0.9))
  with pytest.raises(sd.InputError, match=r"needs rng"):
    sd.bild_generate(model, model, ENC, max_new_tokens=4, sampling=sd.Sampling(top_p=0.8))


@pytest.mark.slow
def test_greedy_needs_no_rng_and_samples_differ_by_key(model):
  assert sd.generate(model, ENC, 4).tokens.shape == (2, 4)          # greedy: rng optional
  s = sd.Sampling(temperature=1.0)
  a = sd.generate(model, ENC, 8, sampling=s, rng=1, eos_id=-1).tokens
  b = sd.generate(model, ENC, 8, sampling=s, rng=2, eos_id=-1).tokens
  assert not np.array_equal(a, b)


@pytest.mark.parametrize("rng, problem", [
    ("seed", r"int seed or a PRNG key.*str"),
    (1.5, r"int seed or a PRNG key.*float"),
    (np.zeros((2, 2), np.uint32), r"shape \(2, 2\): one key per row"),
    (np.zeros((3,), np.uint32), r"one PRNG key"),
])
def test_bad_rng_is_explained(model, no_trace, rng, problem):
  with pytest.raises(sd.InputError, match=problem):
    sd.generate(model, ENC, 4, sampling=sd.Sampling(), rng=rng)


def test_one_typed_key_per_row_is_explained(model, no_trace):
  keys = jax.random.split(jax.random.key(0), 2)
  with pytest.raises(sd.InputError, match=r"one key per row"):
    sd.generate(model, ENC, 4, sampling=sd.Sampling(), rng=keys)


def test_typed_and_raw_keys_are_accepted():
  assert requests.as_rng(jax.random.key(3), sd.Sampling()).shape == ()
  assert requests.as_rng(jax.random.PRNGKey(3), sd.Sampling()).shape == (2,)


@pytest.mark.parametrize("rows, which", [
    ([[5, 17, 42, 1], [0, 0, 0, 0]], r"row 1 holds nothing but padding"),
    ([[0, 0], [0, 0]], r"rows 0, 1 hold nothing but padding"),
])
def test_rows_of_padding_alone_are_refused_naming_the_row(model, no_trace, rows, which):
  with pytest.raises(sd.InputError, match=which):
    sd.generate(model, np.array(rows, np.int32), 4)


@pytest.mark.slow
def test_the_empty_sentence_decodes_as_its_own_row(model):
  """EOS alone (the tokenizer's empty text) decodes, as it does alone in its batch."""
  both = sd.generate(model, np.array([[1, 0, 0], [5, 6, 1]], np.int32), 4)
  alone = sd.generate(model, np.array([[1, 0, 0]], np.int32), 4)
  assert np.asarray(both.tokens)[0].tolist() == np.asarray(alone.tokens)[0].tolist()


def test_eos_outside_the_vocabulary(model, no_trace):
  v = model.config.vocab_size
  with pytest.raises(sd.InputError, match=rf"eos_id={v + 3} is outside the vocabulary"):
    sd.generate(model, ENC, 4, eos_id=v + 3)
  with pytest.raises(sd.InputError, match=r"eos_id must be an integer"):
    sd.speculative_generate(model, model, ENC, gamma=2, max_new_tokens=4, eos_id="1")


def test_eos_minus_one_still_disables_stopping(model):
  out = sd.generate(model, ENC, 5, eos_id=-1)
  assert np.asarray(out.lengths).tolist() == [5, 5]


def test_absurd_max_new_tokens_fails_before_allocation(no_trace):
  target = sd.load("demo-de-en/target")
  enc = np.tile(ENC, (32, 1))
  with pytest.raises(sd.InputError, match=r"max_new_tokens=10000000 needs a decoder cache of "
                                          r"[0-9.]+ GiB .*more than the device's"):
    sd.generate(target, enc, 10_000_000)


def test_nested_lists_of_ids(model):
  listed = sd.generate(model, ENC.tolist(), 4)
  np.testing.assert_array_equal(listed.tokens, sd.generate(model, ENC, 4).tokens)


def test_ragged_nested_list_is_refused(model, no_trace):
  with pytest.raises(sd.InputError, match=r"ragged list \(row lengths \[3, 2\]\).*right-pad"):
    sd.generate(model, [[5, 6, 1], [7, 1]], 4)


def test_blockwise_given_a_model_instead_of_heads(model, no_trace):
  with pytest.raises(sd.InputError, match=r"heads is a Model.*second argument"):
    sd.blockwise_generate(model, model, ENC, max_new_tokens=4)


def test_save_with_swapped_arguments(model, tmp_path):
  with pytest.raises(sd.InputError, match=r"takes \(path, model\)"):
    sd.save(model, str(tmp_path / "out"))
  with pytest.raises(sd.InputError, match=r"takes \(path, model\)"):
    sd.save(model, tmp_path / "out")
  assert not (tmp_path / "out").exists()


def test_save_into_a_hugging_face_dir_is_refused(model, tmp_path):
  hf_dir = tmp_path / "hf"
  ckpt.export_hf(hf_dir, model.config, model.params)
  before = sorted(p.name for p in hf_dir.iterdir())
  with pytest.raises(sd.CheckpointError, match=r"already holds a checkpoint of hf format "
                                               r".*config\.json"):
    sd.save(hf_dir, model)
  assert sorted(p.name for p in hf_dir.iterdir()) == before    # nothing written
  (tmp_path / "t5x").mkdir()
  (tmp_path / "t5x" / "checkpoint").write_bytes(b"")
  with pytest.raises(sd.CheckpointError, match=r"t5x_legacy.*checkpoint"):
    sd.save(tmp_path / "t5x", model)


def test_save_over_our_own_dir_still_overwrites(model, tmp_path):
  sd.save(tmp_path / "own", model)
  sd.save(tmp_path / "own", model, dtype="bfloat16")
  assert json.loads((tmp_path / "own" / "specdec_config.json").read_text())["dtype"] == "bfloat16"


