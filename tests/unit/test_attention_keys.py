"""The models' masks as per-row lengths (`models.layers.Keys`): XLA's path, which turns the
lengths back into a mask (`kernels.shapes.dense_bias`), gives bitwise the attention the
dense masks gave (T5X's `make_attention_mask` rules): causal decode, an encoder's padding
(leading pads, a hole inside a row, a row of pads, masked query rows), cross-attention,
and a draft tree after prefixes of 0 up to the cache's capacity. Soft-capped logits
(`models.layers.xla_attention`) are Gemma 2's formula, computed here in numpy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import cache as cache_lib
from specdec_jax.kernels.shapes import additive, dense_bias
from specdec_jax.models.layers import causal_keys, padded_keys, tree_keys, xla_attention

pytestmark = pytest.mark.unit

H = 2


def _softmax(logits, bias):
  return np.asarray(jax.nn.softmax(logits + bias, axis=-1))


def _logits(b, t, s, seed=0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal((b, H, t, s)) * 4, jnp.float32)


def _as_mask(keys, b, t, s):
  return dense_bias(keys.bias, keys.lengths, b, t, s)


def test_causal_lengths_are_the_causal_mask():
  """Queries at positions 0..9 of a 10-key buffer (and one past it, clipped)."""
  q_pos = jnp.asarray([[0, 1, 2], [7, 8, 9], [4, 9, 12]], jnp.int32)
  relpos = jnp.asarray(np.random.default_rng(1).standard_normal((3, H, 3, 10)), jnp.float32)
  causal = (jnp.arange(10)[None, None, :] <= q_pos[:, :, None])[:, None]
  keys = causal_keys(q_pos, relpos)
  np.testing.assert_array_equal(np.asarray(_as_mask(keys, 3, 3, 10)),
                                np.asarray(additive(causal, relpos)))
  np.testing.assert_array_equal(np.asarray(keys.lengths), np.asarray(q_pos) + 1)


@pytest.fixture
def tokens():
  # a plain row, leading pads, a hole inside the row, a row of pads
  return jnp.asarray([[5, 6, 7, 8, 0, 0], [0, 0, 3, 4, 5, 0], [3, 0, 4, 5, 0, 0],
                      [0, 0, 0, 0, 0, 0]], jnp.int32)


def test_encoder_padding_as_lengths_is_t5x_mask(tokens):
  b, s = tokens.shape
  mask = tokens > 0
  relpos = jnp.asarray(np.random.default_rng(2).standard_normal((1, H, s, s)), jnp.float32)
  keys = padded_keys(mask, s, relpos, queries=mask)
  old = additive(mask[:, None, None, :] & mask[:, None, :, None], relpos)
  logits = _logits(b, s, s)
  np.testing.assert_array_equal(_softmax(logits, _as_mask(keys, b, s, s)), _softmax(logits, old))
  np.testing.assert_array_equal(np.asarray(keys.lengths[:, 0]), [4, s, 4, s])  # masked query: S
  np.testing.assert_array_equal(np.asarray(keys.lengths[:, 2]), [4, 5, 4, s])
  # the control: a length one short of a row's extent drops a key the mask keeps
  short = keys.replace(lengths=keys.lengths - 1)
  assert not np.array_equal(_softmax(logits, _as_mask(short, b, s, s)), _softmax(logits, old))


def test_cross_attention_padding_as_lengths(tokens):
  b, s = tokens.shape
  keys = padded_keys(tokens > 0, 3)
  old = additive((tokens > 0)[:, None, None, :])
  logits = _logits(b, 3, s, seed=3)
  np.testing.assert_array_equal(_softmax(logits, _as_mask(keys, b, 3, s)), _softmax(logits, old))


@pytest.mark.parametrize("prefix", [0, 3, 6, 7])
def test_a_tree_after_any_prefix_as_lengths(prefix):
  """Three drafted tokens (a root and two children) after `prefix` valid keys of an
  8-slot cache (7: the last child lies past it, dropped as the cache drops it)."""
  capacity, k = 8, 3
  length = jnp.asarray([prefix, max(prefix - 2, 0)], jnp.int32)
  slots = cache_lib.query_positions(length, k)
  visible = jnp.asarray([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], bool)
  tree = cache_lib.tree_mask(length, slots, visible, capacity)
  relpos = jnp.asarray(np.random.default_rng(4).standard_normal((2, H, k, capacity)),
                       jnp.float32)
  keys = tree_keys(length, k, tree, relpos)
  logits = _logits(2, k, capacity, seed=5)
  np.testing.assert_array_equal(_softmax(logits, _as_mask(keys, 2, k, capacity)),
                                _softmax(logits, additive(tree, relpos)))


@pytest.mark.parametrize("hkv", [H, 1])      # one K/V head per query head, and grouped
def test_soft_capped_attention_is_gemma_2s_formula(hkv):
  """softmax(c * tanh(q . k / c) + bias) @ v (the cap before the bias, as transformers'
  `eager_attention_forward`), in float64 by hand; the control: uncapped, it is not."""
  rng = np.random.default_rng(6)
  b, t, s, d, cap = 2, 3, 5, 4, 2.0
  q, k, v = (rng.standard_normal(shape).astype(np.float32) * 2
             for shape in ((b, H, t, d), (b, hkv, s, d), (b, hkv, s, d)))
  bias = rng.standard_normal((b, 1, t, s)).astype(np.float32)
  bias[..., 1:][rng.random((b, 1, t, s - 1)) < 0.3] = -1e10      # masked keys; key 0 kept
  kr, vr = (np.repeat(x.astype(np.float64), H // hkv, axis=1) for x in (k, v))  # repeat_kv
  logits = cap * np.tanh(np.einsum("bhtd,bhsd->bhts", q.astype(np.float64), kr) / cap) + bias
  p = np.exp(logits - logits.max(-1, keepdims=True))
  want = np.einsum("bhts,bhsd->bhtd", p / p.sum(-1, keepdims=True), vr)
  args = [jnp.asarray(x) for x in (q, k, v, bias)]
  np.testing.assert_allclose(np.asarray(xla_attention(*args, jnp.float32, cap)), want,
                             rtol=1e-5, atol=1e-5)
  uncapped = np.asarray(xla_attention(*args, jnp.float32))
  assert np.abs(uncapped - want).max() > 0.1


@pytest.mark.parametrize("cls", [sd.GemmaConfig, sd.config.T5Gemma2Config])
@pytest.mark.parametrize("cap", [0.0, "50"])
def test_attn_logit_softcap_must_be_positive(cls, cap):
  assert cls(attn_logit_softcap=50.0).attn_logit_softcap == 50.0
  with pytest.raises(sd.ConfigError, match="attn_logit_softcap must be positive or null"):
    cls(attn_logit_softcap=cap)
