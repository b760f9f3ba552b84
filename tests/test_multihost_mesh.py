"""One model split across two processes (tests/multihost_child.py on loopback, 4 CPU
devices each): a global 8-device mesh whose "model" axis spans both processes, and one
whose "data" axis does, decode the tokens one device does (and count the same
statistics); the request checks read arrays split over processes consistently on every
process (an empty row held by one process fails on both). Each process asserts; this
test runs them."""

import pathlib
import sys

import pytest
from loopback import run_processes

HERE = pathlib.Path(__file__).parent


@pytest.mark.slow     # two processes
def test_model_split_across_processes_decodes_as_one_device():
  outs = run_processes(lambda i, port: [sys.executable, str(HERE / "multihost_child.py"),
                                        str(port), str(i)], processes=2, devices=4)
  for out in outs:
    assert out.splitlines()[-1] == "checked model_spans data_spans empty_row", out
