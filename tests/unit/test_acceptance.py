"""The acceptance rules on hand-built logits: greedy prefix, speculative sampling (with its
residual distribution, statistically, and wrong rules as negative controls), BiLD's rollback."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

import specdec_jax as sd
from specdec_jax import testing, theory
from specdec_jax.rounds.acceptance import Rollback, SpeculativeSampling, TargetOnly

pytestmark = pytest.mark.unit

V = 5
N = 20_000            # independent rows of one rule call: one sample each
P_PASS, P_FAIL = 1e-3, 1e-8


def apply(rule, logits, proposal, sampling, key):
  # Op by op: the rules share their primitives, so each compiles once for the module.
  return rule(logits, proposal, sampling, key)


def peaks(argmaxes, vocab=V):
  """Logits [B, K, V] with a clear maximum at argmaxes [B, K] (and distinct other values)."""
  argmaxes = np.asarray(argmaxes)
  base = np.broadcast_to(np.linspace(0.0, 0.5, vocab, dtype=np.float32), argmaxes.shape + (vocab,))
  return jnp.asarray(base + 5.0 * np.eye(vocab, dtype=np.float32)[argmaxes])


# ----------------------------------------------------------------------------- greedy


def test_greedy_keeps_the_longest_matching_prefix_and_the_targets_next_token():
  # Row 0: the module's worked example (argmax [2, 4, 3, 0], drafts [2, 4, 1] -> emits 2 4 3).
  # Row 1: the same, but only one real draft. Row 2: the first draft is wrong.
  logits = peaks([[2, 4, 3, 0]] * 3)
  prop = testing.proposal([[2, 4, 1], [2, 4, 1], [0, 4, 3]], count=[3, 1, 3])
  got = apply(SpeculativeSampling(), logits, prop, sd.Greedy(), jax.random.key(0))
  np.testing.assert_array_equal(got.m, [2, 1, 0])
  np.testing.assert_array_equal(got.next_token, [3, 4, 2])
  np.testing.assert_array_equal(got.beta, [[1, 1, 0], [1, 1, 0], [0, 1, 1]])
  np.testing.assert_array_equal(got.scored, [[1, 1, 1], [1, 0, 0], [1, 0, 0]])


def test_greedy_lenience_accepts_near_maxima_and_is_lossy():
  # At position 0 the draft 3 has 0.6 of the maximum's probability.
  p = np.array([[0.4, 0.0, 0.0, 0.24, 0.36], [0.1, 0.1, 0.6, 0.1, 0.1], [0.2] * 5], np.float32)
  logits = testing.logits_from_probs(p[None])
  prop = testing.proposal([[3, 2]])
  exact = apply(SpeculativeSampling(), logits, prop, sd.Greedy(), jax.random.key(0))
  lenient = apply(SpeculativeSampling(lenience=0.5), logits, prop, sd.Greedy(),
                  jax.random.key(0))
  assert (int(exact.m[0]), int(exact.next_token[0])) == (0, 0)
  assert (int(lenient.m[0]), int(lenient.next_token[0])) == (2, 0)
  assert not SpeculativeSampling().lossy and SpeculativeSampling(lenience=0.5).lossy
  strict = apply(SpeculativeSampling(lenience=0.7), logits, prop, sd.Greedy(), jax.random.key(0))
  assert int(strict.m[0]) == 0                                       # 0.6 < 0.7


def test_target_only_takes_the_targets_token():
  logits = peaks([[3], [1]])
  got = apply(TargetOnly(), logits, testing.proposal(np.zeros((2, 0), np.int32)),
              sd.Greedy(), jax.random.key(0))
  np.testing.assert_array_equal(got.m, [0, 0])
  np.testing.assert_array_equal(got.next_token, [3, 1])
  assert not TargetOnly.lossy


# ----------------------------------------------------------------------------- sampling


def gof(tokens, probs):
  """Chi-square goodness-of-fit p-value of tokens [n] against probs [V]; a token of
  probability 0 that occurs gives 0."""
  counts = np.bincount(np.asarray(tokens), minlength=len(probs))
  support = probs > 0
  if counts[~support].any():
    return 0.0
  expected = probs[support] / probs[support].sum() * counts.sum()
  return float(scipy_stats.chisquare(counts[support], expected).pvalue)


@dataclasses.dataclass(frozen=True)
class WrongResidual(SpeculativeSampling):
  """WRONG: the right acceptance test, but after a rejection t ~ p, not the residual."""

  def __call__(self, logits, proposal, sampling, key):
    right = SpeculativeSampling()(logits, proposal, sampling, key)
    p = sd.sampling.probs(logits, sampling)
    p_next = jnp.take_along_axis(p, right.m[:, None, None], axis=1)[:, 0]
    next_token = jax.random.categorical(jax.random.split(key)[1], jnp.log(p_next), axis=-1)
    return right.replace(next_token=next_token.astype(jnp.int32))


@dataclasses.dataclass(frozen=True)
class IgnoresQ(SpeculativeSampling):
  """WRONG: accepts x with probability p(x) (q forgotten), else draws from p."""

  def __call__(self, logits, proposal, sampling, key):
    ones = jnp.ones_like(proposal.q)
    return SpeculativeSampling()(logits, proposal.replace(q=ones), sampling, key)


def draws(rule, p, q, seed=0):
  """N rounds of `rule` with G = len(q) drafts x_i ~ q_i and target distributions
  p [G + 1, V] (the same at every prefix): (tokens emitted [N, G + 1] (-1 past the round's
  end), m [N], the rule's decision)."""
  g = len(q)
  rng = np.random.default_rng(seed)
  x = np.stack([rng.choice(V, size=N, p=q[i]) for i in range(g)], 1).astype(np.int32)
  logits = jnp.broadcast_to(testing.logits_from_probs(p), (N, g + 1, V))
  qs = jnp.broadcast_to(jnp.asarray(q, jnp.float32), (N, g, V))
  got = apply(rule, logits, testing.proposal(x, q=qs), sd.Sampling(), jax.random.key(seed))
  m, t = np.asarray(got.m), np.asarray(got.next_token)
  emitted = np.full((N, g + 1), -1)
  for i in range(g + 1):
    emitted[:, i] = np.where(m > i, x[:, min(i, g - 1)], np.where(m == i, t, -1))
  return emitted, m, got


P = np.array([[0.50, 0.05, 0.25, 0.15, 0.05],
              [0.10, 0.40, 0.10, 0.10, 0.30],
              [0.05, 0.05, 0.10, 0.60, 0.20]])
Q = np.array([[0.10, 0.40, 0.20, 0.10, 0.20],
              [0.30, 0.30, 0.05, 0.30, 0.05]])


def positions_follow_p(rule, seed=0):
  """p-values of: the first token ~ p_0; the second given one acceptance ~ p_1; the bonus
  token given two ~ p_2 (Leviathan et al., Theorem 1, at each position)."""
  emitted, m, _ = draws(rule, P, Q, seed)
  return [gof(emitted[m >= i, i], P[i]) for i in range(3)]


def test_speculative_sampling_emits_the_targets_distribution_at_every_position():
  emitted, m, got = draws(SpeculativeSampling(), P, Q)
  assert min(positions_follow_p(SpeculativeSampling())) > P_PASS
  # beta is sum_x min(p, q) exactly (what alpha averages), and the acceptance frequency
  # of the first draft is that probability (Theorem 5).
  np.testing.assert_allclose(got.beta[0], theory.beta(P[:2], Q), rtol=1e-5)
  rate, se = np.mean(m >= 1), np.sqrt(0.25 / N)
  assert abs(rate - theory.beta(P[0], Q[0])) < 5 * se
  assert np.all(m <= 2) and np.any(m == 2) and np.any(m == 0)


@pytest.mark.parametrize("wrong", [WrongResidual(), IgnoresQ()], ids=["residual-is-p", "no-q"])
def test_negative_controls_fail_the_same_check(wrong):
  assert min(positions_follow_p(wrong)) < P_FAIL


def test_after_a_sure_rejection_the_token_is_drawn_from_the_normalised_residual():
  # p(0) = 0: a draft 0 is always rejected; then t ~ max(0, p - q) / sum = [0, .8, 0, .2, 0].
  p = np.array([[0.0, 0.5, 0.3, 0.2, 0.0], [0.2] * 5])
  q = np.array([[0.4, 0.1, 0.3, 0.1, 0.1]])
  x = np.zeros((N, 1), np.int32)
  logits = jnp.broadcast_to(testing.logits_from_probs(p), (N, 2, V))
  prop = testing.proposal(x, q=jnp.broadcast_to(jnp.asarray(q, jnp.float32), (N, 1, V)))
  residual = np.array([0.0, 0.8, 0.0, 0.2, 0.0])
  right = apply(SpeculativeSampling(), logits, prop, sd.Sampling(), jax.random.key(1))
  assert not np.any(right.m)
  assert gof(right.next_token, residual) > P_PASS
  wrong = apply(WrongResidual(), logits, prop, sd.Sampling(), jax.random.key(1))
  assert gof(wrong.next_token, residual) < P_FAIL


def test_lenient_sampling_accepts_at_the_rate_theory_gives():
  lenience = 0.5
  _, m, _ = draws(SpeculativeSampling(lenience=lenience), P, Q)
  _, exact_m, _ = draws(SpeculativeSampling(), P, Q)
  se = np.sqrt(0.25 / N)
  want = theory.lenient_alpha(P[0], Q[0], lenience)
  assert abs(np.mean(m >= 1) - want) < 5 * se
  assert abs(np.mean(exact_m >= 1) - want) > 5 * se     # the check tells the two apart


def test_sampling_without_q_is_an_error():
  with pytest.raises(sd.InputError, match="needs the proposer's distributions q"):
    SpeculativeSampling()(peaks([[1, 2]]), testing.proposal([[1]]), sd.Sampling(),
                          jax.random.key(0))


# ----------------------------------------------------------------------------- BiLD rollback


def test_rollback_keeps_drafts_while_the_large_models_distance_is_small():
  # The module's worked example: p_L(x_i) = [0.9, 0.4, 0.05, 0.8], threshold 2 (p >= e^-2).
  x = [1, 2, 3, 4]
  p = np.full((5, V), 0.0)
  for i, (token, mass) in enumerate(zip(x, [0.9, 0.4, 0.05, 0.8], strict=True)):
    p[i] = (1 - mass) / (V - 1)
    p[i, token] = mass
  p[2, 0] = 0.95 - 3 * p[2, 1]          # position 2's argmax (the large model's token): 0
  p[4] = [0.1, 0.1, 0.1, 0.6, 0.1]
  logits = testing.logits_from_probs(p[None])
  prop = testing.proposal([x])
  got = apply(Rollback(2.0), logits, prop, sd.Greedy(), jax.random.key(0))
  assert (int(got.m[0]), int(got.next_token[0])) == (2, 0)
  np.testing.assert_allclose(got.beta[0], [0.9, 0.4, 0.05, 0.8], rtol=1e-5)
  np.testing.assert_array_equal(got.scored[0], [1, 1, 1, 0])
  never = apply(Rollback(float("inf")), logits, prop, sd.Greedy(), jax.random.key(0))
  assert (int(never.m[0]), int(never.next_token[0])) == (4, 3)     # all kept, then a bonus
  # The distance is measured at temperature 1 whatever the sampling transform.
  hot = apply(Rollback(2.0), logits, prop, sd.Sampling(temperature=0.3), jax.random.key(0))
  assert int(hot.m[0]) == 2
  assert Rollback(2.0).lossy
