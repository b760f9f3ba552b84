"""Exactness by construction: greedy output of every method is bitwise its baseline's.

A k-token verify call and a 1-token step can round differently (other product
shapes, bfloat16 activations, TF32 on GPUs); exact mode gives every target call the
same width and every method the same cache capacity, so a position's numerics never
depend on the call that computed it.

The factor test of exactness on XLA: every method of the registry
(`specdec_jax.testing.examples`, one configured value per method type) on a tiny
T5 (float32) and a tiny decoder-only LM (bfloat16), ragged inputs, rows ending at EOS and
at the cap, and a target whose logits move with its call's width (`WidthRounding`: the
near ties flip); its negative control: without exact mode, the same rounding changes
greedy outputs.
"""

import dataclasses
import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from helpers import METHOD_NAMES, assert_same_output, peaked, perturbed, ragged_tokens

import specdec_jax as sd
from specdec_jax import testing

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

  def _rounded(self, logits, k: int):
    pattern = jnp.sin(jnp.arange(logits.shape[-1], dtype=jnp.float32) * 0.37 + k)
    return logits + self.scale * (k - 1) * pattern

  def decode_with_hidden(self, tokens, cache, *, positions=None, visible=None):
    """The round engine's calls."""
    logits, hidden, cache = super().decode_with_hidden(tokens, cache, positions=positions,
                                                       visible=visible)
    return self._rounded(logits, tokens.shape[1]), hidden, cache

  def decode(self, tokens, cache, *, exit_layer=None):
    """The beam methods' calls (and an early exit's)."""
    logits, cache = super().decode(tokens, cache, exit_layer=exit_layer)
    return self._rounded(logits, tokens.shape[1]), cache


#: The two families: (config, dtype, WidthRounding's scale: enough for near ties to flip);
#: each `peaked` (4, 2) so that EOS ends some rows.
FAMILIES = {"t5": ("t5_1_1_tiny", "float32", 0.02), "lm": ("llama_tiny", "bfloat16", 0.1)}


@pytest.fixture(scope="module", params=list(FAMILIES))
def case(request):
  """(family, WidthRounding target, its registry of methods, ragged inputs, baselines):
  the drafter a perturbed copy of the target; baselines are computed once per value."""
  name, dtype, scale = FAMILIES[request.param]
  base = peaked(sd.init_model(sd.get_config(name), 1), 4.0, 2.0).with_dtype(dtype)
  target = WidthRounding(config=base.config, params=base.params, scale=scale)
  drafter = perturbed(base, 0.05, seed=0)
  heads = sd.init_heads(base, 4, rng=1, init_scale=1.0)
  enc = ragged_tokens(8, 12, target.vocab_size, seed=4)
  return request.param, target, testing.examples(target, drafter, heads), enc, {}


def _decode(case, method):
  _, target, _, enc, _ = case
  return sd.decode(target, method, enc, MAX_NEW)


def _baseline(case, base):
  """The output of the baseline value `base`, decoded once per module and family."""
  found = case[4]
  if base not in found:
    found[base] = _decode(case, base)
  return found[base]


def test_the_baseline_rows_are_ragged(case):
  """What exactness must survive: rows ending at EOS at different steps, and at the cap."""
  lengths = np.asarray(_baseline(case, sd.Autoregressive()).lengths)
  assert len(set(lengths.tolist())) >= 3 and (lengths == MAX_NEW).any(), lengths


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_every_method_is_exact_under_call_shape_rounding(case, name):
  """In exact mode the method's greedy tokens and lengths (a beam method's beams) are
  bitwise its baseline's (`helpers.assert_same_output`)."""
  method = case[2][name]
  out, base = _decode(case, method), _baseline(case, method.baseline())
  assert out.stats.get("exact", True), name
  assert_same_output(out, base, name)


@pytest.mark.slow
def test_without_exact_mode_the_rounding_changes_outputs(case):
  """Negative control: the same methods with exact=False (calls at their natural widths)
  differ from their baselines' exact=False output, for several methods (three: the
  search stops there)."""
  flipped = []
  for name, method in case[2].items():
    if len(flipped) == 3:
      break
    naive = dataclasses.replace(method, exact=False)
    base = dataclasses.replace(method.baseline(), exact=False)
    if naive == base:
      continue                    # a baseline of its own: nothing to compare
    try:
      assert_same_output(_decode(case, naive), _baseline(case, base), name)
    except AssertionError:
      flipped.append(name)
  assert len(flipped) >= 3, flipped


def test_exact_mode_needs_the_round_to_fit():
  target = sd.init_model(sd.get_config("t5_1_1_tiny"), 1)
  drafter, enc = perturbed(target, 0.05, seed=0), ragged_tokens(8, 12, 512, seed=4)
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
  return target, drafter, enc


@pytest.mark.slow
def test_demo_pair_bf16_speculative_equals_baseline(demo_bf16):
  """The real models' smoke: bfloat16 params and activations, every held-out sentence in
  batches of 8, the model drafter at gamma 8 (each gamma and drafter is its own compiled
  program; their exactness is the every-method test's and tests/test_speculative.py's)."""
  target, drafter, enc = demo_bf16
  assert target.config.dtype == "bfloat16"
  batch = 8
  base = np.concatenate([np.asarray(sd.generate(target, enc[i:i + batch], 20).tokens)
                         for i in range(0, len(enc), batch)])
  spec = np.concatenate([np.asarray(sd.speculative_generate(
      target, drafter, enc[i:i + batch], gamma=8, max_new_tokens=20).tokens)
                         for i in range(0, len(enc), batch)])
  np.testing.assert_array_equal(spec, base)
