"""A backend's first-use self-check on a device: its kernels compile, their rows are bitwise
invariant, and they agree with XLA, on small shapes (seconds).

    why = selfcheck.check(backend, "NVIDIA H100 80GB HBM3")   # "" when it passes

`backends.choose` runs it the first time a backend with compiled accelerator kernels
(`Backend.checked`: gpu) is used on a device kind, and raises `SelfCheckFailed` when it
fails: never silently wrong output. The result is cached per (backend, device kind) for
the process, as a string (never arrays). `run(backend)` does the work; with a backend in
interpret mode it runs on a CPU (tests).

What it checks, for each product kind the backend has a kernel for:
- dot (bfloat16 and float32 weights, K and N off the tiles): rows of an M-row call are
  bitwise those of 1- and 5-row calls on them, at scattered positions; the product agrees
  with XLA's at HIGHEST precision (relative to sum |x| max |w|).
- sum_squares: the same, against float64 on the host.
- attention: query rows of a T-token call are bitwise those of 1-token calls and of a row
  alone in the batch; agrees with XLA's softmax attention.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.errors import InputError
from specdec_jax.kernels import shapes

K, N, M = 130, 70, 16        # off the tiles of every backend: both edges padded
ATTENTION = (2, 5, 2, 70, 24)  # B, T, H, S, D: S spans two 64-key chunks
DTYPES = (jnp.bfloat16, jnp.float32)
DOT_TOLERANCE = 1e-4         # |error| / (sum |x| max |w|): bf16 exact, f32 hi/lo ~2^-16
#: float32 attention: its products' dropped lo.lo terms (2^-16 relative each) reach the
#: logits summed over D, then the softmax: 1.24e-4 measured on an H200 (interpret mode: 0)
ATTENTION_TOLERANCE = {jnp.dtype(jnp.bfloat16): 2e-2, jnp.dtype(jnp.float32): 1e-3}

_RESULTS: dict[tuple[str, str], str] = {}    # (backend, device kind) -> "" or what failed


class SelfCheckFailed(InputError):
  """A backend's kernels failed their first-use self-check on this device."""


def check(backend, device_kind: str) -> str:
  """"" when `backend`'s kernels pass `run` on this device kind, else what failed; run
  once per (backend, device kind) in a process."""
  key = (backend.name, device_kind)
  if key not in _RESULTS:
    _RESULTS[key] = run(backend)
  return _RESULTS[key]


def run(backend, dtypes=DTYPES) -> str:
  """Check `backend`'s kernels (module docstring): "" when they pass, else one line
  naming each failure. A kernel that does not compile or run is a failure."""
  rng = np.random.default_rng(0)
  problems: list[str] = []
  checks = {"dot": _dot, "sum_squares": _sum_squares, "attention": _attention}
  for kind, fn in checks.items():
    if kind not in backend.kinds:
      continue
    for dtype in (dtypes if kind != "sum_squares" else (jnp.float32,)):
      name = f"{kind} {jnp.dtype(dtype).name}"
      try:
        problems += [f"{name}: {p}" for p in fn(backend, jnp.dtype(dtype), rng)]
      except Exception as e:        # noqa: BLE001 -- any failure to compile or run is one
        problems.append(f"{name} did not run: {type(e).__name__}: "
                        f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}")
  return "; ".join(problems)


def _rows(m: int, seed: int) -> np.ndarray:
  """Positions in the M-row reference of an m-row call: scattered, reversed."""
  return np.random.default_rng(seed).permutation(M)[:m][::-1].copy()


def _invariant(call, x, full) -> list[str]:
  """Rows of `call` on 1 and 5 of x's rows are bitwise `full`'s."""
  out = []
  for m in (1, 5):
    rows = _rows(m, seed=m)
    if not np.array_equal(np.asarray(call(x[rows])), full[rows]):
      out.append(f"rows differ between a {M}-row call and a {m}-row call")
  return out


def _dot(backend, dtype, rng) -> list[str]:
  w = jnp.asarray(rng.standard_normal((K, N)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((M, K)), dtype)
  packed = backend.pack(w, dtype)
  call = jax.jit(lambda a: backend.dot(a, packed, N))
  full = np.asarray(call(x))
  problems = _invariant(call, x, full)
  want = np.asarray(jnp.dot(x, w.astype(dtype), preferred_element_type=jnp.float32,
                            precision=jax.lax.Precision.HIGHEST))
  scale = np.abs(np.asarray(x, np.float32)).sum(-1, keepdims=True) * float(jnp.abs(w).max())
  error = float(np.max(np.abs(full - want) / scale))
  if not error <= DOT_TOLERANCE:
    problems.append(f"differs from XLA's product by {error:.2e} (relative; allowed "
                    f"{DOT_TOLERANCE:.0e})")
  return problems


def _sum_squares(backend, dtype, rng) -> list[str]:
  x = jnp.asarray(rng.standard_normal((M, K)), dtype)
  ones = backend.pack(jnp.ones((K, 1), jnp.float32), jnp.float32)
  call = jax.jit(lambda a: backend.sum_squares(a, ones))
  full = np.asarray(call(x))
  problems = _invariant(call, x, full)
  want = np.sum(np.square(np.asarray(x, np.float64)), -1, keepdims=True)
  if not np.allclose(full, want, rtol=DOT_TOLERANCE, atol=0):
    problems.append("differs from the float64 sum of squares")
  return problems


def _attention(backend, dtype, rng) -> list[str]:
  """Per-row lengths (a causal decode's: each row one key more than the row before) and a
  relative-position-like bias [1, H, T, S], as the models call it."""
  b, t, h, s, d = ATTENTION
  q = jnp.asarray(rng.standard_normal((b, t, h, d)), dtype)
  k = jnp.asarray(rng.standard_normal((b, h, s, d)), dtype)
  v = jnp.asarray(rng.standard_normal((b, h, s, d)), dtype)
  last = np.array([s - 3, 40])                                    # the last row's keys
  lengths = jnp.asarray(last[:, None] - np.arange(t)[::-1], jnp.int32)   # [B, T]
  bias = jnp.asarray(rng.standard_normal((1, h, t, s)), jnp.float32)
  call = jax.jit(backend.attention)
  full = np.asarray(call(q, k, v, bias, lengths))
  problems = []
  for start in (0, t - 1):
    row = slice(start, start + 1)
    if not np.array_equal(np.asarray(call(q[:, row], k, v, bias[:, :, row], lengths[:, row])),
                          full[:, row]):
      problems.append(f"query row {start} differs between a {t}-token and a 1-token call")
  if not np.array_equal(np.asarray(call(q[1:], k[1:], v[1:], bias, lengths[1:])), full[1:]):
    problems.append("a batch row differs from the same row alone")
  want = np.asarray(_xla_attention(q, k, v, shapes.dense_bias(bias, lengths, b, t, s)))
  error = float(np.max(np.abs(full - want)))
  if not error <= ATTENTION_TOLERANCE[dtype]:
    problems.append(f"differs from XLA's attention by {error:.2e} (allowed "
                    f"{ATTENTION_TOLERANCE[dtype]:.0e})")
  return problems


def _xla_attention(q: Any, k: Any, v: Any, bias: Any) -> Any:
  """softmax(q k + bias) v at HIGHEST precision: q [B, T, H, D] -> [B, T, H, D] float32."""
  logits = jnp.einsum("bthd,bhsd->bhts", q, k, preferred_element_type=jnp.float32,
                      precision=jax.lax.Precision.HIGHEST) + bias
  return jnp.einsum("bhts,bhsd->bthd", jax.nn.softmax(logits, axis=-1),
                    v.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
