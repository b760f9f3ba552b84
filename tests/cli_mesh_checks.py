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
import sys
import tempfile

import jax
import numpy as np

import specdec_jax as sd
from specdec_jax.tools import cli

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


class Placements:
  """Records what the CLI hands to sd.shard / sharding.replicate / sharding.shard_batch."""

  def __init__(self):
    self.seen = {"shard": [], "replicate": [], "shard_batch": []}
    self._real = (sd.shard, sd.sharding.replicate, sd.sharding.shard_batch)

  def __enter__(self):
    shard, replicate, shard_batch = self._real

    def spy_shard(model, mesh, *a, **k):
      out = shard(model, mesh, *a, **k)
      leaves = jax.tree_util.tree_leaves(out.params)
      self.seen["shard"].append({
          "mesh": dict(mesh.shape),
          "logits_spec": [str(a) for a in
                          out.params["decoder"]["logits_dense"]["kernel"].sharding.spec],
          "split_leaves": sum(not x.sharding.is_fully_replicated for x in leaves),
          "leaves": len(leaves)})
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

    sd.shard, sd.sharding.replicate, sd.sharding.shard_batch = (spy_shard, spy_replicate,
                                                                spy_shard_batch)
    return self

  def __exit__(self, *exc):
    sd.shard, sd.sharding.replicate, sd.sharding.shard_batch = self._real


def decode_checks(tmp: str) -> dict:
  model = sharp_target(tmp)
  common = ["decode", "--model", model, "--max-new-tokens", 8, "--json", *PROMPTS]
  report = {}
  for name, extra in (("baseline", []), ("speculative", ["--drafter", DRAFTER, "--gamma", 3])):
    single = run_cli(*common, *extra)
    with Placements() as spy:
      mesh = run_cli(*common, *extra, "--mesh", MESH)
    report[name] = {"single": single, "mesh": mesh, "placements": spy.seen}
  report["errors"] = {
      "not_dividing": run_cli(*common, "--mesh", "data=3,model=2"),
      "unknown_axis": run_cli(*common, "--mesh", "rows=8"),
      "batch": run_cli(*common, "--mesh", MESH, "--batch-size", 3),
  }
  return report


def main(path: str) -> None:
  assert jax.device_count() == 8, jax.devices()
  with tempfile.TemporaryDirectory() as tmp:
    report = {"device_count": jax.device_count(), "decode": decode_checks(tmp)}
  with open(path, "w") as f:
    json.dump(report, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1])
