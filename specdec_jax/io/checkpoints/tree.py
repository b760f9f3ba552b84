"""The T5X parameter tree: flat names, expected shapes, validation, config inference.

Flat keys join T5X's nested names with "/", e.g. ``encoder/layers_0/attention/query/kernel``.
Kernels are 2-D ``[in, out]`` exactly as T5X stores them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from specdec_jax.config import GemmaConfig, T5Config, T5Gemma2Config, mlp_kernel_names
from specdec_jax.config.gemma import GemmaAssistantConfig
from specdec_jax.config.lm import LMConfig
from specdec_jax.errors import ConfigError
from specdec_jax.io.checkpoints.errors import CheckpointError

_ATTENTION_PARTS = ("query", "key", "value", "out")
_LAYER_RE = re.compile(r"^(encoder|decoder)/layers_(\d+)/")


def flatten(tree: Mapping[str, Any], is_leaf: Callable[[Any], bool] | None = None,
            prefix: str = "") -> dict[str, Any]:
  """Nested dict -> {"a/b/c": leaf}. ``is_leaf(dict)`` stops the descent at special dicts."""
  flat = {}
  for name, value in tree.items():
    key = f"{prefix}{name}"
    if isinstance(value, Mapping) and not (is_leaf and is_leaf(value)):
      flat.update(flatten(value, is_leaf, key + "/"))
    else:
      flat[key] = value
  return flat


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  """{"a/b/c": leaf} -> nested dict."""
  tree: dict[str, Any] = {}
  for key, value in flat.items():
    *parents, leaf = key.split("/")
    node = tree
    for name in parents:
      node = node.setdefault(name, {})
    node[leaf] = value
  return tree


def _attention_shapes(prefix: str, emb: int, joined: int) -> dict[str, tuple[int, ...]]:
  shapes: dict[str, tuple[int, ...]] = {f"{prefix}/{part}/kernel": (emb, joined)
                                        for part in _ATTENTION_PARTS[:3]}
  shapes[f"{prefix}/out/kernel"] = (joined, emb)
  return shapes


def _mlp_shapes(prefix: str, config: T5Config) -> dict[str, tuple[int, ...]]:
  e, m = config.emb_dim, config.mlp_dim
  shapes: dict[str, tuple[int, ...]] = {f"{prefix}/{name}/kernel": (e, m)
                                        for name in mlp_kernel_names(config.mlp_activations)}
  shapes[f"{prefix}/wo/kernel"] = (m, e)
  return shapes


def expected_shapes(config: T5Config | LMConfig) -> dict[str, tuple[int, ...]]:
  """Flat key -> shape of every parameter the config implies (T5X names, 2-D kernels)."""
  if isinstance(config, GemmaAssistantConfig):
    from specdec_jax.models import gemma_assistant
    return gemma_assistant.param_shapes(config)
  if isinstance(config, GemmaConfig):
    from specdec_jax.models import gemma
    return gemma.param_shapes(config)
  if isinstance(config, LMConfig):   # its module's tree
    from specdec_jax.models import lm
    return lm.param_shapes(config)
  if isinstance(config, T5Gemma2Config):
    from specdec_jax.models import t5gemma2
    return t5gemma2.param_shapes(config)
  e, hkv = config.emb_dim, config.joined_kv
  rel = (config.num_heads, config.relative_attention_num_buckets)
  shapes: dict[str, tuple[int, ...]] = {
      "token_embedder/embedding": (config.vocab_size, e),
      "encoder/relpos_bias/rel_embedding": rel,
      "encoder/encoder_norm/scale": (e,),
      "decoder/relpos_bias/rel_embedding": rel,
      "decoder/decoder_norm/scale": (e,),
  }
  for i in range(config.num_encoder_layers):
    p = f"encoder/layers_{i}"
    shapes[f"{p}/pre_attention_layer_norm/scale"] = (e,)
    shapes[f"{p}/pre_mlp_layer_norm/scale"] = (e,)
    shapes.update(_attention_shapes(f"{p}/attention", e, hkv))
    shapes.update(_mlp_shapes(f"{p}/mlp", config))
  for i in range(config.num_decoder_layers):
    p = f"decoder/layers_{i}"
    for norm in ("pre_self_attention_layer_norm", "pre_cross_attention_layer_norm",
                 "pre_mlp_layer_norm"):
      shapes[f"{p}/{norm}/scale"] = (e,)
    shapes.update(_attention_shapes(f"{p}/self_attention", e, hkv))
    shapes.update(_attention_shapes(f"{p}/encoder_decoder_attention", e, hkv))
    shapes.update(_mlp_shapes(f"{p}/mlp", config))
  if not config.logits_via_embedding:
    shapes["decoder/logits_dense/kernel"] = (e, config.vocab_size)
  return shapes


def _short_list(items: list[str], limit: int = 12) -> str:
  more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
  return ", ".join(items[:limit]) + more


def validate(flat: Mapping[str, Any], config: T5Config | LMConfig, source: str) -> None:
  """Raise CheckpointError unless ``flat`` holds exactly the config's keys with its shapes."""
  expected = expected_shapes(config)
  missing = sorted(set(expected) - set(flat))
  unexpected = sorted(set(flat) - set(expected))
  misshaped = [f"{k} {tuple(flat[k].shape)} (expected {expected[k]})"
               for k in sorted(set(expected) & set(flat))
               if tuple(getattr(flat[k], "shape", ())) != expected[k]]
  problems = [f"{label}: {_short_list(items)}" for label, items in
              (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshaped))
              if items]
  if problems:
    raise CheckpointError(
        f"{source}: parameters do not match the config ({_describe(config)}); "
        + "; ".join(problems))


def _describe(config) -> str:
  if isinstance(config, GemmaAssistantConfig):
    return (f"Gemma 4 assistant: {config.decoder.num_layers} layers of width "
            f"{config.decoder.emb_dim}, backbone {config.backbone_dim}, centroids "
            f"{config.num_centroids}")
  if getattr(config, "is_decoder_only", False):
    return (f"{config.family} LM: vocab {config.vocab_size}, emb {config.emb_dim}, heads "
            f"{config.num_heads}x{config.head_dim} (kv {config.num_kv_heads}), mlp "
            f"{config.mlp_dim}, layers {config.num_layers}, tie_embeddings "
            f"{config.tie_embeddings}")
  return (f"vocab {config.vocab_size}, emb {config.emb_dim}, heads "
          f"{config.num_heads}x{config.head_dim}, mlp {config.mlp_dim}, layers "
          f"{config.num_encoder_layers}/{config.num_decoder_layers}, activations "
          f"{list(config.mlp_activations)}, logits_via_embedding {config.logits_via_embedding}")


def _count_layers(flat: Mapping[str, Any], stack: str) -> int:
  indices = {int(m.group(2)) for k in flat if (m := _LAYER_RE.match(k)) and m.group(1) == stack}
  return max(indices) + 1 if indices else 0


def _shape(flat: Mapping[str, Any], key: str, source: str) -> tuple[int, ...]:
  if key not in flat:
    raise CheckpointError(
        f"{source}: cannot infer the model config from parameter shapes: {key} is missing "
        "(pass config= or put a config.json next to the checkpoint)")
  return tuple(flat[key].shape)


def infer_config(flat: Mapping[str, Any], source: str) -> T5Config:
  """Architecture implied by parameter shapes (fallback when a checkpoint has no config).

  vocab/emb from the embedding [vocab, emb], heads/buckets from encoder relpos [heads, 32],
  head_dim from query [emb, heads*head_dim], mlp from wo [mlp, emb], layer counts from names,
  ``wi`` -> ("relu",) (T5 1.0), ``wi_0, wi_1`` -> ("gelu", "linear") (T5 1.1), tied logits when
  ``decoder/logits_dense/kernel`` is absent. Other fields keep T5Config defaults.
  """
  vocab, emb = _shape(flat, "token_embedder/embedding", source)
  heads, buckets = _shape(flat, "encoder/relpos_bias/rel_embedding", source)
  joined = _shape(flat, "encoder/layers_0/attention/query/kernel", source)[1]
  mlp = _shape(flat, "encoder/layers_0/mlp/wo/kernel", source)[0]
  n_wi = sum(1 for k in flat if re.fullmatch(r"encoder/layers_0/mlp/wi(_\d+)?/kernel", k))
  if "encoder/layers_0/mlp/wi/kernel" in flat:
    activations: tuple[str, ...] = ("relu",)
  elif n_wi == 2:
    activations = ("gelu", "linear")
  else:
    raise CheckpointError(
        f"{source}: cannot infer mlp_activations from {n_wi} mlp input kernels; pass config=")
  if joined % heads:
    raise CheckpointError(
        f"{source}: query kernel width {joined} is not a multiple of {heads} heads")
  try:
    return T5Config(
        vocab_size=vocab, emb_dim=emb, num_heads=heads, head_dim=joined // heads, mlp_dim=mlp,
        num_encoder_layers=_count_layers(flat, "encoder"),
        num_decoder_layers=_count_layers(flat, "decoder"),
        mlp_activations=activations, relative_attention_num_buckets=buckets,
        logits_via_embedding="decoder/logits_dense/kernel" not in flat)
  except ConfigError as e:
    raise CheckpointError(f"{source}: inferred config is invalid: {e}") from e
