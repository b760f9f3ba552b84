"""`Model`: a config plus its parameter pytree, with pure jitted entry points.

`Model` is a pytree (params are leaves, config is static), so it can be passed
through `jax.jit`, `vmap` or `lax.while_loop` like any array container:

    model = sd.init_model(sd.get_config("t5_1_1_tiny"), jax.random.PRNGKey(0))
    logits = model.forward(enc, dec_in)           # [B, Ld, V] float32
    cache = model.start(enc, capacity=32)         # encoder once, cross K/V cached
    logits, cache = model.decode(tok, cache)      # tok [B, k]; writes at cache.length

The same class holds a decoder-only LM (an `LMConfig`: GPT-2, Llama; `models.lm`), whose
calls take the prompt where T5's take the encoder input:

    lm = sd.init_model(sd.get_config("llama_tiny"))
    logits = lm.forward(tokens)                   # [B, L] -> [B, L, V] float32
    cache = lm.start(prompt, capacity=64)         # prefill; right-padded prompt [B, P]
    tok = lm.first_tokens(prompt)[:, None]        # [B, 1]: each row's last prompt token
    logits, cache = lm.decode(tok, cache)

Decode requests (`start`, cached `decode`) run each product on a kernel or on XLA's ops
as `specdec_jax.kernels.dispatch` decides; the kernels read weights packed for one
backend (cpu, gpu; `kernels.backends`) by an explicit step, `sd.pack(model, kernels=)`
or `sd.load(..., kernels=)` (`models.packing`), which returns a Model carrying them in
`decode_weights`. An unpacked Model (`init_model`'s) runs XLA's ops; `params` keeps
T5X's tree either way.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from flax.traverse_util import flatten_dict, unflatten_dict

from specdec_jax import cache as cache_lib
from specdec_jax.config import T5Config
from specdec_jax.config.gemma import GemmaConfig
from specdec_jax.config.lm import LMConfig
from specdec_jax.config.t5gemma2 import T5Gemma2Config
from specdec_jax.errors import ConfigError, InputError
from specdec_jax.kernels import dispatch
from specdec_jax.models import gemma, layers, lm, t5gemma2
from specdec_jax.models.t5 import Transformer

Array = jax.Array
Config = T5Config | LMConfig


@functools.lru_cache(maxsize=None)
def module_for(config: Config, partitioner: Any = None
               ) -> Transformer | t5gemma2.T5Gemma2 | lm.DecoderOnly:
  """The flax module of `config`: T5's `Transformer` (`t5gemma2.T5Gemma2` for a
  T5Gemma2Config), or `lm.DecoderOnly` for an LMConfig.

  partitioner: a `sd.sharding.Partitioner` its layers constrain their activations by
  (None: no constraint, the one-device program).
  """
  if isinstance(config, GemmaConfig):
    return gemma.GemmaLM(config, partitioner)
  if isinstance(config, LMConfig):
    return lm.DecoderOnly(config, partitioner)
  if isinstance(config, T5Gemma2Config):
    return t5gemma2.T5Gemma2(config, partitioner)
  return Transformer(config, partitioner)


def _apply(model: "Model", *args, method: str, packed: bool = False, **kwargs):
  """`<module>.<method>` on `model`'s params; `packed`: with its decode weights too."""
  variables = {"params": model.params}
  if packed and model.decode_weights is not None:
    variables[dispatch.COLLECTION] = model.decode_weights.weights
  module = module_for(model.config, model.partitioner)
  return module.apply(variables, *args, method=getattr(type(module), method), **kwargs)


@functools.partial(jax.jit, static_argnames=("deterministic",))
def _forward(model, tokens: tuple, deterministic=True, rngs=None):
  """tokens: (inputs, decoder_input_tokens) for T5, (tokens,) for an LM."""
  module = module_for(model.config, model.partitioner)
  return module.apply({"params": model.params}, *tokens, deterministic, rngs=rngs)


@jax.jit
def _encode(model, inputs):
  return _apply(model, inputs, method="encode", packed=True)


@functools.partial(jax.jit, static_argnames=("capacity",))
def _start(model, inputs, capacity):
  return _apply(model, _encode(model, inputs), inputs, capacity,
                method="init_cache", packed=True)


@functools.partial(jax.jit, static_argnames=("capacity",))
def _prefill(model, tokens, lengths, capacity):
  return _apply(model, tokens, lengths, capacity, method="init_cache", packed=True)


@functools.partial(jax.jit, static_argnames=("num_layers",))
def _decode(model, tokens, cache, num_layers=None, positions=None, visible=None):
  return _apply(model, tokens, cache, num_layers, positions, visible, method="decode",
                packed=True)


@dataclasses.dataclass(frozen=True)
class Model:
  """A T5 encoder-decoder or a decoder-only LM: `config` (static; `T5Config` or `LMConfig`),
  `params` (T5X tree names), once packed (`sd.pack`) `decode_weights`
  (`dispatch.DecodeWeights`; None when unpacked), and once placed on a mesh
  (`sd.shard`, `sd.load(mesh=)`) its `partitioner` (static; `sd.sharding.Partitioner`:
  the mesh and rules its activations are constrained by; None on one device).

  A pytree whose leaves are `params`, then the packed weights' (none when unpacked).
  """

  # dataclasses.field (struct.field's result): mypy then sees that config has no default
  config: Config = dataclasses.field(metadata={"pytree_node": False})
  params: Any
  decode_weights: Any = None
  partitioner: Any = struct.field(pytree_node=False, default=None)

  def replace(self, **updates) -> "Model":
    """A new Model with fields replaced; new params or config drop the packed weights."""
    if ("params" in updates or "config" in updates) and "decode_weights" not in updates:
      updates["decode_weights"] = None
    return dataclasses.replace(self, **updates)

  @property
  def width_invariant_decode(self) -> bool:
    """Whether a cached decode call computes each of its k tokens by the ops of a
    1-token call: a k-token call's logits are then bitwise k sequential 1-token calls.

    True when every product of the decode runs on a kernel its backend makes invariant
    (`dispatch.width_invariant`: packed for cpu or gpu, no product left on XLA). XLA's
    dot picks other kernels for k >= 2 rows than for 1 (the engine's exact mode then
    pads every call to one width).
    """
    return dispatch.width_invariant(self)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def is_decoder_only(self) -> bool:
    """True for a decoder-only LM (`LMConfig`), False for a T5 encoder-decoder."""
    return isinstance(self.config, LMConfig)

  def _tokens(self, inputs, decoder_input_tokens) -> tuple[Array, ...]:
    """The token arrays of a full pass, checked: (enc, dec) for T5, (tokens,) for an LM."""
    if self.is_decoder_only:
      if decoder_input_tokens is not None:
        raise InputError("a decoder-only model's forward takes one token array [B, L], "
                         "got two")
      check_tokens(inputs, self.config, "tokens")
      return (jnp.asarray(inputs, jnp.int32),)
    if decoder_input_tokens is None:
      raise InputError("a T5 model's forward takes inputs and decoder_input_tokens")
    check_tokens(inputs, self.config, "inputs")
    check_tokens(decoder_input_tokens, self.config, "decoder_input_tokens")
    return (jnp.asarray(inputs, jnp.int32), jnp.asarray(decoder_input_tokens, jnp.int32))

  def forward(self, inputs: Array, decoder_input_tokens: Array | None = None) -> Array:
    """Full non-cached pass: [B, Le], [B, Ld] int32 -> logits float32 [B, Ld, V].

    A decoder-only model takes one array: `forward(tokens [B, L])` -> [B, L, V] (causal).
    """
    return _forward(self, self._tokens(inputs, decoder_input_tokens))

  def encode(self, inputs: Array) -> Array:
    """[B, Le] int32 -> encoder output [B, Le, E]."""
    if self.is_decoder_only:
      raise InputError("a decoder-only model has no encoder: use start(prompt, capacity)")
    return _encode(self, inputs)

  def start(self, inputs: Array, capacity: int,
            lengths: Array | np.ndarray | None = None) -> cache_lib.DecoderCache:
    """The cache a request decodes from, of `capacity` self-attention positions.

    T5: run the encoder once over `inputs` [B, Le] (cross K/V cached; the decoder
    part empty). A decoder-only model: prefill the right-padded prompt [B, P] (`lengths`
    [B]: default `lm.prompt_lengths`, one past each row's last non-pad token); the cache
    then holds each row's prompt but its last token, which `first_tokens` gives.
    """
    if not isinstance(self.config, LMConfig):
      if lengths is not None:
        raise InputError("lengths= is for decoder-only prompts; a T5 encoder input is masked "
                         "by its pad tokens")
      return _start(self, inputs, capacity)
    check_tokens(inputs, self.config, "prompt tokens")
    lengths = lm.check_prompt(inputs, lengths, capacity, self.config)
    return _prefill(self, jnp.asarray(inputs, jnp.int32),
                    jnp.asarray(lengths, jnp.int32), capacity)

  def decode_capacity(self, new_positions: int, prompt_width: int) -> int:
    """Cache slots of a decode of `new_positions` slots after its input: T5's decoder
    cache holds the decode alone; a decoder-only model's holds its prompt buffer
    (`prompt_width`) first, capped at a learned position table's `max_positions` (slots
    past it only ever receive surplus drafts or exact mode's padding, never a kept token:
    `requests.check_prompt` checks prompt + T fits)."""
    if not self.is_decoder_only:
      return new_positions
    capacity = new_positions + prompt_width
    limit = getattr(self.config, "max_positions", None)
    if getattr(self.config, "positions", None) == "learned" and limit is not None:
      capacity = min(capacity, limit)
    return capacity

  def begin(self, inputs: Array, new_positions: int, lengths: Array | None = None
            ) -> tuple[Array, cache_lib.DecoderCache, int]:
    """A decode's start, whatever the family: (the token each row feeds first [B] int32,
    the cache of `decode_capacity(new_positions, P)` slots whose length counts the tokens
    decoded after the input, that capacity). T5: the encoder run over `inputs` [B, Le],
    the decoder start token. A decoder-only model: the prompt [B, P] prefilled (`lengths`
    [B]) and anchored after each row's prompt but its last token, which it feeds first."""
    capacity = self.decode_capacity(new_positions, np.shape(inputs)[1])
    cache = self.start(inputs, capacity, lengths)
    if self.is_decoder_only:
      cache = cache.anchored()
    return self.first_tokens(inputs, lengths), cache, capacity

  def prompt_lengths(self, tokens: Array) -> Array:
    """[B] int32 lengths of right-padded prompts (one past the last non-pad token); for T5,
    the number of non-pad encoder tokens."""
    if self.is_decoder_only:
      return jnp.asarray(lm.prompt_lengths(tokens, self.config.pad_id))
    return jnp.sum(jnp.asarray(tokens) != self.config.pad_id, axis=1).astype(jnp.int32)

  def first_tokens(self, inputs: Array, lengths: Array | np.ndarray | None = None) -> Array:
    """[B] int32: the token each row feeds to its first `decode` after `start`.

    T5: `decoder_start_id` everywhere. A decoder-only model: the prompt's last token,
    inputs[b, lengths[b] - 1] (`lengths` as in `start`).
    """
    inputs = jnp.asarray(inputs, jnp.int32)
    if not isinstance(self.config, LMConfig):
      return jnp.full((inputs.shape[0],), self.config.decoder_start_id, jnp.int32)
    if lengths is None:
      lengths = lm.prompt_lengths(inputs, self.config.pad_id)
    return lm.first_tokens(inputs, jnp.asarray(lengths, jnp.int32))

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

  def exit_logits(self, inputs: Array, decoder_input_tokens: Array | None = None,
                  exits: tuple[int, ...] = (), deterministic: bool = True, rngs=None):
    """Teacher-forced logits read after each of `exits` decoder layers: a tuple of [B, Ld, V].

    A decoder-only model: `exit_logits(tokens, exits=...)`.
    """
    tokens = self._tokens(inputs, decoder_input_tokens)
    return _apply(self, *tokens, tuple(exits), deterministic, method="exit_logits", rngs=rngs)

  def output_logits(self, hidden: Array) -> Array:
    """The output layer alone: final-norm decoder states [..., E] -> logits float32 [..., V]."""
    return _apply(self, hidden, method="output_logits")

  def hidden_states(self, inputs: Array, decoder_input_tokens: Array | None = None,
                    deterministic: bool = True, rngs=None) -> Array:
    """Teacher-forced final-norm decoder states [B, Ld, E] (prediction heads read them).

    A decoder-only model: `hidden_states(tokens)` -> [B, L, E].
    """
    tokens = self._tokens(inputs, decoder_input_tokens)
    return _apply(self, *tokens, deterministic, method="hidden_states", rngs=rngs)

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
  return children, (model.config, model.partitioner)


def _flatten(model: Model):
  return [model.params, model.decode_weights], (model.config, model.partitioner)


def _unflatten(static, children) -> Model:
  model = object.__new__(Model)
  object.__setattr__(model, "config", static[0])
  object.__setattr__(model, "params", children[0])
  object.__setattr__(model, "decode_weights", children[1])
  object.__setattr__(model, "partitioner", static[1])
  return model


jax.tree_util.register_pytree_with_keys(Model, _flatten_with_keys, _unflatten, _flatten)


def family(model: Model) -> str:
  """The model's kind in words, for messages that refuse a model of the wrong kind:
  "a decoder-only LM" or "a T5 encoder-decoder"."""
  return "a decoder-only LM" if model.is_decoder_only else "a T5 encoder-decoder"


def _dummy_tokens(config: Config) -> tuple[Array, ...]:
  """Token arrays to trace a module's full pass with (one for an LM, two for T5)."""
  dummy = jnp.ones((1, 2), jnp.int32)
  return (dummy,) if isinstance(config, LMConfig) else (dummy, dummy)


def init_model(config: Config, rng: Array | int = 0, dtype=None, shardings: Any = None) -> Model:
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
  if not isinstance(config, (T5Config, LMConfig)):
    raise ConfigError(f"init_model takes an sd.T5Config or sd.LMConfig (sd.get_config(name)), "
                      f"got {type(config).__name__}")
  if isinstance(rng, int):
    rng = jax.random.PRNGKey(rng)
  module = module_for(config)
  dummy = _dummy_tokens(config)
  if dtype is None or jnp.dtype(dtype) == jnp.float32:
    if shardings is None:
      variables = _jitted_init(config)(rng, *dummy)
      return Model(config=config, params=nn.unbox(variables["params"]))
    init = jax.jit(lambda r: nn.unbox(module.init(r, *dummy)["params"]),
                   out_shardings=shardings)
    return Model(config=config, params=init(rng))
  abstract = flatten_dict(nn.unbox(jax.eval_shape(module.init, rng, *dummy)["params"]))
  # LMs and T5Gemma 2 scale queries in the attention (query init scale 1), T5 in the init.
  query_dim = 1 if isinstance(config, (LMConfig, T5Gemma2Config)) else config.head_dim
  where = flatten_dict(shardings) if shardings is not None else {}
  params = {}
  for key, (path, leaf) in zip(jax.random.split(rng, len(abstract)), sorted(abstract.items()),
                               strict=True):
    params[path] = _init_leaf(layers.initializer_for(path, query_dim), key, leaf.shape,
                              jnp.dtype(dtype), where.get(path))
  return Model(config=config.replace(dtype=jnp.dtype(dtype).name), params=unflatten_dict(params))


@functools.lru_cache(maxsize=16)
def _jitted_init(config: Config) -> Any:
  """`jax.jit(module.init)` of `config`, one per config: a new jit of the bound method at
  each call traced and compiled the whole init again (2.4 s for t5_1_1_tiny on CPU)."""
  return jax.jit(module_for(config).init)


@functools.partial(jax.jit, static_argnums=(0, 2, 3, 4))
def _init_leaf(init, key: Array, shape: tuple[int, ...], dtype, sharding=None) -> Array:
  x = init(key, shape, jnp.float32).astype(dtype)
  return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


def logical_axes(config: Config) -> Any:
  """Pytree of logical axis-name tuples, matching the params tree (T5X names)."""
  return unflatten_dict(dict(_logical_axes(config)))


@functools.lru_cache(maxsize=16)
def _logical_axes(config: Config) -> tuple[tuple[tuple[str, ...], Any], ...]:
  """`logical_axes` flat, as (path, axes) pairs (immutable): tracing the module's init
  takes a fifth of a second, and a load onto a mesh asks twice (`sd.sharding`)."""
  module = module_for(config)
  abstract = jax.eval_shape(module.init, jax.random.PRNGKey(0), *_dummy_tokens(config))
  return tuple(flatten_dict(nn.get_partition_spec(abstract["params"])).items())


def check_tokens(tokens, config: Config, name: str) -> None:
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
  arr = host_array(tokens)
  if arr.size and (arr.min() < 0 or arr.max() >= config.vocab_size):
    # An id past the embedding table is not an error to XLA: its gather clamps the index,
    # so the decode would run on another token. Name the first bad one.
    rows, cols = np.nonzero((arr < 0) | (arr >= config.vocab_size))
    raise InputError(f"{name} row {rows[0]} holds token id {arr[rows[0], cols[0]]} (column "
                     f"{cols[0]}), outside the model's vocabulary [0, {config.vocab_size}) "
                     f"(vocab_size {config.vocab_size}; {rows.size} such id"
                     f"{'s' if rows.size > 1 else ''} in all)")


def host_array(tokens) -> Any:
  """`tokens` as a numpy array on this process. An array split over several processes'
  devices (a global mesh whose "data" axis spans hosts) is gathered to every process
  first (`process_allgather`, a collective): every process then checks the same whole
  request and raises the same error, instead of one process failing while the others
  wait in the decode's collectives."""
  import numpy as np
  if isinstance(tokens, jax.Array) and not tokens.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(tokens, tiled=True))
  return np.asarray(tokens)
