"""The 8-device checks of tests/test_cli_mesh.py, run in ONE subprocess.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/cli_mesh_checks.py OUT.json

(jax fixes the device count at start-up, so the forced 8 CPU devices need their own
process.) Writes a JSON report: `specdec decode` with and without `--mesh data=2,model=4`
(outputs, exit codes, stderr of the bad meshes, where the CLI placed the target, the
drafter and the inputs), and `specdec plan`'s bytes beside the measured per-device bytes
of actually sharded parameters and decoder caches. The assertions live in the test.
"""

import contextlib
import io
import json
import pathlib
import sys
import tempfile

import jax
import numpy as np

import specdec_jax as sd
from specdec_jax import cli

TARGET_CONFIG, DRAFTER = "config:t5_1_1_tiny", "config:t5_1_1_tiny_drafter"
PROMPTS = ["5 17 42 9 1", "7 8 9 11 1", "30 31 32 33 34 35 1"]   # 3 rows: data=2 pads to 4
LOGITS_SCALE = 6.0     # sharpens the random target: top-2 margins far above float noise
MESH = "data=2,model=4"


def run_cli(*argv) -> dict:
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main([str(a) for a in argv])
  return {"code": code, "out": out.getvalue(), "err": err.getvalue()}


def sharp_target(tmp: str) -> str:
  """t5_1_1_tiny with its output layer scaled, saved: the --model of every run."""
  target = sd.load(TARGET_CONFIG)
  params = jax.tree_util.tree_map(lambda x: x, target.params)
  params["decoder"]["logits_dense"]["kernel"] = (params["decoder"]["logits_dense"]["kernel"]
                                                 * LOGITS_SCALE)
  path = f"{tmp}/target"
  sd.save(path, target.replace(params=params))
  return path


def _split_summary(mesh, params) -> dict:
  leaves = jax.tree_util.tree_leaves(params)
  return {"mesh": dict(mesh.shape),
          "logits_spec": [str(a) for a in
                          params["decoder"]["logits_dense"]["kernel"].sharding.spec],
          "split_leaves": sum(not x.sharding.is_fully_replicated for x in leaves),
          "leaves": len(leaves)}


class Placements:
  """Records what the CLI hands to sd.shard / sharding.replicate / sharding.shard_batch,
  and the loads that go straight into shards: `sd.load(..., mesh=)` (`sharding.load`)
  and `sd.init_model(..., shardings=)` (config: models)."""

  def __init__(self):
    self.seen = {"shard": [], "replicate": [], "shard_batch": [], "load": [], "init": []}
    self._real = (sd.shard, sd.sharding.replicate, sd.sharding.shard_batch, sd.sharding.load,
                  sd.init_model)

  def __enter__(self):
    shard, replicate, shard_batch, load, init_model = self._real

    def spy_load(path, mesh, *a, **k):
      out = load(path, mesh, *a, **k)
      self.seen["load"].append({"path": str(path), **_split_summary(mesh, out.params)})
      return out

    def spy_init(config, *a, shardings=None, **k):
      out = init_model(config, *a, shardings=shardings, **k)
      if shardings is not None:
        mesh = jax.tree_util.tree_leaves(shardings)[0].mesh
        self.seen["init"].append(_split_summary(mesh, out.params))
      return out

    def spy_shard(model, mesh, *a, **k):
      out = shard(model, mesh, *a, **k)
      self.seen["shard"].append(_split_summary(mesh, out.params))
      return out

    def spy_replicate(tree, mesh):
      out = replicate(tree, mesh)
      leaves = [x for x in jax.tree_util.tree_leaves(out) if isinstance(x, jax.Array)]
      self.seen["replicate"].append({
          "leaves": len(leaves),
          "replicated": all(x.sharding.is_fully_replicated and
                            len(x.sharding.device_set) == 8 for x in leaves)})
      return out

    def spy_shard_batch(x, mesh):
      out = shard_batch(x, mesh)
      self.seen["shard_batch"].append({
          "shape": list(out.shape),
          "shard_shapes": sorted({tuple(s.data.shape) for s in out.addressable_shards})})
      return out

    (sd.shard, sd.sharding.replicate, sd.sharding.shard_batch, sd.sharding.load,
     sd.init_model) = (spy_shard, spy_replicate, spy_shard_batch, spy_load, spy_init)
    return self

  def __exit__(self, *exc):
    (sd.shard, sd.sharding.replicate, sd.sharding.shard_batch, sd.sharding.load,
     sd.init_model) = self._real


def decode_checks(tmp: str) -> dict:
  model = sharp_target(tmp)
  common = ["decode", "--model", model, "--max-new-tokens", 8, "--json", *PROMPTS]
  report = {}
  for name, extra in (("baseline", []), ("speculative", ["--drafter", DRAFTER, "--gamma", 3])):
    single = run_cli(*common, *extra)
    with Placements() as spy:
      mesh = run_cli(*common, *extra, "--mesh", MESH)
    report[name] = {"single": single, "mesh": mesh, "placements": spy.seen}
  pairs = str(pathlib.Path(__file__).parent / "data" / "demo_test_pairs.jsonl")
  evaluate = ["eval", "--model", "demo-de-en/target", "--drafter", "demo-de-en/drafter",
              "--gamma", 3, "--data", pairs, "--limit", 4, "--batch-size", 4, "--json"]
  with Placements() as spy:
    report["eval"] = {"single": run_cli(*evaluate), "mesh": run_cli(*evaluate, "--mesh", MESH)}
  report["eval"]["placements"] = spy.seen
  with Placements() as spy:
    report["bench"] = run_cli("bench", "--target", TARGET_CONFIG, "--drafter", DRAFTER,
                              "--batch-sizes", 2, "--gammas", 2, "--modes", "greedy",
                              "--max-new-tokens", 4, "--prompt-len", 5, "--repeats", 1,
                              "--timing-steps", 2, "--no-progress", "--mesh", MESH,
                              "--out", f"{tmp}/bench")
  report["bench"]["placements"] = spy.seen
  report["bench"]["json"] = json.loads(pathlib.Path(f"{tmp}/bench/bench.json").read_text())
  report["errors"] = {
      "not_dividing": run_cli(*common, "--mesh", "data=3,model=2"),
      "unknown_axis": run_cli(*common, "--mesh", "rows=8"),
      "batch": run_cli(*common, "--mesh", MESH, "--batch-size", 3),
      "bench_batch": run_cli("bench", "--target", TARGET_CONFIG, "--batch-sizes", 1,
                             "--baseline-only", "--mesh", MESH, "--out", f"{tmp}/b1"),
  }
  return report


# (mesh, target config overrides, dtype): heads split over "model" (2x4, 1x8 with 8 heads),
# not divisible (4 heads on 1x8: whole), batch only (8x1).
PLAN_CASES = [((2, 4), {}, "float32"), ((1, 8), {}, "bfloat16"),
              ((1, 8), {"num_heads": 8, "head_dim": 8}, "float32"), ((8, 1), {}, "float32")]
PLAN_SHAPE = {"batch": 8, "max_input_len": 6, "max_new_tokens": 10, "gamma": 3}


def per_device_bytes(tree) -> int:
  """Bytes device 0 holds of every array in `tree` (all devices hold equal shards here)."""
  return sum(x.addressable_shards[0].data.nbytes for x in jax.tree_util.tree_leaves(tree)
             if isinstance(x, jax.Array))


def plan_checks() -> list:
  """`tools.plan`'s arithmetic beside the per-device bytes of really sharded parameters
  (`sd.shard`, `sharding.replicate`) and caches (`model.start`'s, placed in the plan's
  `cache_layout`)."""
  from jax.sharding import NamedSharding, PartitionSpec

  from specdec_jax import plan as plan_lib
  rows = []

  def start(model, enc, capacity, layout, mesh):
    """model.start's cache placed in the planned layout (real arrays on the mesh)."""
    out = jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), layout,
                                 is_leaf=lambda x: isinstance(x, PartitionSpec))
    return jax.jit(lambda m, e: m.start(e, capacity), out_shardings=out)(model, enc)

  for (data, model), overrides, dtype in PLAN_CASES:
    mesh = sd.make_mesh(data=data, model=model)
    target_config = sd.get_config("t5_1_1_tiny", **overrides)
    drafter_config = sd.get_config("t5_1_1_tiny_drafter")
    shape = {k: v for k, v in PLAN_SHAPE.items() if k != "batch"}
    plan = plan_lib.memory_plan(target_config, drafter_config, PLAN_SHAPE["batch"],
                                plan_lib.PlanSettings(dtype=dtype,
                                                      mesh={"data": data, "model": model},
                                                      **shape))
    target = sd.shard(sd.init_model(target_config, 0, dtype), mesh)
    drafter = sd.sharding.replicate(sd.init_model(drafter_config, 1, dtype), mesh)
    b, le = PLAN_SHAPE["batch"], PLAN_SHAPE["max_input_len"]
    enc = sd.sharding.shard_batch(np.full((b, le), 5, np.int32), mesh)
    sizes = plan_lib.abstract_mesh(data, model)
    target_cache = start(target, enc, plan.capacity,
                         plan_lib.cache_layout(target_config, b, sizes), mesh)
    drafter_cache = start(drafter, enc, plan.capacity,
                          plan_lib.cache_layout(drafter_config, b, sizes, split_heads=False),
                          mesh)
    rows.append({
        "case": f"{data}x{model}/{dtype}/heads={target_config.num_heads}",
        "plan": {"target_params": plan.target_params, "drafter_params": plan.drafter_params,
                 "target_cache": sum(plan.target_cache.values()),
                 "drafter_cache": sum(plan.drafter_cache.values())},
        "measured": {"target_params": per_device_bytes(target.params),
                     "drafter_params": per_device_bytes(drafter.params),
                     "target_cache": per_device_bytes(target_cache),
                     "drafter_cache": per_device_bytes(drafter_cache)},
        "single_device": {"target_params": per_device_bytes(
            sd.init_model(target_config, 0, dtype).params)},
        "self_key_spec": [str(a) for a in target_cache.self_key[-1].sharding.spec]})
  return rows


def program_checks() -> list:
  """The plan's total beside XLA's own per-device memory of the whole compiled speculative
  decode (arguments + outputs + temporaries of `engine.run`), on a shape whose caches
  dominate: the engine pins the caches' layout (`sd.sharding.constrain_state`), the
  layers constrain the activations, XLA propagates the rest."""
  from specdec_jax import methods as core
  from specdec_jax import plan as plan_lib
  from specdec_jax.rounds import engine
  config = sd.get_config("t5_1_1_tiny", num_heads=8, head_dim=64)
  drafter_config = sd.get_config("t5_1_1_tiny_drafter")
  b, le, t, g = 8, 6, 1000, 3
  method = core.Speculative(None, gamma=g, exact=False)
  rows = []
  for data, model in ((2, 4), (1, 8)):
    mesh = sd.make_mesh(data=data, model=model)
    target = sd.shard(sd.init_model(config, 0), mesh)
    drafter = sd.sharding.replicate(sd.init_model(drafter_config, 1), mesh)
    enc = sd.sharding.shard_batch(np.full((b, le), 5, np.int32), mesh)
    method = method.replace(drafter=drafter)
    proposer = method.proposer(target, sd.Greedy())
    config_ = method.round_config(target, t, sd.Greedy(), 1)
    compiled = engine.run.lower(target, proposer, enc, method.proposer_inputs(proposer, enc, t),
                                jax.random.PRNGKey(0), config=config_).compile()
    memory = compiled.memory_analysis()
    plan = plan_lib.memory_plan(config, drafter_config, b,
                                plan_lib.PlanSettings(max_input_len=le, max_new_tokens=t,
                                                      gamma=g,
                                                      mesh={"data": data, "model": model}))
    rows.append({"mesh": f"{data}x{model}", "plan_total": plan.total_bytes,
                 "plan_cache": plan.cache_bytes,
                 "compiled": int(memory.argument_size_in_bytes + memory.output_size_in_bytes
                                 + memory.temp_size_in_bytes)})
  return rows


def main(path: str) -> None:
  assert jax.device_count() == 8, jax.devices()
  with tempfile.TemporaryDirectory() as tmp:
    report = {"device_count": jax.device_count(), "decode": decode_checks(tmp),
              "plan": plan_checks(), "program": program_checks()}
  with open(path, "w") as f:
    json.dump(report, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1])
