"""One process of tests/test_multihost_mesh.py: a global mesh over two processes.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 \
        python tests/multihost_checks.py PORT PROCESS_ID OUT.json

Two processes on loopback (`jax.distributed` on 127.0.0.1), 4 CPU devices each, one
8-device mesh over both. Per mesh, the sharpened t5_1_1_tiny target is loaded straight
into its shards (`sd.load(..., mesh=)`), the drafter replicated, the encoder tokens split
by batch; `generate` and speculative greedy run, and their tokens, gathered to every
process (`process_allgather`), are compared with this process's single-device run. An
empty row held by one process only must raise the same error on both. Writes a JSON
report; the assertions live in the test.
"""

import json
import sys
import tempfile

import jax
import numpy as np

PORT, PROCESS, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
jax.distributed.initialize(f"127.0.0.1:{PORT}", 2, PROCESS)

from jax.experimental import multihost_utils  # noqa: E402

import specdec_jax as sd  # noqa: E402
from specdec_jax.rounds import stats  # noqa: E402

LOGITS_SCALE = 6.0     # top-2 margins far above float noise: a mesh changes reduction order
ENC = np.array([[5, 17, 42, 9, 1], [7, 8, 9, 11, 1], [30, 31, 32, 33, 1], [100, 3, 1, 0, 0]],
               np.int32)
T, GAMMA = 8, 3


def sharp_target(tmp: str) -> tuple[str, sd.Model]:
  target = sd.load("config:t5_1_1_tiny")
  params = jax.tree_util.tree_map(lambda x: x, target.params)
  params["decoder"]["logits_dense"]["kernel"] = (params["decoder"]["logits_dense"]["kernel"]
                                                 * LOGITS_SCALE)
  target = target.replace(params=params)
  sd.save(f"{tmp}/target", target)
  return f"{tmp}/target", target


def meshes() -> dict:
  devices = jax.devices()        # process 0's 4 devices, then process 1's
  return {
      # each "model" row of 4 holds 2 devices of each process (every weight matrix split
      # across both processes); "data" rows likewise
      "data=2,model=4/model_spans": sd.make_mesh(
          data=2, model=4, devices=[devices[i] for i in (0, 1, 4, 5, 2, 3, 6, 7)]),
      # "model" within a process, "data" across: each process holds half the rows
      "data=2,model=4/data_spans": sd.make_mesh(data=2, model=4),
  }


def gathered(x) -> list:
  return np.asarray(multihost_utils.process_allgather(x, tiled=True)).tolist()


def main() -> None:
  with tempfile.TemporaryDirectory() as tmp:
    path, target = sharp_target(tmp)
    drafter = sd.load("config:t5_1_1_tiny_drafter")
    single = {"generate": sd.generate(target, ENC, max_new_tokens=T),
              "speculative": sd.speculative_generate(target, drafter, ENC, gamma=GAMMA,
                                                     max_new_tokens=T)}
    single_tokens = single["speculative"].stats["tokens"]
    single = {k: (np.asarray(v.tokens).tolist(), np.asarray(v.lengths).tolist())
              for k, v in single.items()}
    report = {"process": PROCESS, "process_count": jax.process_count(),
              "local_devices": jax.local_device_count(), "meshes": {}}
    for name, mesh in meshes().items():
      t = sd.load(path, mesh=mesh)
      d = sd.sharding.replicate(drafter, mesh)
      enc = sd.sharding.shard_batch(ENC, mesh)
      runs = {"generate": sd.generate(t, enc, max_new_tokens=T),
              "speculative": sd.speculative_generate(t, d, enc, gamma=GAMMA, max_new_tokens=T)}
      kernel = t.params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
      report["meshes"][name] = {
          "mesh_processes": sorted({dev.process_index for dev in mesh.devices.flat}),
          "model_row_processes": sorted({dev.process_index for dev in mesh.devices[0]}),
          "enc_fully_addressable": enc.is_fully_addressable,
          "kernel_spec": [str(a) for a in kernel.sharding.spec],
          "kernel_local_shard": list(kernel.addressable_shards[0].data.shape),
          "kernel_shape": list(kernel.shape),
          "equal_single": {k: [gathered(o.tokens), gathered(o.lengths)] == list(single[k])
                           for k, o in runs.items()},
          "tokens": {k: gathered(o.tokens) for k, o in runs.items()},
          # statistics of rows split over processes: the counters gathered first
          "stats_tokens": stats.summarize(multihost_utils.process_allgather(
              runs["speculative"].counters, tiled=True))["tokens"],
          "single_stats_tokens": single_tokens,
      }
    # an empty row (3) that only process 1 holds on the data-spanning mesh
    mesh = meshes()["data=2,model=4/data_spans"]
    bad = ENC.copy()
    bad[3] = [0, 0, 0, 0, 0]
    t = sd.load(path, mesh=mesh)
    try:
      sd.generate(t, sd.sharding.shard_batch(bad, mesh), max_new_tokens=T)
      report["empty_row_error"] = None
    except sd.InputError as e:
      report["empty_row_error"] = str(e)
  with open(OUT, "w") as f:
    json.dump(report, f)


if __name__ == "__main__":
  main()
