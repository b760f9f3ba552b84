"""Hugging Face Gemma 4 checkpoints -> `GemmaConfig` and the Gemma parameter tree (`models.gemma`).

A directory with ``config.json`` whose ``model_type`` is "gemma4_text" (`Gemma4ForCausalLM`)
or "gemma4" (`Gemma4ForConditionalGeneration`, the text decoder read from its
``text_config``), and safetensors weights (one file, or shards and their index). The text
decoder alone is loaded: a "gemma4" file's vision and audio towers are skipped (prompts are
text). Names (nn.Linear weights [out, in], transposed)::

    <p> = model (gemma4_text) | model.language_model (gemma4)
    <p>.embed_tokens                         token_embedder (tied output)
    <p>.layers.i.input_layernorm             decoder/layers_i/pre_self_attention_layer_norm
    <p>.layers.i.post_attention_layernorm    .../post_self_attention_layer_norm
    <p>.layers.i.pre_feedforward_layernorm   .../pre_mlp_layer_norm
    <p>.layers.i.post_feedforward_layernorm  .../post_mlp_layer_norm
    <p>.layers.i.layer_scalar                .../layer_scalar
    <p>.layers.i.self_attn.{q,k,v,o}_proj    .../self_attention/{query,key,value,out}
    <p>.layers.i.self_attn.{q,k}_norm        .../self_attention/{query,key}_norm
    <p>.layers.i.mlp.{gate,up,down}_proj     .../mlp/{wi_0,wi_1,wo}
    <p>.norm                                 decoder/decoder_norm
    <p>.embed_tokens_per_layer               decoder/per_layer_embedder      (per-layer inputs)
    <p>.per_layer_model_projection           decoder/per_layer_model_projection
    <p>.per_layer_projection_norm            decoder/per_layer_projection_norm
    <p>.layers.i.per_layer_input_gate        .../per_layer_input_gate
    <p>.layers.i.per_layer_projection        .../per_layer_projection
    <p>.layers.i.post_per_layer_input_norm   .../post_per_layer_input_norm

A K/V-shared layer (the last ``num_kv_shared_layers``) has no K/V projections or norms;
a checkpoint's copies of them are skipped, as transformers skips them.

Refused (`CheckpointError`, naming the setting): mixture-of-experts blocks, a per-layer
input vocabulary other than the model's (``vocab_size_per_layer_input``), bidirectional
attention, attention biases, rope types other than "default" and "proportional"
(unscaled), a non-null ``attn_logit_softcapping`` (transformers' Gemma 4 text attention
has no soft-cap: `attn_logit_softcap` stays None). `export_hf` writes a "gemma4_text"
directory back, per-layer inputs and K/V-shared layers included.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from specdec_jax.config.gemma import GemmaConfig
from specdec_jax.errors import ConfigError
from specdec_jax.io.checkpoints import files, hf, leaves, resolve, tree
from specdec_jax.io.checkpoints.errors import CheckpointError

MODEL_TYPES = ("gemma4", "gemma4_text")
_LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}
# Gemma4TextConfig's defaults for keys a config.json may omit.
_DEFAULTS: dict[str, Any] = dict(
    vocab_size=262_144, hidden_size=2304, intermediate_size=9216, num_hidden_layers=30,
    num_attention_heads=8, num_key_value_heads=4, head_dim=256,
    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131_072, rms_norm_eps=1e-6,
    pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True,
    attention_bias=False, sliding_window=512, final_logit_softcapping=None,
    hidden_size_per_layer_input=256, attention_k_eq_v=False, num_kv_shared_layers=0,
    enable_moe_block=False, use_bidirectional_attention=None, global_head_dim=512,
    num_global_key_value_heads=None, use_double_wide_mlp=False,
    vocab_size_per_layer_input=262_144)
_ROPE_DEFAULTS = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                       "rope_theta": 1_000_000.0}}
# Tensors of a "gemma4" file that are not the text decoder.
_TOWERS = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
           "model.embed_audio.")


def handles(hf_config: Mapping[str, Any]) -> bool:
  """Whether a config.json is a Gemma 4 model's (read here)."""
  return hf_config.get("model_type") in MODEL_TYPES


def text_config(hf_config: Mapping[str, Any]) -> Mapping[str, Any]:
  """The text decoder's config: a "gemma4" file's ``text_config``, else the file's own."""
  if hf_config.get("model_type") == "gemma4":
    return hf_config.get("text_config") or {}
  return hf_config


def _rope(spec: Mapping[str, Any] | None, kind: str, source: str) -> tuple[float, float]:
  """(theta, rotated fraction) of one layer type's rope parameters."""
  spec = dict(_ROPE_DEFAULTS[kind] if spec is None else spec)
  rope_type = spec.get("rope_type", "default")
  if rope_type not in ("default", "proportional") or spec.get("factor", 1.0) != 1.0:
    raise CheckpointError(f"{source}: {kind} rope {spec} is not supported (rope_type "
                          "'default' or 'proportional', unscaled)")
  fraction = spec.get("partial_rotary_factor", 1.0) if rope_type == "proportional" else 1.0
  return float(spec["rope_theta"]), float(fraction)


def _global_shape(text: Mapping[str, Any], get: Callable[[str], Any], types: list[str],
                  source: str) -> tuple[int, int]:
  """(head_dim, kv heads) of the full layers: their `per_layer_config` entries, as
  transformers writes them, else ``global_head_dim`` / ``num_global_key_value_heads``."""
  per_layer = text.get("per_layer_config")
  if per_layer is None:
    heads = get("num_global_key_value_heads") if get("attention_k_eq_v") else None
    return get("global_head_dim"), heads or get("num_key_value_heads")
  shapes = set()
  for i, kind in enumerate(types):
    entry = per_layer.get(str(i), per_layer.get(i, {})) or {}
    if kind == "sliding" and entry:
      raise CheckpointError(f"{source}: per_layer_config overrides sliding layer {i} ({entry}); "
                            "only full layers may differ")
    if kind == "full":
      shapes.add((entry.get("head_dim", get("head_dim")),
                  entry.get("num_key_value_heads", get("num_key_value_heads"))))
  if len(shapes) > 1:
    raise CheckpointError(f"{source}: full layers of different shapes {sorted(shapes)} are not "
                          "supported")
  return shapes.pop() if shapes else (get("head_dim"), get("num_key_value_heads"))


def config_from_hf_dict(hf_config: Mapping[str, Any], source: str = hf.CONFIG_NAME
                        ) -> GemmaConfig:
  """The `GemmaConfig` of a Gemma 4 config.json dict; CheckpointError for what is not
  implemented."""
  text = text_config(hf_config)

  def get(key: str) -> Any:
    return _DEFAULTS.get(key) if text.get(key) is None else text[key]

  refused = [("enable_moe_block", "mixture-of-experts blocks"),
             ("use_bidirectional_attention", "bidirectional attention"),
             ("attention_bias", "attention biases")]
  for key, what in refused:
    if get(key):
      raise CheckpointError(f"{source}: {key}={get(key)!r}: {what} are not implemented for "
                            "Gemma 4 (supported: the dense text decoders)")
  if get("hidden_size_per_layer_input") and (
      get("vocab_size_per_layer_input") != get("vocab_size")):
    raise CheckpointError(f"{source}: vocab_size_per_layer_input "
                          f"{get('vocab_size_per_layer_input')} differs from vocab_size "
                          f"{get('vocab_size')}: per-layer inputs over another vocabulary are "
                          "not implemented for Gemma 4")
  if text.get("attn_logit_softcapping") is not None:
    raise CheckpointError(f"{source}: attn_logit_softcapping="
                          f"{text['attn_logit_softcapping']!r}: transformers' Gemma 4 text "
                          "attention applies no attention-logit soft-cap, so this key's meaning "
                          "is unknown; remove it or set it to null")
  if get("hidden_activation") not in ("gelu_pytorch_tanh", "gelu_new"):
    raise CheckpointError(f"{source}: hidden_activation {get('hidden_activation')!r} is not "
                          "supported (the tanh gelu, 'gelu_pytorch_tanh')")
  layers = get("num_hidden_layers")
  raw = text.get("layer_types")
  types = (["sliding" if (i + 1) % 6 else "full" for i in range(layers)] if raw is None
           else [_LAYER_TYPES.get(t, t) for t in raw])
  if types:
    types[-1] = "full"    # as transformers forces it
  rope = text.get("rope_parameters") or {}
  theta, fraction = _rope(rope.get("sliding_attention"), "sliding_attention", source)
  global_theta, global_fraction = _rope(rope.get("full_attention"), "full_attention", source)
  global_head_dim, global_heads = _global_shape(text, get, types, source)
  eos = get("eos_token_id")
  eos = eos[0] if isinstance(eos, (list, tuple)) else eos
  cap = get("final_logit_softcapping")
  try:
    return GemmaConfig(
        vocab_size=get("vocab_size"), emb_dim=get("hidden_size"), num_layers=layers,
        num_heads=get("num_attention_heads"), num_kv_heads=get("num_key_value_heads"),
        head_dim=get("head_dim"), mlp_dim=get("intermediate_size"),
        max_positions=get("max_position_embeddings"), norm_epsilon=float(get("rms_norm_eps")),
        rope_theta=theta, rope_fraction=fraction, global_rope_theta=global_theta,
        global_rope_fraction=global_fraction, layer_types=tuple(types),
        sliding_window=get("sliding_window"), global_head_dim=global_head_dim,
        global_num_kv_heads=global_heads, attention_k_eq_v=bool(get("attention_k_eq_v")),
        final_logit_softcap=None if cap is None else float(cap),
        per_layer_dim=get("hidden_size_per_layer_input"),
        num_kv_shared_layers=get("num_kv_shared_layers"),
        double_wide_mlp=bool(get("use_double_wide_mlp")),
        tie_embeddings=bool(hf_config.get("tie_word_embeddings", get("tie_word_embeddings"))),
        pad_id=get("pad_token_id"), eos_id=eos, bos_id=text.get("bos_token_id"))
  except ConfigError as e:
    raise CheckpointError(f"{source}: {e}") from e


def name_map(config: GemmaConfig, prefix: str) -> list[tuple[str, str, bool]]:
  """(HF name, our flat key, transposed) of every parameter but the output layer."""
  names = [(f"{prefix}.embed_tokens.weight", "token_embedder/embedding", False),
           (f"{prefix}.norm.weight", "decoder/decoder_norm/scale", False)]
  if config.per_layer_dim:
    names += [(f"{prefix}.embed_tokens_per_layer.weight", "decoder/per_layer_embedder/embedding",
               False),
              (f"{prefix}.per_layer_model_projection.weight",
               "decoder/per_layer_model_projection/kernel", True),
              (f"{prefix}.per_layer_projection_norm.weight",
               "decoder/per_layer_projection_norm/scale", False)]
  for i, kind in enumerate(config.layer_types):
    hf_, us = f"{prefix}.layers.{i}", f"decoder/layers_{i}"
    cached = i < config.cached_layers
    norms = [("input_layernorm", "pre_self_attention_layer_norm"),
             ("post_attention_layernorm", "post_self_attention_layer_norm"),
             ("pre_feedforward_layernorm", "pre_mlp_layer_norm"),
             ("post_feedforward_layernorm", "post_mlp_layer_norm"),
             ("self_attn.q_norm", "self_attention/query_norm")]
    projections = [("self_attn.q_proj", "self_attention/query"),
                   ("self_attn.o_proj", "self_attention/out"),
                   ("mlp.gate_proj", "mlp/wi_0"), ("mlp.up_proj", "mlp/wi_1"),
                   ("mlp.down_proj", "mlp/wo")]
    if cached:
      norms.append(("self_attn.k_norm", "self_attention/key_norm"))
      projections.append(("self_attn.k_proj", "self_attention/key"))
    if cached and not (config.attention_k_eq_v and kind == "full"):
      projections.append(("self_attn.v_proj", "self_attention/value"))
    if config.per_layer_dim:
      norms.append(("post_per_layer_input_norm", "post_per_layer_input_norm"))
      projections += [("per_layer_input_gate", "per_layer_input_gate"),
                      ("per_layer_projection", "per_layer_projection")]
    names += [(f"{hf_}.{a}.weight", f"{us}/{b}/scale", False) for a, b in norms]
    names.append((f"{hf_}.layer_scalar", f"{us}/layer_scalar", False))
    names += [(f"{hf_}.{a}.weight", f"{us}/{b}/kernel", True) for a, b in projections]
  return names


def _skipped(config: GemmaConfig, prefix: str) -> set[str]:
  """The K/V projections and norms a checkpoint may hold for K/V-shared layers, unused."""
  return {f"{prefix}.layers.{i}.self_attn.{name}.weight"
          for i in range(config.cached_layers, config.num_layers)
          for name in ("k_proj", "v_proj", "k_norm", "v_norm")}


def _convert(state: Mapping[str, Any], hf_config: Mapping[str, Any], source: str,
             transpose: Callable[[Any], Any], same: Callable[[Any, Any], bool]
             ) -> tuple[GemmaConfig, dict[str, Any]]:
  """(config, flat params) of a state dict of arrays or leaves (`transpose`, `same` for
  either): every mapped tensor present, nothing else but lm_head and the towers."""
  config = config_from_hf_dict(hf_config, source)
  prefix = "model.language_model" if hf_config.get("model_type") == "gemma4" else "model"
  names = name_map(config, prefix)
  known = {n for n, _, _ in names} | {"lm_head.weight"} | _skipped(config, prefix)
  missing = sorted(n for n, _, _ in names if n not in state)
  unexpected = sorted(n for n in state if n not in known and not n.startswith(_TOWERS))
  if missing or unexpected:
    raise CheckpointError(f"{source}: tensors do not match the Gemma 4 config "
                          f"({config.num_layers} layers {list(config.layer_types)}): missing "
                          f"{missing[:8]}; unexpected {unexpected[:8]}")
  flat = {key: transpose(state[name]) if t else state[name] for name, key, t in names}
  head, embedding = state.get("lm_head.weight"), state[names[0][0]]
  if head is not None and not (config.tie_embeddings and same(head, embedding)):
    config = config.replace(tie_embeddings=False)
    flat["decoder/logits_dense/kernel"] = transpose(head)
  elif not config.tie_embeddings:
    raise CheckpointError(f"{source}: lm_head.weight is missing and the output layer is not "
                          "tied to the embedding (tie_word_embeddings false)")
  return config, flat


def _config_json(directory: str) -> tuple[str, Mapping[str, Any]]:
  if resolve.is_gcs(directory):
    raise CheckpointError(f"{directory}: Hugging Face dirs are read from local disk only")
  source = os.path.join(directory, hf.CONFIG_NAME)
  hf_config = resolve.read_json(directory, hf.CONFIG_NAME)
  if hf_config is None:
    raise CheckpointError(f"{source}: not found; a Hugging Face model dir needs its config.json")
  return source, hf_config


def load(directory: str) -> tuple[GemmaConfig, dict[str, np.ndarray]]:
  """(config, flat params) of a local Gemma 4 directory."""
  files = hf.weight_files(directory)
  source, hf_config = _config_json(directory)
  config_from_hf_dict(hf_config, source)    # config errors before reading the weights
  state = hf.read_state_dict(directory, files)
  return _convert(state, hf_config, source, lambda w: np.ascontiguousarray(w.T),
                  lambda a, b: a.shape == b.shape and np.array_equal(a, b))


def open_leaves(directory: str) -> tuple[GemmaConfig, dict[str, leaves.Leaf]]:
  """`load` by slices (`leaves.to_device`): nothing read but headers and the config."""
  files = hf.weight_files(directory)
  source, hf_config = _config_json(directory)
  config_from_hf_dict(hf_config, source)
  state: dict[str, leaves.Leaf] = {}
  for file, tensors in files.items():
    state.update(hf.safetensors_leaves(os.path.join(directory, file), tensors))
  return _convert(state, hf_config, source, leaves.transposed,
                  lambda a, b: a.shape == b.shape and leaves.equal(a, b))


def config_to_hf_dict(config: GemmaConfig, dtype: str | None = None) -> dict[str, Any]:
  """A transformers `Gemma4TextConfig` config.json dict ("gemma4_text") for `config`; a
  `CheckpointError` for soft-capped attention logits, which transformers' Gemma 4 lacks."""
  if config.attn_logit_softcap is not None:
    raise CheckpointError(f"attn_logit_softcap {config.attn_logit_softcap}: transformers' "
                          "Gemma 4 has no attention-logit soft-cap; such a model cannot be "
                          "exported to it")
  def rope(theta: float, fraction: float) -> dict[str, Any]:
    if fraction == 1.0:
      return {"rope_type": "default", "rope_theta": theta}
    return {"rope_type": "proportional", "partial_rotary_factor": fraction, "rope_theta": theta}

  names = {v: k for k, v in _LAYER_TYPES.items()}
  d: dict[str, Any] = dict(
      architectures=["Gemma4ForCausalLM"], model_type="gemma4_text",
      vocab_size=config.vocab_size, hidden_size=config.emb_dim,
      intermediate_size=config.mlp_dim, num_hidden_layers=config.num_layers,
      num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
      head_dim=config.head_dim, hidden_activation="gelu_pytorch_tanh",
      max_position_embeddings=config.max_positions, rms_norm_eps=config.norm_epsilon,
      pad_token_id=config.pad_id, eos_token_id=config.eos_id, bos_token_id=config.bos_id,
      tie_word_embeddings=config.tie_embeddings, attention_bias=False,
      sliding_window=config.sliding_window,
      layer_types=[names[t] for t in config.layer_types],
      final_logit_softcapping=config.final_logit_softcap,
      hidden_size_per_layer_input=config.per_layer_dim,
      vocab_size_per_layer_input=config.vocab_size,
      attention_k_eq_v=config.attention_k_eq_v,
      num_kv_shared_layers=config.num_kv_shared_layers,
      use_double_wide_mlp=config.double_wide_mlp, enable_moe_block=False,
      rope_parameters={
          "sliding_attention": rope(config.rope_theta, config.rope_fraction),
          "full_attention": rope(config.global_rope_theta, config.global_rope_fraction)},
      per_layer_config={str(i): {"head_dim": config.global_head_dim,
                                 "num_key_value_heads": config.global_num_kv_heads}
                        for i, t in enumerate(config.layer_types) if t == "full"})
  if dtype is not None:
    d["dtype"] = dtype
  return d


def export_hf(path: str | os.PathLike, config: GemmaConfig, params: Mapping[str, Any]) -> str:
  """Write a transformers "gemma4_text" dir (config.json + model.safetensors); its path.
  ``Gemma4ForCausalLM.from_pretrained(path)`` gives exactly these weights."""
  path = os.fspath(path)
  flat = {k: np.asarray(v) for k, v in tree.flatten(params).items()}
  tree.validate(flat, config, "params")
  state = {name: np.ascontiguousarray(flat[key].T if t else flat[key])
           for name, key, t in name_map(config, "model")}
  if not config.tie_embeddings:
    state["lm_head.weight"] = np.ascontiguousarray(flat["decoder/logits_dense/kernel"].T)
  dtypes = {str(v.dtype) for v in state.values()}
  hf_config = config_to_hf_dict(config, dtypes.pop() if len(dtypes) == 1 else None)  # or refused
  os.makedirs(path, exist_ok=True)
  files.write_safetensors(state, os.path.join(path, hf.WEIGHTS_NAME), metadata={"format": "pt"})
  with open(os.path.join(path, hf.CONFIG_NAME), "w") as f:
    json.dump(hf_config, f, indent=2)
  return path
