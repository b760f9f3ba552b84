"""The speculative beam search research scripts (scripts/project_speculative_beam.py).
Self-contained: it reads no fixture of the library's tests/conftest.py."""

import jax
import pytest
from helpers import ragged_tokens
from lab_scripts import load_script

import specdec_jax as sd


@pytest.mark.slow
def test_projection_script_drafters_agree_as_their_noise_says():
  """The projection reads its figure at a drafter's greedy agreement: the target agrees
  with itself on every token, its noised copies less, and zero noise is the target."""
  script = load_script("project_speculative_beam")
  target = sd.init_model(sd.get_config("t5_1_1_tiny"), 1)
  enc = ragged_tokens(3, 6, target.config.vocab_size, seed=4)
  same = jax.tree_util.tree_leaves(script.noised(target, 0.0).params)
  assert all(bool((a == b).all()) for a, b in zip(same, jax.tree_util.tree_leaves(
      target.params), strict=True))
  assert script.greedy_agreement(target, target, enc, 8) == 1.0
  assert script.greedy_agreement(target, script.noised(target, 2.0), enc, 8) < 0.9


@pytest.mark.slow
def test_bench_script_times_the_round_phases_on_the_public_api():
  """scripts/bench_speculative_beam.py times the verify call and the drafted tree alone
  through `experimental.speculative_beam`'s public phases (once `_draft` and `_blocks`)."""
  from specdec_jax import experimental
  script = load_script("bench_speculative_beam")
  target = sd.init_model(sd.get_config("t5_1_1_tiny"), 1)
  enc = ragged_tokens(2, 6, target.config.vocab_size, seed=5)
  method = experimental.SpeculativeBeam(target, num_beams=script.K, gamma=2, chains=8)
  part = script.parts(target, target, enc, method, t=3, repeats=1)
  assert set(part) == {"verify_ms", "draft_ms"}
  assert all(v > 0 for v in part.values())
