"""The library's test set-up: its settings (suite_settings.py: the persistent compilation
cache and XLA's compile-speed flags, shared with the lab's tests), the order the xdist
workers take files in, and the session fixtures of the T5X-written tiny model (helpers.py).

Tiers: `pytest tests/unit` (marker `unit`) is the model-free tier: acceptance rules, buffer,
counters, theory, settings and the engine on table models (`specdec_jax.testing`), in seconds;
`pytest -m "not slow"` is the fast tier to run before every commit (within 5 minutes on
2 cores from an empty cache); the full suite (README's test command) adds the tests marked
`@pytest.mark.slow`: each costs 3 s or more from a cold cache (a costly model, program or
subprocess), and the fast tier keeps a cheaper test of the same feature.
"""

import collections

import pytest
import suite_settings
from helpers import t5x_model, t5x_reference  # noqa: F401 (session fixtures)
from suite_settings import release_compiled_programs  # noqa: F401 (autouse, per module)

suite_settings.configure()    # before any test compiles

#: The test files that take half a minute or more from an empty cache (an 8-device
#: subprocess, Pallas's interpreter, a large model), longest first: `-n 2 --dist loadfile`
#: hands them out first (`pytest_collection_modifyitems`). From `--durations` of cold runs;
#: the order need not be exact, a file missing here only loses its place.
HEAVY_FILES = ("test_sharding.py", "test_lower.py", "test_gpu_kernels.py", "test_exact.py",
               "test_kernels_mesh.py", "test_tpu_kernels.py", "test_gpu_check.py",
               "test_soak.py", "test_dtype.py", "test_cli_mesh.py", "test_packaging.py",
               "test_cli_distributed.py", "test_multihost_mesh.py", "test_demo_large.py",
               "test_docs_examples.py",
               "test_gpu_lowering.py", "test_gemma4.py")


def pytest_configure(config):
  """Files go to the xdist workers in collection order (`pytest_collection_modifyitems`),
  not xdist's default order by test count (most first), which hands out the costly files
  with few tests (test_soak.py's one test: a minute) last: one worker then runs them while
  the other has finished."""
  if getattr(config.option, "loadscopereorder", False):
    config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)       # after `-m`/`-k` deselection: the tests that run
def pytest_collection_modifyitems(items):
  """Longest files first, the rest by test count (most first): the greedy order that
  keeps two workers' ends close. A file's tests keep their order (a stable sort)."""
  rank = {name: i for i, name in enumerate(HEAVY_FILES)}
  count = collections.Counter(str(item.path) for item in items)
  items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -count[str(item.path)],
                               str(item.path)))
