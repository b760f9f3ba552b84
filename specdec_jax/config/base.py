"""What every model config shares: a frozen dataclass read from and written to a JSON dict.

`T5Config` (encoder-decoder) and `LMConfig` (decoder-only) subclass `ModelConfig`; the
engine reads the same names off either (`num_decoder_layers`, `joined_kv`,
`activation_dtype`, `is_decoder_only`, `eos_id`, `pad_id`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp

from specdec_jax.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16")


class ModelConfig:
  """The shared behaviour of the config dataclasses (the fields are the subclasses')."""

  KIND: ClassVar[str] = "model"                 # named in error messages
  IS_DECODER_ONLY: ClassVar[bool] = False
  IGNORED_KEYS: ClassVar[frozenset] = frozenset()   # descriptive keys accepted and dropped

  # Declared by the subclasses' fields.
  dtype: str
  num_heads: int
  head_dim: int

  @property
  def is_decoder_only(self) -> bool:
    return self.IS_DECODER_ONLY

  @property
  def activation_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def joined_kv(self) -> int:
    """Width of the attention's query (and, for T5, key/value) projection."""
    return self.num_heads * self.head_dim

  def check_dtype(self) -> None:
    if self.dtype not in DTYPES:
      raise ConfigError(f"{type(self).__name__}.dtype must be float32, bfloat16 or float16, "
                        f"got {self.dtype!r}")

  def replace(self, **changes: Any) -> Any:
    return dataclasses.replace(self, **changes)   # type: ignore[type-var]

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)   # type: ignore[call-overload]

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> Any:
    """The config of a JSON dict; unknown keys are an error (a typo must not silently fall
    back to a default), `IGNORED_KEYS` are dropped."""
    fields = {f.name for f in dataclasses.fields(cls)}   # type: ignore[arg-type]
    unknown = sorted(set(d) - fields - cls.IGNORED_KEYS)
    if unknown:
      raise ConfigError(f"unknown {cls.KIND} config keys {unknown}; known keys: "
                        f"{sorted(fields)}")
    try:
      return cls(**{k: v for k, v in d.items() if k in fields})
    except TypeError as e:
      raise ConfigError(f"invalid {cls.KIND} config: {e}") from e
