"""Build the CPU kernels on first use, cache the library, register its FFI target.

    from specdec_jax.kernels import build
    build.status()   # Status(available=True, reason='built ...', library='/root/.cache/...so')

The C++ sources ship as package data (`skinny.cc`, `attention.cc`, `pool.h`). On first
use they are compiled with the system C++ compiler (`$CXX`, default g++) against the XLA
FFI headers inside jaxlib (`jax.ffi.include_dir()`; nothing is linked) into one library,
in a per-user cache directory:
`$SPECDEC_CACHE_DIR`, else `$XDG_CACHE_HOME/specdec_jax`, else `~/.cache/specdec_jax`.
The file name carries a hash of the sources, the flags, the compiler and the jaxlib
version, so an upgrade of any of them builds a new library. Concurrent processes take
an exclusive lock on the cache entry while one of them builds, and the library is
written to a temporary file renamed into place: a reader never sees a partial file.

Everything but `SPECDEC_CPU_KERNELS` (read on every call) is decided once per
process; a failure on a machine that should support the kernels (no compiler, a
failed build) warns once, and the models then use XLA's dot.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import hashlib
import importlib.resources
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import threading
import time
import warnings

import jax

ENV_VAR = "SPECDEC_CPU_KERNELS"        # 0 / false / off / no: always use XLA's dot
DOT = "specdec_skinny_dot"                 # FFI target of the skinny products
ATTENTION = "specdec_decode_attention"     # FFI target of attention in decode requests
#: FFI target name -> the handler symbol the library exports.
TARGETS = {DOT: "SpecdecSkinnyDot", ATTENTION: "SpecdecDecodeAttention"}
SOURCES = ("skinny.cc", "attention.cc")    # compiled together into one library
HEADERS = ("pool.h",)
FLAGS = ("-std=c++17", "-O3", "-fPIC", "-shared", "-fno-math-errno")
#: Instruction sets the kernels are written for, best first: (name, /proc/cpuinfo flags it
#: needs, compiler flags). Both compute the same FMA sequence per element: same results.
ISAS = (("avx512", ("avx512f", "fma"), ("-mavx512f", "-mfma")),
        ("avx2", ("avx2", "fma"), ("-mavx2", "-mfma")))
_OFF = ("0", "false", "off", "no")

_log = logging.getLogger(__name__)
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Status:
  """Whether the kernels are used, and why (or why not)."""

  available: bool
  reason: str
  library: str | None = None


def status() -> Status:
  """The kernels' status now: the env switch, then the (cached) machine checks and build."""
  value = os.environ.get(ENV_VAR, "").strip().lower()
  if value in _OFF:
    return Status(False, f"disabled by {ENV_VAR}={os.environ[ENV_VAR]}")
  return _machine_status()


def available() -> bool:
  return status().available


def cache_dirs() -> list[pathlib.Path]:
  """Where the library is built, in order of preference (the first writable one is used)."""
  if os.environ.get("SPECDEC_CACHE_DIR"):
    return [pathlib.Path(os.environ["SPECDEC_CACHE_DIR"])]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return [pathlib.Path(base) / "specdec_jax",
          pathlib.Path(tempfile.gettempdir()) / f"specdec_jax-{os.getuid()}"]


def cpu_flags() -> set[str]:
  """The CPU's feature flags from /proc/cpuinfo (empty where it cannot be read)."""
  try:
    text = pathlib.Path("/proc/cpuinfo").read_text()
  except OSError:
    return set()
  for line in text.splitlines():
    if line.startswith("flags"):
      return set(line.split(":", 1)[1].split())
  return set()


_STATUS: list[Status] = []      # the machine's status, once decided


def _machine_status() -> Status:
  with _lock:
    if not _STATUS:
      _STATUS.append(_decide())
    return _STATUS[0]


def _decide() -> Status:
  """Backend, CPU, compiler, build and registration checks (run once per process)."""
  if jax.default_backend() != "cpu":
    return Status(False, f"the default JAX backend is {jax.default_backend()}, not cpu")
  if platform.machine().lower() not in ("x86_64", "amd64"):
    return Status(False, f"not an x86-64 CPU ({platform.machine()})")
  isa = instruction_set()
  if isa is None:
    return Status(False, "the CPU has neither avx512f nor avx2, with fma (from /proc/cpuinfo)")
  compiler = shutil.which(os.environ.get("CXX", "g++"))
  if compiler is None:
    return _unavailable(f"no C++ compiler ({os.environ.get('CXX', 'g++')} not on PATH)")
  try:
    path = _build(compiler, isa)
    lib = ctypes.cdll.LoadLibrary(str(path))
    for target, symbol in TARGETS.items():
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)),
                                  platform="cpu")
  except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as e:
    return _unavailable(str(e))
  return Status(True, f"built and registered ({isa[0]})", str(path))


def instruction_set(flags: set[str] | None = None) -> tuple | None:
  """The best entry of ISAS the CPU supports (`flags`: default /proc/cpuinfo's), or None."""
  flags = cpu_flags() if flags is None else flags
  return next((isa for isa in ISAS if set(isa[1]) <= flags), None)


def _unavailable(reason: str) -> Status:
  warnings.warn(f"specdec_jax: CPU decode kernels unavailable, using XLA's dot instead: "
                f"{reason} (set {ENV_VAR}=0 to silence)", RuntimeWarning, stacklevel=3)
  return Status(False, reason)


def _compiler_id(compiler: str) -> str:
  try:
    out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.splitlines()[0] if out.stdout else compiler
  except (OSError, subprocess.SubprocessError):
    return compiler


def _build(compiler: str, isa: tuple) -> pathlib.Path:
  """The cached library for this source / flags / compiler / jaxlib; builds it if missing."""
  import jaxlib
  package = importlib.resources.files(__package__)
  sources = {name: package.joinpath(name).read_bytes() for name in (*SOURCES, *HEADERS)}
  flags = (*FLAGS, *isa[2])
  key = hashlib.sha256(b"\0".join([*(n.encode() + b"\0" + b for n, b in sources.items()),
                                   " ".join(flags).encode(),
                                   _compiler_id(compiler).encode(),
                                   jaxlib.__version__.encode()])).hexdigest()[:16]
  errors = []
  for directory in cache_dirs():
    try:
      return _build_in(directory, f"kernels-{isa[0]}-{key}", sources, compiler, flags)
    except PermissionError as e:       # not writable: try the next directory
      errors.append(str(e))
  raise OSError("no writable cache directory: " + "; ".join(errors))


def _build_in(directory: pathlib.Path, stem: str, sources: dict[str, bytes], compiler: str,
              flags: tuple[str, ...]) -> pathlib.Path:
  path = directory / f"{stem}.so"
  if path.exists():
    return path
  directory.mkdir(parents=True, exist_ok=True)
  with open(directory / f"{stem}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)      # another process may be building the same file
    if path.exists():
      return path
    _log.info("specdec_jax: building the CPU decode kernels (first run only; cached in %s)",
              directory)
    t0 = time.perf_counter()
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
      # The sources are copied out of the package (which may be a zip) next to the library.
      with tempfile.TemporaryDirectory(prefix=stem + ".", dir=directory) as src_dir:
        for name, text in sources.items():
          pathlib.Path(src_dir, name).write_bytes(text)
        cmd = [compiler, *flags, "-isystem", jax.ffi.include_dir(), *SOURCES, "-o",
               os.path.abspath(tmp)]
        out = subprocess.run(cmd, cwd=src_dir, capture_output=True, timeout=600)
      if out.returncode != 0:
        tail = "\n".join(out.stderr.decode(errors="replace").strip().splitlines()[-8:])
        raise RuntimeError(f"building {', '.join(SOURCES)} failed ({' '.join(cmd)}):\n{tail}")
      os.replace(tmp, path)
      _log.info("specdec_jax: built the CPU decode kernels in %.1f s", time.perf_counter() - t0)
    finally:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
  return path
