"""Hugging Face T5/mT5 directories <-> the T5X parameter tree.

HF ``nn.Linear`` weights are ``[out, in]``; T5X kernels are ``[in, out]``, so every kernel is
transposed. The relative-position tables are ``[buckets, heads]`` in HF, ``[heads, buckets]``
in T5X. Only safetensors weights are read; ``pytorch_model.bin`` is never unpickled.

Output layer, as transformers 5.x loads it: the weight is ``lm_head.weight`` when the file has it
(even if config.json says ``tie_word_embeddings: true`` but the values differ) and
``shared.weight`` otherwise; the decoder output is scaled by ``d_model**-0.5`` when
``scale_decoder_outputs`` (default: ``tie_word_embeddings`` is not false) for model_type t5,
never for mt5. T5X's ``logits_via_embedding`` is "tied AND scaled"; an untied but scaled head
(the tie trap) is loaded as ``logits_dense = lm_head.T * d_model**-0.5``, which gives the same
logits.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

from specdec_jax.config import T5Config
from specdec_jax.errors import ConfigError
from specdec_jax.io.checkpoints import files, leaves, resolve, tree
from specdec_jax.io.checkpoints.errors import CheckpointError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"

# transformers' defaults for keys a config.json may omit.
_HF_DEFAULTS = {
    "t5": dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
               feed_forward_proj="relu"),
    "mt5": dict(vocab_size=250112, d_model=512, d_kv=64, d_ff=1024, num_layers=8, num_heads=6,
                feed_forward_proj="gated-gelu"),
}
_COMMON_DEFAULTS = dict(relative_attention_num_buckets=32, relative_attention_max_distance=128,
                        layer_norm_epsilon=1e-6, dropout_rate=0.1, pad_token_id=0, eos_token_id=1)
# HF activation name -> our activation name ("gelu" is the tanh approximation in T5X/flax).
_ACT_FROM_HF = {"relu": "relu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu",
                "gelu": "gelu_exact", "gelu_python": "gelu_exact", "silu": "silu", "swish": "silu"}
_IGNORED_HF_KEYS = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)
_EMBED_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


# ----------------------------------------------------------------------------- config


def activations_from_hf(feed_forward_proj: str, source: str = CONFIG_NAME) -> tuple[str, ...]:
  """HF ``feed_forward_proj`` -> T5Config.mlp_activations.

  "relu" -> ("relu",); "gated-gelu" -> ("gelu", "linear") (HF's gelu_new = tanh approximation);
  "gated-relu" -> ("relu", "linear"); "gated-silu" -> ("silu", "linear");
  "gelu" (exact erf in HF) -> ("gelu_exact",).
  """
  parts = feed_forward_proj.split("-")
  gated = len(parts) == 2 and parts[0] == "gated"
  hf_act = "gelu_new" if feed_forward_proj == "gated-gelu" else parts[-1]
  if len(parts) > 2 or (len(parts) == 2 and not gated) or hf_act not in _ACT_FROM_HF:
    raise CheckpointError(
        f"{source}: unsupported feed_forward_proj {feed_forward_proj!r}; supported: "
        f"[gated-]{{{', '.join(sorted(_ACT_FROM_HF))}}}")
  act = _ACT_FROM_HF[hf_act]
  return (act, "linear") if gated else (act,)


def activation_to_hf(config: T5Config) -> str:
  """Inverse of ``activations_from_hf`` (honours ``gelu_approximate``)."""
  acts = config.mlp_activations
  if not (len(acts) == 1 or (len(acts) == 2 and acts[1] == "linear")) or acts[0] == "linear":
    raise CheckpointError(f"mlp_activations {list(acts)} have no Hugging Face T5 equivalent "
                          "(HF supports (act,) or (act, 'linear'))")
  act = acts[0]
  if act == "gelu" and not config.gelu_approximate:
    act = "gelu_exact"
  if len(acts) == 2 and act == "gelu":
    return "gated-gelu"  # HF maps exactly this string to gelu_new (tanh)
  if len(acts) == 2 and act == "gelu_exact":
    return "gated-gelu_python"  # "gated-gelu" would be the tanh approximation
  hf_act = {"relu": "relu", "gelu": "gelu_new", "gelu_exact": "gelu", "silu": "silu"}[act]
  return f"gated-{hf_act}" if len(acts) == 2 else hf_act


def _get(hf_config: Mapping[str, Any], key: str) -> Any:
  value = hf_config.get(key)
  if value is None:
    defaults = _HF_DEFAULTS.get(hf_config.get("model_type", "t5"), _HF_DEFAULTS["t5"])
    value = defaults.get(key, _COMMON_DEFAULTS.get(key))
  return value


def hf_scales_logits(hf_config: Mapping[str, Any]) -> bool:
  """Whether transformers multiplies the decoder output by d_model**-0.5 before lm_head."""
  if hf_config.get("model_type") == "mt5":
    return False
  if hf_config.get("scale_decoder_outputs") is not None:
    return bool(hf_config["scale_decoder_outputs"])
  return hf_config.get("tie_word_embeddings", True) is not False


def _model_type(hf_config: Mapping[str, Any], source: str) -> str:
  model_type = hf_config.get("model_type")
  if model_type not in _HF_DEFAULTS:
    raise CheckpointError(f"{source}: model_type {model_type!r} is not supported "
                          f"(supported: {sorted(_HF_DEFAULTS)})")
  return model_type


def config_from_hf_dict(hf_config: Mapping[str, Any],
                        state_dict: Mapping[str, np.ndarray] | None = None,
                        source: str = CONFIG_NAME) -> T5Config:
  """T5Config from a HF T5/mT5 config.json dict.

  ``logits_via_embedding`` is true when HF scales the output and the output weight is the
  embedding; given ``state_dict``, a present ``lm_head.weight`` that differs from
  ``shared.weight`` makes it false (the tie trap).
  """
  _model_type(hf_config, source)
  eos = _get(hf_config, "eos_token_id")
  eos = eos[0] if isinstance(eos, (list, tuple)) else eos
  pad = _get(hf_config, "pad_token_id")
  start = hf_config.get("decoder_start_token_id")
  tied = hf_scales_logits(hf_config)
  if tied and state_dict is not None:
    tied = output_kernel(state_dict, hf_config, source) is None
  try:
    return T5Config(
        vocab_size=_get(hf_config, "vocab_size"), emb_dim=_get(hf_config, "d_model"),
        num_heads=_get(hf_config, "num_heads"), head_dim=_get(hf_config, "d_kv"),
        mlp_dim=_get(hf_config, "d_ff"), num_encoder_layers=_get(hf_config, "num_layers"),
        num_decoder_layers=hf_config.get("num_decoder_layers") or _get(hf_config, "num_layers"),
        mlp_activations=activations_from_hf(_get(hf_config, "feed_forward_proj"), source),
        logits_via_embedding=tied,
        relative_attention_num_buckets=_get(hf_config, "relative_attention_num_buckets"),
        relative_attention_max_distance=_get(hf_config, "relative_attention_max_distance"),
        layer_norm_epsilon=float(_get(hf_config, "layer_norm_epsilon")),
        dropout_rate=float(_get(hf_config, "dropout_rate")),
        pad_id=pad, eos_id=eos, decoder_start_id=pad if start is None else start)
  except ConfigError as e:
    raise CheckpointError(f"{source}: {e}") from e


def config_to_hf_dict(config: T5Config, dtype: str | None = None) -> dict[str, Any]:
  """A transformers T5 config.json dict (model_type t5, ``tie_word_embeddings`` explicit)."""
  hf = {
      "architectures": ["T5ForConditionalGeneration"],
      "model_type": "t5",
      "vocab_size": config.vocab_size,
      "d_model": config.emb_dim,
      "d_kv": config.head_dim,
      "d_ff": config.mlp_dim,
      "num_layers": config.num_encoder_layers,
      "num_decoder_layers": config.num_decoder_layers,
      "num_heads": config.num_heads,
      "relative_attention_num_buckets": config.relative_attention_num_buckets,
      "relative_attention_max_distance": config.relative_attention_max_distance,
      "layer_norm_epsilon": config.layer_norm_epsilon,
      "dropout_rate": config.dropout_rate,
      "feed_forward_proj": activation_to_hf(config),
      "tie_word_embeddings": bool(config.logits_via_embedding),
      "is_encoder_decoder": True,
      "use_cache": True,
      "initializer_factor": 1.0,
      "pad_token_id": config.pad_id,
      "eos_token_id": config.eos_id,
      "decoder_start_token_id": config.decoder_start_id,
  }
  if dtype is not None:
    hf["dtype"] = dtype
  return hf


# ----------------------------------------------------------------------------- names


def _attention_names(hf: str, t5x: str) -> list[tuple[str, str, bool]]:
  return [(f"{hf}.{a}.weight", f"{t5x}/{b}/kernel", True)
          for a, b in (("q", "query"), ("k", "key"), ("v", "value"), ("o", "out"))]


def _mlp_names(hf: str, t5x: str, gated: bool) -> list[tuple[str, str, bool]]:
  wi = ["wi_0", "wi_1"] if gated else ["wi"]
  return [(f"{hf}.{n}.weight", f"{t5x}/{n}/kernel", True) for n in wi + ["wo"]]


def name_map(num_encoder_layers: int, num_decoder_layers: int,
             gated: bool) -> list[tuple[str, str, bool]]:
  """(HF name, T5X flat key, transpose?) for every parameter except the output layer."""
  names = [
      ("shared.weight", "token_embedder/embedding", False),
      ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
       "encoder/relpos_bias/rel_embedding", True),
      ("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
       "decoder/relpos_bias/rel_embedding", True),
      ("encoder.final_layer_norm.weight", "encoder/encoder_norm/scale", False),
      ("decoder.final_layer_norm.weight", "decoder/decoder_norm/scale", False),
  ]
  for i in range(num_encoder_layers):
    hf, t5x = f"encoder.block.{i}.layer", f"encoder/layers_{i}"
    names.append((f"{hf}.0.layer_norm.weight", f"{t5x}/pre_attention_layer_norm/scale", False))
    names += _attention_names(f"{hf}.0.SelfAttention", f"{t5x}/attention")
    names.append((f"{hf}.1.layer_norm.weight", f"{t5x}/pre_mlp_layer_norm/scale", False))
    names += _mlp_names(f"{hf}.1.DenseReluDense", f"{t5x}/mlp", gated)
  for i in range(num_decoder_layers):
    hf, t5x = f"decoder.block.{i}.layer", f"decoder/layers_{i}"
    names.append((f"{hf}.0.layer_norm.weight", f"{t5x}/pre_self_attention_layer_norm/scale",
                  False))
    names += _attention_names(f"{hf}.0.SelfAttention", f"{t5x}/self_attention")
    names.append((f"{hf}.1.layer_norm.weight", f"{t5x}/pre_cross_attention_layer_norm/scale",
                  False))
    names += _attention_names(f"{hf}.1.EncDecAttention", f"{t5x}/encoder_decoder_attention")
    names.append((f"{hf}.2.layer_norm.weight", f"{t5x}/pre_mlp_layer_norm/scale", False))
    names += _mlp_names(f"{hf}.2.DenseReluDense", f"{t5x}/mlp", gated)
  return names


def _is_gated(hf_config: Mapping[str, Any], source: str) -> bool:
  return len(activations_from_hf(_get(hf_config, "feed_forward_proj"), source)) == 2


def _layer_counts(hf_config: Mapping[str, Any]) -> tuple[int, int]:
  n_enc = _get(hf_config, "num_layers")
  return n_enc, hf_config.get("num_decoder_layers") or n_enc


# ----------------------------------------------------------------------------- weights


def output_kernel(state_dict: Mapping[str, np.ndarray], hf_config: Mapping[str, Any],
                  source: str = "state dict") -> np.ndarray | None:
  """T5X ``decoder/logits_dense/kernel`` [emb, vocab] giving transformers' logits, or None
  when they are T5X's tied logits (embedding, scaled by emb**-0.5)."""
  if "shared.weight" not in state_dict:
    raise CheckpointError(f"{source}: shared.weight (the token embedding) is missing")
  shared = state_dict["shared.weight"]
  lm_head = state_dict.get("lm_head.weight")
  same = lm_head is None or (lm_head.shape == shared.shape and np.array_equal(lm_head, shared))
  scaled = hf_scales_logits(hf_config)
  if scaled and same:
    return None
  weight = shared if lm_head is None else lm_head
  if not scaled:
    return np.ascontiguousarray(weight.T)
  scale = np.float32(_get(hf_config, "d_model")) ** np.float32(-0.5)
  return np.ascontiguousarray((weight.astype(np.float32).T * scale).astype(weight.dtype))


def checked_names(tensors: Mapping[str, Any], hf_config: Mapping[str, Any],
                  source: str) -> list[tuple[str, str, bool]]:
  """`name_map` for this config; CheckpointError unless `tensors` (HF names) hold exactly
  its tensors (plus lm_head, ignored keys and embedding aliases)."""
  names = name_map(*_layer_counts(hf_config), _is_gated(hf_config, source))
  missing = [hf for hf, _, _ in names if hf not in tensors]
  known = {hf for hf, _, _ in names} | {"lm_head.weight", *_IGNORED_HF_KEYS, *_EMBED_ALIASES}
  unexpected = sorted(set(tensors) - known)
  if missing or unexpected:
    raise CheckpointError(
        f"{source}: tensors do not match the HF config (layers {_layer_counts(hf_config)}, "
        f"feed_forward_proj {_get(hf_config, 'feed_forward_proj')!r}): missing {missing[:8]}"
        f"{' ...' if len(missing) > 8 else ''}; unexpected {unexpected[:8]}")
  return names


def hf_to_t5x_params(state_dict: Mapping[str, np.ndarray], hf_config: Mapping[str, Any],
                     source: str = "state dict") -> dict[str, Any]:
  """HF T5 state dict (numpy, HF names) -> nested T5X params (kernels transposed to [in, out])."""
  names = checked_names(state_dict, hf_config, source)
  for alias in _EMBED_ALIASES:
    if alias in state_dict and not np.array_equal(state_dict[alias], state_dict["shared.weight"]):
      raise CheckpointError(f"{source}: {alias} differs from shared.weight; untied input "
                            "embeddings have no T5X equivalent")
  flat = {t5x: np.ascontiguousarray(state_dict[hf].T) if transpose else state_dict[hf]
          for hf, t5x, transpose in names}
  kernel = output_kernel(state_dict, hf_config, source)
  if kernel is not None:
    flat["decoder/logits_dense/kernel"] = kernel
  return tree.unflatten(flat)


def t5x_to_hf_state_dict(params: Mapping[str, Any], config: T5Config) -> dict[str, np.ndarray]:
  """Nested (or flat "/"-keyed) T5X params -> HF T5 state dict of contiguous numpy arrays.

  ``lm_head.weight`` [vocab, emb] is written only when the logits are untied.
  """
  flat = {k: np.asarray(v) for k, v in tree.flatten(params).items()}
  tree.validate(flat, config, "params")
  names = name_map(config.num_encoder_layers, config.num_decoder_layers,
                   len(config.mlp_activations) == 2)
  state = {hf: np.ascontiguousarray(flat[t5x].T if transpose else flat[t5x])
           for hf, t5x, transpose in names}
  if not config.logits_via_embedding:
    state["lm_head.weight"] = np.ascontiguousarray(flat["decoder/logits_dense/kernel"].T)
  return state


# ----------------------------------------------------------------------------- files


def _bin_files(names: list[str]) -> list[str]:
  return [n for n in names if re.fullmatch(r"pytorch_model.*\.bin(\.index\.json)?", n)]


def weight_files(directory: str) -> Mapping[str, list[str] | None]:
  """{safetensors file: tensor names it must hold (None: all)} for a HF dir."""
  names = resolve.list_dir(directory)
  if WEIGHTS_NAME in names:
    return {WEIGHTS_NAME: None}
  if INDEX_NAME in names:
    index = resolve.read_json(directory, INDEX_NAME)
    weight_map = None if index is None else index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise CheckpointError(f"{os.path.join(directory, INDEX_NAME)}: no 'weight_map'")
    files: dict[str, list[str]] = {}
    for tensor, file in weight_map.items():
      files.setdefault(file, []).append(tensor)
    return files
  shards = [n for n in names if re.fullmatch(r"model-.*\.safetensors", n)]
  if shards:
    return {n: None for n in shards}
  bins = _bin_files(names)
  if bins:
    raise CheckpointError(
        f"{directory}: holds only PyTorch pickle weights ({', '.join(bins)}); safetensors is "
        "required (pickles are never loaded). Re-save with "
        "model.save_pretrained(dir, safe_serialization=True)")
  raise CheckpointError(f"{directory}: no {WEIGHTS_NAME} (or sharded model-*.safetensors with "
                        f"{INDEX_NAME}) found; only safetensors weights are read (PyTorch .bin "
                        "pickles are never loaded)")


def read_safetensors(path: str, names: list[str] | None = None) -> dict[str, np.ndarray]:
  """Tensors of one safetensors file as numpy arrays in their stored dtype (bf16 via ml_dtypes)."""
  if not os.path.isfile(path):
    raise CheckpointError(f"{path}: safetensors file not found")
  try:
    with safetensors.safe_open(path, framework="numpy") as f:
      keys = f.keys()
      absent = sorted(set(names or ()) - set(keys))
      if absent:
        raise CheckpointError(f"{path}: missing tensors listed in the index: {absent[:8]}")
      return {k: f.get_tensor(k) for k in (names if names is not None else keys)}
  except CheckpointError:
    raise
  except Exception as e:  # SafetensorError: truncated header/data, bad JSON, ...
    raise CheckpointError(f"{path}: corrupt or truncated safetensors file: {e}") from e


def read_state_dict(directory: str,
                    files: Mapping[str, list[str] | None] | None = None) -> dict[str, np.ndarray]:
  """All tensors of a HF dir (single or sharded safetensors)."""
  state: dict[str, np.ndarray] = {}
  for file, names in (files if files is not None else weight_files(directory)).items():
    state.update(read_safetensors(os.path.join(directory, file), names))
  return state


def load(directory: str) -> tuple[T5Config, dict[str, np.ndarray]]:
  """(config, flat T5X params) of a local HF T5/mT5 directory."""
  if resolve.is_gcs(directory):
    raise CheckpointError(f"{directory}: Hugging Face dirs are read from local disk only")
  files = weight_files(directory)  # first: a .bin-only dir gets the safetensors message
  source = os.path.join(directory, CONFIG_NAME)
  hf_config = resolve.read_json(directory, CONFIG_NAME)
  if hf_config is None:
    raise CheckpointError(f"{source}: not found; a Hugging Face T5 dir needs its config.json")
  _model_type(hf_config, source)
  state = read_state_dict(directory, files)
  config = config_from_hf_dict(hf_config, state, source)
  params = hf_to_t5x_params(state, hf_config, directory)
  return config, tree.flatten(params)


def safetensors_leaves(path: str, names: list[str] | None = None) -> dict[str, leaves.Leaf]:
  """The tensors of one safetensors file as leaves read by slices (`safe_open().get_slice`):
  a block is read from the file's memory map without the rest of its tensor."""
  if not os.path.isfile(path):
    raise CheckpointError(f"{path}: safetensors file not found")
  try:
    with safetensors.safe_open(path, framework="numpy") as f:
      keys = list(f.keys())
      absent = sorted(set(names or ()) - set(keys))
      if absent:
        raise CheckpointError(f"{path}: missing tensors listed in the index: {absent[:8]}")
      heads = {k: f.get_slice(k) for k in (names if names is not None else keys)}
      meta: dict[str, tuple[tuple[int, ...], Any]] = {  # dtype None: refused below
          k: (tuple(h.get_shape()), _SAFETENSORS_DTYPES.get(h.get_dtype()))
              for k, h in heads.items()}
  except CheckpointError:
    raise
  except Exception as e:  # SafetensorError: truncated header/data, bad JSON, ...
    raise CheckpointError(f"{path}: corrupt or truncated safetensors file: {e}") from e
  unknown = sorted(k for k, (_, dtype) in meta.items() if dtype is None)
  if unknown:
    raise CheckpointError(f"{path}: tensors {unknown[:5]} have a dtype this loader does not "
                          f"read (supported: {', '.join(_SAFETENSORS_DTYPES)})")

  def reader(name: str):
    def read(index: leaves.Index) -> np.ndarray:
      try:
        with safetensors.safe_open(path, framework="numpy") as f:
          return f.get_slice(name)[index]
      except Exception as e:
        raise CheckpointError(f"{path}: cannot read {name}{list(index)}: {e}") from e
    return read

  return {k: leaves.Leaf(shape, dtype, reader(k)) for k, (shape, dtype) in meta.items()}


# safetensors dtype names -> numpy dtypes (bfloat16 through ml_dtypes).
_SAFETENSORS_DTYPES = {"F64": np.dtype("float64"), "F32": np.dtype("float32"),
                       "F16": np.dtype("float16"), "BF16": np.dtype(ml_dtypes.bfloat16),
                       "I64": np.dtype("int64"), "I32": np.dtype("int32")}


def open_leaves(directory: str) -> tuple[T5Config, dict[str, leaves.Leaf]]:
  """(config, flat T5X leaves) of a local HF T5/mT5 dir, nothing read but headers and
  config (and the output layer compared with the embedding, block by block, when both
  are stored): `load` by slices, for `leaves.to_device`."""
  if resolve.is_gcs(directory):
    raise CheckpointError(f"{directory}: Hugging Face dirs are read from local disk only")
  files = weight_files(directory)
  source = os.path.join(directory, CONFIG_NAME)
  hf_config = resolve.read_json(directory, CONFIG_NAME)
  if hf_config is None:
    raise CheckpointError(f"{source}: not found; a Hugging Face T5 dir needs its config.json")
  _model_type(hf_config, source)
  state: dict[str, leaves.Leaf] = {}
  for file, tensors in files.items():
    state.update(safetensors_leaves(os.path.join(directory, file), tensors))
  names = checked_names(state, hf_config, directory)
  if "shared.weight" not in state:
    raise CheckpointError(f"{directory}: shared.weight (the token embedding) is missing")
  shared = state["shared.weight"]
  for alias in _EMBED_ALIASES:
    if alias in state and not leaves.equal(state[alias], shared):
      raise CheckpointError(f"{directory}: {alias} differs from shared.weight; untied input "
                            "embeddings have no T5X equivalent")
  flat = {t5x: leaves.transposed(state[hf]) if transpose else state[hf]
          for hf, t5x, transpose in names}
  # The output layer, as `output_kernel` derives it.
  lm_head = state.get("lm_head.weight")
  scaled = hf_scales_logits(hf_config)
  tied = scaled and (lm_head is None or leaves.equal(lm_head, shared))
  if not tied:
    weight = shared if lm_head is None else lm_head
    scale = float(np.float32(_get(hf_config, "d_model")) ** np.float32(-0.5)) if scaled else None
    flat["decoder/logits_dense/kernel"] = leaves.transposed(weight, scale)
  config = config_from_hf_dict(hf_config, None, source).replace(logits_via_embedding=tied)
  return config, flat


def _common_dtype(state: Mapping[str, np.ndarray]) -> str | None:
  dtypes = {str(v.dtype) for v in state.values()}
  return dtypes.pop() if len(dtypes) == 1 else None


def export_hf(path: str | os.PathLike, config: T5Config, params: Mapping[str, Any]) -> str:
  """Write a transformers T5 dir (config.json + model.safetensors); returns its path.

  ``T5ForConditionalGeneration.from_pretrained(path)`` gives exactly these weights.
  """
  path = os.fspath(path)
  state = t5x_to_hf_state_dict(params, config)
  hf_config = config_to_hf_dict(config, dtype=_common_dtype(state))
  os.makedirs(path, exist_ok=True)
  files.write_safetensors(state, os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt"})
  with open(os.path.join(path, CONFIG_NAME), "w") as f:
    json.dump(hf_config, f, indent=2)
  return path
