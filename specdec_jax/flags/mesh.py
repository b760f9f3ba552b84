"""--mesh data=D,model=M: the device mesh of `specdec decode`, `bench` and `eval`.

    specdec decode --model DIR --drafter DRAFT_DIR --mesh data=2,model=4 ...

On a mesh the target is loaded straight into the shards T5X's logical-axis rules give its
parameters (`sd.load(..., mesh=)`, `RULES_1D`; a `config:` model initialised into them), every
other model a method carries (drafter, BiLD's small model, prediction heads, rescorer) is
copied whole to every device (`sd.sharding.replicate`), and each batch of encoder tokens
is split by rows over "data" (`sd.sharding.shard_batch`). The models' activations are
constrained by the same rules (`sd.sharding.Partitioner`), and `jit` propagates the rest.
Without --mesh everything stays on one device.
"""

from __future__ import annotations

import argparse
from typing import Any

import jax
from jax.sharding import Mesh

import specdec_jax as sd
from specdec_jax.flags import FlagError
from specdec_jax.loading import load_model
from specdec_jax.sharding import MESH_AXES


def parse_mesh(text: str) -> dict[str, int]:
  """"data=2,model=4" -> {"data": 2, "model": 4}; an axis left out has size 1.

  FlagError: an axis other than "data" / "model", one given twice, a size that is not a
  positive integer.
  """
  sizes: dict[str, int] = {}
  for item in (part.strip() for part in text.split(",")):
    if not item:
      continue
    axis, sep, value = item.partition("=")
    axis = axis.strip()
    if not sep:
      raise FlagError(f"--mesh {text!r}: {item!r} is not AXIS=SIZE (e.g. data=2,model=4)")
    if axis not in MESH_AXES:
      raise FlagError(f"--mesh {text!r}: unknown axis {axis!r}; the axes are "
                     f"{', '.join(MESH_AXES)}")
    if axis in sizes:
      raise FlagError(f"--mesh {text!r}: axis {axis!r} given twice")
    if not value.strip().isdigit() or int(value) < 1:
      raise FlagError(f"--mesh {text!r}: the size of {axis!r} must be a positive integer, "
                     f"got {value!r}")
    sizes[axis] = int(value)
  if not sizes:
    raise FlagError(f"--mesh {text!r}: expected AXIS=SIZE pairs, e.g. data=2,model=4")
  return {axis: sizes.get(axis, 1) for axis in MESH_AXES}


def add_mesh_flag(p: argparse.ArgumentParser) -> None:
  p.add_argument("--mesh", metavar="data=D,model=M",
                 help="decode on a D x M device mesh (D * M = the device count; with several "
                 "processes, every process's devices for one global mesh or this process's "
                 "for a mesh per process): the target split by T5X's rules over 'model', "
                 "other models copied to every device, batches split over 'data' (default: "
                 "one device)")


def mesh_from_flag(mesh: str | None) -> Mesh | None:
  """The `Mesh` of `--mesh data=D,model=M` (None without it), checked before any model is
  loaded.

  One process: over `jax.devices()` (D * M must be the device count). Several processes
  (`distributed`): D * M = `jax.device_count()`, every process's devices, is one GLOBAL
  mesh (a model split across hosts; every process runs every batch); D * M =
  `jax.local_device_count()` is a mesh of this process's devices (data-parallel across
  processes: each decodes its own block of rows). Any other size is a FlagError naming both.
  """
  if mesh is None:
    return None
  sizes = parse_mesh(mesh)
  wanted = sizes["data"] * sizes["model"]
  local, world = jax.local_device_count(), jax.device_count()
  if jax.process_count() == 1 or wanted == world:
    # (several processes: process 0's devices come first)
    return sd.make_mesh(data=sizes["data"], model=sizes["model"])
  if wanted == local:
    return sd.make_mesh(**sizes, devices=jax.local_devices())
  raise FlagError(f"--mesh {mesh}: data * model = {wanted}, but {jax.process_count()} "
                 f"processes have {world} devices ({local} on this one): give {world} for "
                 f"one mesh over every process, or {local} for a mesh per process")


def check_batch(batch: int, mesh: Mesh | None, flag: str = "--batch-size") -> None:
  """FlagError when `batch` rows cannot be split evenly over the mesh's "data" axis."""
  if mesh is not None and batch % mesh.shape["data"]:
    raise FlagError(f"{flag} {batch} is not divisible by the mesh's 'data' axis of size "
                   f"{mesh.shape['data']}: choose a multiple of {mesh.shape['data']}")


def load_target(spec: str, dtype: str | None, mesh: Mesh | None, what: str = "model",
                overrides: dict[str, Any] | None = None) -> sd.Model:
  """The target `spec` (`models.load_model`), on a mesh loaded straight into its shards:
  no parameter is ever whole on one device (T5-XXL does not fit one)."""
  return load_model(spec, dtype, what=what, overrides=overrides, mesh=mesh)
