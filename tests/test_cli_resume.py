"""`specdec decode --output OUT --resume`: a run killed (SIGKILL) mid-file and resumed, by one
process or by two on loopback, leaves OUT equal to an uninterrupted run's, line for line;
OUT of other settings is refused. (How a process that loses its peer stops: the soak
tests of tests/test_cli_failures.py.)

The killed child patches `OutputFile.append` to SIGKILL its own process part-way through
writing a batch (one whole line and half of the next on disk): a kill at the worst moment,
at a known row, without racing a timer. Sampling (not greedy) makes every row depend on its
batch's key, so a resume that re-keyed or re-batched the rows would differ."""

import contextlib
import io
import json
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest
from loopback import device_env, run_processes

from specdec_jax import cli
from specdec_jax.runtime import output_file

MODEL = "config:t5_1_1_tiny"
# equal lengths: one compiled shape. 7 rows in batches of 2: 4 batches, the last one short
PROMPTS = [f"{5 + i} {17 + 2 * i} {40 + i} 9 1" for i in range(7)]
FLAGS = ["--model", MODEL, "--sampling", "sample", "--temperature", "1.0", "--seed", "3",
         "--max-new-tokens", "5", "--batch-size", "2"]

# The child: decode, but die by SIGKILL while writing batch `KILL_AT` (0-based), after
# one whole line and half of the next reached the disk.
CHILD = """
import os, signal, sys
from specdec_jax import cli
from specdec_jax.runtime import output_file
kill_at, calls, append = int(sys.argv[1]), [], output_file.OutputFile.append
def dying_append(self, lines):
  if len(calls) == kill_at:
    with open(self.path, "a") as f:
      f.write(lines[0] + "\\n" + lines[1][:len(lines[1]) // 2])
      f.flush(); os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)
  calls.append(1)
  append(self, lines)
output_file.OutputFile.append = dying_append
sys.exit(cli.main(sys.argv[2:]))
"""

# `specdec ARGV...` without the supervisor: descriptor 1 on stderr once the results are out,
# as the entry point leaves it (jax.distributed's shutdown at exit writes there).
MAIN = """
import os, sys
from specdec_jax import cli
code = cli.main(sys.argv[1:])
sys.stdout.flush()
os.dup2(2, 1)
sys.exit(code)
"""


def _main(argv) -> tuple[int, str, str]:
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(argv)
  return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("resume")
  prompts = tmp / "prompts.txt"
  prompts.write_text("\n".join(PROMPTS) + "\n")
  return tmp, prompts


@pytest.fixture(scope="module")
def uninterrupted(files):
  tmp, prompts = files
  full = tmp / "full.txt"
  code, printed, err = _main(["decode", *FLAGS, "--input-file", str(prompts),
                              "--output", str(full)])
  assert code == 0, err
  assert printed == ""                         # the outputs went to the file
  return full.read_text()


@pytest.mark.slow
def test_uninterrupted_output_matches_stdout_and_is_marked_complete(files, uninterrupted):
  tmp, prompts = files
  code, printed, err = _main(["decode", *FLAGS, "--input-file", str(prompts)])
  assert code == 0, err
  assert uninterrupted == printed             # same lines as printing them
  assert len(uninterrupted.splitlines()) == len(PROMPTS)
  meta = json.loads((tmp / "full.txt.specdec.json").read_text())
  assert meta["complete"] is True and meta["input_rows"] == len(PROMPTS)
  assert meta["settings"]["batch_size"] == 2 and meta["settings"]["seed"] == 3


@pytest.mark.slow      # a process killed, then two processes on loopback
def test_killed_mid_batch_then_resumed_equals_uninterrupted(files, uninterrupted):
  """The file a killed run left, resumed by one process and (a copy) by two: both equal
  the uninterrupted run's. With two, batch g is process g mod 2's, keyed by g, and process
  0 alone reads the file and tells process 1 where to start."""
  tmp, prompts = files
  out = tmp / "killed.txt"
  argv = ["decode", *FLAGS, "--input-file", str(prompts), "--output", str(out)]
  child = subprocess.run([sys.executable, "-c", CHILD, "2", *argv], env=device_env(1),
                         capture_output=True, text=True, timeout=600, check=False)
  assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
  # batches 0 and 1 (rows 0-3) written, then row 4 and half of row 5: a cut last line
  data = out.read_text()
  lines = data.split("\n")
  assert lines[:5] == uninterrupted.splitlines()[:5] and lines[5] != ""
  assert json.loads((tmp / "killed.txt.specdec.json").read_text())["complete"] is False
  two = tmp / "two.txt"
  for src, dst in ((out, two), (tmp / "killed.txt.specdec.json", tmp / "two.txt.specdec.json")):
    shutil.copyfile(src, dst)
  code, printed, err = _main([*argv, "--resume", "--json"])
  assert code == 0, err
  assert out.read_text() == uninterrupted     # nothing lost, nothing twice, cut line gone
  payload = json.loads(printed)
  assert payload["resumed_at_row"] == 5 and payload["outputs"] is None
  # batch 2 (rows 4, 5) again and batch 3 (row 6): 3 rows decoded by the resumed run
  assert payload["stats"]["rows"] == 3
  # a complete file: nothing left to decode
  code, _, err = _main([*argv, "--resume"])
  assert code == 0 and "already holds all 7 outputs" in err
  assert out.read_text() == uninterrupted
  # two processes: the round of batches 2 and 3, one each; only process 0 prints. Each
  # runs cli.main itself, not under `specdec`'s supervisor (tests/test_cli_failures.py's).
  outs = run_processes(lambda i, port: [
      sys.executable, "-c", MAIN, "decode", *FLAGS, "--input-file", str(prompts), "--output",
      str(two), "--resume", "--json", "--coordinator", f"127.0.0.1:{port}",
      "--num-processes", "2", "--process-id", str(i)], processes=2, devices=1)
  assert two.read_text() == uninterrupted and outs[1] == ""
  payload = json.loads(outs[0])
  assert payload["resumed_at_row"] == 5 and payload["stats"]["rows"] == 3
  assert payload["timing"]["processes"] == 2


@pytest.mark.slow
def test_resume_refuses_another_runs_file(files, uninterrupted):
  tmp, prompts = files
  out = tmp / "other.txt"
  out.write_text("\n".join(uninterrupted.splitlines()[:3]) + "\n")
  (tmp / "other.txt.specdec.json").write_text((tmp / "full.txt.specdec.json").read_text())
  base = ["decode", *FLAGS, "--input-file", str(prompts), "--output", str(out), "--resume"]
  code, _, err = _main([*base, "--max-new-tokens", "6"])
  assert code != 0 and "other settings or input (max_new_tokens 5 -> 6)" in err
  code, _, err = _main([*base, "--seed", "4"])
  assert code != 0 and "seed 3 -> 4" in err
  shorter = tmp / "shorter.txt"
  shorter.write_text("\n".join(PROMPTS[:-1]) + "\n")
  code, _, err = _main(["decode", *FLAGS, "--input-file", str(shorter), "--output", str(out),
                        "--resume"])
  assert code != 0 and "the input lines" in err and "the number of input lines" in err
  assert out.read_text().splitlines() == uninterrupted.splitlines()[:3]    # untouched
  # another checkpoint under the same name: the weights' digest differs
  meta = json.loads((tmp / "other.txt.specdec.json").read_text())
  meta["weights_sha256"] = "0" * 64
  (tmp / "other.txt.specdec.json").write_text(json.dumps(meta))
  code, _, err = _main(base)
  assert code != 0 and "(the weights)" in err


def test_output_paths_are_checked_before_any_model_loads(tmp_path, monkeypatch):
  def no_load(*a, **k):
    raise AssertionError("the model was loaded before the output path was checked")
  monkeypatch.setattr("specdec_jax.runtime.decode_setup.load_target", no_load)
  prompts = tmp_path / "p.txt"
  prompts.write_text("5 1\n")
  base = ["decode", "--model", MODEL, "--input-file", str(prompts)]
  code, _, err = _main([*base, "--output", str(tmp_path)])
  assert code != 0 and "is a directory" in err
  code, _, err = _main([*base, "--output", str(tmp_path / "nowhere" / "out.txt")])
  assert code != 0 and "does not exist" in err
  code, _, err = _main([*base, "--output", str(prompts)])
  assert code != 0 and "is the input file" in err
  code, _, err = _main([*base, "--resume"])
  assert code != 0 and "--resume continues an --output file" in err
  foreign = tmp_path / "foreign.txt"
  foreign.write_text("some lines\nnot ours\n")
  code, _, err = _main([*base, "--output", str(foreign), "--resume"])
  assert code != 0 and "was not written by specdec decode --output" in err
  assert foreign.read_text() == "some lines\nnot ours\n"


def test_open_output_keeps_whole_lines_and_marks_partial_files(tmp_path):
  out = str(tmp_path / "out.txt")
  meta = output_file.fingerprint(["a", "b", "c"], {"seed": 0}, "w")
  fresh = output_file.open_output(out, meta, resume=False)
  fresh.append(["x", "y"])
  assert fresh.rows == 2 and pathlib.Path(out).read_text() == "x\ny\n"
  with open(out, "a") as f:
    f.write("z-cut")                       # killed inside the write of row 2
  resumed = output_file.open_output(out, meta, resume=True)
  assert resumed.rows == 2 and pathlib.Path(out).read_text() == "x\ny\n"
  resumed.append(["z"])
  resumed.finish()
  assert json.loads(pathlib.Path(out + ".specdec.json").read_text())["complete"] is True
  with open(out, "w") as f:                # a complete file cut short since: partial again
    f.write("x\n")
  assert output_file.open_output(out, meta, resume=True).rows == 1
  assert json.loads(pathlib.Path(out + ".specdec.json").read_text())["complete"] is False
  assert output_file.open_output(out, meta, resume=False).rows == 0    # replaced
  assert pathlib.Path(out).read_text() == ""
  with pytest.raises(output_file.FlagError, match=r"\(seed 0 -> 1\)"):
    output_file.open_output(out, output_file.fingerprint(["a", "b", "c"], {"seed": 1}, "w"),
                            resume=True)


def test_output_line_keeps_one_line_per_output():
  assert output_file.output_line("a\nb\\n\r") == "a\\nb\\\\n\\r"
  assert "\n" not in output_file.output_line("x\n" * 3)
  assert output_file.output_line([7, 0, 1]) == "7 0 1"


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q"]))
