"""Weight files written like any other file: `write_safetensors`.

safetensors writes through a private temporary file, created mode 0600, so a saved model
was unreadable to the group and others whatever the umask (a shared model directory
then fails for everyone but its writer). The file is given the mode `open` would give a
new file: 0666 less the process's umask (0644 under the usual 022).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import safetensors.numpy


def _umask() -> int:
  """The process's umask, read without changing it where Linux reports it."""
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  except (OSError, ValueError, IndexError):
    pass
  mask = os.umask(0o022)     # elsewhere: set and restore (not atomic: a brief window)
  os.umask(mask)
  return mask


def new_file_mode() -> int:
  """The permission bits `open(path, "w")` gives a new file: 0666 & ~umask."""
  return 0o666 & ~_umask()


def write_safetensors(tensors: Mapping[str, np.ndarray], path: str,
                      metadata: Mapping[str, str] | None = None) -> str:
  """`safetensors.numpy.save_file`, then the file's mode set as for a new file."""
  safetensors.numpy.save_file(dict(tensors), path,
                              metadata=None if metadata is None else dict(metadata))
  os.chmod(path, new_file_mode())
  return path
