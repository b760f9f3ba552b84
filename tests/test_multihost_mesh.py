"""One model split across two processes (tests/multihost_checks.py on loopback): a global
8-device mesh whose "model" axis spans both processes decodes the tokens one device does,
and the request checks read arrays split over processes consistently on every process."""

import json
import pathlib
import sys

import pytest
from loopback import run_processes

HERE = pathlib.Path(__file__).parent
MESHES = ("data=2,model=4/model_spans", "data=2,model=4/data_spans")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("multihost")
  run_processes(lambda i, port: [sys.executable, str(HERE / "multihost_checks.py"),
                                 str(port), str(i), str(tmp / f"{i}.json")],
                processes=2, devices=4)
  return [json.loads((tmp / f"{i}.json").read_text()) for i in range(2)]


@pytest.mark.slow     # two processes
@pytest.mark.parametrize("mesh", MESHES)
def test_model_split_across_processes_decodes_as_one_device(reports, mesh):
  for process, report in enumerate(reports):
    assert report["process"] == process and report["process_count"] == 2
    assert report["local_devices"] == 4
    entry = report["meshes"][mesh]
    assert entry["mesh_processes"] == [0, 1]
    if mesh.endswith("data_spans"):
      assert entry["model_row_processes"] == [0] and not entry["enc_fully_addressable"]
    else:      # one "model" row (every weight's split) spans both processes
      assert entry["model_row_processes"] == [0, 1]
    assert entry["kernel_spec"] == ["None", "model"]
    assert entry["kernel_local_shard"] == [entry["kernel_shape"][0],
                                           entry["kernel_shape"][1] // 4]    # model=4
    assert entry["equal_single"] == {"generate": True, "speculative": True}, entry
    assert entry["stats_tokens"] == entry["single_stats_tokens"] > 0
  assert reports[0]["meshes"][mesh]["tokens"] == reports[1]["meshes"][mesh]["tokens"]


@pytest.mark.slow
def test_an_empty_row_held_by_one_process_fails_on_both(reports):
  for report in reports:
    assert report["empty_row_error"] is not None
    assert "inputs row 3 holds nothing but padding" in report["empty_row_error"]
