"""`specdec bench`: a tiny run writes bench.json / bench.md / bench.png. Speed is never asserted."""

import json
import math

import pytest
import specdec_command as cli

from specdec_jax import loading as models
from specdec_jax_lab import bench

TARGET = "config:t5_1_1_tiny"
DRAFTER = "config:t5_1_1_tiny_drafter"
# Same decode shapes as tests/test_cli.py (two prompts of length 5, 6 new tokens): shared jit
# caches. One batch size: tests/test_bench_baselines.py times several.
ARGS = ["bench", "--target", TARGET, "--drafter", DRAFTER, "--batch-sizes", "2",
        "--gammas", "1,2", "--modes", "greedy", "--prompt-len", "5", "--max-new-tokens", "6",
        "--repeats", "1", "--timing-steps", "2", "--no-progress"]

ENTRY_KEYS = {"batch_size", "mode", "method", "gamma", "ms_per_token", "tokens_per_s",
              "speedup", "generated_tokens", "wall_s_median"}
SPEC_KEYS = ENTRY_KEYS | {"alpha", "acceptance_rate", "block_efficiency", "c", "verify_cost",
                          "predicted_speedup", "measured_over_predicted",
                          "expected_block_efficiency", "target_calls", "drafter_calls"}


def positive(x):
  return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench")
  assert cli.main([*ARGS, "--out", str(out)]) == 0
  return out


@pytest.mark.slow
def test_bench_writes_json_md_png(bench_dir):
  results = json.loads((bench_dir / "bench.json").read_text())
  assert results["schema_version"] == bench.SCHEMA_VERSION
  machine = results["machine"]
  assert machine["jax_version"] and machine["devices"] and machine["cpu_count"] >= 1
  config = results["config"]
  assert config["target"] == TARGET and config["drafter"] == DRAFTER
  assert config["batch_sizes"] == [2] and config["gammas"] == [1, 2]
  assert config["max_new_tokens"] == 6 and config["prompt_len"] == 5
  assert set(results["definitions"]) >= {"ms_per_token", "speedup", "c", "verify_cost"}

  entries = results["results"]
  keys = [(e["batch_size"], e["gamma"]) for e in entries]
  assert keys == [(2, None), (2, 1), (2, 2)]
  for e in entries:
    assert e["mode"] == "greedy"
    if e["method"] == "autoregressive":
      assert ENTRY_KEYS <= set(e)
      assert e["speedup"] == 1.0
      # target calls are counted per row in every method: one per token for the baseline
      assert e["target_calls"] == e["generated_tokens"] and e["block_efficiency"] == 1.0
      for k in ("ms_per_token", "tokens_per_s", "wall_s_median"):
        assert positive(e[k]), (k, e)
    else:
      assert SPEC_KEYS <= set(e), SPEC_KEYS - set(e)
      for k in ("ms_per_token", "tokens_per_s", "speedup", "block_efficiency", "c",
                "verify_cost", "predicted_speedup", "measured_over_predicted",
                "expected_block_efficiency"):
        assert positive(e[k]), (k, e)
      assert 0.0 <= e["alpha"] <= 1.0 and 0.0 <= e["acceptance_rate"] <= 1.0
      assert 1 <= e["generated_tokens"] <= 6 * e["batch_size"]
      assert e["block_efficiency"] == pytest.approx(e["generated_tokens"] / e["target_calls"])
      assert e["acceptance_rate"] == pytest.approx(e["accepted"] / max(e["drafted"], 1))
      assert e["rounds"] <= e["target_calls"]
  costs = {c["batch_size"]: c for c in results["costs"]}
  assert set(costs) == {2}
  for c in costs.values():
    assert positive(c["target_step_ms"]) and positive(c["drafter_step_ms"]) and positive(c["c"])
    assert [v["gamma"] for v in c["verify"]] == [1, 2]
    assert all(positive(v["verify_cost"]) for v in c["verify"])

  md = (bench_dir / "bench.md").read_text()
  header = next(line for line in md.splitlines() if line.startswith("| batch | mode"))
  for column in bench.TABLE_COLUMNS:
    assert f" {column} " in header
  assert md.count("| speculative |") == 2 and md.count("| autoregressive |") == 1
  png = (bench_dir / "bench.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


@pytest.mark.slow
def test_resume_skips_present_entries_and_checks_settings(bench_dir, capsys):
  before = json.loads((bench_dir / "bench.json").read_text())
  assert cli.main([*ARGS, "--out", str(bench_dir), "--resume"]) == 0
  after = json.loads((bench_dir / "bench.json").read_text())
  assert after["results"] == before["results"]      # nothing re-run
  capsys.readouterr()
  code = cli.main([*ARGS, "--out", str(bench_dir), "--resume", "--max-new-tokens", "7"])
  assert code == 1 and "other settings (max_new_tokens)" in capsys.readouterr().err


def test_time_decode_step_and_bad_settings(capsys):
  model = models.load_model(TARGET)
  t = bench.time_decode_step(model, 2, 1, bench.CostTiming(capacity=9, steps=2, repeats=1),
                             encoder_len=5)
  assert positive(t)
  capsys.readouterr()
  assert cli.main(["bench", "--modes", "beam"]) == 2     # usage: argparse's type check
  assert cli.main(["bench", "--gammas", "0"]) == 2
  assert cli.main(["bench", "--repeats", "0", "--target", TARGET, "--baseline-only"]) == 1


def test_baseline_only(tmp_path):
  argv = [a for a in ARGS if a not in ("--drafter", DRAFTER)]
  assert cli.main([*argv, "--baseline-only", "--out", str(tmp_path)]) == 0
  results = json.loads((tmp_path / "bench.json").read_text())
  assert [e["method"] for e in results["results"]] == ["autoregressive"]
  assert results["costs"] == [] and results["config"]["drafter"] is None
  assert positive(results["results"][0]["ms_per_token"])
  assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_projections_pick_the_best_measured_gamma(bench_dir):
  from specdec_jax import costs, theory
  results = json.loads((bench_dir / "bench.json").read_text())
  assert {(p["batch_size"], p["alpha"]) for p in results["projections"]} == {
      (2, a) for a in costs.PROJECTION_ALPHAS}
  assert "Projected speedup" in (bench_dir / "bench.md").read_text()
  # free verification and a free drafter: the longest gamma wins, as Theorem 8 says
  free = {"batch_size": 1, "c": 0.0,
          "verify": [{"gamma": g, "verify_cost": 1.0} for g in (1, 2, 4)]}
  for p in costs.projections(free):
    assert p["gamma"] == 4 and p["projected_speedup"] == pytest.approx(p["theorem8_speedup"])
    assert p["projected_speedup"] == pytest.approx(theory.expected_tokens_per_call(p["alpha"], 4))
  # verification that costs 1 + gamma: gamma 1 wins at alpha 0.6
  dear = {**free, "verify": [{"gamma": g, "verify_cost": 1.0 + g} for g in (1, 2, 4)]}
  assert costs.projections(dear, alphas=(0.6,))[0]["gamma"] == 1


def test_preset_fills_settings_that_flags_did_not_give():
  from specdec_jax_lab.commands import bench as bench_cli
  argv = ["bench", "--preset", "xxl-small", "--batch-sizes", "1"]
  args = cli.build_parser().parse_args(argv)
  args.argv = argv[1:]
  bench_cli.apply_preset(args)
  assert args.target == "config:t5_1_1_xxl" and args.drafter == "config:t5_1_1_small"
  assert args.dtype == "bfloat16" and args.gammas == list(range(1, 16))
  assert args.batch_sizes == [1]          # given on the command line: kept
  assert args.modes == ["greedy"] and args.ignore_eos is True


@pytest.mark.slow
def test_bild_and_blockwise_entries_beside_the_baseline(tmp_path):
  import specdec_jax as sd
  target = models.load_model(TARGET)
  heads = sd.save_heads(tmp_path / "heads.safetensors", sd.init_heads(target, 3, rng=0))
  out = tmp_path / "out"
  argv = [*ARGS[:7], "--gammas", "1", *ARGS[9:], "--bild", "0.5:3",
          "--heads", str(heads), "--heads-lattice", "2:2", "--exact", "off", "--out", str(out)]
  assert cli.main(argv) == 0
  results = json.loads((out / "bench.json").read_text())
  assert results["config"]["exact"] is False
  entries = {(e["method"], e.get("label")): e for e in results["results"]}
  assert set(entries) == {("autoregressive", None), ("speculative", None),
                          ("bild", "bild fb=0.5 rb=3"), ("blockwise", "blockwise"),
                          ("blockwise", "blockwise k=2 p=2")}
  base = entries[("autoregressive", None)]
  for key in [("bild", "bild fb=0.5 rb=3"), ("blockwise", "blockwise"),
              ("blockwise", "blockwise k=2 p=2")]:
    e = entries[key]
    assert positive(e["speedup"]) and e["speedup"] == pytest.approx(
        base["ms_per_token"] / e["ms_per_token"])
  assert "fallback_rate" in entries[("bild", "bild fb=0.5 rb=3")]
  assert "repeated_draft_rate" in entries[("blockwise", "blockwise")]
  # greedy blockwise decoding emits the baseline's tokens: same count generated
  assert entries[("blockwise", "blockwise")]["generated_tokens"] == base["generated_tokens"]
  assert "bild (bild fb=0.5 rb=3)" in (out / "bench.md").read_text()


@pytest.mark.slow
def test_beam_with_a_drafter_times_speculative_beam_beside_it(tmp_path, capsys):
  """--beam K:ALPHA with a drafter: experimental.SpeculativeBeam at each --gammas entry, its speedup
  over the sd.Beam entry (not over greedy decoding; sd.Beam is its own baseline), statistics
  that do not apply to beam search left out, its beam steps per target call and the speedup
  its step costs predict; both generate the same tokens (the same beams). --no-progress
  still reports each group with an estimate of the rest."""
  out = tmp_path / "out"
  argv = [*ARGS[:7], "--gammas", "2", *ARGS[9:], "--beam", "2:0.6",
          "--exact", "off", "--out", str(out)]
  assert cli.main(argv) == 0
  results = json.loads((out / "bench.json").read_text())
  entries = {(e["method"], e.get("label")): e for e in results["results"]}
  beam = entries[("beam", "beam K=2 alpha=0.6")]
  spec = entries[("speculative-beam", "speculative-beam K=2 alpha=0.6 gamma=2")]
  assert beam["speedup"] == 1.0                         # its own baseline
  assert spec["baseline"] == beam["label"] and spec["same_beams"] is True
  assert spec["speedup"] == pytest.approx(beam["ms_per_token"] / spec["ms_per_token"])
  assert spec["block_efficiency"] is None and beam["block_efficiency"] is None
  assert spec["reference"] == beam["label"] and "reference" not in beam
  assert spec["reference_speedup"] == pytest.approx(beam["ms_per_token"] / spec["ms_per_token"])
  table = capsys.readouterr()
  row = next(line for line in table.out.splitlines() if "gamma=2)" in line)
  assert f"| {spec['speedup']:.2f}x |" in row
  # --no-progress: a line per group, the last one saying it is done
  assert "then timing 1 (batch, mode) group of 1 rounds" in table.err
  assert "bench: B=2 greedy timed (1 of 1, " in table.err
  assert spec["generated_tokens"] == beam["generated_tokens"]
  assert spec["steps"] == beam["rounds"] and spec["steps_per_target_call"] >= 1.0
  assert spec["drafted_nodes_per_round"] == 2 * 2 + 2 * (2 - 1)
  # the cost model's inputs at the beams' (B*K) and the chains' (B*M = B*3K) rows
  costs = spec["beam_costs"]
  assert (costs["beam_rows"], costs["verify_rows"], costs["verify_tokens"]) == (4, 12, 3)
  assert (costs["batch_size"], costs["gamma"], costs["chains"]) == (2, 2, 6)
  assert positive(costs["c"]) and positive(costs["verify_cost"])
  assert spec["predicted_reference_speedup"] == pytest.approx(
      spec["steps_per_target_call"] / (2 * costs["c"] + costs["verify_cost"]))
  assert "speculative-beam K=2 alpha=0.6 gamma=2 | beam K=2 alpha=0.6" in (
      out / "bench.md").read_text()
