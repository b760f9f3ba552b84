"""specdec-jax's own format: ``specdec_config.json`` + ``params.safetensors``.

``specdec_config.json`` = {"format": "specdec-jax", "version": 1, "config": T5Config.to_dict(),
"dtype": "float32" | "bfloat16" | ... | "mixed"}; ``params.safetensors`` holds the T5X tree
under flat "/"-joined keys in the stored dtype (bfloat16 through ml_dtypes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from specdec_jax.config import T5Config
from specdec_jax.config.lm import LMConfig
from specdec_jax.config.named import config_from_dict
from specdec_jax.errors import ConfigError
from specdec_jax.io.checkpoints import files, hf, resolve, tree
from specdec_jax.io.checkpoints.errors import CheckpointError
from specdec_jax.io.tokenizer import TOKENIZER_FILES

FORMAT, VERSION = "specdec-jax", 1
CONFIG_NAME = resolve.SPECDEC_CONFIG
PARAMS_NAME = "params.safetensors"
SAVE_DTYPES = ("float32", "bfloat16", "float16")


def cast_floating(flat: Mapping[str, Any], dtype: str | None) -> dict[str, np.ndarray]:
  """Host numpy copies of the params; floating arrays cast to ``dtype`` when given."""
  if dtype is not None and dtype not in SAVE_DTYPES:
    raise CheckpointError(f"unsupported save dtype {dtype!r}; use one of {SAVE_DTYPES}")
  out = {}
  for key, value in flat.items():
    array = np.asarray(value)
    if dtype is not None and jnp.issubdtype(array.dtype, jnp.floating):
      array = array.astype(jnp.dtype(dtype))
    out[key] = np.ascontiguousarray(array)
  return out


def _dtype_name(flat: Mapping[str, np.ndarray]) -> str:
  names = {str(v.dtype) for v in flat.values() if jnp.issubdtype(v.dtype, jnp.floating)}
  return names.pop() if len(names) == 1 else "mixed"


def save(path: str | os.PathLike, config: T5Config | LMConfig, params: Mapping[str, Any],
         dtype: str | None = None) -> str:
  """Write ``params`` (nested or flat, validated against ``config``) to dir ``path``.

  Over a checkpoint of ours with another config (another model), the tokenizer files there
  (`TOKENIZER_FILES`) are removed: they belonged to the old model, and `load_tokenizer(path)`
  would pair them with the new one. The same config (a re-save, another dtype) keeps them.
  """
  path = os.fspath(path)
  check_save_target(path)
  flat = cast_floating(tree.flatten(params), dtype)
  tree.validate(flat, config, "params to save")
  _remove_stale_tokenizer(path, config)
  os.makedirs(path, exist_ok=True)
  meta = {"format": FORMAT, "version": VERSION, "config": config.to_dict(),
          "dtype": _dtype_name(flat)}
  params_tmp = os.path.join(path, PARAMS_NAME + ".tmp")
  files.write_safetensors(flat, params_tmp, metadata={"format": FORMAT})
  os.replace(params_tmp, os.path.join(path, PARAMS_NAME))
  config_tmp = os.path.join(path, CONFIG_NAME + ".tmp")
  with open(config_tmp, "w") as f:
    json.dump(meta, f, indent=1)
  os.replace(config_tmp, os.path.join(path, CONFIG_NAME))
  return path


def _remove_stale_tokenizer(path: str, config: T5Config | LMConfig) -> None:
  """Remove the tokenizer files of another model's checkpoint of ours in dir `path`."""
  if not os.path.isfile(os.path.join(path, CONFIG_NAME)):
    return
  try:
    old = read_config(path).replace(dtype=config.dtype)
  except CheckpointError:
    old = None    # unreadable: another model as far as anyone can tell
  if old == config:
    return
  for name in TOKENIZER_FILES:
    if os.path.isfile(os.path.join(path, name)):
      os.remove(os.path.join(path, name))


def check_save_target(path: str) -> None:
  """Refuse to write into a file, or into a dir that holds a checkpoint of another format.

  Our files beside a Hugging Face or T5X checkpoint would make the dir hold two models,
  and `sd.load` would silently pick ours (see `resolve.format_of`).
  """
  if resolve.is_gcs(path):
    raise CheckpointError(f"{path}: specdec-jax dirs are written to local disk only")
  if os.path.exists(path) and not os.path.isdir(path):
    raise CheckpointError(f"{path}: exists and is not a directory; save into a directory")
  if not os.path.isdir(path):
    return
  names = sorted(os.listdir(path))
  foreign = [n for n in names if n in FOREIGN_FILES or resolve.HF_WEIGHTS_RE.fullmatch(n)
             or resolve.STEP_RE.fullmatch(n)]
  if foreign:
    fmt = resolve.format_of(path) or "another"
    raise CheckpointError(
        f"{path} already holds a checkpoint of {fmt} format ({os.path.join(path, foreign[0])}"
        f"{' and ' + str(len(foreign) - 1) + ' more' if len(foreign) > 1 else ''}); "
        "sd.save writes its own files beside it and sd.load would then read ours: "
        "save into a new directory")


#: Files (or dirs) that mark a Hugging Face or T5X checkpoint in a directory.
FOREIGN_FILES = ("config.json", "checkpoint", "_METADATA", "state", "_CHECKPOINT_METADATA")


def read_config(directory: str) -> T5Config:
  """The T5Config stored in ``specdec_config.json``."""
  source = resolve.join(directory, CONFIG_NAME)
  meta = resolve.read_json(directory, CONFIG_NAME)
  if meta is None:
    raise CheckpointError(f"{source}: not found")
  if meta.get("format") != FORMAT or meta.get("version") != VERSION:
    raise CheckpointError(f"{source}: expected format {FORMAT!r} version {VERSION}, got "
                          f"{meta.get('format')!r} version {meta.get('version')!r}")
  if not isinstance(meta.get("config"), dict):
    raise CheckpointError(f"{source}: no 'config' object")
  try:
    return config_from_dict(meta["config"])
  except (ConfigError, TypeError) as e:
    raise CheckpointError(f"{source}: invalid config: {e}") from e


def load(directory: str) -> tuple[T5Config, dict[str, np.ndarray]]:
  """(config, flat params) of a dir written by ``save``."""
  if resolve.is_gcs(directory):
    raise CheckpointError(f"{directory}: specdec-jax dirs are read from local disk only")
  config = read_config(directory)
  path = os.path.join(directory, PARAMS_NAME)
  params = hf.read_safetensors(path)
  for name, value in params.items():
    if value.dtype.name not in ("float16", "bfloat16", "float32", "float64"):
      raise CheckpointError(f"{path}: tensor {name!r} is {value.dtype.name}; a model's "
                            f"parameters are floating point")
  return config, params


def open_leaves(directory: str) -> tuple[T5Config, dict[str, Any]]:
  """(config, flat leaves read by slices) of a dir written by ``save`` (`leaves.Leaf`)."""
  if resolve.is_gcs(directory):
    raise CheckpointError(f"{directory}: specdec-jax dirs are read from local disk only")
  config = read_config(directory)
  return config, hf.safetensors_leaves(os.path.join(directory, PARAMS_NAME))
