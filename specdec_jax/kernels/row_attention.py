"""Attention of decode requests in one kernel: every query row computed alike.

    out = attention(q, k, v, bias, lengths, window, softcap)
    # q [B, T, H, D], grouped k/v [B, Hkv, S, D], bias None | [B|1, H|1, T|1, S],
    # lengths None | [B, T], window None | int, softcap None | float -> out [B, T, H, D] f32

softmax(q . k + bias) @ v per (b, t, h) row over the row's keys s < lengths[b, t] (the
seam: `kernels.shapes`), with a fixed per-row sequence of operations (see attention.cc):
row t of a T-row call is bitwise the 1-row call on it, whatever B, T and H are, and a
length is bitwise the same row with the keys past it masked in the bias; keys past a
row's length are not read; with a `window`, nor are the keys before lengths - window
(bitwise the same row with them masked in the bias). With a `softcap` c each q . k
becomes c * tanh(q . k / c) before the bias is added (Gemma 2's soft-capping; tanh by a
fixed rational function, within 5 ulp); without one a row is the bits it was before the
kernel took a softcap. Grouped-query K/V are read in place: query head h reads K/V head
h // (H / Hkv) (Hugging Face's `repeat_kv` order), bitwise as if repeated. Keys appended
under the mask change nothing either (a sentence's rows do not depend on the padded
length of its batch), provided the row has an unmasked key and the masked values are
finite. T5 conventions: no 1/sqrt(D) scaling (it lives in the query weights), masked
keys carry a large negative bias.

k and v are read in their dtype. With bfloat16 the probabilities are rounded to
bfloat16 before the weighted sum, as XLA's path rounds them to the compute dtype (the
models' caches are in the compute dtype); float16 caches are widened to float32 first
(exact), and their probabilities stay float32 (XLA's path would round them to float16).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.kernels import build, work
from specdec_jax.kernels.shapes import check_attention, check_softcap, row_lengths

Array = jax.Array


def threads(b: int, h: int, s: int, d: int, dtype) -> int:
  """Threads for attention over [b, h, s, d] keys and values: one per
  `work.PARALLEL_BYTES` of them (the kernel caps it at the pool's size and at b x h)."""
  return work.count(2 * b * h * s * d * jnp.dtype(dtype).itemsize)


def attention(q: Array, k: Array, v: Array, bias: Array | None = None,
              lengths: Array | None = None, window: int | None = None,
              softcap: float | None = None) -> Array:
  """q [B, T, H, D] (any float dtype; computed in float32), k/v [B, Hkv, S, D] (Hkv
  divides H), bias None | [B|1, H|1, T|1, S], lengths None | [B, T] (clipped to 1..S;
  None: S), window None | int (row (b, t) reads the keys from lengths[b, t] - window on:
  `kernels.shapes`), softcap None | float > 0 (the logits q . k soft-capped at it before
  the bias) -> [B, T, H, D] float32.

  Needs the kernels (`build.available()`): the caller picks this or XLA's ops. Under
  `jax.vmap` the call runs once per mapped element (each bitwise as alone).
  """
  b, t, h, d, s, hkv = check_attention(q, k, v, bias, lengths)
  check_softcap(softcap)
  if k.dtype != v.dtype or jnp.dtype(k.dtype) != jnp.bfloat16:
    k, v = k.astype(jnp.float32), v.astype(jnp.float32)
  if not build.available():
    raise RuntimeError(f"attention kernel unavailable: {build.status().reason}")
  call = jax.ffi.ffi_call(build.ATTENTION, jax.ShapeDtypeStruct(q.shape, jnp.float32),
                          vmap_method="sequential")
  bias = jnp.zeros((1, 1, 1, 0), jnp.float32) if bias is None else bias.astype(jnp.float32)
  return call(q.astype(jnp.float32), k, v, bias, row_lengths(lengths, b, t, s),
              nthreads=np.int64(threads(b, hkv, s, d, k.dtype)), chunks=np.int64(work.CHUNKS),
              window=np.int64(window or 0), softcap=np.float32(softcap or 0.0))
