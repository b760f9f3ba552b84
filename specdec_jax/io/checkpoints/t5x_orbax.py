"""T5X Orbax checkpoints: ``checkpoint_<step>/state/`` (``_METADATA``, ``manifest.ocdbt``, ``d/``).

Read with orbax-checkpoint's PyTree handler, restoring only the ``target`` subtree (the params)
as numpy arrays on the host; ``state`` (step, optimizer) is not read.
"""

from __future__ import annotations

import os

import numpy as np

from specdec_jax.io.checkpoints import resolve, tree
from specdec_jax.io.checkpoints.errors import CheckpointError


def state_dir(checkpoint_dir: str) -> str:
  """``checkpoint_<step>/state`` for a step dir; the dir itself when it is the state dir."""
  if resolve.has_file(checkpoint_dir, "_METADATA"):
    return checkpoint_dir
  return resolve.join(checkpoint_dir, "state")


def load_params(checkpoint_dir: str) -> dict[str, np.ndarray]:
  """Flat {"encoder/layers_0/...": array} of the params in an Orbax step (or state) dir."""
  import jax
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
    item = {"target": metadata["target"]}
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    try:
      restored = handler.restore(path, args=ocp.args.PyTreeRestore(
          item=item, restore_args=restore_args, partial_restore=True))
    except Exception as e:
      raise CheckpointError(
          f"{directory}: cannot read Orbax params: {type(e).__name__}: {e}") from e
  finally:
    handler.close()
  return {k: np.asarray(v) for k, v in tree.flatten(restored["target"]).items()}
