"""The decode matmul on Hopper tensor cores, every row computed alike.

    wp = pack(w, dtype)             # w [K, N] -> [P, Kp, Np] bfloat16, once per model
    y = dot(x, wp, n)               # x [..., K] -> [..., n] float32
    s = sum_squares(x, ones)        # x [..., K] -> [..., 1] float32; ones = pack(ones [K, 1])

bfloat16 weights pack to one bfloat16 part (P = 1); float32 weights to two, w = hi + lo
with hi = bf16(w), lo = bf16(w - hi), and x splits the same way: the product is
hi.hi + hi.lo + lo.hi (three bfloat16 WGMMAs, the lo.lo term dropped), about 2^-16 relative
error per term, where a float32 WGMMA would round its operands to TF32 (2^-11). Kp and Np
are K and N rounded up to the tiles (zeros: padding adds exact zeros to each sum).

Tiling: the rows are cut into tiles of TM = 64 (a WGMMA's M; zero rows pad the last),
the columns into tiles of TN, and each (row tile, column tile) accumulates in float32
over K in steps of TK, in order, each step one WGMMA per part pair in a fixed order.
Nothing depends on M but the number of row tiles, so a row's result is bitwise the same
in a call of 1 row or of 512, at any position. Weight tiles are read once per row tile:
once for all rows up to TM = 64 rows (a decode step at batch x width <= 64).

One block per column tile of TN columns on a GPU. Interpret mode (the interpreter runs
one block per grid, and every copy, barrier and SMEM access is a host callback of a few
ms) runs one block with one column tile of all Np columns: as invariant in M (the tile is
fixed by N alone), and ~Np/TN times fewer callbacks. It keeps the copies, barriers,
tiles and K order, but replaces each WGMMA by an in-order product into an SMEM
accumulator (`_mma`): the interpreter's WGMMA is the host BLAS's matmul, whose rows can
depend on their position in the tile, which a GPU's WGMMA rows do not.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from specdec_jax.kernels.gpu import mode

Array = jax.Array

TM = 64     # rows per tile: a WGMMA's M
TN = 64     # columns per tile: one block's share of the output
TK = 64     # reduction step: 128 bytes of bfloat16, one swizzled SMEM row
_PAIRS = {1: ((0, 0),), 2: ((0, 0), (0, 1), (1, 0))}   # (x part, w part) per WGMMA, in order


def _ceil(a: int, b: int) -> int:
  return -(-a // b) * b


def split(a: Array, parts: int) -> Array:
  """a [...] -> [parts, ...] bfloat16: one part bf16(a); two: hi = bf16(a), lo = bf16(a - hi)."""
  hi = a.astype(jnp.bfloat16)
  if parts == 1:
    return hi[None]
  lo = (a.astype(jnp.float32) - hi.astype(jnp.float32)).astype(jnp.bfloat16)
  return jnp.stack([hi, lo])


@functools.partial(jax.jit, static_argnames=("dtype",))
def pack(w: Array, dtype=None) -> Array:
  """w [K, N] -> [P, Kp, Np] bfloat16 (P = 1 for bfloat16, 2 for float32; module docstring).

  dtype: the product's compute dtype (default: w's), float32 or bfloat16.
  """
  dtype = jnp.dtype(dtype or w.dtype)
  if dtype not in (jnp.float32, jnp.bfloat16):
    raise TypeError(f"GPU products take float32 or bfloat16 weights, not {dtype}")
  k, n = w.shape
  w = jnp.pad(w.astype(dtype), ((0, _ceil(k, TK) - k), (0, _ceil(n, TN) - n)))
  return split(w, 1 if dtype == jnp.bfloat16 else 2)


def check_packed(wp: Array, k: int, n: int) -> None:
  """Raise unless `wp` is the packing of a [k, n] matrix."""
  if (wp.ndim != 3 or wp.dtype != jnp.bfloat16 or wp.shape[0] not in _PAIRS
      or wp.shape[1:] != (_ceil(k, TK), _ceil(n, TN))):
    raise ValueError(f"packed weights {wp.dtype}{list(wp.shape)} are not a GPU packing of a "
                     f"[{k}, {n}] matrix (bfloat16 [1|2, {_ceil(k, TK)}, {_ceil(n, TN)}])")


def _transforms(cols: int):
  """SMEM layout of a bfloat16 tile of `cols` columns for WGMMA: 8-row tiles, swizzled."""
  swizzle = plgpu.find_swizzle(cols * 16)
  return plgpu.TilingTransform((8, swizzle // 2)), plgpu.SwizzleTransform(swizzle)


def _acc(shape: tuple[int, int], interpret):
  """The float32 accumulator of `_mma`, zeroed (`mode.params`): a WGMMA accumulator on a
  GPU; when interpreting, a plain SMEM tile (the interpreter cannot store to a WGMMA one)."""
  return plgpu.SMEM(shape, jnp.float32) if interpret else plgpu.ACC(shape, jnp.float32)


def _mma(acc, a_ref, b_ref, interpret) -> None:
  """acc += a_ref [TM, k] @ b_ref [k, n], bfloat16 SMEM tiles into the float32 `_acc`.

  On a GPU, one WGMMA. When interpreting, an in-order product: acc += a[:, j] * b[j, :] for
  j = 0, 1, ..., k-1, every element alike (bfloat16 products are exact in float32). The
  interpreter's WGMMA is the host BLAS's matmul, whose rows may differ in the last bit
  with their position in the tile (OpenBLAS's Haswell sgemm does): it would test the
  host's BLAS, not the kernels' tiling, which a GPU's WGMMA applies to every row alike.
  """
  if not interpret:
    plgpu.wgmma(acc, a_ref, b_ref)
    return
  a, b = a_ref[...].astype(jnp.float32), b_ref[...].astype(jnp.float32)
  acc[...] = lax.fori_loop(0, a.shape[1], lambda j, c: c + a[:, j, None] * b[None, j, :],
                           acc[...])


def _matmul(xp: Array, wp: Array, interpret) -> Array:
  """xp [P, Mp, Kp] @ wp [P, Kp, Np] bfloat16 (summed over `_PAIRS`) -> [Mp, Np] float32.

  interpret: `mode.params`; when interpreting, `blocks` is 1 (see the module docstring).
  """
  parts, mp, kp = xp.shape
  np_ = wp.shape[2]
  tn = np_ if interpret else TN      # the interpreter: one column tile (see the docstring)
  m_tiles, n_tiles, k_steps = mp // TM, np_ // tn, kp // TK
  blocks = 1 if interpret else n_tiles
  pairs = _PAIRS[parts]

  def kernel(x_gmem, w_gmem, o_gmem):
    block = lax.axis_index("blocks")

    def scoped(x_smem, w_smem, o_smem, barrier):
      def column_tile(t, carry):
        j = block * (n_tiles // blocks) + t

        def row_tile(i, carry):
          def accumulate(acc):
            def step(s, carry):
              for p in range(parts):
                plgpu.copy_gmem_to_smem(x_gmem.at[p, pl.ds(i * TM, TM), pl.ds(s * TK, TK)],
                                        x_smem.at[p], barrier.at[p])
                plgpu.copy_gmem_to_smem(w_gmem.at[p, pl.ds(s * TK, TK), pl.ds(j * tn, tn)],
                                        w_smem.at[p], barrier.at[parts + p])
              for b in range(2 * parts):
                plgpu.barrier_wait(barrier.at[b])
              for a, b in pairs:
                _mma(acc, x_smem.at[a], w_smem.at[b], interpret)
              plgpu.wgmma_wait(0)          # the tiles are overwritten next step
              return carry

            lax.fori_loop(0, k_steps, step, None)
            o_smem[...] = acc[...]

          pl.run_scoped(accumulate, _acc((TM, tn), interpret))
          plgpu.commit_smem()
          plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(i * TM, TM), pl.ds(j * tn, tn)])
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)
          return carry

        return lax.fori_loop(0, m_tiles, row_tile, carry)

      lax.fori_loop(0, n_tiles // blocks, column_tile, None)
      plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(scoped,
                  plgpu.SMEM((parts, TM, TK), jnp.bfloat16, transforms=_transforms(TK)),
                  plgpu.SMEM((parts, TK, tn), jnp.bfloat16, transforms=_transforms(tn)),
                  plgpu.SMEM((TM, tn), jnp.float32),
                  plgpu.Barrier(num_barriers=2 * parts))

  return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((mp, np_), jnp.float32),
                      grid=(blocks,), grid_names=("blocks",),
                      compiler_params=plgpu.CompilerParams(), interpret=interpret)(xp, wp)


def dot(x: Array, wp: Array, n: int, interpret: bool | None = None) -> Array:
  """x [..., K] (any float dtype) @ packed [K, n] -> [..., n] float32.

  x is split like the weights (one bfloat16 part, or hi/lo of its float32 value).
  interpret: None: `mode.interpret()`; False compiles for Mosaic GPU (`lower_for_cuda`).
  """
  k = x.shape[-1]
  check_packed(wp, k, n)
  parts, kp, _ = wp.shape
  lead = x.shape[:-1]
  rows = x.reshape(-1, k)
  m = rows.shape[0]
  xp = split(jnp.pad(rows, ((0, _ceil(max(m, 1), TM) - m), (0, kp - k))), parts)
  y = _matmul(xp, wp, mode.params(interpret))
  return y[:m, :n].reshape(lead + (n,))


def sum_squares(x: Array, ones: Array, interpret: bool | None = None) -> Array:
  """sum(x^2) over the last axis, float32 [..., K] -> [..., 1], as x^2 @ ones [K, 1]
  (`ones` = pack(ones [K, 1] float32)): the matmul's fixed order per row."""
  return dot(jnp.square(x.astype(jnp.float32)), ones, 1, interpret)
