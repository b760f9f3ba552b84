"""`specdec bench` times what it says: every line of --prompts-file is decoded at every batch
size. (A beam method's speedup over `sd.Beam` with its beams, and --no-progress's lines:
tests/test_bench.py's test_beam_with_a_drafter_times_speculative_beam_beside_it.)"""

import json

import numpy as np
import pytest
import specdec_command as cli

import specdec_jax as sd

TARGET = "config:t5_1_1_tiny"
DRAFTER = "config:t5_1_1_tiny_drafter"
ARGS = ["bench", "--target", TARGET, "--drafter", DRAFTER, "--modes", "greedy",
        "--prompt-len", "5", "--max-new-tokens", "6", "--repeats", "1", "--timing-steps", "2",
        "--no-progress", "--exact", "off"]
LINES = ["5 17 42 1", "7 8 9 11 1", "12 13 1"]


def _entries(out):
  results = json.loads((out / "bench.json").read_text())
  return {(e["batch_size"], e["method"], e.get("label")): e for e in results["results"]}


@pytest.mark.slow
def test_every_line_of_a_prompts_file_is_timed_at_every_batch_size(tmp_path):
  path = tmp_path / "prompts.txt"
  path.write_text("\n".join(LINES) + "\n\n")
  out = tmp_path / "out"
  assert cli.main([*ARGS, "--baseline-only", "--batch-sizes", "1,2", "--prompts-file",
                   str(path), "--out", str(out)]) == 0
  entries = _entries(out)
  target = sd.load(TARGET)
  ids = np.zeros((len(LINES), 5), np.int32)
  for i, line in enumerate(LINES):
    row = [int(t) for t in line.split()]
    ids[i, :len(row)] = row
  want = int(np.sum(sd.generate(target, ids, 6).lengths))
  assert entries[(1, "autoregressive", None)]["generated_tokens"] == want
  assert entries[(2, "autoregressive", None)]["generated_tokens"] == want
