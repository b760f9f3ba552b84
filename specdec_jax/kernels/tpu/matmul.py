"""The decode matmul on TPU (Pallas, Mosaic TPU), every row computed alike.

    wp = pack(w, dtype)             # w [K, N] -> [Kp, Np] float32 or bfloat16, once per model
    y = dot(x, wp, n)               # x [..., K] -> [..., n] float32
    s = sum_squares(x, ones)        # x [..., K] -> [..., 1] float32; ones = pack(ones [K, 1])

Tiles: the rows are cut into tiles of TM = 128 (zero rows pad the last), K and N into
tiles of `tiles(K, N)` = (TK, TN): multiples of 128 (a TPU vreg's lanes), at most MAX_TK
and MAX_TN, fixed by the weight's shape alone. The grid is (row tile, column tile, K
step), the K steps innermost and in order: each step is one MXU product of an x tile
[TM, TK] by a weight tile [TK, TN] with float32 accumulation, added to the output tile
(float32, resident in VMEM across the steps). Nothing depends on M but the number of
row tiles, so a row's result is bitwise the same in a call of 1 row or of 512, at any
position; the weights stream once per row tile (once for a decode step of up to 128
rows). Kp and Np are K and N rounded up to the tiles; the padding is zeros (exact zeros
in every sum; the padded columns of an odd vocabulary are cut from the result).

bfloat16 weights multiply bfloat16 rows (exact products, float32 sums); float32 weights
multiply float32 rows at Precision.HIGHEST (the MXU's multi-pass float32 product).

Interpret mode (`mode.params`, on a machine without a TPU) runs the same grid, blocks and
K order, but each tile product is an in-order product, acc += x[:, j] * w[j, :] for
j = 0..TK-1, every element alike: the interpreter's dot is XLA:CPU's matmul, whose rows
are as invariant as the host library's blocking makes them (they were on the machine
that wrote this, but nothing promises it), so the tests would check the host library
rather than the tiling (an MXU computes each row from that row alone).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from specdec_jax.errors import InputError
from specdec_jax.kernels.tpu import mode

Array = jax.Array

TM = 128        # rows per tile: an MXU's height (v5e); fixed, whatever M is
LANE = 128      # a vreg's lanes: every tile's K and N are multiples of it
MAX_TK = 1024   # at most this many K per step (fewer, larger steps: less grid overhead)
MAX_TN = 512    # at most this many columns per output tile (VMEM: TK x TN per buffer)
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def _ceil(a: int, b: int) -> int:
  return -(-a // b) * b


def _split(size: int, most: int) -> tuple[int, int]:
  """(tile, padded size): `size` in equal tiles of a multiple of LANE, at most `most`."""
  lanes = _ceil(max(size, 1), LANE)
  steps = -(-lanes // most)
  tile = _ceil(-(-lanes // steps), LANE)
  return tile, tile * steps


def tiles(k: int, n: int) -> tuple[int, int, int, int]:
  """(TK, TN, Kp, Np) of a [k, n] weight: fixed by the weight's shape, never by M."""
  tk, kp = _split(k, MAX_TK)
  tn, np_ = _split(n, MAX_TN)
  return tk, tn, kp, np_


@functools.partial(jax.jit, static_argnames=("dtype",))
def pack(w: Array, dtype=None) -> Array:
  """w [K, N] -> [Kp, Np] in `dtype`, zero-padded to the tiles (module docstring).

  dtype: the product's compute dtype (default: w's), float32 or bfloat16.
  """
  dtype = jnp.dtype(dtype or w.dtype)
  if dtype not in DTYPES:
    raise InputError(f"TPU products take float32 or bfloat16 weights, not {dtype}")
  k, n = w.shape
  _, _, kp, np_ = tiles(k, n)
  return jnp.pad(w.astype(dtype), ((0, kp - k), (0, np_ - n)))


def check_packed(wp: Array, k: int, n: int) -> None:
  """Raise `InputError` unless `wp` is the TPU packing of a [k, n] matrix."""
  _, _, kp, np_ = tiles(k, n)
  if wp.ndim != 2 or jnp.dtype(wp.dtype) not in DTYPES or tuple(wp.shape) != (kp, np_):
    raise InputError(f"packed weights {wp.dtype}{list(wp.shape)} are not a TPU packing of a "
                     f"[{k}, {n}] matrix (float32 or bfloat16 [{kp}, {np_}])")


def product(a: Array, b: Array, interpret, contract_b: int = 0) -> Array:
  """a [R, J] @ b [J, C] (contract_b 0) or a @ b.T for b [C, J] (contract_b 1) -> [R, C]
  float32, every row alike: one MXU product on a TPU (float32 operands at HIGHEST);
  when interpreting, in order over j (the module docstring says why)."""
  if not interpret:
    f32 = a.dtype == jnp.float32
    return lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())),
                           precision=lax.Precision.HIGHEST if f32 else None,
                           preferred_element_type=jnp.float32)
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  if contract_b:
    b = b.T
  acc = jnp.zeros((a.shape[0], b.shape[1]), jnp.float32)
  return lax.fori_loop(0, a.shape[1], lambda j, c: c + a[:, j, None] * b[None, j, :], acc)


def _matmul(xp: Array, wp: Array, tk: int, tn: int, interpret) -> Array:
  """xp [Mp, Kp] @ wp [Kp, Np] (one dtype) -> [Mp, Np] float32, tiles (TM, tk, tn)."""
  mp, kp = xp.shape
  np_ = wp.shape[1]
  inline = bool(interpret)

  def kernel(x_ref, w_ref, o_ref):
    step = product(x_ref[...], w_ref[...], inline)

    @pl.when(pl.program_id(2) == 0)
    def _first():
      o_ref[...] = step

    @pl.when(pl.program_id(2) > 0)
    def _next():
      o_ref[...] += step

  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.float32),
      grid=(mp // TM, np_ // tn, kp // tk),
      in_specs=[pl.BlockSpec((TM, tk), lambda i, j, s: (i, s)),
                pl.BlockSpec((tk, tn), lambda i, j, s: (s, j))],
      out_specs=pl.BlockSpec((TM, tn), lambda i, j, s: (i, j)),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary")),
      interpret=interpret)(xp, wp)


def dot(x: Array, wp: Array, n: int, interpret: bool | None = None) -> Array:
  """x [..., K] @ packed [K, n] -> [..., n] float32; x is cast to the packing's dtype.

  interpret: None: `mode.interpret()`; False compiles for Mosaic TPU (`lower_for_tpu`).
  """
  k = x.shape[-1]
  check_packed(wp, k, n)
  tk, tn, kp, _ = tiles(k, n)
  lead = x.shape[:-1]
  rows = x.reshape(-1, k).astype(wp.dtype)
  m = rows.shape[0]
  xp = jnp.pad(rows, ((0, _ceil(max(m, 1), TM) - m), (0, kp - k)))
  y = _matmul(xp, wp, tk, tn, mode.params(interpret))
  return y[:m, :n].reshape(lead + (n,))


def sum_squares(x: Array, ones: Array, interpret: bool | None = None) -> Array:
  """sum(x^2) over the last axis, float32 [..., K] -> [..., 1], as x^2 @ ones [K, 1]
  (`ones` = pack(ones [K, 1] float32)): the matmul's fixed order per row."""
  return dot(jnp.square(x.astype(jnp.float32)), ones, 1, interpret)
