"""Kernels on a mesh: a sharded target keeps its kernels, each inside `shard_map`.

The checks need 8 devices, which jax fixes at start-up: they run in ONE subprocess
(tests/kernels_mesh_checks.py, 8 forced CPU devices) that reports JSON; the tests below
assert on its report. A target `sd.shard`-ed over the mesh and packed for a backend runs
every product on that backend's kernels, one block per device (`dispatch.Layout`): the
"model" axis splits heads and the MLP as `sharding.RULES_1D` does, batch rows go over
"data", and a row-parallel product adds its devices' partial sums in shard order.

Against the same backend on one device: the tokens of every method, bitwise (a greedy
method's against that device's autoregressive baseline, which they are there; the logits
of a row-parallel product round differently: K is added in two orders); on the mesh,
greedy speculative decoding, BiLD at fallback threshold 1 and blockwise drafts are
bitwise the autoregressive baseline with every target call at its natural width.
"""

import json
import pathlib
import sys

import pytest
from loopback import run_child

HERE = pathlib.Path(__file__).resolve().parent

METHODS = ("Autoregressive", "Speculative", "BiLD", "Blockwise", "Beam")
GREEDY_WIDTHS = {"Autoregressive": [1], "Speculative": [4]}     # gamma 3: 4-token verify calls

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  out = tmp_path_factory.mktemp("kernels_mesh") / "report.json"
  run_child([sys.executable, str(HERE / "kernels_mesh_checks.py"), str(out)], devices=8)
  return json.loads(out.read_text())


def _cpu(report, key):
  if not report["cpu_kernels"]:
    pytest.skip("the CPU kernels are unavailable here")
  return report[key]


@pytest.mark.parametrize("key,names", [("cpu/t5", METHODS),
                                       ("cpu/lm", ("Autoregressive", "Speculative")),
                                       ("tpu/t5", ("Autoregressive", "Speculative"))])
def test_every_method_on_a_sharded_target_is_the_single_device_result(report, key, names):
  entry = _cpu(report, key) if key.startswith("cpu") else report[key]
  assert report["device_count"] == 8
  assert sorted(entry["equal_single"]) == sorted(names)
  assert all(entry["equal_single"].values()), entry["equal_single"]
  assert entry["output_devices"] in (2, 8)


@pytest.mark.parametrize("key", ["cpu/t5", "cpu/lm", "tpu/t5"])
def test_exact_greedy_at_natural_widths_on_the_mesh(report, key):
  """Every product on an invariant kernel on the mesh too: exact mode pads nothing, and
  greedy methods give the mesh's baseline tokens bitwise."""
  entry = _cpu(report, key) if key.startswith("cpu") else report[key]
  assert entry["width_invariant"]
  assert all(v for name, v in entry["exact"].items() if name != "Beam"), entry["exact"]
  assert all(entry["equal_baseline"].values()) and entry["equal_baseline"], entry
  for name, widths in GREEDY_WIDTHS.items():
    assert entry["widths"][name] == widths, (name, entry["widths"])
  assert all(max(w) < 16 for w in entry["widths"].values() if w), entry["widths"]


# (batch, K, N) of the products' layouts: rows over "data"; the norms whole; wo and the
# attention's out split by rows (K); q/k/v, wi and the output layer by columns, and
# attention by heads (its N)
AXES = [["data", None, None], ["data", None, "model"], ["data", "model", None]]


@pytest.mark.parametrize("key,backend", [("cpu/t5", "cpu"), ("cpu/lm", "cpu"), ("tpu/t5", "tpu")])
def test_the_mesh_keeps_its_kernels(report, key, backend):
  """No fallback to XLA: every product packed for the backend, in blocks on the mesh."""
  entry = _cpu(report, key) if key.startswith("cpu") else report[key]
  layouts = entry["layouts"]
  assert layouts["backends"] == [backend] and layouts["all_on_mesh"]
  assert sorted(layouts["axes"], key=str) == sorted(AXES, key=str)
  assert layouts["operand_devices"] == ([2] if key == "tpu/t5" else [8])


def test_the_mesh_program_calls_the_kernels_inside_shard_map(report):
  calls = _cpu(report, "cpu/t5")["calls"]["Autoregressive"]
  assert {"specdec_skinny_dot", "specdec_decode_attention"} <= set(calls["custom_calls"])
  assert calls["manual"] and calls["partitions"] == 8


@pytest.mark.parametrize("backend,call", [("tpu", "tpu_custom_call"), ("gpu", "mosaic_gpu_v2")])
def test_lowered_for_an_accelerator_on_the_mesh_nothing_is_cpu_only(report, backend, call):
  for name, calls in report[f"lowered/{backend}"].items():
    assert call in calls["custom_calls"], name
    assert calls["cpu_only"] == [] and not calls["callbacks"], name
    assert calls["manual"] and calls["partitions"] == 8, name


@pytest.mark.parametrize("backend", ["cpu", "tpu"])
def test_products_on_the_mesh_are_the_kernels_blocks(report, backend):
  """A column-split dot and the attention split by grouped heads (per-row lengths, with a
  bias and without) are bitwise the kernel on one device; a row-split dot is bitwise its
  blocks' partial sums added in shard order; a row computed alone is bitwise the row in
  the batch."""
  entry = _cpu(report, "products/cpu") if backend == "cpu" else report[f"products/{backend}"]
  for split in ("dot_n", "dot_k"):
    assert entry[split]["equal"] and entry[split]["row_alone"], (split, entry)
    assert entry[split]["close"] < 0.1, entry                  # bfloat16 products
  for name in ("attention", "attention_no_bias"):
    assert entry[name]["equal"] and entry[name]["equal_repeated"], (name, entry[name])
