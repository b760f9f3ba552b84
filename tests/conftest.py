"""Shared fixtures: the T5X-written tiny model and small random model pairs."""

import gc
import json
import pathlib

import jax
import numpy as np
import pytest
from flax import traverse_util

import specdec_jax as sd

FIXTURE_DIR = pathlib.Path(__file__).parent / "fixtures" / "t5x_tiny_v1_1"


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drop JAX's compiled programs after each test module.

  Every XLA:CPU executable keeps its JIT-compiled code in a few hundred memory
  mappings until it is freed. The suite compiles well over a thousand programs in
  one process, which would pass the kernel's vm.max_map_count (65,530 by default);
  LLVM then fails to map the next program and the process aborts or segfaults inside
  a compile (seen in CI at about 60% of the suite). Modules share no compiled state.
  """
  yield
  jax.clear_caches()
  gc.collect()


@pytest.fixture(scope="session")
def t5x_reference():
  """reference.npz written by the real T5X code (see fixtures/t5x_tiny_v1_1/README.md)."""
  return dict(np.load(FIXTURE_DIR / "reference.npz"))


@pytest.fixture(scope="session")
def t5x_model(t5x_reference):
  """The fixture's params wrapped as our Model (independent of the checkpoint loaders)."""
  params = traverse_util.unflatten_dict(
      {tuple(k.split("/")): v for k, v in t5x_reference.items() if "/" in k})
  config = sd.T5Config.from_dict(json.loads((FIXTURE_DIR / "config.json").read_text()))
  return sd.Model(config=config, params=params)


def peaked(model: sd.Model, scale: float = 6.0, eos_boost: float = 2.0) -> sd.Model:
  """Sharpen a random model's output distribution and make EOS win sometimes."""
  params = jax.tree_util.tree_map(lambda x: x, model.params)
  kernel = params["decoder"]["logits_dense"]["kernel"] * scale
  params["decoder"]["logits_dense"]["kernel"] = kernel.at[:, 1].multiply(eos_boost)
  return model.replace(params=params)


def perturbed(model: sd.Model, noise: float, seed: int) -> sd.Model:
  """A drafter that agrees with `model` often but not always."""
  leaves, tree = jax.tree_util.tree_flatten(model.params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  leaves = [x + noise * jax.numpy.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return model.replace(params=jax.tree_util.tree_unflatten(tree, leaves))


def ragged_tokens(batch: int, length: int, vocab: int, seed: int = 0) -> np.ndarray:
  """Random encoder inputs [B, L] with different lengths per row, EOS-terminated, 0-padded."""
  rng = np.random.RandomState(seed)
  tokens = np.zeros((batch, length), np.int32)
  for b in range(batch):
    n = length - (b * 3) % (length - 2)
    tokens[b, :n - 1] = rng.randint(2, vocab, n - 1)
    tokens[b, n - 1] = 1
  return tokens
