"""The kernel backends, in one registry: which products each runs, and which it makes
width- and batch-invariant.

    backend = backends.get("cpu")        # "cpu" | "gpu" | "xla"
    backends.choose("auto", params)      # the name "auto" picks here (see `choose`)
    backend.invariant                    # frozenset of product kinds computed alike per row
    backend.status()                     # (available, reason)

- cpu: the C++ kernels through XLA FFI (`kernels.skinny`, `kernels.row_attention`): every
  product kind, float32 and bfloat16; needs the build (`kernels.status()`) and params on
  the CPU (one device or a mesh).
- gpu: Pallas kernels on NVIDIA Hopper through Mosaic GPU (`kernels.gpu`): the decode
  matmul, the RMSNorm sum of squares and decode attention; on a machine without a GPU
  the same kernels run in Pallas's GPU interpret mode (slow: for tests and CI).
- tpu: Pallas kernels through Mosaic TPU (`kernels.tpu`), the same three products; off
  a TPU they run in Pallas's TPU interpret mode (slow: for tests and CI). Never run on a
  TPU yet, so never "auto"'s choice: an explicit opt-in.
- xla: no kernels: every product on XLA's ops, which round a row differently with the
  number of rows (exact greedy then pads every call to one width).

A backend runs a product kind on its kernel when it lists the kind in `kinds`;
`invariant` (a subset) are the kinds whose rows are bitwise independent of M, the row's
position and the call width. `dispatch.width_invariant(model)` holds when every product
of the model's decode runs on such a kernel. On a mesh every backend's kernels run
inside `shard_map`, each device on its block (`dispatch.Layout`); "auto" still picks
"xla" there: name the backend.

Hardware: "auto" picks a backend whose kernels compile for an accelerator (`Backend.checked`:
gpu, later tpu) only on a device kind the device check has recorded as measured
(`verified`: invariant, agreeing with XLA, not slower than the padded XLA baseline); named
explicitly, such a backend must suit the device (`Backend.unsupported`: Mosaic GPU needs
Hopper) and passes a seconds-long self-check on its first use there (`selfcheck`).
`lowering(platforms)` traces the kernels as they run on other platforms (`sd.lower`).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp

from specdec_jax.errors import InputError
from specdec_jax.kernels import build, selfcheck, verified

Array = jax.Array
KINDS = ("dot", "sum_squares", "attention")
CHOICES = ("auto", "cpu", "gpu", "tpu", "xla")

#: The platforms the program being traced is lowered for (`lowering`); None: it runs here.
#: A jit cache key, so a program traced for CUDA is never the one run on this CPU.
_LOWERING = jax.make_user_context(None)


def lowering(platforms):
  """Context: trace kernels as they run on `platforms` (("cuda",), ("tpu",), ...), not
  here: a Pallas backend compiles for its platform (`Backend.compiles_for`) where it is
  lowered for it, and interprets where it is lowered for the CPU."""
  return _LOWERING(tuple(platforms))


def interpret(platform: str) -> bool | None:
  """pallas_call's `interpret` for kernels that compile for `platform` ("cuda", "tpu") in
  the program being traced: False when lowering for it, True otherwise (the CPU), None
  when not lowering (JAX's default backend decides, e.g. `gpu.mode.interpret`)."""
  platforms = _LOWERING.value
  return None if platforms is None else platform not in platforms


@dataclasses.dataclass(frozen=True)
class Backend:
  """One kernel backend (see the module docstring).

  name: "cpu", "gpu" or "xla".
  kinds: the product kinds it has kernels for; invariant: those computed alike per row.
  dtypes: compute dtypes of its kernels (a "dot" also needs its stored weights in them).
  pack: (w [K, N], compute dtype) -> the packed operand of a "dot" or "sum_squares".
  dot: (x [..., K], packed, N) -> [..., N] float32.
  sum_squares: (x [..., K], packed ones) -> [..., 1] float32.
  attention: (q [B, T, H, D], grouped k/v [B, Hkv, S, D], bias None | [B|1, H|1, T|1, S],
    lengths None | [B, T]) -> [B, T, H, D] float32 (the seam: `kernels.shapes`); with
    `windows`, also window= (a sliding window); with `softcaps`, also softcap=.
  windows: its attention kernel takes a sliding window (Gemma's sliding layers).
  softcaps: its attention kernel takes an attention-logit soft-cap (Gemma 2's).
  platform: the JAX backend its kernels run compiled on ("cpu", "gpu", "tpu"; None: xla).
  compiles_for: the lowering platforms its compiled kernels target ("cpu", "cuda",
    "tpu"); () for xla, which lowers for any.
  interprets: its kernels also run in Pallas's interpret mode on a CPU (tests, CI).
  checked: compiled kernels for an accelerator: "auto" picks it only where `verified`
    has a pass for the device kind, and its first use on a device runs `selfcheck`.
  unsupported: device -> why its kernels cannot compile there (None: they can).
  """

  name: str
  kinds: frozenset[str]
  invariant: frozenset[str]
  dtypes: tuple[Any, ...] = ()
  pack: Callable[..., Array] | None = dataclasses.field(default=None, compare=False)
  dot: Callable[..., Array] | None = dataclasses.field(default=None, compare=False)
  sum_squares: Callable[..., Array] | None = dataclasses.field(default=None, compare=False)
  attention: Callable[..., Array] | None = dataclasses.field(default=None, compare=False)
  platform: str | None = None
  compiles_for: tuple[str, ...] = ()
  interprets: bool = False
  checked: bool = False
  windows: bool = False
  softcaps: bool = False
  unsupported: Callable[[Any], str | None] | None = dataclasses.field(default=None,
                                                                       compare=False)

  def status(self) -> tuple[bool, str]:
    """(available, reason) of this backend in this process."""
    if self.name == "cpu":
      s = build.status()
      return s.available, s.reason
    if self.interprets and self.platform is not None:    # Pallas: Mosaic GPU / Mosaic TPU
      here, mosaic = jax.default_backend(), f"Mosaic {self.platform.upper()}"
      if here == self.platform:
        return True, f"Pallas kernels compiled by {mosaic}"
      return True, (f"Pallas kernels in {self.platform.upper()} interpret mode (the JAX "
                    f"backend is {here})")
    return True, "XLA's ops"

  def kernel(self, kind: str) -> Callable[..., Array]:
    """Its function `kind` ("pack", "dot", "sum_squares", "attention"); an operand packed
    for a backend without one (e.g. "xla") is an error, not a silent fallback."""
    fn = getattr(self, kind)
    if fn is None:
      raise InputError(f"the {self.name} backend has no {kind} kernel")
    return fn

  def lowers_for(self, platforms) -> bool:
    """Whether a program on its kernels lowers for `platforms` (`sd.lower`): xla for any;
    the others for the platforms they compile for, or the CPU alone where they interpret."""
    platforms = set(platforms)
    if not self.kinds:
      return True
    return platforms <= set(self.compiles_for) or (self.interprets and platforms == {"cpu"})


def _cpu() -> Backend:
  from specdec_jax.kernels import row_attention, skinny

  def pack(w, dtype):
    return skinny.pack(w, skinny.pack_dtype(w, dtype))

  return Backend("cpu", frozenset(KINDS), frozenset(KINDS),
                 (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)), pack, skinny.dot,
                 lambda x, ones: skinny.dot(jnp.square(x), ones, 1),
                 row_attention.attention, platform="cpu", compiles_for=("cpu",), windows=True,
                 softcaps=True)


def mosaic_gpu_unsupported(device) -> str | None:
  """Why Mosaic GPU cannot compile for `device` (None: it can): it needs NVIDIA Hopper,
  compute capability 9.0 or higher (sm_90+)."""
  capability = getattr(device, "compute_capability", None)
  kind = getattr(device, "device_kind", str(device))
  try:
    major = float(str(capability))
  except ValueError:
    return f"{kind} reports no CUDA compute capability: Mosaic GPU needs NVIDIA Hopper (sm_90+)"
  if major < 9.0:
    return (f"{kind} has compute capability {capability}: Mosaic GPU needs Hopper "
            f"(sm_90+)")
  return None


def _pallas(name: str, kernels, platform: str, lowered_for: str, **extra) -> Backend:
  """A Pallas backend over `kernels` (the module `kernels.gpu` or `kernels.tpu`): compiled
  where the program is lowered for `lowered_for` (`lowering`), else as its `mode` says."""

  def dot(x, wp, n):
    return kernels.dot(x, wp, n, interpret=interpret(lowered_for))

  def sum_squares(x, ones):
    return kernels.sum_squares(x, ones, interpret=interpret(lowered_for))

  def attention(q, k, v, bias=None, lengths=None):
    return kernels.attention(q, k, v, bias, lengths, interpret=interpret(lowered_for))

  return Backend(name, frozenset(KINDS), frozenset(KINDS),
                 (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)), kernels.pack, dot,
                 sum_squares, attention, platform=platform, compiles_for=(lowered_for,),
                 interprets=True, checked=True, **extra)


def _gpu() -> Backend:
  from specdec_jax.kernels import gpu
  return _pallas("gpu", gpu, "gpu", "cuda", unsupported=mosaic_gpu_unsupported)


def _tpu() -> Backend:
  from specdec_jax.kernels import tpu
  return _pallas("tpu", tpu, "tpu", "tpu")


_XLA = Backend("xla", frozenset(), frozenset())
#: name -> (the JAX platform its kernels run compiled on, its maker). A new backend is one
#: line here and one module of kernels.
_MAKERS: dict[str, tuple[str | None, Callable[[], Backend]]] = {
    "cpu": ("cpu", _cpu), "gpu": ("gpu", _gpu), "tpu": ("tpu", _tpu),
    "xla": (None, lambda: _XLA)}
_MADE: dict[str, Backend] = {}


def get(name: str) -> Backend:
  """The backend `name` ("cpu", "gpu", "xla"); "auto" is resolved by `choose`."""
  if name not in _MAKERS:
    raise InputError(f"kernels must be one of {', '.join(CHOICES)}, got {name!r}")
  if name not in _MADE:
    _MADE[name] = _MAKERS[name][1]()
  return _MADE[name]


def choose(kernels: str, params=None) -> str:
  """The backend name for `kernels` ("auto", "cpu", "gpu", "xla") and `params`.

  "auto": on one device of JAX's default backend, the first backend whose kernels run
  compiled there and are available (`Backend.status`), for an accelerator (gpu) only
  where the device check recorded its kernels measured on that device kind (`verified`)
  and its self-check passes; "xla" otherwise (a mesh of several devices, a GPU without
  a record, TPUs, the kernels disabled or unbuilt). So: "cpu" on a CPU where the C++
  kernels build, "xla" on any GPU until the record names its kind. The gpu backend in
  interpret mode is never "auto"'s choice: it is for tests.

  A name is returned as given (checked): a backend with compiled accelerator kernels,
  named on its own platform, must suit the device (`Backend.unsupported`: an InputError
  naming the device) and pass `selfcheck` on first use there (`selfcheck.SelfCheckFailed`).
  """
  if kernels not in CHOICES:
    raise InputError(f"kernels must be one of {', '.join(CHOICES)}, got {kernels!r}")
  devices = placement(params)
  here = jax.default_backend()
  if kernels != "auto":
    if _MAKERS[kernels][0] == here and get(kernels).checked:
      _check_device(get(kernels), _device(devices))
    return kernels
  if len(devices) > 1 or any(d.platform != here for d in devices):
    return "xla"
  for name, (platform, _) in _MAKERS.items():
    if platform != here:
      continue
    backend = get(name)
    if not backend.status()[0]:
      continue
    if backend.checked:
      device = _device(devices)
      kind = device_kind(device)
      if not verified.passed(name, kind):
        continue
      why = (backend.unsupported and backend.unsupported(device)) or selfcheck.check(backend,
                                                                                      kind)
      if why:
        warnings.warn(f"kernels='auto': the {name} kernels recorded for {kind} fail here "
                      f"({why}); using XLA's ops", stacklevel=2)
        continue
    return name
  return "xla"


def auto_reason(params=None) -> str:
  """Why "auto" keeps XLA's ops off the CPU (`dispatch`'s reason for the policy)."""
  here = jax.default_backend()
  checked = [n for n, (p, _) in _MAKERS.items() if p == here and get(n).checked]
  if not checked:
    return f"no kernels for the {here} backend"
  kind = device_kind(_device(placement(params)))
  return (f"the {', '.join(checked)} kernels are not recorded as measured on {kind} "
          f"(specdec_jax/kernels/verified.json); kernels={checked[0]!r} opts in")


def _check_device(backend: Backend, device) -> None:
  """Raise unless `backend`'s compiled kernels suit `device` and pass `selfcheck` there."""
  why = backend.unsupported(device) if backend.unsupported else None
  if why:
    raise InputError(f"kernels={backend.name!r}: {why}; use kernels='xla' (or 'auto')")
  kind = device_kind(device)
  failed = selfcheck.check(backend, kind)
  if failed:
    raise selfcheck.SelfCheckFailed(
        f"kernels={backend.name!r} failed its self-check on {kind}: {failed}; use "
        f"kernels='xla' (or 'auto')")


def _device(devices):
  """The one device of `devices` (the params'), else JAX's first default device."""
  return min(devices, key=lambda d: d.id) if devices else jax.devices()[0]


def device_kind(device) -> str:
  """The device's kind as JAX names it ("NVIDIA H100 80GB HBM3", "TPU v5 lite", "cpu")."""
  return str(getattr(device, "device_kind", device))


def placement(tree) -> set:
  """The devices the jax.Array leaves of `tree` live on."""
  devices = set()
  for x in jax.tree_util.tree_leaves(tree):
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
      devices |= set(x.sharding.device_set)
  return devices
