"""Decoder-only language model architectures: one frozen dataclass, read from JSON.

Two families fix the defaults of the architectural switches; any switch given explicitly
overrides its family's value:

  family   norm       positions  mlp        biases  tied output  norm_epsilon
  "gpt2"   layernorm  learned    gelu_tanh  yes     yes          1e-5
  "llama"  rmsnorm    rope       swiglu     no      no           1e-6

    {"family": "llama", "vocab_size": 512, "emb_dim": 64, "num_layers": 2,
     "num_heads": 4, "num_kv_heads": 2, "mlp_dim": 176}

A named config is package data beside the T5 ones (``specdec_jax/configs/models/<name>.json``);
`sd.get_config` reads a file with a "family" key as an `LMConfig`. Unknown keys are an error.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from specdec_jax.config.base import ModelConfig
from specdec_jax.errors import ConfigError

FAMILIES = {
    "gpt2": dict(norm="layernorm", positions="learned", mlp="gelu_tanh", attention_bias=True,
                 mlp_bias=True, tie_embeddings=True, norm_epsilon=1e-5),
    "llama": dict(norm="rmsnorm", positions="rope", mlp="swiglu", attention_bias=False,
                  mlp_bias=False, tie_embeddings=False, norm_epsilon=1e-6),
}
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
MLPS = ("gelu_tanh", "swiglu", "geglu")
#: The default of the fields __post_init__ fills (from the family, or from other fields):
#: None, typed as Any so that the fields carry the type they have once the config exists.
_FILLED: Any = None


@dataclasses.dataclass(frozen=True)
class LMConfig(ModelConfig):
  """Architecture of a decoder-only Transformer (GPT-2 or Llama style).

  Attributes:
    family: "gpt2" or "llama": the defaults of the switches left None.
    num_kv_heads: key/value heads (grouped-query attention); None: num_heads.
    head_dim: None: emb_dim // num_heads.
    mlp_dim: None: 4 * emb_dim.
    norm: "layernorm" (scale and bias, centred) or "rmsnorm" (scale only).
    positions: "learned" (a [max_positions, emb] table added to the embedding) or "rope"
      (rotary, Hugging Face's rotate-half layout, base `rope_theta`).
    mlp: "gelu_tanh" (two matrices, GPT-2), "swiglu" (gate, up, down; Llama) or "geglu"
      (gate, up, down with the tanh gelu on the gate; Gemma).
    attention_bias, mlp_bias: biases on the attention / MLP projections.
    tie_embeddings: output logits through the token embedding (no scaling).
    max_positions: longest sequence (the learned table's size; informational for rope).
    pad_id: the id right-padded prompts are padded with; bos_id: None when there is none.
  """

  family: str = "llama"
  vocab_size: int = 32000
  emb_dim: int = 512
  num_layers: int = 8
  num_heads: int = 8
  num_kv_heads: int = _FILLED
  head_dim: int = _FILLED
  mlp_dim: int = _FILLED
  norm: str = _FILLED
  positions: str = _FILLED
  mlp: str = _FILLED
  attention_bias: bool = _FILLED
  mlp_bias: bool = _FILLED
  tie_embeddings: bool = _FILLED
  max_positions: int = 2048
  rope_theta: float = 10000.0
  norm_epsilon: float = _FILLED
  dropout_rate: float = 0.0
  dtype: str = "float32"  # activation dtype; params are kept as loaded
  pad_id: int = 0
  bos_id: int | None = None
  eos_id: int = 1

  #: The families this class builds (a subclass, e.g. `GemmaConfig`, has its own).
  FAMILIES: ClassVar[dict[str, dict[str, Any]]] = FAMILIES

  def __post_init__(self):
    if self.family not in self.FAMILIES:
      raise ConfigError(f"{type(self).__name__}.family must be one of {sorted(self.FAMILIES)}, "
                        f"got {self.family!r}")
    for name, value in self.FAMILIES[self.family].items():
      if getattr(self, name) is None:
        object.__setattr__(self, name, value)
    for name, value in (("num_kv_heads", self.num_heads), ("mlp_dim", 4 * self.emb_dim)):
      if getattr(self, name) is None:
        object.__setattr__(self, name, value)
    if self.head_dim is None and isinstance(self.num_heads, int) and self.num_heads > 0:
      if self.emb_dim % self.num_heads:
        raise ConfigError(f"LMConfig: emb_dim {self.emb_dim} is not a multiple of num_heads "
                          f"{self.num_heads}; give head_dim explicitly")
      object.__setattr__(self, "head_dim", self.emb_dim // self.num_heads)
    self._validate()

  def _validate(self) -> None:
    for name in ("vocab_size", "emb_dim", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "mlp_dim", "max_positions"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"LMConfig.{name} must be a positive integer, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(f"LMConfig: num_heads {self.num_heads} is not a multiple of "
                        f"num_kv_heads {self.num_kv_heads} (grouped-query attention shares "
                        "each key/value head among num_heads / num_kv_heads query heads)")
    for name, choices in (("norm", NORMS), ("positions", POSITIONS), ("mlp", MLPS)):
      if getattr(self, name) not in choices:
        raise ConfigError(f"LMConfig.{name} must be one of {list(choices)}, got "
                          f"{getattr(self, name)!r}")
    for name in ("attention_bias", "mlp_bias", "tie_embeddings"):
      if not isinstance(getattr(self, name), bool):
        raise ConfigError(f"LMConfig.{name} must be true or false, got {getattr(self, name)!r}")
    if self.positions == "rope" and self.head_dim % 2:
      raise ConfigError(f"LMConfig: rotary positions need an even head_dim, got {self.head_dim}")
    if not self.rope_theta > 0 or not self.norm_epsilon > 0:
      raise ConfigError(f"LMConfig: rope_theta ({self.rope_theta}) and norm_epsilon "
                        f"({self.norm_epsilon}) must be positive")
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ConfigError(f"LMConfig.dropout_rate must be in [0, 1), got {self.dropout_rate}")
    self.check_dtype()
    for name in ("pad_id", "bos_id", "eos_id"):
      value = getattr(self, name)
      if value is None and name == "bos_id":
        continue
      if not isinstance(value, int) or not 0 <= value < self.vocab_size:
        raise ConfigError(f"LMConfig.{name} must be a token id in [0, {self.vocab_size}), got "
                          f"{value!r}")

  # The names the decoding engine reads off any model config.
  @property
  def num_decoder_layers(self) -> int:
    return self.num_layers

  @property
  def kv_dim(self) -> int:
    """Width of the key (and value) projection: num_kv_heads * head_dim."""
    return self.num_kv_heads * self.head_dim

  KIND = "decoder-only"
  IS_DECODER_ONLY = True
  IGNORED_KEYS = frozenset({"name", "comment"})

  def num_params(self) -> int:
    """Parameter count implied by the config (matches the parameter tree)."""
    e, m, v = self.emb_dim, self.mlp_dim, self.vocab_size
    q, kv = self.joined_kv, self.kv_dim
    attn = e * q + 2 * e * kv + q * e
    if self.attention_bias:
      attn += q + 2 * kv + e
    n_in = 1 if self.mlp == "gelu_tanh" else 2
    mlp = n_in * e * m + m * e + ((n_in * m + e) if self.mlp_bias else 0)
    norm = 2 * e if self.norm == "layernorm" else e
    layer = attn + mlp + 2 * norm
    pos = self.max_positions * e if self.positions == "learned" else 0
    out = 0 if self.tie_embeddings else e * v
    return v * e + pos + self.num_layers * layer + norm + out

  def decode_macs_per_token(self) -> int:
    """Weight multiply-accumulates to decode one token with cached K/V (see T5Config's)."""
    e, m = self.emb_dim, self.mlp_dim
    n_in = 1 if self.mlp == "gelu_tanh" else 2
    layer = 2 * e * self.joined_kv + 2 * e * self.kv_dim + (n_in + 1) * e * m
    return self.num_layers * layer + e * self.vocab_size
