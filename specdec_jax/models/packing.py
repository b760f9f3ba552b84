"""Packing: a Model's decode products laid out for one kernel backend, as an explicit step.

    packed = sd.pack(model, kernels="auto")   # "auto" | "cpu" | "gpu" | "xla"
    packed.decode_weights.policy.backend      # the backend chosen ("auto": backends.choose)
    packed.decode_weights.xla                 # ((product, why it stays on XLA), ...)
    sd.pack((target, drafter))                # every Model in a pytree

`products(config)` lists the products of a decode request by tracing one (abstractly):
every product a layer routes through `kernels.dispatch` is found, none is named here.
`pack` asks the dispatch `Policy` which of them run on the backend's kernels and packs
their weights (`backends.Backend.pack`); the packed Model carries them as pytree leaves
(`dispatch.Packed`, which names the backend), so a jitted function that takes it runs
its decode requests on those kernels. An unpacked Model runs XLA's ops.

On a mesh (a Model placed by `sd.shard` or `sd.load(mesh=)`, then packed with a backend
named: "auto" keeps XLA there) each weight is packed block by block, as its parameters
are split (`dispatch.Layout`): the kernels run inside `shard_map`, each device on its
own block.

Nothing packs implicitly: `sd.load` packs what it loads (its `kernels=`), `sd.pack`
packs what it is given, every call (no memo: keep the packed Model). A Model whose
params change (`Model.replace`) comes back unpacked.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import unflatten_dict
from jax.sharding import NamedSharding, PartitionSpec

from specdec_jax.config.lm import LMConfig
from specdec_jax.errors import InputError
from specdec_jax.kernels import backends, dispatch
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


def _untaken(config: Any, backend: backends.Backend) -> tuple[str, str] | None:
  """(what the backend's attention kernel lacks, what of `config` needs it) for an
  attention `config` has and the kernel does not take (`kernels.shapes`); None if none."""
  if getattr(config, "windowed", False) and not backend.windows:
    return "sliding window", "sliding-window layers (Gemma 4)"
  cap = getattr(config, "attn_logit_softcap", None)
  if cap is not None and not backend.softcaps:
    return "attention-logit soft-cap", f"soft-capped attention logits (attn_logit_softcap {cap})"
  return None


def pack(tree: Any, policy: dispatch.Policy | None = None, *, kernels: str = "auto") -> Any:
  """Every `Model` in `tree` packed for the kernels (see `pack_model`); the rest as is."""
  return jax.tree_util.tree_map(
      lambda x: pack_model(x, policy, kernels=kernels) if isinstance(x, Model) else x,
      tree, is_leaf=lambda x: isinstance(x, Model))


def pack_model(model: Model, policy: dispatch.Policy | None = None, *,
               kernels: str = "auto") -> Model:
  """`model` with `decode_weights` for the backend `kernels` names ("auto", "cpu", "gpu",
  "xla"; `dispatch.policy`) or `policy` gives: the products it puts on its kernels,
  packed; the others listed with the reason in `.xla`.

  A Model packed under the same policy already comes back as is; under another, it is
  repacked from its params. A model with sliding-window layers (Gemma 4) or soft-capped
  attention logits (`attn_logit_softcap`) packs only for a backend whose attention takes
  them (cpu): "auto" chooses "xla" instead of another, and naming another (gpu, tpu) is
  an `InputError`.
  Raises `InputError` for params that are tracers or abstract
  (pack outside a traced function) and for a backend that cannot run here.
  """
  if not isinstance(model, Model):
    raise InputError(f"pack takes a Model (or a pytree of Models), got {type(model).__name__}")
  if not all(_concrete(x) for x in jax.tree_util.tree_leaves(model.params)):
    raise InputError("pack needs concrete params: pack the Model before tracing a function "
                     "of it (a jit argument's params are tracers)")
  named = policy is not None or kernels != "auto"
  policy = dispatch.policy(kernels, model.params) if policy is None else policy
  untaken = _untaken(model.config, backends.get(policy.backend)) if policy.kernels else None
  if untaken is not None:
    takes_no, has = untaken
    if named:
      raise InputError(f"kernels={policy.backend!r}: the {policy.backend} attention kernel "
                       f"takes no {takes_no}, and this model has {has}: use kernels='cpu', "
                       "'xla' or 'auto'")
    policy = dispatch.Policy("xla", f"auto: {has} (the {policy.backend} attention kernel "
                             f"takes no {takes_no})", policy.xla)
  if model.decode_weights is not None and model.decode_weights.policy == policy:
    return model
  backend = backends.get(policy.backend)
  tree, xla, packed = {}, [], []
  # found outside compile-time eval: inside it, tracing would run the init eagerly
  found = products(model.config)
  with jax.ensure_compile_time_eval():
    for product in found:
      mats = [_at(model.params, path) for path in product.sources]
      stored = jnp.result_type(*mats) if mats else None
      reason = policy.route(product, stored)
      if reason is not None:
        xla.append((product.name, reason))
        continue
      layout = _layout(model, product, mats)
      if product.kind == "attention":
        operand = jnp.zeros((0,), jnp.int8)     # no weights: a marker
      elif product.kind == "sum_squares":
        width = mats[0].shape[0] if mats else product.width   # a norm without a scale
        operand = backend.kernel("pack")(jnp.ones((width, 1), jnp.float32), jnp.float32)
        if layout is not None:   # one block, on every device
          operand = jax.device_put(operand[None, None],
                                   NamedSharding(layout.mesh, PartitionSpec()))
      elif layout is not None:
        operand = _blocks(backend, product, mats, layout)
      else:
        w = mats[0].T if product.transposed else jnp.concatenate(mats, axis=1)
        operand = backend.kernel("pack")(w, product.dtype)
      tree[product.key] = dispatch.Packed(operand, policy.backend, layout)
      packed.append(product)
  weights = dispatch.DecodeWeights(unflatten_dict(tree), tuple(xla), policy, tuple(packed))
  return model.replace(decode_weights=weights)


def _mesh(model: Model):
  """The mesh `model`'s params are split over (its partitioner's), or None on one device."""
  if model.partitioner is not None:
    return model.partitioner.mesh
  for x in jax.tree_util.tree_leaves(model.params):
    where = getattr(x, "sharding", None)
    if isinstance(where, NamedSharding) and len(where.device_set) > 1:
      return where.mesh
  return None


def _rule(model: Model, logical: str) -> str | None:
  """The mesh axis the first rule for `logical` maps to (None: no rule or replicated)."""
  rules = model.partitioner.rules if model.partitioner is not None else ()
  return next((axis for name, axis in rules if name == logical), None)


def _axis(spec, dim: int) -> str | None:
  """The one mesh axis dimension `dim` of a PartitionSpec is split over (None: whole or
  split over several axes, which the blocks do not follow: that dimension is gathered)."""
  entry = spec[dim] if dim < len(spec) else None
  return entry if isinstance(entry, str) else None


def _layout(model: Model, product: dispatch.Product, mats) -> dispatch.Layout | None:
  """Where `product` runs on `model`'s mesh (None on one device): batch over the "batch"
  rule's axis; a "dot" split as its weights are (its joined matrices split alike, else
  gathered whole); an attention's heads over the "heads" rule's axis."""
  mesh = _mesh(model)
  if mesh is None:
    return None
  batch = _rule(model, "batch")
  if product.kind == "attention":
    return dispatch.Layout(mesh, batch, None, _rule(model, "heads"))
  if product.kind != "dot":
    return dispatch.Layout(mesh, batch)
  specs = {tuple(getattr(getattr(m, "sharding", None), "spec", ())) for m in mats}
  spec = specs.pop() if len(specs) == 1 else ()
  k, n = (_axis(spec, 1), _axis(spec, 0)) if product.transposed else (_axis(spec, 0),
                                                                       _axis(spec, 1))
  widths = tuple(m.shape[0] if product.transposed else m.shape[1] for m in mats)
  return dispatch.Layout(mesh, batch, k, n, widths)


def _blocks(backend, product: dispatch.Product, mats, layout: dispatch.Layout) -> Array:
  """The packed blocks of a "dot" on a mesh: block (i, j) = rows i of K and columns j of
  each joined matrix, packed alone; stacked [size(k), size(n), *packed] and split over
  (k, n), so each device holds its own block."""
  sk, sn = layout.size(layout.k), layout.size(layout.n)
  ws = [m.T if product.transposed else m for m in mats]
  rows = ws[0].shape[0] // sk

  def block(i, j):
    cols = [w[i * rows:(i + 1) * rows, j * (w.shape[1] // sn):(j + 1) * (w.shape[1] // sn)]
            for w in ws]
    return backend.kernel("pack")(jnp.concatenate(cols, axis=1), product.dtype)

  stacked = jnp.stack([jnp.stack([block(i, j) for j in range(sn)]) for i in range(sk)])
  return jax.device_put(stacked, NamedSharding(layout.mesh, PartitionSpec(layout.k, layout.n)))


def _at(params, path: tuple[str, ...]) -> Array:
  return functools.reduce(lambda t, k: t[k], path, params)


def _concrete(x) -> bool:
  """A leaf holding values (not a tracer, nor an abstract leaf of AOT lowering)."""
  return isinstance(x, (np.ndarray, jax.Array)) and not isinstance(x, jax.core.Tracer)
