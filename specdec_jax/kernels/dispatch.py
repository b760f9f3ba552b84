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

On a mesh (a Model placed by `sd.shard`, then packed) each packed operand carries a
`Layout`: its kernel runs inside `shard_map`, each device on its own block, with specs
from the logical axes' rules (`sharding.RULES_1D`: "model" splits heads and the MLP). A
column-parallel product (wi, q/k/v, the output layer: N split) needs nothing more; a
row-parallel one (wo, the attention's out: K split) adds the devices' partial sums in
shard order (`_reduce`); attention splits by heads (grouped K/V heads with their query
heads) and rows by batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import PartitionSpec as P

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
    [K, 1]; "attention": softmax(q k + bias) v over each row's keys s < its length
    (`kernels.shapes`; no weights).
  sources: param paths of w: [K, N_i] kernels joined along N; with `transposed`, one
    [N, K] matrix (a tied embedding); for "sum_squares", the norm's scale [K] (none for
    a norm without a scale: Gemma's value norm).
  dtype: the dtype the layer computes the product in.
  width: K of a "sum_squares" without sources (0 otherwise).
  """

  key: tuple[str, ...]
  kind: str
  sources: tuple[tuple[str, ...], ...] = ()
  dtype: Any = jnp.dtype(jnp.float32)
  transposed: bool = False
  width: int = 0

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
  unbuilt or disabled, params off the CPU for "cpu"); "auto" falls back to "xla", and
  picks it for params on several devices (name the backend to run its kernels on a mesh).
  xla: product names to keep on XLA.
  """
  name = backends.choose(kernels, params)
  backend = backends.get(name)
  available, reason = backend.status()
  if not available:
    raise InputError(f"kernels={kernels!r}: the {name} kernels are unavailable: {reason}")
  devices = backends.placement(params)
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


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a product runs on a mesh (`Packed.layout`): its kernel inside `shard_map` over
  `mesh`, each device on its own block (hashable: a static value).

  batch: the mesh axis of the rows' leading (batch) dimension, where it divides it.
  k: a "dot": the mesh axis splitting K, the weight's rows (row-parallel: the partial
    sums are reduced across it).
  n: a "dot": the mesh axis splitting N, the weight's columns; an "attention": the mesh
    axis splitting heads, where it divides the K/V heads.
  widths: a "dot": the widths N_i of the matrices joined along N (each split alike).
  The operand of a "dot" or "sum_squares" is the backend's packing of each block, stacked
  [size(k), size(n), *packed], split over (k, n).
  """

  mesh: Any
  batch: str | None = None
  k: str | None = None
  n: str | None = None
  widths: tuple[int, ...] = ()

  def size(self, axis: str | None) -> int:
    return 1 if axis is None else int(self.mesh.shape[axis])


@struct.dataclass
class Packed:
  """One product's packed operand in `COLLECTION`, with the backend it is packed for.

  operand: the backend's packing of its weights (an attention: an empty [0] int8 marker);
    on a mesh, the packing of each block (`Layout`).
  backend: static; the layers run this backend's kernel on `operand`.
  layout: static; on a mesh, where the kernel's blocks run (None: one device).
  """

  operand: Array
  backend: str = struct.field(pytree_node=False, default="cpu")
  layout: Layout | None = struct.field(pytree_node=False, default=None)


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
  kernel = backends.get(wp.backend).kernel("dot")
  if wp.layout is not None:
    return _dot_on_mesh(kernel, x.astype(dtype), wp.operand, n, wp.layout).astype(dtype)
  return kernel(x.astype(dtype), wp.operand, n).astype(dtype)


def mean_square(module, x: Array, scale: str | None = "scale") -> Array:
  """mean(x^2) over the last axis, float32 [..., K] -> [..., 1]; on the kernels as
  x^2 @ ones [K, 1] (a fixed accumulation order per row, as the products have). scale:
  the norm's scale parameter (its K), or None for a norm without one."""
  sources = () if scale is None else (param_path(module, scale),)
  product = Product(tuple(module.scope.path) + ("sum_squares",), "sum_squares", sources,
                    width=x.shape[-1] if scale is None else 0)
  ones = _packed(module, product)
  if ones is None:
    return jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  kernel = backends.get(ones.backend).kernel("sum_squares")
  if ones.layout is not None:     # K whole on every device, the rows split by batch
    batch = _batch_spec(x, ones.layout)
    return _shard_map(lambda a, w: kernel(a, w[0, 0]), ones.layout.mesh,
                      (P(*batch, None), P()), P(*batch, None))(x, ones.operand) / x.shape[-1]
  return kernel(x, ones.operand) / x.shape[-1]


def attention(module, q: Array, k: Array, v: Array, bias: Array | None, lengths: Array, dtype,
              xla: Callable[[], Array], window: int | None = None,
              softcap: float | None = None) -> Array:
  """q [B, H, T, Dh], grouped k/v [B, Hkv, S, Dh] (query head h reads K/V head
  h // (H / Hkv)), bias None | [B|1, H|1, T|1, S], lengths [B, T] (row (b, t) reads keys
  s < lengths[b, t], and s >= lengths[b, t] - `window` with one; logits soft-capped at
  `softcap` with one: `kernels.shapes`) -> [B, T, H, Dh] `dtype`; the attention kernel
  when packed (every query row computed alike), else `xla()`. A window or a softcap on a
  backend whose kernel takes none (gpu, tpu) is refused (`InputError`)."""
  product = Product(tuple(module.scope.path) + ("attention",), "attention", (), jnp.dtype(dtype))
  marker = _packed(module, product)
  if marker is None:
    return xla()
  backend = backends.get(marker.backend)
  attend = backend.kernel("attention")
  for name, value, takes, what in (("window", window, backend.windows, "sliding window"),
                                   ("softcap", softcap, backend.softcaps,
                                    "attention-logit soft-cap")):
    if value is None:
      continue
    if not takes:
      raise InputError(f"the {marker.backend} attention kernel takes no {what} "
                       f"({name} {value} at {'/'.join(product.key)}): pack the model for "
                       "kernels='xla' or 'cpu'")
    attend = functools.partial(attend, **{name: value})
  q = jnp.swapaxes(q, 1, 2)
  if marker.layout is not None:
    return _attention_on_mesh(attend, q, k, v, bias, lengths, marker.layout).astype(dtype)
  return attend(q, k, v, bias, lengths).astype(dtype)


# ----------------------------------------------------------------------------- on a mesh


def _shard_map(f, mesh, in_specs, out_specs):
  """`jax.shard_map` (jax.experimental's on a jax without it). No replication check: the
  kernels are custom calls that declare none."""
  if hasattr(jax, "shard_map"):
    return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
  from jax.experimental.shard_map import shard_map  # pragma: no cover (older jax)
  return shard_map(f, mesh, in_specs, out_specs, check_rep=False)


def _batch_spec(x: Array, layout: Layout, taken=()) -> tuple[str | None, ...]:
  """Specs of x's dimensions but the last: the leading one over `layout.batch` where that
  axis divides it (and splits no weight dimension, `taken`), the rest whole."""
  axis = layout.batch
  if (x.ndim < 2 or axis is None or axis in taken or layout.size(axis) == 1
      or x.shape[0] % layout.size(axis)):
    axis = None
  return ((axis,) + (None,) * (x.ndim - 2))[:max(x.ndim - 1, 0)]


def _reduce(parts: Array) -> Array:
  """parts [s, ...] (one partial sum per device, in shard order) -> their sum, added in
  shard order: 0 + 1, then + 2, ... Each element's order of additions is fixed by the mesh,
  never by the rows: a row-parallel product stays bitwise independent of the batch and
  the call width, as the kernels are (a psum's order is the collective's to choose)."""
  total = parts[0]
  for i in range(1, parts.shape[0]):
    total = total + parts[i]
  return total


def _dot_on_mesh(kernel: Callable[..., Array], x: Array, operand: Array, n: int,
                 layout: Layout) -> Array:
  """x [..., K] @ the blocks of w [K, n] (`Layout`) -> [..., n] float32, each device's
  kernel on its block: columns split over `layout.n` (each joined matrix alike), K over
  `layout.k` (partial sums gathered and added in shard order: `_reduce`)."""
  sk, sn = layout.size(layout.k), layout.size(layout.n)
  widths = layout.widths or (n,)
  local = [w // sn for w in widths]
  batch = _batch_spec(x, layout, (layout.k, layout.n))

  def block(xs, ws):
    y = kernel(xs, ws[0, 0], sum(local))
    if sk > 1:
      y = _reduce(jax.lax.all_gather(y, layout.k))
    return tuple(jnp.split(y, np.cumsum(local)[:-1].tolist(), axis=-1))

  # each joined matrix's columns come back whole: device j's y holds block j of each
  ys = _shard_map(block, layout.mesh, (P(*batch, layout.k), P(layout.k, layout.n)),
                  tuple(P(*batch, layout.n) for _ in widths))(x, operand)
  return ys[0] if len(ys) == 1 else jnp.concatenate(ys, axis=-1)


def _attention_on_mesh(attend: Callable[..., Array], q: Array, k: Array, v: Array,
                       bias: Array | None, lengths: Array, layout: Layout) -> Array:
  """`attend` (q [B, T, H, D], k/v [B, Hkv, S, D], bias None | [B|1, H|1, T|1, S],
  lengths [B, T]) per device: heads over `layout.n` where it divides Hkv (each device its
  K/V heads and their query heads), rows over `layout.batch` where it divides B; the rest
  whole on every device."""
  heads = layout.n if layout.n and k.shape[1] % layout.size(layout.n) == 0 else None
  batch = _batch_spec(q, layout, (heads,))[0] if q.ndim == 4 else None
  on = lambda axis, size: axis if size > 1 else None
  q_spec = P(batch, None, heads, None)
  kv_spec = P(batch, heads, None, None)
  specs = [q_spec, kv_spec, kv_spec, P(batch, None)]     # and the lengths
  operands = [q, k, v, lengths]
  if bias is not None:
    specs.append(P(on(batch, bias.shape[0]), on(heads, bias.shape[1]), None, None))
    operands.append(bias)

  def local(q, k, v, lengths, bias=None):
    return attend(q, k, v, bias, lengths)

  return _shard_map(local, layout.mesh, tuple(specs), q_spec)(*operands)
