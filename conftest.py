"""The repository's pytest plugin, for the library's tests and the lab's alike: the order the
xdist workers take files in and the file each worker takes next, made from data (the
seconds each test took in a CI run, in tests/durations.json), and `--store-durations` to
refresh that data. At the root so that a step running both folders (CI's soak step) loads
it once.
"""

import collections
import json
import pathlib

import pytest

REPO_DIR = pathlib.Path(__file__).parent

#: Seconds each test took in a CI run from an empty compilation cache (its setup, call and
#: teardown), keyed by node id from the repository root: the data the xdist order is made
#: from (`pytest_collection_modifyitems`). Per test, not per file, so that a marker's step
#: (`-m device`, `-m soak`, `-m docs`) orders its files by the tests it runs. CI refreshes
#: it with `--store-durations tests/durations.json` in each test step (CONTRIBUTING.md).
DURATIONS = REPO_DIR / "tests" / "durations.json"


def pytest_addoption(parser):
  parser.addoption(
      "--store-durations", metavar="PATH", default=None,
      help="at the end of the session write each test's seconds (setup, call and teardown) "
      "into the JSON file PATH, keeping the entries of tests that did not run; also under "
      "xdist (the controller writes)")


def _file(nodeid: str) -> str:
  return nodeid.split("::")[0]


def _estimates() -> collections.defaultdict:
  """node id -> stored seconds; a test with none stored, the mean of those stored."""
  stored = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
  mean = sum(stored.values()) / max(1, len(stored))
  return collections.defaultdict(lambda: mean, stored)


def pytest_configure(config):
  """Files go to the xdist workers in collection order (`pytest_collection_modifyitems`),
  not xdist's default order by test count (most first), which hands out the costly files
  with few tests (test_soak.py's one test: a minute) last: one worker then runs them while
  the other has finished."""
  if getattr(config.option, "loadscopereorder", False):
    config.option.loadscopereorder = False


#: node id -> seconds of each test that ran in this process (the xdist controller: in every
#: worker), for `--store-durations`
_SECONDS: collections.Counter = collections.Counter()


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items):
  """Longest files first (the greedy order that keeps two workers' ends close); a file's
  tests keep their order (a stable sort). A file's estimate: the stored seconds of its tests
  that run (after `-m`/`-k` deselect); a test with none stored, the mean of those stored."""
  yield                                   # deselection: `items` now holds the tests to run
  seconds = _estimates()
  estimate: collections.Counter = collections.Counter()
  for item in items:
    estimate[_file(item.nodeid)] += seconds[item.nodeid]
  items.sort(key=lambda item: (-estimate[_file(item.nodeid)], _file(item.nodeid)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """`--dist loadfile` whose next file for a worker depends on what the workers hold.

  An xdist worker runs a test only once it holds the next (its teardown depends on it), so
  the scheduler hands a worker its next file while the worker's last tests still run: with
  xdist's own choice (the next file in order), a worker starting a long one-test file
  (test_soak.py) also takes the next long file, and the other worker idles at the end. Here
  a worker that holds more unfinished seconds than another takes the shortest file left
  (a filler), and otherwise the longest (the greedy order). It reads xdist's own queue and
  assignments (`workqueue`, `assigned_work`, `_assign_work_unit`, as of xdist 3.5-3.8): an
  xdist without them gets its own scheduler."""
  if config.getvalue("dist") != "loadfile":
    return None
  from xdist.scheduler import LoadFileScheduling
  if not hasattr(LoadFileScheduling, "_assign_work_unit"):
    return None

  seconds = _estimates()

  class Balanced(LoadFileScheduling):
    def _held(self, node) -> float:
      return sum(seconds[test] for unit in self.assigned_work.get(node, {}).values()
                 for test, done in unit.items() if not done)

    def _assign_work_unit(self, node) -> None:
      others = [self._held(other) for other in self.assigned_work if other is not node]
      if others and self._held(node) > min(others):       # the shortest file first
        self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)
      super()._assign_work_unit(node)                    # takes the first file in the queue

  scheduler = Balanced(config, log)
  if not isinstance(getattr(scheduler, "workqueue", None), collections.OrderedDict) \
      or not isinstance(getattr(scheduler, "assigned_work", None), dict):
    return None
  return scheduler


def pytest_runtest_logreport(report):
  """Each test's setup, call and teardown seconds (under xdist the controller receives
  every worker's reports)."""
  _SECONDS[report.nodeid] += report.duration


def pytest_sessionfinish(session):
  """`--store-durations PATH`: the tests that ran, with their seconds, merged into PATH,
  which keeps the others' (those of a deleted file dropped; delete PATH to drop those of
  deleted tests too). Written once: by the xdist controller, or the only process."""
  path = session.config.getoption("store_durations")
  if path is None or hasattr(session.config, "workerinput"):
    return
  path = pathlib.Path(path)
  stored = json.loads(path.read_text()) if path.exists() else {}
  stored = {t: s for t, s in stored.items() if (REPO_DIR / _file(t)).exists()}
  stored |= {t: round(s, 2) for t, s in _SECONDS.items()}
  path.write_text(json.dumps(dict(sorted(stored.items())), indent=0) + "\n")
