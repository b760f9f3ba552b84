"""Load and save T5 checkpoints as a T5X-named parameter tree.

The tree is a nested dict of arrays with exactly T5X's names and 2-D kernels, e.g.
``params["encoder"]["layers_0"]["attention"]["query"]["kernel"]`` [emb, heads*head_dim]
(see ``tree.expected_shapes``). Supported sources, auto-detected by ``load_checkpoint``:

- T5X legacy: ``checkpoint_<step>/checkpoint`` (flax msgpack) + zarr arrays (``t5x_legacy``),
  local or gs:// (tensorstore file/gcs kvstore);
- T5X Orbax: ``checkpoint_<step>/state/`` (``t5x_orbax``);
- Hugging Face T5/mT5 dirs with safetensors weights, or hub ids "org/name" (``hf``),
  T5Gemma 2 dirs (``hf_t5gemma2``), and decoder-only GPT-2 / Llama / Gemma 4 dirs
  (``hf_lm``, ``hf_gemma``, an `LMConfig` and the LM tree);
- this package's own format written by ``save_checkpoint`` (``native``);
- bundled names such as "demo-de-en/target", shipped by the demo distributions
  (``packages/specdec-jax-demo-small``, ...; see ``specdec_jax.package_data``).

Every user-caused failure raises ``CheckpointError`` naming the file and the problem.
Nothing is ever unpickled.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from specdec_jax.config import GemmaConfig, T5Config, T5Gemma2Config
from specdec_jax.config.lm import LMConfig
from specdec_jax.errors import ConfigError
from specdec_jax.io.checkpoints import (
  hf,
  hf_gemma,
  hf_gemma_assistant,
  hf_lm,
  hf_t5gemma2,
  leaves,
  native,
  resolve,
  t5x_legacy,
  t5x_orbax,
  tree,
)
from specdec_jax.io.checkpoints.errors import CheckpointError
from specdec_jax.io.checkpoints.hf import (
  config_from_hf_dict,
  config_to_hf_dict,
  hf_to_t5x_params,
  t5x_to_hf_state_dict,
)
from specdec_jax.io.checkpoints.resolve import FORMATS, bundled_names, detect_format
from specdec_jax.io.checkpoints.tree import expected_shapes, flatten, infer_config, unflatten

__all__ = [
    "CheckpointError", "FORMATS", "load_checkpoint", "save_checkpoint", "export_hf",
    "detect_format", "bundled_names", "t5x_to_hf_state_dict", "hf_to_t5x_params",
    "config_to_hf_dict", "config_from_hf_dict", "expected_shapes", "validate_params",
    "infer_config", "flatten", "unflatten", "load_checkpoint_sharded",
]


def config_from_json_dict(d: Mapping[str, Any], source: str) -> T5Config:
  """A config.json found beside a T5X checkpoint: T5X-style keys, or a HF config (model_type)."""
  if "model_type" in d:
    return hf.config_from_hf_dict(d, source=source)
  try:
    return T5Config.from_dict(dict(d))
  except (ConfigError, TypeError) as e:
    raise CheckpointError(f"{source}: invalid T5 config: {e}") from e


def _t5x_config(checkpoint_dir: str, flat: Mapping[str, np.ndarray]) -> tuple[T5Config, str]:
  """(config, where it came from): nearest config.json at/above the checkpoint, else shapes."""
  start = checkpoint_dir
  if resolve.has_file(checkpoint_dir, "_METADATA"):  # an Orbax state/ dir: search from its step
    start = resolve.parent(checkpoint_dir)
  found = resolve.find_config_json(start)
  if found is not None:
    file, d = found
    return config_from_json_dict(d, file), f"config from {file}"
  return tree.infer_config(flat, checkpoint_dir), "config inferred from parameter shapes"


def _hf_reader(hf_config: dict) -> Any:
  """The module that reads a Hugging Face dir of this config.json: Gemma 4 (`hf_gemma`),
  its assistant (`hf_gemma_assistant`), T5Gemma 2 (`hf_t5gemma2`), the other decoder-only
  LMs (`hf_lm`) or T5 (`hf`)."""
  if hf_gemma_assistant.handles(hf_config):
    return hf_gemma_assistant
  if hf_gemma.handles(hf_config):
    return hf_gemma
  if hf_t5gemma2.handles(hf_config):
    return hf_t5gemma2
  return hf_lm if hf_lm.handles(hf_config) and hf_config else hf


def _read(fmt: str, directory: str, need_config: bool) -> tuple[T5Config | None, str, dict]:
  """(stored or inferred config, its origin, flat params) of a located checkpoint."""
  if fmt in (resolve.T5X_LEGACY, resolve.T5X_ORBAX):
    reader = t5x_legacy if fmt == resolve.T5X_LEGACY else t5x_orbax
    flat = reader.load_params(directory)
    if not need_config:
      return None, "given config", flat
    config, origin = _t5x_config(directory, flat)
    return config, origin, flat
  if fmt == resolve.HF:
    hf_config = resolve.read_json(directory, hf.CONFIG_NAME) or {}
    config, flat = _hf_reader(hf_config).load(directory)
    return config, "config from config.json", flat
  config, flat = native.load(directory)
  return config, f"config from {resolve.SPECDEC_CONFIG}", flat


def load_checkpoint(path_or_name: str | os.PathLike,
                    config: T5Config | None = None) -> tuple[T5Config, dict[str, Any]]:
  """Load any supported checkpoint -> (config, nested params of numpy arrays).

  Args:
    path_or_name: a checkpoint dir (or a parent of ``checkpoint_<step>`` dirs: highest step),
      a gs:// URL (T5X), a bundled name ("demo-de-en/target") or a HF hub id ("org/name").
    config: the architecture; default: the checkpoint's own (HF config.json,
      specdec_config.json), for T5X a config.json in or up to two dirs above the checkpoint
      dir, else inferred from parameter shapes.
  Returns:
    (config, params) with params validated against config (names and shapes).
  """
  location = resolve.resolve(path_or_name)
  fmt, directory = resolve.locate(location)
  stored, origin, flat = _read(fmt, directory, need_config=config is None)
  final = config if config is not None else stored
  if final is None:
    raise CheckpointError(f"{directory} ({fmt}): no config given, stored or inferred")
  tree.validate(flat, final, f"{directory} ({fmt}, {origin})")
  return final, tree.unflatten(flat)


def load_checkpoint_sharded(path_or_name: str | os.PathLike,
                            shardings_for: Callable[[T5Config], Mapping[str, Any]],
                            dtype: Any = None, config: T5Config | None = None
                            ) -> tuple[T5Config, dict[str, Any]]:
  """`load_checkpoint` straight into device shards -> (config, nested params of jax.Array).

  shardings_for(config) -> {flat key: jax.sharding.Sharding}, called once the config is
    known. Each parameter is read leaf by leaf, and of each leaf only the blocks its
    devices hold: safetensors by slices (ours and Hugging Face), T5X legacy zarr arrays by
    index ranges (tensorstore), T5X Orbax restored with the target shardings.
  dtype: floating params cast to it on the host, block by block (None: as stored).
  """
  location = resolve.resolve(path_or_name)
  fmt, directory = resolve.locate(location)
  if fmt == resolve.T5X_ORBAX:
    stored = t5x_orbax.param_shapes(directory)
  elif fmt == resolve.T5X_LEGACY:
    stored = t5x_legacy.open_leaves(directory)
  elif fmt == resolve.HF:
    hf_json = resolve.read_json(directory, hf.CONFIG_NAME) or {}
    hf_config, stored = _hf_reader(hf_json).open_leaves(directory)
  elif fmt == resolve.SPECDEC:
    own_config, stored = native.open_leaves(directory)
  else:
    raise CheckpointError(f"{directory}: format {fmt!r} cannot be loaded into shards; load it "
                          f"whole (sd.load without mesh=) and place it with sd.shard")
  if config is not None:
    final, origin = config, "given config"
  elif fmt in (resolve.T5X_LEGACY, resolve.T5X_ORBAX):
    final, origin = _t5x_config(directory, stored)
  elif fmt == resolve.HF:
    final, origin = hf_config, "config from config.json"
  else:
    final, origin = own_config, f"config from {resolve.SPECDEC_CONFIG}"
  tree.validate(stored, final, f"{directory} ({fmt}, {origin})")
  shardings = dict(shardings_for(final))
  if fmt == resolve.T5X_ORBAX:
    flat = t5x_orbax.load_sharded(directory, shardings, dtype)
  else:
    flat = leaves.place(stored, shardings, dtype)
  return final, tree.unflatten(flat)


def validate_params(params: Mapping[str, Any], config: T5Config, source: str = "params") -> None:
  """CheckpointError unless nested or flat ``params`` have exactly the config's names/shapes."""
  tree.validate(tree.flatten(params), config, source)


def export_hf(path: str | os.PathLike, config: T5Config | LMConfig,
              params: Mapping[str, Any]) -> str:
  """Write a transformers dir (config.json + model.safetensors): T5 for a T5Config
  (`hf.export_hf`), Gemma 4 for a GemmaConfig (`hf_gemma.export_hf`), GPT-2 or Llama for
  another LMConfig (`hf_lm.export_hf`). Returns its path. A T5Gemma 2 is refused (a
  `CheckpointError`): transformers' class needs a vision tower, which it does not have."""
  if isinstance(config, T5Gemma2Config):
    raise CheckpointError("export to a transformers directory is not implemented for "
                          "T5Gemma 2 (its class needs the vision tower, which is not "
                          "loaded); save it in our own format (sd.save)")
  if isinstance(config, GemmaConfig):
    return hf_gemma.export_hf(path, config, params)
  if isinstance(config, LMConfig):
    return hf_lm.export_hf(path, config, params)
  return hf.export_hf(path, config, params)


def save_checkpoint(path: str | os.PathLike, config: T5Config | LMConfig,
                    params: Mapping[str, Any],
                    dtype: str | None = None) -> str:
  """Write ``params`` as a specdec-jax dir (specdec_config.json + params.safetensors).

  ``dtype`` ("float32", "bfloat16", "float16") casts the floating params; None keeps them.
  Returns the directory path.
  """
  try:
    return native.save(path, config, params, dtype)
  except OSError as e:
    raise CheckpointError(f"cannot write a checkpoint to {os.fspath(path)!r}: "
                          f"{e.strerror or e}") from None
