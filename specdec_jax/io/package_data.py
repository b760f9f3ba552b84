"""Files shipped inside the package: named model configs and the bundled demo models.

Both are package data, found with ``importlib.resources`` so that a wheel install has them
as an editable one does::

    specdec_jax/configs/models/<name>.json       named T5 configs (sd.get_config(name))
    specdec_jax/assets/<group>/<name>/           bundled checkpoints ("demo-de-en/target")
    specdec_jax/assets/<group>/spiece.model      bundled tokenizers ("demo-de-en")

A group too large for the library's wheel (every wheel stays under the package index's
100 MB file limit) ships in a separate distribution built from this repository's
``packages/`` directory, with the same layout under its own import package::

    specdec_jax_demo/assets/demo-de-en-large/target     pip install specdec-jax-demo

Names resolve the same way whichever distribution holds them (``sd.load("demo-de-en-large/
target")``); a name of such a group, when its distribution is not installed, raises
`MissingAssets` with the pip command.

The repository's top-level ``configs/models`` is a symlink to the package's directory.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import pathlib
from importlib.resources.abc import Traversable

from specdec_jax.errors import CheckpointError, TokenizerError

PACKAGE = "specdec_jax"

#: Asset groups shipped in their own distribution: group -> (import package, pip name,
#: its directory in this repository).
SEPARATE = {"demo-de-en-large": ("specdec_jax_demo", "specdec-jax-demo",
                                 "packages/specdec-jax-demo")}


class MissingAssets(CheckpointError, TokenizerError):
  """A bundled name whose group ships in a distribution that is not installed."""


def package_root() -> Traversable:
  """The installed ``specdec_jax`` package (a ``pathlib.Path`` unless imported from a zip)."""
  return importlib.resources.files(PACKAGE)


def model_configs() -> Traversable:
  """``specdec_jax/configs/models/``: one ``<name>.json`` per named config."""
  return package_root() / "configs" / "models"


def group_of(name: str | None) -> str | None:
  """"demo-de-en-large" of "demo-de-en-large/target" (and of "demo-de-en-large")."""
  return None if not name else str(name).split("/", 1)[0]


def assets(name: str | None = None) -> Traversable:
  """The assets directory that holds `name`'s group: ``specdec_jax/assets/``, or the
  ``assets/`` of the separate distribution its group ships in (`SEPARATE`).

  Raises:
    MissingAssets: the group's distribution is not installed (the message says how).
  """
  group = group_of(name)
  if group not in SEPARATE:
    return package_root() / "assets"
  module, pip_name, source = SEPARATE[group]
  if importlib.util.find_spec(module) is None:
    raise MissingAssets(
        f"{name!r} ships in the separate package {pip_name} (its models are too large for "
        f"specdec-jax's own wheel), which is not installed: pip install {pip_name} "
        f"(from a clone of the repository: pip install ./{source})")
  return importlib.resources.files(module) / "assets"


def separate_groups() -> list[str]:
  """The groups of `SEPARATE` whose distribution is installed (sorted)."""
  return sorted(g for g, (module, *_) in SEPARATE.items()
                if importlib.util.find_spec(module) is not None
                and (importlib.resources.files(module) / "assets" / g).is_dir())


def assets_path(name: str | None = None) -> pathlib.Path | None:
  """``assets(name)`` as a directory on disk, or None when the package is not stored as files.

  Checkpoints are read by path (through tensorstore's file driver), so bundled checkpoints
  need the package installed as files, as pip installs a wheel.
  """
  root = assets(name)
  return root if isinstance(root, pathlib.Path) else None
