"""scripts/gpu_check.py, the prepared device check, run end to end on tiny shapes on CPU
(the gpu kernels in interpret mode): it writes its JSON and Markdown, the kernels' rows
are invariant, XLA's dot is reported alongside, and every method's tokens equal the
gpu baseline's."""

import importlib.util
import json
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


def _script():
  spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _run(tmp_path, *sections):
  rc = _script().main(["--tiny", "--out", str(tmp_path), "--sections", ",".join(sections)])
  result = json.loads((tmp_path / "gpu_check.json").read_text())
  return rc, result, (tmp_path / "gpu_check.md").read_text()


@pytest.mark.slow
def test_invariance_section_on_tiny_shapes(tmp_path):
  rc, result, md = _run(tmp_path, "invariance")
  assert rc == 0, result
  inv = result["invariance"]
  assert result["interpret_mode"] and inv["ms"] == [1, 2, 5, 16]
  assert all(inv["dot"].values()) and all(inv["sum_squares"].values())
  assert all(inv["attention_widths"].values()) and set(inv["attention_widths"]) == {
      "1", "2", "5", "16"}
  assert set(inv["xla_dot"]) == {"1", "2", "5", "16"}     # reported, whatever it is here
  assert "| dot | yes | yes | yes | yes |" in md


@pytest.mark.slow
def test_the_whole_check_runs_end_to_end_on_tiny_models(tmp_path):
  rc, result, md = _run(tmp_path, "invariance", "decoding", "steps")
  assert rc == 0, {k: v for k, v in result.items() if isinstance(v, dict) and "error" in v}
  dec = result["decoding"]
  assert set(dec["ms_per_token"]) == {"2"}
  for checks in dec["tokens_equal_gpu_baseline"].values():
    assert all(v for k, v in checks.items() if "(gpu kernels" in k), checks
  steps = result["steps"]
  assert steps["gpu"]["c"] > 0 and steps["xla"]["target_step_ms"] > 0
  assert steps["peak_bandwidth_Bps"] is None           # a CPU: no bound claimed
  assert "## ms/token (greedy)" in md and "exact baseline (gpu kernels) / plain" in md


def test_a_failed_section_is_reported_and_fails_the_run(tmp_path):
  rc, result, md = _run(tmp_path, "no-such-section")
  assert rc == 1 and "error" in result["no-such-section"]
  assert "## no-such-section: FAILED" in md
