"""CPU decode kernels (specdec_jax.kernels): products, M-invariance, the model's decode path,
and the backend seam (`sd.pack(kernels=)`, `sd.load(kernels=)`; the gpu backend's kernels:
tests/test_gpu_kernels.py).

Kernel tests skip (with the reason) where the kernels are unavailable: another
backend, a CPU without AVX-512F or AVX2 (with FMA), no compiler, a failed build, or
SPECDEC_CPU_KERNELS=0. The fallback tests run everywhere.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from helpers import ragged_tokens

import specdec_jax as sd
from specdec_jax import kernels
from specdec_jax.errors import InputError
from specdec_jax.kernels import backends, build, dispatch, shapes, skinny
from specdec_jax.models import packing
from specdec_jax.rounds import engine

STATUS = kernels.status()
needs_kernels = pytest.mark.skipif(not STATUS.available,
                                   reason=f"CPU kernels unavailable: {STATUS.reason}")
PAIRS = pathlib.Path(__file__).parent / "data" / "demo_test_pairs.jsonl"
SHAPES = [(256, 768), (255, 1000), (7, 5), (1, 17), (64, 33), (513, 130)]


def _off(monkeypatch):
  monkeypatch.setenv(kernels.ENV_VAR, "0")


def _uses_kernel(fn, *args) -> bool:
  return build.DOT in jax.jit(fn).lower(*args).as_text()


def _decode(model, tokens, cache):
  return model.decode(tokens, cache)[0]


def _packed_dots(model):
  """{key: dtype} of the packed weights of `model`'s matmuls (not norms, not attention)."""
  weights = flatten_dict(sd.pack(model).decode_weights.weights)
  return {p: x.operand.dtype for p, x in weights.items()
          if p[-1] not in ("sum_squares", "attention")}


@pytest.fixture(scope="module")
def demo():
  """The demo target, a held-out batch and a cache prefilled with 16 positions."""
  target = sd.load("demo-de-en/target")
  tok = sd.load_tokenizer("demo-de-en")
  rows = [json.loads(line) for line in PAIRS.read_text().splitlines()[:8]]
  enc = jnp.asarray(tok.encode([r["de"] for r in rows]), jnp.int32)
  return target, enc


def _prefilled(model, enc, length=16, capacity=48, seed=0):
  rng = np.random.default_rng(seed)
  cache = model.start(enc, capacity=capacity)
  prefix = jnp.asarray(rng.integers(2, model.vocab_size, (enc.shape[0], length)), jnp.int32)
  return model.decode(prefix, cache)[1]


# ----------------------------------------------------------------------------- fallback


def test_status_says_why():
  assert isinstance(STATUS, kernels.Status) and STATUS.reason
  assert STATUS.available == (STATUS.library is not None)


def test_instruction_set_is_the_best_the_cpu_has():
  pick = lambda *flags: (build.instruction_set(set(flags)) or ("none",))[0]
  assert pick("avx512f", "avx2", "fma") == "avx512"
  assert pick("avx2", "fma", "f16c") == "avx2"         # e.g. AMD EPYC before Zen 4
  assert pick("avx512f", "avx2") == "none"             # both sets need FMA
  assert pick("avx", "sse4_2") == "none"
  if STATUS.available:                                  # the library says which it built
    assert f"({build.instruction_set()[0]})" in STATUS.reason
    assert f"kernels-{build.instruction_set()[0]}-" in STATUS.library


@pytest.mark.slow
def test_env_var_disables_and_decode_falls_back_to_dot(monkeypatch, demo):
  target, enc = demo
  _off(monkeypatch)
  assert not kernels.available() and kernels.ENV_VAR in kernels.status().reason
  packed = sd.pack(target)                       # "auto": xla here, visibly
  assert packed.decode_weights.policy.backend == "xla" and not packed.decode_weights.weights
  assert kernels.ENV_VAR in packed.decode_weights.policy.reason
  assert not dispatch.policy().kernels and not packed.width_invariant_decode
  cache = _prefilled(packed, enc[:1])
  tokens = jnp.asarray([[5, 6, 7]], jnp.int32)
  assert not _uses_kernel(_decode, packed, tokens, cache)
  with pytest.raises(InputError, match="cpu kernels are unavailable"):
    sd.pack(target, kernels="cpu")              # asked for by name: an error, not a fallback


@pytest.mark.slow
def test_decode_uses_kernel_exactly_when_available(demo):
  target, enc = demo
  cache = _prefilled(target, enc[:1])
  tokens = jnp.asarray([[5, 6, 7]], jnp.int32)
  packed = sd.pack(target)
  assert _uses_kernel(_decode, packed, tokens, cache) == STATUS.available
  assert (packed.decode_weights.policy.backend == "cpu") == STATUS.available
  unpacked = sd.Model(config=target.config, params=target.params)
  assert not _uses_kernel(_decode, unpacked, tokens, cache)   # nothing packs implicitly


def test_failed_build_warns_once_and_falls_back(monkeypatch, tmp_path):
  saved = list(build._STATUS)
  monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("CXX", "false")            # a "compiler" that always fails
  monkeypatch.delenv(kernels.ENV_VAR, raising=False)
  if jax.default_backend() != "cpu" or build.instruction_set() is None:
    pytest.skip("this machine never builds the kernels")
  try:
    build._STATUS.clear()
    with pytest.warns(RuntimeWarning, match="using XLA's dot instead"):
      assert not kernels.available()
    assert not kernels.available()                # decided once: no second warning
    assert not list(tmp_path.glob("*.so"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    build._STATUS.clear()
    with pytest.warns(RuntimeWarning, match="no C.. compiler"):
      assert not kernels.available()
  finally:
    build._STATUS[:] = saved


# ----------------------------------------------------------------------------- products


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("k,n", SHAPES)
def test_product_matches_dot(k, n, dtype):
  rng = np.random.default_rng(k * n)
  w = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
  wp = kernels.pack(w, dtype)
  for m in (1, 3, 16):
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    y = kernels.dot(x, wp, n)
    ref = jnp.dot(x, w.astype(dtype).astype(jnp.float32), precision="highest")
    assert y.shape == (m, n) and y.dtype == jnp.float32
    scale = float(jnp.max(jnp.abs(ref)))
    assert float(jnp.max(jnp.abs(y - ref))) <= 1e-5 * scale


def _assert_rows_invariant(dot, x):
  """Each row of `dot` (x [16, K] -> [16, N]) is bitwise the same in every call: alone, in
  each suffix of x (M = 1..16 rows, the row at another position), as [2, 8, K] under jit
  and vmapped over [4, 4, K]."""
  single = np.stack([np.asarray(dot(x[i:i + 1]))[0] for i in range(16)])
  for m in range(1, 17):
    rows = np.asarray(dot(x[16 - m:]))                   # row i sits at another position
    np.testing.assert_array_equal(rows, single[16 - m:], err_msg=f"M={m}")
  batched = np.asarray(jax.jit(dot)(x.reshape(2, 8, -1)))
  np.testing.assert_array_equal(batched.reshape(single.shape), single)
  vmapped = np.asarray(jax.vmap(dot)(x.reshape(4, 4, -1)))
  np.testing.assert_array_equal(vmapped.reshape(single.shape), single)


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("k,n", [(256, 768), (255, 1000), (7, 5)])
def test_rows_are_bitwise_independent_of_m(k, n, dtype):
  rng = np.random.default_rng(0)
  wp = kernels.pack(jnp.asarray(rng.standard_normal((k, n)), jnp.float32), dtype)
  x = jnp.asarray(rng.standard_normal((16, k)), jnp.float32)
  _assert_rows_invariant(lambda x: kernels.dot(x, wp, n), x)


@needs_kernels
def test_the_row_check_fails_a_product_whose_rows_depend_on_m():
  """Negative control of `_assert_rows_invariant`: the kernel made to sum K in two halves
  once a call has more than 4 rows (as a product blocked by M might) fails it at M=5."""
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.standard_normal((255, 1000)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((16, 255)), jnp.float32)
  whole, low, high = (kernels.pack(part, jnp.float32) for part in (w, w[:128], w[128:]))

  def blocked_by_m(x):
    if x.reshape(-1, 255).shape[0] <= 4:
      return kernels.dot(x, whole, 1000)
    return kernels.dot(x[..., :128], low, 1000) + kernels.dot(x[..., 128:], high, 1000)

  with pytest.raises(AssertionError, match="M=5"):
    _assert_rows_invariant(blocked_by_m, x)


@needs_kernels
def test_packed_shape_is_checked():
  wp = kernels.pack(jnp.ones((8, 20), jnp.float32))
  assert wp.shape == (2, 8, 16)
  assert kernels.pack(jnp.ones((9, 20), jnp.bfloat16)).shape == (2, 5, 16, 2)
  with pytest.raises(ValueError, match="not a packed"):
    kernels.dot(jnp.ones((1, 8)), wp, 40)
  with pytest.raises(TypeError, match="float32 or bfloat16"):
    kernels.pack(jnp.ones((8, 20), jnp.float16))


# ----------------------------------------------------------------------------- attention


def _xla_attention(q, k, v, bias, softcap=None):
  """The reference: XLA's softmax attention at highest precision, q [B, T, H, D]; the
  logits soft-capped before the bias where `softcap`."""
  logits = jnp.einsum("bthd,bhsd->bhts", q, k.astype(jnp.float32), precision="highest")
  if softcap is not None:
    logits = jnp.tanh(logits / softcap) * softcap
  logits = logits + bias
  probs = jax.nn.softmax(logits, axis=-1)
  if k.dtype == jnp.bfloat16:
    probs = probs.astype(jnp.bfloat16).astype(jnp.float32)
  return jnp.einsum("bhts,bhsd->bthd", probs, v.astype(jnp.float32), precision="highest")


def _attention_inputs(b, t, h, s, d, dtype, bias_shape, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((b, t, h, d)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((b, h, s, d)), dtype) for _ in range(2))
  masked = rng.random(bias_shape) < 0.3
  masked[..., 0] = False                      # every row keeps a key
  bias = jnp.asarray(np.where(masked, -1e10, rng.standard_normal(bias_shape)), jnp.float32)
  return q, k, v, bias


ATTENTION_CASES = [  # b, t, h, s, d, dtype, bias: self-attention [B, H, T, S] / cross [B, 1, 1, S],
    # softcap (the logits soft-capped; None: the rows the kernel computed before it took one)
    (1, 5, 4, 36, 64, jnp.float32, "self", None), (3, 4, 2, 13, 20, jnp.bfloat16, "cross", None),
    (2, 1, 3, 7, 5, jnp.float32, "self", None), (2, 3, 2, 40, 128, jnp.bfloat16, "self", None),
    (1, 5, 4, 36, 64, jnp.float32, "self", 5.0), (2, 3, 2, 40, 128, jnp.bfloat16, "cross", 5.0),
    (2, 2, 2, 9, 8, jnp.float16, "cross", None)]


def _bias_shape(b, t, h, s, kind):
  return (b, h, t, s) if kind == "self" else (b, 1, 1, s)


@needs_kernels
@pytest.mark.parametrize("b,t,h,s,d,dtype,kind,cap", ATTENTION_CASES)
def test_attention_matches_xla(b, t, h, s, d, dtype, kind, cap):
  q, k, v, bias = _attention_inputs(b, t, h, s, d, dtype, _bias_shape(b, t, h, s, kind))
  out = kernels.attention(q, k, v, bias, softcap=cap)
  assert out.shape == (b, t, h, d) and out.dtype == jnp.float32
  ref = _xla_attention(q, k.astype(jnp.float32) if dtype == jnp.float16 else k,
                       v.astype(jnp.float32) if dtype == jnp.float16 else v, bias, cap)
  # bfloat16 probabilities may round the other way where the two softmaxes differ by an ulp
  tol = 2e-2 if dtype == jnp.bfloat16 else 2e-5
  assert float(jnp.max(jnp.abs(out - ref))) <= tol * float(jnp.max(jnp.abs(ref)))


@needs_kernels
@pytest.mark.parametrize("b,t,h,s,d,dtype,kind,cap", ATTENTION_CASES[:-1])
def test_attention_rows_are_bitwise_independent_of_t_and_b(monkeypatch, b, t, h, s, d, dtype,
                                                           kind, cap):
  from specdec_jax.kernels import work
  q, k, v, bias = _attention_inputs(b, t, h, s, d, dtype, _bias_shape(b, t, h, s, kind), seed=1)
  monkeypatch.setattr(work, "PARALLEL_BYTES", 1)   # the whole call split over the pool
  out = np.asarray(kernels.attention(q, k, v, bias, softcap=cap))
  monkeypatch.undo()
  for i in range(t):        # each query row alone
    row_bias = bias[:, :, i:i + 1] if bias.shape[2] > 1 else bias
    alone = kernels.attention(q[:, i:i + 1], k, v, row_bias, softcap=cap)
    np.testing.assert_array_equal(np.asarray(alone)[:, 0], out[:, i])
  for j in range(b):        # each batch row alone
    alone = kernels.attention(q[j:j + 1], k[j:j + 1], v[j:j + 1], bias[j:j + 1], softcap=cap)
    np.testing.assert_array_equal(np.asarray(alone)[0], out[j])
  mapped = jax.vmap(lambda *a: kernels.attention(*(x[None] for x in a), softcap=cap)[0])(
      q, k, v, bias)
  np.testing.assert_array_equal(np.asarray(mapped), out)


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_attention_rows_do_not_depend_on_keys_appended_under_the_mask(dtype):
  """A sentence padded to a longer batch: keys 13..20 appended with the -1e10 mask (across a
  multiple of 8) leave every row bitwise as it was."""
  q, k, v, bias = _attention_inputs(2, 3, 2, 21, 16, dtype, (2, 2, 3, 21), seed=2)
  bias = bias.at[..., 13:].set(-1e10)
  short = kernels.attention(q, k[:, :, :13], v[:, :, :13], bias[..., :13])
  np.testing.assert_array_equal(np.asarray(kernels.attention(q, k, v, bias)), np.asarray(short))


@needs_kernels
def test_attention_gives_masked_keys_exactly_zero_weight():
  """A key under the -1e10 mask contributes nothing: its (finite) value can be anything."""
  q, k, v, bias = _attention_inputs(2, 3, 2, 21, 16, jnp.float32, (2, 2, 3, 21), seed=2)
  bias = bias.at[..., 5:].set(-1e10)
  before = np.asarray(kernels.attention(q, k, v, bias))
  after = np.asarray(kernels.attention(q, k, v.at[:, :, 5:].set(1e6), bias))
  np.testing.assert_array_equal(before, after)
  # the control: unmasked, the same change moves the output
  assert not np.array_equal(np.asarray(kernels.attention(q, k, v, bias * 0)),
                            np.asarray(kernels.attention(q, k, v.at[:, :, 5:].set(1e6), bias * 0)))


@needs_kernels
def test_attention_rounds_bfloat16_probabilities_to_nearest():
  """With v the identity (S = D) the output is the probabilities: with bfloat16 caches they
  are bfloat16 values, within half a bfloat16 ulp of XLA's float32 softmax (so rounded to
  nearest, not truncated); with float32 caches they are not rounded."""
  q, k, _, bias = _attention_inputs(1, 4, 2, 16, 16, jnp.float32, (1, 2, 4, 16), seed=5)
  eye = jnp.broadcast_to(jnp.eye(16, dtype=jnp.float32), (1, 2, 16, 16))
  probs = jax.nn.softmax(jnp.einsum("bthd,bhsd->bhts", q, k.astype(jnp.bfloat16).astype(
      jnp.float32), precision="highest") + bias, axis=-1)
  out = np.asarray(kernels.attention(q, k.astype(jnp.bfloat16), eye.astype(jnp.bfloat16), bias))
  out = np.moveaxis(out, 2, 1)                              # [B, H, T, S]
  np.testing.assert_array_equal(out, np.asarray(jnp.asarray(out).astype(jnp.bfloat16),
                                                np.float32))
  ulp = np.asarray(probs, np.float32) * 2.0 ** -7
  assert np.all(np.abs(out - np.asarray(probs)) <= 0.5 * ulp * (1 + 1e-3) + 1e-7)
  wide = np.moveaxis(np.asarray(kernels.attention(q, k.astype(jnp.bfloat16).astype(jnp.float32),
                                                  eye, bias)), 2, 1)
  assert not np.array_equal(wide, np.asarray(jnp.asarray(wide).astype(jnp.bfloat16), np.float32))
  np.testing.assert_allclose(wide, np.asarray(probs), rtol=1e-5, atol=1e-7)


@needs_kernels
def test_attention_propagates_nan_as_xla_does():
  q, k, v, bias = _attention_inputs(2, 2, 2, 9, 8, jnp.float32, (2, 2, 2, 9), seed=3)
  out = np.asarray(kernels.attention(q.at[0, 1, 1, 3].set(jnp.nan), k, v, bias))
  assert np.isnan(out[0, 1, 1]).all()
  assert not np.isnan(np.delete(out.reshape(-1, 8), 1 * 2 + 1, axis=0)).any()
  out = np.asarray(kernels.attention(q, k, v, bias.at[1, 0, 0, 4].set(jnp.nan)))
  assert np.isnan(out[1, 0, 0]).all() and np.isnan(out).sum() == 8


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_attention_lengths_are_the_mask_and_the_keys_past_them_are_not_read(dtype):
  """Per-row lengths (0 and 30 clipped to 1 and S = 21; rows crossing groups of 8) give
  bitwise the dense bias that masks the keys past them, also without a bias (an explicit
  zero bias alike); the keys past every length may hold NaN: they are never read (a masked
  key is read: the control, NaN)."""
  q, k, v, bias = _attention_inputs(2, 4, 2, 21, 16, dtype, (2, 2, 4, 21), seed=7)
  lengths = jnp.asarray([[1, 9, 21, 0], [30, 8, 16, 3]], jnp.int32)
  for b in (bias, None):
    want = kernels.attention(q, k, v, shapes.dense_bias(b, lengths, 2, 4, 21))
    got = kernels.attention(q, k, v, b, lengths)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  np.testing.assert_array_equal(np.asarray(kernels.attention(q, k, v, None, lengths)),
                                np.asarray(kernels.attention(q, k, v, bias * 0, lengths)))
  short = jnp.full((2, 4), 6, jnp.int32)
  poisoned = [a.at[:, :, 6:].set(jnp.nan) for a in (k, v)]
  out = np.asarray(kernels.attention(q, *poisoned, bias, short))
  np.testing.assert_array_equal(out, np.asarray(kernels.attention(q, k, v, bias, short)))
  masked = kernels.attention(q, *poisoned, shapes.dense_bias(bias, short, 2, 4, 21))
  assert np.isnan(np.asarray(masked)).all()
  with pytest.raises(ValueError, match=r"lengths \[2, 3\] int32 are not \[B, T\]"):
    kernels.attention(q, k, v, bias, lengths[:, :3])


@needs_kernels
def test_attention_takes_grouped_kv_and_checks_shapes():
  """Grouped K/V [B, Hkv, S, D] (4 query heads on 2 K/V heads) are read in place: bitwise
  the attention over K/V repeated per query head (`repeat_kv` order)."""
  q, k, v, bias = _attention_inputs(2, 3, 4, 9, 8, jnp.bfloat16, (2, 4, 3, 9))
  repeated = [jnp.repeat(a[:, :2], 2, axis=1) for a in (k, v)]
  np.testing.assert_array_equal(np.asarray(kernels.attention(q, k[:, :2], v[:, :2], bias)),
                                np.asarray(kernels.attention(q, *repeated, bias)))
  q, k, v, bias = _attention_inputs(2, 3, 2, 9, 8, jnp.float32, (2, 2, 3, 9))
  with pytest.raises(ValueError, match=r"not \[B, Hkv, S, D\]"):
    kernels.attention(q, k[:, :, :, :4], v, bias)
  with pytest.raises(ValueError, match=r"not \[B, Hkv, S, D\]"):
    kernels.attention(q[:, :, :1], k, v, bias[:, :1])     # 2 K/V heads for 1 query head
  with pytest.raises(ValueError, match=r"bias \[2, 2, 2, 9\] is not"):
    kernels.attention(q, k, v, bias[:, :, :2])
  with pytest.raises(ValueError, match="bias"):
    kernels.attention(q, k, v, bias[..., :8])
  with pytest.raises(ValueError, match="must be 4-D"):
    kernels.attention(q[0], k, v, bias)


# ----------------------------------------------------------------------------- the model


@pytest.mark.slow
@needs_kernels
def test_decode_with_kernels_matches_dot(demo):
  target, enc = demo
  cache = _prefilled(target, enc)
  tokens = jnp.asarray(np.random.default_rng(1).integers(2, target.vocab_size, (8, 4)), jnp.int32)
  on = np.asarray(target.decode(tokens, cache)[0])
  off = np.asarray(sd.pack(target, kernels="xla").decode(tokens, cache)[0])
  assert np.max(np.abs(on - off)) <= 1e-5 * np.max(np.abs(off))
  np.testing.assert_array_equal(on.argmax(-1), off.argmax(-1))


@pytest.mark.slow
@needs_kernels
def test_greedy_tokens_identical_on_demo_pair(demo):
  target, enc = demo
  on = sd.generate(target, enc, max_new_tokens=24, exact=False)
  off = sd.generate(sd.pack(target, kernels="xla"), enc, max_new_tokens=24, exact=False)
  np.testing.assert_array_equal(np.asarray(on.tokens), np.asarray(off.tokens))
  np.testing.assert_array_equal(np.asarray(on.lengths), np.asarray(off.lengths))


def _verify_vs_steps(model, enc, ks=(2, 3, 5, 9)):
  cache = _prefilled(model, enc)
  rng = np.random.default_rng(2)
  for k in ks:
    tokens = jnp.asarray(rng.integers(2, model.vocab_size, (enc.shape[0], k)), jnp.int32)
    big = np.asarray(model.decode(tokens, cache)[0])
    steps, c = [], cache
    for j in range(k):
      logits, c = model.decode(tokens[:, j:j + 1], c)
      steps.append(np.asarray(logits)[:, 0])
    np.testing.assert_array_equal(big, np.stack(steps, axis=1), err_msg=f"k={k}")


@needs_kernels
@pytest.mark.parametrize("batch", [1, 8])
def test_verify_call_is_bitwise_the_single_steps(demo, batch):
  target, enc = demo
  _verify_vs_steps(target, enc[:batch])


@pytest.mark.slow
@needs_kernels
@pytest.mark.parametrize("name,dtype", [("t5_1_1_tiny", "bfloat16"), ("t5_1_0_tiny", "float32")])
def test_verify_call_is_bitwise_the_single_steps_tiny(name, dtype):
  """Beside the demo (a float32 T5 1.1 above): bfloat16, and T5 1.0's tied output layer."""
  model = sd.pack(sd.init_model(sd.get_config(name), 3, dtype))
  assert model.width_invariant_decode
  _verify_vs_steps(model, jnp.asarray(ragged_tokens(2, 10, model.vocab_size)), ks=(2, 4))


@needs_kernels
@pytest.mark.parametrize("k", [1, 4])
def test_decode_call_runs_attention_and_products_on_kernels(demo, k):
  """A cached decode call has no XLA dot left: both attentions of every decoder layer are
  one attention kernel call each (any k), every product a skinny product."""
  target, enc = demo
  cache = _prefilled(target, enc[:2])
  hlo = jax.jit(_decode).lower(sd.pack(target), jnp.ones((2, k), jnp.int32), cache).as_text()
  assert hlo.count(f"custom_call @{build.ATTENTION}(") == 2 * target.config.num_decoder_layers
  assert hlo.count(f"custom_call @{build.DOT}(") > 0
  assert "stablehlo.dot_general" not in hlo


@pytest.mark.slow
@needs_kernels
def test_packing_is_explicit_and_new_params_unpack(monkeypatch, demo):
  """sd.load packs ("auto": cpu here); sd.pack of a Model packed under the same policy
  is that Model; new params drop the packed weights (the Model then runs XLA's ops);
  nothing is memoised per Model object: a policy change repacks."""
  target, enc = demo
  assert target.decode_weights.policy.backend == "cpu"                 # sd.load packed it
  assert sd.pack(target) is target and sd.pack(target, kernels="cpu") is target
  cache = _prefilled(target, enc[:1])
  tokens = jnp.asarray([[5, 6, 7]], jnp.int32)
  before = np.asarray(target.decode(tokens, cache)[0])

  params = jax.tree_util.tree_map(lambda x: x, target.params)
  params["decoder"]["logits_dense"]["kernel"] = params["decoder"]["logits_dense"]["kernel"] * 2
  changed = target.replace(params=params)
  assert changed.decode_weights is None                   # new params drop the packed weights
  assert not _uses_kernel(_decode, changed, tokens, cache)
  after = np.asarray(changed.decode(tokens, cache)[0])
  np.testing.assert_allclose(after, 2 * before, rtol=1e-5, atol=1e-5)
  repacked = sd.pack(changed)
  np.testing.assert_allclose(np.asarray(repacked.decode(tokens, cache)[0]), 2 * before,
                             rtol=1e-5, atol=1e-5)

  bf16 = target.with_dtype("bfloat16")
  assert bf16.decode_weights is None
  assert set(_packed_dots(bf16).values()) == {jnp.dtype(jnp.bfloat16)}
  xla = sd.pack(target, kernels="xla")
  assert xla.decode_weights.policy.backend == "xla" and not xla.width_invariant_decode
  assert sd.pack(xla).decode_weights.policy.backend == "cpu"           # another policy: repacked
  _off(monkeypatch)
  assert sd.pack(target).decode_weights.policy.backend == "xla"        # asked on every pack


def test_kernels_choice_is_checked_and_auto_documented():
  with pytest.raises(InputError, match="kernels must be one of auto, cpu, gpu, tpu, xla"):
    sd.load("config:t5_1_1_tiny", kernels="npu")
  with pytest.raises(InputError, match="kernels must be one of"):
    backends.get("auto")
  model = sd.init_model(sd.get_config("t5_1_1_tiny"), 0)
  assert model.decode_weights is None                                  # init_model: unpacked
  want = "cpu" if STATUS.available and jax.default_backend() == "cpu" else "xla"
  assert backends.choose("auto", model.params) == want
  assert backends.get("xla").invariant == frozenset()
  assert backends.get("cpu").invariant == backends.get("gpu").invariant == frozenset(
      dispatch.KINDS)
  with pytest.raises(InputError, match="concrete params"):
    jax.jit(lambda m: sd.pack(m).params)(model)


def test_treedef_does_not_depend_on_the_kernels(monkeypatch, demo):
  """An unpacked Model's pytree structure is the same with the kernels on and off, and
  using it (decode calls, a jit argument) writes nothing onto it."""
  target, enc = demo
  fresh = lambda: sd.Model(config=target.config, params=target.params)
  on = fresh()
  jax.jit(lambda m: m.encode(enc[:1]))(on)
  on.start(enc[:1], capacity=4)
  _off(monkeypatch)
  off = fresh()
  off.start(enc[:1], capacity=4)
  assert jax.tree_util.tree_structure(on) == jax.tree_util.tree_structure(off)
  assert len(jax.tree_util.tree_leaves(on)) == len(jax.tree_util.tree_leaves(target.params))
  assert set(vars(on)) == set(vars(off)) == {"config", "params", "decode_weights",
                                            "partitioner"}


def test_products_come_from_the_parameter_tree():
  """Every 2-D kernel of the params feeds exactly one packed matmul (a new Dense layer is
  found, not listed by hand), every RMSNorm scale one sum of squares; attentions: one
  per attention module; the tied embedding is the T5 1.0 output layer."""
  for name in ("t5_1_1_tiny", "t5_1_0_tiny"):
    cfg = sd.get_config(name)
    products = packing.products(cfg)
    params = flatten_dict(jax.eval_shape(lambda cfg=cfg: sd.init_model(cfg, 0).params))
    sources = [s for p in products if p.kind == "dot" for s in p.sources]
    kernels_2d = [p for p, x in params.items() if p[-1] == "kernel"]
    assert sorted(s for s in sources if s[-1] == "kernel") == sorted(kernels_2d)
    assert len(set(sources)) == len(sources)
    norms = sorted(s for p in products if p.kind == "sum_squares" for s in p.sources)
    assert norms == sorted(p for p in params if p[-1] == "scale")
    attentions = [p for p in products if p.kind == "attention"]
    assert len(attentions) == cfg.num_encoder_layers + 2 * cfg.num_decoder_layers
    tied = [p for p in products if p.transposed]
    assert [p.sources for p in tied] == ([(("token_embedder", "embedding"),)]
                                        if cfg.logits_via_embedding else [])


def test_policy_routes_each_product():
  on = dispatch.Policy("cpu", "built", frozenset({"decoder/layers_0/mlp/wo/kernel"}))
  dot = lambda key, dtype: dispatch.Product(key, "dot", (), jnp.dtype(dtype))
  assert on.route(dot(("encoder", "x", "kernel"), jnp.float32), jnp.float32) is None
  assert on.route(dot(("encoder", "x", "kernel"), jnp.float32), jnp.bfloat16) is None
  assert "float16" in on.route(dot(("encoder", "x", "kernel"), jnp.float32), jnp.float16)
  assert "float16" in on.route(dot(("encoder", "x", "kernel"), jnp.float16), jnp.float32)
  assert on.route(dot(("decoder", "layers_0", "mlp", "wo", "kernel"), jnp.float32),
                  jnp.float32) == "kept on XLA by the policy"
  norm = dispatch.Product(("n", "sum_squares"), "sum_squares", ())
  assert on.route(norm) is None
  assert dispatch.Policy("xla", "off here").route(norm) == "off here"
  with pytest.raises(ValueError, match="unknown product kind"):
    on.route(dispatch.Product(("x",), "conv", ()))


@pytest.mark.slow
@needs_kernels
def test_one_product_on_xla_makes_the_decode_not_width_invariant(monkeypatch, demo):
  """A Model packed with one product kept on XLA: its decode has that one XLA dot, it is
  reported not width-invariant, and exact mode pads its calls again."""
  target, enc = demo
  wo = "decoder/layers_0/mlp/wo/kernel"
  partial = sd.pack(target, dispatch.policy("cpu", xla={wo}))
  assert partial.decode_weights.xla == ((wo, "kept on XLA by the policy"),)
  assert not partial.width_invariant_decode and sd.pack(target).width_invariant_decode
  cache = _prefilled(target, enc[:2])
  hlo = jax.jit(_decode).lower(partial, jnp.ones((2, 3), jnp.int32), cache).as_text()
  assert hlo.count("stablehlo.dot_general") == 1
  widths = []
  original = sd.Model.decode_with_hidden

  def recording(self, tokens, cache, **kwargs):
    widths.append(tokens.shape[1])
    return original(self, tokens, cache, **kwargs)

  monkeypatch.setattr(sd.Model, "decode_with_hidden", recording)
  drafter = sd.load("demo-de-en/drafter")
  sd.speculative_generate(partial, drafter, enc[:2], gamma=3, max_new_tokens=8)
  assert set(widths) == {engine.EXACT_WIDTH}
  widths.clear()
  sd.speculative_generate(target, drafter, enc[:2], gamma=3, max_new_tokens=8)
  assert set(widths) == {4}


def test_only_dispatch_reads_the_packed_collection():
  """One dispatch site: no other module of the library looks the packed weights up."""
  root = pathlib.Path(sd.__file__).parent
  readers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if any(s in p.read_text() for s in ("has_variable(", "get_variable(")))
  assert readers == ["kernels/dispatch.py"]


@needs_kernels
def test_model_made_inside_jit_falls_back(demo):
  target, enc = demo
  cache = _prefilled(target, enc[:1])
  tokens = jnp.asarray([[5, 6, 7]], jnp.int32)

  def rebuilt(params, tokens, cache):
    return sd.Model(config=target.config, params=params).decode(tokens, cache)[0]

  assert not _uses_kernel(rebuilt, target.params, tokens, cache)
  inside = np.asarray(jax.jit(rebuilt)(target.params, tokens, cache))
  outside = np.asarray(target.decode(tokens, cache)[0])
  assert np.max(np.abs(inside - outside)) <= 1e-5 * np.max(np.abs(outside))


@needs_kernels
def test_start_runs_the_encoder_on_kernels_forward_keeps_xla_dot(demo):
  """`start` (encoder + cross K/V, once per request) runs its products, norms and
  attention on the kernels; the teacher-forced `forward` keeps XLA's dot. The
  kernels' cache equals XLA's to rounding."""
  target, enc = demo
  assert not _uses_kernel(lambda m, e: m.forward(e, e), target, enc)
  start = lambda m, e: m.start(e, capacity=8)
  hlo = jax.jit(start).lower(sd.pack(target), enc).as_text()
  cfg = target.config
  products = 4 * cfg.num_encoder_layers + cfg.num_decoder_layers     # qkv, out, wi, wo; kv
  norms = 2 * cfg.num_encoder_layers + 1
  assert hlo.count(f"custom_call @{build.DOT}(") == products + norms
  assert hlo.count(f"custom_call @{build.ATTENTION}(") == cfg.num_encoder_layers
  assert "stablehlo.dot_general" not in hlo
  on = start(target, enc)
  off = start(sd.pack(target, kernels="xla"), enc)
  for a, b in zip(jax.tree_util.tree_leaves(on), jax.tree_util.tree_leaves(off), strict=True):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.max(np.abs(a - b)) <= 1e-5 * max(1.0, np.max(np.abs(b)))


@pytest.mark.slow
@needs_kernels
def test_rows_of_a_batch_decode_bitwise_as_alone(demo):
  """Batch invariance: a sentence of a padded batch gets bitwise the cache and logits it
  gets alone (trimmed to its own length), and the same greedy tokens: the shortest, the
  longest and a middle one (each length alone is a program of its own). (With the kernels
  off, XLA's encoder differed for 14 of 16 sentences between batch 16 and alone on jax
  0.10.2.)"""
  target, enc = demo
  tokens = jnp.asarray(np.random.default_rng(4).integers(2, target.vocab_size, (enc.shape[0], 3)),
                       jnp.int32)

  def run(e, t):
    cache = target.start(e, capacity=24)
    return cache, target.decode(t, cache)[0]

  lengths = np.asarray((enc > 0).sum(axis=1))
  assert len(set(lengths.tolist())) > 1                      # a ragged batch
  cache, logits = run(enc, tokens)
  out = sd.generate(target, enc, max_new_tokens=16)
  order = np.argsort(lengths, kind="stable")
  for i in (order[0], order[len(order) // 2], order[-1]):
    n = lengths[i]
    cache_1, logits_1 = run(enc[i:i + 1, :n], tokens[i:i + 1])
    np.testing.assert_array_equal(np.asarray(logits[i:i + 1]), np.asarray(logits_1))
    np.testing.assert_array_equal(np.asarray(cache.cross.key[0][i:i + 1, :, :n]),
                                  np.asarray(cache_1.cross.key[0]))
    alone = sd.generate(target, enc[i:i + 1, :n], max_new_tokens=16)
    np.testing.assert_array_equal(np.asarray(out.tokens[i]), np.asarray(alone.tokens[0]))


@pytest.mark.slow
@needs_kernels
def test_bfloat16_exact_float32_weights_pack_narrow_with_bitwise_equal_products():
  """float32 weights that bfloat16 holds exactly pack as bfloat16 panels, and the
  product is bitwise the float32 panels' (same values, same FMA sequence); weights
  that need float32 stay float32."""
  rng = np.random.default_rng(3)
  w = jnp.asarray(rng.standard_normal((255, 1000)), jnp.float32)
  exact = w.astype(jnp.bfloat16).astype(jnp.float32)
  x = jnp.asarray(rng.standard_normal((5, 255)), jnp.float32)
  wide, narrow = kernels.pack(exact, jnp.float32), kernels.pack(exact, jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(kernels.dot(x, narrow, 1000)),
                                np.asarray(kernels.dot(x, wide, 1000)))
  cfg = sd.get_config("t5_1_1_tiny")
  model = sd.init_model(cfg, 0)
  dtypes = _packed_dots
  assert set(dtypes(model).values()) == {jnp.dtype(jnp.float32)}     # random float32 init
  rounded = model.replace(params=jax.tree_util.tree_map(
      lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), model.params))
  assert set(dtypes(rounded).values()) == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree_util.tree_leaves(rounded.params)} == {jnp.dtype(jnp.float32)}
  bundled = sd.load("demo-de-en/target")                             # stored in bfloat16
  assert set(dtypes(bundled).values()) == {jnp.dtype(jnp.bfloat16)}


def test_bfloat16_exactness_is_judged_on_the_bits():
  f32 = lambda bits: np.asarray(bits, np.uint32).view(np.float32)
  assert skinny.bfloat16_exact(jnp.asarray(f32([0x3F800000, 0x80000000, 0x7F800000,
                                                    0x00010000, 0x7FC00000])))  # 1 -0 inf sub NaN
  for bits in (0x3F800001, 0x00000001, 0x7FC00001):       # float32-only value, subnormal, NaN
    assert not skinny.bfloat16_exact(jnp.asarray(f32([0x3F800000, bits])))


def test_threads_grow_with_weights_and_rows():
  from specdec_jax.kernels import skinny, work
  one = work.PARALLEL_BYTES // 4                         # float32 values in one share
  assert skinny.threads(1, 1, one, jnp.float32) == 1
  assert skinny.threads(1, 1, 4 * one, jnp.float32) == 4
  assert skinny.threads(1, 1, 4 * one, jnp.bfloat16) == 2
  rows = skinny.ROWS_PER_PASS
  assert skinny.threads(rows, 1, one, jnp.float32) == 1
  assert skinny.threads(8 * rows, 1, one, jnp.float32) == 8  # an encoder's many rows


@needs_kernels
def test_narrow_panels_give_bitwise_the_logits_of_float32_panels(monkeypatch, demo):
  """The bundled target (bfloat16-exact float32 params) decodes on bfloat16 panels to
  bitwise the logits of float32 panels of the same params."""
  target, enc = demo
  cache = _prefilled(target, enc)
  tokens = jnp.asarray(np.random.default_rng(4).integers(2, target.vocab_size, (8, 3)), jnp.int32)
  narrow = np.asarray(target.decode(tokens, cache)[0])
  assert set(_packed_dots(target).values()) == {jnp.dtype(jnp.bfloat16)}
  monkeypatch.setattr(skinny, "bfloat16_exact", lambda w: False)
  wide_model = sd.pack(target.replace(params=dict(target.params)))
  assert set(_packed_dots(wide_model).values()) == {jnp.dtype(jnp.float32)}
  np.testing.assert_array_equal(np.asarray(wide_model.decode(tokens, cache)[0]), narrow)


@needs_kernels
def test_aot_lowering_keeps_the_kernels(demo):
  """`jit(f).lower(model, ...).compile()` lowers the kernel path and the compiled
  function takes the same Model (its abstract leaves keep the packed weights)."""
  target, enc = demo
  cache = _prefilled(target, enc[:1])
  tokens = jnp.asarray([[5, 6, 7]], jnp.int32)
  packed = sd.pack(target)
  lowered = jax.jit(_decode).lower(packed, tokens, cache)
  assert build.DOT in lowered.as_text()
  out = lowered.compile()(packed, tokens, cache)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(target.decode(tokens, cache)[0]))


@pytest.mark.slow
@needs_kernels
def test_exact_greedy_needs_no_padding_with_kernels(monkeypatch, demo):
  """Exact mode (the greedy default) on a width-invariant target: verify calls carry
  gamma + 1 tokens, not EXACT_WIDTH, and speculative output is still bitwise the
  baseline's. Kernels off: the calls are padded again."""
  target, enc = demo
  drafter = sd.load("demo-de-en/drafter")
  assert target.width_invariant_decode                   # sd.load packed it for "cpu"
  assert not sd.Model(config=target.config, params=target.params).width_invariant_decode
  widths = []                                   # token width of each traced target call
  original = sd.Model.decode_with_hidden

  def recording(self, tokens, cache, **kwargs):
    widths.append(tokens.shape[1])
    return original(self, tokens, cache, **kwargs)

  monkeypatch.setattr(sd.Model, "decode_with_hidden", recording)
  base = sd.generate(target, enc, max_new_tokens=23)
  assert base.stats["exact"] and set(widths) == {1}
  for gamma in (2, 5):
    widths.clear()
    spec = sd.speculative_generate(target, drafter, enc, gamma=gamma, max_new_tokens=23)
    assert spec.stats["exact"] and set(widths) == {gamma + 1}
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(base.tokens))
    np.testing.assert_array_equal(np.asarray(spec.lengths), np.asarray(base.lengths))
  on_xla = sd.pack(target, kernels="xla")
  assert not on_xla.width_invariant_decode
  widths.clear()
  sd.generate(on_xla, enc, max_new_tokens=23)
  assert set(widths) == {engine.EXACT_WIDTH}
