"""`specdec decode --output OUT`: outputs written batch by batch, resumable after a kill.

    specdec decode --model DIR --input-file prompts.txt --batch-size 16 --output out.txt
    # killed (SIGKILL, a preempted VM) half way: the same command with --resume continues
    specdec decode --model DIR --input-file prompts.txt --batch-size 16 --output out.txt --resume

OUT holds one line per input line, in input order: line i answers input line i (the
output text, or its token ids separated by spaces). A line break inside an output
(an LM's continuation may hold one) is written as the two characters ``\\n`` (``\\r``
likewise) and a backslash as ``\\\\``, so every output is exactly one line. Each finished
batch is appended, flushed and fsync'd before the next is decoded, so a kill loses at
most the batch in flight.

Beside OUT, ``OUT.specdec.json`` (the sidecar) records what OUT answers: a digest of the
input lines, the decode settings (method, model and drafter names, sampling, seed,
max_new_tokens, batch size, dtype, mesh) and a digest of the weights (shapes and the
first values of every array, so another checkpoint at the same path is caught), and
whether OUT is complete. Until "complete" is true, OUT is a partial file: its lines are
final, but lines are missing and its last line may be cut.

Without --resume, OUT (and its sidecar) is replaced. With --resume, OUT's complete lines
are kept, a cut last line is dropped, and decoding restarts at the batch holding the
first missing row: batch g is decoded with the same key (`batch_key(rng, g)`) and the
same rows as in an uninterrupted run, so the file ends up the same line for line, with
no row lost or written twice. A sidecar whose settings or input differ is refused (the
error names what differs); so is an OUT with lines but no sidecar.

With several processes each decodes every P-th batch of the file (batch g on process
g mod P, keyed by g: the same keys as one process with that batch size); after each
round of P batches, process 0 gathers them and writes them in order. Process 0 alone
reads and writes OUT (it lives on process 0's host) and tells the others where to resume.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from specdec_jax.errors import FileAccessError, SpecdecError
from specdec_jax.flags import FlagError
from specdec_jax.io.reports import atomic_write, read_json
from specdec_jax.runtime.progress import deferred_signals

FORMAT = 1
SIDECAR_SUFFIX = ".specdec.json"
#: Values of each weight array hashed into the fingerprint (with its shape and dtype).
DIGEST_VALUES = 256


def sidecar_path(out: str) -> str:
  return out + SIDECAR_SUFFIX


def output_line(output: str | Sequence[int]) -> str:
  """One output as one line (no line break): ids joined by spaces, or the text with
  backslashes doubled and line breaks escaped.

  >>> output_line("a\\\\b\\nc"), output_line([5, 1])
  ('a\\\\\\\\b\\\\nc', '5 1')
  """
  if not isinstance(output, str):
    return " ".join(str(int(t)) for t in output)
  return output.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def check_output_path(out: str, input_file: str | None, resume: bool) -> None:
  """The cheap checks, before any model is loaded: OUT's directory exists and is writable,
  OUT is not a directory, not the input file, and (with --resume) has a sidecar if it has
  lines."""
  directory = os.path.dirname(os.path.abspath(out))
  if os.path.isdir(out):
    raise FileAccessError(f"--output {out!r} is a directory: name a file")
  if not os.path.isdir(directory):
    raise FileAccessError(f"--output {out!r}: directory {directory!r} does not exist")
  if not os.access(directory, os.W_OK | os.X_OK):
    raise FileAccessError(f"--output {out!r}: directory {directory!r} is not writable")
  if os.path.exists(out):
    if not os.access(out, os.W_OK):
      raise FileAccessError(f"--output {out!r} is not writable")
    if input_file not in (None, "-") and os.path.exists(input_file) and os.path.samefile(
        out, input_file):
      raise FileAccessError(f"--output {out!r} is the input file: it would be overwritten")
  if resume and _has_lines(out) and not os.path.exists(sidecar_path(out)):
    raise FlagError(f"--resume: {out!r} has lines but no {sidecar_path(out)!r}: it was not "
                   "written by specdec decode --output (drop --resume to replace it)")


def _has_lines(out: str) -> bool:
  return os.path.exists(out) and os.path.getsize(out) > 0


def weights_digest(*trees: Any) -> str:
  """sha256 of every array leaf's shape, dtype and first `DIGEST_VALUES` values (of this
  process's first shard where an array spans processes): cheap, and tells checkpoints apart."""
  h = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(trees):
    if not hasattr(leaf, "shape"):
      continue
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      leaf = leaf.addressable_shards[0].data
    values = np.asarray(leaf).ravel()[:DIGEST_VALUES]
    h.update(f"{tuple(leaf.shape)}:{leaf.dtype};".encode())
    h.update(values.tobytes())
  return h.hexdigest()


def fingerprint(inputs: Sequence[str], settings: dict[str, Any], weights: str) -> dict[str, Any]:
  """What OUT answers: the input lines (digest and count), the settings (JSON values, as
  `Run.settings` gives them), the weights."""
  text = "\n".join(inputs).encode("utf-8", "surrogatepass")
  settings = json.loads(json.dumps(settings, sort_keys=True))   # as the sidecar reads back
  return {"format": FORMAT, "input_sha256": hashlib.sha256(text).hexdigest(),
          "input_rows": len(inputs), "settings": settings, "weights_sha256": weights}


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
  out = []
  for key in sorted(set(old) | set(new)):
    if key == "settings" and isinstance(old.get(key), dict):
      out += [f"{k} {old[key].get(k)!r} -> {new[key].get(k)!r}"
              for k in sorted(set(old[key]) | set(new[key]))
              if old[key].get(k) != new[key].get(k)]
    elif old.get(key) != new.get(key):
      out.append({"input_sha256": "the input lines", "input_rows": "the number of input lines",
                  "weights_sha256": "the weights"}.get(key, key))
  return out


@dataclasses.dataclass
class OutputFile:
  """OUT opened for appending: `rows` lines already final in it."""

  path: str
  meta: dict[str, Any]
  rows: int

  def append(self, lines: Sequence[str]) -> None:
    """Append `lines` (one output line each), flushed and fsync'd: on disk when this returns.
    The lines are written and counted together (an interrupt waits), so `rows` is what
    the file holds when a run is stopped."""
    if not lines:
      return
    with deferred_signals():
      try:
        with open(self.path, "a", encoding="utf-8", newline="\n") as f:
          f.write("".join(line + "\n" for line in lines))
          f.flush()
          os.fsync(f.fileno())
      except OSError as e:
        raise FileAccessError(f"cannot write --output {self.path!r}: {e.strerror or e}") from None
      self.rows += len(lines)

  line = staticmethod(output_line)

  def kept(self, total: int) -> str:
    """What an interrupt kept: the `rows` of `total` in OUT, and how to go on."""
    return (f"{self.rows} of {total} rows kept in {self.path!r}; the same "
            "command with --resume continues from there")

  def finish(self) -> None:
    """Mark OUT complete in its sidecar."""
    _write_sidecar(self.path, self.meta, complete=True)


def _truncate(path: str, size: int) -> None:
  with open(path, "r+b") as f:
    f.truncate(size)
    f.flush()
    os.fsync(f.fileno())


def open_output(out: str, meta: dict[str, Any], resume: bool) -> OutputFile:
  """OUT ready to append to, and how many of its rows are final. Without `resume` (or with
  nothing to resume) OUT starts empty; with it, a sidecar whose fingerprint differs from
  `meta` is refused and a cut last line is dropped."""
  sidecar = sidecar_path(out)
  rows = 0
  try:
    if resume and (_has_lines(out) or os.path.exists(sidecar)):
      old = read_json(sidecar, "--resume: sidecar") if os.path.exists(sidecar) else None
      if old is None:
        raise FlagError(f"--resume: {out!r} has lines but no {sidecar!r}: it was not written "
                       "by specdec decode --output (drop --resume to replace it)")
      old = {k: v for k, v in old.items() if k != "complete"} if isinstance(old, dict) else {}
      diff = _differences(old, meta)
      if diff:
        raise FlagError(f"--resume: {out!r} was written with other settings or input "
                       f"({'; '.join(diff)}): drop --resume to replace it, or give its settings")
      data = b""
      if os.path.exists(out):
        with open(out, "rb") as f:
          data = f.read()
      end = data.rfind(b"\n") + 1          # a cut last line (no newline yet) is dropped
      rows = data.count(b"\n", 0, end)
      if rows > meta["input_rows"]:
        raise FlagError(f"--resume: {out!r} has {rows} lines but the input has "
                       f"{meta['input_rows']}: not this input's output")
      if end < len(data):
        _truncate(out, end)
      if rows < meta["input_rows"]:      # e.g. a complete OUT cut short since: partial again
        _write_sidecar(out, meta, complete=False)
      return OutputFile(out, meta, rows)
    # A fresh OUT: the old sidecar goes first, so no moment pairs it with the new lines.
    if os.path.exists(sidecar):
      os.remove(sidecar)
    with open(out, "wb") as f:
      os.fsync(f.fileno())
  except OSError as e:
    raise FileAccessError(f"cannot open --output {out!r}: {e.strerror or e}") from None
  _write_sidecar(out, meta, complete=False)
  return OutputFile(out, meta, rows)


def _write_sidecar(out: str, meta: dict[str, Any], complete: bool) -> None:
  atomic_write(sidecar_path(out), json.dumps({**meta, "complete": complete}, indent=1) + "\n")


def open_shared(out: str, lines: Sequence[str], settings: dict[str, Any], weights: tuple,
                resume: bool) -> tuple[OutputFile | None, int]:
  """(OUT opened or resumed by process 0, None on the others; the row decoding starts at,
  on every process). The sidecar fingerprints the input `lines`, the `settings` and the
  `weights` (trees of arrays); process 0's error stops every process."""
  output, error = None, None
  if jax.process_index() == 0:
    meta = fingerprint(lines, settings, weights_digest(*weights))
    try:
      output = open_output(out, meta, resume)
    except SpecdecError as e:
      error = e
  start = -1 if output is None else output.rows
  if jax.process_count() > 1:    # process 0's count, on every process (-1: it failed)
    from jax.experimental import multihost_utils
    start = int(multihost_utils.broadcast_one_to_all(np.int64(start)))
    if start < 0 and error is None:   # the others stop too, not waiting in a collective
      raise FlagError("process 0 could not open --output (see its error): stopping")
  if error is not None:
    raise error
  return output, start
