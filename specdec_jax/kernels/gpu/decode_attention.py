"""Decode attention on Hopper tensor cores: every query row computed alike.

    out = attention(q, k, v, bias)  # q [B, T, H, D], grouped k/v [B, Hkv, S, D],
                                    # bias [B|1, H|1, T|1, S] -> out [B, T, H, D] float32

softmax(q . k + bias) @ v per (b, h, query row), T5's conventions (no 1/sqrt(D): it lives
in the query weights; masked keys carry a large negative bias). The query rows of a
(b, h) are cut into tiles of TM = 64 (zero rows pad the last); each tile walks the keys
in chunks of C keys (64 unless the tile table names another for the head size:
`tiles.chunk`), in order, with an online softmax (running max m, sum l,
output o): the same operations for every row, whatever T, B, H and the row's place, so
a row is bitwise the same in a 1-token call and in a 16-token one. The cache is read in
its fixed shape S (rounded up to C; the padding carries -inf-like bias, contributing
exact zeros); a row's lengths are its bias. Grouped-query K/V stay grouped: query head h
reads K/V head h // (H / Hkv) (no repeated copy).

Products run as bfloat16 WGMMAs with float32 accumulation; float32 operands split into
hi/lo parts as in `matmul` (three WGMMAs). Interpret mode replaces each WGMMA by an
in-order product (`matmul._mma`: the interpreter's WGMMA is the host BLAS's matmul, whose
rows can depend on their position in the tile). The probabilities of a chunk enter p @ v in
the parts of their float32 values, before normalisation (XLA's path rounds normalised
weights to the compute dtype: the two agree within the dtype's rounding).

The keys are read transposed ([D, S] tiles, made by the wrapper) so that both products
take their operands in the layout a bfloat16 WGMMA reads without transposes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from specdec_jax.kernels.gpu import mode, tiles
from specdec_jax.kernels.gpu.matmul import _PAIRS, TM, _acc, _ceil, _mma, _transforms, split
from specdec_jax.kernels.shapes import check_attention

Array = jax.Array

C = 64          # keys per chunk by default: a fixed SIZE, whatever S is (`_chunk`)
_MASKED = -1e30  # bias of the keys padding S up to chunks: exp() of it is 0


def _kernel_call(qp, ktp, vp, bias, heads: int, interpret) -> Array:
  """qp [P, BH, Tp, Dp], ktp [P, BHkv, Dp, Sp], vp [P, BHkv, Sp, Dp] bfloat16, bias
  [Bb, Hb, Tp, Sp] float32 -> [BH, Tp, Dp] float32."""
  parts, bh, tp, dp = qp.shape
  sp = ktp.shape[3]
  bias_b, bias_h = bias.shape[:2]
  C = _chunk(dp, parts)              # noqa: N806 (the module's C, from the tile table)
  group = bh // ktp.shape[1]          # query heads per K/V head
  row_tiles, chunks = tp // TM, sp // C
  units = bh * row_tiles
  blocks = 1 if interpret else units
  pairs = _PAIRS[parts]
  f32 = jnp.float32

  def kernel(q_gmem, k_gmem, v_gmem, bias_gmem, o_gmem):
    block = lax.axis_index("blocks")

    def scoped(q_smem, k_smem, v_smem, p_smem, b_smem, o_smem, barrier):
      def unit(t, carry):
        u = block * (units // blocks) + t
        g, ti = u // row_tiles, u % row_tiles
        # its K/V head (ungrouped: g itself)
        kv = g if group == 1 else (g // heads) * (heads // group) + (g % heads) // group
        bb = g // heads if bias_b > 1 else 0
        hb = g % heads if bias_h > 1 else 0
        rows = pl.ds(ti * TM, TM)
        for p in range(parts):
          plgpu.copy_gmem_to_smem(q_gmem.at[p, g, rows, :], q_smem.at[p], barrier.at[p])
        for p in range(parts):
          plgpu.barrier_wait(barrier.at[p])

        def chunk(c, state):
          """Chunk c of the keys; state (o, m, l) of the chunks before, None for the first."""
          keys = pl.ds(c * C, C)
          for p in range(parts):
            plgpu.copy_gmem_to_smem(k_gmem.at[p, kv, :, keys], k_smem.at[p], barrier.at[p])
            plgpu.copy_gmem_to_smem(v_gmem.at[p, kv, keys, :], v_smem.at[p],
                                    barrier.at[parts + p])
          plgpu.copy_gmem_to_smem(bias_gmem.at[bb, hb, rows, keys], b_smem,
                                  barrier.at[2 * parts])
          for i in range(2 * parts + 1):
            plgpu.barrier_wait(barrier.at[i])

          def scores(acc):
            for a, b in pairs:
              _mma(acc, q_smem.at[a], k_smem.at[b], interpret)
            plgpu.wgmma_wait(0)
            return acc[...]

          s = pl.run_scoped(scores, _acc((TM, C), interpret)) + b_smem[...]
          m_new = s.max(axis=1) if state is None else jnp.maximum(state[1], s.max(axis=1))
          probs = jnp.exp(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
          hi = probs.astype(jnp.bfloat16)
          p_smem[0] = hi
          if parts == 2:
            p_smem[1] = (probs - hi.astype(f32)).astype(jnp.bfloat16)
          plgpu.commit_smem()

          def weighted(acc):
            for a, b in pairs:
              _mma(acc, p_smem.at[a], v_smem.at[b], interpret)
            plgpu.wgmma_wait(0)
            return acc[...]

          pv = pl.run_scoped(weighted, _acc((TM, dp), interpret))
          if state is None:
            return pv, m_new, probs.sum(axis=1)
          o, m, denom = state
          alpha = jnp.exp(m - m_new)
          return (o * lax.broadcast_in_dim(alpha, o.shape, [0]) + pv, m_new,
                  denom * alpha + probs.sum(axis=1))

        # The first chunk starts the state (its layouts are the WGMMA results').
        o, _, denom = lax.fori_loop(1, chunks, chunk, chunk(0, None))
        o_smem[...] = o / lax.broadcast_in_dim(denom, o.shape, [0])
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[g, rows, :])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        return carry

      lax.fori_loop(0, units // blocks, unit, None)
      plgpu.wait_smem_to_gmem(0)

    bf16 = jnp.bfloat16
    pl.run_scoped(scoped,
                  plgpu.SMEM((parts, TM, dp), bf16, transforms=_transforms(dp)),
                  plgpu.SMEM((parts, dp, C), bf16, transforms=_transforms(C)),
                  plgpu.SMEM((parts, C, dp), bf16, transforms=_transforms(dp)),
                  plgpu.SMEM((parts, TM, C), bf16, transforms=_transforms(C)),
                  plgpu.SMEM((TM, C), f32, transforms=_f32_transforms(C)),
                  plgpu.SMEM((TM, dp), f32, transforms=_f32_transforms(dp)),
                  plgpu.Barrier(num_barriers=2 * parts + 1))

  return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((bh, tp, dp), f32),
                      grid=(blocks,), grid_names=("blocks",),
                      compiler_params=plgpu.CompilerParams(), interpret=interpret)(
                          qp, ktp, vp, bias)


def _chunk(dp: int, parts: int) -> int:
  """Keys per chunk for padded head size `dp` (`tiles.chunk`; C by default)."""
  return tiles.chunk(dp, jnp.bfloat16 if parts == 1 else jnp.float32)


def _f32_transforms(cols: int):
  """SMEM layout of a float32 tile read into / written from WGMMA-layout registers."""
  swizzle = plgpu.find_swizzle(cols * 32)
  return plgpu.TilingTransform((8, swizzle // 4)), plgpu.SwizzleTransform(swizzle)


def attention(q: Array, k: Array, v: Array, bias: Array, interpret: bool | None = None) -> Array:
  """q [B, T, H, D], k/v [B, Hkv, S, D] (Hkv divides H; float32 or bfloat16; float16
  computed as float32), bias [B|1, H|1, T|1, S] -> [B, T, H, D] float32.

  bfloat16 q, k and v run one bfloat16 part; anything else two (hi/lo of float32).
  interpret: None: `mode.interpret()`; False compiles for Mosaic GPU.
  """
  b, t, h, d, s, hkv = check_attention(q, k, v, bias)
  bf16 = jnp.dtype(jnp.bfloat16)
  parts = 1 if {jnp.dtype(a.dtype) for a in (q, k, v)} == {bf16} else 2
  tp, dp = _ceil(t, TM), _ceil(d, 64)
  sp = _ceil(s, _chunk(dp, parts))
  qh = jnp.pad(jnp.swapaxes(q, 1, 2), ((0, 0), (0, 0), (0, tp - t), (0, dp - d)))
  kt = jnp.pad(jnp.swapaxes(k, 2, 3), ((0, 0), (0, 0), (0, dp - d), (0, sp - s)))
  vv = jnp.pad(v, ((0, 0), (0, 0), (0, sp - s), (0, dp - d)))
  flat = lambda a: split(a.reshape((-1,) + a.shape[2:]).astype(jnp.float32), parts)
  bias = jnp.broadcast_to(bias.astype(jnp.float32), bias.shape[:2] + (t, s))
  bias = jnp.pad(bias, ((0, 0), (0, 0), (0, tp - t), (0, sp - s)),
                 constant_values=_MASKED)
  out = _kernel_call(flat(qh), flat(kt), flat(vv), bias, h, mode.params(interpret))
  return jnp.swapaxes(out.reshape(b, h, tp, dp)[:, :, :t, :d], 1, 2)
