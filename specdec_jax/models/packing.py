"""Packing: a Model's decode products laid out for the CPU kernels, as an explicit step.

    packed = sd.pack(model)             # a Model with `decode_weights` (or `model` itself)
    packed.decode_weights.xla           # ((product, why it stays on XLA), ...)
    sd.pack((target, drafter))          # every Model in a pytree

`products(config)` lists the products of a decode request by tracing one (abstractly):
every product a layer routes through `kernels.dispatch` is found, none is named here.
`pack` asks the dispatch `Policy` which of them run on the kernels and packs their
weights once (`kernels.pack`); the packed Model carries them as pytree leaves, so a
jitted function that takes it runs its decode requests on the kernels. An unpacked
Model's pytree structure is the same on every machine.

The decode entry points pack the Models they are given (`Model.start` / `decode`
outside a trace, `decoding.engine.run`), once per Model object: a cache keyed by the
object, checked against its params leaves (by identity) and the policy. A function you
jit yourself over `model.decode` should take `pack(model)`: a Model that arrives as a
jit argument unpacked runs XLA's ops.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import unflatten_dict

from specdec_jax import kernels
from specdec_jax.errors import InputError
from specdec_jax.kernels import dispatch
from specdec_jax.models.lm_config import LMConfig
from specdec_jax.models.model import Config, Model, module_for

Array = jax.Array


@functools.lru_cache(maxsize=None)
def products(config: Config) -> tuple[dispatch.Product, ...]:
  """Every product of a decode request (`Model.start`, then a cached `decode`), in call order.

  Found by tracing both abstractly (`jax.eval_shape`) while `dispatch` records the
  products the layers declare: a new layer that calls `dispatch` is listed (and packed)
  with no change here.
  """
  module = module_for(config)
  cls = type(module)
  one = jnp.ones((1, 1), jnp.int32)
  lm = isinstance(config, LMConfig)

  def request(params):
    variables = {"params": params}
    if lm:   # the prefill, then a decode
      cache = module.apply(variables, one, jnp.ones((1,), jnp.int32), 1, method=cls.init_cache)
    else:
      encoded = module.apply(variables, one, method=cls.encode)
      cache = module.apply(variables, encoded, one, 1, method=cls.init_cache)
    return module.apply(variables, one, cache, method=cls.decode)

  dummy = (one,) if lm else (one, one)
  abstract = nn.unbox(jax.eval_shape(module.init, jax.random.PRNGKey(0), *dummy)["params"])
  with dispatch.discovering() as found:
    jax.eval_shape(request, abstract)
  return tuple({p.key: p for p in found}.values())


def pack(tree: Any, policy: dispatch.Policy | None = None) -> Any:
  """Every `Model` in `tree` packed for the kernels (see `pack_model`); the rest as is."""
  return jax.tree_util.tree_map(lambda x: pack_model(x, policy) if isinstance(x, Model) else x,
                                tree, is_leaf=lambda x: isinstance(x, Model))


def pack_model(model: Model, policy: dispatch.Policy | None = None) -> Model:
  """`model` with `decode_weights`: the products `policy` (default `dispatch.policy()`)
  puts on the kernels, packed; the others listed with the reason in `.xla`.

  Returns `model` itself where nothing can be packed: the policy has the kernels off
  (SPECDEC_CPU_KERNELS=0, another backend, no build), params that are tracers or
  abstract (a Model made inside a traced function) or not on one CPU device, or
  `model` is packed already. Cached per Model object (see the module docstring).
  """
  if not isinstance(model, Model):
    raise InputError(f"pack takes a Model (or a pytree of Models), got {type(model).__name__}")
  if model.decode_weights is not None:
    return model
  leaves = jax.tree_util.tree_leaves(model.params)
  if not all(_concrete(x) for x in leaves):
    return model
  policy = dispatch.policy() if policy is None else policy
  key = id(model)
  with _lock:
    entry = _cache.get(key)
  if entry is not None and entry.policy == policy and _same(entry.leaves, leaves):
    return model if entry.packed is None else entry.packed
  packed = _pack(model, policy, leaves)
  with _lock:
    if key not in _cache:
      weakref.finalize(model, _cache.pop, key, None)
    _cache[key] = _Entry(policy, tuple(leaves), None if packed is model else packed)
  return packed


class _Entry(NamedTuple):
  policy: dispatch.Policy
  leaves: tuple          # the params leaves packed from, compared by identity
  packed: Model | None   # None: the model itself (not kept alive by the cache)


_cache: dict[int, _Entry] = {}
_lock = threading.Lock()


def _pack(model: Model, policy: dispatch.Policy, leaves) -> Model:
  if not policy.kernels or not dispatch.on_one_cpu(leaves):
    return model
  tree, xla = {}, []
  with jax.ensure_compile_time_eval():
    for product in products(model.config):
      mats = [_at(model.params, path) for path in product.sources]
      stored = jnp.result_type(*mats) if mats else None
      reason = policy.route(product, stored)
      if reason is not None:
        xla.append((product.name, reason))
      elif product.kind == "attention":
        tree[product.key] = jnp.zeros((0,), jnp.int8)     # no weights: a marker
      elif product.kind == "sum_squares":
        tree[product.key] = kernels.pack(jnp.ones((mats[0].shape[0], 1), jnp.float32))
      else:
        w = mats[0].T if product.transposed else jnp.concatenate(mats, axis=1)
        tree[product.key] = kernels.pack(w, pack_dtype(w, product.dtype))
  weights = dispatch.DecodeWeights(unflatten_dict(tree), tuple(xla), policy)
  return model.replace(decode_weights=weights)


def pack_dtype(w: Array, dtype) -> jnp.dtype:
  """The panels' dtype for weights `w` computed in `dtype` (both float32 or bfloat16).

  bfloat16 where the activations are bfloat16 or the weights are; float32 weights that
  bfloat16 holds exactly (checkpoints stored in bfloat16, such as the bundled demo
  pair, loaded as float32) pack as bfloat16 too: the kernel widens them back to the
  same float32 values and runs the same FMA sequence, so the results are bitwise those
  of float32 panels, from half the bytes (a batch-1 step streams every weight). This
  depends on the values: params moved off the bfloat16 grid repack wide.
  """
  if jnp.dtype(dtype) == jnp.bfloat16 or w.dtype == jnp.bfloat16 or bfloat16_exact(w):
    return jnp.dtype(jnp.bfloat16)
  return jnp.dtype(jnp.float32)


def bfloat16_exact(w: Array) -> bool:
  """Whether bfloat16 holds every float32 value of `w` bit for bit: the low 16 bits are
  zero (a test of the bits, so subnormals and NaN payloads are judged by what the
  kernel will read, whatever the floating-point mode)."""
  return not np.any(np.asarray(w, np.float32).view(np.uint32) & 0xFFFF)


def _at(params, path: tuple[str, ...]) -> Array:
  return functools.reduce(lambda t, k: t[k], path, params)


def _concrete(x) -> bool:
  """A leaf holding values (not a tracer, nor an abstract leaf of AOT lowering)."""
  return isinstance(x, (np.ndarray, jax.Array)) and not isinstance(x, jax.core.Tracer)


def _same(a, b) -> bool:
  return len(a) == len(b) and all(x is y for x, y in zip(a, b))
