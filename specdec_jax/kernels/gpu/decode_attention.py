"""Decode attention on Hopper tensor cores: every query row computed alike.

    out = attention(q, k, v, bias=None, lengths=None)
    # q [B, T, H, D], grouped k/v [B, Hkv, S, D], bias None | [B|1, H|1, T|1, S],
    # lengths None | [B, T] int -> out [B, T, H, D] float32      (`kernels.shapes`)

softmax(q . k + bias) @ v per (b, h, query row) over the row's keys s < lengths[b, t]
(clipped to 1..S; None: all S), T5's conventions (no 1/sqrt(D): it lives in the query
weights). The query rows of a (b, h) are cut into tiles of TM = 64 (zero rows of length 1
pad the last); each tile walks the keys in chunks of C keys (64 unless the tile table
names another for the head size: `tiles.chunk`), in order, with an online softmax
(running max m, sum l, output o): the same operations for every row, whatever T, B, H
and the row's place, so a row is bitwise the same in a 1-token call and in a 16-token
one. Grouped-query K/V stay grouped: query head h reads K/V head h // (H / Hkv) (no
repeated copy). With no bias the kernel has no bias operand (nothing made or read).

Lengths. The cache keeps its fixed shape S (rounded up to C), but a tile walks only the
chunks its longest row reaches (`shapes.tile_chunks`, a scalar read from GMEM: the
trip count of the chunk loop), and the kernel masks the keys c * C + j at or past each
row's own length (a [TM] int32 per tile, read into the rows' WGMMA layout: no [T, S]
mask is made) with _MASKED, whose exp() is an exact 0; the padding of S is masked the
same way. The result is BITWISE the same kernel's with lengths=None and the lengths in
the bias (`shapes.dense_bias`), and a row's result does not depend on how many chunks
its tile walks: a row's length is >= 1, so its first key is not masked by its length
and m is finite from chunk 0 on (at least about -2e10 where a bias masks the whole first
chunk, as an encoder row with many leading pads: far above _MASKED), and chunk 0 is
computed alike in both. A chunk of keys all masked for that row then has
s.max() below m (so m_new = m and alpha = exp(0) = 1 exactly), probabilities exp(masked
- m) = +0 exactly, p @ v = +0 and a zero row sum: o * 1 + 0 = o and l * 1 + 0 = l,
bitwise; so walking it or not changes nothing. In a chunk the row walks, a masked key's
logit (_MASKED here, MASKED + bias in the dense reference) is below m either way and
its probability an exact 0 either way; the unmasked keys' logits are the same sums.

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
from specdec_jax.kernels.shapes import check_attention, tiled_lengths

Array = jax.Array

C = 64          # keys per chunk by default: a fixed SIZE, whatever S is (`_chunk`)
_MASKED = -1e30  # logit of a key past a row's length or S: exp() of it is 0


def _kernel_call(qp, ktp, vp, bias, lens, walks, heads: int, interpret) -> Array:
  """qp [P, BH, Tp, Dp], ktp [P, BHkv, Dp, Sp], vp [P, BHkv, Sp, Dp] bfloat16, bias None |
  [Bb, Hb, Tp, Sp] float32, lens [B, Tp] int32 (each row's keys, 1..S), walks [B, Tp / TM]
  int32 (each row tile's chunks, `shapes.tile_chunks`) -> [BH, Tp, Dp] float32."""
  parts, bh, tp, dp = qp.shape
  C = _chunk(dp, parts)              # noqa: N806 (the module's C, from the tile table)
  group = bh // ktp.shape[1]          # query heads per K/V head
  row_tiles = tp // TM
  units = bh * row_tiles
  blocks = 1 if interpret else units
  pairs = _PAIRS[parts]
  f32 = jnp.float32
  biased = bias is not None
  # barriers: K parts, V parts, [the bias], the row lengths
  n_barriers = 2 * parts + biased + 1
  lens_barrier = n_barriers - 1

  def kernel(q_gmem, k_gmem, v_gmem, *refs):
    bias_gmem, (lens_gmem, walks_gmem, o_gmem) = (refs[0] if biased else None), refs[-3:]
    block = lax.axis_index("blocks")

    def scoped(q_smem, k_smem, v_smem, p_smem, lens_smem, o_smem, barrier, *b_smem):
      def unit(t, carry):
        u = block * (units // blocks) + t
        g, ti = u // row_tiles, u % row_tiles
        # its K/V head (ungrouped: g itself)
        kv = g if group == 1 else (g // heads) * (heads // group) + (g % heads) // group
        if biased:
          bb = g // heads if bias_gmem.shape[0] > 1 else 0
          hb = g % heads if bias_gmem.shape[1] > 1 else 0
        rows = pl.ds(ti * TM, TM)
        for p in range(parts):
          plgpu.copy_gmem_to_smem(q_gmem.at[p, g, rows, :], q_smem.at[p], barrier.at[p])
        plgpu.copy_gmem_to_smem(lens_gmem.at[g // heads, rows], lens_smem,
                                barrier.at[lens_barrier])
        for i in (*range(parts), lens_barrier):
          plgpu.barrier_wait(barrier.at[i])
        # each row's length, one per WGMMA row (as the running max m)
        row_len = _cast(lens_smem[...], plgpu.Layout.WGMMA.reduce(1), interpret)

        def chunk(c, state):
          """Chunk c of the keys; state (o, m, l) of the chunks before, None for the first."""
          keys = pl.ds(c * C, C)
          for p in range(parts):
            plgpu.copy_gmem_to_smem(k_gmem.at[p, kv, :, keys], k_smem.at[p], barrier.at[p])
            plgpu.copy_gmem_to_smem(v_gmem.at[p, kv, keys, :], v_smem.at[p],
                                    barrier.at[parts + p])
          if biased:
            plgpu.copy_gmem_to_smem(bias_gmem.at[bb, hb, rows, keys], b_smem[0],
                                    barrier.at[2 * parts])
          for i in range(2 * parts + biased):
            plgpu.barrier_wait(barrier.at[i])

          def scores(acc):
            for a, b in pairs:
              _mma(acc, q_smem.at[a], k_smem.at[b], interpret)
            plgpu.wgmma_wait(0)
            return acc[...]

          s = pl.run_scoped(scores, _acc((TM, C), interpret))
          if biased:
            s = s + b_smem[0][...]
          # keys at or past a row's length (and S's padding): exp() of _MASKED is 0
          key = c * C + _cast(lax.broadcasted_iota(jnp.int32, (TM, C), 1),
                              plgpu.Layout.WGMMA, interpret)
          s = jnp.where(key < lax.broadcast_in_dim(row_len, s.shape, [0]), s, _MASKED)
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

        # The first chunk starts the state (its layouts are the WGMMA results'); the tile
        # walks only the chunks its longest row reaches (module docstring).
        walk = walks_gmem[g // heads, ti]
        o, _, denom = lax.fori_loop(1, walk, chunk, chunk(0, None))
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
                  plgpu.SMEM((TM,), jnp.int32),
                  plgpu.SMEM((TM, dp), f32, transforms=_f32_transforms(dp)),
                  plgpu.Barrier(num_barriers=n_barriers),
                  *([plgpu.SMEM((TM, C), f32, transforms=_f32_transforms(C))] if biased else []))

  operands = (qp, ktp, vp) + ((bias,) if biased else ()) + (lens, walks)
  return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((bh, tp, dp), f32),
                      grid=(blocks,), grid_names=("blocks",),
                      compiler_params=plgpu.CompilerParams(), interpret=interpret)(*operands)


def _cast(x: Array, layout, interpret) -> Array:
  """x in `layout` on a GPU (Mosaic GPU infers no layout for an iota or a vector read
  from SMEM); unchanged when interpreting (the interpreter has no layouts)."""
  return x if interpret else plgpu.layout_cast(x, layout)


def _chunk(dp: int, parts: int) -> int:
  """Keys per chunk for padded head size `dp` (`tiles.chunk`; C by default)."""
  return tiles.chunk(dp, jnp.bfloat16 if parts == 1 else jnp.float32)


def _f32_transforms(cols: int):
  """SMEM layout of a float32 tile read into / written from WGMMA-layout registers."""
  swizzle = plgpu.find_swizzle(cols * 32)
  return plgpu.TilingTransform((8, swizzle // 4)), plgpu.SwizzleTransform(swizzle)


def attention(q: Array, k: Array, v: Array, bias: Array | None = None,
              lengths: Array | None = None, interpret: bool | None = None) -> Array:
  """q [B, T, H, D], k/v [B, Hkv, S, D] (Hkv divides H; float32 or bfloat16; float16
  computed as float32), bias None | [B|1, H|1, T|1, S], lengths None | [B, T] int (row
  (b, t) reads the keys s < lengths[b, t], clipped to 1..S; None: all S) -> [B, T, H, D]
  float32 (`kernels.shapes`).

  bfloat16 q, k and v run one bfloat16 part; anything else two (hi/lo of float32).
  interpret: None: `mode.interpret()`; False compiles for Mosaic GPU.
  """
  b, t, h, d, s, hkv = check_attention(q, k, v, bias, lengths)
  bf16 = jnp.dtype(jnp.bfloat16)
  parts = 1 if {jnp.dtype(a.dtype) for a in (q, k, v)} == {bf16} else 2
  tp, dp = _ceil(t, TM), _ceil(d, 64)
  c = _chunk(dp, parts)
  sp = _ceil(s, c)
  qh = jnp.pad(jnp.swapaxes(q, 1, 2), ((0, 0), (0, 0), (0, tp - t), (0, dp - d)))
  kt = jnp.pad(jnp.swapaxes(k, 2, 3), ((0, 0), (0, 0), (0, dp - d), (0, sp - s)))
  vv = jnp.pad(v, ((0, 0), (0, 0), (0, sp - s), (0, dp - d)))
  flat = lambda a: split(a.reshape((-1,) + a.shape[2:]).astype(jnp.float32), parts)
  if bias is not None:      # its padding's keys are masked in the kernel, whatever it holds
    bias = jnp.broadcast_to(bias.astype(jnp.float32), bias.shape[:2] + (t, s))
    bias = jnp.pad(bias, ((0, 0), (0, 0), (0, tp - t), (0, sp - s)))
  lens, walks = tiled_lengths(lengths, b, t, s, TM, c)
  out = _kernel_call(flat(qh), flat(kt), flat(vv), bias, lens, walks, h, mode.params(interpret))
  return jnp.swapaxes(out.reshape(b, h, tp, dp)[:, :, :t, :d], 1, 2)
