"""runtime.progress: a signal that arrives while a batch's rows are written and counted is
raised after the block, whichever thread the kernel handed it to."""

import os
import signal
import threading
import time

import pytest

from specdec_jax.runtime.progress import (
  Interrupted,
  Progress,
  Terminated,
  deferred_signals,
  interrupts_kept,
  on_sigterm,
)

pytestmark = pytest.mark.unit


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


@pytest.mark.parametrize("interrupt, terminated", [(KeyboardInterrupt, False),
                                                   (Terminated, True)])
def test_an_interrupt_says_what_was_kept_when_it_came(interrupt, terminated):
  """The message is read at the interrupt (rows counted in the block), SIGTERM stays
  told apart; with nothing kept the interrupt goes through as it came."""
  done = 0
  with pytest.raises(Interrupted) as raised:
    with interrupts_kept(lambda: f"{done} of 5 rows kept"):
      done += 3
      raise interrupt
  assert (raised.value.detail, raised.value.terminated) == ("3 of 5 rows kept", terminated)
  assert raised.value.__suppress_context__           # one line, not a chained trace
  with pytest.raises(KeyboardInterrupt) as plain:
    with interrupts_kept(lambda: None):
      raise interrupt
  assert type(plain.value) is interrupt
  with interrupts_kept(lambda: "never read"):         # a quiet block: nothing raised
    pass


def test_a_sigterm_that_a_callers_error_swallowed_still_ends_the_run_as_terminated():
  """SIGTERM's handler can run inside a Python callback of jax's C++ code (a jit cache
  comparing static arguments), which raises its own ValueError instead of `Terminated`
  (seen in CI: exit 1 in place of 143). Another error, with no SIGTERM, stays itself."""
  old = signal.getsignal(signal.SIGTERM)
  on_sigterm()
  try:
    def swallowing_callback():                  # jax: "static arguments should be ..."
      try:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10**6):                  # the handler runs between bytecodes
          pass
      except Terminated as e:
        raise ValueError("static arguments should be comparable") from e
    with pytest.raises(Interrupted) as raised:
      with interrupts_kept(lambda: "2 of 5 rows kept"):
        swallowing_callback()
    assert (raised.value.detail, raised.value.terminated) == ("2 of 5 rows kept", True)
    with pytest.raises(Terminated):
      with interrupts_kept(lambda: None):
        swallowing_callback()
    with pytest.raises(ValueError):             # no SIGTERM in this block: its own error
      with interrupts_kept(lambda: "never read"):
        raise ValueError("a real error")
  finally:
    signal.signal(signal.SIGTERM, old)


@pytest.mark.slow
def test_a_blocked_interrupt_inherited_from_the_parent_is_unblocked():
  """A process started with SIGINT blocked (a parent's mask, kept across exec) still
  ends on Ctrl-C once it calls `unblock_interrupts` at its start."""
  import subprocess
  import sys
  code = ("import os, signal, time\n"
          "from specdec_jax.runtime import progress\n"
          "if os.environ['UNBLOCK'] == '1':\n"
          "  progress.unblock_interrupts()\n"
          "os.kill(os.getpid(), signal.SIGINT)\n"
          "time.sleep(0.2)\n"
          "print('ran on')\n")
  launch = ("import os, signal, sys\n"
            "signal.signal(signal.SIGINT, signal.SIG_DFL)   # not a background job's\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
            "os.execv(sys.executable, [sys.executable, '-c', sys.argv[1]])\n")
  for unblock, interrupted in (("1", True), ("0", False)):     # and the negative control
    out = subprocess.run([sys.executable, "-c", launch, code], capture_output=True,
                         text=True, env={**os.environ, "UNBLOCK": unblock}, timeout=60)
    assert ("KeyboardInterrupt" in out.stderr) is interrupted, out.stderr[-500:]
    assert ("ran on" in out.stdout) is not interrupted


def test_an_output_files_lines_and_count_stay_together(raising_handlers, tmp_path,
                                                       monkeypatch):
  """A signal that comes while `OutputFile.append` writes is raised after the lines are
  counted: `rows` is what the file holds (the 'N rows kept' of a stopped run)."""
  from specdec_jax.runtime import output_file
  out = output_file.OutputFile(str(tmp_path / "out.txt"), {}, rows=0)
  real_fsync = os.fsync

  def fsync_then_signal(fd):
    real_fsync(fd)
    _signal_from_another_thread(signal.SIGTERM)     # lands between write and count
  monkeypatch.setattr(output_file.os, "fsync", fsync_then_signal)
  with pytest.raises(_Raised):
    out.append(["a", "b"])
  assert out.rows == len((tmp_path / "out.txt").read_text().splitlines()) == 2
