"""Compiling once: JAX's persistent compilation cache for the command line, compilation
counts, and progress lines while a command compiles.

    where = use_persistent_cache()        # <cache>/jax unless switched off; None if off
    with compiling("the decode programs for batch 1", where) as count:
      decode(...)                         # stderr: "specdec: preparing ... (compiled once, ...)"
    count.compiled, count.cached          # then "specdec: ready in 9.1 s: 12 compiled, 0 from ..."

The cache directory is the kernels' per-user one (`kernels.build.cache_dirs`:
`$SPECDEC_CACHE_DIR`, else `$XDG_CACHE_HOME/specdec_jax`, else `~/.cache/specdec_jax`)
plus `jax/`. A directory JAX already has (`JAX_COMPILATION_CACHE_DIR`, or set by the
caller) is kept. `--no-compile-cache` or `SPECDEC_COMPILE_CACHE=0` turn the cache off.

Counts come from `jax.monitoring`: every XLA program JAX builds records one backend-compile
event, and a program read from the persistent cache also records a cache hit, so
compiled = events - hits. Programs JAX finds in its in-memory cache record nothing.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
from typing import Iterator

import jax

from specdec_jax.kernels import build

#: The environment switch: "0" (or off, false, no) turns the persistent cache off.
ENV_VAR = "SPECDEC_COMPILE_CACHE"
_OFF = ("0", "off", "false", "no")
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def cache_dir() -> str:
  """The per-user directory of the persistent compilation cache: <kernel cache>/jax."""
  return os.fspath(build.cache_dirs()[0] / "jax")


def switched_off(flag: bool = True) -> bool:
  """Whether the cache is off: the flag (`--no-compile-cache`) or `SPECDEC_COMPILE_CACHE`."""
  return not flag or os.environ.get(ENV_VAR, "1").strip().lower() in _OFF


def use_persistent_cache(flag: bool = True) -> str | None:
  """Turn JAX's persistent compilation cache on for this process; its directory, or None
  when switched off. Every program is cached (no minimum compile time or size), so a
  second run of the same command or script compiles nothing. Call before the first
  compilation; from Python it is `sd.use_compilation_cache()` (the `specdec` command
  calls it itself):

      import specdec_jax as sd
      sd.use_compilation_cache()        # ~/.cache/specdec_jax/jax (SPECDEC_CACHE_DIR moves it)
      target = sd.load("demo-de-en/target")
  """
  if switched_off(flag):
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  where = jax.config.values["jax_compilation_cache_dir"] or cache_dir()
  try:
    os.makedirs(where, exist_ok=True)
  except OSError as e:   # an unwritable home: run uncached rather than fail
    announce(f"compilation cache off: cannot create {where!r} ({e.strerror or e})")
    return None
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", where)
  for name in ("jax_persistent_cache_min_compile_time_secs",
               "jax_persistent_cache_min_entry_size_bytes"):
    if name.upper() not in os.environ:          # a user's own setting wins
      jax.config.update(name, 0)
  return where


@dataclasses.dataclass
class CompileCount:
  """XLA programs built while counting: `compiled` by XLA, `cached` read from the
  persistent cache (`requests` = both); `names`: requests by function ("jit(_run)": n)."""

  requests: int = 0
  cached: int = 0
  seconds: float = 0.0
  names: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  @property
  def compiled(self) -> int:
    return self.requests - self.cached


_counts: list[CompileCount] = []      # the active counters (nested counting adds to each)
_counts_lock = threading.Lock()


def _on_duration(event: str, duration_secs: float, fun_name: str | int = "?",
                 **_: str | int) -> None:
  if event == _COMPILE_EVENT:
    with _counts_lock:
      for c in _counts:
        c.requests += 1
        c.seconds += duration_secs
        c.names[fun_name] += 1


def _on_event(event: str, **_) -> None:
  if event == _HIT_EVENT:
    with _counts_lock:
      for c in _counts:
        c.cached += 1


@contextlib.contextmanager
def counting() -> Iterator[CompileCount]:
  """A `CompileCount` of the programs built inside the block (any thread)."""
  count = CompileCount()
  with _counts_lock:
    if not _counts:
      jax.monitoring.register_event_duration_secs_listener(_on_duration)
      jax.monitoring.register_event_listener(_on_event)
    _counts.append(count)
  try:
    yield count
  finally:
    with _counts_lock:
      _counts.remove(count)
      if not _counts:
        jax.monitoring.unregister_event_duration_listener(_on_duration)
        jax.monitoring.unregister_event_listener(_on_event)


def announce(message: str) -> None:
  """One progress line on stderr, "specdec: <message>" (stdout stays the output's)."""
  print(f"specdec: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def compiling(what: str, cache: str | None, quiet: bool = False) -> Iterator[CompileCount]:
  """Count the compilations of a warm-up block, announcing it before and after on stderr:
  "preparing <what> (compiled once, then read back from DIR)" and "ready in X s: N
  compiled, M from the cache" (a warm run: 0 compiled). `cache`: `use_persistent_cache`'s
  directory (None: off)."""
  if not quiet:
    where = (f"compiled once, then read back from {cache}" if cache else
             "compilation cache off: compiled on every run")
    announce(f"preparing {what} ({where})")
  t0 = time.perf_counter()
  with counting() as count:
    yield count
  if not quiet:
    announce(f"ready in {time.perf_counter() - t0:.1f} s: {count.compiled} compiled, "
             f"{count.cached} from the cache")


class _KernelLog(logging.Handler):
  def emit(self, record: logging.LogRecord) -> None:
    announce(record.getMessage().removeprefix("specdec_jax: "))


def announce_kernel_build() -> None:
  """Show the CPU kernels' one-time build (`kernels.build` logs it) as progress lines."""
  log = logging.getLogger(build.__name__)
  if not any(isinstance(h, _KernelLog) for h in log.handlers):
    log.addHandler(_KernelLog(logging.INFO))
    log.setLevel(logging.INFO)
