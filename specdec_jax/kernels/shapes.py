"""The decode-attention operands' shapes, checked once for every backend's kernel."""

from __future__ import annotations

import jax

Array = jax.Array


def check_attention(q: Array, k: Array, v: Array,
                    bias: Array) -> tuple[int, int, int, int, int, int]:
  """(B, T, H, D, S, Hkv) of q [B, T, H, D], grouped k/v [B, Hkv, S, D] (query head h
  reads K/V head h // (H / Hkv); Hkv = H without grouping), bias [B|1, H|1, T|1, S]; a
  `ValueError` naming the operand whose shape does not fit."""
  if q.ndim != 4 or k.ndim != 4:
    raise ValueError(f"attention: q {list(q.shape)} and k {list(k.shape)} must be 4-D "
                     f"([B, T, H, D] and [B, Hkv, S, D])")
  b, t, h, d = q.shape
  hkv, s = k.shape[1], k.shape[2]
  if k.shape != (b, hkv, s, d) or v.shape != k.shape or hkv < 1 or h % hkv:
    raise ValueError(f"attention: k {list(k.shape)} / v {list(v.shape)} are not [B, Hkv, S, D] "
                     f"= [{b}, Hkv, S, {d}] of q {list(q.shape)} (Hkv dividing H = {h})")
  if bias.ndim != 4 or bias.shape[3] != s or any(
      n not in (1, full) for n, full in zip(bias.shape[:3], (b, h, t), strict=True)):
    raise ValueError(f"attention: bias {list(bias.shape)} is not [B|1, H|1, T|1, S] = "
                     f"[{b}|1, {h}|1, {t}|1, {s}]")
  return b, t, h, d, s, hkv
