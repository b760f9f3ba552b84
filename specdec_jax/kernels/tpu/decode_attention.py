"""Decode attention on TPU (Pallas, Mosaic TPU): every query row computed alike.

    out = attention(q, k, v, bias=None, lengths=None)
    # q [B, T, H, D], grouped k/v [B, Hkv, S, D], bias None | [B|1, H|1, T|1, S],
    # lengths None | [B, T] int -> out [B, T, H, D] float32

softmax(q . k + bias) @ v per (b, h, query row) over the row's keys s < lengths[b, t]
(`shapes.row_lengths`: clipped to 1..S, None: S), T5's conventions (no 1/sqrt(D): it
lives in the query weights). The grid is (b, h, query tile): the query rows of a (b, h)
are cut into tiles of TQ = 16 (zero rows of length 1 pad the last), and each tile walks
the fixed-shape cache, S rounded up to chunks of C = 128 keys (a fixed SIZE, whatever S
is), in order, with an online softmax (running max m, sum l, output o): the same
operations for every row, whatever T, B, H and the row's place, so a row is bitwise the
same in a 1-token call and in a 16-token one. Grouped-query K/V stay grouped: the block
of query head h reads K/V head h // (H / Hkv) (no repeated copy). bias=None: no bias
operand at all.

Lengths. A tile walks only its longest row's chunks (`shapes.tile_chunks`, scalar-
prefetched into SMEM: the trip count of its loop over chunks), and inside a chunk a key
c * C + j at or past a row's own length (each row's length comes in as a [TQ, 1] int32
block, never a [T, S] tensor) gets the logit -1e30: its weight exp(-1e30 - m) is an
exact zero; the keys padding S up to chunks are past every length. Why this is bitwise
the same kernel with lengths=None and the mask in the bias (`shapes.dense_bias`, -1e10):
a row's first key is not masked by its length (lengths >= 1), so after chunk 0 its
running max m is finite (at least about -2e10 where a bias masks the whole first chunk),
far above -1e30, and chunk 0 is computed alike in both; a chunk with masked keys then leaves m
where the unmasked keys put it (the same ones in both), every masked weight is an exact
0, and a chunk wholly past the row's length (walked by the reference, or by a tile with
a longer row; skipped by a tile without one) changes nothing: alpha = exp(m - m) = 1,
its p @ v and row sum add exact zeros. So a row's result depends on neither the masked
values nor on how many chunks its tile walked (the same for a bias that masks keys too:
-1e10 beside -2e10 still weighs 0).

bfloat16 q, k and v: bfloat16 MXU products with float32 accumulation, the probabilities
of a chunk entering p @ v rounded to bfloat16 before normalisation (XLA's path rounds
the normalised weights: the two agree within bfloat16's rounding); anything else runs
in float32 (products at Precision.HIGHEST). Interpret mode replaces each product, and
the row sums, by in-order loops (`matmul.product`: the interpreter's are the host's).
D is padded to a multiple of 128 (zeros: exact zero terms).

K and V stay in HBM (`pl.ANY`): the loop copies chunk c + 1 into the other half of a
two-chunk VMEM buffer while it computes chunk c, so a tile reads from HBM only the K/V
chunks it walks, and VMEM holds 2 x 2 x C x Dp of them whatever S is. A bias, when there
is one (T5's relative position bias), is still a block of all its chunks: read whole.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from specdec_jax.kernels.shapes import check_attention, tiled_lengths
from specdec_jax.kernels.tpu import mode
from specdec_jax.kernels.tpu.matmul import LANE, _ceil, product

Array = jax.Array

TQ = 16          # query rows per tile (a bfloat16 vreg's sublanes)
C = 128          # keys per chunk: a fixed SIZE, whatever S is
_MASKED = -1e30  # the logit of a key past a row's length: exp() of it is 0


def _row_sum(p: Array, interpret: bool) -> Array:
  """p [R, C] -> [R, 1] float32: a lane reduction on a TPU; in order when interpreting."""
  if not interpret:
    return p.sum(axis=1, keepdims=True)
  return lax.fori_loop(0, p.shape[1], lambda j, c: c + p[:, j, None],
                       jnp.zeros((p.shape[0], 1), jnp.float32))


def _kernel_call(walk: Array, rows: Array, qp: Array, kp: Array, vp: Array,
                 bias: Array | None, interpret) -> Array:
  """walk [B * tiles] int32 (the chunks each query tile walks), rows [B, Tp, 1] int32 (each
  row's length, 1..S), qp [B, H, Tp, Dp], kp/vp [B, Hkv, chunks, C, Dp] (one dtype, left in
  HBM: chunk c + 1 is copied into VMEM while chunk c is computed), bias None | [Bb, Hb,
  chunks, Tp, C] float32 -> [B, H, Tp, Dp] float32."""
  b, h, tp, dp = qp.shape
  tiles = tp // TQ
  group = h // kp.shape[1]
  inline = bool(interpret)
  low = qp.dtype == jnp.bfloat16
  # lax.div: heads are >= 0, and Mosaic TPU lowers a floor division's sign test only
  # knowing the chip (not where `lower_for_tpu` runs); ungrouped: the head itself
  kv_head = (lambda hh: hh) if group == 1 else (lambda hh: lax.div(hh, group))

  def kernel(walk_ref, rows_ref, q_ref, k_hbm, v_hbm, *refs):
    bias_ref = refs[0] if bias is not None else None
    o_ref, k_buf, v_buf, sems = refs[-4:]
    bb, kvh = pl.program_id(0), kv_head(pl.program_id(1))
    walked = walk_ref[bb * tiles + pl.program_id(2)]
    q = q_ref[...]
    length = rows_ref[...]                                        # [TQ, 1]
    lane = lax.broadcasted_iota(jnp.int32, (TQ, C), 1)

    def copies(c, slot):
      return [pltpu.make_async_copy(hbm.at[bb, kvh, c], buf.at[slot], sems.at[i, slot])
              for i, (hbm, buf) in enumerate(((k_hbm, k_buf), (v_hbm, v_buf)))]

    def chunk(c, state):
      """Chunk c of the keys after the state (o, m, l) of the chunks before it."""
      o, m, denom = state
      slot = lax.rem(c, 2)

      @pl.when(c + 1 < walked)
      def _next():
        for copy in copies(c + 1, 1 - slot):
          copy.start()

      for copy in copies(c, slot):
        copy.wait()
      s = product(q, k_buf[slot], inline, contract_b=1)
      if bias_ref is not None:
        s = s + bias_ref[c]
      s = jnp.where(c * C + lane < length, s, _MASKED)
      m_new = jnp.maximum(m, s.max(axis=1, keepdims=True))
      probs = jnp.exp(s - m_new)
      pv = product(probs.astype(jnp.bfloat16) if low else probs, v_buf[slot], inline)
      alpha = jnp.exp(m - m_new)          # 0 before the first chunk (m = -inf, o = l = 0)
      return o * alpha + pv, m_new, denom * alpha + _row_sum(probs, inline)

    for copy in copies(0, 0):
      copy.start()
    # Every score is finite (masked keys carry a finite logit), so m_new is too.
    start = (jnp.zeros((TQ, dp), jnp.float32), jnp.full((TQ, 1), -jnp.inf, jnp.float32),
             jnp.zeros((TQ, 1), jnp.float32))
    o, _, denom = lax.fori_loop(0, walked, chunk, start)
    o_ref[...] = o / denom

  row = lambda bb, hh, t, walk: (bb, hh, t, 0)
  in_specs = [pl.BlockSpec((None, TQ, 1), lambda bb, hh, t, walk: (bb, t, 0)),
              pl.BlockSpec((None, None, TQ, dp), row),
              pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)]
  operands = [rows, qp, kp, vp]
  if bias is not None:
    bias_b, bias_h = bias.shape[:2]
    in_specs.append(pl.BlockSpec(
        (None, None, bias.shape[2], TQ, C),
        lambda bb, hh, t, walk: (bb if bias_b > 1 else 0, hh if bias_h > 1 else 0, 0, t, 0)))
    operands.append(bias)
  grid = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(b, h, tiles), in_specs=in_specs,
      out_specs=pl.BlockSpec((None, None, TQ, dp), row),
      scratch_shapes=[pltpu.VMEM((2, C, dp), qp.dtype), pltpu.VMEM((2, C, dp), qp.dtype),
                      pltpu.SemaphoreType.DMA((2, 2))])
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((b, h, tp, dp), jnp.float32), grid_spec=grid,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel")),
      interpret=interpret)(walk, *operands)


def attention(q: Array, k: Array, v: Array, bias: Array | None = None,
              lengths: Array | None = None, interpret: bool | None = None) -> Array:
  """q [B, T, H, D], k/v [B, Hkv, S, D] (Hkv divides H; float32 or bfloat16; float16
  computed as float32), bias None | [B|1, H|1, T|1, S], lengths None | [B, T] int (keys
  each row reads, clipped to 1..S; None: S) -> [B, T, H, D] float32.

  interpret: None: `mode.interpret()`; False compiles for Mosaic TPU (`lower_for_tpu`).
  """
  b, t, h, d, s, hkv = check_attention(q, k, v, bias, lengths)
  bf16 = jnp.dtype(jnp.bfloat16)
  dtype = bf16 if {jnp.dtype(a.dtype) for a in (q, k, v)} == {bf16} else jnp.dtype(jnp.float32)
  tp, dp, sp = _ceil(t, TQ), _ceil(d, LANE), _ceil(s, C)
  qh = jnp.pad(jnp.swapaxes(q, 1, 2).astype(dtype), ((0, 0), (0, 0), (0, tp - t), (0, dp - d)))
  chunked = lambda a: jnp.pad(a.astype(dtype), ((0, 0), (0, 0), (0, sp - s), (0, dp - d))
                             ).reshape(b, hkv, sp // C, C, dp)
  kp, vp = chunked(k), chunked(v)
  rows, walk = tiled_lengths(lengths, b, t, s, TQ, C)
  if bias is not None:      # the keys padding S are past every row's length: masked there
    bias = jnp.broadcast_to(bias.astype(jnp.float32), bias.shape[:2] + (t, s))
    bias = jnp.pad(bias, ((0, 0), (0, 0), (0, tp - t), (0, sp - s)))
    bias = jnp.swapaxes(bias.reshape(bias.shape[:3] + (sp // C, C)), 2, 3)
  out = _kernel_call(walk.reshape(-1), rows[:, :, None], qh, kp, vp, bias,
                     mode.params(interpret))
  return jnp.swapaxes(out[:, :, :t, :d], 1, 2)
