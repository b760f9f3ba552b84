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


@pytest.mark.device
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
  assert inv["attention_lengths"] == {"as_mask": True}
  assert "| dot | yes | yes | yes | yes |" in md


@pytest.mark.device
@pytest.mark.slow
def test_the_whole_check_runs_end_to_end_on_tiny_models(tmp_path):
  """Every section but invariance (its own test above): the tile sweep, decoding, steps and
  the near-tie census."""
  rc, result, md = _run(tmp_path, "sweep", "decoding", "steps", "census")
  assert rc == 0, {k: v for k, v in result.items() if isinstance(v, dict) and "error" in v}
  # the sweep: each candidate timed and checked; the fastest invariant one is the table's
  from specdec_jax.kernels.gpu import tiles
  swept = result["sweep"]["shapes"]["70x130:bfloat16"]
  candidates = [tiles.Tiles(**c["tiles"]) for c in swept["candidates"]]
  assert candidates == tiles.candidates(70, 130, "bfloat16")[:2]
  assert all(c["invariant"] and c["us"] > 0 for c in swept["candidates"])
  fastest = min(swept["candidates"], key=lambda c: c["us"])
  table = json.loads((tmp_path / "gpu_tiles.json").read_text())
  assert table["dot"]["70x130:bfloat16"] == {**fastest["tiles"], "us": round(fastest["us"], 2)}
  assert "70x130:bfloat16" not in tiles.table()["dot"]   # the run's table did not outlive it
  assert "## Tile sweep" in md and "| 70x130:bfloat16 | 2 | 2 |" in md
  # the census: natural text, near-ties counted among the decoded steps
  census = result["census"]
  assert census["prompts"] == 2 and 0 < census["steps"] <= 2 * census["new_tokens"]
  assert 0 <= census["near_ties"] <= census["steps"] and 0 <= census["rows_differ"] <= 2
  assert "## Near-tie census (natural text)" in md
  dec = result["decoding"]
  assert set(dec["ms_per_token"]) == {"2"}
  for checks in dec["tokens_equal_gpu_baseline"].values():
    assert all(v for k, v in checks.items() if "(gpu kernels" in k), checks
  steps = result["steps"]
  assert steps["gpu"]["c"] > 0 and steps["xla"]["target_step_ms"] > 0
  # interpret mode measures nothing: the record's entry says fail, and why
  entry = json.loads((tmp_path / "verified_entry.json").read_text())
  assert entry["verdict"] == "fail" and "interpret mode" in " ".join(entry["figures"]["reasons"])
  assert "## Record: fail for" in md
  assert steps["peak_bandwidth_Bps"] is None           # a CPU: no bound claimed
  assert "## ms/token (greedy)" in md and "exact baseline (gpu kernels) / plain" in md


def test_a_failed_section_is_reported_and_fails_the_run(tmp_path):
  rc, result, md = _run(tmp_path, "no-such-section")
  assert rc == 1 and "error" in result["no-such-section"]
  assert "## no-such-section: FAILED" in md


def test_the_verdict_needs_invariance_equal_tokens_and_speed():
  """The record's verdict (what kernels='auto' reads): a pass needs every kernel's rows
  invariant, every method's tokens equal and the kernels' exact baseline no slower than
  XLA's padded one, measured on the device (never in interpret mode)."""
  module = _script()
  good = {"interpret_mode": False,
          "invariance": {"dot": {"1": True}, "sum_squares": {"1": True},
                         "attention_widths": {"1": True}},
          "decoding": {"tokens_equal_gpu_baseline": {"1": {"speculative (gpu kernels)": True}},
                       "ms_per_token": {"1": {"exact baseline (gpu kernels)": 1.0,
                                              "exact baseline (xla, padded)": 1.2}}}}
  assert module.verdict(good) == ("pass", [])
  slow = json.loads(json.dumps(good))
  slow["decoding"]["ms_per_token"]["1"]["exact baseline (gpu kernels)"] = 1.5
  assert module.verdict(slow)[0] == "fail" and "slower" in module.verdict(slow)[1][0]
  varying = json.loads(json.dumps(good))
  varying["invariance"]["dot"]["1"] = False
  assert module.verdict(varying) == ("fail", ["dot rows differ with M"])
  swept = {**good, "sweep": {"shapes": {"4096x4096:bfloat16": {
      "candidates": [{"invariant": False}], "chosen": None}}}}
  assert module.verdict(swept) == ("fail", ["no tiling of 4096x4096:bfloat16 kept its rows "
                                            "invariant"])
  assert module.verdict({**good, "interpret_mode": True})[0] == "fail"
  entry = module.record_entry(good, "python scripts/gpu_check.py --out x")
  assert entry["verdict"] == "pass" and entry["check"].endswith("--out x")
