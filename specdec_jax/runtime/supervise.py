"""A multi-process `specdec decode` runs in a supervised child, so that a process that JAX
aborts from C++ still ends with one line of ours.

When process 0 dies, it takes JAX's coordination service with it, and jaxlib's error
polling in every other process aborts that process at once (SIGABRT, glog lines and a
"Check failure stack trace") before Python, or `liveness`'s watchdog, can say anything.
No Python hook runs first (jaxlib's `missed_heartbeat_callback` cannot be given a Python
function in jaxlib 0.10: it crashes converting the status). So the process the user
started (the parent, `run`) only re-executes the same command as its child and watches
it:

- stdout and stdin are the child's own (the outputs pass untouched); stderr is read
  through a pipe and forwarded line by line as it comes, except that a C++ log line
  (glog's ``W1127 00:37:07.936375 4014 file.cc:147] ...``, or a fatal marker such as
  ``terminate called ...``) and the lines after it are held back for `HOLD` seconds: if
  the child lives on (or ends normally), they are forwarded in order; if it then dies by
  a signal, JAX's lines about its coordination service (its C++ log lines, their
  continuation lines, fatal markers and the stack traces after them: `jax_lines`) are
  replaced by one line naming what was lost (`verdict`), e.g. ``specdec decode: error:
  lost process 0 (the coordinator at 10.0.0.1:1234): UNAVAILABLE: Failed to send RPC to
  coordination service. ...; stopping process 1 of 2``, with exit code 1; our own lines
  among them are still forwarded, in order. A death by a signal with no sign of the
  coordination service (a crash) keeps its lines and ends with a line naming the signal,
  also exit code 1.
- otherwise the child's exit code is the parent's (0, 1 with the child's own one-line
  error, 2, 130 after Ctrl-C).
- SIGINT, SIGTERM and SIGHUP sent to the parent by a process (`kill`) are relayed to the
  child; those a terminal sends reach the child directly (one process group) and are not
  sent twice. A signal sent to the whole process group (`kill -- -PGID`, `timeout -s INT`,
  a scheduler signalling every process of a job) reaches the child directly too, but
  nothing tells the parent so: `siginfo` is the same as for a `kill` of the parent alone,
  and the sender's process group proves nothing (a script's `kill $!` comes from the
  child's own group). So the parent relays it, and the child (`as_child`) takes a
  repeated SIGINT within `REPEAT` seconds as the same interrupt: the second copy cannot
  interrupt the clean-up that the first started. SIGTERM and SIGHUP keep their default
  action in the child (it ends), so a second copy of them changes nothing. A child that a
  relayed signal ends takes the parent the same way; a signal that arrives once the
  child has ended is dropped (the child's outcome is the run's).
- the parent blocks the relayed signals in its main thread and collects them with
  `sigtimedwait` (which says whether a terminal sent them); a thread that another library
  started earlier with them unblocked may receive one instead: a Python handler, which
  always runs in the main thread, collects those too (relayed, as their sender is unknown).
- the child has PR_SET_PDEATHSIG = SIGKILL: killing the parent, even with SIGKILL, kills
  the child, so that the other processes see a killed process lost.

The child knows it is one by `ENV` (the write end of a pipe to the parent, which also
makes `wanted` false there); once `jax.distributed` is joined it reports its process
index, the process count and the coordinator (`joined`), so that the parent can tell a
lost coordinator from one never reached. Linux only (`prctl`, `sigtimedwait`); elsewhere
the command runs in the process itself, as does `main(argv)` called from Python.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence

from specdec_jax.flags import FlagError

#: The child's marker: the file descriptor of its pipe to the parent.
ENV = "SPECDEC_SUPERVISOR_FD"
#: Signals sent to the parent alone that it passes on to the child.
RELAYED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                if hasattr(signal, name))
#: Seconds a C++ log line (and what follows it) is held back while the child lives on.
HOLD = 3.0
#: Seconds within which the child takes a repeated SIGINT as the same interrupt.
REPEAT = 1.0
PR_SET_PDEATHSIG = 1

_GLOG = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^ \]]+:\d+\] ?")
_FATAL = (b"terminate called", b"*** Check failure stack trace", b"Fatal Python error")
_COORDINATION = re.compile(rb"coordination.service|distributed service", re.IGNORECASE)
_STATUS = re.compile(rb"absl::Status: (.*)")
_TASK = re.compile(rb"/job:[^/\s]+/replica:\d+/task:(\d+)")
_LEADER = re.compile(rb"UNAVAILABLE|leader task")
#: A line that starts a message of ours (or Python's) rather than continuing JAX's.
_OURS = re.compile(rb"^(specdec\b|Traceback \(|\S+\.py:\d+: \w*(Warning|Error)\b)")


def supported() -> bool:
  """Whether this platform can supervise (Linux: `prctl` and `sigtimedwait`)."""
  return sys.platform.startswith("linux") and hasattr(signal, "sigtimedwait")


def wanted(distributed: bool) -> bool:
  """Whether this process should run a `distributed` command as a supervised child: not
  already a child, and on a platform that can."""
  return distributed and ENV not in os.environ and supported()


@dataclasses.dataclass
class Who:
  """The child's place among the processes, as far as known: the flags' values first, the
  child's `joined` report once it arrives."""

  process: int | None = None
  processes: int | None = None
  coordinator: str | None = None
  joined: bool = False

  def name(self) -> str:
    index = "?" if self.process is None else self.process
    return f"process {index}" + (f" of {self.processes}" if self.processes else "")


def as_child() -> None:
  """In a supervised child (in its main thread, at its start): take a SIGINT repeated
  within `REPEAT` seconds as the same interrupt (see the module's docstring). A no-op in a
  process that is not a child."""
  if ENV not in os.environ or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    return
  last = [-REPEAT]

  def interrupt(signum, frame):
    now = time.monotonic()
    if now - last[0] < REPEAT:      # the same interrupt, sent to the group and relayed
      return
    last[0] = now
    raise KeyboardInterrupt
  signal.signal(signal.SIGINT, interrupt)


def joined(process: int, processes: int, coordinator: str | None) -> None:
  """In a supervised child: tell the parent that `jax.distributed` is joined (a no-op in
  a process that is not a child)."""
  fd = os.environ.pop(ENV, None)
  if fd is None or not fd.isdigit():
    return
  report = json.dumps({"process": process, "processes": processes,
                       "coordinator": coordinator}) + "\n"
  try:
    os.write(int(fd), report.encode())
    os.close(int(fd))
  except OSError:     # no parent listening: nothing to tell
    pass


def _first_sentences(text: str, limit: int = 240) -> str:
  sentences = re.split(r"(?<=\.) +", " ".join(text.split()))
  out = sentences[0]
  for sentence in sentences[1:]:
    if len(out) + 1 + len(sentence) > limit:
      break
    out += " " + sentence
  return out[:limit].rstrip(". ")


def detail(lines: Sequence[bytes]) -> str:
  """The most useful words of JAX's dying lines: the status of its fatal line (e.g.
  "UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was
  preempted/died/restarted unexpectedly ..."), else the first error line's message."""
  for line in lines:
    status = _STATUS.search(line)
    if status and _GLOG.match(line):
      return _first_sentences(status.group(1).decode(errors="replace"))
  for severity in (b"F", b"E", b"W"):
    for line in lines:
      match = _GLOG.match(line)
      if match and match.group(1) == severity:
        return _first_sentences(line[match.end():].decode(errors="replace"))
  return ""


def lost_task(lines: Sequence[bytes], own: int | None) -> int | None:
  """The process (JAX's task, ``/job:jax_worker/replica:0/task:2``) other than `own` that
  JAX's lines name, if any."""
  for line in lines:
    for match in _TASK.finditer(line):
      if int(match.group(1)) != own:
        return int(match.group(1))
  return None


def jax_lines(lines: Sequence[bytes]) -> list[bool]:
  """For each of `lines`: whether it is JAX's (a C++ log line and the lines continuing
  it, a fatal marker and the stack trace after it) rather than one of ours, which starts
  with our program's name, a Python traceback or warning."""
  marks, inside = [], False
  for line in lines:
    if _GLOG.match(line) or line.startswith(_FATAL):
      inside = True
    elif _OURS.match(line):
      inside = False
    marks.append(inside)
  return marks


def verdict(signum: int, lines: Sequence[bytes], who: Who) -> tuple[str, bool]:
  """(the one-line error, whether it replaces JAX's `lines` (`jax_lines`)) for a child
  that `signum` ended after writing `lines` (those held back)."""
  found = detail(lines)
  why = found or "JAX aborted"
  if any(_COORDINATION.search(line) for line in lines):
    task = lost_task(lines, who.process) if who.joined else None
    if who.joined and task not in (None, 0):
      return f"lost process {task}: {why}; stopping {who.name()}", True
    leader = task == 0 or any(_LEADER.search(line) for line in lines)
    if who.joined and who.process != 0 and leader:
      where = f" at {who.coordinator}" if who.coordinator else ""
      return f"lost process 0 (the coordinator{where}): {why}; stopping {who.name()}", True
    if who.joined and who.process != 0:
      return (f"lost the coordination service (process 0 or a peer): {why}; stopping "
              f"{who.name()}"), True
    if who.joined:
      return (f"JAX's coordination service lost a process: {why}; "
              f"stopping {who.name()}"), True
    where = who.coordinator or "the detected coordinator"
    return (f"{who.name()} could not join the processes through the coordinator at "
            f"{where}: {why}"), True
  try:
    name = signal.Signals(signum).name
  except ValueError:
    name = f"signal {signum}"
  return f"{who.name()} ended by {name}" + (f": {found}" if found else ""), False


class Relay:
  """The child's stderr on its way to ours: whole lines forwarded as they come, C++ log
  lines and what follows them held back for `hold` seconds (see the module's docstring).
  `write` receives the bytes to forward."""

  def __init__(self, write, hold: float = HOLD):
    self.write, self.hold = write, hold
    self.partial = b""
    self.held: list[bytes] = []
    self.since = 0.0        # when the latest C++ log line came
    self.fatal = False      # a line that only a dying process writes: hold until the end

  def feed(self, data: bytes, now: float) -> None:
    lines = (self.partial + data).split(b"\n")
    self.partial = lines.pop()
    for line in lines:
      self.line(line + b"\n", now)

  def line(self, line: bytes, now: float) -> None:
    glog = _GLOG.match(line)
    fatal = line.startswith(_FATAL) or bool(glog and glog.group(1) == b"F")
    if fatal or (glog and glog.group(1) != b"I"):
      self.since, self.fatal = now, self.fatal or fatal
      self.held.append(line)
    elif self.held:
      self.held.append(line)
    else:
      self.write(line)

  def tick(self, now: float, idle: bool) -> None:
    """Forward what was held once the child lived `hold` seconds past it (unless it wrote
    a fatal line), and a partial line the child left while quiet (`idle`)."""
    if self.held and not self.fatal and now - self.since >= self.hold:
      self.flush()
    if idle and self.partial and not self.held and not _GLOG.match(self.partial):
      self.write(self.partial)
      self.partial = b""

  def flush(self) -> None:
    self.write(b"".join(self.held) + self.partial)
    self.held, self.partial = [], b""

  def end(self) -> list[bytes]:
    """At the child's end: what is held (a trailing partial line included), not forwarded."""
    held = self.held + ([self.partial] if self.partial else [])
    self.held, self.partial = [], b""
    return held


def _stderr_writer():
  out = getattr(sys.stderr, "buffer", None)

  def write(data: bytes) -> None:
    try:
      if out is not None:
        out.write(data)
        out.flush()
      else:
        sys.stderr.write(data.decode(errors="replace"))
        sys.stderr.flush()
    except (OSError, ValueError):     # our stderr is gone: keep draining the child's
      pass
  return write


def _preexec(parent: int, prctl):
  def setup():
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:       # the parent died before prctl: follow it
      os.kill(os.getpid(), signal.SIGKILL)
  return setup


def _end_like(signum: int) -> None:
  """End this process by `signum`, as the child was."""
  sys.stdout.flush()
  sys.stderr.flush()
  signal.signal(signum, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
  os.kill(os.getpid(), signum)
  time.sleep(1)
  os._exit(128 + signum)


def run(command: Sequence[str], who: Who, program: str = "specdec decode",
        poll: float = 0.1) -> int:
  """Run `command` as a supervised child (see the module's docstring); the exit code for
  this process. `who` is updated by the child's `joined` report; `program` starts the
  one-line error (``<program>: error: ...``). A child that cannot be started is a
  `FlagError`."""
  prctl = ctypes.CDLL(None, use_errno=True).prctl   # resolved before fork, not in the child
  write = _stderr_writer()
  report_r, report_w = os.pipe()
  caught: list[int] = []        # signals that a thread other than this one received
  handlers = _catch(caught)
  blocked = signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)
  try:
    try:
      child = subprocess.Popen(list(command), stderr=subprocess.PIPE, pass_fds=(report_w,),
                               env=dict(os.environ, **{ENV: str(report_w)}),
                               preexec_fn=_preexec(os.getpid(), prctl))
    except (OSError, subprocess.SubprocessError) as e:
      reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
      raise FlagError(f"cannot start the supervised child {command[0]!r}: {reason}") from None
    finally:
      os.close(report_w)
    try:
      code, held = _watch(child, Relay(write), poll, caught)
    finally:
      _read_report(report_r, who)
      report_r = -1
  finally:
    if report_r >= 0:
      os.close(report_r)
    while signal.sigtimedwait(RELAYED, 0) is not None:   # came once the child had ended
      pass
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    for signum, handler in handlers.items():
      signal.signal(signum, handler)
  if code >= 0:
    return code
  if -code in RELAYED:          # ended by a signal meant for both: end the same way
    write(b"".join(held))
    _end_like(-code)
  message, replaces = verdict(-code, held, who)
  if replaces:
    held = [line for line, jax in zip(held, jax_lines(held), strict=True) if not jax]
  write(b"".join(held))
  write(f"{program}: error: {message}\n".encode())
  return 1


def _catch(caught: list[int]) -> dict:
  """In the main thread: handlers that append a relayed signal to `caught`, for one that
  a thread not blocking it receives (Python runs the handler in the main thread); the
  handlers they replace."""
  if threading.current_thread() is not threading.main_thread():
    return {}
  previous = {}
  for signum in RELAYED:
    previous[signum] = signal.signal(signum, lambda signum, frame: caught.append(signum))
  return previous


def _watch(child: subprocess.Popen, relay: Relay, poll: float,
           caught: list[int]) -> tuple[int, list[bytes]]:
  """Relay `child`'s stderr and the signals sent to us (`caught`: those a handler
  collected) until it ends; (its return code, the lines still held back when it ended by
  a signal)."""
  assert child.stderr is not None
  err: int | None = child.stderr.fileno()
  ended_at = None
  try:
    while True:
      if err is None:
        time.sleep(poll)
        ready: list[int] = []
      else:
        ready, _, _ = select.select([err], [], [], poll)
      now = time.monotonic()
      if ready:
        data = os.read(ready[0], 1 << 16)
        if data:
          relay.feed(data, now)
        else:            # the child closed its stderr: wait for its end, still relaying
          err = None
      relay.tick(now, idle=not ready)
      while (info := signal.sigtimedwait(RELAYED, 0)) is not None:
        if info.si_code <= 0 and info.si_pid != child.pid:   # from a process, not a terminal
          caught.append(info.si_signo)
      while caught:
        child.send_signal(caught.pop(0))
      if child.poll() is not None:     # a grandchild may hold the pipe open: stop soon after
        ended_at = ended_at or now
        if err is None or now - ended_at > 1.0:
          break
  except BaseException:     # a bug of ours: the child must not outlive it
    child.kill()
    raise
  finally:
    code = child.wait()
    child.stderr.close()
  if code >= 0:
    relay.flush()
    return code, []
  return code, relay.end()


def _read_report(fd: int, who: Who) -> None:
  """Read the child's `joined` report, if it made one, into `who`."""
  data = b""
  try:
    os.set_blocking(fd, False)     # a write end still open elsewhere must not block us
    while chunk := os.read(fd, 4096):
      data += chunk
  except BlockingIOError:
    pass
  finally:
    os.close(fd)
  try:
    report = json.loads(data.decode().splitlines()[0])
  except (IndexError, ValueError, UnicodeDecodeError):
    return
  who.process, who.processes = report["process"], report["processes"]
  who.coordinator = report["coordinator"] or who.coordinator
  who.joined = True
