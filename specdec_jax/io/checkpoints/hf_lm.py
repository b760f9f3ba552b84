"""Hugging Face decoder-only checkpoints (GPT-2, Llama) <-> the LM parameter tree (`models.lm`).

A directory with ``config.json`` (``model_type`` "gpt2" or "llama") and safetensors weights,
``model.safetensors`` or shards listed in ``model.safetensors.index.json``; PyTorch pickles are
never read. Names, as `GPT2LMHeadModel` / `LlamaForCausalLM` save them::

    GPT-2 (Conv1D weights are [in, out]: copied)     ours
    transformer.wte / wpe                            token_embedder / position_embedder
    transformer.h.i.ln_1, ln_2                       decoder/layers_i/pre_{self_attention,
                                                     mlp}_layer_norm
    transformer.h.i.attn.c_attn [E, 3E] (fused)      .../self_attention/{query,key,value} (split)
    transformer.h.i.attn.c_proj                      .../self_attention/out
    transformer.h.i.mlp.c_fc, c_proj                 .../mlp/wi, wo
    transformer.ln_f                                 decoder/decoder_norm

    Llama (nn.Linear weights are [out, in]: transposed)
    model.embed_tokens                               token_embedder
    model.layers.i.input_layernorm                   decoder/layers_i/pre_self_attention_layer_norm
    model.layers.i.self_attn.{q,k,v,o}_proj          .../self_attention/{query,key,value,out}
    model.layers.i.post_attention_layernorm          .../pre_mlp_layer_norm
    model.layers.i.mlp.{gate,up,down}_proj           .../mlp/{wi_0,wi_1,wo}
    model.norm                                       decoder/decoder_norm

The output layer is ``lm_head.weight`` when the file holds one that is not the embedding
(``decoder/logits_dense/kernel``, transposed), else the tied embedding. Rotary positions use
Hugging Face's rotate-half layout, so Llama's q/k weights load unpermuted; only unscaled rope
(``rope_type`` "default") is supported.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from specdec_jax.config.lm import LMConfig
from specdec_jax.errors import ConfigError
from specdec_jax.io.checkpoints import files, hf, leaves, resolve, tree
from specdec_jax.io.checkpoints.errors import CheckpointError

MODEL_TYPES = ("gpt2", "llama")
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}

# transformers' defaults for keys a config.json may omit.
_DEFAULTS = {
    "gpt2": dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                 n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                 bos_token_id=50256, eos_token_id=50256, tie_word_embeddings=True,
                 scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                 add_cross_attention=False),
    "llama": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None,
                  head_dim=None, hidden_act="silu", max_position_embeddings=2048,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                  attention_bias=False, mlp_bias=False, rope_theta=10000.0),
}
_GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")   # both the tanh approximation
# Buffers some files carry that are not parameters.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def model_type(hf_config: Mapping[str, Any], source: str) -> str:
  kind = hf_config.get("model_type")
  if kind not in MODEL_TYPES:
    raise CheckpointError(
        f"{source}: model_type {kind!r} is not supported (supported: encoder-decoder "
        f"{sorted(hf._HF_DEFAULTS)}, decoder-only {list(MODEL_TYPES)})")
  return kind


def handles(hf_config: Mapping[str, Any]) -> bool:
  """Whether a HF config.json is read here rather than by the T5 reader (`hf`): any
  model_type T5's reader does not know (unknown types get this module's error)."""
  return hf_config.get("model_type") not in hf._HF_DEFAULTS


# ----------------------------------------------------------------------------- config


def _get(hf_config: Mapping[str, Any], key: str) -> Any:
  value = hf_config.get(key)
  return _DEFAULTS[hf_config["model_type"]].get(key) if value is None else value


def _token_id(value):
  return value[0] if isinstance(value, (list, tuple)) and value else value


def rope_theta(hf_config: Mapping[str, Any], source: str) -> float:
  """The rotary base of a Llama config; CheckpointError for any rope scaling.

  transformers 5 writes ``rope_parameters`` {"rope_type", "rope_theta", ...}; older files
  ``rope_theta`` and ``rope_scaling`` (None when unscaled).
  """
  params = dict(hf_config.get("rope_parameters") or {})
  scaling = hf_config.get("rope_scaling")
  for spec in (params, scaling or {}):
    kind = spec.get("rope_type", spec.get("type", "default"))
    if kind != "default":
      raise CheckpointError(
          f"{source}: rope scaling {kind!r} is not supported (only unscaled rotary positions, "
          f"rope_type 'default'); rope settings: {json.dumps(spec, sort_keys=True)}")
  factor = params.get("partial_rotary_factor", hf_config.get("partial_rotary_factor", 1.0))
  if factor != 1.0:
    raise CheckpointError(f"{source}: partial_rotary_factor {factor} is not supported (rotary "
                          "positions over the whole head only)")
  return float(params.get("rope_theta", _get(hf_config, "rope_theta")))


def config_from_hf_dict(hf_config: Mapping[str, Any], tied: bool | None = None,
                        source: str = hf.CONFIG_NAME) -> LMConfig:
  """LMConfig of a HF GPT-2 / Llama config.json dict.

  tied: whether the output layer is the embedding (default: the config's
  ``tie_word_embeddings``; `load` decides it from the tensors). A missing pad id is the EOS id.
  """
  kind = model_type(hf_config, source)
  get = lambda key: _get(hf_config, key)
  eos = _token_id(get("eos_token_id"))
  pad = _token_id(hf_config.get("pad_token_id"))
  common = dict(family=kind, vocab_size=get("vocab_size"), eos_id=eos,
                # An explicit null is "no BOS" (what we write for a model without one).
                bos_id=_token_id(hf_config["bos_token_id"] if "bos_token_id" in hf_config
                                 else get("bos_token_id")),
                pad_id=eos if pad is None else pad,
                tie_embeddings=bool(get("tie_word_embeddings") if tied is None else tied))
  try:
    if kind == "gpt2":
      act = get("activation_function")
      if act not in _GPT2_ACTIVATIONS:
        raise CheckpointError(f"{source}: GPT-2 activation_function {act!r} is not supported "
                              f"(supported: {list(_GPT2_ACTIVATIONS)})")
      for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                        ("add_cross_attention", False)):
        if bool(get(key)) != want:
          raise CheckpointError(f"{source}: GPT-2 with {key}={get(key)!r} is not supported")
      emb = get("n_embd")
      return LMConfig(**common, emb_dim=emb, num_layers=get("n_layer"), num_heads=get("n_head"),
                      mlp_dim=get("n_inner") or 4 * emb, max_positions=get("n_positions"),
                      norm_epsilon=float(get("layer_norm_epsilon")))
    if get("hidden_act") != "silu":
      raise CheckpointError(f"{source}: Llama hidden_act {get('hidden_act')!r} is not "
                            "supported (supported: 'silu')")
    heads = get("num_attention_heads")
    return LMConfig(**common, emb_dim=get("hidden_size"), num_layers=get("num_hidden_layers"),
                    num_heads=heads, num_kv_heads=get("num_key_value_heads") or heads,
                    head_dim=get("head_dim") or get("hidden_size") // heads,
                    mlp_dim=get("intermediate_size"),
                    max_positions=get("max_position_embeddings"),
                    norm_epsilon=float(get("rms_norm_eps")),
                    rope_theta=rope_theta(hf_config, source),
                    attention_bias=bool(get("attention_bias")), mlp_bias=bool(get("mlp_bias")))
  except ConfigError as e:
    raise CheckpointError(f"{source}: {e}") from e


def hf_model_type(config: LMConfig) -> str:
  """"gpt2" or "llama": the Hugging Face architecture `config` is exactly; else CheckpointError."""
  switches = (config.norm, config.positions, config.mlp)
  if (switches == ("layernorm", "learned", "gelu_tanh") and config.attention_bias
      and config.mlp_bias and config.num_kv_heads == config.num_heads
      and config.joined_kv == config.emb_dim):
    return "gpt2"
  if switches == ("rmsnorm", "rope", "swiglu"):
    return "llama"
  raise CheckpointError(
      f"this decoder-only config (norm {config.norm}, positions {config.positions}, mlp "
      f"{config.mlp}, biases {config.attention_bias}/{config.mlp_bias}, heads "
      f"{config.num_heads}/{config.num_kv_heads}) has no Hugging Face GPT-2 or Llama "
      "equivalent")


def config_to_hf_dict(config: LMConfig, dtype: str | None = None) -> dict[str, Any]:
  """A transformers GPT-2 or Llama config.json dict for `config`."""
  kind = hf_model_type(config)
  ids = dict(bos_token_id=config.bos_id, eos_token_id=config.eos_id,
             pad_token_id=config.pad_id, tie_word_embeddings=config.tie_embeddings)
  d: dict[str, Any]
  if kind == "gpt2":
    d = dict(vocab_size=config.vocab_size, n_positions=config.max_positions,
             n_embd=config.emb_dim, n_layer=config.num_layers, n_head=config.num_heads,
             n_inner=config.mlp_dim, activation_function="gelu_new",
             layer_norm_epsilon=config.norm_epsilon, resid_pdrop=config.dropout_rate,
             embd_pdrop=config.dropout_rate, attn_pdrop=0.0, **ids)
  else:
    d = dict(vocab_size=config.vocab_size, hidden_size=config.emb_dim,
             intermediate_size=config.mlp_dim, num_hidden_layers=config.num_layers,
             num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
             head_dim=config.head_dim, hidden_act="silu",
             max_position_embeddings=config.max_positions, rms_norm_eps=config.norm_epsilon,
             rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
             rope_theta=config.rope_theta, attention_bias=config.attention_bias,
             mlp_bias=config.mlp_bias, **ids)
  d = {"architectures": [ARCHITECTURES[kind]], "model_type": kind, **d}
  if dtype is not None:
    d["dtype"] = dtype
  return d


# ----------------------------------------------------------------------------- names


def name_map(config: LMConfig) -> list[tuple[str, tuple[str, ...], str]]:
  """(HF name, our flat keys, op) for every parameter but the output layer. op: "copy",
  "transpose" ([out, in] -> [in, out]) or "split" (GPT-2's c_attn: the last axis in three)."""
  kind = hf_model_type(config)
  names: list[tuple[str, tuple[str, ...], str]] = []
  if kind == "gpt2":
    names += [("transformer.wte.weight", ("token_embedder/embedding",), "copy"),
              ("transformer.wpe.weight", ("position_embedder/embedding",), "copy")]
    for i in range(config.num_layers):
      hf_, us = f"transformer.h.{i}", f"decoder/layers_{i}"
      attn = f"{us}/self_attention"
      for hf_norm, norm in (("ln_1", "pre_self_attention_layer_norm"),
                            ("ln_2", "pre_mlp_layer_norm")):
        names += [(f"{hf_}.{hf_norm}.weight", (f"{us}/{norm}/scale",), "copy"),
                  (f"{hf_}.{hf_norm}.bias", (f"{us}/{norm}/bias",), "copy")]
      for part, ours in (("weight", "kernel"), ("bias", "bias")):
        names += [(f"{hf_}.attn.c_attn.{part}",
                   tuple(f"{attn}/{p}/{ours}" for p in ("query", "key", "value")), "split"),
                  (f"{hf_}.attn.c_proj.{part}", (f"{attn}/out/{ours}",), "copy"),
                  (f"{hf_}.mlp.c_fc.{part}", (f"{us}/mlp/wi/{ours}",), "copy"),
                  (f"{hf_}.mlp.c_proj.{part}", (f"{us}/mlp/wo/{ours}",), "copy")]
    names += [("transformer.ln_f.weight", ("decoder/decoder_norm/scale",), "copy"),
              ("transformer.ln_f.bias", ("decoder/decoder_norm/bias",), "copy")]
    return names
  names.append(("model.embed_tokens.weight", ("token_embedder/embedding",), "copy"))
  for i in range(config.num_layers):
    hf_, us = f"model.layers.{i}", f"decoder/layers_{i}"
    names += [(f"{hf_}.input_layernorm.weight", (f"{us}/pre_self_attention_layer_norm/scale",),
               "copy"),
              (f"{hf_}.post_attention_layernorm.weight", (f"{us}/pre_mlp_layer_norm/scale",),
               "copy")]
    for hf_part, ours, biased in (
        ("self_attn.q_proj", "self_attention/query", config.attention_bias),
        ("self_attn.k_proj", "self_attention/key", config.attention_bias),
        ("self_attn.v_proj", "self_attention/value", config.attention_bias),
        ("self_attn.o_proj", "self_attention/out", config.attention_bias),
        ("mlp.gate_proj", "mlp/wi_0", config.mlp_bias),
        ("mlp.up_proj", "mlp/wi_1", config.mlp_bias),
        ("mlp.down_proj", "mlp/wo", config.mlp_bias)):
      names.append((f"{hf_}.{hf_part}.weight", (f"{us}/{ours}/kernel",), "transpose"))
      if biased:
        names.append((f"{hf_}.{hf_part}.bias", (f"{us}/{ours}/bias",), "copy"))
  names.append(("model.norm.weight", ("decoder/decoder_norm/scale",), "copy"))
  return names


def _embedding_name(config: LMConfig) -> str:
  return name_map(config)[0][0]


# ----------------------------------------------------------------------------- weights


def _matched_names(state: Mapping[str, object], config: LMConfig,
                   source: str) -> list[tuple[str, tuple[str, ...], str]]:
  """`name_map(config)` once `state`'s tensor names (HF names) are checked against it:
  every mapped one present, no other but lm_head.weight and the ignored buffers."""
  names = name_map(config)
  known = {n for n, _, _ in names} | {"lm_head.weight"}
  missing = sorted(n for n, _, _ in names if n not in state)
  unexpected = sorted(n for n in state if n not in known and not n.endswith(_IGNORED_SUFFIXES))
  if missing or unexpected:
    raise CheckpointError(
        f"{source}: tensors do not match the config ({config.family}, {config.num_layers} "
        f"layers, biases {config.attention_bias}/{config.mlp_bias}): missing {missing[:8]}"
        f"{' ...' if len(missing) > 8 else ''}; unexpected {unexpected[:8]}")
  return names


def hf_to_params(state: Mapping[str, np.ndarray], config: LMConfig,
                 source: str = "state dict") -> dict[str, np.ndarray]:
  """HF state dict (numpy, HF names) -> flat params ("/"-joined keys) of `config`."""
  names = _matched_names(state, config, source)
  flat = {}
  for name, keys, op in names:
    w = state[name]
    if op == "transpose":
      flat[keys[0]] = np.ascontiguousarray(w.T)
    elif op == "split":
      for key, part in zip(keys, np.split(w, 3, axis=-1), strict=True):
        flat[key] = np.ascontiguousarray(part)
    else:
      flat[keys[0]] = w
  if not config.tie_embeddings:
    if "lm_head.weight" not in state:
      raise CheckpointError(f"{source}: lm_head.weight is missing and the output layer is "
                            "not tied to the embedding (tie_word_embeddings false)")
    flat["decoder/logits_dense/kernel"] = np.ascontiguousarray(state["lm_head.weight"].T)
  return flat


def params_to_hf_state_dict(params: Mapping[str, Any], config: LMConfig) -> dict[str, np.ndarray]:
  """Nested or flat params -> HF state dict of contiguous numpy arrays (``lm_head.weight``
  only when the output is untied, as transformers saves a tied model)."""
  flat = {k: np.asarray(v) for k, v in tree.flatten(params).items()}
  tree.validate(flat, config, "params")
  state = {}
  for name, keys, op in name_map(config):
    if op == "transpose":
      state[name] = np.ascontiguousarray(flat[keys[0]].T)
    elif op == "split":
      state[name] = np.ascontiguousarray(np.concatenate([flat[k] for k in keys], axis=-1))
    else:
      state[name] = np.ascontiguousarray(flat[keys[0]])
  if not config.tie_embeddings:
    state["lm_head.weight"] = np.ascontiguousarray(flat["decoder/logits_dense/kernel"].T)
  return state


def _normalise_names(state: dict[str, Any], kind: str) -> dict[str, Any]:
  """GPT-2 files saved from the bare `GPT2Model` (the original "gpt2" on the Hub) lack the
  "transformer." prefix."""
  if kind == "gpt2" and not any(k.startswith("transformer.") for k in state):
    return {k if k == "lm_head.weight" else f"transformer.{k}": v for k, v in state.items()}
  return state


def _is_tied(state: Mapping[str, np.ndarray], hf_config: Mapping[str, Any],
             embedding: str) -> bool:
  """The output layer is the embedding: no lm_head in the file (as transformers saves a tied
  model), or one equal to the embedding with tie_word_embeddings set."""
  head = state.get("lm_head.weight")
  if head is None:   # untied without a head: `hf_to_params` says it is missing
    return bool(_get(hf_config, "tie_word_embeddings"))
  emb = state.get(embedding)
  return (bool(_get(hf_config, "tie_word_embeddings")) and emb is not None
          and head.shape == emb.shape and np.array_equal(head, emb))


def load(directory: str) -> tuple[LMConfig, dict[str, np.ndarray]]:
  """(config, flat params) of a local HF GPT-2 / Llama directory."""
  if resolve.is_gcs(directory):
    raise CheckpointError(f"{directory}: Hugging Face dirs are read from local disk only")
  files = hf.weight_files(directory)   # first: a .bin-only dir gets the safetensors message
  source = os.path.join(directory, hf.CONFIG_NAME)
  hf_config = resolve.read_json(directory, hf.CONFIG_NAME)
  if hf_config is None:
    raise CheckpointError(f"{source}: not found; a Hugging Face model dir needs its config.json")
  kind = model_type(hf_config, source)
  config = config_from_hf_dict(hf_config, source=source)   # config errors before reading
  state = _normalise_names(hf.read_state_dict(directory, files), kind)
  config = config.replace(tie_embeddings=_is_tied(state, hf_config, _embedding_name(config)))
  return config, hf_to_params(state, config, directory)


def export_hf(path: str | os.PathLike, config: LMConfig, params: Mapping[str, Any]) -> str:
  """Write a transformers GPT-2 / Llama dir (config.json + model.safetensors); its path.

  ``AutoModelForCausalLM.from_pretrained(path)`` gives exactly these weights.
  """
  path = os.fspath(path)
  state = params_to_hf_state_dict(params, config)
  dtypes = {str(v.dtype) for v in state.values()}
  hf_config = config_to_hf_dict(config, dtype=dtypes.pop() if len(dtypes) == 1 else None)
  os.makedirs(path, exist_ok=True)
  files.write_safetensors(state, os.path.join(path, hf.WEIGHTS_NAME),
                          metadata={"format": "pt"})
  with open(os.path.join(path, hf.CONFIG_NAME), "w") as f:
    json.dump(hf_config, f, indent=2)
  return path


# ----------------------------------------------------------------------------- by slices


def _columns(leaf: leaves.Leaf, start: int, width: int) -> leaves.Leaf:
  """Columns [start, start + width) of `leaf`'s last axis as a leaf (GPT-2's fused c_attn
  split into query, key and value): a block read is a block of the stored tensor."""
  def read(index: leaves.Index) -> np.ndarray:
    last = index[-1]
    return leaf.read(tuple(index[:-1]) + (slice(start + last.start, start + last.stop),))
  return leaves.Leaf(tuple(leaf.shape[:-1]) + (width,), leaf.dtype, read)


def open_leaves(directory: str) -> tuple[LMConfig, dict[str, leaves.Leaf]]:
  """(config, flat leaves) of a local HF GPT-2 / Llama dir, nothing read but headers and
  config (and lm_head compared with the embedding, block by block, when both are stored):
  `load` by slices, for `leaves.to_device`. The leaves hold `load`'s values."""
  if resolve.is_gcs(directory):
    raise CheckpointError(f"{directory}: Hugging Face dirs are read from local disk only")
  files = hf.weight_files(directory)
  source = os.path.join(directory, hf.CONFIG_NAME)
  hf_config = resolve.read_json(directory, hf.CONFIG_NAME)
  if hf_config is None:
    raise CheckpointError(f"{source}: not found; a Hugging Face model dir needs its config.json")
  kind = model_type(hf_config, source)
  config = config_from_hf_dict(hf_config, source=source)
  state: dict[str, leaves.Leaf] = {}
  for file, tensors in files.items():
    state.update(hf.safetensors_leaves(os.path.join(directory, file), tensors))
  state = _normalise_names(state, kind)
  head, emb = state.get("lm_head.weight"), state.get(_embedding_name(config))
  tie = bool(_get(hf_config, "tie_word_embeddings"))
  tied = tie if head is None else (tie and emb is not None and leaves.equal(head, emb))
  config = config.replace(tie_embeddings=tied)
  names = _matched_names(state, config, directory)
  flat: dict[str, leaves.Leaf] = {}
  for name, keys, op in names:
    leaf = state[name]
    if op == "transpose":
      flat[keys[0]] = leaves.transposed(leaf)
    elif op == "split":
      width = leaf.shape[-1] // 3
      for i, key in enumerate(keys):
        flat[key] = _columns(leaf, i * width, width)
    else:
      flat[keys[0]] = leaf
  if not tied:
    if head is None:
      raise CheckpointError(f"{directory}: lm_head.weight is missing and the output layer is "
                            "not tied to the embedding (tie_word_embeddings false)")
    flat["decoder/logits_dense/kernel"] = leaves.transposed(head)
  return config, flat
