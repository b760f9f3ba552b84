"""Settings are checked where they are made: every bad method setting, rule, engine config,
adaptive policy, request and drafter input raises its SpecdecError naming the problem."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import errors, testing
from specdec_jax.drafters import as_drafter, as_proposer
from specdec_jax.rounds import engine, requests, stats
from specdec_jax.rounds.acceptance import Rollback, SpeculativeSampling

pytestmark = pytest.mark.unit

CONFIG = sd.get_config("t5_1_1_tiny")        # a config only: no weights are made


@pytest.mark.parametrize("make, message", [
    (lambda: sd.Speculative(None, gamma=0), "gamma must be an integer >= 1"),
    (lambda: sd.Speculative(None, gamma=2.5), "gamma must be an integer >= 1"),
    (lambda: sd.Speculative(None, lenience=0.0), r"lenience must be in \(0, 1\]"),
    (lambda: sd.Speculative(None, adaptive="yes"), "adaptive must be"),
    (lambda: sd.Speculative(None, accept=3), "accept must be an acceptance rule"),
    (lambda: sd.Autoregressive(exact="on"), "exact must be True, False or None"),
    (lambda: sd.BiLD(None, fallback_threshold=1.5), r"fallback_threshold must be in \[0, 1\]"),
    (lambda: sd.BiLD(None, rollback_threshold=0.0), "rollback_threshold must be > 0"),
    (lambda: sd.BiLD(None, rollback_threshold=float("nan")), "rollback_threshold must be > 0"),
    (lambda: sd.BiLD(None, max_small_steps=0), "max_small_steps must be an integer >= 1"),
    (lambda: sd.BiLD(None, batch_policy="later"), "batch_policy must be one of"),
    (lambda: sd.Blockwise(None, top_k=0), "top_k must be an integer >= 1"),
    (lambda: sd.Blockwise(None, num_drafts=0), "num_drafts must be an integer >= 1"),
    (lambda: sd.Blockwise(None, rescoring="beam"), "rescoring must be one of"),
    (lambda: sd.Blockwise(None, rescoring="ngram"), "needs a rescorer"),
    (lambda: sd.Blockwise(None, rescoring="neural", rescorer=1, num_drafts=2),
     "neural rescoring builds one draft"),
    (lambda: sd.Blockwise(None, oracle="yes"), "oracle must be True or False"),
])
def test_bad_settings_fail_when_the_value_is_made(make, message):
  with pytest.raises(sd.InputError, match=message):
    make()


@pytest.mark.parametrize("make, message", [
    (lambda: SpeculativeSampling(lenience=0.0), r"lenience must be in \(0, 1\]"),
    (lambda: SpeculativeSampling(lenience=1.5), r"lenience must be in \(0, 1\]"),
    (lambda: Rollback(0.0), "rollback_threshold must be > 0"),
    (lambda: Rollback(float("nan")), "rollback_threshold must be > 0"),
    (lambda: Rollback("2"), "rollback_threshold must be > 0"),
    (lambda: engine.RoundConfig(max_new_tokens=4, max_proposals=-1),
     "max_proposals must be >= 0"),
    (lambda: engine.RoundConfig(max_new_tokens=4, max_proposals=16, call_width=16),
     "exact mode verifies at most 15 proposals per call; this run needs 16"),
    (lambda: sd.AdaptiveGamma(decay=1.0), r"decay must be in \[0, 1\)"),
    (lambda: sd.AdaptiveGamma(c=-0.1), "c must be >= 0"),
    (lambda: sd.AdaptiveGamma(verify_cost=(1.0, 0.0)), "verify_cost must be a tuple"),
    (lambda: requests.check_positive_int(True, "gamma"), "gamma must be an integer >= 1"),
    (lambda: requests.check_positive_int("3", "gamma"), "gamma must be an integer >= 1"),
    (lambda: requests.resolve_eos(True, CONFIG), "eos_id must be an integer token id"),
    (lambda: requests.resolve_eos(512, CONFIG), r"eos_id=512 is outside the vocabulary"),
    (lambda: requests.as_rng(None, sd.Sampling()), "needs rng"),
    (lambda: requests.as_rng("seed"), "rng must be an int seed or a PRNG key"),
    (lambda: requests.as_rng(jax.random.split(jax.random.key(0), 3)), "one key per row"),
    (lambda: requests.as_rng(np.zeros((3,), np.uint32)), "rng must be an int seed or one"),
    (lambda: requests.as_token_array([[5, 6], [7]], "inputs"), "ragged list"),
    (lambda: requests.as_token_array([[5.5, 6.0]], "inputs"), "integer token ids"),
    (lambda: requests.as_token_array([5, 6], "inputs"), "must be 2-D"),
    (lambda: requests.check_request([[0, 0, 0], [5, 1, 0]], CONFIG, 4),
     "inputs row 0 holds nothing but padding"),
    (lambda: requests.check_request([[5, 1]], CONFIG, 0), "max_new_tokens must be an integer"),
    (lambda: requests.check_request([[5, 1]], CONFIG, 10**12), "needs a decoder cache of"),
    (lambda: requests.check_heads_value(object()), "heads must be prediction heads"),
    (lambda: sd.NGramDrafter.fit([[3, 9]], vocab_size=8), r"ids outside \[0, 8\)"),
    (lambda: as_drafter(object(), testing.TableModel(jnp.zeros((8, 8)))), "not a drafter"),
    (lambda: as_proposer(testing.table_drafter(jnp.zeros((5, 5))),
                         testing.TableModel(jnp.zeros((8, 8)))),
     "vocabulary mismatch: drafter has vocab_size 5, target has 8"),
    (lambda: stats.merge([]), "needs at least one part"),
    (lambda: stats.merge([(stats.DecodeStats.zeros(2, 3), 3)]), "3 real rows in a part of 2"),
    (lambda: jax.jit(lambda s: stats.summarize(s)["tokens"])(stats.DecodeStats.zeros(1, 1)),
     "inside jax.jit use"),
])
def test_bad_values_are_refused_where_they_are_made(make, message):
  with pytest.raises(errors.SpecdecError, match=message) as info:
    make()
  assert isinstance(info.value, ValueError)       # what callers caught before the base class


def test_every_error_class_is_a_specdec_error_and_a_value_error():
  classes = [c for c in vars(errors).values()
             if isinstance(c, type) and issubclass(c, Exception) and c is not errors.SpecdecError
             and not issubclass(c, Warning)]     # sd.InputWarning: a warning, not an error
  assert len(classes) >= 5
  for cls in classes:
    assert issubclass(cls, errors.SpecdecError) and issubclass(cls, ValueError), cls


def test_adaptive_gamma_follows_theory():
  rule = sd.AdaptiveGamma(c=0.05)
  alphas = np.array([0.1, 0.6, 0.8, 0.95], np.float32)
  got = np.asarray(rule.choose(jax.numpy.asarray(alphas), 10))
  want = [sd.theory.optimal_gamma(float(a), 0.05, max_gamma=10)[0] for a in alphas]
  np.testing.assert_array_equal(got, want)


def test_adaptive_gamma_with_measured_verify_costs():
  """With dear wide verify calls the policy picks a smaller gamma than Theorem 8's, and
  exactly the gamma `theory.walltime_improvement_measured` ranks first."""
  v = (1.1, 1.4, 1.9, 2.5, 3.0)
  rule = sd.AdaptiveGamma(c=0.05, verify_cost=v)
  for alpha in (0.3, 0.6, 0.8, 0.95):
    want = 1 + int(np.argmax([sd.theory.walltime_improvement_measured(alpha, g, 0.05, v[g - 1])
                              for g in range(1, 6)]))
    assert rule.gammas([alpha], 5) == [want]
  assert rule.gammas([0.8], 5)[0] < sd.AdaptiveGamma(c=0.05).gammas([0.8], 5)[0]
  assert sd.AdaptiveGamma(c=0.05, verify_cost=(1.0,)).gammas([0.8], 8) == \
      sd.AdaptiveGamma(c=0.05).gammas([0.8], 8)           # a constant 1 is Theorem 8
  with pytest.raises(sd.InputError, match="verify_cost"):
    sd.AdaptiveGamma(verify_cost=(1.0, 0.0))

