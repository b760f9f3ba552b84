"""Skinny products on packed weights: `pack` once per model, `dot` in every decode step.

    wp = pack(w)                    # w [K, N] float32 or bfloat16 -> 16-column panels
    y = dot(x, wp, n=N)             # x [..., K] -> y [..., N] float32

float32 weights pack to float32 panels [P, K, 16] (kind "f32"); bfloat16 weights to
bfloat16 panels [P, ceil(K/2), 16, 2] (kind "bf16cvt": the kernel widens them to
float32; x stays float32). P = ceil(N/16); padding is zeros. Every output element is
one float32 accumulator updated in order k = 0..K-1 with an FMA, whatever the number
of rows: row r of a call is bitwise the 1-row call on that row (see skinny.cc).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.kernels import build, work

Array = jax.Array

PANEL = 16
ROWS_PER_PASS = 8      # rows that share one pass over the weights, roughly (skinny.cc plan)
PREFETCH = 16          # software prefetch distance, in panel rows


@functools.partial(jax.jit, static_argnames=("dtype",))
def pack(w: Array, dtype=None) -> Array:
  """w [K, N] -> panels: float32 [P, K, 16], or bfloat16 [P, ceil(K/2), 16, 2].

  dtype: the weights' compute dtype (default: w's); float32 or bfloat16. bfloat16
  rounds float32 weights as `w.astype(jnp.bfloat16)` does.
  """
  dtype = jnp.dtype(dtype or w.dtype)
  if dtype not in (jnp.float32, jnp.bfloat16):
    raise TypeError(f"skinny products take float32 or bfloat16 weights, not {dtype}")
  k, n = w.shape
  p = -(-n // PANEL)
  w = jnp.pad(w.astype(dtype), ((0, 0), (0, p * PANEL - n)))
  if dtype == jnp.float32:
    return w.reshape(k, p, PANEL).transpose(1, 0, 2)
  k2 = -(-k // 2)
  w = jnp.pad(w, ((0, 2 * k2 - k), (0, 0)))
  return w.reshape(k2, 2, p, PANEL).transpose(2, 0, 3, 1)


def check_packed(wp: Array, k: int, n: int) -> None:
  """Raise unless `wp` is the packing of a [k, n] float32 or bfloat16 matrix."""
  p = -(-n // PANEL)
  want = {jnp.float32: (p, k, PANEL), jnp.bfloat16: (p, -(-k // 2), PANEL, 2)}
  shape = want.get(jnp.dtype(wp.dtype).type)
  if shape is None or tuple(wp.shape) != shape:
    raise ValueError(f"packed weights {wp.dtype}{list(wp.shape)} are not a packed [{k}, {n}] "
                     f"matrix (float32 {list(want[jnp.float32])} or bfloat16 "
                     f"{list(want[jnp.bfloat16])})")


def threads(m: int, k: int, n: int, dtype) -> int:
  """Threads for an [m, k] x [k, n] product: about one per `work.PARALLEL_BYTES` of
  weights per ROWS_PER_PASS rows (an encoder's m = batch x length rows is compute, not
  one stream of the weights). The kernel caps it at the pool's size and the panel count."""
  return work.count(k * n * jnp.dtype(dtype).itemsize * -(-m // ROWS_PER_PASS))


def dot(x: Array, wp: Array, n: int) -> Array:
  """x [..., K] (any float dtype; computed in float32) @ packed [K, n] -> [..., n] float32.

  Needs the kernels (`build.available()`): the caller picks this or `jnp.dot`.
  """
  k = x.shape[-1]
  check_packed(wp, k, n)
  if not build.available():
    raise RuntimeError(f"skinny products unavailable: {build.status().reason}")
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (n,), jnp.float32)
  # vmap: one call per element. "expand_dims" would hand the kernel batched weights
  # [R, P, K, 16] (a vmapped while_loop batches its body's weights), which it rejects.
  call = jax.ffi.ffi_call(build.DOT, out, vmap_method="sequential")
  m = int(np.prod(x.shape[:-1], dtype=np.int64))
  return call(x.astype(jnp.float32), wp, nthreads=np.int64(threads(m, k, n, wp.dtype)),
              chunks=np.int64(work.CHUNKS), prefetch=np.int64(PREFETCH))


def pack_dtype(w: Array, dtype) -> jnp.dtype:
  """The CPU panels' dtype for weights `w` computed in `dtype` (both float32 or bfloat16).

  bfloat16 where the activations are bfloat16 or the weights are; float32 weights that
  bfloat16 holds exactly (checkpoints stored in bfloat16, such as the bundled demo
  pair, loaded as float32) pack as bfloat16 too: the kernel widens them back to the
  same float32 values and runs the same FMA sequence, so the results are bitwise those
  of float32 panels, from half the bytes (a batch-1 step streams every weight). This
  depends on the values: params moved off the bfloat16 grid repack wide.
  """
  if jnp.dtype(dtype) == jnp.bfloat16 or w.dtype == jnp.bfloat16 or bfloat16_exact(w):
    return jnp.dtype(jnp.bfloat16)
  return jnp.dtype(jnp.float32)


def bfloat16_exact(w: Array) -> bool:
  """Whether bfloat16 holds every float32 value of `w` bit for bit: the low 16 bits are
  zero (a test of the bits, so subnormals and NaN payloads are judged by what the
  kernel will read, whatever the floating-point mode)."""
  return not np.any(np.asarray(w, np.float32).view(np.uint32) & 0xFFFF)
