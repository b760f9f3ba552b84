"""Attention of decode requests in one kernel: every query row computed alike.

    out = attention(q, k, v, bias)   # q [B, T, H, D], k/v [B, H, S, D], bias [B|1, H|1, T|1, S]
                                     # -> out [B, T, H, D] float32

softmax(q . k + bias) @ v per (b, t, h) row with a fixed per-row sequence of
operations (see attention.cc): row t of a T-row call is bitwise the 1-row call on it,
whatever B, T and H are, and masked keys add exact zeros (a sentence's rows do not
depend on the padded length of its batch). T5 conventions: no 1/sqrt(D) scaling (it lives in the query
weights), masked keys carry a large negative bias. k and v are read in the caches'
dtype: with bfloat16 the probabilities are rounded to bfloat16 before the weighted sum,
as XLA's path casts them to the compute dtype; float16 caches are widened to float32
first (exact; the probabilities then stay float32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.kernels import build, skinny

Array = jax.Array


def threads(b: int, h: int, s: int, d: int, dtype) -> int:
  """Threads for attention over [b, h, s, d] keys and values: one per PARALLEL_BYTES of
  them (the kernel caps it at the pool's size and at b x h)."""
  return max(1, 2 * b * h * s * d * jnp.dtype(dtype).itemsize // skinny.PARALLEL_BYTES)


def attention(q: Array, k: Array, v: Array, bias: Array) -> Array:
  """q [B, T, H, D] (any float dtype; computed in float32), k/v [B, H, S, D], bias [B|1, H|1, T|1, S] -> [B, T, H, D] float32.

  Needs the kernels (`build.available()`): the caller picks this or XLA's ops.
  """
  b, t, h, d = q.shape
  s = k.shape[2]
  if k.shape != (b, h, s, d) or v.shape != k.shape:
    raise ValueError(f"attention: k {list(k.shape)} / v {list(v.shape)} are not [B, H, S, D] "
                     f"= [{b}, {h}, S, {d}] of q {list(q.shape)}")
  if k.dtype != v.dtype or jnp.dtype(k.dtype) != jnp.bfloat16:
    k, v = k.astype(jnp.float32), v.astype(jnp.float32)
  if bias.ndim != 4 or any(n not in (1, full) for n, full in zip(bias.shape[:3], (b, h, t))) \
      or bias.shape[3] != s:
    raise ValueError(f"attention: bias {list(bias.shape)} is not [B|1, H|1, T|1, S] = "
                     f"[{b}|1, {h}|1, {t}|1, {s}]")
  if not build.available():
    raise RuntimeError(f"decode attention kernel unavailable: {build.status().reason}")
  call = jax.ffi.ffi_call(build.ATTENTION, jax.ShapeDtypeStruct(q.shape, jnp.float32))
  return call(q.astype(jnp.float32), k, v, bias.astype(jnp.float32),
              nthreads=np.int64(threads(b, h, s, d, k.dtype)))
