"""Named configs: the JSON files shipped as package data, and config files on disk.

``sd.get_config("t5_1_1_small")`` reads ``specdec_jax/configs/models/t5_1_1_small.json``; a
file with a "family" key is a decoder-only `LMConfig` (a `T5Gemma2Config` for the family
"t5gemma2"), one with a "backbone_dim" key a Gemma 4 assistant's `GemmaAssistantConfig`,
any other a `T5Config`.
"""

from __future__ import annotations

import json
import pathlib
import re

from specdec_jax import package_data
from specdec_jax.config.gemma import assistant_config_from_dict, lm_config_from_dict
from specdec_jax.config.t5 import T5Config
from specdec_jax.config.t5gemma2 import T5Gemma2Config
from specdec_jax.errors import ConfigError

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def available_configs() -> list[str]:
  """Names of the configs shipped in ``specdec_jax/configs/models/`` (sorted)."""
  root = package_data.model_configs()
  if not root.is_dir():
    return []
  return sorted(f.name[:-len(".json")] for f in root.iterdir()
                if f.name.endswith(".json") and f.is_file())


def get_config(name_or_path: str | pathlib.Path, **overrides):
  """A named config (``"t5_1_1_small"``) or a path to a JSON config file: a `T5Config`, an
  `LMConfig` (decoder-only) for a file with a "family" key (``"gpt2_tiny"``), or a
  `GemmaAssistantConfig` for one with a "backbone_dim" key (``"gemma4_31b_assistant"``)."""
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
  return config_from_dict(d)


def config_from_dict(d: dict):
  """The config of a JSON dict: a Gemma 4 assistant's for a "backbone_dim" key, a
  `T5Gemma2Config` for the family "t5gemma2", a decoder-only config for another "family"
  key (`lm_config_from_dict`), else a `T5Config`."""
  if "backbone_dim" in d:   # a Gemma 4 assistant: a drafter, not a model of its own
    return assistant_config_from_dict(d)
  if d.get("family") == "t5gemma2":
    return T5Gemma2Config.from_dict(d)
  if "family" in d:   # a decoder-only language model
    return lm_config_from_dict(d)
  return T5Config.from_dict(d)


def _read_text(path: pathlib.Path) -> str:
  try:
    return path.read_text(encoding="utf-8")
  except (OSError, UnicodeDecodeError) as e:
    raise ConfigError(f"cannot read config file {path}: {e}") from e
