"""T5Gemma 2 encoder-decoders (text): `T5Gemma2Config`, a `T5Config` with Gemma 3's layers.

T5Gemma 2 (`T5Gemma2ForConditionalGeneration`: 270M-270M, 1B-1B, 4B-4B) is an
encoder-decoder built from Gemma 3 layers:

    {"family": "t5gemma2", "vocab_size": 256, "emb_dim": 64, "num_heads": 4,
     "num_kv_heads": 2, "head_dim": 16, "mlp_dim": 128, "num_encoder_layers": 3,
     "num_decoder_layers": 2, "encoder_layer_types": ["sliding", "sliding", "full"],
     "decoder_layer_types": ["sliding", "full"], "sliding_window": 8}

What every layer does (transformers' `T5Gemma2EncoderLayer` / `T5Gemma2DecoderLayer`):
RMSNorms before AND after the attention and the MLP, each multiplying by 1 + its weight
(Gemma 3's norm), RMSNorms over each head of the queries and keys (1 + weight; values
unnormed), rotary positions with a base per layer type (sliding: `rope_theta`, full:
`global_rope_theta`, with a linear `global_rope_factor`), queries scaled by
query_pre_attn_scalar ** -0.5, a gated MLP with the tanh gelu. The embedding, shared by
both stacks and tied to the output layer, is scaled by sqrt(emb_dim), except the
end-of-image token's (`eoi_id`), which reads a vector of its own unscaled. The logits are
soft-capped where `final_logit_softcap` is set.

The decoder's attention is MERGED: one softmax over its own causal keys and the encoder's
(cross) keys, both projected by the same Q/K/V/O weights; the cross keys are normed but
not rotated. An encoder sliding layer's query at p sees the keys at [p - (w - 1) // 2,
p + w // 2] (transformers' bidirectional window of w = `sliding_window`); a decoder
sliding layer's query at p sees its own keys at (p - w, p] and every cross key.

The T5 fields that T5Gemma 2 has no use for keep their defaults (relative position
buckets) or are fixed (`mlp_activations` the gated tanh gelu); `logits_via_embedding`
says whether the output layer is the embedding (tied, unscaled) or a `logits_dense`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specdec_jax.config.t5 import T5Config
from specdec_jax.errors import ConfigError

LAYER_TYPES = ("sliding", "full")
_FILLED: Any = None


def default_layer_types(num_layers: int) -> tuple[str, ...]:
  """transformers' default: five sliding layers, then a full one."""
  return tuple("sliding" if (i + 1) % 6 else "full" for i in range(num_layers))


@dataclasses.dataclass(frozen=True)
class T5Gemma2Config(T5Config):
  """A T5Gemma 2 text encoder-decoder (see the module docstring); `T5Config`'s fields plus:

  Attributes:
    family: "t5gemma2" (what tells a JSON config from a T5 one).
    num_kv_heads: key/value heads (grouped-query attention); None: num_heads.
    encoder_layer_types, decoder_layer_types: "sliding" or "full" per layer; None: five
      sliding then one full.
    sliding_window: the window of the sliding layers (see the module docstring).
    rope_theta, global_rope_theta: the rotary base of the sliding / full layers.
    global_rope_factor: the full layers' linear rope scaling (positions divided by it).
    query_pre_attn_scalar: queries are scaled by its inverse square root.
    final_logit_softcap: logits become cap * tanh(logits / cap); None: none.
    attn_logit_softcap: each attention logit (queries scaled) becomes cap * tanh(logit /
      cap) before the mask (Gemma 2's soft-capping, `kernels.shapes`); None: none.
    eoi_id: the end-of-image token, embedded by a vector of its own.
  """

  family: str = "t5gemma2"
  logits_via_embedding: bool = True
  layer_norm_epsilon: float = 1e-6
  decoder_start_id: int = 2
  num_kv_heads: int = _FILLED
  encoder_layer_types: tuple[str, ...] = _FILLED
  decoder_layer_types: tuple[str, ...] = _FILLED
  sliding_window: int = 4096
  rope_theta: float = 10_000.0
  global_rope_theta: float = 1_000_000.0
  global_rope_factor: float = 1.0
  query_pre_attn_scalar: float = 256.0
  final_logit_softcap: float | None = None
  attn_logit_softcap: float | None = None
  eoi_id: int = 256_000

  def __post_init__(self):
    for name, layers in (("encoder_layer_types", self.num_encoder_layers),
                         ("decoder_layer_types", self.num_decoder_layers)):
      given = getattr(self, name)
      object.__setattr__(self, name, default_layer_types(layers) if given is None
                         else tuple(given))
    if self.num_kv_heads is None:
      object.__setattr__(self, "num_kv_heads", self.num_heads)
    super().__post_init__()
    self._validate_t5gemma2()

  def _validate_t5gemma2(self) -> None:
    if self.family != "t5gemma2":
      raise ConfigError(f"T5Gemma2Config.family must be 't5gemma2', got {self.family!r}")
    for name, layers in (("encoder_layer_types", self.num_encoder_layers),
                         ("decoder_layer_types", self.num_decoder_layers)):
      types = getattr(self, name)
      if len(types) != layers or any(t not in LAYER_TYPES for t in types):
        raise ConfigError(f"T5Gemma2Config.{name} must give one of {list(LAYER_TYPES)} for "
                          f"each of the {layers} layers, got {list(types)}")
    for name in ("num_kv_heads", "sliding_window", "eoi_id"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"T5Gemma2Config.{name} must be a positive integer, got {value!r}")
    if self.num_heads % self.num_kv_heads or self.head_dim % 2:
      raise ConfigError(f"T5Gemma2Config: num_kv_heads {self.num_kv_heads} must divide "
                        f"num_heads {self.num_heads} and head_dim {self.head_dim} be even")
    if self.mlp_activations != ("gelu", "linear") or not self.gelu_approximate:
      raise ConfigError(f"T5Gemma2Config.mlp_activations must be ['gelu', 'linear'] with "
                        f"gelu_approximate (the gated tanh gelu), got "
                        f"{list(self.mlp_activations)}")
    for name in ("rope_theta", "global_rope_theta", "global_rope_factor",
                 "query_pre_attn_scalar"):
      value = getattr(self, name)
      if not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"T5Gemma2Config.{name} must be positive, got {value!r}")
    for name in ("final_logit_softcap", "attn_logit_softcap"):
      cap = getattr(self, name)
      if cap is not None and not (isinstance(cap, (int, float)) and cap > 0):
        raise ConfigError(f"T5Gemma2Config.{name} must be positive or null, got {cap!r}")

  def to_dict(self) -> dict[str, Any]:
    d = super().to_dict()
    for name in ("encoder_layer_types", "decoder_layer_types"):
      d[name] = list(d[name])
    return d

  @property
  def kv_dim(self) -> int:
    """Width of the key and value projections: num_kv_heads * head_dim."""
    return self.num_kv_heads * self.head_dim

  def num_params(self) -> int:
    """Parameter count implied by the config (matches the parameter tree)."""
    e, h, kv, m, v = self.emb_dim, self.joined_kv, self.kv_dim, self.mlp_dim, self.vocab_size
    layer = 2 * e * h + 2 * e * kv + 3 * e * m + 4 * e + 2 * self.head_dim
    out = 0 if self.logits_via_embedding else e * v
    return (v * e + e + (self.num_encoder_layers + self.num_decoder_layers) * layer + 2 * e
            + out)

  def decode_macs_per_token(self) -> int:
    """Weight multiply-accumulates to decode one token with cached K/V: per decoder layer
    its Q, K, V, O (the cross K/V are cached) and gated MLP; plus the output layer."""
    e, h, kv, m = self.emb_dim, self.joined_kv, self.kv_dim, self.mlp_dim
    return self.num_decoder_layers * (2 * e * h + 2 * e * kv + 3 * e * m) + e * self.vocab_size
