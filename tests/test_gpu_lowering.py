"""The gpu backend's dot kernel (specdec_jax.kernels.gpu) through Mosaic GPU's lowering for
CUDA, on CPU (no GPU needed): every tiling the device check sweeps (`tiles.candidates`),
for the T5-XXL target's and the T5-small drafter's decode products, is a kernel Mosaic GPU
accepts; a construct it cannot compile is rejected (negative control). Apart from
tests/test_gpu_kernels.py (the kernels in interpret mode) for time: each lowering takes a
fifth of a second, and the slow test lowers 224.
"""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from specdec_jax.kernels import gpu
from specdec_jax.kernels.gpu import matmul, tiles

# An accelerator backend in interpret mode: the full suite's (README's command), not the
# fast tier's, which proves the factors on XLA and the cpu kernels (CONTRIBUTING).
pytestmark = pytest.mark.slow


def _lowers(f, *args) -> str:
  return gpu.lower_for_cuda(f, *args).as_text()


#: Weight shapes of the T5-XXL target's and the T5-small drafter's decode products, and
#: their norms' sums of squares ([K, 1], float32).
DECODE_SHAPES = ((4096, 4096), (4096, 10240), (10240, 4096), (4096, 32128), (512, 384),
                 (384, 512), (512, 1024), (1024, 512), (512, 32128))


def _candidates_lower(shapes, dtypes, most=None):
  for k, n in shapes:
    for dtype in dtypes:
      parts = 1 if dtype == jnp.bfloat16 else 2
      x = jax.ShapeDtypeStruct((8, k), dtype)
      for t in tiles.candidates(k, n, dtype)[:most]:
        wp = jax.ShapeDtypeStruct((parts,) + t.padded(k, n), jnp.bfloat16)
        text = _lowers(lambda a, b, t=t, n=n: matmul.dot(a, b, n, interpret=False, tiles=t),
                       x, wp)
        assert text.count("mosaic_gpu") >= 1, (k, n, dtype, t)


def test_candidate_tilings_lower_for_cuda():
  """The first configurations the device check sweeps for a T5-XXL MLP product (bfloat16:
  K split, 3 stages; tn 256) and a T5-small one (float32) go through Mosaic GPU's
  lowering: the pipelined kernel. Every candidate of every decode shape: the slow test."""
  _candidates_lower([(4096, 10240)], [jnp.bfloat16], most=5)
  _candidates_lower([(512, 384)], [jnp.float32], most=2)


@pytest.mark.device
@pytest.mark.slow
def test_every_candidate_of_every_decode_shape_lowers_for_cuda():
  """Each configuration the device check sweeps, for every T5-XXL / T5-small decode
  product and norm, in both dtypes, lowers for CUDA through Mosaic GPU."""
  _candidates_lower(DECODE_SHAPES, [jnp.bfloat16, jnp.float32])
  _candidates_lower([(4096, 1), (512, 1)], [jnp.float32])


def test_cuda_lowering_rejects_what_mosaic_gpu_cannot_compile():
  """Negative control: a kernel computing a plain jnp.dot on whole refs fails to lower."""
  def kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

  def f(x, w):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((64, 64), jnp.float32),
                          compiler_params=plgpu.CompilerParams())(x, w)

  x = jnp.ones((64, 64), jnp.bfloat16)
  with pytest.raises(NotImplementedError, match="dot_general"):
    _lowers(f, x, x)
