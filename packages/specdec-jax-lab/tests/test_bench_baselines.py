"""`specdec bench` times what it says: a beam method's speedup is over `sd.Beam` with its
beams (not over greedy decoding), sd.Beam is its own baseline, statistics that do not apply
to beam search are left out, every line of --prompts-file is decoded at every batch size, and
--no-progress still reports each group with an estimate of the rest."""

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
def test_a_beam_methods_speedup_is_over_sd_beam(tmp_path, capsys):
  out = tmp_path / "out"
  assert cli.main([*ARGS, "--batch-sizes", "2", "--gammas", "2", "--beam", "2:0.6",
                   "--out", str(out)]) == 0
  entries = _entries(out)
  beam = entries[(2, "beam", "beam K=2 alpha=0.6")]
  spec = entries[(2, "speculative-beam", "speculative-beam K=2 alpha=0.6 gamma=2")]
  assert beam["speedup"] == 1.0                         # its own baseline
  assert spec["baseline"] == beam["label"] and spec["same_beams"] is True
  assert spec["speedup"] == pytest.approx(beam["ms_per_token"] / spec["ms_per_token"])
  assert spec["block_efficiency"] is None and beam["block_efficiency"] is None
  table = capsys.readouterr()
  row = next(line for line in table.out.splitlines() if "gamma=2)" in line)
  assert f"| {spec['speedup']:.2f}x |" in row
  # --no-progress: a line per group, the last one saying it is done
  assert "then timing 1 (batch, mode) group of 1 rounds" in table.err
  assert "bench: B=2 greedy timed (1 of 1, " in table.err


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
