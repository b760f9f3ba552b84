"""The gpu backend's kernels (specdec_jax.kernels.gpu, Pallas on Mosaic GPU), on CPU.

Where no GPU is the default backend they run in Pallas's GPU interpret mode: each row of
a product, sum of squares and attention is bitwise the same whatever the number of rows
M, the row's position and the call width, and agrees with XLA's ops to rounding (each
WGMMA runs as an in-order product here: the interpreter's own is the host BLAS's matmul,
whose rows can depend on their position in the tile, as OpenBLAS's Haswell sgemm's do). The
same kernels compiled for a GPU (interpret=False) go through Mosaic GPU's lowering here
too (`lower_for_cuda`), which rejects constructs it cannot compile (every tiling the
device check sweeps, and the negative control: tests/test_gpu_lowering.py). Shapes are
small: the interpreter runs every copy, barrier and SMEM access as a host callback. The
backend's end-to-end decode is the device check's (tests/test_gpu_check.py: speculative
decoding on these kernels, bitwise the baseline's); every method's runs on the tpu kernels
(tests/test_tpu_kernels.py), and the factors make it so here (CONTRIBUTING).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax.kernels import backends, gpu, shapes
from specdec_jax.kernels.gpu import matmul, tiles

# An accelerator backend in interpret mode: the full suite's (README's command), not the
# fast tier's, which proves the factors on XLA and the cpu kernels (CONTRIBUTING).
pytestmark = pytest.mark.slow

K, N = 70, 130                    # odd: both edges padded at packing
MS = (1, 2, 5, 16, 64, 512)


def _rows(m: int, seed: int = 0) -> np.ndarray:
  """Positions in a 512-row reference of the m rows of a call: scattered, reversed."""
  return np.random.default_rng(seed).permutation(512)[:m][::-1].copy()


@pytest.fixture(scope="module")
def products():
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.standard_normal((K, N)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((512, K)), jnp.float32)
  return x, w


#: The tile classes of the table (`tiles.Tiles`), tiny: (K, tiles; None: the default rule).
#: The default of a [70, 130] weight (64 x 64, one K part); a K split in 3 parts (the
#: order of their sum matters: a + b = b + a) of 3 steps each through 2 stages (slots
#: reused); 128-wide K steps through 3 stages.
TILE_CLASSES = {"default": (K, None), "k split": (400, tiles.Tiles(128, 64, 2, 3)),
                "tk 128": (300, tiles.Tiles(64, 128, 3, 1))}


@pytest.mark.parametrize("dtype,case", [
    (jnp.bfloat16, "default"), (jnp.bfloat16, "k split"),
    pytest.param(jnp.bfloat16, "tk 128", marks=pytest.mark.slow),
    pytest.param(jnp.float32, "default", marks=pytest.mark.slow),
    pytest.param(jnp.float32, "k split", marks=pytest.mark.slow)])
def test_dot_rows_are_bitwise_independent_of_m_and_position(products, dtype, case):
  """For each tile class: rows of 1..64-row calls are bitwise those of a 512-row call
  (scattered, reversed), and a [B, T, K] call's rows are its [B x T, K] call's."""
  k, t = TILE_CLASSES[case]
  x, w = products
  if k != K:
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((512, k)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((k, N)) / np.sqrt(k), jnp.float32)
  wp = gpu.pack(w, dtype, tiles=t)
  assert t is None or wp.shape[1] == t.padded(k, N)[0]
  full = np.asarray(gpu.dot(x.astype(dtype), wp, N, tiles=t))
  ms = MS[:-1] if dtype == jnp.bfloat16 and t is None else (1, 5, 64)   # interpreting: slow
  for m in ms:
    rows = _rows(m, seed=m)
    got = np.asarray(gpu.dot(x[rows].astype(dtype), wp, N, tiles=t))
    np.testing.assert_array_equal(got, full[rows], err_msg=f"M={m}")
  # [..., K] leading dims: a [B, T, K] call is its rows
  got = np.asarray(gpu.dot(x[:6].astype(dtype).reshape(2, 3, k), wp, N, tiles=t))
  np.testing.assert_array_equal(got.reshape(6, N), full[:6])
  want = np.asarray(jnp.dot(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32,
                            precision=jax.lax.Precision.HIGHEST))
  np.testing.assert_allclose(full, want, rtol=0, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("dtype,rtol", [(jnp.bfloat16, 1e-5), (jnp.float32, 2e-5)])
def test_dot_agrees_with_xla(products, dtype, rtol):
  """bfloat16: XLA's bfloat16 product with float32 accumulation; float32: XLA's at
  HIGHEST precision (the hi/lo split drops lo.lo, ~2^-16 relative per term)."""
  x, w = products
  x = x[:5]
  got = np.asarray(gpu.dot(x.astype(dtype), gpu.pack(w, dtype), N))
  want = np.asarray(jnp.dot(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32,
                            precision=jax.lax.Precision.HIGHEST))
  assert got.shape == (5, N)
  scale = np.abs(x).sum(-1, keepdims=True) * np.abs(w).max()
  assert np.max(np.abs(got - want) / scale) <= rtol


def test_tiles_come_from_the_table_by_weight_shape(products):
  """A table entry for a weight's (K, N, dtype) sets its packing and the kernel's tiles
  (inside `tiles.using`, and only there); other shapes and dtypes take the default rule; a
  packing made for other tiles is refused, never misread."""
  x, w = products
  default = gpu.pack(w, jnp.bfloat16)
  entry = {"tn": 128, "tk": 64, "stages": 2, "k_splits": 2, "device": "test"}
  with tiles.using({"dot": {tiles.key(K, N, jnp.bfloat16): entry}}):
    assert tiles.dot_tiles(K, N, jnp.bfloat16) == tiles.Tiles(128, 64, 2, 2)
    assert tiles.dot_tiles(K, N, jnp.float32) == tiles.default(K, N, jnp.float32)
    assert tiles.dot_tiles(K + 1, N, jnp.bfloat16) == tiles.default(K + 1, N, jnp.bfloat16)
    wp = gpu.pack(w, jnp.bfloat16)
    got = np.asarray(gpu.dot(x[:5].astype(jnp.bfloat16), wp, N))
    with pytest.raises(ValueError, match="not a GPU packing of a .70, 130. matrix for Tiles"):
      gpu.dot(x[:5].astype(jnp.bfloat16), default, N)
  assert wp.shape == (1, 128, 256) and default.shape == (1, 128, 192)
  want = np.asarray(gpu.dot(x[:5].astype(jnp.bfloat16), default, N, tiles=tiles.Tiles()))
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
  # After the block the shipped table is in force again: the table's packing is refused.
  assert tiles.dot_tiles(K, N, jnp.bfloat16) == tiles.default(K, N, jnp.bfloat16)
  with pytest.raises(ValueError, match="not a GPU packing of a .70, 130. matrix for Tiles"):
    gpu.dot(x[:5].astype(jnp.bfloat16), wp, N)


def test_the_default_rule_and_the_candidates_the_device_check_sweeps():
  """Blocks enough for the T5-XXL products (K split: about one block per SM), pipelined
  copies (>= 2 stages) that fit a Hopper block's SMEM, the default first."""
  for k, n in ((4096, 4096), (4096, 10240), (10240, 4096)):
    t = tiles.default(k, n, jnp.bfloat16)
    assert t.stages >= 2 and t.k_splits > 1 and t.steps(k) >= 2
    assert -(-n // t.tn) * t.k_splits >= tiles.TARGET_BLOCKS
  assert tiles.default(K, N, jnp.bfloat16) == tiles.Tiles(64, 64, 2, 1)
  for dtype, parts in ((jnp.bfloat16, 1), (jnp.float32, 2)):
    for k, n in ((4096, 10240), (512, 384), (4096, 1)):
      found = tiles.candidates(k, n, dtype)
      assert found[0] == tiles.default(k, n, dtype) and len(set(found)) == len(found) > 3
      for t in found:
        assert t.smem_bytes(parts) <= tiles.SMEM_BYTES and (t.stages >= 2 or t.steps(k) < 2)
        assert t.padded(k, n)[0] == t.steps(k) * t.tk * t.k_splits >= k
  with pytest.raises(ValueError, match="tiles need"):
    tiles.Tiles(tn=96)


def test_packing_pads_the_edges_with_zeros_and_is_checked():
  w = jnp.ones((K, N), jnp.float32)
  wp = gpu.pack(w)
  assert wp.shape == (2, 128, 192) and wp.dtype == jnp.bfloat16
  assert np.asarray(wp[0, :K, :N]).min() == 1 and not np.asarray(wp[0, K:]).any()
  assert not np.asarray(wp[0, :, N:]).any() and not np.asarray(wp[1]).any()
  assert gpu.pack(w, jnp.bfloat16).shape == (1, 128, 192)
  with pytest.raises(ValueError, match="not a GPU packing"):
    gpu.dot(jnp.ones((1, 2 * K)), wp, N)
  with pytest.raises(TypeError, match="float32 or bfloat16"):
    gpu.pack(w.astype(jnp.float16))


def test_sum_squares_rows_are_invariant_and_agree(products):
  x, _ = products
  ones = gpu.pack(jnp.ones((K, 1), jnp.float32), jnp.float32)
  full = np.asarray(gpu.sum_squares(x, ones))
  for m in (1, 5, 64):
    rows = _rows(m, seed=m)
    np.testing.assert_array_equal(np.asarray(gpu.sum_squares(x[rows], ones)), full[rows])
  want = np.sum(np.square(np.asarray(x, np.float64)), -1, keepdims=True)
  np.testing.assert_allclose(full, want, rtol=2e-5)


def _attention_inputs(b, t, h, s, d, dtype, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((b, t, h, d)), dtype)
  k = jnp.asarray(rng.standard_normal((b, h, s, d)), dtype)
  v = jnp.asarray(rng.standard_normal((b, h, s, d)), dtype)
  lengths = jnp.asarray(rng.integers(1, s + 1, b))                 # per-row cache lengths
  bias = jnp.where(jnp.arange(s)[None, None, None] < lengths[:, None, None, None], 0.0, -1e10)
  return q, k, v, bias.astype(jnp.float32)


def _xla_attention(q, k, v, bias):
  logits = jnp.einsum("bthd,bhsd->bhts", q, k, preferred_element_type=jnp.float32,
                      precision=jax.lax.Precision.HIGHEST) + bias
  w = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum("bhts,bhsd->bthd", w, v.astype(jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)


def _ragged_lengths(b, t, s, seed=0):
  """[B, T] int32 per-row key counts: row 0 of each batch row reads 1 key (given as 0,
  clipped to 1), row 1 all S (given as S + 5, clipped to S): one tile mixes the shortest
  and the longest; the rest at random in 1..S."""
  lengths = np.random.default_rng(seed).integers(1, s + 1, (b, t))
  lengths[:, 0], lengths[:, 1] = 0, s + 5
  return jnp.asarray(lengths, jnp.int32)


@pytest.mark.parametrize("dtype,atol", [(jnp.bfloat16, 2e-2),
                                        pytest.param(jnp.float32, 1e-4, marks=pytest.mark.slow)])
def test_attention_rows_are_invariant_in_t_and_b_and_agree(dtype, atol):
  """Query rows of a 16-token call with ragged per-row lengths are bitwise those of 1-
  and 5-token calls on them, at the start and the end (and a batch row's are those it
  gets alone); S = 70 spans two 64-key chunks, and the rows' lengths end in both. Row 0
  reads 1 key: alone its tile walks one chunk, beside row 1 (all S keys) two, and its
  result is the same. The lengths are bitwise their dense bias (`shapes.dense_bias`)."""
  b, t, h, s, d = 3, 16, 2, 70, 24
  q, k, v, _ = _attention_inputs(b, t, h, s, d, dtype)
  lengths = _ragged_lengths(b, t, s)
  # row 0 alone (T=1 at 0) walks one chunk of 64 keys; beside row 1, two
  assert np.asarray(shapes.tile_chunks(lengths[:, :1], 64, 64, s)).tolist() == [[1]] * b
  assert np.asarray(shapes.tile_chunks(lengths, 64, 64, s)).tolist() == [[2]] * b
  full = np.asarray(gpu.attention(q, k, v, lengths=lengths))
  dense = shapes.dense_bias(None, lengths, b, t, s)
  np.testing.assert_array_equal(np.asarray(gpu.attention(q, k, v, dense)), full)
  for width, start in ((1, 0), (1, t - 1), (5, 3)):
    rows = slice(start, start + width)
    part = np.asarray(gpu.attention(q[:, rows], k, v, lengths=lengths[:, rows]))
    np.testing.assert_array_equal(part, full[:, rows], err_msg=f"T={width}")
  alone = np.asarray(gpu.attention(q[2:3, 3:4], k[2:3], v[2:3], lengths=lengths[2:3, 3:4]))
  np.testing.assert_array_equal(alone, full[2:3, 3:4])
  # row 0 alone walks one chunk: the keys past it may hold NaN, never read
  poisoned = [a[2:3].at[:, :, 64:].set(jnp.nan) for a in (k, v)]
  np.testing.assert_array_equal(
      np.asarray(gpu.attention(q[2:3, :1], *poisoned, lengths=lengths[2:3, :1])), full[2:3, :1])
  # bfloat16: probabilities enter p @ v in bfloat16 (XLA's path rounds them too)
  np.testing.assert_allclose(full, np.asarray(_xla_attention(q, k, v, dense)), atol=atol)


@pytest.mark.slow
def test_attention_keys_per_chunk_come_from_the_tile_table():
  """A table entry of 128 keys per chunk (head size 24, padded to 64; bfloat16): rows stay
  invariant in T and B (S = 200: two chunks, the second masked in part), the result
  agrees with XLA's, and the kernel lowers for CUDA; float32 keeps 64."""
  q, k, v, bias = _attention_inputs(3, 5, 1, 200, 24, jnp.bfloat16)
  by_64 = np.asarray(gpu.attention(q, k, v, bias))
  with tiles.using({"attention": {"64:bfloat16": {"chunk": 128}}}):
    assert tiles.chunk(64, jnp.bfloat16) == 128 and tiles.chunk(64, jnp.float32) == 64
    full = np.asarray(gpu.attention(q, k, v, bias))
    assert not np.array_equal(full, by_64)        # the chunks changed: another softmax order
    np.testing.assert_array_equal(np.asarray(gpu.attention(q[:, 3:4], k, v, bias)),
                                  full[:, 3:4])
    np.testing.assert_array_equal(
        np.asarray(gpu.attention(q[1:2], k[1:2], v[1:2], bias[1:2])), full[1:2])
    np.testing.assert_allclose(full, np.asarray(_xla_attention(q, k, v, bias)), atol=2e-2)
    text = _lowers(lambda *a: gpu.attention(*a, interpret=False), q, k, v, bias)
  assert "mosaic_gpu" in text


@pytest.mark.slow
def test_attention_takes_a_broadcast_bias_lengths_and_checks_shapes():
  """A [1, H, T, S] bias with ragged per-row lengths (1 and S included) is bitwise the
  kernel with no lengths and their dense bias (`shapes.dense_bias`), and agrees with
  XLA's; grouped K/V and no bias: bitwise repeated K/V and an explicit zero bias."""
  q, k, v, bias = _attention_inputs(2, 3, 2, 9, 8, jnp.float32)
  rel = jnp.asarray(np.random.default_rng(1).standard_normal((1, 2, 3, 9)), jnp.float32)
  lengths = _ragged_lengths(2, 3, 9, seed=1)
  dense = shapes.dense_bias(rel, lengths, 2, 3, 9)                # [B, H, T, S]
  got = np.asarray(gpu.attention(q, k, v, rel, lengths))
  np.testing.assert_array_equal(np.asarray(gpu.attention(q, k, v, dense)), got)
  np.testing.assert_allclose(got, np.asarray(_xla_attention(q, k, v, dense)), atol=1e-4)
  # grouped K/V (one K/V head for both query heads) read in place, bitwise as repeated;
  # no bias (no bias operand) bitwise an explicit zero bias [1, 1, 1, S]
  np.testing.assert_array_equal(
      np.asarray(gpu.attention(q, k[:, :1], v[:, :1])),
      np.asarray(gpu.attention(q, *(jnp.repeat(a[:, :1], 2, axis=1) for a in (k, v)),
                               jnp.zeros((1, 1, 1, 9)))))
  with pytest.raises(ValueError, match=r"not \[B, Hkv, S, D\]"):
    gpu.attention(q, k[:, :, :, :4], v, bias)
  with pytest.raises(ValueError, match="bias"):
    gpu.attention(q, k, v, bias[..., :8])
  with pytest.raises(ValueError, match="lengths"):
    gpu.attention(q, k, v, lengths=lengths[:, :2])


# ----------------------------------------------------------------------------- CUDA lowering


def _lowers(f, *args) -> str:
  return gpu.lower_for_cuda(f, *args).as_text()


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernels_lower_for_cuda(products, dtype):
  """Mosaic GPU's lowering (no GPU needed) accepts each kernel as compiled for a GPU:
  one column tile per block, 64-key chunks."""
  x, w = products
  wp = gpu.pack(w, dtype)
  text = _lowers(lambda a, b: matmul.dot(a, b, N, interpret=False), x[:5].astype(dtype), wp)
  assert "mosaic_gpu" in text
  ones = gpu.pack(jnp.ones((K, 1), jnp.float32), jnp.float32)
  assert "mosaic_gpu" in _lowers(lambda a, b: matmul.sum_squares(a, b, interpret=False),
                                 x[:5], ones)
  q, k, v, bias = _attention_inputs(2, 3, 2, 70, 24, dtype)
  assert "mosaic_gpu" in _lowers(
      lambda *a: gpu.attention(*a, interpret=False), q, k, v, bias)
  # per-row lengths (a dynamic chunk count, an in-kernel mask), with and without a bias
  lengths = _ragged_lengths(2, 3, 70)
  assert "mosaic_gpu" in _lowers(
      lambda *a: gpu.attention(*a, lengths=lengths, interpret=False), q, k, v)
  assert "mosaic_gpu" in _lowers(
      lambda *a: gpu.attention(*a, lengths=lengths, interpret=False), q, k, v, bias)


# ----------------------------------------------------------------------------- the model


def test_gpu_packing_puts_every_product_on_the_kernels():
  model = sd.init_model(sd.get_config("t5_1_1_tiny"), 0, "bfloat16")
  packed = sd.pack(model, kernels="gpu")
  weights = packed.decode_weights
  assert weights.policy.backend == "gpu" and weights.xla == ()
  assert "interpret" in weights.policy.reason or jax.default_backend() == "gpu"
  assert packed.width_invariant_decode and not sd.pack(model, kernels="xla").width_invariant_decode
  leaves = jax.tree_util.tree_leaves(weights.weights, is_leaf=lambda x: hasattr(x, "backend"))
  assert {p.backend for p in leaves} == {"gpu"}
  assert backends.get("gpu").kinds == frozenset(weights.products[i].kind
                                                for i in range(len(weights.products)))
