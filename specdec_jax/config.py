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
import json
import pathlib
import re
from typing import Any

import jax.numpy as jnp

from specdec_jax.errors import ConfigError
from specdec_jax.io import package_data

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

# Keys some T5X/fixture config files carry that describe storage, not architecture.
_IGNORED_KEYS = frozenset({"params_dtype_in_checkpoint", "tied_logits_scale", "name", "comment"})
_ACTIVATIONS = frozenset({"gelu", "relu", "linear", "gelu_exact", "silu"})




@dataclasses.dataclass(frozen=True)
class T5Config:
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
    if self.dtype not in ("float32", "bfloat16", "float16"):
      raise ConfigError(f"T5Config.dtype must be float32, bfloat16 or float16, got {self.dtype!r}")

  @property
  def activation_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def joined_kv(self) -> int:
    return self.num_heads * self.head_dim

  def replace(self, **changes) -> "T5Config":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["mlp_activations"] = list(self.mlp_activations)
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "T5Config":
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - fields - _IGNORED_KEYS)
    if unknown:
      raise ConfigError(f"unknown T5 config keys {unknown}; known keys: {sorted(fields)}")
    return cls(**{k: v for k, v in d.items() if k in fields})

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


def available_configs() -> list[str]:
  """Names of the configs shipped in ``specdec_jax/configs/models/`` (sorted)."""
  root = package_data.model_configs()
  if not root.is_dir():
    return []
  return sorted(f.name[:-len(".json")] for f in root.iterdir()
                if f.name.endswith(".json") and f.is_file())


def get_config(name_or_path: str | pathlib.Path, **overrides):
  """A named config (``"t5_1_1_small"``) or a path to a JSON config file: a `T5Config`, or an
  `LMConfig` (decoder-only) for a file with a "family" key (``"gpt2_tiny"``)."""
  path = pathlib.Path(name_or_path)
  if path.suffix == ".json" and path.is_file():
    source, text = str(path), _read_text(path)
  else:
    resource = package_data.model_configs() / f"{name_or_path}.json"
    if not (isinstance(name_or_path, str) and _NAME_RE.fullmatch(name_or_path)
            and resource.is_file()):
      raise ConfigError(
          f"unknown config {str(name_or_path)!r}; named configs: {', '.join(available_configs())}"
          " (or give a path to a .json file)")
    source, text = f"named config {name_or_path!r}", resource.read_text(encoding="utf-8")
  try:
    d = json.loads(text)
  except json.JSONDecodeError as e:
    raise ConfigError(f"config file {source} is not valid JSON: {e}") from e
  if not isinstance(d, dict):
    raise ConfigError(f"config file {source} must hold a JSON object, got {type(d).__name__}")
  d.update(overrides)
  if "family" in d:   # a decoder-only language model (models.lm_config)
    from specdec_jax.models.lm_config import LMConfig
    return LMConfig.from_dict(d)
  return T5Config.from_dict(d)


def _read_text(path: pathlib.Path) -> str:
  try:
    return path.read_text(encoding="utf-8")
  except (OSError, UnicodeDecodeError) as e:
    raise ConfigError(f"cannot read config file {path}: {e}") from e
