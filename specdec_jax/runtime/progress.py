"""Long runs: a progress line on stderr, and interrupts that say what was kept.

    progress = Progress(total=160, label="specdec decode")
    progress.update(rows=8, tokens=91)      # stderr, at most once a second (and the last):
                                            # "specdec decode: 8/160 rows, 91 tokens, 45 tokens/s"
    with interrupts_kept(lambda: progress.kept("written above")):   # Ctrl-C: Interrupted
      ...

`specdec`'s main turns SIGTERM into `Terminated` (`on_sigterm`), so a terminated run ends
as an interrupted one does: with one line saying how many rows were kept and how to go
on, exit code 143 (130 for Ctrl-C).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, TextIO


class Terminated(KeyboardInterrupt):
  """SIGTERM, raised in the main thread (`on_sigterm`)."""


_TERMINATED: list[int] = []    # SIGTERMs `on_sigterm`'s handler raised, even where swallowed


class Interrupted(KeyboardInterrupt):
  """An interrupt (Ctrl-C or SIGTERM) that says what was kept and how to go on."""

  def __init__(self, detail: str, terminated: bool = False):
    super().__init__(detail)
    self.detail, self.terminated = detail, terminated


@contextlib.contextmanager
def interrupts_kept(kept: Callable[[], str | None]) -> Iterator[None]:
  """An interrupt (Ctrl-C, or SIGTERM as `Terminated`) in the block raised as `Interrupted`
  saying `kept()`: what was kept and how to go on, read when it comes; `kept()` None
  (nothing kept to speak of) lets the interrupt through as it is."""
  before = len(_TERMINATED)
  try:
    yield
  except KeyboardInterrupt as e:
    detail = kept()
    if detail is None:
      raise
    raise Interrupted(detail, terminated=isinstance(e, Terminated)) from None
  except Exception as e:
    # SIGTERM's handler may run inside a Python callback of jax's C++ code (a jit cache
    # comparing static arguments), which turns `Terminated` into its own ValueError.
    if len(_TERMINATED) == before:
      raise
    detail = kept()
    if detail is None:
      raise Terminated() from e
    raise Interrupted(detail, terminated=True) from None


def unblock_interrupts() -> None:
  """SIGINT and SIGTERM unblocked in the main thread, at a process's start: a mask
  inherited from the parent would hold them pending for ever (Ctrl-C would do nothing),
  and the threads XLA starts later inherit this thread's mask."""
  if threading.current_thread() is threading.main_thread() and hasattr(
      signal, "pthread_sigmask"):
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def on_sigterm() -> None:
  """SIGTERM raises `Terminated` in the main thread (a no-op elsewhere)."""
  if threading.current_thread() is not threading.main_thread():
    return

  def terminate(signum, frame):
    _TERMINATED.append(signum)
    raise Terminated()
  signal.signal(signal.SIGTERM, terminate)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
  """SIGINT and SIGTERM held back while the block runs (then delivered): writing a batch's
  rows and counting them happen together, so "N rows kept" is what was written.

  Python-level handlers, not a signal mask: a process-directed signal may land on any of
  XLA's threads (their masks are their own), but Python runs its handlers in the main
  thread, so recording it there holds it back whichever thread took it.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  caught: list[int] = []

  def hold(signum, frame):
    caught.append(signum)
  held = (signal.SIGINT, signal.SIGTERM)
  old: dict[int, Any] = {s: signal.signal(s, hold) for s in held}
  try:
    yield
  finally:
    for s, handler in old.items():
      signal.signal(s, handler)
    if caught:
      _deliver(caught[0], old[caught[0]])


def _deliver(signum: int, handler) -> None:
  """What `handler` would have done with `signum` (a Python handler runs here)."""
  if callable(handler):
    handler(signum, None)
  elif handler == signal.SIG_DFL:
    signal.raise_signal(signum)


class Progress:
  """Rows done of `total`, tokens and tokens/s, printed on `stream` at most every
  `every` seconds (and always for the last rows)."""

  def __init__(self, total: int, label: str, *, every: float = 1.0,
               stream: TextIO | None = None, done: int = 0):
    self.total, self.label, self.every = total, label, every
    self.stream = stream if stream is not None else sys.stderr
    self.rows, self.tokens = done, 0
    self.start = self.last = time.perf_counter()

  def update(self, rows: int, tokens: int) -> None:
    self.rows += rows
    self.tokens += tokens
    now = time.perf_counter()
    if now - self.last >= self.every or self.rows >= self.total:
      self.last = now
      rate = self.tokens / max(now - self.start, 1e-9)
      print(f"{self.label}: {self.rows}/{self.total} rows, {self.tokens} tokens, "
            f"{rate:.0f} tokens/s", file=self.stream, flush=True)

  def kept(self, where: str) -> str:
    """"32 of 160 rows kept (<where>)"."""
    return f"{self.rows} of {self.total} rows kept ({where})"
