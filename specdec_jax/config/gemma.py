"""Gemma 4 text decoders: `GemmaConfig`, an `LMConfig` with Gemma's layer types; its
drafter, `GemmaAssistantConfig`.

Gemma 4 (`Gemma4ForCausalLM`, the text decoder of `Gemma4ForConditionalGeneration`)
interleaves sliding-window layers and full (global) layers, each type with its own rotary
base, head size and key/value heads:

    {"family": "gemma4", "vocab_size": 256, "emb_dim": 64, "num_layers": 4, "num_heads": 4,
     "num_kv_heads": 2, "head_dim": 16, "mlp_dim": 128,
     "layer_types": ["sliding", "sliding", "sliding", "full"], "sliding_window": 8,
     "global_head_dim": 32, "global_num_kv_heads": 1, "attention_k_eq_v": true,
     "final_logit_softcap": 30.0}

What every Gemma 4 layer does (transformers' `Gemma4TextDecoderLayer`): RMSNorms before
AND after the attention and the MLP, RMSNorms over each head of the queries and keys
(scaled) and the values (unscaled), queries unscaled (scaling 1), a gated MLP with the
tanh gelu, and the layer's output times a stored scalar. The embedding is scaled by
sqrt(emb_dim) and tied to the output layer; the logits are soft-capped where
`final_logit_softcap` is set. A sliding layer's query at position p attends to the keys
at positions (p - sliding_window, p]. Full layers rotate the first `global_rope_fraction`
of each head's angle pairs (transformers' "proportional" rope) and keep the rest.

The small targets (E2B, E4B) add per-layer inputs (`per_layer_dim`: each layer's output gets
a gated projection of a per-layer embedding of the token plus a projection of its embedded
state) and layers that share K/V (`num_kv_shared_layers`: the last layers compute queries
only and read the K/V of the last earlier layer of their type, which alone is cached; with
`double_wide_mlp` their MLPs are twice as wide). Not implemented, refused by the
checkpoint reader: mixture-of-experts blocks and bidirectional attention.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from specdec_jax.config.lm import LMConfig
from specdec_jax.errors import ConfigError

GEMMA_FAMILIES = {
    "gemma4": dict(norm="rmsnorm", positions="rope", mlp="geglu", attention_bias=False,
                   mlp_bias=False, tie_embeddings=True, norm_epsilon=1e-6),
}
LAYER_TYPES = ("sliding", "full")
_FILLED: Any = None


def default_layer_types(num_layers: int) -> tuple[str, ...]:
  """transformers' default: five sliding layers then a full one, the last layer full."""
  types = ["sliding" if (i + 1) % 6 else "full" for i in range(num_layers)]
  types[-1] = "full"
  return tuple(types)


@dataclasses.dataclass(frozen=True)
class GemmaConfig(LMConfig):
  """A Gemma 4 text decoder (see the module docstring); `LMConfig`'s fields plus:

  Attributes:
    layer_types: "sliding" or "full" per layer; None: five sliding then one full, the
      last layer full.
    sliding_window: keys a sliding layer's query sees, itself included.
    global_head_dim: a full layer's head size; None: head_dim.
    global_num_kv_heads: a full layer's key/value heads; None: num_kv_heads.
    global_rope_theta: a full layer's rotary base (`rope_theta` is the sliding layers').
    rope_fraction, global_rope_fraction: the share of each head's angle pairs rotated in
      sliding / full layers (the rest keep angle 0).
    attention_k_eq_v: full layers have no value projection: values are the projected
      keys before their norm and rotation.
    final_logit_softcap: logits become cap * tanh(logits / cap); None: none.
    attn_logit_softcap: each attention logit q . k becomes cap * tanh(q . k / cap)
      before the mask (Gemma 2's soft-capping, `kernels.shapes`); None: none (Gemma 4).
    per_layer_dim: P of the per-layer inputs (`hidden_size_per_layer_input`); 0: none.
    num_kv_shared_layers: the last layers that compute no K/V of their own: each reads
      the K/V of the last earlier layer of its type (`kv_source`); 0: none.
    double_wide_mlp: the K/V-shared layers' MLPs are 2 * mlp_dim wide.
  """

  family: str = "gemma4"
  layer_types: tuple[str, ...] = _FILLED
  sliding_window: int = 512
  global_head_dim: int = _FILLED
  global_num_kv_heads: int = _FILLED
  global_rope_theta: float = 1_000_000.0
  rope_fraction: float = 1.0
  global_rope_fraction: float = 1.0
  attention_k_eq_v: bool = False
  final_logit_softcap: float | None = None
  attn_logit_softcap: float | None = None
  per_layer_dim: int = 0
  num_kv_shared_layers: int = 0
  double_wide_mlp: bool = False

  FAMILIES: ClassVar[dict[str, dict[str, Any]]] = GEMMA_FAMILIES

  def __post_init__(self):
    types = (default_layer_types(self.num_layers) if self.layer_types is None
             else tuple(self.layer_types))
    object.__setattr__(self, "layer_types", types)
    super().__post_init__()
    for name, value in (("global_head_dim", self.head_dim),
                        ("global_num_kv_heads", self.num_kv_heads)):
      if getattr(self, name) is None:
        object.__setattr__(self, name, value)
    self._validate_gemma()

  def _validate_gemma(self) -> None:
    if len(self.layer_types) != self.num_layers or any(
        t not in LAYER_TYPES for t in self.layer_types):
      raise ConfigError(f"GemmaConfig.layer_types must give one of {list(LAYER_TYPES)} for each "
                        f"of the {self.num_layers} layers, got {list(self.layer_types)}")
    for name in ("sliding_window", "global_head_dim", "global_num_kv_heads"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"GemmaConfig.{name} must be a positive integer, got {value!r}")
    if self.num_heads % self.global_num_kv_heads or self.global_head_dim % 2:
      raise ConfigError(f"GemmaConfig: global_num_kv_heads {self.global_num_kv_heads} must "
                        f"divide num_heads {self.num_heads} and global_head_dim "
                        f"{self.global_head_dim} be even")
    for name in ("rope_fraction", "global_rope_fraction"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ConfigError(f"GemmaConfig.{name} must lie in [0, 1], got {getattr(self, name)}")
    if not self.global_rope_theta > 0:
      raise ConfigError(f"GemmaConfig.global_rope_theta must be positive, got "
                        f"{self.global_rope_theta}")
    for name in ("final_logit_softcap", "attn_logit_softcap"):
      cap = getattr(self, name)
      if cap is not None and not (isinstance(cap, (int, float)) and cap > 0):
        raise ConfigError(f"GemmaConfig.{name} must be positive or null, got {cap!r}")
    self._validate_small()

  def _validate_small(self) -> None:
    for name in ("per_layer_dim", "num_kv_shared_layers"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"GemmaConfig.{name} must be a non-negative integer, got {value!r}")
    first, shared = self.cached_layers, self.layer_types[self.cached_layers:]
    if self.num_kv_shared_layers and (first < 1 or any(
        self.last_cached_layer(kind) is None for kind in shared)):
      raise ConfigError(f"GemmaConfig.num_kv_shared_layers {self.num_kv_shared_layers}: each "
                        f"shared layer ({list(shared)}) reads an earlier layer of its type, "
                        f"and layers {list(self.layer_types[:first])} are not shared")

  @property
  def cached_layers(self) -> int:
    """The layers that compute and cache K/V: the first num_layers - num_kv_shared_layers."""
    return self.num_layers - self.num_kv_shared_layers

  def last_cached_layer(self, kind: str) -> int | None:
    """The last layer of type `kind` ("sliding", "full") that computes and caches K/V
    (transformers' "store" layer); None if no cached layer is of that type."""
    cached = self.layer_types[:self.cached_layers]
    return len(cached) - 1 - cached[::-1].index(kind) if kind in cached else None

  def kv_source(self, layer: int) -> int:
    """The layer whose K/V `layer` attends to: itself, or for a shared layer the last
    cached layer of its type (validated to exist)."""
    if layer < self.cached_layers:
      return layer
    source = self.last_cached_layer(self.layer_types[layer])
    assert source is not None, (layer, self.layer_types)   # __post_init__ checked it
    return source

  def layer_mlp_dim(self, layer: int) -> int:
    """The hidden width of layer `layer`'s MLP."""
    wide = self.double_wide_mlp and layer >= self.cached_layers
    return self.mlp_dim * (2 if wide else 1)

  def layer_shape(self, layer: int) -> tuple[int, int]:
    """(key/value heads, head size) of layer `layer` (its K/V cache's [Hkv, Dh])."""
    if self.layer_types[layer] == "full":
      return self.global_num_kv_heads, self.global_head_dim
    return self.num_kv_heads, self.head_dim

  @property
  def windowed(self) -> bool:
    """Whether some layer attends through a sliding window."""
    return "sliding" in self.layer_types

  def num_params(self) -> int:
    """Parameter count implied by the config (matches the parameter tree)."""
    e, v, p, n = self.emb_dim, self.vocab_size, self.per_layer_dim, self.num_layers
    total = v * e + e + (v * n * p + e * n * p + p if p else 0)
    for i in range(n):
      hkv, d = self.layer_shape(i)
      shared_v = self.attention_k_eq_v and self.layer_types[i] == "full"
      kv = (1 if shared_v else 2) * e * hkv * d + d if i < self.cached_layers else 0
      attn = 2 * e * self.num_heads * d + d + kv
      total += attn + 3 * e * self.layer_mlp_dim(i) + 4 * e + 1 + (2 * e * p + e if p else 0)
    return total

  def decode_macs_per_token(self) -> int:
    """Weight multiply-accumulates to decode one token with cached K/V."""
    e, p = self.emb_dim, self.per_layer_dim
    total = e * self.vocab_size + e * self.num_layers * p
    for i in range(self.num_layers):
      hkv, d = self.layer_shape(i)
      kv = 2 * e * hkv * d if i < self.cached_layers else 0
      total += 2 * e * self.num_heads * d + kv + 3 * e * self.layer_mlp_dim(i) + 2 * e * p
    return total


def lm_config_from_dict(d: dict[str, Any]) -> Any:
  """The decoder-only config of a JSON dict with a "family" key: a `GemmaConfig` for a
  Gemma family, else an `LMConfig`."""
  cls = GemmaConfig if d.get("family") in GEMMA_FAMILIES else LMConfig
  return cls.from_dict(d)


@dataclasses.dataclass(frozen=True)
class GemmaAssistantConfig:
  """The Gemma 4 assistant (transformers' `Gemma4AssistantForCausalLM`, "gemma4_assistant"):
  a drafter whose layers have queries only and read a Gemma 4 target's cached K/V.

  Attributes:
    decoder: its layers (`GemmaConfig`: emb_dim, heads, layer types, window, rotary
      bases, norms; the key/value heads and head sizes are those of the target's layers
      it reads). Its K/V projections do not exist; its output layer is tied to its
      embedding and is not soft-capped.
    backbone_dim: the target's hidden size E_t: it reads [the target's embedding of a
      token, the target's final state] (2 E_t) and carries an E_t state between drafts.
    num_centroids: None, or the centroids whose tokens alone get logits
      (`use_ordered_embeddings`); the vocabulary splits into num_centroids equal blocks
      of a stored token ordering.
    centroid_top_k: the centroids kept per draft (`centroid_intermediate_top_k`).
  """

  decoder: GemmaConfig
  backbone_dim: int
  num_centroids: int | None = None
  centroid_top_k: int = 32

  def __post_init__(self):
    if not isinstance(self.decoder, GemmaConfig):
      raise ConfigError(f"GemmaAssistantConfig.decoder must be a GemmaConfig, got "
                        f"{type(self.decoder).__name__}")
    for name in ("backbone_dim", "centroid_top_k"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"GemmaAssistantConfig.{name} must be a positive integer, got "
                          f"{value!r}")
    c = self.num_centroids
    if c is not None:
      if not isinstance(c, int) or isinstance(c, bool) or c < 1 or self.vocab_size % c:
        raise ConfigError(f"GemmaAssistantConfig.num_centroids must divide the vocabulary "
                          f"({self.vocab_size}), got {c!r}")
      if self.centroid_top_k > c:
        raise ConfigError(f"GemmaAssistantConfig.centroid_top_k {self.centroid_top_k} exceeds "
                          f"num_centroids {c}")

  @property
  def vocab_size(self) -> int:
    return self.decoder.vocab_size

  @property
  def activation_dtype(self) -> Any:
    return self.decoder.activation_dtype

  def replace(self, **changes: Any) -> "GemmaAssistantConfig":
    return dataclasses.replace(self, **changes)


def assistant_config_from_dict(d: dict[str, Any]) -> GemmaAssistantConfig:
  """A `GemmaAssistantConfig` of a JSON dict: {"decoder": {GemmaConfig's keys},
  "backbone_dim": E_t, "num_centroids": C or null, "centroid_top_k": k}; "name" and
  "comment" are dropped."""
  keys = {f.name for f in dataclasses.fields(GemmaAssistantConfig)}
  unknown = sorted(set(d) - keys - {"name", "comment"})
  if unknown:
    raise ConfigError(f"GemmaAssistantConfig: unknown keys {unknown}; expected {sorted(keys)}")
  if not isinstance(d.get("decoder"), dict):
    raise ConfigError("GemmaAssistantConfig: 'decoder' must be an object of GemmaConfig's keys")
  return GemmaAssistantConfig(decoder=GemmaConfig.from_dict(d["decoder"]),
                              **{k: v for k, v in d.items() if k in keys - {"decoder"}})
