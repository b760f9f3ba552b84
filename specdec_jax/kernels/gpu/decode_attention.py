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

import dataclasses
from typing import Any, NamedTuple

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


@dataclasses.dataclass(frozen=True)
class _Plan:
  """The kernel's static sizes, read by every phase (Python values: nothing traced)."""

  parts: int          # bfloat16 parts of an operand (1, or 2: hi/lo of float32)
  bh: int             # B * H: query heads of every batch row
  tp: int             # query rows, padded to a multiple of TM
  dp: int             # head size, padded to a multiple of 64
  c: int              # keys per chunk (`_chunk`)
  heads: int          # H
  group: int          # query heads per K/V head
  biased: bool        # a bias operand exists
  interpret: Any      # `mode.params`: False, or the interpreter's parameters

  @property
  def row_tiles(self) -> int:
    return self.tp // TM

  @property
  def units(self) -> int:
    """(head, row tile) pairs: each one unit of work."""
    return self.bh * self.row_tiles

  @property
  def blocks(self) -> int:
    return 1 if self.interpret else self.units

  @property
  def n_barriers(self) -> int:
    """K parts, V parts, [the bias], the row lengths."""
    return 2 * self.parts + self.biased + 1

  @property
  def lens_barrier(self) -> int:
    return self.n_barriers - 1


class _Refs(NamedTuple):
  """The kernel's GMEM operands and its SMEM scratch (`_scratch`)."""

  q_gmem: Any
  k_gmem: Any
  v_gmem: Any
  bias_gmem: Any      # None without a bias
  lens_gmem: Any
  walks_gmem: Any
  o_gmem: Any
  q_smem: Any
  k_smem: Any
  v_smem: Any
  p_smem: Any
  lens_smem: Any
  o_smem: Any
  barrier: Any
  b_smem: tuple       # (the bias chunk,) or ()


class _Tile(NamedTuple):
  """One unit's place: its query head g, its row tile ti and rows, its K/V head, its bias
  row and head (0 where the bias broadcasts), and each row's length in the WGMMA layout."""

  g: Any
  ti: Any
  rows: Any
  kv: Any
  bb: Any
  hb: Any
  row_len: Any


def _kernel_call(qp, ktp, vp, bias, lens, walks, heads: int, interpret) -> Array:
  """qp [P, BH, Tp, Dp], ktp [P, BHkv, Dp, Sp], vp [P, BHkv, Sp, Dp] bfloat16, bias None |
  [Bb, Hb, Tp, Sp] float32, lens [B, Tp] int32 (each row's keys, 1..S), walks [B, Tp / TM]
  int32 (each row tile's chunks, `shapes.tile_chunks`) -> [BH, Tp, Dp] float32."""
  parts, bh, tp, dp = qp.shape
  plan = _Plan(parts=parts, bh=bh, tp=tp, dp=dp, c=_chunk(dp, parts), heads=heads,
               group=bh // ktp.shape[1], biased=bias is not None, interpret=interpret)

  def kernel(q_gmem, k_gmem, v_gmem, *refs):
    bias_gmem = refs[0] if plan.biased else None
    block = lax.axis_index("blocks")

    def scoped(*smem):
      _scoped(plan, _Refs(q_gmem, k_gmem, v_gmem, bias_gmem, *refs[-3:], *smem[:7],
                          b_smem=smem[7:]), block)

    pl.run_scoped(scoped, *_scratch(plan))

  operands = (qp, ktp, vp) + ((bias,) if plan.biased else ()) + (lens, walks)
  return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((bh, tp, dp), jnp.float32),
                      grid=(plan.blocks,), grid_names=("blocks",),
                      compiler_params=plgpu.CompilerParams(), interpret=interpret)(*operands)


def _scratch(plan: _Plan) -> list:
  """The SMEM of a block: q, K, V and probability tiles (bfloat16 parts), the row lengths,
  the output tile, the barriers, [a bias chunk]."""
  bf16, f32, parts, dp, c = jnp.bfloat16, jnp.float32, plan.parts, plan.dp, plan.c
  return [plgpu.SMEM((parts, TM, dp), bf16, transforms=_transforms(dp)),
          plgpu.SMEM((parts, dp, c), bf16, transforms=_transforms(c)),
          plgpu.SMEM((parts, c, dp), bf16, transforms=_transforms(dp)),
          plgpu.SMEM((parts, TM, c), bf16, transforms=_transforms(c)),
          plgpu.SMEM((TM,), jnp.int32),
          plgpu.SMEM((TM, dp), f32, transforms=_f32_transforms(dp)),
          plgpu.Barrier(num_barriers=plan.n_barriers),
          *([plgpu.SMEM((TM, c), f32, transforms=_f32_transforms(c))] if plan.biased else [])]


def _scoped(plan: _Plan, r: _Refs, block) -> None:
  """The block's units, one after the other (one block of every unit when interpreting)."""
  per_block = plan.units // plan.blocks
  lax.fori_loop(0, per_block, lambda t, carry: _unit(plan, r, block * per_block + t, carry),
                None)
  plgpu.wait_smem_to_gmem(0)


def _unit(plan: _Plan, r: _Refs, u, carry):
  """Unit u: one query head's row tile over the keys its longest row reaches."""
  tile = _start_tile(plan, r, u)
  # The first chunk starts the state (its layouts are the WGMMA results'); the tile walks
  # only the chunks its longest row reaches (module docstring).
  walk = r.walks_gmem[tile.g // plan.heads, tile.ti]
  chunk = lambda c, state: _chunk_step(plan, r, tile, c, state)
  o, _, denom = lax.fori_loop(1, walk, chunk, chunk(0, None))
  r.o_smem[...] = o / lax.broadcast_in_dim(denom, o.shape, [0])
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(r.o_smem, r.o_gmem.at[tile.g, tile.rows, :])
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)
  return carry


def _start_tile(plan: _Plan, r: _Refs, u) -> _Tile:
  """Unit u's place, its query rows and row lengths read into SMEM."""
  heads, group = plan.heads, plan.group
  g, ti = u // plan.row_tiles, u % plan.row_tiles
  # its K/V head (ungrouped: g itself)
  kv = g if group == 1 else (g // heads) * (heads // group) + (g % heads) // group
  bb = hb = None
  if plan.biased:
    bb = g // heads if r.bias_gmem.shape[0] > 1 else 0
    hb = g % heads if r.bias_gmem.shape[1] > 1 else 0
  rows = pl.ds(ti * TM, TM)
  for p in range(plan.parts):
    plgpu.copy_gmem_to_smem(r.q_gmem.at[p, g, rows, :], r.q_smem.at[p], r.barrier.at[p])
  plgpu.copy_gmem_to_smem(r.lens_gmem.at[g // heads, rows], r.lens_smem,
                          r.barrier.at[plan.lens_barrier])
  for i in (*range(plan.parts), plan.lens_barrier):
    plgpu.barrier_wait(r.barrier.at[i])
  # each row's length, one per WGMMA row (as the running max m)
  row_len = _cast(r.lens_smem[...], plgpu.Layout.WGMMA.reduce(1), plan.interpret)
  return _Tile(g, ti, rows, kv, bb, hb, row_len)


def _load_chunk(plan: _Plan, r: _Refs, tile: _Tile, c) -> None:
  """Chunk c of K, V [and the bias] into SMEM, waited for."""
  keys, parts = pl.ds(c * plan.c, plan.c), plan.parts
  for p in range(parts):
    plgpu.copy_gmem_to_smem(r.k_gmem.at[p, tile.kv, :, keys], r.k_smem.at[p], r.barrier.at[p])
    plgpu.copy_gmem_to_smem(r.v_gmem.at[p, tile.kv, keys, :], r.v_smem.at[p],
                            r.barrier.at[parts + p])
  if plan.biased:
    plgpu.copy_gmem_to_smem(r.bias_gmem.at[tile.bb, tile.hb, tile.rows, keys], r.b_smem[0],
                            r.barrier.at[2 * parts])
  for i in range(2 * parts + plan.biased):
    plgpu.barrier_wait(r.barrier.at[i])


def _product(plan: _Plan, a_smem, b_smem, shape: tuple[int, int]) -> Array:
  """a @ b of two SMEM tiles in bfloat16 parts (`_PAIRS`), float32-accumulated WGMMAs."""
  def run(acc):
    for a, b in _PAIRS[plan.parts]:
      _mma(acc, a_smem.at[a], b_smem.at[b], plan.interpret)
    plgpu.wgmma_wait(0)
    return acc[...]

  return pl.run_scoped(run, _acc(shape, plan.interpret))


def _chunk_step(plan: _Plan, r: _Refs, tile: _Tile, c, state):
  """Chunk c of the keys; state (o, m, l) of the chunks before, None for the first."""
  _load_chunk(plan, r, tile, c)
  s = _product(plan, r.q_smem, r.k_smem, (TM, plan.c))
  if plan.biased:
    s = s + r.b_smem[0][...]
  # keys at or past a row's length (and S's padding): exp() of _MASKED is 0
  key = c * plan.c + _cast(lax.broadcasted_iota(jnp.int32, (TM, plan.c), 1),
                           plgpu.Layout.WGMMA, plan.interpret)
  s = jnp.where(key < lax.broadcast_in_dim(tile.row_len, s.shape, [0]), s, _MASKED)
  m_new = s.max(axis=1) if state is None else jnp.maximum(state[1], s.max(axis=1))
  probs = jnp.exp(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
  hi = probs.astype(jnp.bfloat16)
  r.p_smem[0] = hi
  if plan.parts == 2:
    r.p_smem[1] = (probs - hi.astype(jnp.float32)).astype(jnp.bfloat16)
  plgpu.commit_smem()
  pv = _product(plan, r.p_smem, r.v_smem, (TM, plan.dp))
  if state is None:
    return pv, m_new, probs.sum(axis=1)
  o, m, denom = state
  alpha = jnp.exp(m - m_new)
  return (o * lax.broadcast_in_dim(alpha, o.shape, [0]) + pv, m_new,
          denom * alpha + probs.sum(axis=1))


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
