"""T5X Orbax checkpoints: ``checkpoint_<step>/state/`` (``_METADATA``, ``manifest.ocdbt``, ``d/``).

Read with orbax-checkpoint's PyTree handler, restoring only the ``target`` subtree (the params)
as numpy arrays on the host; ``state`` (step, optimizer) is not read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from specdec_jax.io.checkpoints import resolve, tree
from specdec_jax.io.checkpoints.errors import CheckpointError


def state_dir(checkpoint_dir: str) -> str:
  """``checkpoint_<step>/state`` for a step dir; the dir itself when it is the state dir."""
  if resolve.has_file(checkpoint_dir, "_METADATA"):
    return checkpoint_dir
  return resolve.join(checkpoint_dir, "state")


def _restore(checkpoint_dir: str, make_args: Any) -> Any:
  """The params subtree of an Orbax step (or state) dir, restored leaf by leaf with the
  restore args `make_args(metadata tree)` gives; with `make_args=None`, the metadata tree."""
  import orbax.checkpoint as ocp  # imported lazily: slow to import
  from etils import epath

  directory = state_dir(checkpoint_dir)
  if not resolve.is_gcs(directory):
    directory = os.path.abspath(directory)  # orbax requires absolute paths
  path = epath.Path(directory)
  handler = ocp.PyTreeCheckpointHandler()
  try:
    try:
      metadata = handler.metadata(path).tree
    except Exception as e:
      raise CheckpointError(f"{directory}/_METADATA: cannot read Orbax metadata: {e}") from e
    if not isinstance(metadata, dict) or "target" not in metadata:
      keys = sorted(metadata) if isinstance(metadata, dict) else type(metadata).__name__
      raise CheckpointError(f"{directory}: Orbax checkpoint has no 'target' (params) subtree; "
                            f"top-level keys: {keys}")
    if make_args is None:
      return metadata["target"]
    item = {"target": metadata["target"]}
    restore_args = {"target": make_args(metadata["target"])}
    try:
      restored = handler.restore(path, args=ocp.args.PyTreeRestore(
          item=item, restore_args=restore_args, partial_restore=True))
    except CheckpointError:
      raise
    except Exception as e:
      raise CheckpointError(
          f"{directory}: cannot read Orbax params: {type(e).__name__}: {e}") from e
  finally:
    handler.close()
  return restored["target"]


def load_params(checkpoint_dir: str) -> dict[str, np.ndarray]:
  """Flat {"encoder/layers_0/...": array} of the params in an Orbax step (or state) dir."""
  import jax
  import orbax.checkpoint as ocp

  def host(target):
    return jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)

  return {k: np.asarray(v) for k, v in tree.flatten(_restore(checkpoint_dir, host)).items()}


def param_shapes(checkpoint_dir: str) -> dict[str, Any]:
  """Flat {key: jax.ShapeDtypeStruct} of the stored params (Orbax metadata; nothing read)."""
  import jax
  flat = tree.flatten(_restore(checkpoint_dir, None))
  return {k: jax.ShapeDtypeStruct(tuple(m.shape), np.dtype(m.dtype)) for k, m in flat.items()}


def load_sharded(checkpoint_dir: str, shardings: Mapping[str, Any],
                 dtype: Any = None) -> dict[str, Any]:
  """Flat params restored straight into `shardings` (flat key -> `jax.sharding.Sharding`):
  Orbax reads each device's index range of each array (`ArrayRestoreArgs`), cast to
  `dtype` when given (floating params; None keeps the stored dtype)."""
  import jax.numpy as jnp
  import orbax.checkpoint as ocp

  def args(target):
    flat = tree.flatten(target)
    missing = sorted(set(shardings) - set(flat))
    if missing:
      raise CheckpointError(f"{checkpoint_dir}: Orbax params lack {missing[:5]}")

    def one(key, meta):
      cast = dtype is not None and jnp.issubdtype(np.dtype(meta.dtype), jnp.floating)
      return ocp.ArrayRestoreArgs(sharding=shardings[key], global_shape=tuple(meta.shape),
                                  dtype=jnp.dtype(dtype) if cast else None)
    return tree.unflatten({k: one(k, m) for k, m in flat.items()})

  return tree.flatten(_restore(checkpoint_dir, args))
