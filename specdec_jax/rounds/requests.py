"""Checks and defaults for decode requests: clear errors before anything is traced.

Every public decode function runs these on its raw arguments first, so a malformed
request fails with an `InputError` that names the argument, never inside a jit trace:

    check_request(inputs, config, max_new_tokens)   tokens [B, Le] -> int32 array
    check_prompt(prompt, config, max_new_tokens, lengths)   a decoder-only request -> (prompt,
                                                             lengths [B])
    resolve_eos(eos_id, config)                              the stop token, in the vocabulary
    as_rng(rng, sampling)                                    one PRNG key (required to sample)
    check_heads_value(heads)                                 prediction heads, not a Model
    check_target(target)                                     a Model, not a name or tokenizer
"""

from __future__ import annotations

import os
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import sampling as sampling_lib
from specdec_jax.batching import rows_without_eos
from specdec_jax.config import T5Config
from specdec_jax.config.lm import LMConfig
from specdec_jax.errors import InputError, InputWarning
from specdec_jax.models.model import Model, check_tokens, host_array

Array = jax.Array


def check_request(inputs, config: T5Config, max_new_tokens: int) -> Array:
  """Validate a decode request and return the encoder tokens as int32 [B, Le].

  `inputs` may be an array or a rectangular nested list of ids. Every row must hold at
  least one token that is not padding (0): the encoder would attend over nothing, so a row
  of padding alone is refused, naming the row. The empty input is EOS alone (`[1, 0, ...]`,
  what the tokenizer encodes an empty text to), and decodes like any other.

  Length: T5's relative position buckets have no trained limit (distances past
  `relative_attention_max_distance` share the last bucket), so only `max_encoder_length`,
  when the config sets one, caps Le; the decoder's budget is bounded by memory
  (`check_buffer_fits`). EOS: the ids are used verbatim. T5 was trained on EOS-terminated
  inputs (the tokenizer's `encode` appends EOS, as T5X's seqio does); an input without
  EOS is decoded as given, and its output generally differs from the EOS-terminated one.
  """
  inputs = as_token_array(inputs, "inputs")
  check_tokens(inputs, config, "inputs")
  max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
  limit = getattr(config, "max_encoder_length", None)
  if limit is not None and inputs.shape[1] > limit:
    raise InputError(f"inputs has length {inputs.shape[1]}, longer than the "
                     f"model allows (max_encoder_length={limit})")
  if not isinstance(inputs, jax.core.Tracer):
    check_nonempty_rows(host_array(inputs), config, "inputs")
    warn_missing_eos(host_array(inputs), config)
  check_buffer_fits(config, inputs.shape[0], max_new_tokens)
  check_max_new_tokens(max_new_tokens)     # after: the memory check says more when both fail
  return jnp.asarray(inputs, jnp.int32)


_WARNED: set[str] = set()      # the InputWarnings given in this process: each once


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def warn_once(key: str, message: str) -> None:
  """An `InputWarning` with `message`, the first time `key` is warned in this process,
  pointing at the caller's line (the first frame outside specdec_jax)."""
  if key in _WARNED:
    return
  _WARNED.add(key)
  frame: types.FrameType | None = sys._getframe(0)
  level = 1
  while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
    frame, level = frame.f_back, level + 1
  warnings.warn(message, InputWarning, stacklevel=level)


def warn_missing_eos(tokens: np.ndarray, config: T5Config) -> None:
  """Warn (once) when a T5 input row does not end in EOS: it decodes as given, but T5 reads
  EOS-terminated inputs (the tokenizer appends EOS, as T5X's seqio does), so its output
  differs from the same input ending in EOS. `specdec decode` notes it per prompt instead."""
  rows = rows_without_eos(tokens, config.eos_id, config.pad_id)
  if rows:
    shown = ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
    warn_once("missing_eos", f"inputs row{'s' if len(rows) > 1 else ''} {shown} "
              f"{'do' if len(rows) > 1 else 'does'} not end in EOS ({config.eos_id}): T5 reads "
              f"EOS-terminated inputs (tokenizer.encode appends it), so the output differs "
              f"from the same input ending in {config.eos_id}; append it (this warning is "
              "shown once)")


def check_left_padding(tokens: np.ndarray, pad_id: int) -> None:
  """Refuse decoder-only prompts [B, P] that look left-padded, given without lengths:
  every row ends in the last column and rows start with different numbers of pad ids
  (Hugging Face's padding_side="left"). Decoded as given, the pads would be read as the
  prompt's first tokens and the output would differ with no word."""
  tokens = np.asarray(tokens)
  if tokens.shape[0] < 2 or np.any(tokens[:, -1] == pad_id):
    return
  leading = np.argmax(tokens != pad_id, axis=1)
  if leading.min() == leading.max():
    return
  rows = np.flatnonzero(leading > 0)[:8].tolist()
  raise InputError(
      f"prompt rows {rows} look left-padded (they start with the pad id {pad_id} and every "
      "row ends in the last column): decoder-only prompts here are right-padded with "
      "per-row lengths. Right-pad them and pass prompt_lengths (tokenizer.encode_prompts "
      "returns both; with Hugging Face, padding_side=\"right\" and "
      "attention_mask.sum(-1)), or, if the leading pad ids are content, pass prompt_lengths "
      "to say so")


def check_prompt(prompt, config, max_new_tokens: int, lengths=None) -> tuple[Array, Array]:
  """Validate a decoder-only request: right-padded prompts [B, P] and their lengths.

  Returns (prompt int32 [B, P], lengths int32 [B]); `lengths` None: one past each row's
  last token that is not the pad id (`lm.prompt_lengths`; pass them when a prompt may end
  in the pad id, as GPT-2's EOS-padded prompts may). Every row needs P_b >= 1 tokens; an
  EOS in a prompt is content (GPT-2 opens documents with it). P + max_new_tokens must fit
  the model's `max_positions`: a learned table has no row past it, and rotary positions past
  it were never trained (the output degrades silently, often to an immediate EOS).
  """
  from specdec_jax.models import lm
  prompt = as_token_array(prompt, "prompt tokens")
  check_tokens(prompt, config, "prompt tokens")
  max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
  if isinstance(prompt, jax.core.Tracer):
    raise InputError("decode a decoder-only model on concrete prompts (its lengths are "
                     "checked before tracing), not inside jit")
  limit, scheme = config.max_positions, "learned" if config.positions == "learned" else "rotary"
  if prompt.shape[1] + max_new_tokens > limit:
    raise InputError(f"a prompt buffer of {prompt.shape[1]} tokens and max_new_tokens="
                     f"{max_new_tokens} exceed the model's {limit} {scheme} positions "
                     "(max_positions): shorten the prompt or lower max_new_tokens")
  if lengths is None:
    check_left_padding(host_array(prompt), config.pad_id)
  lengths = lm.check_prompt(prompt, lengths, prompt.shape[1], config)
  check_buffer_fits(config, prompt.shape[0], max_new_tokens + prompt.shape[1])
  check_max_new_tokens(max_new_tokens)
  return jnp.asarray(prompt, jnp.int32), jnp.asarray(lengths, jnp.int32)


def as_token_array(tokens, name: str):
  """A nested Python list of ids -> int32 numpy [B, L]; arrays pass through.

  A ragged list (rows of different lengths) is refused: rows must be right-padded
  with 0 to one length (`tools.batching.pad_rows`, or `tokenizer.encode` on strings).
  """
  if not isinstance(tokens, (list, tuple)):
    return tokens
  rows = list(tokens)
  if not rows or not all(isinstance(r, (list, tuple, np.ndarray)) for r in rows):
    raise InputError(f"{name} must be 2-D [batch, length]: a list of rows of token ids, "
                     f"got a list of {type(rows[0]).__name__ if rows else 'nothing'}")
  lengths = [len(r) for r in rows]
  if len(set(lengths)) > 1:
    raise InputError(f"{name} is a ragged list (row lengths {lengths[:8]}"
                     f"{', ...' if len(lengths) > 8 else ''}): right-pad every row with 0 "
                     "to one length (tools.batching.pad_rows, or tokenizer.encode)")
  array = np.asarray(rows)
  if array.size and not np.issubdtype(array.dtype, np.integer):
    raise InputError(f"{name} must hold integer token ids, got {array.dtype} values")
  return array.astype(np.int32)


def check_nonempty_rows(tokens: np.ndarray, config: T5Config, name: str) -> None:
  """Refuse rows [B, L] holding nothing but padding: the encoder has no position to attend
  to (the empty sentence is EOS alone, a row like any other)."""
  empty = np.flatnonzero(~np.any(tokens != config.pad_id, axis=1))
  if empty.size:
    rows = ", ".join(map(str, empty[:8].tolist())) + (", ..." if empty.size > 8 else "")
    raise InputError(
        f"{name} row{'s' if empty.size > 1 else ''} {rows} "
        f"{'hold' if empty.size > 1 else 'holds'} nothing but padding ({config.pad_id}): the "
        f"encoder has no token to attend to; an empty input is EOS alone "
        f"([{config.eos_id}], as the tokenizer encodes an empty text), or drop the row (a "
        "short last batch can repeat a real row: tools.batching.padded_batches)")


def device_memory_bytes() -> int | None:
  """The default device's memory (accelerators: XLA's limit; CPU: the host's RAM)."""
  device = jax.local_devices()[0]    # this process's (several processes: jax.distributed)
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def cache_bytes(config: T5Config, batch: int, length: int) -> int:
  """Bytes of a decoder self-attention cache: K and V [B, H_kv, length, D] in every layer
  (H_kv: a decoder-only model's key/value heads; T5's heads)."""
  itemsize = jnp.dtype(config.dtype).itemsize
  heads = getattr(config, "num_kv_heads", None) or config.num_heads
  return (2 * config.num_decoder_layers * batch * heads * length
          * config.head_dim * itemsize)


def check_buffer_fits(config: T5Config, batch: int, max_new_tokens: int) -> None:
  """Refuse a `max_new_tokens` whose decoder cache alone exceeds the device's memory.

  The cache is allocated for the whole budget at once (fixed shapes), so an absurd
  budget would otherwise surface as an out-of-memory error deep inside XLA.
  """
  need, have = cache_bytes(config, batch, max_new_tokens + 1), device_memory_bytes()
  heads = getattr(config, "num_kv_heads", None) or config.num_heads
  if have is not None and need > have:
    raise InputError(
        f"max_new_tokens={max_new_tokens} needs a decoder cache of {need / 2**30:.1f} GiB "
        f"(K and V [B={batch}, heads={heads}, {max_new_tokens + 1}, "
        f"head_dim={config.head_dim}] {config.dtype} in {config.num_decoder_layers} layers), "
        f"more than the device's {have / 2**30:.1f} GiB: lower max_new_tokens or the batch")


#: The most new tokens one decode call takes: far past any trained length (T5's relative
#: positions have no limit, LMs' `max_positions` bound them sooner), and it keeps every
#: position and buffer index well inside int32. The cache's memory is checked on its own
#: (`check_buffer_fits`).
MAX_NEW_TOKENS = 2**20


def check_positive_int(value, name: str, maximum: int | None = None, why: str = "") -> int:
  """`value` as an int >= 1 (and <= `maximum`, `why` saying what the limit protects)."""
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
    raise InputError(f"{name} must be an integer >= 1, got {value!r}")
  if maximum is not None and value > maximum:
    raise InputError(f"{name}={value} is above the limit of {maximum}"
                     + (f" ({why})" if why else ""))
  return int(value)


def check_max_new_tokens(value) -> int:
  """max_new_tokens as an int in [1, MAX_NEW_TOKENS]."""
  return check_positive_int(value, "max_new_tokens", MAX_NEW_TOKENS,
                            "tokens per decode call: decode longer outputs in pieces")


def check_same_vocabulary(target_vocab: int, drafter_vocab: int, what: str = "drafter") -> None:
  if drafter_vocab != target_vocab:
    raise InputError(
        f"vocabulary mismatch: {what} has vocab_size {drafter_vocab}, target has "
        f"{target_vocab}; drafter/verifier decoding needs the same vocabulary")


def resolve_eos(eos_id: int | None, config: T5Config | LMConfig) -> int:
  """None -> the model's EOS; a negative id disables stopping (T5X's eos_id=-1).

  An id >= vocab_size is refused: no token could ever equal it, so no row would stop.
  """
  if eos_id is None:
    return config.eos_id
  if not isinstance(eos_id, (int, np.integer)) or isinstance(eos_id, bool):
    raise InputError(f"eos_id must be an integer token id (or None: the model's "
                     f"{config.eos_id}; -1: never stop), got {eos_id!r}")
  if eos_id >= config.vocab_size:
    raise InputError(f"eos_id={eos_id} is outside the vocabulary [0, {config.vocab_size}): "
                     "no token can equal it, so no row would stop; pass -1 to disable "
                     "stopping on purpose")
  return int(eos_id)


def _seed_key(seed: int) -> Array:
  # Built on every call (~0.1 ms on CPU), never memoised: a key first built inside a user's
  # jax.jit or vmap is a tracer, and a cached tracer breaks every later decode.
  return jax.random.PRNGKey(seed)


def as_rng(rng, sampling=None) -> Array:
  """One PRNG key for the call: an int seed -> its key; a key passes through.

  `rng` is ONE key for the whole batch (rows draw independent streams from it).
  None is allowed only for greedy decoding (`sampling` None or greedy): sampling
  without a key would silently reuse seed 0, so every call would draw the same samples.
  """
  if rng is None:
    if not sampling_lib.as_sampling(sampling).is_greedy:
      raise InputError(
          f"sampling={sampling!r} needs rng: a seed (rng=0) or a key (rng=jax.random.key(0)); "
          "without it every call would draw the same samples")
    return _seed_key(0)
  if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
    return _seed_key(int(rng))
  shape, dtype = getattr(rng, "shape", None), getattr(rng, "dtype", None)
  if shape is None or dtype is None:
    raise InputError(f"rng must be an int seed or a PRNG key (jax.random.key(0) or "
                     f"jax.random.PRNGKey(0)), got {type(rng).__name__} {rng!r:.40}")
  typed = jnp.issubdtype(dtype, jax.dtypes.prng_key)
  if (typed and shape == ()) or (not typed and dtype == jnp.uint32 and shape == (2,)):
    return rng
  if (typed and len(shape) == 1) or (not typed and len(shape) == 2 and shape[-1] == 2):
    raise InputError(
        f"rng has shape {tuple(shape)}: one key per row. Pass ONE key for the call (rows "
        "draw independent streams from it); for per-row keys, decode the rows in separate "
        "calls, or vmap the pure pieces (engine.init_state / round_step / finish) over rows")
  raise InputError(f"rng must be an int seed or one PRNG key (jax.random.key(0): shape (), or "
                   f"jax.random.PRNGKey(0): uint32 [2]), got {dtype} {tuple(shape)}")


def check_target(target) -> None:
  """`target` must be a loaded `Model`, not its name, a tokenizer or a drafter."""
  if isinstance(target, Model):
    return
  if isinstance(target, (str, os.PathLike)):
    raise InputError(f"target is the {type(target).__name__} {os.fspath(target)!r}: load the "
                     f"model first (target = sd.load({os.fspath(target)!r}))")
  hint = (": pass the model as target, the tokenizer only encodes the prompts"
          if hasattr(target, "encode_one") else "")
  raise InputError(f"target must be an sd.Model (sd.load), got {type(target).__name__}{hint}")


def check_heads_value(heads) -> None:
  """`heads` must be prediction heads (`sd.load_heads` / `sd.init_heads`), not a Model."""
  if isinstance(heads, Model):
    raise InputError(
        "heads is a Model: blockwise_generate(model, heads, inputs, ...) takes the "
        "prediction heads trained on `model` as its second argument "
        "(sd.load_heads(path, model), or `specdec train --heads`)")
  if not (hasattr(heads, "num_drafts") and hasattr(heads, "params")):
    raise InputError(f"heads must be prediction heads (sd.load_heads / sd.init_heads), "
                     f"got {type(heads).__name__}")
