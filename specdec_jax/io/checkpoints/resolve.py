"""Where a checkpoint lives: local/gs:// paths, format detection, bundled names, hub ids.

Local and ``gs://`` locations share one code path: files are read through a tensorstore
key-value store whose spec (``kvstore_spec``) is the only thing that differs.
"""

from __future__ import annotations

import json
import os
import pathlib
import posixpath
import re
from typing import Any

import tensorstore as ts

from specdec_jax import package_data
from specdec_jax.io.checkpoints.errors import CheckpointError

T5X_LEGACY, T5X_ORBAX, HF, SPECDEC = "t5x_legacy", "t5x_orbax", "hf", "specdec"
FORMATS = (T5X_LEGACY, T5X_ORBAX, HF, SPECDEC)
SPECDEC_CONFIG = "specdec_config.json"
HUB_PATTERNS = ["config.json", "*.safetensors", "*.json", "spiece.model"]

_GCS_RE = re.compile(r"gs://([^/]+)/?(.*)", re.DOTALL)
STEP_RE = re.compile(r"checkpoint_(\d+)")
_HUB_ID_RE = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
HF_WEIGHTS_RE = re.compile(
    r"(model.*\.safetensors(\.index\.json)?|pytorch_model.*\.bin(\.index\.json)?)")


def default_assets_dir(name: str | None) -> pathlib.Path | None:
  """The ``assets/`` directory of the installed distribution that ships `name`'s group
  (package data, via importlib.resources; `package_data.SEPARATE`), or None when no
  distribution ships a group of that name.

  Raises:
    MissingAssets: the group's distribution is not installed.
    CheckpointError: it is installed but not as files (checkpoints are read by path).
  """
  root = package_data.assets(name)
  if root is None or isinstance(root, pathlib.Path):
    return root
  raise CheckpointError(
      f"bundled checkpoints are read from disk, but {name!r} is imported from {root} (not a "
      "directory); install its package as files (pip install)")


def _installed_roots() -> list[pathlib.Path]:
  """The ``assets/`` directories on disk of the installed asset distributions."""
  return [root for root in package_data.installed_assets() if isinstance(root, pathlib.Path)]


def is_gcs(path: str) -> bool:
  return str(path).startswith("gs://")


def join(directory: str, *names: str) -> str:
  return posixpath.join(directory, *names) if is_gcs(directory) else os.path.join(directory, *names)


def parent(directory: str) -> str:
  """The enclosing directory (``gs://bucket`` is its own parent)."""
  m = _GCS_RE.fullmatch(directory)
  if m:
    key = posixpath.dirname(m.group(2).rstrip("/"))
    return f"gs://{m.group(1)}/{key}" if key else f"gs://{m.group(1)}"
  return os.path.dirname(os.path.abspath(directory))


def kvstore_spec(directory: str, relative: str = "") -> dict[str, Any]:
  """Tensorstore kvstore spec for ``directory/relative``.

  ``gs://bucket/a/b`` -> {"driver": "gcs", "bucket": "bucket", "path": "a/b/<relative>"};
  a local dir -> {"driver": "file", "path": "/abs/dir/<relative>"}. A trailing "/" in
  ``relative`` (or an empty ``relative``) makes the path a directory prefix.
  """
  m = _GCS_RE.fullmatch(directory)
  if m:
    bucket, key = m.groups()
    key = key.rstrip("/")
    return {"driver": "gcs", "bucket": bucket,
            "path": posixpath.join(key, relative) if key else relative}
  return {"driver": "file", "path": os.path.join(os.path.abspath(directory), relative)}


def _open_store(directory: str) -> ts.KvStore:
  try:
    return ts.KvStore.open(kvstore_spec(directory)).result()
  except Exception as e:  # tensorstore raises ValueError with a status string
    raise CheckpointError(f"{directory}: cannot open storage: {e}") from e


def read_bytes(directory: str, name: str) -> bytes | None:
  """Contents of ``directory/name``, or None when it does not exist."""
  try:
    result = _open_store(directory).read(name).result()
  except CheckpointError:
    raise
  except Exception as e:
    raise CheckpointError(f"{join(directory, name)}: cannot read file: {e}") from e
  return bytes(result.value) if result.state == "value" else None


def has_file(directory: str, name: str) -> bool:
  try:
    result = _open_store(directory).read(name, byte_range=slice(0, 0)).result()
  except Exception:  # a directory where a file was expected, permissions, ...
    return False
  return result.state == "value"


def list_dir(directory: str) -> list[str]:
  """Names directly inside ``directory`` (sorted; [] when it does not exist)."""
  if not is_gcs(directory):
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []
  try:
    keys = _open_store(directory).list().result()
  except Exception as e:
    raise CheckpointError(f"{directory}: cannot list: {e}") from e
  return sorted({k.decode().split("/", 1)[0] for k in keys})


def read_json(directory: str, name: str) -> dict[str, Any] | None:
  """Parsed JSON object at ``directory/name``; None if absent; CheckpointError if malformed."""
  raw = read_bytes(directory, name)
  if raw is None:
    return None
  try:
    value = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{join(directory, name)}: not valid JSON: {e}") from e
  if not isinstance(value, dict):
    raise CheckpointError(f"{join(directory, name)}: expected a JSON object, got "
                          f"{type(value).__name__}")
  return value


def _is_hf_dir(directory: str) -> bool:
  """HF weight files, or a HF config.json (model_type) that does not merely describe the
  T5X checkpoint_<step> dirs beside it."""
  names = list_dir(directory)
  if any(HF_WEIGHTS_RE.fullmatch(n) for n in names):
    return True
  if "config.json" in names and not any(STEP_RE.fullmatch(n) for n in names):
    try:
      return "model_type" in (read_json(directory, "config.json") or {})
    except CheckpointError:
      return False
  return False


def format_of(directory: str) -> str | None:
  """The format stored directly in ``directory`` (not in its checkpoint_* children), or None."""
  if has_file(directory, SPECDEC_CONFIG):
    return SPECDEC
  if has_file(directory, "checkpoint"):
    return T5X_LEGACY
  if has_file(directory, "state/_METADATA") or has_file(directory, "_METADATA"):
    return T5X_ORBAX
  if _is_hf_dir(directory):
    return HF
  return None


def step_dirs(directory: str) -> list[tuple[int, str]]:
  """(step, path) of the ``checkpoint_<step>`` children, highest step first."""
  steps = [(int(m.group(1)), join(directory, n))
           for n in list_dir(directory) if (m := STEP_RE.fullmatch(n))]
  return sorted(steps, reverse=True)


def _unknown_format(directory: str) -> CheckpointError:
  names = list_dir(directory)
  shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
  return CheckpointError(
      f"{directory}: unknown checkpoint format (contents: {shown or 'empty'}); expected a T5X "
      "checkpoint (checkpoint_<step>/checkpoint msgpack, or checkpoint_<step>/state/_METADATA for "
      "Orbax, or a parent of checkpoint_<step> dirs), a Hugging Face T5 dir (config.json + "
      f"model.safetensors) or a specdec-jax dir ({SPECDEC_CONFIG} + params.safetensors)")


def locate(path: str) -> tuple[str, str]:
  """(format, directory to load) for an existing local or gs:// path.

  A parent of ``checkpoint_<step>`` dirs resolves to the highest step that holds a T5X
  checkpoint. A file path stands for its directory.
  """
  path = os.fspath(path)
  if not is_gcs(path):
    if not os.path.exists(path):
      raise CheckpointError(f"{path}: no such file or directory")
    path = os.path.abspath(path)
    if os.path.isfile(path):
      path = os.path.dirname(path)
  fmt = format_of(path)
  if fmt is not None:
    return fmt, path
  steps = step_dirs(path)
  for _, step_dir in steps:
    fmt = format_of(step_dir)
    if fmt in (T5X_LEGACY, T5X_ORBAX):
      return fmt, step_dir
  if steps:
    raise CheckpointError(
        f"{path}: none of the checkpoint_<step> dirs ({', '.join(p for _, p in steps[:5])}) "
        "holds a T5X checkpoint ('checkpoint' msgpack file or state/_METADATA)")
  raise _unknown_format(path)


def detect_format(path: str) -> str:
  """One of "t5x_legacy", "t5x_orbax", "hf", "specdec" for a local or gs:// path."""
  return locate(path)[0]


def find_config_json(checkpoint_dir: str, levels_up: int = 2) -> tuple[str, dict] | None:
  """(file, parsed) of the nearest ``config.json`` in ``checkpoint_dir`` or up to
  ``levels_up`` directories above it; None when there is none."""
  directory = checkpoint_dir
  for _ in range(levels_up + 1):
    value = read_json(directory, "config.json")
    if value is not None:
      return join(directory, "config.json"), value
    up = parent(directory)
    if up == directory:
      break
    directory = up
  return None


def bundled_names(assets_dir: pathlib.Path | None = None, max_depth: int = 3) -> list[str]:
  """Names ("demo-de-en/target") of the checkpoint dirs under `assets_dir`, by default under
  every installed asset distribution's (sorted)."""
  if assets_dir is None:
    return sorted(n for root in _installed_roots() for n in bundled_names(root, max_depth))
  root = pathlib.Path(assets_dir)
  names: list[str] = []

  def walk(directory: pathlib.Path, depth: int) -> None:
    for child in sorted(p for p in directory.iterdir() if p.is_dir()):
      if format_of(str(child)) is not None or step_dirs(str(child)):
        names.append(child.relative_to(root).as_posix())
      elif depth < max_depth:
        walk(child, depth + 1)

  if root.is_dir():
    walk(root, 1)
  return names


def _looks_like_path(name: str) -> bool:
  return (os.path.isabs(name) or name.startswith((".", "~")) or name.endswith("/")
          or "\\" in name or name.count("/") > 1)


def hub_download(repo_id: str) -> str:
  """Download config + safetensors + tokenizer of a Hugging Face Hub repo; the local dir."""
  try:
    import huggingface_hub  # optional dependency
  except ImportError as e:
    raise CheckpointError(
        f"{repo_id!r} is not a local path or a bundled name; downloading it from the Hugging "
        "Face Hub needs huggingface_hub (pip install 'specdec-jax[hub]')") from e
  try:
    return str(huggingface_hub.snapshot_download(repo_id, allow_patterns=HUB_PATTERNS))
  except Exception as e:   # offline, unknown repo, gated, ...: one line, not the HTTP stack
    reason = (str(e).strip().splitlines() or [""])[0]
    raise CheckpointError(
        f"{repo_id!r} is not a local path or a bundled name, and downloading it from the "
        f"Hugging Face Hub failed: {type(e).__name__}: {reason}") from None


def resolve(path_or_name: str | os.PathLike, assets_dir: pathlib.Path | None = None) -> str:
  """A loadable location for a path, gs:// URL, bundled name or Hugging Face Hub id.

  Order: gs:// URL; existing local path; ``<assets>/<name>``; a hub id ("org/name") whose
  first part is not a bundled group; otherwise CheckpointError naming the bundled names.
  """
  name = os.fspath(path_or_name)
  if is_gcs(name):
    return name
  local = pathlib.Path(name).expanduser()
  if local.exists():
    return os.path.abspath(local)
  root = pathlib.Path(assets_dir) if assets_dir is not None else default_assets_dir(name)
  relative = pathlib.PurePosixPath(name)
  safe = bool(name) and not relative.is_absolute() and ".." not in relative.parts
  if root is not None and safe and (root / relative).is_dir():
    return str(root / relative)
  if _looks_like_path(name):
    raise CheckpointError(f"{name}: no such file or directory")
  in_bundled_group = root is not None and safe and (root / relative.parts[0]).is_dir()
  if _HUB_ID_RE.fullmatch(name) and not in_bundled_group:
    return hub_download(name)
  bundled = bundled_names(root)
  where = f" under {root}" if root is not None else ""
  raise CheckpointError(
      f"{name!r} is not an existing path, a bundled name or a Hugging Face Hub id (org/name); "
      f"bundled names{where}: {', '.join(bundled) if bundled else 'none'}")
