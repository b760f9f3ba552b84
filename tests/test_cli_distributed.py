"""`specdec decode --input-file` by two processes on loopback (jax.distributed on
127.0.0.1, 4 CPU devices each), on a 2x2 mesh of local devices per process and on one
global 1x8 mesh over both: the outputs of the whole file, on process 0, equal one
process's, in input order."""

import contextlib
import io
import json
import pathlib
import sys

import jax
import numpy as np
import pytest
from loopback import run_processes

import specdec_jax as sd
from specdec_jax import cli
from specdec_jax.runtime import distributed

HERE = pathlib.Path(__file__).parent
DRAFTER = "config:t5_1_1_tiny_drafter"
LOGITS_SCALE = 6.0    # top-2 margins far above float noise: a mesh changes reduction order
# 5 rows of different lengths: process 0 decodes 3, process 1 decodes 2 (+ 1 padding row)
PROMPTS = ["5 17 42 9 1", "7 8 9 11 1", "30 31 32 33 34 35 1", "100 3 1", "64 65 66 67 1"]


def test_process_rows_cover_the_input_in_order():
  for n in (1, 2, 5, 8, 9):
    for processes in (1, 2, 3, 4):
      blocks = [distributed.process_rows(n, p, processes) for p in range(processes)]
      rows = [r for start, stop, _ in blocks for r in range(start, stop)]
      assert rows == list(range(n)), (n, processes)
      assert len({block for _, _, block in blocks}) == 1
      tokens = np.arange(n)[:, None] + 1
      batches = [distributed.local_batches(tokens, 2, p, processes) for p in range(processes)]
      assert len({len(b) for b in batches}) == 1                   # equal shapes everywhere
      real = [int(t) for bs in batches for b in bs for t in b.tokens[:b.real, 0]]
      assert real == list(range(1, n + 1))


def test_partial_process_flags_are_an_error(capsys, monkeypatch):
  code = cli.main(["decode", "--model", "config:t5_1_1_tiny", "--coordinator", "127.0.0.1:1",
                   "5 1"])
  _, err = capsys.readouterr()
  assert code == 1 and "--num-processes, --process-id missing" in err
  monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
  code = cli.main(["decode", "--model", "config:t5_1_1_tiny", "--distributed", "5 1"])
  _, err = capsys.readouterr()
  assert code == 1 and "JAX_NUM_PROCESSES='two' is not a non-negative integer" in err
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  code = cli.main(["decode", "--model", "config:t5_1_1_tiny", "--process-id", "2",
                   "--coordinator", "127.0.0.1:1", "5 1"])
  _, err = capsys.readouterr()
  assert code == 1 and "--process-id 2 must be in [0, --num-processes 2)" in err


@pytest.mark.parametrize("address", ["notahost", ":1234", "host:0", "host:port"])
def test_a_coordinator_that_is_not_host_port_is_named_on_process_0_too(capsys, address):
  """Process 0 does not wait for a coordinator: jaxlib read the port itself and failed
  with "list index out of range" (issue 46)."""
  code = cli.main(["decode", "--model", "config:t5_1_1_tiny", "--coordinator", address,
                   "--num-processes", "2", "--process-id", "0", "5 1"])
  _, err = capsys.readouterr()
  assert code == 1 and f"--coordinator {address!r} is not HOST:PORT (e.g. 10.0.0.1:1234" in err
  assert "index" not in err and "Traceback" not in err


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
  """(argv, the JSON of one process decoding the file) on a sharpened tiny target."""
  tmp = tmp_path_factory.mktemp("distributed")
  target = sd.load("config:t5_1_1_tiny")
  params = jax.tree_util.tree_map(lambda x: x, target.params)
  params["decoder"]["logits_dense"]["kernel"] = (params["decoder"]["logits_dense"]["kernel"]
                                                 * LOGITS_SCALE)
  model = tmp / "target"
  sd.save(model, target.replace(params=params))
  prompts = tmp / "prompts.txt"
  prompts.write_text("\n".join([PROMPTS[0], "", *PROMPTS[1:]]) + "\n")   # an empty input too
  argv = ["decode", "--model", str(model), "--drafter", DRAFTER, "--gamma", "3",
          "--max-new-tokens", "8", "--input-file", str(prompts), "--json"]
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    assert cli.main(argv) == 0
  return argv, json.loads(printed.getvalue())


@pytest.mark.slow     # two processes; the fast tier keeps the row split's unit tests
@pytest.mark.parametrize("mesh, spans", [
    ("data=2,model=2", False),   # a mesh per process: each decodes its block of rows
    # (one global mesh, every weight split across both processes: test_multihost_mesh.py)
])
def test_two_processes_decode_a_file_as_one(one_process, mesh, spans):
  argv, one = one_process
  outs = run_processes(lambda i, port: [
      sys.executable, "-m", "specdec_jax.cli", *argv, "--mesh", mesh,
      "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i)],
      processes=2, devices=4)
  # stdout holds the outputs alone: gloo's (the CPU collectives') "[Gloo] Rank 0 is
  # connected ..." lines, which it writes to descriptor 1, go to stderr with every log
  assert outs[1] == "" and len(outs[0].splitlines()) == 1    # only process 0 prints
  assert "[Gloo]" not in outs[0]
  two = json.loads(outs[0])
  assert two["timing"]["processes"] == 2
  assert two["timing"]["mesh_spans_processes"] is spans
  assert two["outputs"] == one["outputs"] and two["lengths"] == one["lengths"]
  assert two["timing"]["prompts"] == len(PROMPTS) + 1 == len(two["outputs"])
  # statistics merged over both processes' real rows, as one process counts them
  for key in ("tokens", "target_calls", "drafted", "accepted"):
    assert two["stats"][key] == one["stats"][key], key
  assert two["settings"]["mesh"] == mesh


def test_a_mesh_of_neither_size_is_an_error(monkeypatch):
  """With several processes --mesh covers every process's devices or this one's."""
  from specdec_jax.flags import FlagError
  from specdec_jax.flags import mesh as mesh_args
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "device_count", lambda: 8)
  monkeypatch.setattr(jax, "local_device_count", lambda: 4)
  with pytest.raises(FlagError, match=r"data \* model = 6, but 2 processes have 8 devices "
                     r"\(4 on this one\): give 8 .* or 4 for a mesh per process"):
    mesh_args.mesh_from_flag("data=2,model=3")


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q"]))
