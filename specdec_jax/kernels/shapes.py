"""The decode-attention seam, shared by every backend's kernel: its operands' shapes, checked
once, and what per-row lengths mean.

    out = attention(q, k, v, bias=None, lengths=None)
    # q [B, T, H, D], grouped k/v [B, Hkv, S, D], bias None | [B|1, H|1, T|1, S],
    # lengths None | [B, T] int32 -> out [B, T, H, D] float32
    # (and, where a backend takes them, window= and softcap=: below)

Row (b, t) attends to the keys s < lengths[b, t] (clipped to 1..S; None: all S) and adds
`bias` to their logits: what a model's masks cannot say by a length (T5's relative
position bias, the hidden branches of a drafted tree) and nothing else. Keys past a row's
length are never read: a kernel walks a row tile's keys only up to the longest row in it.
The result is bitwise the call with no lengths and the mask in the bias
(`dense_bias`), for any row with an unmasked key: a masked key's weight is an exact zero.

A sliding window (Gemma's sliding layers, `window`) narrows each row to the keys in
[lengths[b, t] - window, lengths[b, t]), bitwise the same row with the keys before it
masked in the bias. XLA's path (`dense_bias`) and the cpu kernel implement it; the gpu
and tpu kernels take no window and refuse it (`kernels.dispatch.attention`,
`models.packing`).

An attention-logit soft-cap (Gemma 2's, `softcap` c > 0) turns each logit q . k (the
queries already scaled) into c * tanh(q . k / c) before the bias and the mask are added
(`soft_cap`; transformers' `eager_attention_forward` order). XLA's path and the cpu kernel
implement it; the gpu and tpu kernels take none and refuse it, as they refuse a window.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.errors import InputError

Array = jax.Array

MASKED = -1e10  # T5X's bias for masked attention logits


def check_attention(q: Array, k: Array, v: Array, bias: Array | None = None,
                    lengths: Array | None = None) -> tuple[int, int, int, int, int, int]:
  """(B, T, H, D, S, Hkv) of q [B, T, H, D], grouped k/v [B, Hkv, S, D] (query head h
  reads K/V head h // (H / Hkv); Hkv = H without grouping), bias None | [B|1, H|1, T|1, S],
  lengths None | [B, T] integer; a `ValueError` naming the operand whose shape does not
  fit."""
  if q.ndim != 4 or k.ndim != 4:
    raise ValueError(f"attention: q {list(q.shape)} and k {list(k.shape)} must be 4-D "
                     f"([B, T, H, D] and [B, Hkv, S, D])")
  b, t, h, d = q.shape
  hkv, s = k.shape[1], k.shape[2]
  if k.shape != (b, hkv, s, d) or v.shape != k.shape or hkv < 1 or h % hkv:
    raise ValueError(f"attention: k {list(k.shape)} / v {list(v.shape)} are not [B, Hkv, S, D] "
                     f"= [{b}, Hkv, S, {d}] of q {list(q.shape)} (Hkv dividing H = {h})")
  if bias is not None and (bias.ndim != 4 or bias.shape[3] != s or any(
      n not in (1, full) for n, full in zip(bias.shape[:3], (b, h, t), strict=True))):
    raise ValueError(f"attention: bias {list(bias.shape)} is not [B|1, H|1, T|1, S] = "
                     f"[{b}|1, {h}|1, {t}|1, {s}]")
  if lengths is not None and (lengths.shape != (b, t)
                              or not jnp.issubdtype(lengths.dtype, jnp.integer)):
    raise ValueError(f"attention: lengths {list(lengths.shape)} {lengths.dtype} are not "
                     f"[B, T] = [{b}, {t}] integers")
  return b, t, h, d, s, hkv


def check_softcap(softcap: float | None) -> None:
  """An `InputError` unless `softcap` is None or a positive number."""
  if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                              or not softcap > 0):
    raise InputError(f"attention: softcap must be a positive number or None, got {softcap!r}")


def soft_cap(logits: Array, softcap: float | None) -> Array:
  """Attention logits [..., S] (scaled, before the bias and the mask) -> softcap *
  tanh(logits / softcap), Gemma 2's soft-capping; `logits` as they are for None."""
  if softcap is None:
    return logits
  return jnp.tanh(logits / softcap) * softcap


def additive(mask: Array, bias: Array | None = None) -> Array:
  """bool mask (True: attend) -> float32 0 / MASKED (+ `bias`), broadcast together."""
  out = jnp.where(mask, 0.0, MASKED).astype(jnp.float32)
  return out if bias is None else out + bias.astype(jnp.float32)


def row_lengths(lengths: Array | None, b: int, t: int, s: int) -> Array:
  """[B, T] int32 keys each row reads: `lengths` clipped to 1..S (None: S)."""
  if lengths is None:
    return jnp.full((b, t), s, jnp.int32)
  return jnp.clip(lengths.astype(jnp.int32), 1, s)


def dense_bias(bias: Array | None, lengths: Array | None, b: int, t: int,
               s: int, window: int | None = None) -> Array:
  """The same attention as one additive bias [B|1, H|1, T, S] float32: `bias` (0 when
  None) where s < the row's length (and, with a `window`, s >= length - window), MASKED
  + `bias` elsewhere. XLA's path, and the kernels' reference in the tests."""
  if lengths is None and window is None:
    return jnp.zeros((1, 1, 1, s), jnp.float32) if bias is None else bias.astype(jnp.float32)
  length = row_lengths(lengths, b, t, s)[:, :, None]
  keys = jnp.arange(s, dtype=jnp.int32)
  keep = keys < length
  if window is not None:
    keep = keep & (keys >= length - window)
  return additive(keep[:, None], bias)


def _padded_rows(lengths: Array, rows: int) -> Array:
  """[B, T] row lengths -> [B, Tp], Tp = T rounded up to `rows`: the rows padding the
  last tile read one key."""
  t = lengths.shape[1]
  return jnp.pad(lengths, ((0, 0), (0, -(-t // rows) * rows - t)), constant_values=1)


def tile_chunks(lengths: Array, rows: int, chunk: int, s: int) -> Array:
  """[B, T] row lengths (`row_lengths`) -> [B, ceil(T / rows)] int32: the key chunks of
  `chunk` keys a tile of `rows` query rows walks (its longest row's, at least 1). Rows
  padding the last tile read one chunk."""
  padded = _padded_rows(lengths, rows)
  longest = padded.reshape(padded.shape[0], -1, rows).max(axis=2)
  return jnp.clip(-(-longest // chunk), 1, -(-s // chunk)).astype(jnp.int32)


def tiled_lengths(lengths: Array | None, b: int, t: int, s: int, rows: int,
                  chunk: int) -> tuple[Array, Array]:
  """A Pallas kernel's lengths, its query rows in tiles of `rows`, its keys in chunks of
  `chunk`: (each row's keys [B, Tp] int32, `row_lengths` with the rows padding T read
  one key; the chunks each tile walks [B, Tp / rows], `tile_chunks`)."""
  lens = row_lengths(lengths, b, t, s)
  return _padded_rows(lens, rows), tile_chunks(lens, rows, chunk, s)
