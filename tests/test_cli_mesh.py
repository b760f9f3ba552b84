"""`specdec decode --mesh` and `specdec plan` against real arrays on 8 forced CPU devices
(tests/cli_mesh_checks.py, one subprocess: jax fixes the device count at start-up), and
the parsing of --mesh."""

import json
import pathlib
import sys

import numpy as np
import pytest
from loopback import run_child

import specdec_jax as sd
from specdec_jax.cli import mesh_args
from specdec_jax.errors import CLIError
from specdec_jax.io.prompts import Prompts
from specdec_jax.runs import Run
from specdec_jax.runtime.jobs import Job, plan

HERE = pathlib.Path(__file__).parent


def test_parse_mesh():
  assert mesh_args.parse_mesh("data=2,model=4") == {"data": 2, "model": 4}
  assert mesh_args.parse_mesh(" model=8 ") == {"data": 1, "model": 8}
  for text, message in [("rows=2", "unknown axis 'rows'; the axes are data, model"),
                        ("data=2,data=4", "given twice"), ("data=0", "positive integer"),
                        ("model=two", "positive integer"), ("data", "is not AXIS=SIZE"),
                        ("", "expected AXIS=SIZE")]:
    with pytest.raises(CLIError, match=message):
      mesh_args.parse_mesh(text)


def test_batch_must_split_over_data():
  mesh = mesh_args.mesh_from_flag("data=1,model=1")
  mesh_args.check_batch(3, mesh)
  # no --batch-size: every row in one batch, rounded to "data" (8 devices: cli_mesh_checks)
  prompts = Prompts(np.array([[5, 1], [6, 1], [7, 1]], np.int32))
  run = Run(sd.Autoregressive())
  assert plan(run, prompts, Job(max_new_tokens=2)).batch == 3
  assert plan(run.on(mesh), prompts, Job(max_new_tokens=2)).batch == 3


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  out = tmp_path_factory.mktemp("cli_mesh") / "report.json"
  run_child([sys.executable, str(HERE / "cli_mesh_checks.py"), str(out)], devices=8)
  return json.loads(out.read_text())


def assert_split_over_model(loads):
  """One target, loaded into shards on the 2x4 mesh, most leaves split over "model"."""
  assert [p["mesh"] for p in loads] == [{"data": 2, "model": 4}]
  assert loads[0]["logits_spec"] == ["None", "model"]
  assert loads[0]["split_leaves"] > loads[0]["leaves"] // 2


@pytest.mark.slow
@pytest.mark.parametrize("method", ["baseline", "speculative"])
def test_decode_on_a_mesh_prints_the_single_device_translations(report, method):
  assert report["device_count"] == 8
  runs = report["decode"][method]
  single, mesh = runs["single"], runs["mesh"]
  assert single["code"] == 0 and mesh["code"] == 0, (single["err"], mesh["err"])
  single_out, mesh_out = json.loads(single["out"]), json.loads(mesh["out"])
  assert len(mesh_out["outputs"]) == 3 and all(mesh_out["outputs"])
  assert mesh_out["outputs"] == single_out["outputs"]
  assert mesh_out["settings"]["mesh"] == "data=2,model=4"
  assert single_out["settings"]["mesh"] is None
  # where the CLI placed things: the target loaded straight into its shards over "model"
  # (sd.load(..., mesh=), never whole and then sd.shard-ed), every other model whole on
  # each of the 8 devices, each batch split by rows over "data" (3 prompts padded to 4)
  placed = runs["placements"]
  assert placed["shard"] == []
  assert_split_over_model(placed["load"])
  assert placed["shard_batch"] and all(b["shape"][0] == 4 and
                                       [s[0] for s in b["shard_shapes"]] == [2]
                                       for b in placed["shard_batch"])
  if method == "speculative":
    assert placed["replicate"] and all(r["replicated"] and r["leaves"] > 0
                                       for r in placed["replicate"])


@pytest.mark.slow
def test_eval_and_bench_on_a_mesh(report):
  """`specdec eval --mesh` scores the same hypotheses as one device; `specdec bench
  --mesh` times baseline and speculative decoding on it."""
  single, mesh = report["decode"]["eval"]["single"], report["decode"]["eval"]["mesh"]
  assert single["code"] == 0 and mesh["code"] == 0, (single["err"], mesh["err"])
  single, mesh = json.loads(single["out"]), json.loads(mesh["out"])
  assert mesh["hypotheses"] == single["hypotheses"] and mesh["pairs"] == 4
  assert mesh["settings"]["mesh"] == "data=2,model=4"
  placed = report["decode"]["eval"]["placements"]
  assert placed["shard"] == [] and [p["path"] for p in placed["load"]] == ["demo-de-en/target"]
  assert_split_over_model(placed["load"])
  bench = report["decode"]["bench"]
  assert bench["code"] == 0, bench["err"]
  # the config: target initialised into its shards (as `--preset xxl-small --mesh` does)
  assert bench["placements"]["shard"] == []
  assert_split_over_model(bench["placements"]["init"])
  assert bench["json"]["config"]["mesh"] == "data=2,model=4"
  entries = {e["gamma"]: e for e in bench["json"]["results"]}
  assert set(entries) == {None, 2} and entries[2]["ms_per_token"] > 0


@pytest.mark.slow
def test_bad_meshes_exit_1_with_one_line(report):
  errors = report["decode"]["errors"]
  for name, message in [("not_dividing", "needs data * model = 6 devices, but 8"),
                        ("unknown_axis", "unknown axis 'rows'"),
                        ("batch", "--batch-size 3 is not divisible by the mesh's 'data' axis "
                                  "of size 2"),
                        ("bench_batch", "--batch-sizes entry 1 is not divisible")]:
    run = errors[name]
    command = "bench" if name.startswith("bench") else "decode"
    assert run["code"] == 1 and run["out"] == "", (name, run)
    assert run["err"].startswith(f"specdec {command}: error: ") and message in run["err"], run
    assert len(run["err"].strip().splitlines()) == 1


@pytest.mark.slow
def test_plan_equals_the_bytes_of_sharded_params_and_caches(report):
  """Per-device bytes of sd.shard-ed / replicated parameters and of caches in the planned
  layout, measured on the devices, against tools.plan's arithmetic (within 1%)."""
  assert {r["case"] for r in report["plan"]} == {
      "2x4/float32/heads=4", "1x8/bfloat16/heads=4", "1x8/float32/heads=8",
      "8x1/float32/heads=4"}
  for row in report["plan"]:
    for key, planned in row["plan"].items():
      measured = row["measured"][key]
      assert abs(planned - measured) <= 0.01 * measured, (row["case"], key, planned, measured)
    split = not row["case"].startswith("8x1")
    params, whole = row["measured"]["target_params"], row["single_device"]["target_params"]
    assert (params < whole / 3) if split else params == whole, row["case"]


@pytest.mark.slow
def test_plan_is_close_to_the_compiled_decode(report):
  """The whole compiled speculative decode's per-device memory (XLA's memory analysis;
  the caches pinned to the plan's layout by the engine) is within 15% of the plan's
  total."""
  for row in report["program"]:
    assert row["plan_cache"] > 0.5 * row["plan_total"]        # a cache-dominated shape
    assert abs(row["plan_total"] - row["compiled"]) <= 0.15 * row["compiled"], row
