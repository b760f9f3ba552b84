"""What every report shares: JSON-safe values, atomic file writes, reading user files,
machine facts, and number formatting.

    write_json("out/bench.json", results)        # to_jsonable + atomic_write
    write_plot("out/bench.png", plot, results)   # plot(results, tmp) then rename
    text = read_text(args.input_file, "prompt file")   # FileAccessError naming the file

A write goes to `path.tmp` first and is renamed over `path`, so an interrupted run
never leaves a half-written report. Failures the user can cause (a missing input, an
unwritable directory) raise `FileAccessError` with the path in the message.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from typing import Any, Callable

import jax
import numpy as np

from specdec_jax.errors import FileAccessError


def to_jsonable(x: Any) -> Any:
  """Arrays -> lists, numpy/jax scalars -> Python numbers, non-finite floats -> None."""
  if isinstance(x, dict):
    return {str(k): to_jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [to_jsonable(v) for v in x]
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    x = np.asarray(x)
    return to_jsonable(x.tolist()) if x.ndim else to_jsonable(x.item())
  if isinstance(x, (bool, np.bool_)):
    return bool(x)
  if isinstance(x, (int, np.integer)):
    return int(x)
  if isinstance(x, (float, np.floating)):
    return float(x) if math.isfinite(x) else None
  return x


def created_line(results: dict[str, Any]) -> str:
  """"Created <when> by `<command>`." of a report (without the command when it has none)."""
  command = results.get("command")
  return f"Created {results['created']}" + (f" by `{command}`" if command else "") + "."


def fmt(x, digits: int = 2, suffix: str = "", missing: str = "—") -> str:
  """A number with `digits` decimals and `suffix`, or `missing` for None."""
  return missing if x is None else f"{float(x):.{digits}f}{suffix}"


# ----------------------------------------------------------------------------- files


def _access_error(e: OSError, path, doing: str) -> FileAccessError:
  return FileAccessError(f"cannot {doing} {os.fspath(path)!r}: {e.strerror or e}")


def make_dirs(path) -> None:
  """os.makedirs(path, exist_ok=True), failing with a FileAccessError naming `path`."""
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise _access_error(e, path, "create directory") from None


def check_output_dir(path, flag: str) -> None:
  """FileAccessError now, before any work, if directory `path` (given as `flag`) could not be
  written later: it or an ancestor is a file, or the nearest existing ancestor is not
  writable. Nothing is created."""
  path = os.path.abspath(os.fspath(path))
  if os.path.exists(path) and not os.path.isdir(path):
    raise FileAccessError(f"{flag} {path!r} is a file, not a directory")
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise FileAccessError(f"{flag} {path!r}: {existing!r} is a file, not a directory")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise FileAccessError(f"{flag} {path!r}: cannot write in {existing!r} (permission denied)")


def atomic_write(path, text: str) -> None:
  """Write `text` to `path` via `path.tmp` and a rename (creating the directory)."""
  path = os.fspath(path)
  make_dirs(os.path.dirname(path) or ".")
  tmp = path + ".tmp"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except OSError as e:
    raise _access_error(e, path, "write") from None


def write_json(path, obj: Any) -> None:
  """`obj` as indented JSON (via `to_jsonable`), written atomically."""
  atomic_write(path, json.dumps(to_jsonable(obj), indent=1) + "\n")


def write_plot(path, plot: Callable[[Any, str], None], results: Any) -> None:
  """`plot(results, tmp)` into a temporary .png beside `path`, then renamed over it."""
  path = os.fspath(path)
  make_dirs(os.path.dirname(path) or ".")
  tmp = path + ".tmp.png"
  try:
    plot(results, tmp)
    os.replace(tmp, path)
  except OSError as e:
    raise _access_error(e, path, "write") from None


def read_text(path, what: str = "file") -> str:
  """The UTF-8 text of `path`; FileAccessError "<what> '<path>': No such file ..." if unreadable."""
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except OSError as e:
    raise FileAccessError(f"{what} {os.fspath(path)!r}: {e.strerror or e}") from None
  except UnicodeDecodeError as e:
    raise FileAccessError(f"{what} {os.fspath(path)!r} is not UTF-8 text: {e}") from None


def read_json(path, what: str = "file") -> Any:
  """The JSON value in `path`; FileAccessError when unreadable or not valid JSON."""
  text = read_text(path, what)
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise FileAccessError(f"{what} {os.fspath(path)!r} is not valid JSON: {e}") from None


# ----------------------------------------------------------------------------- provenance


def utc_now() -> str:
  """The current UTC time, ISO 8601 to the second (the reports' "created")."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def machine_info() -> dict[str, Any]:
  """Versions, devices and host facts stored beside every timing."""
  import jaxlib
  devices = jax.devices()
  return {
      "jax_version": jax.__version__,
      "jaxlib_version": getattr(jaxlib, "__version__", None),
      "backend": jax.default_backend(),
      "devices": [str(d) for d in devices],
      "device_kind": devices[0].device_kind if devices else None,
      "device_count": len(devices),
      "cpu_count": os.cpu_count(),
      "platform": platform.platform(),
      "processor": platform.processor() or platform.machine(),
      "python": platform.python_version(),
      "numpy_version": np.__version__,
  }
