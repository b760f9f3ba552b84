"""`specdec decode --compare` measures a method against its own baseline (`Method.baseline()`):
speculative beam search against `sd.Beam` of the same beams (beams and scores checked), a
sampled run against the target sampling alike; statistics that do not apply to a method are
not printed for it."""

import json

import pytest
from test_cli import DRAFTER, PROMPTS, TARGET, run

from specdec_jax.runtime import jobs

BEAM = ["--method", "beam", "--num-beams", "2", "--alpha", "0.6", "--max-new-tokens", "6"]


@pytest.fixture()
def decoded(monkeypatch):
  """The runs `--compare` decodes, as (method name, its settings, sampling)."""
  seen = []
  real = jobs.decode_corpus
  def spy(method, *args, **kwargs):
    seen.append((method.kind, method.settings()))
    return real(method, *args, **kwargs)
  monkeypatch.setattr(jobs, "decode_corpus", spy)
  return seen


@pytest.mark.slow
def test_speculative_beam_is_compared_with_sd_beam_of_the_same_beams(capsys, decoded):
  code, out, err = run(capsys, "decode", "--model", TARGET, *BEAM, "--drafter", TARGET,
                       "--gamma", "2", "--compare", "--stats", "--json", *PROMPTS)
  assert code == 0, err
  compare = json.loads(out)["timing"]["compare"]
  assert compare["baseline"] == "sd.Beam" and compare["same_beams"] is True
  baselines = [s for kind, s in decoded if kind == "beam"]
  assert baselines and all(s["num_beams"] == 2 and s["alpha"] == 0.6 for s in baselines)
  assert not any(kind == "autoregressive" for kind, _ in decoded)
  assert "sd.Beam" in err and "same beams and scores: yes" in err
  # a beam method's statistics: its steps per call, no tokens per target call
  assert "beam steps/call" in err and "tokens/target call" not in err


@pytest.mark.slow
def test_a_sampled_run_is_compared_with_the_target_sampling_alike(capsys, decoded):
  code, out, err = run(capsys, "decode", "--model", TARGET, "--drafter", DRAFTER, "--gamma",
                       "2", "--max-new-tokens", "6", "--sampling", "sample", "--temperature",
                       "0.7", "--compare", "--json", *PROMPTS)
  assert code == 0, err
  sampling = {s["sampling"] for _, s in decoded}
  assert len(sampling) == 1 and "0.7" in sampling.pop()
  assert json.loads(out)["timing"]["compare"]["baseline"] == "target alone"
  assert "sampled with the same settings" in err and "same tokens: NO" not in err
