"""`specdec decode --mesh` and `specdec plan` against real arrays on the test process's 8
CPU devices (conftest.py; the CLI runs in-process), and the parsing of --mesh."""

import contextlib
import io
import json
import pathlib
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import specdec_jax as sd
from specdec_jax import cli
from specdec_jax import plan as plan_lib
from specdec_jax.flags import FlagError
from specdec_jax.flags import mesh as mesh_args
from specdec_jax.io.prompts import Prompts
from specdec_jax.rounds import engine
from specdec_jax.runs import Run
from specdec_jax.runtime.jobs import Job, plan

HERE = pathlib.Path(__file__).parent
TARGET_CONFIG, DRAFTER = "config:t5_1_1_tiny", "config:t5_1_1_tiny_drafter"
PROMPTS = ["5 17 42 9 1", "7 8 9 11 1", "30 31 32 33 34 35 1"]   # 3 rows: data=2 pads to 4
LOGITS_SCALE = 6.0     # sharpens the random target: top-2 margins far above float noise
MESH = "data=2,model=4"


def test_parse_mesh():
  assert mesh_args.parse_mesh("data=2,model=4") == {"data": 2, "model": 4}
  assert mesh_args.parse_mesh(" model=8 ") == {"data": 1, "model": 8}
  for text, message in [("rows=2", "unknown axis 'rows'; the axes are data, model"),
                        ("data=2,data=4", "given twice"), ("data=0", "positive integer"),
                        ("model=two", "positive integer"), ("data", "is not AXIS=SIZE"),
                        ("", "expected AXIS=SIZE")]:
    with pytest.raises(FlagError, match=message):
      mesh_args.parse_mesh(text)


def test_batch_must_split_over_data():
  mesh = mesh_args.mesh_from_flag("data=2,model=4")
  mesh_args.check_batch(4, mesh)
  with pytest.raises(FlagError, match="--batch-size 3 is not divisible"):
    mesh_args.check_batch(3, mesh)
  mesh_args.check_batch(3, None)
  # no --batch-size: every row in one batch, rounded up to a multiple of "data"
  prompts = Prompts(np.array([[5, 1], [6, 1], [7, 1]], np.int32))
  run = Run(sd.Autoregressive())
  assert plan(run, prompts, Job(max_new_tokens=2)).batch == 3
  assert plan(run.on(mesh), prompts, Job(max_new_tokens=2)).batch == 4


def run_cli(*argv) -> SimpleNamespace:
  """`specdec ARGV` in this process: its exit code, stdout and stderr."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main([str(a) for a in argv])
  return SimpleNamespace(code=code, out=out.getvalue(), err=err.getvalue())


@pytest.fixture(scope="module")
def sharp_target(tmp_path_factory) -> str:
  """t5_1_1_tiny with its output layer scaled, saved: the --model of every decode."""
  target = sd.load(TARGET_CONFIG)
  params = jax.tree_util.tree_map(lambda x: x, target.params)
  params["decoder"]["logits_dense"]["kernel"] = (params["decoder"]["logits_dense"]["kernel"]
                                                 * LOGITS_SCALE)
  path = tmp_path_factory.mktemp("cli_mesh") / "target"
  sd.save(path, target.replace(params=params))
  return str(path)


def _split(mesh, params) -> dict:
  leaves = jax.tree_util.tree_leaves(params)
  return {"mesh": dict(mesh.shape),
          "logits_spec": list(params["decoder"]["logits_dense"]["kernel"].sharding.spec),
          "split_leaves": sum(not x.sharding.is_fully_replicated for x in leaves),
          "leaves": len(leaves)}


def placements(monkeypatch) -> dict[str, list]:
  """Records, from now on, what the CLI hands to sd.shard / sharding.replicate /
  sharding.shard_batch, and the loads that go straight into shards: `sd.load(...,
  mesh=)` (`sharding.load`) and `sd.init_model(..., shardings=)` (config: models)."""
  seen: dict[str, list] = {"shard": [], "replicate": [], "shard_batch": [], "load": [],
                           "init": []}
  shard, replicate, shard_batch, load, init_model = (
      sd.shard, sd.sharding.replicate, sd.sharding.shard_batch, sd.sharding.load,
      sd.init_model)

  def spy_load(path, mesh, *a, **k):
    out = load(path, mesh, *a, **k)
    seen["load"].append({"path": str(path), **_split(mesh, out.params)})
    return out

  def spy_init(config, *a, shardings=None, **k):
    out = init_model(config, *a, shardings=shardings, **k)
    if shardings is not None:
      seen["init"].append(_split(jax.tree_util.tree_leaves(shardings)[0].mesh, out.params))
    return out

  def spy_shard(model, mesh, *a, **k):
    out = shard(model, mesh, *a, **k)
    seen["shard"].append(_split(mesh, out.params))
    return out

  def spy_replicate(tree, mesh):
    out = replicate(tree, mesh)
    leaves = [x for x in jax.tree_util.tree_leaves(out) if isinstance(x, jax.Array)]
    seen["replicate"].append(leaves and all(
        x.sharding.is_fully_replicated and len(x.sharding.device_set) == 8 for x in leaves))
    return out

  def spy_shard_batch(x, mesh):
    out = shard_batch(x, mesh)
    seen["shard_batch"].append((out.shape[0], tuple(sorted({
        s.data.shape[0] for s in out.addressable_shards}))))
    return out

  for name, spy in (("shard", spy_shard), ("init_model", spy_init)):
    monkeypatch.setattr(sd, name, spy)
  for name, spy in (("replicate", spy_replicate), ("shard_batch", spy_shard_batch),
                    ("load", spy_load)):
    monkeypatch.setattr(sd.sharding, name, spy)
  return seen


def assert_split_over_model(loads):
  """One target, loaded into shards on the 2x4 mesh, most leaves split over "model"."""
  assert [p["mesh"] for p in loads] == [{"data": 2, "model": 4}]
  assert loads[0]["logits_spec"] == [None, "model"]
  assert loads[0]["split_leaves"] > loads[0]["leaves"] // 2


@pytest.mark.slow
def test_decode_on_a_mesh_prints_the_single_device_translations(sharp_target, monkeypatch):
  """Speculative decoding: the target placed as the baseline's is, and its drafter too.
  (Sharded logits equal one device's, so every method on the mesh is exact:
  tests/test_sharding.py::test_sharded_logits_are_one_devices; the baseline on a mesh,
  its test_generate_along_each_mesh_axis.)"""
  argv = ["decode", "--model", sharp_target, "--max-new-tokens", 8, "--json", *PROMPTS,
          "--drafter", DRAFTER, "--gamma", 3]
  single = run_cli(*argv)
  placed = placements(monkeypatch)
  mesh = run_cli(*argv, "--mesh", MESH)
  assert single.code == 0 and mesh.code == 0, (single.err, mesh.err)
  single_out, mesh_out = json.loads(single.out), json.loads(mesh.out)
  assert len(mesh_out["outputs"]) == 3 and all(mesh_out["outputs"])
  assert mesh_out["outputs"] == single_out["outputs"]
  assert mesh_out["settings"]["mesh"] == MESH and single_out["settings"]["mesh"] is None
  # where the CLI placed things: the target loaded straight into its shards over "model"
  # (sd.load(..., mesh=), never whole and then sd.shard-ed), every other model whole on
  # each of the 8 devices, each batch split by rows over "data" (3 prompts padded to 4)
  assert placed["shard"] == []
  assert_split_over_model(placed["load"])
  assert placed["shard_batch"] and set(placed["shard_batch"]) == {(4, (2,))}
  assert placed["replicate"] and all(placed["replicate"])


@pytest.mark.slow
def test_eval_and_bench_on_a_mesh(tmp_path, monkeypatch):
  """`specdec eval --mesh` scores the same hypotheses as one device; `specdec bench
  --mesh` times baseline and speculative decoding on it."""
  pairs = str(HERE / "data" / "demo_test_pairs.jsonl")
  evaluate = ["eval", "--model", "demo-de-en/target", "--data", pairs, "--limit", 4,
              "--batch-size", 4, "--json"]
  single = run_cli(*evaluate)
  placed = placements(monkeypatch)
  mesh = run_cli(*evaluate, "--mesh", MESH)
  assert single.code == 0 and mesh.code == 0, (single.err, mesh.err)
  single, mesh = json.loads(single.out), json.loads(mesh.out)
  assert mesh["hypotheses"] == single["hypotheses"] and mesh["pairs"] == 4
  assert mesh["settings"]["mesh"] == MESH
  assert placed["shard"] == [] and [p["path"] for p in placed["load"]] == ["demo-de-en/target"]
  assert_split_over_model(placed["load"])
  for found in placed.values():
    found.clear()
  bench = run_cli("bench", "--target", TARGET_CONFIG, "--drafter", DRAFTER, "--batch-sizes", 2,
                  "--gammas", 2, "--modes", "greedy", "--max-new-tokens", 4, "--prompt-len", 5,
                  "--repeats", 1, "--timing-steps", 2, "--no-progress", "--mesh", MESH,
                  "--out", tmp_path / "bench")
  assert bench.code == 0, bench.err
  # the config: target initialised into its shards (as `--preset xxl-small --mesh` does)
  assert placed["shard"] == []
  assert_split_over_model(placed["init"])
  report = json.loads((tmp_path / "bench" / "bench.json").read_text())
  assert report["config"]["mesh"] == MESH
  entries = {e["gamma"]: e for e in report["results"]}
  assert set(entries) == {None, 2} and entries[2]["ms_per_token"] > 0


def test_bad_meshes_exit_1_with_one_line(sharp_target, tmp_path):
  common = ["decode", "--model", sharp_target, "--max-new-tokens", 8, "--json", *PROMPTS]
  for argv, message in [
      ((*common, "--mesh", "data=3,model=2"), "needs data * model = 6 devices, but 8"),
      ((*common, "--mesh", "rows=8"), "unknown axis 'rows'"),
      ((*common, "--mesh", MESH, "--batch-size", 3),
       "--batch-size 3 is not divisible by the mesh's 'data' axis of size 2"),
      (("bench", "--target", TARGET_CONFIG, "--batch-sizes", 1, "--baseline-only", "--mesh",
        MESH, "--out", tmp_path / "b1"), "--batch-sizes entry 1 is not divisible")]:
    run = run_cli(*argv)
    assert run.code == 1 and run.out == "", (argv, run)
    assert run.err.startswith(f"specdec {argv[0]}: error: ") and message in run.err, run.err
    assert len(run.err.strip().splitlines()) == 1, run.err


# (mesh, target config overrides, dtype): heads split over "model" (2x4, 1x8 with 8 heads),
# not divisible (4 heads on 1x8: whole), batch only (8x1).
PLAN_CASES = [((2, 4), {}, "float32"), ((1, 8), {}, "bfloat16"),
              ((1, 8), {"num_heads": 8, "head_dim": 8}, "float32"), ((8, 1), {}, "float32")]
PLAN_SHAPE = {"batch": 8, "max_input_len": 6, "max_new_tokens": 10, "gamma": 3}


def per_device_bytes(tree) -> int:
  """Bytes device 0 holds of every array in `tree` (all devices hold equal shards here)."""
  return sum(x.addressable_shards[0].data.nbytes for x in jax.tree_util.tree_leaves(tree)
             if isinstance(x, jax.Array))


@pytest.mark.slow
@pytest.mark.parametrize("mesh,overrides,dtype", PLAN_CASES,
                         ids=["2x4", "1x8-bf16", "1x8-8-heads", "8x1"])
def test_plan_equals_the_bytes_of_sharded_params_and_caches(mesh, overrides, dtype):
  """Per-device bytes of sd.shard-ed / replicated parameters and of caches in the planned
  layout (`model.start`'s, placed in the plan's `cache_layout`), measured on the devices,
  against `plan.memory_plan`'s arithmetic (within 1%)."""
  data, model = mesh
  on = sd.make_mesh(data=data, model=model)
  target_config = sd.get_config("t5_1_1_tiny", **overrides)
  drafter_config = sd.get_config("t5_1_1_tiny_drafter")
  shape = {k: v for k, v in PLAN_SHAPE.items() if k != "batch"}
  b = PLAN_SHAPE["batch"]
  plan = plan_lib.memory_plan(target_config, drafter_config, b, plan_lib.PlanSettings(
      dtype=dtype, mesh={"data": data, "model": model}, **shape))
  whole = sd.init_model(target_config, 0, dtype)
  target = sd.shard(whole, on)
  drafter = sd.sharding.replicate(sd.init_model(drafter_config, 1, dtype), on)
  enc = sd.sharding.shard_batch(np.full((b, PLAN_SHAPE["max_input_len"]), 5, np.int32), on)
  sizes = plan_lib.abstract_mesh(data, model)

  def start(model, layout):
    """model.start's cache placed in the planned layout (real arrays on the mesh)."""
    out = jax.tree_util.tree_map(lambda spec: NamedSharding(on, spec), layout,
                                 is_leaf=lambda x: isinstance(x, PartitionSpec))
    return jax.jit(lambda m, e: m.start(e, plan.capacity), out_shardings=out)(model, enc)

  target_cache = start(target, plan_lib.cache_layout(target_config, b, sizes))
  drafter_cache = start(drafter, plan_lib.cache_layout(drafter_config, b, sizes,
                                                       split_heads=False))
  measured = {"target_params": per_device_bytes(target.params),
              "drafter_params": per_device_bytes(drafter.params),
              "target_cache": per_device_bytes(target_cache),
              "drafter_cache": per_device_bytes(drafter_cache)}
  planned = {"target_params": plan.target_params, "drafter_params": plan.drafter_params,
             "target_cache": sum(plan.target_cache.values()),
             "drafter_cache": sum(plan.drafter_cache.values())}
  for key, bytes_ in planned.items():
    assert abs(bytes_ - measured[key]) <= 0.01 * measured[key], (key, bytes_, measured[key])
  unsplit = per_device_bytes(whole.params)
  assert measured["target_params"] < unsplit / 3 if model > 1 else \
      measured["target_params"] == unsplit


@pytest.mark.slow
def test_plan_is_close_to_the_compiled_decode():
  """The whole compiled speculative decode's per-device memory (XLA's memory analysis of
  arguments, outputs and temporaries; the caches pinned to the plan's layout by the
  engine) is within 15% of the plan's total, on a shape whose caches dominate, on the
  2x4 mesh (each other mesh's parameters and caches, byte for byte:
  test_plan_equals_the_bytes_of_sharded_params_and_caches)."""
  config = sd.get_config("t5_1_1_tiny", num_heads=8, head_dim=64)
  drafter_config = sd.get_config("t5_1_1_tiny_drafter")
  b, le, t, g = 8, 6, 1000, 3
  data, model = 2, 4
  mesh = sd.make_mesh(data=data, model=model)
  target = sd.shard(sd.init_model(config, 0), mesh)
  drafter = sd.sharding.replicate(sd.init_model(drafter_config, 1), mesh)
  enc = sd.sharding.shard_batch(np.full((b, le), 5, np.int32), mesh)
  method = sd.Speculative(drafter, gamma=g, exact=False)
  proposer = method.proposer(target, sd.Greedy())
  compiled = engine.run.lower(target, proposer, enc, method.proposer_inputs(proposer, enc, t),
                              jax.random.PRNGKey(0),
                              config=method.round_config(target, t, sd.Greedy(), 1)).compile()
  memory = compiled.memory_analysis()
  total = memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
  plan = plan_lib.memory_plan(config, drafter_config, b, plan_lib.PlanSettings(
      max_input_len=le, max_new_tokens=t, gamma=g, mesh={"data": data, "model": model}))
  assert plan.cache_bytes > 0.5 * plan.total_bytes        # a cache-dominated shape
  assert abs(plan.total_bytes - total) <= 0.15 * total, (plan.total_bytes, total)


@pytest.mark.slow
def test_plan_equals_the_bytes_of_a_sharded_gemma4_and_its_cache():
  """A Gemma 4 target on data=4, model=2: its parameters split by the rules and its prefilled
  cache placed in the plan's layout (the sliding layers' 2 K/V heads split over "model",
  the full layer's 1 head whole), measured on the devices, equal the plan's bytes."""
  config = sd.get_config("gemma4_tiny")
  b, prompt, new, gamma = 8, 6, 10, 3
  on = sd.make_mesh(data=4, model=2)
  plan = plan_lib.memory_plan(config, None, b, plan_lib.PlanSettings(
      max_input_len=prompt, max_new_tokens=new, gamma=gamma, mesh={"data": 4, "model": 2}))
  target = sd.shard(sd.init_model(config, 0), on)
  layout = plan_lib.cache_layout(config, b, plan_lib.abstract_mesh(4, 2))
  assert [spec[1] for spec in layout.self_key] == ["model", "model", None]
  out = jax.tree_util.tree_map(lambda spec: NamedSharding(on, spec), layout,
                               is_leaf=lambda x: isinstance(x, PartitionSpec))
  tokens = sd.sharding.shard_batch(np.full((b, prompt), 5, np.int32), on)
  lengths = jnp.full((b,), prompt, jnp.int32)
  cache = jax.jit(lambda m, t, n: m.start(t, plan.slots, n), out_shardings=out)(target, tokens,
                                                                              lengths)
  assert per_device_bytes(target.params) == plan.target_params < plan.target_params_whole
  assert per_device_bytes(cache) == sum(plan.target_cache.values())
