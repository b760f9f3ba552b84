"""Shared fixtures (the T5X-written tiny model, small random model pairs) and test settings.

Almost all of the suite's time is XLA compiles, so the tests keep a persistent compilation
cache: every program compiled once is loaded from disk by later runs (and by later modules of
the same run, after `_release_compiled_programs` has dropped it from memory). Where it lives:

  JAX_COMPILATION_CACHE_DIR   when set, JAX's own setting is kept as it is;
  SPECDEC_TEST_CACHE          else this directory ("off": no persistent cache, e.g. to
                              measure compile times);
  <repo>/.jax_cache/          else (ignored by git; delete it to start cold).

Every program is cached (minimum compile time 0 s, minimum entry size 0 bytes) unless
JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS / JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES say
otherwise. Entries are keyed by the program, the backend, jaxlib and the XLA flags, so a
stale entry is never loaded; the directory only grows (a full run writes a few hundred MB).

Compile time: XLA's LLVM back end runs at optimization level 0 in the tests
(`--xla_backend_optimization_level=0` added to XLA_FLAGS, also for the subprocesses),
which cuts compile-bound test time by about 40%, and its CPU back end emits fused loops with
its older emitters (`--xla_cpu_use_fusion_emitters=false`, where this jaxlib has the flag),
which cuts another third. The HLO is the same, but the machine code is not quite: at XLA's
own level LLVM contracts a*b+c into fused multiply-adds, so a value can differ in its last
bit from what users compute. The tests compare programs
compiled alike, and CI runs the exactness tests again at XLA's own level, kernels on and
off (`.ci/run`). SPECDEC_TEST_XLA_OPT=default keeps XLA's level (or =N sets level N); an
XLA_FLAGS that already names a level is kept.

Tiers: `pytest tests/unit` (marker `unit`) is the model-free tier: acceptance rules, buffer,
counters, theory, settings and the engine on table models (`specdec_jax.testing`), in seconds;
`pytest -m "not slow"` is the fast tier to run before every commit (within 5 minutes on
2 cores from an empty cache); the full suite (README's test command) adds the tests marked
`@pytest.mark.slow`: each costs 3 s or more from a cold cache (a costly model, program or
subprocess), and the fast tier keeps a cheaper test of the same feature.
"""

import collections
import gc
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util
from helpers import EMITTERS_FLAG, FIXTURE_DIR, LEGACY_EMITTERS, OPT_LEVEL_FLAG, REPO_DIR

import specdec_jax as sd


def _use_compilation_cache() -> None:
  """Point JAX's persistent compilation cache at a directory (see the module docstring)."""
  if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    where = os.environ.get("SPECDEC_TEST_CACHE", str(REPO_DIR / ".jax_cache"))
    if where.lower() in ("off", "0", "none", ""):
      return
    jax.config.update("jax_compilation_cache_dir", where)
    # Also in the environment: the CLI and wheel tests run `specdec` in subprocesses.
    os.environ["JAX_COMPILATION_CACHE_DIR"] = where
  for name, value in (("jax_persistent_cache_min_compile_time_secs", 0.0),
                      ("jax_persistent_cache_min_entry_size_bytes", 0)):
    if name.upper() not in os.environ:
      jax.config.update(name, value)
      os.environ[name.upper()] = str(value)


def _xla_knows(flag: str) -> bool:
  """Whether this jaxlib's XLA accepts `flag` (it aborts the process on an unknown one):
  asked once, in a child, and remembered in the environment for the xdist workers."""
  key = "SPECDEC_TEST_XLA_KNOWS_" + flag.strip("-").split("=")[0].upper()
  if key not in os.environ:
    probe = subprocess.run(
        [sys.executable, "-c", "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"],
        env=dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS="cpu"), capture_output=True)
    os.environ[key] = "1" if probe.returncode == 0 else "0"
  return os.environ[key] == "1"


def _use_fast_compiles() -> None:
  """XLA's back-end optimization level 0 and its older loop emitters in the tests (see the
  module docstring)."""
  flags = os.environ.get("XLA_FLAGS", "")
  level = os.environ.get("SPECDEC_TEST_XLA_OPT", "0")
  if level == "default" or OPT_LEVEL_FLAG in flags:
    return
  if not level.isdigit():
    raise pytest.UsageError(f"SPECDEC_TEST_XLA_OPT={level!r}: 'default' or a level (0-3)")
  flags = f"{flags} {OPT_LEVEL_FLAG}={level}"
  if EMITTERS_FLAG not in flags and _xla_knows(LEGACY_EMITTERS):
    flags = f"{flags} {LEGACY_EMITTERS}"
  os.environ["XLA_FLAGS"] = flags.strip()


#: CPU devices in every test process (`jax_num_cpu_devices`): the mesh tests lay out meshes
#: of up to 8 in-process. Everything else runs on device 0, as on one device; the setting is
#: jax's, not the environment's, so `specdec` subprocesses still see one device.
CPU_DEVICES = 8


# Before any test compiles: conftest.py is imported before the test modules, and XLA reads
# XLA_FLAGS and the device count when its CPU client starts (the first computation).
_use_fast_compiles()
_use_compilation_cache()
jax.config.update("jax_num_cpu_devices", CPU_DEVICES)


#: Seconds each test file took in a full run from an empty compilation cache (its tests'
#: setup, call and teardown summed), keyed by path from the repository root: the data the
#: xdist order is made from (`pytest_collection_modifyitems`). A run refreshes it with
#: `--store-durations tests/durations.json` (CONTRIBUTING.md).
DURATIONS = pathlib.Path(__file__).parent / "durations.json"


def pytest_addoption(parser):
  parser.addoption(
      "--store-durations", metavar="PATH", default=None,
      help="at the end of the session write each test file's seconds (setup, call and "
      "teardown of its tests that ran, summed) into the JSON file PATH, keeping the entries "
      "of files that did not run; also under xdist (the controller writes)")


def _file(nodeid: str) -> str:
  return nodeid.split("::")[0]


def pytest_configure(config):
  """Files go to the xdist workers in collection order (`pytest_collection_modifyitems`),
  not xdist's default order by test count (most first), which hands out the costly files
  with few tests (test_soak.py's one test: a minute) last: one worker then runs them while
  the other has finished."""
  if getattr(config.option, "loadscopereorder", False):
    config.option.loadscopereorder = False


#: file -> seconds of its tests that ran in this process (the xdist controller: in every
#: worker), for `--store-durations`
_SECONDS: collections.Counter = collections.Counter()


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items):
  """Longest files first (the greedy order that keeps two workers' ends close); a file's
  tests keep their order (a stable sort). A file's estimate: its stored seconds times the
  share of its tests that run (after `-m`/`-k` deselect); a file with none stored, its
  tests times the mean seconds per test of the stored files."""
  collected = collections.Counter(_file(item.nodeid) for item in items)
  yield                                   # deselection: `items` now holds the tests to run
  stored = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
  known = [f for f in collected if f in stored]
  per_test = sum(stored[f] for f in known) / max(1, sum(collected[f] for f in known))
  running = collections.Counter(_file(item.nodeid) for item in items)
  estimate = {f: stored.get(f, per_test * collected[f]) * n / collected[f]
              for f, n in running.items()}
  items.sort(key=lambda item: (-estimate[_file(item.nodeid)], _file(item.nodeid)))


def pytest_runtest_logreport(report):
  """Each test's setup, call and teardown seconds, added to its file's (under xdist the
  controller receives every worker's reports)."""
  _SECONDS[_file(report.nodeid)] += report.duration


def pytest_sessionfinish(session):
  """`--store-durations PATH`: the files that ran, with their seconds, merged into PATH
  (written once: by the xdist controller, or the only process)."""
  path = session.config.getoption("store_durations")
  if path is None or hasattr(session.config, "workerinput"):
    return
  path = pathlib.Path(path)
  stored = json.loads(path.read_text()) if path.exists() else {}
  stored = {f: s for f, s in stored.items() if (REPO_DIR / f).exists()}
  stored |= {f: round(s, 1) for f, s in _SECONDS.items()}
  path.write_text(json.dumps(dict(sorted(stored.items())), indent=1) + "\n")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drop JAX's compiled programs after each test module.

  Every XLA:CPU executable keeps its JIT-compiled code in a few hundred memory
  mappings until it is freed. The suite compiles well over a thousand programs in
  one process, which would pass the kernel's vm.max_map_count (65,530 by default);
  LLVM then fails to map the next program and the process aborts or segfaults inside
  a compile (seen in CI at about 60% of the suite). Modules share no compiled state.
  """
  yield
  jax.clear_caches()
  gc.collect()


@pytest.fixture(scope="session")
def t5x_reference():
  """reference.npz written by the real T5X code (see fixtures/t5x_tiny_v1_1/README.md)."""
  return dict(np.load(FIXTURE_DIR / "reference.npz"))


@pytest.fixture(scope="session")
def t5x_model(t5x_reference):
  """The fixture's params wrapped as our Model (independent of the checkpoint loaders)."""
  params = traverse_util.unflatten_dict(
      {tuple(k.split("/")): v for k, v in t5x_reference.items() if "/" in k})
  config = sd.T5Config.from_dict(json.loads((FIXTURE_DIR / "config.json").read_text()))
  return sd.Model(config=config, params=params)
