"""Files read as package data: the library's named model configs, and the demo models and
tokenizers that ship beside it.

Both are found with ``importlib.resources`` so that a wheel install has them as an editable
one does. The configs are the library's own::

    specdec_jax/configs/models/<name>.json       named T5 configs (sd.get_config(name))

The library's wheel is code only: the demo models ship in companion distributions built from
this repository's ``packages/`` directory (every wheel stays under the package index's
100 MB file limit), each holding asset groups under ``assets/`` of its import package::

    specdec_jax_demo_small/assets/<group>/<name>/     bundled checkpoints ("demo-de-en/target")
    specdec_jax_demo_small/assets/<group>/spiece.model    bundled tokenizers ("demo-de-en")
    specdec_jax_demo/assets/demo-de-en-large/target       the larger De->En pair

A name resolves through its group, the part before the first "/", to the distribution that
ships the group (`SEPARATE`), whichever that is; a name of a group whose distribution is not
installed raises `MissingAssets` with the pip command.

The repository's top-level ``configs/models`` is a symlink to the package's directory.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from importlib.resources.abc import Traversable

from specdec_jax.errors import CheckpointError, TokenizerError

PACKAGE = "specdec_jax"

_SMALL = ("specdec_jax_demo_small", "specdec-jax-demo-small", "packages/specdec-jax-demo-small")
_LARGE = ("specdec_jax_demo", "specdec-jax-demo", "packages/specdec-jax-demo")
#: Asset groups, each shipped in a distribution of its own beside the library: group ->
#: (import package, pip name, its directory in this repository).
SEPARATE = {"demo-de-en": _SMALL, "demo-en-lm": _SMALL, "demo-de-en-large": _LARGE}


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


def _installed(module: str) -> bool:
  return importlib.util.find_spec(module) is not None


def assets(name: str | None) -> Traversable | None:
  """The ``assets/`` directory of the distribution that ships `name`'s group (`SEPARATE`);
  None when no distribution ships a group of that name.

  Raises:
    MissingAssets: the group's distribution is not installed (the message says how).
  """
  group = group_of(name)
  if group not in SEPARATE:
    return None
  module, pip_name, source = SEPARATE[group]
  if not _installed(module):
    raise MissingAssets(
        f"{name!r} ships in the separate package {pip_name} (specdec-jax's own wheel holds "
        f"no models), which is not installed: pip install {pip_name} "
        f"(from a clone of the repository: pip install ./{source})")
  return importlib.resources.files(module) / "assets"


def installed_assets() -> list[Traversable]:
  """The ``assets/`` directories of the installed distributions of `SEPARATE`, each once."""
  modules = dict.fromkeys(module for module, *_ in SEPARATE.values())
  return [importlib.resources.files(m) / "assets" for m in modules if _installed(m)]


def separate_groups() -> list[str]:
  """The groups of `SEPARATE` whose distribution is installed (sorted)."""
  return sorted(g for g, (module, *_) in SEPARATE.items()
                if _installed(module)
                and (importlib.resources.files(module) / "assets" / g).is_dir())
