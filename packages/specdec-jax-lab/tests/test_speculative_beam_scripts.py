"""The speculative beam search research scripts (scripts/project_speculative_beam.py).
Self-contained: it reads no fixture of the library's tests/conftest.py."""

import importlib.util
import pathlib
import sys

import jax
import numpy as np
import pytest

import specdec_jax as sd

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
  """scripts/NAME.py as a module."""
  spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


def ragged_tokens(batch: int, length: int, vocab: int, seed: int) -> np.ndarray:
  """Random encoder inputs [B, L], rows of different lengths, EOS-terminated, 0-padded."""
  rng = np.random.default_rng(seed)
  tokens = np.zeros((batch, length), np.int32)
  for b in range(batch):
    n = length - (b * 3) % (length - 2)
    tokens[b, :n - 1] = rng.integers(2, vocab, n - 1)
    tokens[b, n - 1] = 1
  return tokens


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
