"""Kernels or XLA, per product of a decode request: the one place that decides.

A *product* is what a layer computes with weights in a decode request (`Model.start`,
a cached `Model.decode`): a matmul (a Dense, a fused Q/K/V, the output layer), an
RMSNorm's sum of squares (as x^2 @ ones), or an attention. The layers call `dot`,
`mean_square` and `attention` for every product; each runs the CPU kernel when the
request carries the product's packed operand (`COLLECTION`), else XLA's ops.

Which products get packed is the `Policy`'s call, made once, at packing
(`models.packing.pack`):

    policy = dispatch.policy()                  # from SPECDEC_CPU_KERNELS, backend, CPU, build
    policy.route(product, stored_dtype)         # None: on the kernels; else why it is on XLA
    dispatch.width_invariant(model)             # every product of its decode on a kernel?

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

from specdec_jax.kernels import build
from specdec_jax.kernels.row_attention import attention as attention_kernel
from specdec_jax.kernels.skinny import dot as dot_kernel

Array = jax.Array

COLLECTION = "decode_weights"   # flax collection of packed operands, at each product's key
KINDS = ("dot", "sum_squares", "attention")
_KERNEL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


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
  """Which products run on the kernels (hashable: a static value).

  kernels: the kernels are built and enabled here (`kernels.status()`).
  reason: why (or why not).
  xla: product names ("decoder/layers_0/mlp/wo/kernel") kept on XLA whatever else holds.
  """

  kernels: bool
  reason: str
  xla: frozenset[str] = frozenset()

  def route(self, product: Product, stored_dtype=None) -> str | None:
    """None when `product` runs on a kernel; else the reason it runs on XLA.

    stored_dtype: the dtype of its weights as stored (a "dot"'s sources).
    """
    if not self.kernels:
      return self.reason
    if product.name in self.xla:
      return "kept on XLA by the policy"
    if product.kind not in KINDS:
      raise ValueError(f"unknown product kind {product.kind!r} ({product.name})")
    if product.kind == "sum_squares":
      return None                            # float32 whatever the model's dtype
    dtypes = {jnp.dtype(product.dtype)}
    if product.kind == "dot":
      dtypes.add(jnp.dtype(stored_dtype))
    if not dtypes <= set(_KERNEL_DTYPES):
      return f"no kernel for {', '.join(sorted(d.name for d in dtypes))}"
    return None


def policy(xla=(), params=None) -> Policy:
  """The policy of this process now: `kernels.status()` (env SPECDEC_CPU_KERNELS, the
  backend, the CPU, the build); with `params`, also their placement (the kernels run
  on one CPU device). xla: product names to keep on XLA."""
  status = build.status()
  if status.available and params is not None and not on_one_cpu(params):
    return Policy(False, "params are not on one CPU device", frozenset(xla))
  return Policy(status.available, status.reason, frozenset(xla))


def on_one_cpu(tree) -> bool:
  """Every jax.Array leaf of `tree` lives on one and the same CPU device."""
  devices = set()
  for x in jax.tree_util.tree_leaves(tree):
    if isinstance(x, jax.Array):
      devices |= set(x.sharding.device_set)
  return len(devices) <= 1 and all(d.platform == "cpu" for d in devices)


@struct.dataclass
class DecodeWeights:
  """A Model's packed decode operands (`Model.decode_weights`; `models.packing.pack`).

  weights: the `COLLECTION` tree: at each kernel product's key, its packed weight
    (`kernels.pack`); an attention's entry is an empty [0] int8 marker.
  xla: static ((name, reason), ...) of the products of the decode left on XLA.
  policy: the `Policy` it was packed under (static).
  """

  weights: Any
  xla: tuple[tuple[str, str], ...] = struct.field(pytree_node=False, default=())
  policy: Policy | None = struct.field(pytree_node=False, default=None)


def width_invariant(model) -> bool:
  """Whether every product of `model`'s decode runs on a kernel: a k-token call then
  computes each token by the ops of a 1-token call (bitwise equal logits).

  XLA's dot picks other kernels for k >= 2 rows than for 1, so one product on XLA is
  enough for rows to round differently (exact mode then pads every call to one width).
  """
  weights = getattr(model, "decode_weights", None)
  return weights is not None and not weights.xla


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


def _packed(module, product: Product) -> Array | None:
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
  return dot_kernel(x.astype(dtype), wp, n).astype(dtype)


def mean_square(module, x: Array, scale: str = "scale") -> Array:
  """mean(x^2) over the last axis, float32 [..., K] -> [..., 1]; on the kernel as
  x^2 @ ones [K, 1] (a fixed accumulation order per row, as the products have)."""
  product = Product(tuple(module.scope.path) + ("sum_squares",), "sum_squares",
                    (param_path(module, scale),))
  ones = _packed(module, product)
  if ones is None:
    return jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  return dot_kernel(jnp.square(x), ones, 1) / x.shape[-1]


def attention(module, q: Array, k: Array, v: Array, bias: Array, dtype,
              xla: Callable[[], Array]) -> Array:
  """q [B, H, T, Dh], k/v [B, H, S, Dh], bias [B|1, H|1, T|1, S] -> [B, T, H, Dh] `dtype`;
  the attention kernel when packed (every query row computed alike), else `xla()`."""
  product = Product(tuple(module.scope.path) + ("attention",), "attention", (), jnp.dtype(dtype))
  if _packed(module, product) is None:
    return xla()
  return attention_kernel(jnp.swapaxes(q, 1, 2), k, v, bias).astype(dtype)
