"""runtime.progress: a signal that arrives while a batch's rows are written and counted is
raised after the block, whichever thread the kernel handed it to."""

import os
import signal
import threading
import time

import pytest

from specdec_jax.runtime.progress import Progress, deferred_signals


class _Raised(Exception):
  pass


def _raise(signum, frame):
  raise _Raised(signum)


def _signal_from_another_thread(signum: int) -> None:
  t = threading.Thread(target=os.kill, args=(os.getpid(), signum))
  t.start()
  t.join()
  time.sleep(0.05)                      # the main thread passes many bytecodes: a handler
  for _ in range(1000):                 # left to run would have run by now
    pass


@pytest.fixture
def raising_handlers():
  old = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)}
  yield
  for s, handler in old.items():
    signal.signal(s, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_block_is_raised_after_it(raising_handlers, signum):
  steps = []
  with pytest.raises(_Raised) as raised:
    with deferred_signals():
      _signal_from_another_thread(signum)
      steps.append("written")
      steps.append("counted")
  assert steps == ["written", "counted"] and raised.value.args == (signum,)
  assert signal.getsignal(signum) is _raise          # the handlers are back


def test_negative_control_without_the_block_the_signal_cuts_in(raising_handlers):
  steps = []
  with pytest.raises(_Raised):
    _signal_from_another_thread(signal.SIGINT)
    steps.append("written")
  assert steps == []


def test_a_quiet_block_raises_nothing(raising_handlers):
  with deferred_signals():
    pass
  assert signal.getsignal(signal.SIGINT) is _raise


def test_progress_counts_rows_and_says_what_was_kept(capsys):
  import sys
  progress = Progress(10, "specdec decode", every=3600.0, stream=sys.stdout)
  progress.update(4, 40)
  assert capsys.readouterr().out == ""               # not yet a second since the start
  progress.update(6, 60)                             # the last rows: always printed
  assert capsys.readouterr().out.startswith("specdec decode: 10/10 rows, 100 tokens, ")
  assert progress.kept("in 'out.txt'") == "10 of 10 rows kept (in 'out.txt')"
