"""The tpu backend's kernels (specdec_jax.kernels.tpu, Pallas on Mosaic TPU), on CPU.

Where no TPU is the default backend they run in Pallas's TPU interpret mode: each row of
a product, sum of squares and attention is bitwise the same whatever the number of rows
M, the row's position and the call width, and agrees with XLA's ops to rounding (each
MXU product runs as an in-order product here: the interpreter's own is the host's
matmul, whose rows can depend on their position in the tile). The same kernels compiled
for a TPU (interpret=False) go through Pallas's Mosaic TPU lowering here too
(`lower_for_tpu`), which rejects block shapes a TPU cannot tile (negative controls: a
plain kernel with a [5, 100] block, and our matmul with its row tile cut to 4). Shapes
are small: the interpreter runs every block copy as a host callback.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import METHOD_NAMES, every_method_at_natural_widths, perturbed, ragged_tokens
from jax.experimental import pallas as pl

import specdec_jax as sd
from specdec_jax import testing
from specdec_jax.errors import InputError
from specdec_jax.kernels import backends, selfcheck, shapes, tpu
from specdec_jax.kernels.tpu import decode_attention, matmul

# An accelerator backend in interpret mode: the full suite's (README's command), not the
# fast tier's, which proves the factors on XLA and the cpu kernels (CONTRIBUTING).
pytestmark = pytest.mark.slow

K, N = 70, 130                    # odd: both edges padded at packing
BLOCK_RULE = "divisible by 8 and 128"
#: The baselines' outputs of the end-to-end decode, by method value (decoded once).
BASELINES: dict = {}


def _rows(m: int, seed: int = 0, of: int = 512) -> np.ndarray:
  """Positions in an `of`-row reference of the m rows of a call: scattered, reversed."""
  return np.random.default_rng(seed).permutation(of)[:m][::-1].copy()


@pytest.fixture(scope="module")
def products():
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.standard_normal((K, N)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((512, K)), jnp.float32)
  return x, w


QUICK = "quick"   # the fast tier's case: fewer calls (each new shape compiles ~1 s here)


@pytest.mark.parametrize("dtype,case", [
    (jnp.bfloat16, QUICK), pytest.param(jnp.bfloat16, "full", marks=pytest.mark.slow),
    pytest.param(jnp.float32, "full", marks=pytest.mark.slow)])
def test_dot_rows_are_bitwise_independent_of_m_and_position(products, dtype, case):
  """Rows of calls of 1, 5 and 129 rows (the last: two row tiles, one row in the second)
  are bitwise those of a 512-row call (four tiles), taken from scattered positions.
  Quick: 5 rows of a 160-row call (two tiles), from both tiles."""
  x, w = products
  wp = tpu.pack(w, dtype)
  of, ms = (160, (5,)) if case == QUICK else (512, (1, 5, matmul.TM + 1))
  full = np.asarray(tpu.dot(x[:of].astype(dtype), wp, N))
  for m in ms:
    rows = _rows(m, seed=m, of=of)
    assert case != QUICK or (rows.min() < matmul.TM <= rows.max())
    got = np.asarray(tpu.dot(x[rows].astype(dtype), wp, N))
    np.testing.assert_array_equal(got, full[rows], err_msg=f"M={m}")
  if case != QUICK:        # [..., K] leading dims: a [B, T, K] call is its rows
    got = np.asarray(tpu.dot(x[:6].astype(dtype).reshape(2, 3, K), wp, N))
    np.testing.assert_array_equal(got.reshape(6, N), full[:6])


@pytest.mark.parametrize("dtype,rtol", [(jnp.bfloat16, 1e-5), (jnp.float32, 2e-6)])
def test_dot_agrees_with_xla(products, dtype, rtol):
  """bfloat16: XLA's bfloat16 product with float32 accumulation; float32: XLA's at
  HIGHEST precision. K = 1100 spans two K steps of 640 (and pads 180)."""
  x, w = products
  rng = np.random.default_rng(1)
  for xs, ws in ((x[:5], w), (jnp.asarray(rng.standard_normal((3, 1100)), jnp.float32),
                              jnp.asarray(rng.standard_normal((1100, N)), jnp.float32))):
    got = np.asarray(tpu.dot(xs.astype(dtype), tpu.pack(ws, dtype), N))
    want = np.asarray(jnp.dot(xs.astype(dtype), ws.astype(dtype),
                              preferred_element_type=jnp.float32,
                              precision=jax.lax.Precision.HIGHEST))
    assert got.shape == want.shape
    scale = np.abs(xs).sum(-1, keepdims=True) * np.abs(ws).max()
    assert np.max(np.abs(got - want) / scale) <= rtol


def test_tiles_are_fixed_by_the_weight_shape():
  assert matmul.tiles(70, 130) == (128, 256, 128, 256)
  assert matmul.tiles(1100, 1) == (640, 128, 1280, 128)          # two K steps, not 1024 + 76
  assert matmul.tiles(4096, 10240) == (1024, 512, 4096, 10240)   # T5-XXL's MLP
  assert matmul.tiles(512, 32128) == (512, 512, 512, 32256)      # T5's vocabulary, padded


def test_packing_pads_the_edges_with_zeros_and_is_checked():
  w = jnp.ones((K, N), jnp.float32)
  wp = tpu.pack(w)
  assert wp.shape == (128, 256) and wp.dtype == jnp.float32
  assert np.asarray(wp[:K, :N]).min() == 1 and not np.asarray(wp[K:]).any()
  assert not np.asarray(wp[:, N:]).any()
  assert tpu.pack(w, jnp.bfloat16).dtype == jnp.bfloat16
  with pytest.raises(InputError, match="not a TPU packing of a \\[140, 130\\] matrix"):
    tpu.dot(jnp.ones((1, 2 * K)), wp, N)
  with pytest.raises(InputError, match="float32 or bfloat16"):
    tpu.pack(w.astype(jnp.float16))


def test_sum_squares_rows_are_invariant_and_agree(products):
  x, _ = products
  ones = tpu.pack(jnp.ones((K, 1), jnp.float32), jnp.float32)
  full = np.asarray(tpu.sum_squares(x, ones))
  assert full.shape == (512, 1)
  for m in (1, 5):
    rows = _rows(m, seed=m)
    np.testing.assert_array_equal(np.asarray(tpu.sum_squares(x[rows], ones)), full[rows])
  want = np.sum(np.square(np.asarray(x, np.float64)), -1, keepdims=True)
  np.testing.assert_allclose(full, want, rtol=2e-6)


def _attention_inputs(b, t, h, s, d, dtype, seed=0, lengths=None):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((b, t, h, d)), dtype)
  k = jnp.asarray(rng.standard_normal((b, h, s, d)), dtype)
  v = jnp.asarray(rng.standard_normal((b, h, s, d)), dtype)
  if lengths is None:                                               # per-row cache lengths
    lengths = rng.integers(1, s + 1, b)
  lengths = jnp.asarray(lengths).reshape(b, 1, -1, 1)               # [B] or [B, T]
  bias = jnp.where(jnp.arange(s) < lengths, 0.0, shapes.MASKED)
  return q, k, v, bias.astype(jnp.float32)


def _xla_attention(q, k, v, bias):
  logits = jnp.einsum("bthd,bhsd->bhts", q, k, preferred_element_type=jnp.float32,
                      precision=jax.lax.Precision.HIGHEST) + bias
  w = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum("bhts,bhsd->bthd", w, v.astype(jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)


@pytest.mark.parametrize("dtype,atol,case", [
    (jnp.bfloat16, 2e-2, QUICK), pytest.param(jnp.bfloat16, 2e-2, "full", marks=pytest.mark.slow),
    pytest.param(jnp.float32, 1e-5, "full", marks=pytest.mark.slow)])
def test_attention_rows_are_invariant_in_t_and_b_and_agree(dtype, atol, case):
  """Per-row lengths: bitwise the same kernel with their mask as a dense bias. Query rows
  of a 17-token call (two query tiles) are bitwise those of 1- and 5-token calls on them,
  at the start and the end (and a batch row's are those it gets alone); S = 150 spans two
  128-key chunks; the ragged lengths (0, 1, S, past S, either chunk) mask keys of both, and
  the first tile of row 0 holds a 150-key row beside rows of at most 128 keys, so it
  walks two chunks where its last rows alone walk one (and never read the second).
  Quick: those rows alone."""
  b, t, h, s, d = 3, 17, 2, 150, 24
  q, k, v, _ = _attention_inputs(b, t, h, s, d, dtype)
  lengths = jnp.asarray(np.random.default_rng(2).integers(1, s + 1, (b, t)), jnp.int32)
  lengths = lengths.at[0].set(jnp.asarray([150, 1] + [129, 5, 128, 90] * 3 + [12, 77, 3]))
  lengths = lengths.at[2, :4].set(jnp.asarray([1, 150, 400, 0]))
  assert decode_attention.C == 128
  walk = lambda lens: np.asarray(shapes.tile_chunks(lens, decode_attention.TQ, 128, s))
  assert walk(lengths[:1]).tolist() == [[2, 1]] and walk(lengths[:1, 12:]).tolist() == [[1]]
  full = np.asarray(tpu.attention(q, k, v, lengths=lengths))
  mask = shapes.dense_bias(None, lengths, b, t, s)
  np.testing.assert_array_equal(full, np.asarray(tpu.attention(q, k, v, mask)))
  calls = (((1, 0), (1, t - 1), (5, 12)) if case != QUICK else ())
  for width, start in calls:
    part = np.asarray(tpu.attention(q[:, start:start + width], k, v,
                                    lengths=lengths[:, start:start + width]))
    np.testing.assert_array_equal(part, full[:, start:start + width], err_msg=f"T={width}")
  # alone, the rows walk one chunk: NaN keys and values past it are never read
  k1, v1 = (a[:1].at[:, :, 128:].set(jnp.nan) for a in (k, v))
  alone = np.asarray(tpu.attention(q[:1, 12:], k1, v1, lengths=lengths[:1, 12:]))
  np.testing.assert_array_equal(alone, full[:1, 12:])
  # bfloat16: probabilities enter p @ v in bfloat16 (XLA's path rounds them too)
  np.testing.assert_allclose(full, np.asarray(_xla_attention(q, k, v, mask)), atol=atol)


@pytest.mark.slow
def test_attention_takes_a_broadcast_bias_and_checks_shapes():
  """A [1, H, T, S] bias beside per-row lengths is bitwise that bias plus their mask;
  bias=None is bitwise a zero bias."""
  lengths = jnp.asarray([[1, 9, 4], [2, 9, 6]], jnp.int32)
  q, k, v, bias = _attention_inputs(2, 3, 2, 9, 8, jnp.float32, lengths=lengths)
  rel = jnp.asarray(np.random.default_rng(1).standard_normal((1, 2, 3, 9)), jnp.float32)
  got = np.asarray(tpu.attention(q, k, v, rel + bias))           # [B, H, T, S] from both
  np.testing.assert_array_equal(np.asarray(tpu.attention(q, k, v, jnp.broadcast_to(
      rel + bias, (2, 2, 3, 9)))), got)
  np.testing.assert_allclose(got, np.asarray(_xla_attention(q, k, v, rel + bias)), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(tpu.attention(q, k, v, rel, lengths)), got)
  # grouped K/V (one K/V head for both query heads) read in place and no bias: bitwise
  # the K/V repeated and a zero bias (one pair of calls for both: the interpreter is slow)
  zero = jnp.zeros((1, 1, 1, 9), jnp.float32)
  np.testing.assert_array_equal(
      np.asarray(tpu.attention(q, k[:, :1], v[:, :1], lengths=lengths)),
      np.asarray(tpu.attention(q, *(jnp.repeat(a[:, :1], 2, axis=1) for a in (k, v)), zero,
                               lengths)))
  with pytest.raises(ValueError, match=r"not \[B, Hkv, S, D\]"):
    tpu.attention(q, k[:, :, :, :4], v, bias)
  with pytest.raises(ValueError, match="bias"):
    tpu.attention(q, k, v, bias[..., :8])
  with pytest.raises(ValueError, match="lengths"):
    tpu.attention(q, k, v, lengths=lengths[:, :2])


# ----------------------------------------------------------------------------- TPU lowering


def _lowers(f, *args) -> str:
  return tpu.lower_for_tpu(f, *args).as_text()


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernels_lower_for_tpu(products, dtype):
  """Pallas's Mosaic TPU lowering (no TPU needed) accepts each kernel as compiled for a
  TPU: [128, TK] x [TK, TN] tiles, [16, 128] query tiles, 128-key chunks; the program
  holds the Mosaic custom call and no interpreter callback."""
  x, w = products
  wp = tpu.pack(w, dtype)
  texts = [
      _lowers(lambda a, b: matmul.dot(a, b, N, interpret=False), x[:5].astype(dtype), wp),
      _lowers(lambda a, b: matmul.sum_squares(a, b, interpret=False), x[:5],
              tpu.pack(jnp.ones((K, 1), jnp.float32), jnp.float32)),
      _lowers(lambda *a: tpu.attention(*a, interpret=False),
              *_attention_inputs(2, 3, 2, 150, 24, dtype))]
  q, k, v, bias = _attention_inputs(2, 3, 2, 150, 24, dtype)
  lengths = jnp.asarray([[1, 150, 129], [7, 128, 60]], jnp.int32)
  with_lengths = lambda *a: tpu.attention(*a, lengths=lengths, interpret=False)
  texts += [_lowers(with_lengths, q, k, v, bias), _lowers(with_lengths, q, k, v)]
  for text in texts:
    assert "tpu_custom_call" in text and "callback" not in text
  # bias=None: the kernel has no bias operand (chunk counts, lengths, q, k, v)
  kernel, = (e for e in jax.make_jaxpr(with_lengths)(q, k, v).eqns
             if e.primitive.name == "pallas_call")
  assert [a.aval.shape for a in kernel.invars[:2]] == [(2,), (2, 16, 1)]
  assert len(kernel.invars) == 5


def test_tpu_lowering_rejects_block_shapes_a_tpu_cannot_tile(products, monkeypatch):
  """Negative controls: a [5, 100] block fails Mosaic TPU's lowering, and so does our
  matmul with its row tile cut to 4 rows (the same kernel lowers at TM = 128 above)."""
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

  def f(x):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((10, 200), jnp.float32),
                          grid=(2, 2), in_specs=[pl.BlockSpec((5, 100), lambda i, j: (i, j))],
                          out_specs=pl.BlockSpec((5, 100), lambda i, j: (i, j)))(x)

  with pytest.raises(ValueError, match=BLOCK_RULE):
    _lowers(f, jnp.ones((10, 200), jnp.float32))
  x, w = products
  monkeypatch.setattr(matmul, "TM", 4)
  with pytest.raises(ValueError, match=BLOCK_RULE):
    _lowers(lambda a, b: matmul.dot(a, b, N, interpret=False), x[:5], tpu.pack(w))


# ----------------------------------------------------------------------------- the model


def _tiny(vocab: int = 509) -> sd.Model:
  """A one-layer t5_1_1_tiny in bfloat16 with an odd vocabulary (the output product's
  columns padded to 512 and cut)."""
  config = dataclasses.replace(sd.get_config("t5_1_1_tiny"), vocab_size=vocab,
                               num_encoder_layers=1, num_decoder_layers=1)
  return sd.init_model(config, 1, "bfloat16")


@pytest.fixture(scope="module")
def tiny():
  """(`_tiny()`, it packed for the tpu backend)."""
  model = _tiny()
  return model, sd.pack(model, kernels="tpu")


def test_tpu_packing_puts_every_product_on_the_kernels_and_auto_never_picks_it(tiny, monkeypatch):
  model, packed = tiny
  weights = packed.decode_weights
  assert weights.policy.backend == "tpu" and weights.xla == ()
  assert "TPU interpret mode" in weights.policy.reason or jax.default_backend() == "tpu"
  assert packed.width_invariant_decode and not sd.pack(model, kernels="xla").width_invariant_decode
  leaves = jax.tree_util.tree_leaves(weights.weights, is_leaf=lambda x: hasattr(x, "backend"))
  assert {p.backend for p in leaves} == {"tpu"}
  assert {p.kind for p in weights.products} == backends.get("tpu").invariant == frozenset(
      backends.KINDS)
  # an explicit opt-in: "auto" does not pick it, not even on a TPU (faked: the first-use
  # self-check, which would run the kernels compiled, passes by fiat here)
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  monkeypatch.setattr(selfcheck, "check", lambda backend, kind: "")
  assert backends.choose("auto", None) != "tpu"
  assert backends.choose("tpu", None) == "tpu"


def test_a_decode_request_on_tpu_kernels_lowers_for_tpu(tiny, monkeypatch):
  """A whole decode request (`Model.start` + a 3-token `Model.decode`) of a model packed
  for tpu, its kernels compiled (not interpreted), lowers for TPU on this machine: every
  product is one Mosaic TPU kernel at the model's real shapes (head_dim 16, vocabulary
  509), and nothing calls back to the host."""
  monkeypatch.setattr(tpu.mode, "interpret", lambda: False)
  jax.clear_caches()                     # no jaxpr traced in interpret mode is reused
  _, target = tiny

  def request(model, enc, tokens):
    return model.decode(tokens, model.start(enc, capacity=16))[0]

  text = tpu.lower_for_tpu(request, target, jnp.ones((2, 8), jnp.int32),
                           jnp.ones((2, 3), jnp.int32)).as_text()
  products = target.decode_weights.products
  assert {p.kind for p in products} == set(backends.KINDS)
  assert text.count("tpu_custom_call") == len(products) and "callback" not in text
  jax.clear_caches()


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("name", METHOD_NAMES)
def test_every_method_on_tpu_kernels_is_bitwise_the_baseline_at_natural_widths(
    tiny, monkeypatch, name):
  """The tpu backend's end-to-end decode (interpret mode here), every method of the
  registry on the tiny bfloat16 target (drafter and heads on XLA's ops): greedy output
  bitwise the baseline's with every target call at its natural width
  (`helpers.every_method_at_natural_widths`)."""
  model, target = tiny
  methods = testing.examples(None, perturbed(model, 0.05, seed=0),
                             sd.init_heads(model, 2, rng=1, init_scale=1.0))
  every_method_at_natural_widths(target, methods, name, ragged_tokens(2, 8, model.vocab_size,
                                                                      seed=4),
                                 5, monkeypatch, BASELINES)
