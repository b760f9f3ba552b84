"""Kernels or XLA, per product of a decode request: the one place that decides.

A *product* is what a layer computes with weights in a decode request (`Model.start`,
a cached `Model.decode`): a matmul (a Dense, a fused Q/K/V, the output layer), an
RMSNorm's sum of squares, or an attention. The layers call `dot`, `mean_square` and
`attention` for every product; each runs the kernel of the backend (`backends`: "cpu",
"gpu") whose packed operand (`Packed`) the request carries in `COLLECTION`, else
XLA's ops.

Which products get packed, for which backend, is the `Policy`'s call, made once, at
packing (`models.packing.pack`, `sd.pack(model, kernels=...)`, `sd.load(kernels=...)`):

    policy = dispatch.policy("auto", params)    # backends.choose: cpu, gpu or xla here
    policy.route(product, stored_dtype)         # None: on the kernels; else why it is on XLA
    dispatch.width_invariant(model)             # every product of its decode invariant?

Teacher-forced passes (`Model.forward`) never carry the collection: they run XLA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.errors import InputError
from specdec_jax.kernels import backends

Array = jax.Array

COLLECTION = "decode_weights"   # flax collection of packed operands, at each product's key
KINDS = backends.KINDS


class Product(NamedTuple):
  """One product of a decode request, as its layer declares it.

  key: its path in `COLLECTION`: the calling module's path + a name ("kernel", "qkv",
    "kv", "wi", "logits", "sum_squares", "attention").
  kind: "dot": x [..., K] @ w [K, N]; "sum_squares": sum(x^2) over K as x^2 @ ones
    [K, 1]; "attention": softmax(q k + bias) v (no weights).
  sources: param paths of w: [K, N_i] kernels joined along N; with `transposed`, one
    [N, K] matrix (a tied embedding); for "sum_squares", the norm's scale [K].
  dtype: the dtype the layer computes the product in.
  """

  key: tuple[str, ...]
  kind: str
  sources: tuple[tuple[str, ...], ...] = ()
  dtype: Any = jnp.dtype(jnp.float32)
  transposed: bool = False

  @property
  def name(self) -> str:
    return "/".join(self.key)


@dataclasses.dataclass(frozen=True)
class Policy:
  """Which products run on which backend's kernels (hashable: a static value).

  backend: "cpu", "gpu" or "xla" (`backends`).
  reason: why this backend (`backends.Backend.status`, or why not the one asked for).
  xla: product names ("decoder/layers_0/mlp/wo/kernel") kept on XLA whatever else holds.
  """

  backend: str
  reason: str
  xla: frozenset[str] = frozenset()

  @property
  def kernels(self) -> bool:
    """Whether any product can run on a kernel (the backend is not "xla")."""
    return bool(backends.get(self.backend).kinds)

  def route(self, product: Product, stored_dtype=None) -> str | None:
    """None when `product` runs on a kernel; else the reason it runs on XLA.

    stored_dtype: the dtype of its weights as stored (a "dot"'s sources).
    """
    if product.kind not in KINDS:
      raise ValueError(f"unknown product kind {product.kind!r} ({product.name})")
    backend = backends.get(self.backend)
    if not backend.kinds:
      return self.reason
    if product.name in self.xla:
      return "kept on XLA by the policy"
    if product.kind not in backend.kinds:
      return f"no {self.backend} kernel for {product.kind}"
    if product.kind == "sum_squares":
      return None                            # float32 whatever the model's dtype
    dtypes = {jnp.dtype(product.dtype)}
    if product.kind == "dot":
      dtypes.add(jnp.dtype(stored_dtype))
    if not dtypes <= set(backend.dtypes):
      return f"no {self.backend} kernel for {', '.join(sorted(d.name for d in dtypes))}"
    return None


def policy(kernels: str = "auto", params=None, xla=()) -> Policy:
  """The policy for `kernels` ("auto", "cpu", "gpu", "xla"; `backends.choose`) and `params`.

  A backend named explicitly that cannot run here raises `InputError` (the CPU kernels
  unbuilt or disabled, params on several devices); "auto" falls back to "xla".
  xla: product names to keep on XLA.
  """
  name = backends.choose(kernels, params)
  backend = backends.get(name)
  available, reason = backend.status()
  if not available:
    raise InputError(f"kernels={kernels!r}: the {name} kernels are unavailable: {reason}")
  devices = backends.placement(params)
  if backend.needs_one_device and len(devices) > 1:
    raise InputError(f"kernels={kernels!r}: the {name} kernels need the params on one device, "
                     f"they are on {len(devices)}; use kernels='xla' (or 'auto')")
  if name == "cpu" and any(d.platform != "cpu" for d in devices):
    raise InputError(f"kernels='cpu': the params are on {sorted({d.platform for d in devices})}, "
                     f"not on the CPU")
  if kernels == "auto" and name == "xla":
    reason = "auto: " + _why_xla(params)
  return Policy(name, reason, frozenset(xla))


def _why_xla(params) -> str:
  """Why "auto" chose XLA's ops here."""
  if len(backends.placement(params)) > 1:
    return "params on several devices"
  if jax.default_backend() == "cpu":
    return backends.get("cpu").status()[1]
  return backends.auto_reason(params)


@struct.dataclass
class Packed:
  """One product's packed operand in `COLLECTION`, with the backend it is packed for.

  operand: the backend's packing of its weights (an attention: an empty [0] int8 marker).
  backend: static; the layers run this backend's kernel on `operand`.
  """

  operand: Array
  backend: str = struct.field(pytree_node=False, default="cpu")


@struct.dataclass
class DecodeWeights:
  """A Model's packed decode operands (`Model.decode_weights`; `models.packing.pack`).

  weights: the `COLLECTION` tree: at each kernel product's key, its `Packed` operand.
  xla: static ((name, reason), ...) of the products of the decode left on XLA.
  policy: the `Policy` it was packed under (static).
  products: static, the products packed (on the policy's backend).
  """

  weights: Any
  xla: tuple[tuple[str, str], ...] = struct.field(pytree_node=False, default=())
  policy: Policy | None = struct.field(pytree_node=False, default=None)
  products: tuple[Product, ...] = struct.field(pytree_node=False, default=())


def width_invariant(model) -> bool:
  """Whether every product of `model`'s decode runs on a kernel its backend makes width-
  and batch-invariant (`backends.Backend.invariant`): a k-token call then computes each
  token by the ops of a 1-token call (bitwise equal logits).

  XLA's dot picks other kernels for k >= 2 rows than for 1, so one product on XLA is
  enough for rows to round differently (exact mode then pads every call to one width).
  """
  weights = getattr(model, "decode_weights", None)
  if weights is None or weights.xla or weights.policy is None:
    return False
  invariant = backends.get(weights.policy.backend).invariant
  return all(p.kind in invariant for p in weights.products)


# ----------------------------------------------------------------------------- the layers' calls

_local = threading.local()      # .found: this thread's open `discovering()` recorders


@contextlib.contextmanager
def discovering():
  """Record every product the layers declare while tracing (`models.packing.products`)."""
  found: list[Product] = []
  stack = _local.__dict__.setdefault("found", [])
  stack.append(found)
  try:
    yield found
  finally:
    stack.pop()


def param_path(module, name: str) -> tuple[str, ...]:
  """The params path of `module`'s parameter `name` (T5X tree names)."""
  return tuple(module.scope.path) + (name,)


def _packed(module, product: Product) -> Packed | None:
  """The product's packed operand in this request, or None (run XLA's ops)."""
  stack = getattr(_local, "found", None)
  if stack:
    stack[-1].append(product)
    return None
  name = product.key[-1]
  if module.has_variable(COLLECTION, name):
    return module.get_variable(COLLECTION, name)
  return None


def dot(module, name: str, x: Array, sources, n: int, dtype, xla: Callable[[], Array],
        transposed: bool = False) -> Array:
  """x [..., K] @ w [K, n] in `dtype` -> [..., n] `dtype`, w made of `sources` (see
  `Product`); the skinny kernel when packed, else `xla()`."""
  product = Product(tuple(module.scope.path) + (name,), "dot", tuple(sources), jnp.dtype(dtype),
                    transposed)
  wp = _packed(module, product)
  if wp is None:
    return xla()
  return backends.get(wp.backend).kernel("dot")(x.astype(dtype), wp.operand, n).astype(dtype)


def mean_square(module, x: Array, scale: str = "scale") -> Array:
  """mean(x^2) over the last axis, float32 [..., K] -> [..., 1]; on the kernels as
  x^2 @ ones [K, 1] (a fixed accumulation order per row, as the products have)."""
  product = Product(tuple(module.scope.path) + ("sum_squares",), "sum_squares",
                    (param_path(module, scale),))
  ones = _packed(module, product)
  if ones is None:
    return jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  return backends.get(ones.backend).kernel("sum_squares")(x, ones.operand) / x.shape[-1]


def attention(module, q: Array, k: Array, v: Array, bias: Array, dtype,
              xla: Callable[[], Array]) -> Array:
  """q [B, H, T, Dh], k/v [B, H, S, Dh], bias [B|1, H|1, T|1, S] -> [B, T, H, Dh] `dtype`;
  the attention kernel when packed (every query row computed alike), else `xla()`."""
  product = Product(tuple(module.scope.path) + ("attention",), "attention", (), jnp.dtype(dtype))
  marker = _packed(module, product)
  if marker is None:
    return xla()
  attend = backends.get(marker.backend).kernel("attention")
  return attend(jnp.swapaxes(q, 1, 2), k, v, bias).astype(dtype)
