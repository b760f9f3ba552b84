"""Hugging Face T5Gemma 2 checkpoints -> `T5Gemma2Config` and its tree (`models.t5gemma2`).

A directory with ``config.json`` whose ``model_type`` is "t5gemma2"
(`T5Gemma2ForConditionalGeneration`) and safetensors weights (one file, or shards and
their index). The text encoder and decoder are loaded; the vision tower and its
projector are not (a note says so when the checkpoint has them; prompts are text).
Names (nn.Linear weights [out, in], transposed; transformers writes the encoder's text
model without its ``text_model.``, and reads either)::

    model.encoder.embed_tokens.{weight, eoi_embedding}   token_embedder/{embedding, eoi_embedding}
    model.<s>.layers.i.pre_self_attn_layernorm           <s>/layers_i/pre_self_attention_layer_norm
    model.<s>.layers.i.post_self_attn_layernorm          .../post_self_attention_layer_norm
    model.<s>.layers.i.pre_feedforward_layernorm         .../pre_mlp_layer_norm
    model.<s>.layers.i.post_feedforward_layernorm        .../post_mlp_layer_norm
    model.<s>.layers.i.self_attn.{q,k,v,o}_proj          .../self_attention/{query,key,value,out}
    model.<s>.layers.i.self_attn.{q,k}_norm              .../self_attention/{query,key}_norm
    model.<s>.layers.i.mlp.{gate,up,down}_proj           .../mlp/{wi_0,wi_1,wo}
    model.<s>.norm                                       <s>/{encoder,decoder}_norm
    lm_head.out_proj                                     decoder/logits_dense (untied only)

(<s>: encoder, decoder). The decoder's embedding, where stored, is the encoder's (tied).
``attn_logit_softcapping`` loads as `attn_logit_softcap`, which our attention applies;
transformers 5.24's T5Gemma 2 stores it but never applies it, so where it is set the two
differ. Refused (`CheckpointError`, naming the setting): an encoder and a decoder that
differ in anything but their layers (heads, sizes, window, rope, soft-caps), attention
biases, rope types other than "default" and "linear", a pad id other than 0.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from specdec_jax.config.t5gemma2 import T5Gemma2Config
from specdec_jax.errors import ConfigError, InputWarning
from specdec_jax.io.checkpoints import hf, leaves, resolve
from specdec_jax.io.checkpoints.errors import CheckpointError

MODEL_TYPES = ("t5gemma2",)
GENERATION_CONFIG = "generation_config.json"
_LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}
# T5Gemma2TextConfig's defaults for keys a config.json may omit.
_DEFAULTS: dict[str, Any] = dict(
    vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
    num_attention_heads=8, num_key_value_heads=4, head_dim=256,
    hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1,
    bos_token_id=2, attention_bias=False, query_pre_attn_scalar=256, sliding_window=4096,
    final_logit_softcapping=None, attn_logit_softcapping=None)
_ROPE_DEFAULTS = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                  "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}}
# Settings the encoder and the decoder must share (the model has one of each).
_SHARED = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
           "num_key_value_heads", "head_dim", "hidden_activation", "rms_norm_eps",
           "query_pre_attn_scalar", "sliding_window", "pad_token_id", "attn_logit_softcapping")
# Tensors of the checkpoint that are not the text model.
_TOWERS = ("model.encoder.vision_tower.", "model.encoder.multi_modal_projector.")


def handles(hf_config: Mapping[str, Any]) -> bool:
  """Whether a config.json is a T5Gemma 2 model's (read here)."""
  return hf_config.get("model_type") in MODEL_TYPES


def _stacks(hf_config: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
  """The encoder's text config and the decoder's config of a "t5gemma2" config.json."""
  encoder = hf_config.get("encoder") or {}
  return encoder.get("text_config") or {}, hf_config.get("decoder") or {}


def _rope(stack: Mapping[str, Any], kind: str, source: str) -> tuple[float, float]:
  """(theta, linear factor) of one layer type's rope parameters: `rope_parameters`, or
  the older keys transformers still reads (`rope_theta` and `rope_scaling` for the full
  layers, `rope_local_base_freq` for the sliding ones)."""
  spec: dict[str, Any] = dict(_ROPE_DEFAULTS[kind])
  if stack.get("rope_parameters") is None:
    legacy = {"full_attention": ("rope_theta", "rope_scaling"),
              "sliding_attention": ("rope_local_base_freq", None)}
    theta, scaling = legacy[kind]
    if stack.get(theta) is not None:
      spec["rope_theta"] = stack[theta]
    spec.update((stack.get(scaling) if scaling else None) or {})
  spec.update((stack.get("rope_parameters") or {}).get(kind) or {})
  rope_type = spec.get("rope_type", "default")
  factor = float(spec.get("factor", 1.0)) if rope_type == "linear" else 1.0
  if rope_type not in ("default", "linear") or (rope_type == "default"
                                                and spec.get("factor", 1.0) != 1.0):
    raise CheckpointError(f"{source}: {kind} rope {spec} is not supported (rope_type "
                          "'default', or 'linear' with its factor)")
  return float(spec["rope_theta"]), factor


def _layer_types(stack: Mapping[str, Any], layers: int) -> tuple[str, ...]:
  raw = stack.get("layer_types")
  if raw is None:
    return tuple("sliding" if (i + 1) % 6 else "full" for i in range(layers))
  return tuple(_LAYER_TYPES.get(t, t) for t in raw)


def has_vision(hf_config: Mapping[str, Any]) -> bool:
  """Whether the checkpoint's config has a vision tower (transformers always builds one)."""
  return bool((hf_config.get("encoder") or {}).get("vision_config"))


def config_from_hf_dict(hf_config: Mapping[str, Any], source: str = hf.CONFIG_NAME,
                        generation: Mapping[str, Any] | None = None) -> T5Gemma2Config:
  """The `T5Gemma2Config` of a "t5gemma2" config.json dict (and its generation_config.json,
  which may name the decoder's start token); CheckpointError for what is not implemented."""
  encoder, decoder = _stacks(hf_config)

  def get(stack: Mapping[str, Any], key: str) -> Any:
    return _DEFAULTS.get(key) if stack.get(key) is None else stack[key]

  for key in _SHARED:
    if get(encoder, key) != get(decoder, key):
      raise CheckpointError(f"{source}: {key} differs between the encoder "
                            f"({get(encoder, key)!r}) and the decoder ({get(decoder, key)!r}); "
                            "only the layer counts and types may differ")
  for stack, name in ((encoder, "encoder"), (decoder, "decoder")):
    if get(stack, "attention_bias"):
      raise CheckpointError(f"{source}: {name} attention_bias=true: attention biases are not "
                            "implemented for T5Gemma 2")
    for kind in _ROPE_DEFAULTS:
      if _rope(stack, kind, source) != _rope(decoder, kind, source):
        raise CheckpointError(f"{source}: the {kind} rope differs between the encoder and the "
                              "decoder; only the layer counts and types may differ")
  if get(decoder, "hidden_activation") not in ("gelu_pytorch_tanh", "gelu_new"):
    raise CheckpointError(f"{source}: hidden_activation {get(decoder, 'hidden_activation')!r} "
                          "is not supported (the tanh gelu, 'gelu_pytorch_tanh')")
  if get(decoder, "pad_token_id") != 0:
    raise CheckpointError(f"{source}: pad_token_id {get(decoder, 'pad_token_id')!r} is not "
                          "supported (encoder inputs are right-padded with 0)")
  theta, _ = _rope(decoder, "sliding_attention", source)
  global_theta, factor = _rope(decoder, "full_attention", source)
  eos = get(decoder, "eos_token_id")
  eos = eos[0] if isinstance(eos, (list, tuple)) else eos
  generation = generation or {}
  start = generation.get("decoder_start_token_id")
  if start is None:
    start = generation.get("bos_token_id", get(decoder, "bos_token_id"))
  eoi = hf_config.get("eoi_token_index") or (hf_config.get("encoder") or {}).get(
      "eoi_token_index") or 256_000
  cap = get(decoder, "final_logit_softcapping")
  attn_cap = get(decoder, "attn_logit_softcapping")
  enc_layers, dec_layers = get(encoder, "num_hidden_layers"), get(decoder, "num_hidden_layers")
  try:
    return T5Gemma2Config(
        vocab_size=get(decoder, "vocab_size"), emb_dim=get(decoder, "hidden_size"),
        num_heads=get(decoder, "num_attention_heads"),
        num_kv_heads=get(decoder, "num_key_value_heads"), head_dim=get(decoder, "head_dim"),
        mlp_dim=get(decoder, "intermediate_size"), num_encoder_layers=enc_layers,
        num_decoder_layers=dec_layers,
        encoder_layer_types=_layer_types(encoder, enc_layers),
        decoder_layer_types=_layer_types(decoder, dec_layers),
        sliding_window=get(decoder, "sliding_window"), rope_theta=theta,
        global_rope_theta=global_theta, global_rope_factor=factor,
        query_pre_attn_scalar=float(get(decoder, "query_pre_attn_scalar")),
        final_logit_softcap=None if cap is None else float(cap),
        attn_logit_softcap=None if attn_cap is None else float(attn_cap),
        layer_norm_epsilon=float(get(decoder, "rms_norm_eps")),
        logits_via_embedding=bool(hf_config.get("tie_word_embeddings", True)),
        eos_id=eos, decoder_start_id=start, eoi_id=eoi)
  except ConfigError as e:
    raise CheckpointError(f"{source}: {e}") from e


def name_map(config: T5Gemma2Config) -> list[tuple[str, str, bool]]:
  """(HF name, our flat key, transposed) of every parameter but the output layer."""
  names = [("model.encoder.embed_tokens.weight", "token_embedder/embedding", False),
           ("model.encoder.embed_tokens.eoi_embedding", "token_embedder/eoi_embedding", False),
           ("model.encoder.norm.weight", "encoder/encoder_norm/scale", False),
           ("model.decoder.norm.weight", "decoder/decoder_norm/scale", False)]
  for stack, layers in (("encoder", config.num_encoder_layers),
                        ("decoder", config.num_decoder_layers)):
    for i in range(layers):
      theirs, ours = f"model.{stack}.layers.{i}", f"{stack}/layers_{i}"
      names += [(f"{theirs}.{a}.weight", f"{ours}/{b}/scale", False) for a, b in (
          ("pre_self_attn_layernorm", "pre_self_attention_layer_norm"),
          ("post_self_attn_layernorm", "post_self_attention_layer_norm"),
          ("pre_feedforward_layernorm", "pre_mlp_layer_norm"),
          ("post_feedforward_layernorm", "post_mlp_layer_norm"),
          ("self_attn.q_norm", "self_attention/query_norm"),
          ("self_attn.k_norm", "self_attention/key_norm"))]
      names += [(f"{theirs}.{a}.weight", f"{ours}/{b}/kernel", True) for a, b in (
          ("self_attn.q_proj", "self_attention/query"), ("self_attn.k_proj", "self_attention/key"),
          ("self_attn.v_proj", "self_attention/value"), ("self_attn.o_proj", "self_attention/out"),
          ("mlp.gate_proj", "mlp/wi_0"), ("mlp.up_proj", "mlp/wi_1"), ("mlp.down_proj", "mlp/wo"))]
  return names


_TIED = ("model.decoder.embed_tokens.weight", "model.decoder.embed_tokens.eoi_embedding")


def _convert(state: Mapping[str, Any], hf_config: Mapping[str, Any], source: str,
             generation: Mapping[str, Any] | None, transpose: Callable[[Any], Any],
             same: Callable[[Any, Any], bool]) -> tuple[T5Gemma2Config, dict[str, Any]]:
  """(config, flat params) of a state dict of arrays or leaves: every mapped tensor
  present, nothing else but the output layer, the decoder's tied embedding and the vision
  tower (a note when present)."""
  config = config_from_hf_dict(hf_config, source, generation)
  state = {k.replace("model.encoder.text_model.", "model.encoder."): v for k, v in state.items()}
  names = name_map(config)
  known = {n for n, _, _ in names} | {"lm_head.out_proj.weight", *_TIED}
  missing = sorted(n for n, _, _ in names if n not in state)
  unexpected = sorted(n for n in state if n not in known and not n.startswith(_TOWERS))
  if missing or unexpected:
    raise CheckpointError(f"{source}: tensors do not match the T5Gemma 2 config "
                          f"({config.num_encoder_layers} encoder and {config.num_decoder_layers} "
                          f"decoder layers): missing {missing[:8]}; unexpected {unexpected[:8]}")
  if has_vision(hf_config) or any(n.startswith(_TOWERS) for n in state):
    warnings.warn(f"{source}: the checkpoint's vision tower is not loaded (specdec-jax reads "
                  "the text encoder and decoder; inputs are text tokens)", InputWarning,
                  stacklevel=4)
  flat = {key: transpose(state[name]) if t else state[name] for name, key, t in names}
  for tied, ours in zip(_TIED, (names[0][0], names[1][0]), strict=True):
    if tied in state and not same(state[tied], state[ours]):
      raise CheckpointError(f"{source}: {tied} differs from {ours}: a decoder embedding of "
                            "its own is not supported (T5Gemma 2 ties them)")
  head = state.get("lm_head.out_proj.weight")
  if head is not None and not (config.logits_via_embedding and same(head, state[names[0][0]])):
    config = config.replace(logits_via_embedding=False)
    flat["decoder/logits_dense/kernel"] = transpose(head)
  elif head is None and not config.logits_via_embedding:
    raise CheckpointError(f"{source}: lm_head.out_proj.weight is missing and the output layer "
                          "is not tied to the embedding (tie_word_embeddings false)")
  return config, flat


def _jsons(directory: str) -> tuple[str, Mapping[str, Any], Mapping[str, Any] | None]:
  if resolve.is_gcs(directory):
    raise CheckpointError(f"{directory}: Hugging Face dirs are read from local disk only")
  source = os.path.join(directory, hf.CONFIG_NAME)
  hf_config = resolve.read_json(directory, hf.CONFIG_NAME)
  if hf_config is None:
    raise CheckpointError(f"{source}: not found; a Hugging Face model dir needs its config.json")
  return source, hf_config, resolve.read_json(directory, GENERATION_CONFIG)


def open_leaves(directory: str) -> tuple[T5Gemma2Config, dict[str, leaves.Leaf]]:
  """(config, flat leaves read by slices): nothing read but headers and the configs."""
  files = hf.weight_files(directory)
  source, hf_config, generation = _jsons(directory)
  config_from_hf_dict(hf_config, source, generation)    # config errors before the weights
  state: dict[str, leaves.Leaf] = {}
  for file, tensors in files.items():
    state.update(hf.safetensors_leaves(os.path.join(directory, file), tensors))
  return _convert(state, hf_config, source, generation, leaves.transposed,
                  lambda a, b: a.shape == b.shape and leaves.equal(a, b))


def load(directory: str) -> tuple[T5Gemma2Config, dict[str, np.ndarray]]:
  """(config, flat params) of a local T5Gemma 2 directory: the text model's tensors read
  whole (the vision tower's never)."""
  config, flat = open_leaves(directory)
  return config, {key: np.ascontiguousarray(leaf.read(tuple(slice(None) for _ in leaf.shape)))
                  for key, leaf in flat.items()}
