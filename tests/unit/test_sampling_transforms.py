"""Sampling transforms: temperature, top-k, top-p against brute-force references, the argmax,
token log-probabilities, draws that stay in the kept set, and the settings' checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import sampling as sampling_lib

pytestmark = pytest.mark.unit

RNG = np.random.RandomState(0)
# Integer logits: many ties, at the top-k edge and at the top-p threshold.
LOGITS = RNG.randint(-3, 3, size=(16, 9)).astype(np.float32)


def top_k_reference(row, k):
  """Keep every logit >= the k-th largest (ties kept)."""
  return row >= np.sort(row)[::-1][k - 1]


def top_p_reference(row, p):
  """Keep the tokens of the smallest prefix (by descending probability) whose mass reaches
  p, and every token tied with its last one."""
  probs = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
  ordered = np.sort(probs)[::-1]
  kept = int(np.argmax(np.cumsum(ordered) >= p - 1e-6)) + 1
  return probs >= ordered[kept - 1] * (1 - 1e-6)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_top_k_mask_is_the_reference(k):
  got = np.isfinite(jax.jit(sampling_lib.top_k_mask, static_argnums=1)(LOGITS, k))
  np.testing.assert_array_equal(got, [top_k_reference(r, k) for r in LOGITS])


def test_top_p_mask_is_the_reference():
  mask = jax.jit(sampling_lib.top_p_mask, static_argnums=1)
  for p in (0.1, 0.5, 0.75, 0.9, 0.999):
    np.testing.assert_array_equal(np.isfinite(mask(LOGITS, p)),
                                  [top_p_reference(r, p) for r in LOGITS], err_msg=str(p))


def test_top_k_and_top_p_masks():
  logits = jnp.log(jnp.array([[0.5, 0.2, 0.2, 0.1]]))
  np.testing.assert_array_equal(jnp.isfinite(sampling_lib.top_k_mask(logits, 2)),
                                [[True, True, True, False]])         # tie with the 2nd kept
  np.testing.assert_array_equal(jnp.isfinite(sampling_lib.top_p_mask(logits, 0.5)),
                                [[True, False, False, False]])
  np.testing.assert_array_equal(jnp.isfinite(sampling_lib.top_p_mask(logits, 0.6)),
                                [[True, True, True, False]])         # tie at threshold kept
  p = sampling_lib.probs(logits, sd.Sampling(temperature=1.0, top_p=0.5))
  np.testing.assert_allclose(p, [[1.0, 0, 0, 0]], atol=1e-6)
  p = sampling_lib.probs(logits, sd.Greedy())
  np.testing.assert_array_equal(p, [[1.0, 0, 0, 0]])


@jax.jit
def transformed(logits):
  """(probs at T = 0.5 with top-k 3, then top-p 0.8, and their token log-probs of token 0)."""
  settings = sd.Sampling(temperature=0.5, top_k=3, top_p=0.8)
  return (sampling_lib.probs(logits, settings),
          sampling_lib.token_log_probs(logits, jnp.zeros(logits.shape[:-1], jnp.int32),
                                       settings))


def test_temperature_then_top_k_then_top_p():
  probs, log_p0 = transformed(LOGITS)
  for row, got, lp in zip(LOGITS, np.asarray(probs), np.asarray(log_p0), strict=True):
    scaled = np.where(top_k_reference(row, 3), row / 0.5, -np.inf)
    keep = top_p_reference(scaled, 0.8)
    want = np.where(keep, np.exp(scaled - scaled.max()), 0.0)
    want /= want.sum()
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert lp == pytest.approx(np.log(want[0]), abs=1e-5) if want[0] else lp == -np.inf


def test_temperature_zero_and_top_k_one_are_greedy():
  assert sd.Sampling(temperature=0).is_greedy and sd.Sampling(top_k=1).is_greedy
  assert not sd.Sampling(temperature=0.1).is_greedy
  greedy = sampling_lib.token_log_probs(LOGITS[:2], jnp.array([0, int(LOGITS[1].argmax())]),
                                        sd.Greedy())
  assert greedy[1] == 0.0 and (greedy[0] == 0.0) == (LOGITS[0].argmax() == 0)


def test_draws_stay_in_the_kept_set_and_follow_it():
  logits = jnp.log(jnp.array([0.4, 0.3, 0.2, 0.1]))
  settings = sd.Sampling(top_k=2)
  tokens = np.asarray(sampling_lib.draw(jax.random.key(0), jnp.tile(logits, (4000, 1)),
                                        settings))
  counts = np.bincount(tokens, minlength=4)
  assert counts[2:].sum() == 0
  assert abs(counts[0] / 4000 - 4 / 7) < 0.03                      # 0.4 / (0.4 + 0.3)
  np.testing.assert_array_equal(sampling_lib.draw(None, LOGITS, sd.Greedy()),
                                LOGITS.argmax(-1))


def test_as_sampling():
  assert sampling_lib.as_sampling(None) == sd.Greedy()
  assert sampling_lib.as_sampling({"temperature": 0.5}) == sd.Sampling(temperature=0.5)
  with pytest.raises(sd.SamplingError, match="sampling must be sd.Greedy"):
    sampling_lib.as_sampling("greedy")


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": -0.1}, "temperature must be"),
    ({"temperature": float("inf")}, "temperature must be"),
    ({"temperature": float("nan")}, "temperature must be"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_k": -1}, "top_k must be"),
    ({"top_k": 2.0}, "top_k must be"),
    ({"top_k": True}, "top_k must be"),
])
def test_bad_sampling_parameters(kwargs, match):
  with pytest.raises(sd.SamplingError, match=match):
    sd.Sampling(**kwargs)


def test_argmax_is_jnp_argmax():
  """sampling.argmax (two plain reductions, faster on XLA:CPU) returns jnp.argmax's index
  everywhere: ties go to the first maximum, rows of -inf to 0, in float32 and bfloat16."""
  rng = np.random.RandomState(0)
  x = rng.randint(-3, 3, size=(6, 5, 40)).astype(np.float32)     # many ties
  x[0, 0] = -np.inf
  x[1, 1, 7] = np.inf
  for dtype in (jnp.float32, jnp.bfloat16):
    got = jax.jit(sampling_lib.argmax)(jnp.asarray(x, dtype))
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, jnp.argmax(jnp.asarray(x, dtype), axis=-1))
