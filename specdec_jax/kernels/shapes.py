"""The decode-attention operands' shapes, checked once for every backend's kernel."""

from __future__ import annotations

import jax

Array = jax.Array


def check_attention(q: Array, k: Array, v: Array, bias: Array) -> tuple[int, int, int, int, int]:
  """(B, T, H, D, S) of q [B, T, H, D], k/v [B, H, S, D], bias [B|1, H|1, T|1, S]; a
  `ValueError` naming the operand whose shape does not fit."""
  if q.ndim != 4 or k.ndim != 4:
    raise ValueError(f"attention: q {list(q.shape)} and k {list(k.shape)} must be 4-D "
                     f"([B, T, H, D] and [B, H, S, D])")
  b, t, h, d = q.shape
  s = k.shape[2]
  if k.shape != (b, h, s, d) or v.shape != k.shape:
    raise ValueError(f"attention: k {list(k.shape)} / v {list(v.shape)} are not [B, H, S, D] "
                     f"= [{b}, {h}, S, {d}] of q {list(q.shape)}")
  if bias.ndim != 4 or bias.shape[3] != s or any(
      n not in (1, full) for n, full in zip(bias.shape[:3], (b, h, t), strict=True)):
    raise ValueError(f"attention: bias {list(bias.shape)} is not [B|1, H|1, T|1, S] = "
                     f"[{b}|1, {h}|1, {t}|1, {s}]")
  return b, t, h, d, s
