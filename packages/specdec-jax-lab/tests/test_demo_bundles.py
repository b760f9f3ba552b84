"""The demo bundles the lab's pipeline trains and the demo distributions ship: trained (the
De->En target reads its input, the LM beats its drafter and a shuffled control, on held-out
pairs) and, bundled, under the package index's file limit. How users get them (names,
shapes, speculative output equal to greedy): the library's tests/test_demo_pair.py,
test_lm_bundled.py, test_demo_large.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DEMO_PAIRS, REPO_DIR

import specdec_jax as sd
from specdec_jax_lab import demo, evaluation
from specdec_jax_lab.training import shift_right


@pytest.fixture(scope="module")
def de_en():
  return sd.load("demo-de-en/target"), sd.load_tokenizer("demo-de-en")


def _nll(model, inputs, targets) -> float:
  """Mean NLL of `targets` [B, T] given `inputs`, teacher-forced as in training."""
  logits = model.forward(inputs, shift_right(targets))
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  ll = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
  mask = targets > 0
  return float(-(ll * mask).sum() / mask.sum())


def test_de_en_target_translates_its_input(de_en):
  """Held-out references are far likelier given the right German input than given
  another pair's (a model that ignores its input, or random weights, fails this)."""
  target, tok = de_en
  inputs = tok.encode([p["de"] for p in DEMO_PAIRS])
  targets = tok.encode([p["en"] for p in DEMO_PAIRS])
  shuffled = inputs[np.random.RandomState(0).permutation(len(DEMO_PAIRS))]
  real, control = _nll(target, inputs, targets), _nll(target, shuffled, targets)
  assert real < control - 0.5, (real, control)


def test_lm_target_is_better_than_its_drafter_and_a_shuffled_control():
  pytest.importorskip("tokenizers")
  target, drafter = sd.load("demo-en-lm/target"), sd.load("demo-en-lm/drafter")
  tok = sd.load_tokenizer("demo-en-lm")
  texts = [p["en"] for p in DEMO_PAIRS]
  tokens = np.asarray(tok.encode(texts[:32], add_eos=True))
  ppl = {name: evaluation.perplexity(m, tokens)["perplexity"]
         for name, m in (("target", target), ("drafter", drafter))}
  # Negative control: the target's weights permuted within each leaf.
  rng = np.random.default_rng(0)
  shuffled = target.replace(params=jax.tree_util.tree_map(
      lambda x: np.asarray(x).reshape(-1)[rng.permutation(x.size)].reshape(x.shape),
      target.params))
  control = evaluation.perplexity(shuffled, tokens)["perplexity"]
  assert ppl["target"] < ppl["drafter"] < control
  assert ppl["target"] < 400, ppl


@pytest.mark.slow
def test_the_large_pairs_wheel_stays_under_the_index_limit():
  """The models specdec-jax-demo's wheel ships, deflate-compressed as a wheel stores them,
  stay under the package index's 100 MB file limit (`demo.MAX_WHEEL_MB`: 5 MB left for the
  code and metadata). (specdec-jax-demo-small's wheel is built and measured in the
  library's tests/test_packaging.py.)"""
  assets = REPO_DIR / "packages" / "specdec-jax-demo" / "specdec_jax_demo" / "assets"
  if not assets.is_dir():
    pytest.skip(f"{assets.relative_to(REPO_DIR)} holds no models yet (the bundle stage "
                "writes them)")
  assert demo.compressed_mb(assets) < demo.MAX_WHEEL_MB
