"""The prediction heads' block (Stern et al. 2018, section 4; Kim et al. 2024): head j maps
the final decoder state h to u_j = h + W_out_j relu(W_in_j h), a residual feed-forward
layer whose output the verifier's own output layer turns into logits. Model-free: the
heads' parameters are drawn here and the block is written out in numpy."""

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.drafters.heads import Heads, head_states

pytestmark = pytest.mark.unit

E, F, NUM_HEADS = 6, 10, 4


def _heads(seed: int = 0) -> Heads:
  rng = np.random.default_rng(seed)
  params = {f"head_{j}": {"wi": rng.standard_normal((E, F)).astype(np.float32),
                          "wo": rng.standard_normal((F, E)).astype(np.float32)}
            for j in range(2, NUM_HEADS + 1)}
  return Heads(params=params, num_heads=NUM_HEADS)


def _reference(heads: Heads, h: np.ndarray) -> np.ndarray:
  """[..., E] -> [..., h - 1, E], each head's residual block in numpy."""
  out = []
  for j in range(2, heads.num_heads + 1):
    p = heads.params[f"head_{j}"]
    out.append(h + np.maximum(h @ p["wi"], 0.0) @ p["wo"])
  return np.stack(out, axis=-2)


def test_each_head_is_a_residual_block_on_the_final_state():
  heads = _heads()
  h = np.random.default_rng(1).standard_normal((3, 5, E)).astype(np.float32)
  got = np.asarray(head_states(heads, jnp.asarray(h)))
  assert got.shape == (3, 5, NUM_HEADS - 1, E)
  np.testing.assert_allclose(got, _reference(heads, h), rtol=1e-5, atol=1e-5)

