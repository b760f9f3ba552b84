"""Rows of token ids to batches: padded rows, fixed-size batches, cycled rows.

    batches = padded_batches(inputs, 8)     # [Batch(tokens [8, L], real 8), ..., Batch(.., real 3)]
    outputs = [decode(b.tokens) for b in batches]
    stats.merge_outputs(outputs, [b.real for b in batches])   # padding rows dropped

Every batch has `batch_size` rows, so one compiled decode serves a whole corpus: the
last one is filled with copies of its final row (a real prompt, so the decoder's input
checks pass and the real rows' greedy outputs are unchanged), and `real` counts the rows
that are not padding.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
import numpy as np

from specdec_jax.errors import InputError, PromptError


class Batch(NamedTuple):
  """tokens: int32 [batch_size, L]; real: its first `real` rows are inputs, the rest padding."""

  tokens: np.ndarray
  real: int


def padded_batches(inputs: np.ndarray, batch_size: int) -> list[Batch]:
  """`inputs` [N, L] in batches of `batch_size` rows, the last padded by repeating its final row.

  >>> [(b.tokens[:, 0].tolist(), b.real) for b in padded_batches(np.arange(5)[:, None], 2)]
  [([0, 1], 2), ([2, 3], 2), ([4, 4], 1)]
  """
  inputs = np.asarray(inputs)
  out = []
  for i in range(0, len(inputs), batch_size):
    chunk = inputs[i:i + batch_size]
    real = len(chunk)
    if real < batch_size:
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real, 0)])
    out.append(Batch(chunk, real))
  return out


def cycled_rows(rows: np.ndarray, batch: int) -> np.ndarray:
  """The first `batch` rows of `rows` [N, L], cycling when N < batch (same rows for every B)."""
  rows = np.asarray(rows)
  return rows[np.arange(batch) % len(rows)]


def pad_rows(rows: Sequence[Sequence[int] | np.ndarray] | np.ndarray,
             length: int | None = None) -> np.ndarray:
  """Rows of ids -> int32 [N, length] right-padded with 0 and cut at `length`
  (default: the longest row, at least 1)."""
  if length is None:
    length = max([len(r) for r in rows] + [1])
  out = np.zeros((len(rows), length), np.int32)
  for i, row in enumerate(rows):
    r = np.asarray(row)[:length]
    out[i, :len(r)] = r
  return out


def bucket_width(used: int, limit: int) -> int:
  """The width of a batch whose prompts use `used` columns: the next power of two from 8,
  at most `limit` (the whole input's width) and at least `used`. A corpus in small batches
  then compiles its decode for a few widths, not one per prompt length; the extra pad
  columns are masked (the outputs stay the same, bitwise).

  >>> [bucket_width(n, 40) for n in (1, 8, 9, 13, 17, 33, 40)]
  [8, 8, 16, 16, 32, 40, 40]
  """
  return max(used, min(limit, max(8, 1 << max(used - 1, 0).bit_length())))


def prompt_batches(tokens: np.ndarray, lengths: np.ndarray | None, batch_size: int,
                   split: Callable[[np.ndarray, int], list[Batch]] = padded_batches
                   ) -> tuple[list[Batch], list[np.ndarray] | None]:
  """Prompts [N, P] in batches of `batch_size` rows (`split`: `padded_batches`, or one
  process's block of them), each cut to its longest prompt's `bucket_width`: a T5's
  0-padded rows by their last nonzero column (`trim_padding`), a decoder-only model's by
  its prompt `lengths` [N]; (the batches, for an LM their int32 [batch_size] lengths)."""
  blocks = split(tokens, batch_size)
  if lengths is None:
    return [Batch(trim_padding(b.tokens), b.real) for b in blocks], None
  sizes = [np.asarray(b.tokens[:, 0], np.int32)
           for b in split(np.asarray(lengths)[:, None], batch_size)]
  width = lambda n: bucket_width(int(n.max()), tokens.shape[1])
  return [Batch(b.tokens[:, :width(n)], b.real) for b, n in zip(blocks, sizes, strict=True)], sizes


def rows_without_eos(tokens: np.ndarray, eos_id: int, pad_id: int = 0) -> list[int]:
  """Indices of the rows of T5 encoder inputs [N, L] whose last non-pad token is not EOS."""
  tokens = np.asarray(tokens)
  real = tokens != pad_id
  last = np.where(real.any(axis=1), tokens.shape[1] - 1 - np.argmax(real[:, ::-1], axis=1), 0)
  ends = tokens[np.arange(len(tokens)), last]
  return np.flatnonzero(real.any(axis=1) & (ends != eos_id)).tolist()


def trim_padding(tokens: np.ndarray) -> np.ndarray:
  """Drop all-pad (0) trailing columns down to a `bucket_width`: a batch of short prompts
  need not pay for a long one, and batches of similar lengths share one compiled shape."""
  used = np.flatnonzero(np.any(np.asarray(tokens) != 0, axis=0))
  return tokens[:, :bucket_width(int(used[-1]) + 1 if used.size else 1, tokens.shape[1])]


def prompt_lengths(tokens, pad_id: int) -> np.ndarray:
  """Per-row lengths of right-padded prompts [B, P]: one past the last id != `pad_id`.

  A row that is all `pad_id` is an error (a prompt needs at least one token). Pass the
  lengths explicitly when a prompt may end in the pad id (GPT-2 pads with its EOS).
  """
  if isinstance(tokens, jax.core.Tracer):
    raise InputError("prompt lengths cannot be computed from traced tokens (inside jit): "
                     "pass lengths=")
  arr = np.asarray(tokens)
  real = arr != pad_id
  lengths = np.where(real.any(axis=1), arr.shape[1] - np.argmax(real[:, ::-1], axis=1), 0)
  if np.any(lengths < 1):
    rows = np.flatnonzero(lengths < 1).tolist()
    raise InputError(f"prompt rows {rows[:8]} hold only the pad id {pad_id}: a prompt needs at "
                     "least one token (or pass lengths=)")
  return lengths.astype(np.int32)


def pad_to_bucket(tokens, pad_id: int = 0) -> np.ndarray:
  """`tokens` int [B, L] right-padded (or trimmed of all-pad columns) to the bucket width
  of the columns they use: the next power of two from 8. A script decoding many batches
  then compiles `sd.decode` once per bucket, not once per longest prompt (a new width is a
  new program: seconds each). The extra columns are pad, masked: outputs are bitwise the
  same. `pad_id`: the model's pad id (T5: 0; a decoder-only model's `config.pad_id`).

  >>> pad_to_bucket(np.array([[5, 6, 1], [7, 1, 0]])).shape
  (2, 8)
  >>> pad_to_bucket(np.ones((1, 9), np.int32)).shape
  (1, 16)
  """
  arr = np.asarray(tokens)
  if arr.ndim != 2 or arr.dtype.kind not in "iu":
    raise InputError(f"pad_to_bucket takes int token ids [B, L], got {arr.dtype} "
                     f"{tuple(arr.shape)}")
  used = np.flatnonzero(np.any(arr != pad_id, axis=0))
  n = int(used[-1]) + 1 if used.size else 1
  width = max(8, 1 << (n - 1).bit_length())
  out = np.full((arr.shape[0], width), pad_id, arr.dtype)
  out[:, :min(width, arr.shape[1])] = arr[:, :width]
  return out


def random_prompts(batch: int, length: int, vocab_size: int, seed: int = 0) -> np.ndarray:
  """int32 [batch, length]: uniform ids in [3, vocab) (no pad/EOS/unk), last token EOS (1)."""
  if length < 1:
    raise PromptError(f"prompt length must be >= 1, got {length}")
  if vocab_size < 4:
    raise PromptError(f"vocab_size {vocab_size} too small for random prompts")
  rng = np.random.RandomState(seed)
  tokens = rng.randint(3, vocab_size, size=(batch, length)).astype(np.int32)
  tokens[:, -1] = 1
  return tokens
