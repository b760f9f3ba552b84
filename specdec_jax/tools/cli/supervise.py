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
  a signal, JAX's lines about its coordination service are replaced by one line naming
  what was lost (`verdict`), e.g. ``specdec decode: error: lost process 0 (the
  coordinator at 10.0.0.1:1234): UNAVAILABLE: Failed to send RPC to coordination
  service. ...; stopping process 1 of 2``, with exit code 1. A death by a signal with no
  sign of the coordination service (a crash) keeps its lines and ends with a line naming
  the signal, also exit code 1.
- otherwise the child's exit code is the parent's (0, 1 with the child's own one-line
  error, 2, 130 after Ctrl-C).
- SIGINT, SIGTERM and SIGHUP sent to the parent alone (`kill`) are relayed to the child;
  those a terminal sends reach the child directly (one process group) and are not sent
  twice. A child that a relayed signal ends takes the parent the same way.
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
import time
from typing import Sequence

#: The child's marker: the file descriptor of its pipe to the parent.
ENV = "SPECDEC_SUPERVISOR_FD"
#: Signals sent to the parent alone that it passes on to the child.
RELAYED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                if hasattr(signal, name))
#: Seconds a C++ log line (and what follows it) is held back while the child lives on.
HOLD = 3.0
PR_SET_PDEATHSIG = 1

_GLOG = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^ \]]+:\d+\] ?")
_FATAL = (b"terminate called", b"*** Check failure stack trace", b"Fatal Python error")
_COORDINATION = re.compile(rb"coordination.service|distributed service", re.IGNORECASE)
_STATUS = re.compile(rb"absl::Status: (.*)")


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


def verdict(signum: int, lines: Sequence[bytes], who: Who) -> tuple[str, bool]:
  """(the one-line error, whether it replaces `lines`) for a child that `signum` ended
  after writing `lines` (those held back)."""
  why = detail(lines)
  if any(_COORDINATION.search(line) for line in lines):
    if who.joined and who.process != 0:
      where = f" at {who.coordinator}" if who.coordinator else ""
      return (f"lost process 0 (the coordinator{where}): {why or 'JAX aborted'}; stopping "
              f"{who.name()}"), True
    if who.joined:
      return (f"JAX's coordination service lost a process: {why or 'JAX aborted'}; "
              f"stopping {who.name()}"), True
    where = who.coordinator or "the detected coordinator"
    return (f"{who.name()} could not join the processes through the coordinator at "
            f"{where}: {why or 'JAX aborted'}"), True
  try:
    name = signal.Signals(signum).name
  except ValueError:
    name = f"signal {signum}"
  return f"{who.name()} ended by {name}" + (f": {why}" if why else ""), False


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
  one-line error (``<program>: error: ...``)."""
  prctl = ctypes.CDLL(None, use_errno=True).prctl   # resolved before fork, not in the child
  write = _stderr_writer()
  report_r, report_w = os.pipe()
  blocked = signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)
  try:
    try:
      child = subprocess.Popen(list(command), stderr=subprocess.PIPE, pass_fds=(report_w,),
                               env=dict(os.environ, **{ENV: str(report_w)}),
                               preexec_fn=_preexec(os.getpid(), prctl))
    finally:
      os.close(report_w)
    try:
      code, held = _watch(child, Relay(write), poll)
    finally:
      _read_report(report_r, who)
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
  if code >= 0:
    return code
  if -code in RELAYED:          # ended by a signal meant for both: end the same way
    write(b"".join(held))
    _end_like(-code)
  message, replaces = verdict(-code, held, who)
  if not replaces:
    write(b"".join(held))
  write(f"{program}: error: {message}\n".encode())
  return 1


def _watch(child: subprocess.Popen, relay: Relay, poll: float) -> tuple[int, list[bytes]]:
  """Relay `child`'s stderr and the signals sent to us until it ends; (its return code,
  the lines still held back when it ended by a signal)."""
  assert child.stderr is not None
  err = child.stderr.fileno()
  ended_at = None
  try:
    while True:
      ready, _, _ = select.select([err], [], [], poll)
      now = time.monotonic()
      if ready:
        data = os.read(err, 1 << 16)
        if not data:
          break
        relay.feed(data, now)
      relay.tick(now, idle=not ready)
      while (info := signal.sigtimedwait(RELAYED, 0)) is not None:
        if info.si_code <= 0 and info.si_pid != child.pid:   # from a process, not a terminal
          child.send_signal(info.si_signo)
      if child.poll() is not None:     # a grandchild may hold the pipe open: stop soon after
        ended_at = ended_at or now
        if now - ended_at > 1.0:
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
