"""Speculative decoding: greedy equivalence with the baseline, statistics, errors, compiles."""

import jax
import numpy as np
import pytest
from helpers import compiles, perturbed, ragged_tokens, tiny_target, workload_fixtures

import specdec_jax as sd

MAX_NEW = 11   # not a multiple of gamma + 1 for the gammas here (3 to 6)


target, inputs, baseline = workload_fixtures(MAX_NEW)


@pytest.mark.slow
def test_close_drafter_accepts_more_than_unrelated_one(target, inputs):
  close_model = perturbed(target, 0.05, seed=0)                 # agrees often, not always
  other_model = sd.init_model(sd.get_config("t5_1_1_tiny_drafter"), 2)
  close = sd.speculative_generate(target, close_model, inputs, gamma=3,
                                  max_new_tokens=MAX_NEW)
  other = sd.speculative_generate(target, other_model, inputs, gamma=3,
                                  max_new_tokens=MAX_NEW)
  assert float(close.stats["acceptance_rate"]) > float(other.stats["acceptance_rate"]) + 0.2
  assert float(close.stats["tokens_per_target_call"]) > 1.5
  assert float(close.stats["alpha"]) > float(other.stats["alpha"])


def test_stats_are_consistent(target, inputs, baseline):
  out = sd.speculative_generate(target, perturbed(target, 0.05, seed=0), inputs,
                                gamma=3, max_new_tokens=MAX_NEW)
  s = {k: np.asarray(v) for k, v in out.stats.items()}
  assert s["accepted"] == np.asarray(out.counters.accepted).sum()
  assert s["drafted"] == np.asarray(out.counters.drafted).sum()
  np.testing.assert_allclose(s["acceptance_rate"], s["accepted"] / s["drafted"], rtol=1e-6)
  np.testing.assert_allclose(s["tokens_per_target_call"],
                             np.asarray(out.lengths).sum() / s["target_calls"], rtol=1e-6)
  # per-position counts are non-increasing (draft i+1 only counts if draft i was accepted)
  assert np.all(np.diff(s["per_position_accepted"]) <= 0)
  assert s["per_position_accepted"].sum() == s["accepted"]
  assert len(s["per_position_accepted"]) == 3                # one count per draft position
  assert s["drafter_calls"] >= s["drafted"] // 3 and not s["lossy"]
  assert 0.0 <= float(s["alpha"]) <= 1.0


def test_drafts_past_an_emitted_eos_are_not_counted(target, inputs, baseline):
  """The drafter is the target: it drafts on past its own EOS and the rule accepts it all,
  but the sentence ends at the EOS (`buffer.emit` drops what follows), so the counters must
  drop it too: in a row that ended at an EOS every accepted draft is an emitted token."""
  out = sd.speculative_generate(target, target, inputs, gamma=5,
                                max_new_tokens=MAX_NEW)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(baseline.tokens))
  c = jax.tree_util.tree_map(np.asarray, out.counters)
  lengths = np.asarray(out.lengths)
  ended = lengths < MAX_NEW        # rows whose sentence ended at an EOS (not at the cap)
  assert ended.sum() >= 2
  # emitted = accepted drafts + one target token per round that did not end in a draft's EOS
  assert np.all(c.accepted[ended] <= lengths[ended])
  assert np.all(c.accepted + c.target_calls >= lengths)
  assert np.all(c.drafter_tokens[ended] == c.accepted[ended])
  assert np.all(c.beta_count[ended] <= lengths[ended])       # scored only along the sentence
  assert float(out.stats["alpha"]) == 1.0 and int(out.stats["rejections"]) == 0


def test_ngram_drafter_costs_no_model_calls_and_helps(target, inputs, baseline):
  """A token-level drafter: the baseline's tokens, more than one per target call (prompt
  lookup's: test_prompt_lookup_copies_from_input; a model drafter's: tests/test_exact.py)."""
  ngram = sd.NGramDrafter.fit(np.asarray(baseline.tokens), 512)
  out = sd.speculative_generate(target, ngram, inputs, gamma=4, max_new_tokens=MAX_NEW)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  np.testing.assert_array_equal(out.lengths, baseline.lengths)
  assert float(out.stats["tokens_per_target_call"]) > 1.5   # fitted on the target's outputs


@pytest.mark.slow
def test_prompt_lookup_copies_from_input():
  """A target that copies its input is predicted perfectly by prompt lookup."""
  target = tiny_target(6.0, 3.0)
  base = sd.generate(target, ragged_tokens(2, 12, 512, seed=3), 10, eos_id=-1)
  enc = np.concatenate([np.asarray(base.tokens), np.ones((2, 1), np.int32)], 1)
  drafter = sd.PromptLookupDrafter(vocab_size=512, max_ngram=2)
  # The continuation of each output is in its own input: once the first token is
  # emitted, every later draft copies the target's next token.
  out = sd.speculative_generate(target, drafter, ragged_tokens(2, 12, 512, seed=3), gamma=4,
                                max_new_tokens=10, eos_id=-1, drafter_inputs=enc)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  # (The first round has no emitted suffix to match: its drafts are all rejected.)
  assert float(out.stats["acceptance_rate"]) > 0.6
  assert float(out.stats["tokens_per_target_call"]) > 2.0
  # Without the copy source in the drafter's input nothing matches: acceptance ~ 0.
  blind = sd.speculative_generate(target, drafter, ragged_tokens(2, 12, 512, seed=3), gamma=4,
                                  max_new_tokens=10, eos_id=-1)
  np.testing.assert_array_equal(blind.tokens, base.tokens)
  assert float(blind.stats["acceptance_rate"]) < 0.2
  state = drafter.init(jax.numpy.asarray(enc), 8)
  seq = jax.numpy.zeros((2, 11), jax.numpy.int32).at[:, 1:].set(base.tokens)
  n = jax.numpy.array([3, 5])
  logits, state = drafter.first(state, seq, n)
  np.testing.assert_array_equal(np.argmax(logits, -1), np.asarray(base.tokens)[[0, 1], [3, 5]])


@pytest.mark.slow
def test_adaptive_gamma_shrinks_for_a_bad_drafter_and_keeps_greedy_equivalence(
    target, inputs, baseline):
  """An unrelated drafter: adaptive gamma drafts less, and its tokens are still the
  baseline's (a close drafter under the measured policy: the next test)."""
  bad = sd.init_model(sd.get_config("t5_1_1_tiny_drafter"), 2)
  fixed = sd.speculative_generate(target, bad, inputs, gamma=6, max_new_tokens=MAX_NEW)
  adaptive = sd.speculative_generate(target, bad, inputs, gamma=6,
                                     max_new_tokens=MAX_NEW, adaptive=sd.AdaptiveGamma(c=0.2))
  np.testing.assert_array_equal(adaptive.tokens, baseline.tokens)
  np.testing.assert_array_equal(adaptive.lengths, baseline.lengths)
  assert int(adaptive.stats["drafted"]) < int(fixed.stats["drafted"])
  assert int(adaptive.stats["drafter_calls"]) < int(fixed.stats["drafter_calls"])


@pytest.mark.slow
def test_measured_adaptive_gamma_keeps_greedy_equivalence(target, inputs, baseline):
  from specdec_jax.costs import measured_adaptive_gamma
  drafter = perturbed(target, 0.05, seed=0)
  policy = measured_adaptive_gamma(target, drafter, inputs, 4, capacity=16,
                                   repeats=1, steps=2)
  assert policy.c > 0 and len(policy.verify_cost) == 4 and min(policy.verify_cost) > 0
  out = sd.speculative_generate(target, drafter, inputs, gamma=4,
                                max_new_tokens=MAX_NEW, adaptive=policy)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)


@pytest.mark.slow
def test_lenience_is_labelled_lossy_and_accepts_more(target, inputs):
  drafter = perturbed(target, 0.1, seed=1)   # exact acceptance ~0.26
  exact = sd.speculative_generate(target, drafter, inputs, gamma=4,
                                  max_new_tokens=MAX_NEW)
  lenient = sd.speculative_generate(target, drafter, inputs, gamma=4,
                                    max_new_tokens=MAX_NEW, lenience=0.1)
  assert bool(lenient.stats["lossy"]) and not bool(exact.stats["lossy"])
  assert float(lenient.stats["acceptance_rate"]) > float(exact.stats["acceptance_rate"]) + 0.1
  # Lossy: the lenient greedy output is no longer the target's greedy output...
  assert not np.array_equal(np.asarray(lenient.tokens), np.asarray(exact.tokens))
  # ...and every token it accepted that the target would not have chosen was within
  # the lenience of the target's best (checked by a teacher-forced pass).
  tokens = np.asarray(lenient.tokens)
  dec_in = np.concatenate([np.zeros((tokens.shape[0], 1), np.int32), tokens[:, :-1]], 1)
  probs = np.asarray(jax.nn.softmax(target.forward(inputs, dec_in), -1))
  chosen = np.take_along_axis(probs, tokens[..., None], -1)[..., 0]
  live = np.arange(tokens.shape[1])[None] < np.asarray(lenient.lengths)[:, None]
  # A correction token after a rejection is the argmax; accepted drafts pass the lenience test.
  assert np.all(chosen[live] >= 0.1 * probs.max(-1)[live] - 1e-6)


@pytest.mark.slow
def test_no_recompilation_for_new_prompt_contents(target, baseline):
  drafter = perturbed(target, 0.05, seed=0)
  sd.speculative_generate(target, drafter, ragged_tokens(3, 9, 512, seed=0), gamma=2,
                          max_new_tokens=6)
  with compiles() as programs:
    for seed in (1, 2):
      sd.speculative_generate(target, drafter, ragged_tokens(3, 9, 512, seed=seed), gamma=2,
                              max_new_tokens=6)
  assert programs == []


@pytest.mark.slow
def test_bad_requests_give_clear_errors(target, inputs):
  drafter = sd.init_model(sd.get_config("t5_1_1_tiny_drafter"), 2)
  with pytest.raises(sd.InputError, match="gamma must be an integer >= 1"):
    sd.speculative_generate(target, drafter, inputs, gamma=0)
  other_vocab = sd.init_model(sd.get_config("t5_1_1_tiny_drafter").replace(vocab_size=300), 0)
  with pytest.raises(sd.InputError, match="vocabulary mismatch.*300.*512"):
    sd.speculative_generate(target, other_vocab, inputs, gamma=2)
  with pytest.raises(sd.InputError, match="vocabulary mismatch"):
    sd.speculative_generate(target, sd.PromptLookupDrafter(vocab_size=100), inputs)
  limited = sd.Model(target.config.replace(max_encoder_length=8), target.params)
  with pytest.raises(sd.InputError, match="longer than the model allows"):
    sd.speculative_generate(limited, drafter, inputs, gamma=2)
  with pytest.raises(sd.InputError, match="lenience"):
    sd.speculative_generate(target, drafter, inputs, lenience=0.0)
  with pytest.raises(sd.SamplingError, match="temperature"):
    sd.speculative_generate(target, drafter, inputs, sampling=sd.Sampling(-1.0))
