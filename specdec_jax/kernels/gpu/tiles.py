"""Tile configurations of the gpu kernels, keyed by weight shape: a table and a default rule.

    t = tiles.dot_tiles(k, n, dtype)     # Tiles of a [k, n] product: the table's, else `default`
    tiles.candidates(k, n, dtype)        # the configurations scripts/gpu_check.py sweeps
    tiles.chunk(d, dtype)                # attention: keys per chunk for head size d

A `Tiles` fixes everything about how the decode matmul walks one weight matrix: column tile
`tn`, reduction step `tk`, copy `stages` in flight, and `k_splits`, the number of equal
parts K is cut into (each part a block of its own, the parts' float32 partial sums added
in their fixed order after the kernel: more blocks for a small N). All of it is a function
of the weight's shape and dtype alone, never of M (batch x width): a row is computed by the
same operations in the same order in a call of 1 row or of 512.

The table is package data, `specdec_jax/kernels/gpu_tiles.json`, written by the device
check (`scripts/gpu_check.py --record`: per weight shape, the fastest candidate whose rows
were invariant on the device):

    {"format": 1, "about": "...",
     "dot": {"4096x10240:bfloat16": {"tn": 128, "tk": 128, "stages": 4, "k_splits": 2,
                                     "device": "NVIDIA H200", "date": "...", "us": 31.0}},
     "attention": {"64:bfloat16": {"chunk": 64}}}

Shapes not in the table take `default` (a rule on K, N and the parts). A packing is made
for its tiles (K and N padded to them, `padded`), so a table changed after packing is
caught by `matmul.check_packed`, never silently misread.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
from typing import Any, Iterator

import jax.numpy as jnp

from specdec_jax import package_data

FILE = ("kernels", "gpu_tiles.json")
TM = 64                 # rows per tile: a WGMMA's M (fixed: not a table entry)
SMEM_BYTES = 216 * 1024  # a block's copy buffers and output tile (Hopper: 227 KB a block)
TARGET_BLOCKS = 128     # blocks `default` aims for: about one per SM (H100 SXM 132, PCIe 114)
TNS = (64, 128, 256)    # column tiles: a WGMMA's N, at most 256
TKS = (64, 128)         # reduction steps: 128 or 256 bytes of bfloat16 per row
STAGES = (2, 4)         # copies in flight the sweep tries (`default` may take 3)
CHUNKS = (64, 128)      # attention keys per chunk


@dataclasses.dataclass(frozen=True)
class Tiles:
  """How the decode matmul walks a [K, N] weight (module docstring).

  tn: columns per block (a multiple of 64, at most 256); tk: K per step (64 or 128);
  stages: weight (and row) tiles copied ahead, >= 1 (1: each copy waited for before its
  WGMMA); k_splits: equal parts of K, each a block whose partial sum is added after the
  kernel, in order (1: none).
  """

  tn: int = 64
  tk: int = 64
  stages: int = 2
  k_splits: int = 1

  def __post_init__(self):
    if self.tn % 64 or not 64 <= self.tn <= 256 or self.tk not in TKS:
      raise ValueError(f"tiles need tn in 64..256 (multiple of 64) and tk in {TKS}: {self}")
    if self.stages < 1 or self.k_splits < 1:
      raise ValueError(f"tiles need stages >= 1 and k_splits >= 1: {self}")

  def padded(self, k: int, n: int) -> tuple[int, int]:
    """(Kp, Np): K rounded up to k_splits x tk, N to tn (the packing's shape)."""
    return _ceil(max(k, 1), self.tk * self.k_splits), _ceil(max(n, 1), self.tn)

  def steps(self, k: int) -> int:
    """K steps of each split."""
    return self.padded(k, 1)[0] // (self.tk * self.k_splits)

  def smem_bytes(self, parts: int) -> int:
    """A block's SMEM: `stages` x parts x (row tile + weight tile) bfloat16, and the
    float32 output tile."""
    return self.stages * parts * (TM * self.tk + self.tk * self.tn) * 2 + TM * self.tn * 4

  def as_json(self) -> dict[str, int]:
    return dataclasses.asdict(self)


def _ceil(a: int, b: int) -> int:
  return -(-a // b) * b


def _parts(dtype) -> int:
  """bfloat16 weights pack to one bfloat16 part, float32 to two (hi/lo: `matmul`)."""
  dtype = jnp.dtype(dtype)
  if dtype not in (jnp.float32, jnp.bfloat16):
    raise TypeError(f"GPU products take float32 or bfloat16 weights, not {dtype}")
  return 1 if dtype == jnp.bfloat16 else 2


def key(k: int, n: int, dtype) -> str:
  """The table's key of a [k, n] weight: "KxN:dtype"."""
  return f"{k}x{n}:{jnp.dtype(dtype).name}"


def splits_for(k: int, n: int, tn: int, tk: int) -> int:
  """The K split `default` takes for tiles (tn, tk): the fewest powers of two that give
  about TARGET_BLOCKS blocks, each split at least 2 steps (a pipeline to overlap), at most
  16, and no more zero padding of K than one step per split."""
  n_tiles, k_steps = -(-max(n, 1) // tn), -(-max(k, 1) // tk)
  splits = 1
  while (n_tiles * splits < TARGET_BLOCKS and splits < 16 and k_steps >= 4 * splits
         and _ceil(k_steps, 2 * splits) - k_steps < 2 * splits):
    splits *= 2
  return splits


def _fit(tn: int, tk: int, stages: int, k: int, n: int, parts: int) -> Tiles:
  """Tiles (tn, tk, splits_for, stages) with stages cut to the steps and to SMEM_BYTES."""
  splits = splits_for(k, n, tn, tk)
  t = Tiles(tn, tk, max(1, min(stages, Tiles(tn, tk, 1, splits).steps(k))), splits)
  while t.stages > 1 and t.smem_bytes(parts) > SMEM_BYTES:
    t = dataclasses.replace(t, stages=t.stages - 1)
  return t


def default(k: int, n: int, dtype) -> Tiles:
  """The rule for shapes not in the table: tk 128 from K >= 512 (fewer, larger copies),
  tn 128 from N >= 2048, 64 below (more blocks for a small N), a K split for about
  TARGET_BLOCKS blocks (`splits_for`) and 3 stages where SMEM has room. Small shapes (the
  tests') get 64 x 64 tiles; where SMEM holds fewer than 2 stages (float32 at tk 128),
  tk 64."""
  parts = _parts(dtype)
  tn = 128 if n >= 2048 else 64
  t = _fit(tn, 128 if k >= 512 else 64, 3, k, n, parts)
  if t.stages < 2 <= t.steps(k):      # float32's two parts: halve the step to pipeline
    t = _fit(tn, 64, 3, k, n, parts)
  return t


def candidates(k: int, n: int, dtype) -> list[Tiles]:
  """The configurations the device check times for a [k, n] weight, most promising first:
  `default`, then each (tk, tn, stages) of TKS x TNS x STAGES (larger tiles first) with its
  `splits_for` split, then the same without a split; only pipelined ones (stages >= 2
  where a split has 2 steps or more) that fit SMEM, without repeats."""
  parts = _parts(dtype)
  split, whole = [], []
  for tk in reversed(TKS):
    for tn in reversed(TNS):
      if tn > 64 and _ceil(n, tn) - n >= tn // 2:      # mostly padding: not worth timing
        continue
      for stages in reversed(STAGES):
        fitted = _fit(tn, tk, stages, k, n, parts)
        split.append(fitted)
        whole.append(_fit(tn, tk, stages, k, 1 << 30, parts))   # N so large: no split
  out = [default(k, n, dtype)]
  for t in split + whole:
    pipelined = t.stages >= 2 or t.steps(k) < 2
    if pipelined and t.smem_bytes(parts) <= SMEM_BYTES and t not in out:
      out.append(t)
  return out


@functools.cache
def shipped() -> dict[str, Any]:
  """The package's table, kernels/gpu_tiles.json (read once per process)."""
  path = package_data.package_root().joinpath(*FILE)
  return json.loads(path.read_text(encoding="utf-8"))


# The table `using` puts in force (None: the shipped one). Read when a kernel is traced.
_IN_FORCE: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "gpu_tiles", default=None)


def table() -> dict[str, Any]:
  """The tile table in force: `using`'s inside its block, else the shipped one."""
  found = _IN_FORCE.get()
  return shipped() if found is None else found


@contextlib.contextmanager
def using(tiles_table: dict[str, Any]) -> Iterator[dict[str, Any]]:
  """Within the block, kernels traced there take their tiles from `tiles_table` (e.g. the
  device check's sweep, before it is written to the package):

      with tiles.using(tiles.with_entries(tiles.table(), dot={"4096x4096:bfloat16": {...}})):
        y = jax.jit(lambda x: gpu.dot(x, gpu.pack(w, jnp.bfloat16), n))(x)

  A program traced (and cached by jit) inside keeps those tiles after the block."""
  token = _IN_FORCE.set(tiles_table)
  try:
    yield tiles_table
  finally:
    _IN_FORCE.reset(token)


def dot_tiles(k: int, n: int, dtype) -> Tiles:
  """The tiles of a [k, n] weight of `dtype` (its compute dtype): the table's entry, else
  `default`."""
  found = table().get("dot", {}).get(key(k, n, dtype))
  if found is None:
    return default(k, n, dtype)
  return Tiles(**{f.name: int(found[f.name]) for f in dataclasses.fields(Tiles)})


def chunk(d: int, dtype) -> int:
  """Attention's keys per chunk for head size `d`: the table's, else 64. A fixed SIZE,
  whatever the cache length and the call's width."""
  found = table().get("attention", {}).get(f"{d}:{jnp.dtype(dtype).name}")
  return int(found["chunk"]) if found else 64


def with_entries(base: dict[str, Any], dot: dict[str, dict[str, Any]] | None = None,
                 attention: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
  """`base` (a table) with `dot` / `attention` entries added or replaced (a new dict; the
  device check writes it back to gpu_tiles.json)."""
  return {**base, "dot": {**base.get("dot", {}), **(dot or {})},
          "attention": {**base.get("attention", {}), **(attention or {})}}
