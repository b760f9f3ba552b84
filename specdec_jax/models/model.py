"""`Model`: a T5 config plus its parameter pytree, with pure jitted entry points.

`Model` is a pytree (params are leaves, config is static), so it can be passed
through `jax.jit`, `vmap` or `lax.while_loop` like any array container:

    model = sd.init_model(sd.get_config("t5_1_1_tiny"), jax.random.PRNGKey(0))
    logits = model.forward(enc, dec_in)           # [B, Ld, V] float32
    cache = model.start(enc, capacity=32)         # encoder once, cross K/V cached
    logits, cache = model.decode(tok, cache)      # tok [B, k]; writes at cache.length

Decode requests (`start`, cached `decode`) run each product on a CPU kernel or on
XLA's ops as `specdec_jax.kernels.dispatch` decides; the kernels read weights packed
for them by an explicit step, `sd.pack(model)` (`models.packing`), which returns a
Model carrying them in `decode_weights`. `start` / `decode` pack on the fly when given
an unpacked Model outside a trace; `params` keeps T5X's tree either way.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
from flax.traverse_util import flatten_dict, unflatten_dict
import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax import cache as cache_lib
from specdec_jax.config import T5Config
from specdec_jax.errors import InputError
from specdec_jax.kernels import dispatch
from specdec_jax.models import layers
from specdec_jax.models.t5 import Transformer

Array = jax.Array


@functools.lru_cache(maxsize=None)
def module_for(config: T5Config) -> Transformer:
  return Transformer(config)


def _apply(model: "Model", *args, method: str, packed: bool = False, **kwargs):
  """`Transformer.<method>` on `model`'s params; `packed`: with its decode weights too."""
  variables = {"params": model.params}
  if packed and model.decode_weights is not None:
    variables[dispatch.COLLECTION] = model.decode_weights.weights
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


@dataclasses.dataclass(frozen=True)
class Model:
  """A T5 encoder-decoder: `config` (static), `params` (T5X tree names) and, once
  packed (`pack`), `decode_weights` (`dispatch.DecodeWeights`; None when unpacked).

  A pytree whose leaves are `params`, then the packed weights' (none when unpacked).
  """

  config: T5Config = struct.field(pytree_node=False)
  params: Any
  decode_weights: Any = None

  def replace(self, **updates) -> "Model":
    """A new Model with fields replaced; new params or config drop the packed weights."""
    if ("params" in updates or "config" in updates) and "decode_weights" not in updates:
      updates["decode_weights"] = None
    return dataclasses.replace(self, **updates)

  def pack(self, policy: dispatch.Policy | None = None) -> "Model":
    """This Model with its decode products packed for the CPU kernels (`packing.pack_model`)."""
    from specdec_jax.models import packing
    return packing.pack_model(self, policy)

  @property
  def width_invariant_decode(self) -> bool:
    """Whether a cached decode call computes each of its k tokens by the ops of a
    1-token call: a k-token call's logits are then bitwise k sequential 1-token calls.

    True when every product of the decode runs on a kernel (`dispatch.width_invariant`:
    a packed Model with no product left on XLA). XLA's dot picks other kernels for
    k >= 2 rows than for 1 (the engine's exact mode then pads every call to one width).
    """
    return dispatch.width_invariant(self)

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
    return _encode(self.pack(), encoder_tokens)

  def start(self, encoder_tokens: Array, capacity: int) -> cache_lib.DecoderCache:
    """Run the encoder once and build an empty decoder cache of `capacity` positions."""
    return _start(self.pack(), encoder_tokens, capacity)

  def decode(self, tokens: Array, cache: cache_lib.DecoderCache, *,
             exit_layer: int | None = None) -> tuple[Array, cache_lib.DecoderCache]:
    """k tokens per row at offsets `cache.length`: tokens [B, k] -> (logits f32 [B, k, V], cache).

    The returned cache has `length + k`; roll back with `cache.with_length(...)`.
    `exit_layer`: read the logits after that many decoder layers (shared final norm
    and output layer: an early exit); only those layers' buffers are written.
    """
    logits, _, cache = _decode(self.pack(), tokens, cache, exit_layer)
    return logits, cache

  def decode_with_hidden(self, tokens: Array, cache: cache_lib.DecoderCache, *,
                         positions: Array | None = None, visible: Array | None = None
                         ) -> tuple[Array, Array, cache_lib.DecoderCache]:
    """`decode` that also returns the final-norm decoder states [B, k, E] (what the
    output layer reads; prediction heads draft from them).

    `positions` [B, k] / `visible` [B | 1, k, k]: the k new tokens form a tree (several
    drafts after one shared token; see `cache.tree_mask`).
    """
    return _decode(self.pack(), tokens, cache, None, positions, visible)

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


def _flatten_with_keys(model: Model):
  children = [(jax.tree_util.GetAttrKey("params"), model.params),
              (jax.tree_util.GetAttrKey("decode_weights"), model.decode_weights)]
  return children, model.config


def _flatten(model: Model):
  return [model.params, model.decode_weights], model.config


def _unflatten(config, children) -> Model:
  model = object.__new__(Model)
  object.__setattr__(model, "config", config)
  object.__setattr__(model, "params", children[0])
  object.__setattr__(model, "decode_weights", children[1])
  return model


jax.tree_util.register_pytree_with_keys(Model, _flatten_with_keys, _unflatten, _flatten)


def init_model(config: T5Config, rng: Array | int = 0, dtype=None, shardings: Any = None) -> Model:
  """Randomly initialised model (T5X-style initialisers).

  dtype None or float32: one flax init, float32 params (the reproducible default).
  Another dtype (e.g. bfloat16): every parameter is drawn on its own, straight into
  `dtype` on the default device, and the activations use it too: peak memory is the
  model in `dtype` plus one float32 parameter, where one jitted init holds several
  float32 copies of the whole model (2.7x its float32 size for T5 1.1 large on CPU).
  The values differ from the float32 init's (other keys), the distributions do not.
  shardings: a tree like the params of `jax.sharding.Sharding`s (`sd.sharding`): each
  parameter is computed straight into its shards (the init jitted with those output
  shardings); the values are the unsharded init's.
  """
  if isinstance(rng, int):
    rng = jax.random.PRNGKey(rng)
  module = module_for(config)
  dummy = jnp.ones((1, 2), jnp.int32)
  if dtype is None or jnp.dtype(dtype) == jnp.float32:
    if shardings is None:
      variables = jax.jit(module.init)(rng, dummy, dummy)
      return Model(config=config, params=nn.unbox(variables["params"]))
    init = jax.jit(lambda r: nn.unbox(module.init(r, dummy, dummy)["params"]),
                   out_shardings=shardings)
    return Model(config=config, params=init(rng))
  abstract = flatten_dict(nn.unbox(jax.eval_shape(module.init, rng, dummy, dummy)["params"]))
  where = flatten_dict(shardings) if shardings is not None else {}
  params = {}
  for key, (path, leaf) in zip(jax.random.split(rng, len(abstract)), sorted(abstract.items())):
    params[path] = _init_leaf(layers.initializer_for(path, config.head_dim), key, leaf.shape,
                              jnp.dtype(dtype), where.get(path))
  return Model(config=config.replace(dtype=jnp.dtype(dtype).name), params=unflatten_dict(params))


@functools.partial(jax.jit, static_argnums=(0, 2, 3, 4))
def _init_leaf(init, key: Array, shape: tuple[int, ...], dtype, sharding=None) -> Array:
  x = init(key, shape, jnp.float32).astype(dtype)
  return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)




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
