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

TARGET = "config:t5_1_1_tiny"


def _prompts(path, n: int, seed: int = 0) -> list[str]:
  rng = np.random.default_rng(seed)
  lines = [" ".join(map(str, [*rng.integers(3, 500, size=int(rng.integers(2, 6))), 1]))
           for _ in range(n)]
  path.write_text("\n".join(lines) + "\n")
  return lines


def _command(*args) -> list[str]:
  return [*WITH_DEFAULT_SIGINT, "-m", "specdec_jax.cli", "decode", "--model", TARGET,
          "--max-new-tokens", "24", "--batch-size", "1", *args]


def _env(tmp_path) -> dict:
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(PYTHONPATH=str(REPO_DIR), JAX_PLATFORMS="cpu",
             SPECDEC_CACHE_DIR=str(tmp_path / "cache"))
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


@pytest.mark.slow      # 15 s; the fast tier keeps tests/unit/test_progress.py's
def test_an_interrupted_stdout_run_has_printed_its_finished_rows(tmp_path):
  prompts = _prompts(tmp_path / "in.txt", 3000)
  env = _env(tmp_path)
  out, err, code = _stop_after(_command("--input-file", "in.txt"), env, tmp_path, 3,
                               signal.SIGINT)
  assert code == 130, err[-2000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("specdec decode: interrupted: ") and "Traceback" not in err, err
  kept = int(last.split("interrupted: ")[1].split(" of ")[0])
  assert 3 <= kept < len(prompts) and len(out) == kept, (kept, len(out))
  assert "3000 rows kept (written above)" in last and "--resume" in last
  # the printed rows are the outputs of those prompts (a clean run of the first ones)
  (tmp_path / "head.txt").write_text("\n".join(prompts[:kept]) + "\n")
  full = subprocess.run(_command("--input-file", "head.txt"), env=env, cwd=tmp_path,
                        capture_output=True, text=True, timeout=300)
  assert full.returncode == 0, full.stderr[-2000:]
  assert full.stdout.splitlines() == out


@pytest.mark.slow
def test_sigterm_ends_an_output_file_run_with_what_it_kept(tmp_path):
  """--output: progress lines on stderr (rows done / total, tokens/s); SIGTERM says how many
  rows the file keeps and that --resume continues; --resume then completes it."""
  _prompts(tmp_path / "in.txt", 3000, seed=1)
  env = _env(tmp_path)
  cmd = _command("--input-file", "in.txt", "--output", "out.txt")
  proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  line = ""
  while "rows," not in line:                 # the first progress line
    line = proc.stderr.readline()
    assert line, "no progress line"
  assert line.startswith("specdec decode: ") and "/3000 rows" in line and "tokens/s" in line
  proc.send_signal(signal.SIGTERM)
  _, err = _rest(proc)
  assert proc.returncode == 143, err[-2000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("specdec decode: terminated: ") and "Traceback" not in err
  kept = int(last.split("terminated: ")[1].split(" of ")[0])
  assert "in 'out.txt'" in last and "--resume" in last
  assert len((tmp_path / "out.txt").read_text().splitlines()) == kept < 3000


@pytest.mark.slow
def test_sigterm_without_a_progress_file_still_says_what_was_kept(tmp_path):
  _prompts(tmp_path / "in.txt", 3000, seed=2)
  out, err, code = _stop_after(_command("--input-file", "in.txt"), _env(tmp_path), tmp_path,
                               2, signal.SIGTERM)
  assert code == 143, err[-2000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("specdec decode: terminated: ") and f"{len(out)} of 3000" in last


def test_a_person_at_a_terminal_sees_a_first_line_at_once(capsys, monkeypatch):
  """With stderr a terminal, the first line (what is loading) comes before the model loads;
  a pipe gets only the results and the errors (one line each)."""
  import sys as system

  from specdec_jax.cli import decode, main
  seen = []
  real = decode.load_target

  def spy(*args, **kwargs):
    seen.append(capsys.readouterr().err)
    return real(*args, **kwargs)
  monkeypatch.setattr(decode, "load_target", spy)
  monkeypatch.setattr(system.stderr, "isatty", lambda: True, raising=False)
  assert main(["decode", "--model", TARGET, "--max-new-tokens", "2", "5 6 1"]) == 0
  assert seen and seen[0].startswith(f"specdec: loading {TARGET}")
