"""The decode matmul on Hopper tensor cores, every row computed alike.

    wp = pack(w, dtype)             # w [K, N] -> [P, Kp, Np] bfloat16, once per model
    y = dot(x, wp, n)               # x [..., K] -> [..., n] float32
    s = sum_squares(x, ones)        # x [..., K] -> [..., 1] float32; ones = pack(ones [K, 1])

bfloat16 weights pack to one bfloat16 part (P = 1); float32 weights to two, w = hi + lo
with hi = bf16(w), lo = bf16(w - hi), and x splits the same way: the product is
hi.hi + hi.lo + lo.hi (three bfloat16 WGMMAs, the lo.lo term dropped), about 2^-16 relative
error per term, where a float32 WGMMA would round its operands to TF32 (2^-11).

Tiles (`tiles.Tiles`, from the table keyed by the weight's shape and dtype, else its
default rule): the rows are cut into tiles of TM = 64 (a WGMMA's M; zero rows pad the
last), the columns into tiles of tn, and K into k_splits equal parts of `steps` steps of
tk. Each (row tile, K part, column tile) is a block: it streams its row and weight tiles
through a pipeline of `stages` SMEM buffers (`plgpu.emit_pipeline`: the copies of the next
steps are in flight while a step's WGMMAs run) and accumulates its steps in order in
float32; the parts' partial sums are added after the kernel in their fixed order,
p0 + p1 + p2 + .... Kp and Np are K and N rounded up to the tiles (zeros: padding adds
exact zeros to each sum). Nothing depends on M but the number of row tiles, so a row's
result is bitwise the same in a call of 1 row or of 512, at any position. K splits give
a small N enough blocks to keep a GPU's SMs reading weights (N = 512: 8 column tiles of
64, times up to 16 parts).

Interpret mode (the interpreter runs the grid's blocks one after another, and every copy,
barrier and SMEM access is a host callback of a few ms) runs one block that walks every
row tile and K part with one column tile of all Np columns: as invariant in M (the tile
is fixed by N alone), and ~Np/tn times fewer callbacks. It keeps the pipeline, stages, K
parts and K order, but replaces each WGMMA by an in-order product into an SMEM
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
from specdec_jax.kernels.gpu.tiles import TM, Tiles, dot_tiles

Array = jax.Array

_PAIRS = {1: ((0, 0),), 2: ((0, 0), (0, 1), (1, 0))}   # (x part, w part) per WGMMA, in order


def _ceil(a: int, b: int) -> int:
  return -(-a // b) * b


def split(a: Array, parts: int) -> Array:
  """a [...] -> [parts, ...] bfloat16: one part bf16(a); two: hi = a cut to bfloat16's
  mantissa (its low 16 bits cleared: exact in bfloat16), lo = bf16(a - hi).

  hi is cut with a bit mask, not rounded by a float32 -> bfloat16 -> float32 round trip:
  XLA:GPU may drop such a pair of converts (excess precision), which made lo 0 and the
  float32 products bfloat16-precise on an H200 (the self-check's error 2.5e-4)."""
  if parts == 1:
    return a.astype(jnp.bfloat16)[None]
  a = a.astype(jnp.float32)
  bits = jax.lax.bitcast_convert_type(a, jnp.uint32) & jnp.uint32(0xFFFF0000)
  hi = jax.lax.bitcast_convert_type(bits, jnp.float32)
  return jnp.stack([hi, a - hi]).astype(jnp.bfloat16)


def _tiles(k: int, n: int, parts: int, tiles: Tiles | None) -> Tiles:
  """`tiles`, else the table's for a [k, n] weight of P = `parts` (`tiles.dot_tiles`)."""
  return tiles or dot_tiles(k, n, jnp.bfloat16 if parts == 1 else jnp.float32)


def pack(w: Array, dtype=None, tiles: Tiles | None = None) -> Array:
  """w [K, N] -> [P, Kp, Np] bfloat16 (P = 1 for bfloat16, 2 for float32; module docstring).

  dtype: the product's compute dtype (default: w's), float32 or bfloat16.
  tiles: the tiles it is packed for (None: the table's, `tiles.dot_tiles`, looked up
  here, outside the jitted padding).
  """
  dtype = jnp.dtype(dtype or w.dtype)
  if dtype not in (jnp.float32, jnp.bfloat16):
    raise TypeError(f"GPU products take float32 or bfloat16 weights, not {dtype}")
  k, n = w.shape
  parts = 1 if dtype == jnp.bfloat16 else 2
  return _pack(w, dtype, _tiles(k, n, parts, tiles).padded(k, n))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _pack(w: Array, dtype, padded: tuple[int, int]) -> Array:
  (k, n), (kp, np_) = w.shape, padded
  w = jnp.pad(w.astype(dtype), ((0, kp - k), (0, np_ - n)))
  return split(w, 1 if dtype == jnp.bfloat16 else 2)


def check_packed(wp: Array, k: int, n: int, tiles: Tiles | None = None) -> Tiles:
  """The tiles `wp` is packed for; raise unless it is the packing of a [k, n] matrix for
  them (`tiles`, else the table's)."""
  if wp.ndim != 3 or wp.dtype != jnp.bfloat16 or wp.shape[0] not in _PAIRS:
    raise ValueError(f"packed weights {wp.dtype}{list(wp.shape)} are not a GPU packing "
                     f"(bfloat16 [1|2, Kp, Np])")
  t = _tiles(k, n, wp.shape[0], tiles)
  if wp.shape[1:] != t.padded(k, n):
    kp, np_ = t.padded(k, n)
    raise ValueError(f"packed weights {wp.dtype}{list(wp.shape)} are not a GPU packing of a "
                     f"[{k}, {n}] matrix for {t} (bfloat16 [1|2, {kp}, {np_}])")
  return t


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


def _matmul(xp: Array, wp: Array, t: Tiles, interpret) -> Array:
  """xp [P, Mp, Kp] @ wp [P, Kp, Np] bfloat16 (summed over `_PAIRS`) -> partial sums
  [k_splits, Mp, Np] float32, one per K part.

  interpret: `mode.params`; when interpreting, one block, one column tile of Np columns
  (see the module docstring).
  """
  parts, mp, kp = xp.shape
  np_ = wp.shape[2]
  tn, tk, splits = (np_ if interpret else t.tn), t.tk, t.k_splits
  m_tiles, n_tiles, steps = mp // TM, np_ // tn, kp // (tk * splits)
  units = m_tiles * splits * n_tiles       # blocks on a GPU: (row tile, K part, col tile)
  blocks = 1 if interpret else units
  pairs = _PAIRS[parts]
  specs = [plgpu.BlockSpec((parts, TM, tk), lambda s: (0, 0, s), transforms=_transforms(tk)),
           plgpu.BlockSpec((parts, tk, tn), lambda s: (0, s, 0), transforms=_transforms(tn))]

  def kernel(x_gmem, w_gmem, o_gmem, o_smem):
    block = lax.axis_index("blocks")

    def unit(u, carry):
      u = block * (units // blocks) + u
      j, part, i = u % n_tiles, (u // n_tiles) % splits, u // (n_tiles * splits)
      ks = pl.ds(part * steps * tk, steps * tk)

      def accumulate(acc):
        def step(_, x_smem, w_smem):
          for a, b in pairs:
            _mma(acc, x_smem.at[a], w_smem.at[b], interpret)
          plgpu.wgmma_wait(0)       # this slot's tiles are refilled after the step

        # the copies of the next `stages - 1` steps stream while this step's WGMMAs run
        plgpu.emit_pipeline(step, grid=(steps,), in_specs=specs,
                            max_concurrent_steps=t.stages)(
                                x_gmem.at[:, pl.ds(i * TM, TM), ks],
                                w_gmem.at[:, ks, pl.ds(j * tn, tn)])
        o_smem[...] = acc[...]

      pl.run_scoped(accumulate, _acc((TM, tn), interpret))
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[part, pl.ds(i * TM, TM), pl.ds(j * tn, tn)])
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)
      return carry

    lax.fori_loop(0, units // blocks, unit, None)
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((splits, mp, np_), jnp.float32),
                      grid=(blocks,), grid_names=("blocks",),
                      scratch_types=[plgpu.SMEM((TM, tn), jnp.float32)],
                      compiler_params=plgpu.CompilerParams(), interpret=interpret)(xp, wp)


def dot(x: Array, wp: Array, n: int, interpret: bool | None = None,
        tiles: Tiles | None = None) -> Array:
  """x [..., K] (any float dtype) @ packed [K, n] -> [..., n] float32.

  x is split like the weights (one bfloat16 part, or hi/lo of its float32 value).
  interpret: None: `mode.interpret()`; False compiles for Mosaic GPU (`lower_for_cuda`).
  tiles: those `wp` was packed for (None: the table's).
  """
  k = x.shape[-1]
  t = check_packed(wp, k, n, tiles)
  parts, kp, _ = wp.shape
  lead = x.shape[:-1]
  rows = x.reshape(-1, k)
  m = rows.shape[0]
  xp = split(jnp.pad(rows, ((0, _ceil(max(m, 1), TM) - m), (0, kp - k))), parts)
  partials = _matmul(xp, wp, t, mode.params(interpret))
  y = partials[0]
  for part in range(1, t.k_splits):          # the K parts in order: the same for every row
    y = y + partials[part]
  return y[:m, :n].reshape(lead + (n,))


def sum_squares(x: Array, ones: Array, interpret: bool | None = None,
                tiles: Tiles | None = None) -> Array:
  """sum(x^2) over the last axis, float32 [..., K] -> [..., 1], as x^2 @ ones [K, 1]
  (`ones` = pack(ones [K, 1] float32)): the matmul's fixed order per row."""
  return dot(jnp.square(x.astype(jnp.float32)), ones, 1, interpret, tiles)
