"""stdout for a command's results, stderr for everything else.

    with results_stdout(keep=False):
      ...                      # C++ (Gloo, XLA), JAX and our logs: all on stderr
      emit("the translation")  # the one way to the real stdout

While a command runs, file descriptor 1 points at stderr, so a library that writes to
stdout from C++ (Gloo's "[Gloo] Rank 0 is connected to 1 peer ranks", printed while
`jax.distributed` connects several processes) or from Python (`sys.stdout` is stderr too)
cannot mix its lines into the outputs; `emit` writes to a copy of the real stdout taken
first. A `sys.stdout` that is not descriptor 1 (a test's capture, a caller's
`redirect_stdout`) receives the results instead of descriptor 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
from typing import Iterator, TextIO

_results: TextIO | None = None


def emit(text: str = "") -> None:
  """Write one line of a command's results to the real stdout (flushed)."""
  out = _results if _results is not None else sys.stdout
  out.write(text + "\n")
  out.flush()


def _flush_c_stdio() -> None:
  """Flush C's stdio buffers (a C++ library's pending stdout lines) before descriptor 1
  changes, so that they land where they were written."""
  try:
    ctypes.CDLL(None).fflush(None)
  except (OSError, AttributeError):   # no C library to load (not POSIX)
    pass


def _fileno(stream) -> int | None:
  try:
    return stream.fileno()
  except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
    return None


@contextlib.contextmanager
def results_stdout(keep: bool = False) -> Iterator[None]:
  """Descriptor 1 and `sys.stdout` on stderr while the block runs; `emit` writes to the
  real stdout. `keep`: leave descriptor 1 on stderr afterwards (the process entry point:
  lines written at exit, e.g. by `jax.distributed`'s shutdown, stay off stdout)."""
  global _results
  previous, stdout = _results, sys.stdout
  sys.stdout.flush()
  _flush_c_stdio()
  try:
    saved = os.dup(1)
    os.dup2(2, 1)
  except OSError:   # descriptor 1 or 2 closed: nothing to separate
    saved = None
  if _fileno(stdout) == 1 and saved is not None:
    _results = io.TextIOWrapper(os.fdopen(saved, "wb", closefd=False),
                                encoding=stdout.encoding or "utf-8", errors="replace",
                                line_buffering=True)
  else:
    _results = stdout
  sys.stdout = sys.stderr
  try:
    yield
  finally:
    sys.stdout = stdout
    sys.stderr.flush()
    _results.flush()
    if _results is not stdout and isinstance(_results, io.TextIOWrapper):   # ours
      _results.detach()
    _results = previous
    if saved is not None:
      _flush_c_stdio()
      if not keep:
        os.dup2(saved, 1)
      os.close(saved)
