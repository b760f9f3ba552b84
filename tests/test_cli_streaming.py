"""Long files (issue 38): `specdec decode` prints each row as its batch finishes, shows a
file's progress on stderr, and an interrupt or SIGTERM ends with one line saying how many
rows were kept and how to go on."""

import os
import signal
import subprocess
import threading

import numpy as np
import pytest
from helpers import REPO_DIR, WITH_DEFAULT_SIGINT

from specdec_jax import cli

TARGET = "config:t5_1_1_tiny"


def _prompts(path, n: int, seed: int = 0) -> list[str]:
  rng = np.random.default_rng(seed)
  lines = [" ".join(map(str, [*rng.integers(3, 500, size=int(rng.integers(2, 6))), 1]))
           for _ in range(n)]
  path.write_text("\n".join(lines) + "\n")
  return lines


DECODE = ["decode", "--model", TARGET, "--max-new-tokens", "24", "--batch-size", "1"]

#: `specdec ARGV...` run as `python -c PAUSED N ARGV...`: once N rows are done (N = 0: once
#: the run first prints its progress) `Progress.update` says "paused at R rows" on stderr
#: and waits for good. A signal the test sends on that line lands where the test knows:
#: between two batches, R rows written and counted.
PAUSED = """\
import sys, time
from specdec_jax import cli
from specdec_jax.runtime import progress
update, after = progress.Progress.update, int(sys.argv[1])
def update_then_pause(self, rows, tokens):
  last = self.last
  update(self, rows, tokens)
  if (self.rows >= after) if after else (self.last != last):
    print(f"paused at {self.rows} rows", file=sys.stderr, flush=True)
    while True:
      time.sleep(1)
progress.Progress.update = update_then_pause
sys.argv = [sys.argv[0], *sys.argv[2:]]
sys.exit(cli.main())
"""


def _command(*args) -> list[str]:
  return [*WITH_DEFAULT_SIGINT, "-m", "specdec_jax.cli", *DECODE, *args]


def _paused(after: int, *args) -> list[str]:
  return [*WITH_DEFAULT_SIGINT, "-c", PAUSED, str(after), *DECODE, *args]


def _env(tmp_path) -> dict:
  """The child's environment: its own cache directory, and XLA's dot (an interrupt is the
  same on any backend; the CPU kernels would be built again, ~10 s, in that directory)."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(PYTHONPATH=str(REPO_DIR), JAX_PLATFORMS="cpu",
             SPECDEC_CACHE_DIR=str(tmp_path / "cache"), SPECDEC_CPU_KERNELS="0")
  return env


def _stop_after(cmd, env, cwd, lines: int, sig) -> tuple[list[str], str, int]:
  """Run `cmd`, read `lines` stdout lines as they come, send `sig`; (all stdout lines,
  stderr, exit code)."""
  proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  seen = [proc.stdout.readline() for _ in range(lines)]
  proc.send_signal(sig)
  rest, err = _rest(proc)
  return [s.rstrip("\n") for s in seen] + rest.splitlines(), err, proc.returncode


def _stop_paused(cmd, env, cwd, sig) -> tuple[int, list[str], str, str, int]:
  """Run a `_paused` command, send `sig` once it says it paused; (the rows done then, the
  stderr lines before that, stdout, all of stderr, the exit code)."""
  proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  before = []
  while not (line := proc.stderr.readline()).startswith("paused at "):
    assert line, "the run ended before it paused"
    before.append(line)
  proc.send_signal(sig)
  out, err = _rest(proc)
  return int(line.split()[2]), before, out, "".join(before) + line + err, proc.returncode


def _rest(proc, timeout: float = 120) -> tuple[str, str]:
  """What is left of proc's stdout and stderr, to their ends. Not `communicate()`: it
  reads the pipes' file descriptors, past the lines a `readline()` has already buffered
  (on a loaded machine several rows arrive in one read, and those were lost)."""
  got: dict[str, str] = {}
  readers = [threading.Thread(target=lambda n=n, f=f: got.update({n: f.read()}), daemon=True)
             for n, f in (("out", proc.stdout), ("err", proc.stderr))]
  for reader in readers:
    reader.start()
  try:
    proc.wait(timeout)
  finally:
    proc.kill()
  for reader in readers:
    reader.join(timeout)
  return got["out"], got["err"]


@pytest.mark.slow      # a process; the fast tier keeps tests/unit/test_progress.py's
def test_an_interrupted_stdout_run_has_printed_its_finished_rows(tmp_path, capsys,
                                                               monkeypatch):
  """Ctrl-C between two batches (the run paused after 3 rows): the 3 rows are printed and
  are a clean run's, and the last line says so."""
  prompts = _prompts(tmp_path / "in.txt", 3000)
  env = _env(tmp_path)
  monkeypatch.setenv("SPECDEC_CPU_KERNELS", "0")      # the clean run below: the child's dot
  kept, _, out, err, code = _stop_paused(_paused(3, "--input-file", "in.txt"), env, tmp_path,
                                         signal.SIGINT)
  assert (kept, code) == (3, 130), err[-2000:]
  last = err.strip().splitlines()[-1]
  assert last == ("specdec decode: interrupted: 3 of 3000 rows kept (written above); "
                  "--output FILE writes rows as they finish and --resume continues where a "
                  "run stopped"), err[-2000:]
  # the printed rows are the outputs of those prompts (a clean run of the first ones, here)
  (tmp_path / "head.txt").write_text("\n".join(prompts[:3]) + "\n")
  assert cli.main([*DECODE, "--input-file", str(tmp_path / "head.txt")]) == 0
  assert capsys.readouterr().out.splitlines() == out.splitlines()


@pytest.mark.slow
def test_sigterm_ends_an_output_file_run_with_what_it_kept(tmp_path):
  """--output: progress lines on stderr (rows done / total, tokens/s); SIGTERM between two
  batches (the run paused once it printed its first progress line) says how many rows the
  file keeps, which are the rows done, and that --resume continues."""
  _prompts(tmp_path / "in.txt", 3000, seed=1)
  cmd = _paused(0, "--input-file", "in.txt", "--output", "out.txt")
  kept, before, _, err, code = _stop_paused(cmd, _env(tmp_path), tmp_path, signal.SIGTERM)
  assert code == 143, err[-2000:]
  line = before[-1]                          # the first progress line
  assert line.startswith(f"specdec decode: {kept}/3000 rows, ") and "tokens/s" in line, err
  last = err.strip().splitlines()[-1]
  assert last == (f"specdec decode: terminated: {kept} of 3000 rows kept in 'out.txt'; the "
                  "same command with --resume continues from there"), err[-2000:]
  assert len((tmp_path / "out.txt").read_text().splitlines()) == kept


@pytest.mark.slow
@pytest.mark.soak      # where the signal lands is the machine's choice: CI's soak step
def test_sigterm_anywhere_in_a_stdout_run_says_what_was_kept(tmp_path):
  """SIGTERM as soon as 2 rows are printed, wherever the run is then (in a compile, a
  decode, a jax callback, writing a row): the rows printed are the rows it says it kept.
  The tests above send theirs at a point they chose; this one finds the others."""
  _prompts(tmp_path / "in.txt", 3000, seed=2)
  out, err, code = _stop_after(_command("--input-file", "in.txt"), _env(tmp_path), tmp_path,
                               2, signal.SIGTERM)
  assert code == 143, err[-2000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("specdec decode: terminated: ") and f"{len(out)} of 3000" in last


@pytest.mark.slow
def test_a_person_at_a_terminal_sees_a_first_line_at_once(capsys, monkeypatch):
  """With stderr a terminal, the first line (what is loading) comes before the model loads;
  a pipe gets only the results and the errors (one line each)."""
  import sys as system

  from specdec_jax.cli import main
  from specdec_jax.runtime import decode_setup
  seen = []
  real = decode_setup.load_target

  def spy(*args, **kwargs):
    seen.append(capsys.readouterr().err)
    return real(*args, **kwargs)
  monkeypatch.setattr(decode_setup, "load_target", spy)
  monkeypatch.setattr(system.stderr, "isatty", lambda: True, raising=False)
  assert main(["decode", "--model", TARGET, "--max-new-tokens", "2", "5 6 1"]) == 0
  assert seen and seen[0].startswith(f"specdec: loading {TARGET}")
