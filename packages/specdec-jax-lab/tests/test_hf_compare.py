"""specdec_jax_lab.hf_compare: our decoding side by side with transformers on the same weights."""

import json

import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax_lab import hf_compare

pytest.importorskip("torch", reason="needs the interop extra (torch, transformers)")
pytest.importorskip("transformers")


def _peaked_target():
  model = sd.init_model(sd.get_config("t5_1_1_tiny"), 0)
  params = dict(model.params)
  decoder = dict(params["decoder"])
  dense = dict(decoder["logits_dense"])
  dense["kernel"] = dense["kernel"] * 6.0   # greedy paths not decided by float noise
  decoder["logits_dense"] = dense
  params["decoder"] = decoder
  return model.replace(params=params)


@pytest.fixture(scope="module")
def models():
  return _peaked_target(), sd.init_model(sd.get_config("t5_1_1_tiny_drafter"), 1)


def _prompts():
  rng = np.random.RandomState(0)
  rows = [rng.randint(3, 512, n).astype(np.int32) for n in (5, 8, 11)]
  for r in rows:
    r[-1] = 1
  return rows


def test_token_helpers():
  assert hf_compare.hf_row_tokens(np.array([0, 7, 8, 1, 0, 0]), eos_id=1) == [7, 8, 1]
  assert hf_compare.hf_row_tokens(np.array([0, 7, 8, 9]), eos_id=1) == [7, 8, 9]
  assert hf_compare.our_row_tokens(np.array([7, 8, 1, 0]), 3) == [7, 8, 1]
  assert hf_compare.first_difference([1, 2, 3], [1, 2, 3]) is None
  assert hf_compare.first_difference([1, 2, 3], [1, 5, 3]) == 1
  assert hf_compare.first_difference([1, 2], [1, 2, 3]) == 2
  rows = hf_compare.prompt_rows(np.array([[5, 6, 1, 0], [7, 1, 0, 0]]))
  assert [r.tolist() for r in rows] == [[5, 6, 1], [7, 1]]
  np.testing.assert_array_equal(hf_compare.pad_rows(rows), [[5, 6, 1], [7, 1, 0]])
  with pytest.raises(hf_compare.CompareError):
    hf_compare.prompt_rows([np.zeros(3, np.int32)])


@pytest.mark.slow
def test_compare_hf_greedy_assisted_and_ours_identical(tmp_path, models):
  target, drafter = models
  settings = hf_compare.CompareSettings(gamma=3, max_new_tokens=8, batch_sizes=(), repeats=1,
                                       hf_default_assisted=False, progress=False)
  results = hf_compare.compare(target, drafter, _prompts(), settings,
                               config={"command": "pytest"})
  assert results["errors"] == {}, results["errors"]
  rows = {r["name"]: r for r in results["methods"]}
  # (batch > 1 rows run the same code in chunks; left out to keep the test short)
  assert set(rows) == {"hf_greedy", "hf_assisted", "ours_greedy", "ours_speculative"}
  for name, r in rows.items():
    assert r["error"] is None
    assert r["ms_per_token"] > 0 and r["tokens_per_s"] > 0
    assert r["identical_to_hf_greedy"] is True, (name, r.get("mismatches"))
    assert r["mismatching_prompts_vs_hf_greedy"] == 0
    assert r["speedup_vs_hf_greedy"] > 0 and r["speedup_vs_ours_greedy"] > 0
  assert rows["hf_greedy"]["speedup_vs_hf_greedy"] == pytest.approx(1.0)
  assert rows["hf_greedy"]["tokens_per_target_call"] == pytest.approx(1.0)
  assert rows["hf_assisted"]["tokens_per_target_call"] >= 1.0
  assert rows["ours_speculative"]["acceptance_rate"] is not None
  assert rows["ours_greedy"]["generated_tokens"] == rows["hf_greedy"]["generated_tokens"]
  assert results["summary"]["all_greedy_identical_to_hf"] is True
  assert results["config"]["hf_assisted"] == {"num_assistant_tokens": 3,
                                              "num_assistant_tokens_schedule": "constant",
                                              "assistant_confidence_threshold": 0.0}

  paths = hf_compare.write_report(results, str(tmp_path / "out"))
  saved = json.loads(open(paths["json"]).read())
  assert saved["summary"]["all_greedy_identical_to_hf"] is True
  md = open(paths["md"]).read()
  assert "| method | batch | γ | ms/token |" in md
  assert hf_compare.markdown_table(results).count("| yes |") == 4
  assert "| 2 | yes | yes | yes | yes |" in md     # the per-prompt table: 3 prompts


@pytest.mark.slow
def test_failed_method_is_recorded_not_raised(monkeypatch, models):
  target, drafter = models

  def broken(*a, **k):
    raise RuntimeError("cache exploded")
  monkeypatch.setattr(hf_compare.hf, "load_hf_from_dir", broken)
  # same shapes as above: our compiled decoders are reused
  results = hf_compare.compare(target, drafter, _prompts(),
                               hf_compare.CompareSettings(gamma=3, max_new_tokens=8,
                                                          batch_sizes=(), repeats=1,
                                                          progress=False))
  assert "cache exploded" in results["errors"]["hf_target_load"]
  names = {r["name"] for r in results["methods"]}
  assert names == {"ours_greedy", "ours_speculative"}
  assert all(r["identical_to_hf_greedy"] is None for r in results["methods"])
  assert "hf_target_load" in hf_compare.markdown_report(results)
