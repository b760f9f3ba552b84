"""Hugging Face Gemma 4 assistants ("gemma4_assistant") -> `GemmaAssistantConfig` and the
assistant's parameter tree (`models.gemma_assistant`).

A directory saved by transformers' `Gemma4AssistantForCausalLM`: ``config.json`` (its
layers in ``text_config``, every layer's K/V shared: ``num_kv_shared_layers`` equal to
the layer count) and safetensors weights. Names (nn.Linear weights [out, in], transposed)::

    pre_projection, post_projection              pre_projection, post_projection
    model.embed_tokens                           token_embedder (tied output)
    model.layers.i.self_attn.{q,o}_proj          decoder/layers_i/self_attention/{query,out}
    model.layers.i.self_attn.q_norm              .../self_attention/query_norm
    model.layers.i.<norms, layer_scalar, mlp>    as a Gemma 4 text layer (`hf_gemma`)
    model.norm                                   decoder/decoder_norm
    masked_embedding.centroids                   centroids          (use_ordered_embeddings)
    masked_embedding.token_ordering              token_ordering

Refused (`CheckpointError`, naming the setting): layers with K/V of their own, double-wide
MLPs, per-layer inputs, an output layer not tied to the embedding, and what `hf_gemma`
refuses for a text decoder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from specdec_jax.config.gemma import GemmaAssistantConfig
from specdec_jax.errors import ConfigError
from specdec_jax.io.checkpoints import hf, hf_gemma
from specdec_jax.io.checkpoints.errors import CheckpointError

MODEL_TYPE = "gemma4_assistant"
_K_V = ("self_attn.k_proj", "self_attn.v_proj", "self_attn.k_norm", "self_attn.v_norm")


def handles(hf_config: Mapping[str, Any]) -> bool:
  """Whether a config.json is a Gemma 4 assistant's (read here)."""
  return hf_config.get("model_type") == MODEL_TYPE


def config_from_hf_dict(hf_config: Mapping[str, Any], source: str = hf.CONFIG_NAME
                        ) -> GemmaAssistantConfig:
  """The `GemmaAssistantConfig` of a "gemma4_assistant" config.json dict."""
  text = dict(hf_config.get("text_config") or {})
  layers = text.get("num_hidden_layers")
  shared = text.pop("num_kv_shared_layers", None)
  if shared not in (None, layers):
    raise CheckpointError(f"{source}: num_kv_shared_layers={shared!r}: every layer of a Gemma 4 "
                          f"assistant reads the target's K/V ({layers} layers)")
  for key in ("use_double_wide_mlp", "vocab_size_per_layer_input"):
    if text.get(key):
      raise CheckpointError(f"{source}: {key}={text[key]!r} is not supported for a Gemma 4 "
                            "assistant")
  if hf_config.get("tie_word_embeddings", True) is False:
    raise CheckpointError(f"{source}: tie_word_embeddings false: a Gemma 4 assistant's output "
                          "layer is its embedding")
  text.setdefault("hidden_size_per_layer_input", 0)
  decoder = hf_gemma.config_from_hf_dict(text, source)
  ordered = bool(hf_config.get("use_ordered_embeddings", False))
  try:
    return GemmaAssistantConfig(
        decoder=decoder.replace(final_logit_softcap=None, tie_embeddings=True),
        backbone_dim=hf_config.get("backbone_hidden_size", 1536),
        num_centroids=hf_config.get("num_centroids", 2048) if ordered else None,
        centroid_top_k=hf_config.get("centroid_intermediate_top_k", 32))
  except ConfigError as e:
    raise CheckpointError(f"{source}: {e}") from e


def name_map(config: GemmaAssistantConfig) -> list[tuple[str, str, bool]]:
  """(HF name, our flat key, transposed) of every parameter."""
  names = [(n, k, t) for n, k, t in hf_gemma.name_map(config.decoder, "model")
           if not any(part in n for part in _K_V)]
  names += [("pre_projection.weight", "pre_projection/kernel", True),
            ("post_projection.weight", "post_projection/kernel", True)]
  if config.num_centroids is not None:
    names += [("masked_embedding.centroids.weight", "centroids/kernel", True),
              ("masked_embedding.token_ordering", "token_ordering", False)]
  return names


def load(directory: str) -> tuple[GemmaAssistantConfig, dict[str, np.ndarray]]:
  """(config, flat params) of a local Gemma 4 assistant directory."""
  files = hf.weight_files(directory)
  source = os.path.join(directory, hf.CONFIG_NAME)
  hf_config = hf_gemma._config_json(directory)[1]
  config = config_from_hf_dict(hf_config, source)     # config errors before the weights
  state = hf.read_state_dict(directory, files)
  names = name_map(config)
  known = {n for n, _, _ in names} | {"lm_head.weight"}
  missing = sorted(n for n, _, _ in names if n not in state)
  unexpected = sorted(n for n in state if n not in known)
  if missing or unexpected:
    raise CheckpointError(f"{source}: tensors do not match the Gemma 4 assistant config "
                          f"({config.decoder.num_layers} layers, centroids "
                          f"{config.num_centroids}): missing {missing[:8]}; unexpected "
                          f"{unexpected[:8]}")
  head = state.get("lm_head.weight")
  if head is not None and not np.array_equal(head, state["model.embed_tokens.weight"]):
    raise CheckpointError(f"{source}: lm_head.weight differs from the embedding: a Gemma 4 "
                          "assistant's output layer is its embedding")
  flat = {key: np.ascontiguousarray(state[name].T) if t else state[name]
          for name, key, t in names}
  if "token_ordering" in flat:
    order = flat["token_ordering"]
    if sorted(order.tolist()) != list(range(config.vocab_size)):
      raise CheckpointError(f"{source}: masked_embedding.token_ordering is not an ordering of "
                            f"the {config.vocab_size} tokens (transformers initialises it to "
                            "zeros; a trained assistant's is a permutation)")
    flat["token_ordering"] = order.astype(np.int32)
  return config, flat


def open_leaves(directory: str) -> Any:
  """Refused: an assistant is loaded whole (`sd.load` without mesh=)."""
  raise CheckpointError(f"{directory}: a Gemma 4 assistant is not loaded onto a mesh yet; "
                        "load it without mesh= (it is small: jit replicates it)")
