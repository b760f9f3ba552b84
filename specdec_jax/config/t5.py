"""T5 architecture configs: one frozen dataclass, read from declarative JSON files.

A named config is package data, ``specdec_jax/configs/models/<name>.json`` (the repository's
``configs/models`` links to it); a config file uses the key names of T5X's
``t5x.examples.t5.network.T5Config`` so a T5X user recognises every field::

    {"vocab_size": 32128, "emb_dim": 512, "num_heads": 6, "head_dim": 64,
     "mlp_dim": 1024, "num_encoder_layers": 8, "num_decoder_layers": 8,
     "mlp_activations": ["gelu", "linear"], "logits_via_embedding": false}

Unknown keys are an error (a typo must not silently fall back to a default);
a few descriptive keys written by T5X exports are accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specdec_jax.config.base import ModelConfig
from specdec_jax.errors import ConfigError

_ACTIVATIONS = frozenset({"gelu", "relu", "linear", "gelu_exact", "silu"})


@dataclasses.dataclass(frozen=True)
class T5Config(ModelConfig):
  """Architecture of a T5 encoder-decoder (T5 1.0, 1.1, Flan-T5, mT5).

  Attributes mirror T5X's network config. ``mlp_activations=("relu",)`` with
  ``logits_via_embedding=True`` is T5 1.0; ``("gelu", "linear")`` with untied
  logits is T5 1.1 / Flan-T5 / mT5.
  """

  vocab_size: int = 32128
  emb_dim: int = 512
  num_heads: int = 6
  head_dim: int = 64
  mlp_dim: int = 1024
  num_encoder_layers: int = 8
  num_decoder_layers: int = 8
  mlp_activations: tuple[str, ...] = ("gelu", "linear")
  logits_via_embedding: bool = False
  dtype: str = "float32"  # activation dtype; params are kept as loaded
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  dropout_rate: float = 0.0
  float32_attention_logits: bool = False  # accepted for T5X compatibility; we always use f32
  gelu_approximate: bool = True
  pad_id: int = 0
  eos_id: int = 1
  decoder_start_id: int = 0
  max_encoder_length: int | None = None  # None: no limit beyond memory

  def __post_init__(self):
    object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
    for name in ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim",
                 "num_encoder_layers", "num_decoder_layers",
                 "relative_attention_num_buckets", "relative_attention_max_distance"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ConfigError(f"T5Config.{name} must be a positive integer, got {value!r}")
    bad = [a for a in self.mlp_activations if a not in _ACTIVATIONS]
    if bad or not self.mlp_activations:
      raise ConfigError(
          f"T5Config.mlp_activations={self.mlp_activations!r}: each must be one of "
          f"{sorted(_ACTIVATIONS)}")
    self.check_dtype()

  KIND = "T5"
  # Keys some T5X/fixture config files carry that describe storage, not architecture.
  IGNORED_KEYS = frozenset({"params_dtype_in_checkpoint", "tied_logits_scale", "name", "comment"})

  def to_dict(self) -> dict[str, Any]:
    d = super().to_dict()
    d["mlp_activations"] = list(self.mlp_activations)
    return d

  def num_params(self) -> int:
    """Parameter count implied by the config (matches the T5X tree)."""
    e, h, m, v = self.emb_dim, self.joined_kv, self.mlp_dim, self.vocab_size
    n_wi = len(self.mlp_activations)
    attn = 4 * e * h
    mlp = n_wi * e * m + m * e
    enc = self.num_encoder_layers * (attn + mlp + 2 * e) + e
    dec = self.num_decoder_layers * (2 * attn + mlp + 3 * e) + e
    rel = 2 * self.num_heads * self.relative_attention_num_buckets
    out = 0 if self.logits_via_embedding else e * v
    return v * e + enc + dec + rel + out

  def decode_macs_per_token(self) -> int:
    """Weight multiply-accumulates to decode one token with cached K/V.

    Per decoder layer: self-attention Q, K, V, O (4 E·H), cross-attention Q and O
    (2 E·H; its K/V come from the cache), the MLP ((n_wi + 1) E·M); plus the
    output projection E·V. The encoder (once per input) and the attention over the
    cache (grows with length, small at these sizes) are not counted. This is the
    cost ratio c of the speculative-decoding analysis when a step is bound by
    reading weights.
    """
    e, h, m = self.emb_dim, self.joined_kv, self.mlp_dim
    layer = 6 * e * h + (len(self.mlp_activations) + 1) * e * m
    return self.num_decoder_layers * layer + e * self.vocab_size


def mlp_kernel_names(activations: tuple[str, ...]) -> list[str]:
  """T5X's names of the MLP's input kernels: ``wi`` for one activation, else ``wi_0, wi_1, ...``."""
  return ["wi"] if len(activations) == 1 else [f"wi_{i}" for i in range(len(activations))]
