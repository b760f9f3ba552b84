"""One process of tests/test_multihost_mesh.py: a global mesh over two processes.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 \
        python tests/multihost_child.py PORT PROCESS_ID

Two processes on loopback (`jax.distributed` on 127.0.0.1), 4 CPU devices each, one
8-device mesh over both. Per mesh, the sharpened t5_1_1_tiny target is loaded straight
into its shards (`sd.load(..., mesh=)`), the drafter replicated, the encoder tokens split
by batch; speculative greedy runs, and its tokens, gathered to every process
(`process_allgather`), must be this process's single-device run's (`generate` on a mesh
is one device's: tests/test_sharding.py). An empty row held by one process only must
raise the same error on both. The checks are asserted here (a failure exits non-zero
with its traceback); the last line of stdout names the checks that passed.
"""

import sys
import tempfile

import jax
import numpy as np

PORT, PROCESS = sys.argv[1], int(sys.argv[2])
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
      "model_spans": sd.make_mesh(
          data=2, model=4, devices=[devices[i] for i in (0, 1, 4, 5, 2, 3, 6, 7)]),
      # "model" within a process, "data" across: each process holds half the rows
      "data_spans": sd.make_mesh(data=2, model=4),
  }


def gathered(x) -> np.ndarray:
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def check_mesh(name: str, mesh, path: str, drafter, single: dict) -> None:
  """The target loaded into shards on `mesh` decodes `single`'s tokens, gathered."""
  assert sorted({d.process_index for d in mesh.devices.flat}) == [0, 1]
  t = sd.load(path, mesh=mesh)
  enc = sd.sharding.shard_batch(ENC, mesh)
  row = sorted({d.process_index for d in mesh.devices[0]})
  if name == "data_spans":
    assert row == [0] and not enc.is_fully_addressable
  else:                          # one "model" row (every weight's split) spans both processes
    assert row == [0, 1]
  kernel = t.params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
  assert list(kernel.sharding.spec) == [None, "model"]
  assert kernel.addressable_shards[0].data.shape == (kernel.shape[0], kernel.shape[1] // 4)
  runs = {"speculative": sd.speculative_generate(t, sd.sharding.replicate(drafter, mesh), enc,
                                                 gamma=GAMMA, max_new_tokens=T)}
  for method, out in runs.items():
    tokens, lengths = single[method]
    np.testing.assert_array_equal(gathered(out.tokens), tokens, err_msg=f"{name} {method}")
    np.testing.assert_array_equal(gathered(out.lengths), lengths, err_msg=f"{name} {method}")
  # statistics of rows split over processes: the counters gathered first
  got = stats.summarize(multihost_utils.process_allgather(runs["speculative"].counters,
                                                          tiled=True))["tokens"]
  assert got == single["speculative_tokens"] > 0, (name, got)


def main() -> None:
  assert jax.process_count() == 2 and jax.local_device_count() == 4
  checked = []
  with tempfile.TemporaryDirectory() as tmp:
    path, target = sharp_target(tmp)
    drafter = sd.load("config:t5_1_1_tiny_drafter")
    outs = {"speculative": sd.speculative_generate(target, drafter, ENC, gamma=GAMMA,
                                                   max_new_tokens=T)}
    single: dict = {k: (np.asarray(v.tokens), np.asarray(v.lengths)) for k, v in outs.items()}
    single["speculative_tokens"] = outs["speculative"].stats["tokens"]
    for name, mesh in meshes().items():
      check_mesh(name, mesh, path, drafter, single)
      checked.append(name)
    # an empty row (3) that only process 1 holds on the data-spanning mesh: both fail alike
    mesh = meshes()["data_spans"]
    bad = ENC.copy()
    bad[3] = [0, 0, 0, 0, 0]      # padding alone (EOS alone is the empty input)
    t = sd.load(path, mesh=mesh)
    try:
      sd.generate(t, sd.sharding.shard_batch(bad, mesh), max_new_tokens=T)
    except sd.InputError as e:
      assert "inputs row 3 holds nothing but padding" in str(e), e
      checked.append("empty_row")
  print("checked", *checked)


if __name__ == "__main__":
  main()
