"""Files shipped inside the package: named model configs and the bundled demo pair.

Both are package data, found with ``importlib.resources`` so that a wheel install has them
as an editable one does::

    specdec_jax/configs/models/<name>.json       named T5 configs (sd.get_config(name))
    specdec_jax/assets/<group>/<name>/           bundled checkpoints ("demo-de-en/target")
    specdec_jax/assets/<group>/spiece.model      bundled tokenizers ("demo-de-en")

The repository's top-level ``configs/models`` is a symlink to the package's directory.
"""

from __future__ import annotations

import importlib.resources
import pathlib
from importlib.resources.abc import Traversable

PACKAGE = "specdec_jax"


def package_root() -> Traversable:
  """The installed ``specdec_jax`` package (a ``pathlib.Path`` unless imported from a zip)."""
  return importlib.resources.files(PACKAGE)


def model_configs() -> Traversable:
  """``specdec_jax/configs/models/``: one ``<name>.json`` per named config."""
  return package_root() / "configs" / "models"


def assets() -> Traversable:
  """``specdec_jax/assets/``: bundled checkpoints and tokenizers."""
  return package_root() / "assets"


def assets_path() -> pathlib.Path | None:
  """``assets()`` as a directory on disk, or None when the package is not stored as files.

  Checkpoints are read by path (through tensorstore's file driver), so bundled checkpoints
  need the package installed as files, as pip installs a wheel.
  """
  root = assets()
  return root if isinstance(root, pathlib.Path) else None
