"""The T5X side-by-side benchmark's checks (the timing itself needs a T5X checkout and
runs in scripts/compare_t5x.py)."""

import pathlib
import subprocess
import sys

import pytest

from specdec_jax.tools import t5x_bench

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "compare_t5x.py"


def test_missing_t5x_checkout_is_a_clear_error(tmp_path):
  (tmp_path / "t5x").mkdir()
  (tmp_path / "t5x" / "decoding.py").write_text("")
  with pytest.raises(t5x_bench.T5XSourceError, match="binary_search.py.*network.py"):
    t5x_bench.load_t5x(tmp_path)


def test_compare_script_reports_a_missing_checkout(tmp_path):
  proc = subprocess.run([sys.executable, str(SCRIPT), "--t5x-src",
                         str(tmp_path / "nowhere"), "--model", "config:t5_1_1_tiny",
                         "--out", str(tmp_path / "out")], capture_output=True, text=True)
  assert proc.returncode == 2
  assert "not a T5X source checkout" in proc.stderr and "Traceback" not in proc.stderr


def test_compare_script_reports_a_missing_model(tmp_path):
  src = tmp_path / "t5x_src"
  for rel in t5x_bench.T5X_FILES:   # present but empty: the model is what is missing
    (src / rel).parent.mkdir(parents=True, exist_ok=True)
    (src / rel).write_text("")
  proc = subprocess.run([sys.executable, str(SCRIPT), "--t5x-src", str(src), "--model",
                         str(tmp_path / "no_such_checkpoint"), "--out", str(tmp_path / "out")],
                        capture_output=True, text=True)
  assert proc.returncode == 2, proc.stderr
  assert "no_such_checkpoint" in proc.stderr and "Traceback" not in proc.stderr
