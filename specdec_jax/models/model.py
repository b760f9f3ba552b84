"""`Model`: a T5 config plus its parameter pytree, with pure jitted entry points.

`Model` is a pytree (params are leaves, config is static), so it can be passed
through `jax.jit`, `vmap` or `lax.while_loop` like any array container:

    model = sd.init_model(sd.get_config("t5_1_1_tiny"), jax.random.PRNGKey(0))
    logits = model.forward(enc, dec_in)           # [B, Ld, V] float32
    cache = model.start(enc, capacity=32)         # encoder once, cross K/V cached
    logits, cache = model.decode(tok, cache)      # tok [B, k]; writes at cache.length

On a CPU with the decode kernels (`specdec_jax.kernels`), a Model also carries the
weights of its decode requests packed for them (`Model.decode_weights`): built once
per Model from its params, on first use, and passed as extra pytree leaves; `start`
and cached decode calls read them from a separate flax collection, so `params` keeps
T5X's tree.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import flax.linen as nn
from flax.traverse_util import flatten_dict, unflatten_dict
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import cache as cache_lib
from specdec_jax import kernels
from specdec_jax.config import T5Config
from specdec_jax.errors import InputError
from specdec_jax.models import layers
from specdec_jax.models.t5 import Transformer, decode_products

Array = jax.Array


@functools.lru_cache(maxsize=None)
def module_for(config: T5Config) -> Transformer:
  return Transformer(config)


def _apply(model: "Model", *args, method: str, packed: bool = False, **kwargs):
  """`Transformer.<method>` on `model`'s params; `packed`: with its decode weights too."""
  variables = {"params": model.params}
  weights = model.decode_weights if packed else None
  if weights is not None:
    variables[layers.DECODE_WEIGHTS] = weights
  return module_for(model.config).apply(variables, *args, method=getattr(Transformer, method),
                                        **kwargs)


@functools.partial(jax.jit, static_argnames=("deterministic",))
def _forward(model, encoder_tokens, decoder_input_tokens, deterministic=True, rngs=None):
  module = module_for(model.config)
  return module.apply({"params": model.params}, encoder_tokens, decoder_input_tokens,
                      deterministic, rngs=rngs)


@jax.jit
def _encode(model, encoder_tokens):
  return _apply(model, encoder_tokens, method="encode", packed=True)


@functools.partial(jax.jit, static_argnames=("capacity",))
def _start(model, encoder_tokens, capacity):
  return _apply(model, _encode(model, encoder_tokens), encoder_tokens, capacity,
                method="init_cache", packed=True)


@functools.partial(jax.jit, static_argnames=("num_layers",))
def _decode(model, tokens, cache, num_layers=None, positions=None, visible=None):
  return _apply(model, tokens, cache, num_layers, positions, visible, method="decode",
                packed=True)


class _Packed(NamedTuple):
  """A Model's packed decode weights and the param leaves they were packed from."""

  sources: tuple       # tree_leaves(params) at packing time, compared by identity
  weights: Any         # {DECODE_WEIGHTS tree} or None (the model cannot use the kernels)


@dataclasses.dataclass(frozen=True)
class Model:
  """A T5 encoder-decoder: `config` (static) and `params` (T5X tree names).

  A pytree whose leaves are `params`, then `decode_weights` when there are any.
  """

  config: T5Config = struct.field(pytree_node=False)
  params: Any

  def replace(self, **updates) -> "Model":
    """A new Model with fields replaced (its decode weights are packed anew, when used)."""
    return dataclasses.replace(self, **updates)

  @property
  def decode_weights(self) -> Any | None:
    """The kernels of decode requests (`start`, cached `decode`) packed for the CPU
    skinny products, or None.

    A tree in the `layers.DECODE_WEIGHTS` collection's layout (`t5.decode_products`).
    Built on first use (the first jit call that takes this Model) from the current
    params, then kept on this Model: it is never recomputed per call, and a Model
    made by `replace`, `astype` or `with_dtype` is a new Model that packs its own.
    Packed weights can never be stale: they are used only while every params leaf
    is the very array they were packed from (assigning into the params dict in
    place re-packs). None where the kernels are off or unavailable
    (`kernels.status()`), for float16, for params not on one CPU device, and for a
    Model made inside a traced function (those run XLA's dot). The packed dtype can
    depend on the values (`pack_decode_weights`: bfloat16-exact float32 weights pack
    narrow), so params moved off the bfloat16 grid (fine-tuning) repack wide: a new
    pytree structure for jit (one recompile) and for an AOT-compiled function.
    """
    if not kernels.available():
      return None
    leaves = jax.tree_util.tree_leaves(self.params)
    cached = self.__dict__.get("_packed")
    if cached is not None and _same_arrays(cached.sources, leaves):
      return cached.weights
    if not all(_concrete(x) for x in leaves):
      return None   # tracers, or abstract leaves (ShapeDtypeStruct, a lowering's ArgInfo)
    with jax.ensure_compile_time_eval():
      weights = pack_decode_weights(self.config, self.params) if _on_one_cpu(leaves) else None
    object.__setattr__(self, "_packed", _Packed(tuple(leaves), weights))
    return weights

  @property
  def width_invariant_decode(self) -> bool:
    """Whether a cached decode call computes each of its k tokens by the ops of a
    1-token call: a k-token call's logits are then bitwise k sequential 1-token calls.

    True with packed decode weights (`decode_weights`): every product is a skinny
    kernel with a fixed per-element accumulation order, and attention a kernel that
    computes every query row alike (`kernels.attention`). XLA's dot picks other
    kernels for k >= 2 rows than for 1, so without them rows round differently (the
    engine's exact mode then pads every call to one width, `engine.EXACT_WIDTH`).
    """
    return self.decode_weights is not None

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def forward(self, encoder_tokens: Array, decoder_input_tokens: Array) -> Array:
    """Full non-cached pass: [B, Le], [B, Ld] int32 -> logits float32 [B, Ld, V]."""
    check_tokens(encoder_tokens, self.config, "encoder_tokens")
    check_tokens(decoder_input_tokens, self.config, "decoder_input_tokens")
    return _forward(self, jnp.asarray(encoder_tokens, jnp.int32),
                    jnp.asarray(decoder_input_tokens, jnp.int32))

  def encode(self, encoder_tokens: Array) -> Array:
    """[B, Le] int32 -> encoder output [B, Le, E]."""
    return _encode(self, encoder_tokens)

  def start(self, encoder_tokens: Array, capacity: int) -> cache_lib.DecoderCache:
    """Run the encoder once and build an empty decoder cache of `capacity` positions."""
    return _start(self, encoder_tokens, capacity)

  def decode(self, tokens: Array, cache: cache_lib.DecoderCache, *,
             exit_layer: int | None = None) -> tuple[Array, cache_lib.DecoderCache]:
    """k tokens per row at offsets `cache.length`: tokens [B, k] -> (logits f32 [B, k, V], cache).

    The returned cache has `length + k`; roll back with `cache.with_length(...)`.
    `exit_layer`: read the logits after that many decoder layers (shared final norm
    and output layer: an early exit); only those layers' buffers are written.
    """
    logits, _, cache = _decode(self, tokens, cache, exit_layer)
    return logits, cache

  def decode_with_hidden(self, tokens: Array, cache: cache_lib.DecoderCache, *,
                         positions: Array | None = None, visible: Array | None = None
                         ) -> tuple[Array, Array, cache_lib.DecoderCache]:
    """`decode` that also returns the final-norm decoder states [B, k, E] (what the
    output layer reads; prediction heads draft from them).

    `positions` [B, k] / `visible` [B | 1, k, k]: the k new tokens form a tree (several
    drafts after one shared token; see `cache.tree_mask`).
    """
    return _decode(self, tokens, cache, None, positions, visible)

  def exit_logits(self, encoder_tokens: Array, decoder_input_tokens: Array,
                  exits: tuple[int, ...], deterministic: bool = True, rngs=None):
    """Teacher-forced logits read after each of `exits` decoder layers: a tuple of [B, Ld, V]."""
    return module_for(self.config).apply({"params": self.params}, encoder_tokens,
                                         decoder_input_tokens, tuple(exits), deterministic,
                                         method=Transformer.exit_logits, rngs=rngs)

  def output_logits(self, hidden: Array) -> Array:
    """The output layer alone: final-norm decoder states [..., E] -> logits float32 [..., V]."""
    return _apply(self, hidden, method="output_logits")

  def hidden_states(self, encoder_tokens: Array, decoder_input_tokens: Array,
                    deterministic: bool = True, rngs=None) -> Array:
    """Teacher-forced final-norm decoder states [B, Ld, E] (prediction heads read them)."""
    return module_for(self.config).apply({"params": self.params}, encoder_tokens,
                                         decoder_input_tokens, deterministic,
                                         method=Transformer.hidden_states, rngs=rngs)

  def num_params(self) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(self.params))

  def with_dtype(self, dtype) -> "Model":
    """Compute in `dtype`: floating params cast to it AND activations in it (config.dtype).
    Attention and output logits stay float32 whatever the dtype."""
    return self.astype(dtype).replace(config=self.config.replace(dtype=jnp.dtype(dtype).name))

  def astype(self, dtype) -> "Model":
    """Cast floating parameters only (e.g. to bfloat16 for storage); see `with_dtype`."""
    dtype = jnp.dtype(dtype)
    params = jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, self.params)
    return self.replace(params=params)


def _concrete(x) -> bool:
  """A leaf holding values (not a tracer, nor an abstract leaf of AOT lowering)."""
  return isinstance(x, (np.ndarray, jax.Array)) and not isinstance(x, jax.core.Tracer)


def _same_arrays(a, b) -> bool:
  return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _on_one_cpu(leaves) -> bool:
  for x in leaves:
    if isinstance(x, jax.Array) and not all(d.platform == "cpu" for d in x.sharding.device_set):
      return False
    if isinstance(x, jax.Array) and len(x.sharding.device_set) != 1:
      return False
  return True


def pack_decode_weights(config: T5Config, params) -> Any | None:
  """The decode-request products (`t5.decode_products`) packed for `kernels.dot`, or None.

  Each weight is packed in the dtype its layer computes in: bfloat16 where the
  activations are bfloat16 or the params are (kind "bf16cvt"), else float32 -- but
  float32 weights whose every value bfloat16 holds exactly (checkpoints stored in
  bfloat16, such as the bundled demo pair, loaded as float32) pack as bfloat16 too:
  the kernel widens them back to the same float32 values and runs the same FMA
  sequence, so the results are bitwise those of float32 panels, from half the bytes
  (a batch-1 step streams every weight: 2x less memory traffic).
  None for float16 activations or params (no kernel for them).
  """
  if config.activation_dtype not in (jnp.float32, jnp.bfloat16):
    return None
  tree = {}
  for path, product in decode_products(config).items():
    mats = [functools.reduce(lambda t, k: t[k], p, params) for p in product.sources]
    if product.sum_of_squares:
      tree[path] = kernels.pack(jnp.ones((mats[0].shape[0], 1), jnp.float32))
      continue
    stored = jnp.result_type(*mats)
    if product.dtype == jnp.bfloat16 or stored == jnp.bfloat16:
      dtype = jnp.bfloat16
    elif stored == jnp.float32:
      dtype = jnp.float32
    else:
      return None
    w = mats[0].T if product.transposed else jnp.concatenate(mats, axis=1)
    if dtype == jnp.float32 and _bfloat16_exact(w):
      dtype = jnp.bfloat16
    tree[path] = kernels.pack(w, dtype)
  return unflatten_dict(tree)


def _bfloat16_exact(w: Array) -> bool:
  """Whether bfloat16 holds every float32 value of `w` bit for bit: the low 16 bits are
  zero (a test of the bits, so subnormals and NaN payloads are judged by what the
  kernel will read, whatever the floating-point mode)."""
  return not np.any(np.asarray(w, np.float32).view(np.uint32) & 0xFFFF)


def _flatten_with_keys(model: Model):
  weights = model.decode_weights
  children = [(jax.tree_util.GetAttrKey("params"), model.params)]
  if weights is not None:
    children.append((jax.tree_util.GetAttrKey("decode_weights"), weights))
  return children, (model.config, weights is not None)


def _flatten(model: Model):
  children, aux = _flatten_with_keys(model)
  return [c for _, c in children], aux


def _unflatten(aux, children) -> Model:
  """Decode weights survive unflattening only as tracers or abstract leaves (a jit or
  while-loop argument, `jit(f).lower(model, ...)`): concrete leaves may have been
  mapped by any function, so a concrete Model re-packs."""
  config, has_weights = aux
  model = object.__new__(Model)
  object.__setattr__(model, "config", config)
  object.__setattr__(model, "params", children[0])
  if has_weights:
    weights = children[1]
    if not any(_concrete(x) for x in jax.tree_util.tree_leaves(weights)):
      leaves = tuple(jax.tree_util.tree_leaves(children[0]))
      object.__setattr__(model, "_packed", _Packed(leaves, weights))
  return model


jax.tree_util.register_pytree_with_keys(Model, _flatten_with_keys, _unflatten, _flatten)


def init_model(config: T5Config, rng: Array | int = 0, dtype=None) -> Model:
  """Randomly initialised model (T5X-style initialisers).

  dtype None or float32: one flax init, float32 params (the reproducible default).
  Another dtype (e.g. bfloat16): every parameter is drawn on its own, straight into
  `dtype` on the default device, and the activations use it too: peak memory is the
  model in `dtype` plus one float32 parameter, where one jitted init holds several
  float32 copies of the whole model (2.7x its float32 size for T5 1.1 large on CPU).
  The values differ from the float32 init's (other keys), the distributions do not.
  """
  if isinstance(rng, int):
    rng = jax.random.PRNGKey(rng)
  module = module_for(config)
  dummy = jnp.ones((1, 2), jnp.int32)
  if dtype is None or jnp.dtype(dtype) == jnp.float32:
    variables = jax.jit(module.init)(rng, dummy, dummy)
    return Model(config=config, params=nn.unbox(variables["params"]))
  abstract = flatten_dict(nn.unbox(jax.eval_shape(module.init, rng, dummy, dummy)["params"]))
  params = {}
  for key, (path, leaf) in zip(jax.random.split(rng, len(abstract)), sorted(abstract.items())):
    params[path] = _init_leaf(layers.initializer_for(path, config.head_dim), key, leaf.shape,
                              jnp.dtype(dtype))
  return Model(config=config.replace(dtype=jnp.dtype(dtype).name), params=unflatten_dict(params))


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _init_leaf(init, key: Array, shape: tuple[int, ...], dtype) -> Array:
  return init(key, shape, jnp.float32).astype(dtype)


def logical_axes(config: T5Config) -> Any:
  """Pytree of logical axis-name tuples, matching the params tree (T5X names)."""
  module = module_for(config)
  dummy = jnp.ones((1, 2), jnp.int32)
  abstract = jax.eval_shape(module.init, jax.random.PRNGKey(0), dummy, dummy)
  return nn.get_partition_spec(abstract["params"])


def check_tokens(tokens, config: T5Config, name: str) -> None:
  """Clear errors for the malformed token arrays users most often pass."""
  shape = getattr(tokens, "shape", None)
  if shape is None or len(shape) != 2:
    raise InputError(f"{name} must be a 2-D int array [batch, length], got shape {shape}")
  if shape[0] < 1 or shape[1] < 1:
    raise InputError(f"{name} must have a non-empty batch and length, got shape {shape}")
  dtype = jnp.asarray(tokens).dtype if not hasattr(tokens, "dtype") else tokens.dtype
  if not jnp.issubdtype(dtype, jnp.integer):
    raise InputError(f"{name} must hold integer token ids, got dtype {dtype}")
  if isinstance(tokens, jax.core.Tracer):
    return
  import numpy as np
  arr = np.asarray(tokens)
  if arr.size and (arr.min() < 0 or arr.max() >= config.vocab_size):
    raise InputError(f"{name} has token ids outside [0, {config.vocab_size}) "
                     f"(min {arr.min()}, max {arr.max()})")
