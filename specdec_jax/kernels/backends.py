"""The kernel backends, in one registry: which products each runs, and which it makes
width- and batch-invariant.

    backend = backends.get("cpu")        # "cpu" | "gpu" | "xla"
    backends.choose("auto", params)      # the name "auto" picks here (see `choose`)
    backend.invariant                    # frozenset of product kinds computed alike per row
    backend.status()                     # (available, reason)

- cpu: the C++ kernels through XLA FFI (`kernels.skinny`, `kernels.row_attention`): every
  product kind, float32 and bfloat16; needs the build (`kernels.status()`) and params on
  one CPU device.
- gpu: Pallas kernels on NVIDIA Hopper through Mosaic GPU (`kernels.gpu`): the decode
  matmul, the RMSNorm sum of squares and decode attention; on a machine without a GPU
  the same kernels run in Pallas's GPU interpret mode (slow: for tests and CI). Needs
  params on one device.
- tpu: Pallas kernels through Mosaic TPU (`kernels.tpu`), the same three products; off
  a TPU they run in Pallas's TPU interpret mode (slow: for tests and CI). Never run on a
  TPU yet, so never "auto"'s choice: an explicit opt-in. Needs params on one device.
- xla: no kernels: every product on XLA's ops, which round a row differently with the
  number of rows (exact greedy then pads every call to one width).

A backend runs a product kind on its kernel when it lists the kind in `kinds`;
`invariant` (a subset) are the kinds whose rows are bitwise independent of M, the row's
position and the call width. `dispatch.width_invariant(model)` holds when every product
of the model's decode runs on such a kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from specdec_jax.errors import InputError
from specdec_jax.kernels import build

Array = jax.Array
KINDS = ("dot", "sum_squares", "attention")
CHOICES = ("auto", "cpu", "gpu", "tpu", "xla")


@dataclasses.dataclass(frozen=True)
class Backend:
  """One kernel backend (see the module docstring).

  name: "cpu", "gpu" or "xla".
  kinds: the product kinds it has kernels for; invariant: those computed alike per row.
  dtypes: compute dtypes of its kernels (a "dot" also needs its stored weights in them).
  pack: (w [K, N], compute dtype) -> the packed operand of a "dot" or "sum_squares".
  dot: (x [..., K], packed, N) -> [..., N] float32.
  sum_squares: (x [..., K], packed ones) -> [..., 1] float32.
  attention: (q [B, T, H, D], k/v [B, H, S, D], bias [B|1, H|1, T|1, S]) -> [B, T, H, D]
    float32.
  """

  name: str
  kinds: frozenset[str]
  invariant: frozenset[str]
  dtypes: tuple[Any, ...] = ()
  pack: Callable[..., Array] | None = dataclasses.field(default=None, compare=False)
  dot: Callable[..., Array] | None = dataclasses.field(default=None, compare=False)
  sum_squares: Callable[..., Array] | None = dataclasses.field(default=None, compare=False)
  attention: Callable[..., Array] | None = dataclasses.field(default=None, compare=False)
  needs_one_device: bool = True

  def status(self) -> tuple[bool, str]:
    """(available, reason) of this backend in this process."""
    if self.name == "cpu":
      s = build.status()
      return s.available, s.reason
    if self.name == "gpu":
      here = jax.default_backend()
      if here == "gpu":
        return True, "Pallas kernels compiled by Mosaic GPU"
      return True, f"Pallas kernels in GPU interpret mode (the JAX backend is {here})"
    if self.name == "tpu":
      here = jax.default_backend()
      if here == "tpu":
        return True, "Pallas kernels compiled by Mosaic TPU"
      return True, f"Pallas kernels in TPU interpret mode (the JAX backend is {here})"
    return True, "XLA's ops"

  def kernel(self, kind: str) -> Callable[..., Array]:
    """Its function `kind` ("pack", "dot", "sum_squares", "attention"); an operand packed
    for a backend without one (e.g. "xla") is an error, not a silent fallback."""
    fn = getattr(self, kind)
    if fn is None:
      raise InputError(f"the {self.name} backend has no {kind} kernel")
    return fn


def _cpu() -> Backend:
  from specdec_jax.kernels import row_attention, skinny

  def pack(w, dtype):
    return skinny.pack(w, skinny.pack_dtype(w, dtype))

  return Backend("cpu", frozenset(KINDS), frozenset(KINDS),
                 (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)), pack, skinny.dot,
                 lambda x, ones: skinny.dot(jnp.square(x), ones, 1),
                 row_attention.attention)


def _gpu() -> Backend:
  from specdec_jax.kernels import gpu
  return Backend("gpu", frozenset(KINDS), frozenset(KINDS),
                 (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)), gpu.pack, gpu.dot,
                 gpu.sum_squares, gpu.attention)


def _tpu() -> Backend:
  from specdec_jax.kernels import tpu
  return Backend("tpu", frozenset(KINDS), frozenset(KINDS),
                 (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)), tpu.pack, tpu.dot,
                 tpu.sum_squares, tpu.attention)


_XLA = Backend("xla", frozenset(), frozenset(), needs_one_device=False)
_MAKERS = {"cpu": _cpu, "gpu": _gpu, "tpu": _tpu, "xla": lambda: _XLA}
_MADE: dict[str, Backend] = {}


def get(name: str) -> Backend:
  """The backend `name` ("cpu", "gpu", "xla"); "auto" is resolved by `choose`."""
  if name not in _MAKERS:
    raise InputError(f"kernels must be one of {', '.join(CHOICES)}, got {name!r}")
  if name not in _MADE:
    _MADE[name] = _MAKERS[name]()
  return _MADE[name]


def choose(kernels: str, params=None) -> str:
  """The backend name for `kernels` ("auto", "cpu", "gpu", "xla") and `params`.

  "auto": "gpu" where JAX's default backend is a GPU and the params live on one device;
  "cpu" where it is the CPU, the C++ kernels are built (`kernels.status()`) and the
  params live on one CPU device; "xla" otherwise (a mesh of several devices, TPUs, the
  kernels disabled or unbuilt). The gpu backend in interpret mode is never "auto"'s
  choice: it is for tests. A name is returned as given (checked).
  """
  if kernels not in CHOICES:
    raise InputError(f"kernels must be one of {', '.join(CHOICES)}, got {kernels!r}")
  if kernels != "auto":
    return kernels
  devices = placement(params)
  here = jax.default_backend()
  if len(devices) > 1:
    return "xla"
  if here == "gpu" and all(d.platform == "gpu" for d in devices):
    return "gpu"
  if here == "cpu" and build.available() and all(d.platform == "cpu" for d in devices):
    return "cpu"
  return "xla"


def placement(tree) -> set:
  """The devices the jax.Array leaves of `tree` live on."""
  devices = set()
  for x in jax.tree_util.tree_leaves(tree):
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
      devices |= set(x.sharding.device_set)
  return devices
