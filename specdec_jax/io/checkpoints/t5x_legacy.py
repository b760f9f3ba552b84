"""T5X legacy checkpoints: ``checkpoint_<step>/checkpoint`` (flax msgpack) + zarr arrays.

The msgpack file holds ``{"version", "optimizer": {"target": params, "state": ...}}``. Small
arrays are inline (flax's ndarray ext type); large ones are tensorstore spec dicts
``{"driver": "zarr", "kvstore": {"driver": "file"|"gcs", "path": "target.a.b/"}, ...}`` whose path
is relative to the step dir. As in T5X, the kvstore actually used depends on where the
checkpoint is now (local dir -> file, gs://bucket/... -> gcs), not on where it was written.
Only arrays under ``target`` are read; optimizer state is skipped.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorstore as ts
from flax import serialization

from specdec_jax.io.checkpoints import leaves, resolve, tree
from specdec_jax.io.checkpoints.errors import CheckpointError

MSGPACK_NAME = "checkpoint"


def is_tensorstore_spec(value: Any) -> bool:
  """A leaf of the msgpack tree that points at an array stored outside it."""
  return isinstance(value, Mapping) and "driver" in value and ("kvstore" in value
                                                               or "path" in value)


def decode_msgpack(raw: bytes, source: str) -> dict[str, Any]:
  """Flax msgpack bytes -> nested dict (ndarray ext types decoded; nothing is unpickled)."""
  try:
    state = serialization.msgpack_restore(raw)
  except Exception as e:  # msgpack raises several unrelated types for corrupt input
    raise CheckpointError(f"{source}: corrupt or truncated msgpack: {type(e).__name__}: {e}") from e
  if not isinstance(state, dict):
    raise CheckpointError(f"{source}: expected a msgpack map, got {type(state).__name__}")
  return state


def params_target(state: Mapping[str, Any], source: str) -> Mapping[str, Any]:
  """The params subtree ``optimizer.target`` of a decoded T5X checkpoint."""
  optimizer = state.get("optimizer")
  if not isinstance(optimizer, Mapping) or not isinstance(optimizer.get("target"), Mapping):
    raise CheckpointError(
        f"{source}: not a T5X checkpoint: expected {{'optimizer': {{'target': params}}}}, "
        f"top-level keys are {sorted(state)}")
  return optimizer["target"]


def _relative_path(spec: Mapping[str, Any], key: str, source: str) -> str:
  kvstore = spec.get("kvstore")
  path = kvstore.get("path") if isinstance(kvstore, Mapping) else None
  path = path if path is not None else spec.get("path")  # tensorstore<0.1.14 layout
  if not isinstance(path, str) or not path:
    raise CheckpointError(f"{source}: tensorstore spec of {key} has no path: {dict(spec)}")
  parts = posixpath.normpath(path).split("/")
  if path.startswith("/") or "://" in path or ".." in parts:
    raise CheckpointError(
        f"{source}: tensorstore spec of {key} must use a path relative to the step dir, "
        f"got {path!r}")
  return path if path.endswith("/") else path + "/"


def zarr_spec(spec: Mapping[str, Any], step_dir: str, key: str = "?") -> dict[str, Any]:
  """The tensorstore spec that opens one stored array of the checkpoint in ``step_dir``.

  Keeps only the relative array path of the stored spec; the kvstore comes from
  ``resolve.kvstore_spec(step_dir, path)`` (file or gcs). Missing chunks are errors,
  never silently filled.
  """
  source = resolve.join(step_dir, MSGPACK_NAME)
  if spec.get("driver") != "zarr":
    raise CheckpointError(f"{source}: array {key} uses unsupported tensorstore driver "
                          f"{spec.get('driver')!r} (T5X writes 'zarr')")
  return {"driver": "zarr",
          "kvstore": resolve.kvstore_spec(step_dir, _relative_path(spec, key, source)),
          "fill_missing_data_reads": False}


def _result(future: Any, key: str, spec: Mapping[str, Any], what: str) -> Any:
  try:
    return future.result()
  except Exception as e:
    raise CheckpointError(
        f"cannot {what} array {key} (zarr at {spec['kvstore']['path']}): {e}") from e


def read_zarr_arrays(specs: Mapping[str, dict]) -> dict[str, np.ndarray]:
  """Read every spec concurrently -> {key: numpy array in its stored dtype}."""
  opened = {k: ts.open(spec, read=True) for k, spec in specs.items()}
  stores = {k: _result(f, k, specs[k], "open") for k, f in opened.items()}
  reads = {k: store.read() for k, store in stores.items()}
  return {k: np.asarray(_result(f, k, specs[k], "read")) for k, f in reads.items()}


def _split_target(step_dir: str) -> tuple[dict[str, dict], dict[str, np.ndarray]]:
  """(zarr specs, inline arrays) of the params in a legacy step dir, by flat key."""
  source = resolve.join(step_dir, MSGPACK_NAME)
  raw = resolve.read_bytes(step_dir, MSGPACK_NAME)
  if raw is None:
    raise CheckpointError(f"{source}: file not found")
  target = params_target(decode_msgpack(raw, source), source)
  flat = tree.flatten(target, is_leaf=is_tensorstore_spec)
  specs = {k: zarr_spec(v, step_dir, k) for k, v in flat.items() if is_tensorstore_spec(v)}
  inline = {k: v for k, v in flat.items() if k not in specs}
  bad = [k for k, v in inline.items() if not isinstance(v, (np.ndarray, np.generic))]
  if bad:
    raise CheckpointError(f"{source}: params {bad[:5]} are neither arrays nor tensorstore specs")
  return specs, {k: np.asarray(v) for k, v in inline.items()}


def load_params(step_dir: str) -> dict[str, np.ndarray]:
  """Flat {"encoder/layers_0/...": array} of the params in a legacy step dir."""
  specs, arrays = _split_target(step_dir)
  arrays.update(read_zarr_arrays(specs))
  return arrays


def open_leaves(step_dir: str) -> dict[str, leaves.Leaf]:
  """Flat leaves of the params in a legacy step dir: each zarr array opened (metadata
  only) and read by index ranges through tensorstore, which fetches only the chunks a
  block overlaps; inline arrays are in the msgpack file already."""
  specs, arrays = _split_target(step_dir)
  opened = {k: ts.open(spec, read=True) for k, spec in specs.items()}
  stores = {k: _result(f, k, specs[k], "open") for k, f in opened.items()}

  def reader(key: str, store: Any):
    def read(index: leaves.Index) -> np.ndarray:
      return np.asarray(_result(store[index].read(), key, specs[key], "read"))
    return read

  out = {k: leaves.of_array(v) for k, v in arrays.items()}
  out.update({k: leaves.Leaf(tuple(store.shape), np.dtype(store.dtype.numpy_dtype),
                             reader(k, store)) for k, store in stores.items()})
  return out
