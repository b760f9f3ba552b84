"""Exactness by construction: greedy output of every method is bitwise the baseline's.

A k-token verify call and a 1-token step can round differently (other product
shapes, bfloat16 activations, TF32 on GPUs); exact mode gives every target call the
same width and every method the same cache capacity, so a position's numerics never
depend on the call that computed it.
"""

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from helpers import perturbed, ragged_tokens

import specdec_jax as sd

MAX_NEW = 14


@struct.dataclass
class WidthRounding(sd.Model):
  """A target whose logits move with the number of tokens its decode call carries.

  Emulates an accelerator whose products round differently for different shapes:
  the same position gets logits + scale * (k - 1) * pattern when computed in a
  k-token call. Forward passes are untouched.
  """

  scale: float = struct.field(pytree_node=False, default=0.0)

  @property
  def width_invariant_decode(self) -> bool:
    return False          # by construction, whatever its products run on

  def decode_with_hidden(self, tokens, cache, *, positions=None, visible=None):
    logits, hidden, cache = super().decode_with_hidden(tokens, cache, positions=positions,
                                                       visible=visible)
    k = tokens.shape[1]
    pattern = jnp.sin(jnp.arange(logits.shape[-1], dtype=jnp.float32) * 0.37 + k)
    return logits + self.scale * (k - 1) * pattern, hidden, cache


@pytest.fixture(scope="module")
def target():
  base = sd.init_model(sd.get_config("t5_1_1_tiny"), 1)
  return WidthRounding(config=base.config, params=base.params, scale=0.02)


@pytest.fixture(scope="module")
def enc():
  return ragged_tokens(8, 12, 512, seed=4)


def _methods(target):
  heads = sd.init_heads(target, 4, rng=1, init_scale=1.0)
  drafter = perturbed(target, 0.05, seed=0)
  return {
      "speculative g1": lambda enc, exact: sd.speculative_generate(
          target, drafter, enc, gamma=1, max_new_tokens=MAX_NEW, exact=exact),
      "speculative g4": lambda enc, exact: sd.speculative_generate(
          target, drafter, enc, gamma=4, max_new_tokens=MAX_NEW, exact=exact),
      "speculative adaptive": lambda enc, exact: sd.speculative_generate(
          target, drafter, enc, gamma=6, max_new_tokens=MAX_NEW, exact=exact, adaptive=True),
      "bild fallback 1.0": lambda enc, exact: sd.bild_generate(
          target, drafter, enc, fallback_threshold=1.0, max_new_tokens=MAX_NEW, exact=exact),
      "blockwise parallel": lambda enc, exact: sd.blockwise_generate(
          target, heads, enc, max_new_tokens=MAX_NEW, top_k=2, num_drafts=3, exact=exact),
  }


@pytest.mark.slow
def test_exact_mode_survives_call_shape_rounding_and_the_naive_path_does_not(target, enc):
  exact_base = sd.generate(target, enc, MAX_NEW)                       # exact by default
  naive_base = sd.generate(target, enc, MAX_NEW, exact=False)
  assert exact_base.stats["exact"] and not naive_base.stats["exact"]
  flipped = 0
  for name, run in _methods(target).items():
    exact = run(enc, None)
    assert exact.stats["exact"], name
    np.testing.assert_array_equal(exact.tokens, exact_base.tokens, err_msg=name)
    np.testing.assert_array_equal(exact.lengths, exact_base.lengths, err_msg=name)
    naive = run(enc, False)
    flipped += int(np.any(np.asarray(naive.tokens) != np.asarray(naive_base.tokens)))
  # Negative control: without exact mode, the same rounding changes greedy outputs.
  assert flipped >= 3, flipped


def test_exact_mode_needs_the_round_to_fit(target, enc):
  drafter = perturbed(target, 0.05, seed=0)
  with pytest.raises(sd.InputError, match="exact mode verifies at most 15 proposals"):
    sd.speculative_generate(target, drafter, enc, gamma=16, max_new_tokens=4, exact=True)
  out = sd.speculative_generate(target, drafter, enc, gamma=16, max_new_tokens=4)
  assert not out.stats["exact"]             # the default falls back, and says so


# ----------------------------------------------------------------------------- demo pair, bf16

PAIRS = [json.loads(line) for line in
         (pathlib.Path(__file__).parent / "data" / "demo_test_pairs.jsonl")
         .read_text().splitlines()]


@pytest.fixture(scope="module")
def demo_bf16():
  tok = sd.load_tokenizer("demo-de-en")
  target = sd.load("demo-de-en/target", dtype="bfloat16")
  drafter = sd.load("demo-de-en/drafter", dtype="bfloat16")
  enc = np.asarray(tok.encode([p["de"] for p in PAIRS]))
  refs = [t[t > 0] for t in np.asarray(tok.encode([p["en"] for p in PAIRS]))]
  drafters = {"model": drafter, "ngram": sd.NGramDrafter.fit(refs, target.config.vocab_size),
              "prompt-lookup": sd.PromptLookupDrafter(target.config.vocab_size)}
  return target, drafters, enc


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_demo_pair_bf16_speculative_equals_baseline(demo_bf16, batch):
  """bfloat16 params and activations: every held-out sentence, every drafter; the model
  drafter at gamma 1..8 (batch 1) or 1, 2, 4, 8 (batch 8), the table drafters at 2 and 8
  (each gamma is its own compiled program)."""
  target, drafters, enc = demo_bf16
  assert target.config.dtype == "bfloat16"
  rows = slice(None) if batch == 8 else slice(0, 16)      # batch 1: the first 16 sentences
  enc = enc[rows]
  base = np.concatenate([np.asarray(sd.generate(target, enc[i:i + batch], 20).tokens)
                         for i in range(0, len(enc), batch)])
  for name, drafter in drafters.items():
    gammas = (range(1, 9) if batch == 1 else (1, 2, 4, 8)) if name == "model" else (2, 8)
    for gamma in gammas:
      spec = np.concatenate([np.asarray(sd.speculative_generate(
          target, drafter, enc[i:i + batch], gamma=gamma, max_new_tokens=20).tokens)
                             for i in range(0, len(enc), batch)])
      np.testing.assert_array_equal(spec, base, err_msg=f"{name} gamma {gamma}")
