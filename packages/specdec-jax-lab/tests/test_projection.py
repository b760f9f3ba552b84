"""The scale projection tool on tiny configs: measured costs -> theory's speedups, outputs."""

import json

import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import theory
from specdec_jax_lab import projection
from specdec_jax_lab.errors import BenchError

TINY = (("tiny", "config:t5_1_1_tiny", "config:t5_1_1_tiny_drafter"),)


def test_project_is_theory_with_measured_verify_cost():
  rows = projection.project(0.8, 0.1, {1: 1.0, 2: 1.2, 3: 1.5})
  assert [r["gamma"] for r in rows] == [1, 2]          # v(1) is the 1-token call itself
  assert rows[0]["projected_speedup"] == pytest.approx(1.8 / (0.1 + 1.2))
  assert rows[1]["projected_speedup"] == pytest.approx((1 + 0.8 + 0.64) / (0.2 + 1.5))
  assert rows[1]["theorem8_speedup"] == pytest.approx((1 + 0.8 + 0.64) / 1.2)
  assert rows[1]["expected_tokens"] == pytest.approx(2.44)


@pytest.fixture(scope="module")
def tiny_run():
  settings = projection.ProjectionSettings(dtype="bfloat16", max_k=3, encoder_len=5,
                                           capacity=8, steps=1, repeats=2)
  return projection.run_projection(TINY, (1, 2), settings, alpha=0.7)


@pytest.mark.slow
def test_run_projection_tiny(tiny_run):
  res = tiny_run
  assert res["alpha"] == {"alpha": 0.7, "source": "given"}
  assert set(res["measured"]) == {"config:t5_1_1_tiny", "config:t5_1_1_tiny_drafter"}
  assert res["models"]["config:t5_1_1_tiny"]["dtype"] == "bfloat16"
  for per in res["measured"].values():
    for m in per.values():
      assert set(m["seconds"]) == {"1", "2", "3"} and all(s > 0 for s in m["seconds"].values())
      assert m["verify_cost"]["1"] == 1.0
      assert m["verify_cost"]["3"] == pytest.approx(m["seconds"]["3"] / m["seconds"]["1"])
  assert [(p["pair"], p["batch_size"]) for p in res["projections"]] == [("tiny", 1), ("tiny", 2)]
  for p in res["projections"]:
    t = res["measured"]["config:t5_1_1_tiny"][str(p["batch_size"])]["seconds"]
    d = res["measured"]["config:t5_1_1_tiny_drafter"][str(p["batch_size"])]["seconds"]
    assert p["c"] == pytest.approx(d["1"] / t["1"])
    assert [r["gamma"] for r in p["gammas"]] == [1, 2]
    for r in p["gammas"]:
      assert r["projected_speedup"] == pytest.approx(float(theory.walltime_improvement_measured(
          0.7, r["gamma"], p["c"], t[str(r["gamma"] + 1)] / t["1"])))
    assert p["best_speedup"] == max(r["projected_speedup"] for r in p["gammas"])
    assert [x["alpha"] for x in p["alpha_grid"]] == [0.6, 0.7, 0.8, 0.9]


@pytest.mark.slow
def test_outputs_json_md_png(tiny_run, tmp_path):
  paths = projection.write_outputs(tiny_run, str(tmp_path))
  assert json.loads(open(paths["json"]).read())["projections"] == json.loads(
      json.dumps(tiny_run["projections"]))
  md = open(paths["md"]).read()
  assert "a projection, not a measurement" in md and "| tiny | 2 |" in md
  assert md.count("`config:t5_1_1_tiny") == 4           # two models x two batch sizes
  assert open(paths["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_cli_writes_outputs(tmp_path):
  assert projection.main(["--out", str(tmp_path), "--pair", ",".join(TINY[0]), "--alpha", "0.5",
                          "--batch-sizes", "1", "--max-k", "2", "--encoder-len", "5",
                          "--capacity", "8", "--steps", "1", "--repeats", "1"]) == 0
  res = json.loads((tmp_path / "projection.json").read_text())
  assert res["alpha"]["alpha"] == 0.5 and len(res["projections"]) == 1


def test_bad_alpha_and_ks():
  with pytest.raises(BenchError, match="alpha"):
    projection.run_projection(TINY, (1,), alpha=1.0)
  model = sd.init_model(sd.get_config("t5_1_1_tiny"))
  with pytest.raises(BenchError, match="include 1"):
    projection.measure_step_costs(model, 1, (2, 3))
  with pytest.raises(BenchError, match="capacity"):
    projection.measure_step_costs(model, 1, (1, 8), capacity=8)


class _IdTokenizer:
  """Texts of space-separated ids -> a right-padded id matrix."""

  def encode(self, texts):
    rows = [[int(t) for t in s.split()] + [1] for s in texts]
    out = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, r in enumerate(rows):
      out[i, :len(r)] = r
    return out


@pytest.mark.slow
def test_measure_alpha_is_one_for_the_target_as_its_own_drafter():
  target = sd.init_model(sd.get_config("t5_1_1_tiny"))
  texts = ["5 9 13 40", "7 8", "22 23 24 25 26"]
  own = projection.measure_alpha(target, target, texts, _IdTokenizer(), gamma=2,
                                 max_new_tokens=6, batch=4)
  assert own["alpha"] == 1.0 and own["rows"] == 3
  other = projection.measure_alpha(target, sd.init_model(sd.get_config("t5_1_1_tiny_drafter")),
                                   texts, _IdTokenizer(), gamma=2, max_new_tokens=6, batch=4)
  assert 0.0 <= other["alpha"] < 1.0
