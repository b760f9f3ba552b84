"""Parameters read leaf by leaf, block by block: the shared piece of loading into shards.

A `Leaf` is one stored parameter not read yet: its shape, its stored dtype and
`read(index)`, which returns the block at `index` (one `slice` per dimension) as a
numpy array. Each format opens its leaves (safetensors slices, zarr through tensorstore,
arrays inline in a msgpack file); `to_device` places one leaf with a `Sharding`:
`jax.make_array_from_callback` asks for each device's block, and only those blocks are
read. The host holds the distinct blocks of one leaf at a time (at most the leaf), never
the tree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.io.checkpoints.errors import CheckpointError

Index = tuple[slice, ...]


@dataclasses.dataclass(frozen=True)
class Leaf:
  """One stored parameter: `read(index)` -> its block at `index` [per-dimension slices]."""
  shape: tuple[int, ...]
  dtype: np.dtype
  read: Callable[[Index], np.ndarray]

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def of_array(array: np.ndarray) -> Leaf:
  """A leaf over an array already in memory (small arrays stored inline)."""
  array = np.asarray(array)
  return Leaf(tuple(array.shape), array.dtype, lambda index: array[index])


def transposed(leaf: Leaf, scale: float | None = None) -> Leaf:
  """`leaf`.T as a leaf (a Hugging Face [out, in] weight read as a T5X [in, out] kernel),
  times `scale` in float32 when given, rounded back to the stored dtype."""
  def read(index: Index) -> np.ndarray:
    block = leaf.read(index[::-1]).T
    if scale is not None:
      block = (block.astype(np.float32) * np.float32(scale)).astype(leaf.dtype)
    return np.ascontiguousarray(block)
  return Leaf(leaf.shape[::-1], leaf.dtype, read)


def full_index(shape: tuple[int, ...]) -> Index:
  return tuple(slice(0, n) for n in shape)


def normalize(index: Any, shape: tuple[int, ...]) -> Index:
  """A device's index (slices, possibly `slice(None)`) as explicit [start, stop) slices."""
  index = tuple(index) + (slice(None),) * (len(shape) - len(tuple(index)))
  out = []
  for s, n in zip(index, shape, strict=True):
    start, stop, step = s.indices(n)
    if step != 1:
      raise ValueError(f"a shard index has step {step}, expected 1")
    out.append(slice(start, stop))
  return tuple(out)


def read_block(leaf: Leaf, index: Index, key: str = "") -> np.ndarray:
  """`leaf`'s block at `index`: every sharded load reads through here (the tests count
  the bytes of each call)."""
  block = np.asarray(leaf.read(index))
  want = tuple(s.stop - s.start for s in index)
  if block.shape != want:
    raise CheckpointError(f"{key or 'a parameter'}: reading block {_show(index)} gave shape "
                          f"{block.shape}, expected {want} (a damaged or truncated file?)")
  return block


def read_whole(leaf: Leaf, key: str = "") -> np.ndarray:
  return read_block(leaf, full_index(leaf.shape), key)


def cast(block: np.ndarray, dtype: Any) -> np.ndarray:
  """Floating `block` in `dtype` (None: as stored), rounded to nearest even as XLA casts."""
  if dtype is None or not jnp.issubdtype(block.dtype, jnp.floating):
    return block
  return block.astype(jnp.dtype(dtype), copy=False)


def to_device(leaf: Leaf, sharding: jax.sharding.Sharding, dtype: Any = None,
              key: str = "") -> jax.Array:
  """`leaf` as a jax.Array laid out by `sharding`: each distinct device block read once,
  cast to `dtype` on the host (floating leaves; None keeps the stored dtype)."""
  blocks: dict[tuple[tuple[int, int], ...], np.ndarray] = {}

  def callback(index: Any) -> np.ndarray:
    index = normalize(index, leaf.shape)
    at = tuple((s.start, s.stop) for s in index)
    if at not in blocks:        # a block replicated over several devices is read once
      blocks[at] = cast(read_block(leaf, index, key), dtype)
    return blocks[at]

  out_dtype = leaf.dtype if dtype is None or not jnp.issubdtype(leaf.dtype, jnp.floating) \
      else jnp.dtype(dtype)
  return jax.make_array_from_callback(tuple(leaf.shape), sharding, callback, dtype=out_dtype)


def place(leaves: Mapping[str, Leaf], shardings: Mapping[str, jax.sharding.Sharding],
          dtype: Any = None) -> dict[str, jax.Array]:
  """Every leaf placed with its sharding, one leaf after another (flat "/" keys)."""
  return {key: to_device(leaves[key], shardings[key], dtype, key) for key in leaves}


def equal(a: Leaf, b: Leaf, block_bytes: int = 1 << 26) -> bool:
  """Whether two leaves hold the same values, compared about `block_bytes` at a time
  (whole rows of the first dimension)."""
  if tuple(a.shape) != tuple(b.shape) or not a.shape:
    return tuple(a.shape) == tuple(b.shape) and np.array_equal(a.read(()), b.read(()))
  row = max(1, a.nbytes // max(1, a.shape[0]))
  rows = max(1, block_bytes // row)
  rest = tuple(slice(0, n) for n in a.shape[1:])
  for start in range(0, a.shape[0], rows):
    index = (slice(start, min(start + rows, a.shape[0])),) + rest
    if not np.array_equal(a.read(index), b.read(index)):
      return False
  return True


def _show(index: Index) -> str:
  return "[" + ", ".join(f"{s.start}:{s.stop}" for s in index) + "]"
