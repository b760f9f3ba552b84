"""Several processes fail loudly: a lost process stops the others with a one-line error.

Without this, a process whose peer died waits in its next collective: JAX's coordination
service notices the missing heartbeats after `heartbeat_timeout_seconds` (100 s by
default in jax 0.10) and then aborts the survivor from C++ (SIGABRT, a stack trace and
no word from Python), and a Gloo collective started after the death first times out on
its own.

`start` runs a daemon thread in each process that every `period` seconds bumps its own
counter in the coordination service's key-value store (`specdec/alive/<process>`) and
reads everyone's:

- a peer whose counter has not moved for `timeout` seconds (by this process's clock: no
  clock agreement needed) is lost: "process 1 of 2 stopped answering ...";
- a failed call means the coordination service (process 0's) is gone: "lost process 0
  (the coordinator at HOST:PORT) ...".

A collective that fails because its peer died raises at once in the main thread; the
CLI then waits for the watchdog's verdict (`after_failure`) instead of printing a trace.
Either way the thread prints ``specdec decode: error: <that>`` on stderr and ends the
process with exit code 1 (`os._exit`: the main thread may be blocked inside a collective,
where no exception reaches it). JAX's own heartbeat is set to twice `timeout`
(`jax_heartbeat`), so the watchdog speaks first; should it not (a survivor whose Python
thread is starved), JAX's C++ abort still ends the process within that bound.

One loss the watchdog cannot report first: process 0's. Its coordination service dies with
it, and jaxlib's error polling in every other process aborts that process from C++ at once
(SIGABRT), before any Python runs. So `specdec decode` with several processes runs the
decode in a supervised child (`supervise`): the process the user started holds JAX's dying
lines back and, when its child ends by a signal, prints the same kind of line, ``lost
process 0 (the coordinator at HOST:PORT): UNAVAILABLE: ...; stopping process 1 of 2``,
and exits with code 1 (as it does for a C++ abort above). Killing that process kills its
child (PR_SET_PDEATHSIG), so the others see it lost.

At exit the thread stops judging (`atexit`, before JAX's shutdown barrier, where a peer
that finished first waits without decoding) but keeps beating until the process ends.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

PREFIX = "specdec/alive/"
#: (timeout, period) of this process's watchdog, once started.
_running: list[tuple[float, float]] = []


def jax_heartbeat(timeout: float) -> int:
  """JAX's `heartbeat_timeout_seconds` for a watchdog `timeout`: later than the watchdog."""
  return max(2, int(2 * timeout + 0.5))


def _die(message: str) -> None:
  print(f"specdec decode: error: {message}", file=sys.stderr, flush=True)
  os._exit(1)


def start(client, process: int, processes: int, timeout: float, coordinator: str | None,
          period: float | None = None) -> threading.Event:
  """Start the watchdog of `process` (of `processes`) on `client` (jax.distributed's);
  the event that stops its judging (set at exit)."""
  period = period or min(1.0, timeout / 10)
  stopping = threading.Event()
  atexit.register(stopping.set)
  where = f" at {coordinator}" if coordinator else ""

  def watch():
    beats, seen = 0, {p: (None, time.monotonic()) for p in range(processes) if p != process}
    while True:
      beats += 1
      try:
        client.key_value_set(f"{PREFIX}{process}", str(beats), allow_overwrite=True)
        values = dict(client.key_value_dir_get(PREFIX))
      except Exception as e:  # noqa: BLE001 -- any failure of the service: process 0's
        if stopping.is_set():
          return
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        _die(f"lost process 0 (the coordinator{where}): {first}; stopping process "
             f"{process} of {processes}")
      now = time.monotonic()
      for p, (value, since) in seen.items():
        new = values.get(f"{PREFIX}{p}", values.get(str(p)))
        if new != value:
          seen[p] = (new, now)
        elif now - since > timeout and not stopping.is_set():
          _die(f"process {p} of {processes} stopped answering (no heartbeat for "
               f"{timeout:g} s: killed, crashed or hung); stopping process {process}")
      time.sleep(period)

  threading.Thread(target=watch, name="specdec-liveness", daemon=True).start()
  _running.append((timeout, period))
  return stopping


def after_failure() -> None:
  """Called with an exception on its way out of a multi-process decode: a collective whose
  peer died fails at once (Gloo: "Connection closed by peer"), before any heartbeat is
  missed. Wait until the watchdog can tell (it then ends the process with its one line);
  return (the exception goes on) if every peer still answers: then it was not a loss."""
  if not _running:
    return
  timeout, period = _running[-1]
  time.sleep(timeout + 3 * period)
