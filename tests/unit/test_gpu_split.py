"""The gpu kernels' float32 operands split into bfloat16 parts, hi + lo (kernels/gpu/matmul.py).

On an H200 the split's lo part came out 0: XLA:GPU drops a float32 -> bfloat16 -> float32
pair of converts (excess precision), so `a - f32(bf16(a))` was `a - a`, and every float32
product of the gpu kernels was only bfloat16-precise (the self-check's error 2.5e-4 against
1e-4 allowed). The split cuts hi with a bit mask instead; these tests hold it to that.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.kernels.gpu.matmul import split

pytestmark = pytest.mark.unit


def _values():
  rng = np.random.default_rng(0)
  return jnp.asarray(rng.standard_normal(4096) * 10.0 ** rng.integers(-6, 6, 4096), jnp.float32)


def test_the_split_never_rounds_through_bfloat16_and_back():
  jaxpr = jax.make_jaxpr(lambda a: split(a, 2))(_values())
  back = [e for e in jaxpr.eqns if e.primitive.name == "convert_element_type"
          and e.invars[0].aval.dtype == jnp.bfloat16 and e.params["new_dtype"] == jnp.float32]
  assert not back, "a bfloat16 -> float32 convert in the split: XLA:GPU may drop the pair"


def test_hi_plus_lo_is_the_float32_value_to_2_to_the_minus_16():
  a = _values()
  hi, lo = np.asarray(jax.jit(lambda x: split(x, 2))(a), np.float32)
  assert np.array_equal(hi, np.asarray(jnp.asarray(hi, jnp.bfloat16), np.float32))
  error = np.abs(hi + lo - np.asarray(a)) / np.abs(np.asarray(a))
  assert error.max() <= 2.0 ** -16
  assert np.count_nonzero(lo) > 0.9 * lo.size      # lo carries the low bits


def test_one_part_is_the_bfloat16_value():
  a = _values()
  (part,) = np.asarray(split(a, 1))
  assert np.array_equal(part, np.asarray(a.astype(jnp.bfloat16)))
