"""Autoregressive baseline and the T5X-compatible temperature_sample, against T5X's outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import compiles, peaked, ragged_tokens

import specdec_jax as sd
from specdec_jax.methods import t5x_compat


def test_generate_reproduces_t5x_greedy(t5x_model, t5x_reference):
  out = sd.generate(t5x_model, t5x_reference["encoder_input_tokens"], max_new_tokens=10)
  np.testing.assert_array_equal(out.tokens, t5x_reference["greedy_tokens"])
  np.testing.assert_array_equal(out.lengths, [5, 4, 10])   # EOS counted, 0 after it


def test_generate_without_eos_reproduces_t5x(t5x_model, t5x_reference):
  out = sd.generate(t5x_model, t5x_reference["encoder_input_tokens"], 10, eos_id=-1)
  np.testing.assert_array_equal(out.tokens, t5x_reference["greedy_tokens_noeos"])


def _t5x_call(model, reference, **kwargs):
  enc = jnp.asarray(reference["encoder_input_tokens"])
  cache = model.start(enc, capacity=10)
  fn = jax.jit(lambda c: t5x_compat.temperature_sample(
      jnp.zeros((3, 10), jnp.int32), c, t5x_compat.tokens_to_logits_for(model), **kwargs))
  return fn(cache)


@pytest.mark.parametrize("eos_id,key", [(1, "greedy_tokens"), (-1, "greedy_tokens_noeos")])
def test_t5x_compat_greedy_matches_fixture(t5x_model, t5x_reference, eos_id, key):
  seqs, scores = _t5x_call(t5x_model, t5x_reference, eos_id=eos_id, temperature=0.0)
  assert seqs.shape == (3, 1, 10) and scores.shape == (3, 1)
  np.testing.assert_array_equal(seqs[:, 0], t5x_reference[key])
  np.testing.assert_array_equal(scores[:, 0], t5x_reference["greedy_scores_default"])
  _, raw = _t5x_call(t5x_model, t5x_reference, eos_id=eos_id, temperature=0.0,
                     rescale_log_probs=False)
  suffix = "" if eos_id == 1 else "_noeos"
  np.testing.assert_allclose(raw[:, 0], t5x_reference["greedy_logprobs" + suffix], rtol=1e-5)


def test_t5x_compat_sampling_matches_fixture_rng_stream(t5x_model, t5x_reference):
  """Same PRNG key and split pattern as T5X: identical samples (JAX threefry-specific)."""
  key = jnp.asarray(t5x_reference["sample_rng_key"], jnp.uint32)
  seqs, logp = _t5x_call(t5x_model, t5x_reference, eos_id=1, temperature=1.0, topk=0,
                         decode_rng=key, rescale_log_probs=False)
  np.testing.assert_array_equal(seqs[:, 0], t5x_reference["sample_tokens"])
  np.testing.assert_allclose(logp[:, 0], t5x_reference["sample_logprobs"], rtol=1e-5)


@pytest.mark.slow
def test_t5x_compat_forced_prompt_and_num_decodes(t5x_model, t5x_reference):
  enc = jnp.asarray(t5x_reference["encoder_input_tokens"])
  inputs = jnp.zeros((3, 10), jnp.int32).at[:, 1].set(7).at[0, 2].set(1)
  cache = t5x_model.start(enc, capacity=10)
  seqs, logp = t5x_compat.temperature_sample(
      inputs, cache, t5x_compat.tokens_to_logits_for(t5x_model), eos_id=1, temperature=1.0,
      topk=0, num_decodes=4, decode_rng=jax.random.PRNGKey(0))
  assert seqs.shape == (3, 4, 10)
  np.testing.assert_array_equal(seqs[:, :, 0], 7)           # forced token kept
  np.testing.assert_array_equal(seqs[0, :, 1], 1)           # forced EOS does not end the row
  assert np.all(np.diff(np.asarray(logp), axis=1) >= 0)     # ascending: best last
  # Teacher-forced tokens must agree with a full forward pass over the same sequence.
  best = np.asarray(seqs[:, -1])
  dec_in = np.concatenate([np.zeros((3, 1), np.int32), best[:, :-1]], 1)
  logits = np.asarray(t5x_model.forward(np.asarray(enc), dec_in))
  lp = np.asarray(jax.nn.log_softmax(logits, -1))
  expected = []
  for b in range(3):
    total, forced = 0.0, 2 if b == 0 else 1          # forced positions add no log-prob
    for t in range(forced, 10):
      total += lp[b, t, best[b, t]]
      if best[b, t] == 1:
        break
    expected.append(total)
  got = np.asarray(logp[:, -1])
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_t5x_compat_rejects_topk_and_topp(t5x_model, t5x_reference):
  with pytest.raises(ValueError, match="At most one of `topp` or `topk`"):
    _t5x_call(t5x_model, t5x_reference, eos_id=1, topk=4, topp=0.9)


def test_t5x_compat_max_decode_steps(t5x_model, t5x_reference):
  seqs, _ = _t5x_call(t5x_model, t5x_reference, eos_id=-1, temperature=0.0, max_decode_steps=3)
  np.testing.assert_array_equal(seqs[:, 0, :3], t5x_reference["greedy_tokens_noeos"][:, :3])
  np.testing.assert_array_equal(seqs[:, 0, 3:], 0)


@pytest.mark.slow
def test_generate_ragged_batch_equals_rows_alone():
  model = peaked(sd.init_model(sd.get_config("t5_1_1_tiny"), 1))
  enc = ragged_tokens(4, 11, model.vocab_size, seed=2)
  batched = sd.generate(model, enc, 12)
  for b in range(4):
    alone = sd.generate(model, enc[b:b + 1, :int((enc[b] > 0).sum())], 12)
    np.testing.assert_array_equal(batched.tokens[b], alone.tokens[0])
    assert int(batched.lengths[b]) == int(alone.lengths[0])


def test_greedy_matches_teacher_forced_argmax(t5x_model, t5x_reference):
  out = sd.generate(t5x_model, t5x_reference["encoder_input_tokens"], 10, eos_id=-1)
  dec_in = np.concatenate([np.zeros((3, 1), np.int32), np.asarray(out.tokens)[:, :-1]], 1)
  logits = t5x_model.forward(t5x_reference["encoder_input_tokens"], dec_in)
  np.testing.assert_array_equal(np.argmax(logits, -1), out.tokens)


@pytest.mark.slow
def test_sampling_is_seeded_and_respects_top_k():
  model = sd.init_model(sd.get_config("t5_1_1_tiny"), 0)
  enc = ragged_tokens(8, 6, model.vocab_size)
  method = sd.Sampling(temperature=1.0, top_k=2)
  a = sd.generate(model, enc, 6, sampling=method, rng=jax.random.PRNGKey(5), eos_id=-1)
  b = sd.generate(model, enc, 6, sampling=method, rng=jax.random.PRNGKey(5), eos_id=-1)
  c = sd.generate(model, enc, 6, sampling=method, rng=jax.random.PRNGKey(6), eos_id=-1)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert not np.array_equal(a.tokens, c.tokens)
  dec_in = np.concatenate([np.zeros((8, 1), np.int32), np.asarray(a.tokens)[:, :-1]], 1)
  top2 = np.argsort(-np.asarray(model.forward(enc, dec_in)), -1)[..., :2]
  assert np.all((top2 == np.asarray(a.tokens)[..., None]).any(-1))


@pytest.mark.slow
def test_no_recompilation_for_new_prompt_contents():
  model = sd.init_model(sd.get_config("t5_1_1_tiny"), 0)
  enc = ragged_tokens(2, 7, model.vocab_size, seed=0)
  sd.generate(model, enc, 5)
  with compiles() as programs:
    for seed in (1, 2, 3):
      sd.generate(model, ragged_tokens(2, 7, model.vocab_size, seed=seed), 5)
  assert programs == []
  with compiles() as programs:       # a new shape: the decode program again, nothing else
    sd.generate(model, ragged_tokens(2, 8, model.vocab_size), 5)
  assert programs == ["jit(_run)"]


def test_bad_inputs_give_clear_errors():
  model = sd.init_model(sd.get_config("t5_1_1_tiny"), 0)
  with pytest.raises(sd.InputError, match="2-D"):
    sd.generate(model, np.array([1, 2, 3], np.int32), 4)
  with pytest.raises(sd.InputError, match="integer token ids"):
    sd.generate(model, np.ones((1, 3), np.float32), 4)
  with pytest.raises(sd.InputError, match="outside"):
    sd.generate(model, np.array([[5, 600]], np.int32), 4)
  with pytest.raises(sd.InputError, match="max_new_tokens"):
    sd.generate(model, np.array([[5, 1]], np.int32), 0)
  limited = sd.Model(model.config.replace(max_encoder_length=4), model.params)
  with pytest.raises(sd.InputError, match="longer than the model allows"):
    sd.generate(limited, np.ones((1, 6), np.int32), 4)
