"""BiLD: Algorithm 1 against a plain reference, batching, limits, early exit, errors."""

import math

import jax
import numpy as np
import pytest
from helpers import compiles, model_fixtures, ragged_tokens

import specdec_jax as sd

MAX_NEW = 12
EOS = 1


# The small model agrees with the large one often but not always: both policies fire.
large, small = model_fixtures(4.0, 2.5, target="large", drafter="small")


def reference_bild(large, small_logits, enc, fallback, rollback, max_small, max_new, eos=EOS):
  """Algorithm 1 of Kim et al., one row, full non-cached forward passes.

  small_logits(enc, dec_in) -> logits [Ld, V] of the small model. Returns
  (tokens, fallbacks, rollbacks): the tokens until EOS (kept) or max_new. Each pass reads
  a decoder input of one length, max_new + 1 (the prefix, then pad 0): the decoder is
  causal, so a position's logits are its prefix's, and each model compiles once.
  """
  y, unverified, consecutive, fallbacks, rollbacks = [], 0, 0, 0, 0
  padded = lambda y: np.array([[0] + y + [0] * (max_new - len(y))])   # [1, max_new + 1]
  while len(y) < max_new and (not y or y[-1] != eos):
    p_s = np.asarray(jax.nn.softmax(small_logits(enc, padded(y))[len(y)]))
    if p_s.max() > fallback and consecutive < max_small:
      y.append(int(p_s.argmax()))                   # the small model's prediction
      unverified, consecutive = unverified + 1, consecutive + 1
      continue
    fallbacks += p_s.max() <= fallback
    logits = np.asarray(large.forward(enc, padded(y))[0])                 # [max_new+1, V]
    log_p = np.asarray(jax.nn.log_softmax(logits, -1))
    start = len(y) - unverified
    bad = [i for i in range(start, len(y)) if -log_p[i, y[i]] > rollback]
    if bad:                                          # roll back to the first bad token
      y = y[:bad[0]] + [int(logits[bad[0]].argmax())]
      rollbacks += 1
    else:
      y.append(int(logits[len(y)].argmax()))
    unverified = consecutive = 0
  return y[:max_new], fallbacks, rollbacks


def _row(out, b=0):
  return np.asarray(out.tokens)[b, :int(out.lengths[b])].tolist()


def _model_logits(model):
  return lambda enc, dec: model.forward(enc, dec)[0]


@pytest.mark.slow
@pytest.mark.parametrize("fallback,rollback", [(0.3, 2.0)])
def test_batch_one_is_algorithm_1(large, small, fallback, rollback):
  counts = np.zeros(2)
  for seed in range(4):
    enc = ragged_tokens(1, 10, 512, seed=seed)
    want, fb, rb = reference_bild(large, _model_logits(small), enc, fallback, rollback, 10,
                                  MAX_NEW)
    out = sd.bild_generate(large, small, enc, fallback_threshold=fallback,
                           rollback_threshold=rollback, max_new_tokens=MAX_NEW)
    assert _row(out) == want, (seed, _row(out), want)
    assert int(out.stats["fallbacks"]) == fb and int(out.stats["rejections"]) == rb
    counts += (fb, rb)
  assert counts[0] > 0 and counts[1] > 0, counts      # both policies fired


@pytest.mark.slow
def test_small_step_cap_hands_over(large, small):
  """max_small_steps=2 with a small model that is always confident (threshold 0)."""
  enc = ragged_tokens(1, 10, 512, seed=5)
  want, fb, _ = reference_bild(large, _model_logits(small), enc, 0.0, 2.0, 2, MAX_NEW)
  out = sd.bild_generate(large, small, enc, fallback_threshold=0.0, rollback_threshold=2.0,
                         max_small_steps=2, max_new_tokens=MAX_NEW)
  assert _row(out) == want and fb == 0 == int(out.stats["fallbacks"])
  s = out.stats
  # Every large call verified at most two small tokens.
  assert int(s["drafted"]) <= 2 * int(s["target_calls"]) + 2


@pytest.mark.slow
def test_ragged_rows_equal_rows_alone_and_sync_cuts_small_runs(large, small):
  """The wait policy: each row of a ragged batch (EOS at different steps) is the row
  decoded alone, its large calls too. The sync policy equals wait at batch one, and at
  batch six verifies confident rows early."""
  enc = ragged_tokens(6, 12, 512, seed=7)
  kwargs = dict(fallback_threshold=0.3, rollback_threshold=1.5, max_new_tokens=MAX_NEW)
  wait = sd.bild_generate(large, small, enc, **kwargs)
  lengths = np.asarray(wait.lengths)
  assert len(set(lengths.tolist())) >= 3 and (lengths < MAX_NEW).any()  # EOS at different times
  per_row = np.asarray(wait.counters.target_calls)
  for b in range(enc.shape[0]):
    alone = sd.bild_generate(large, small, enc[b:b + 1], **kwargs)
    assert _row(wait, b) == _row(alone)
    assert per_row[b] == int(alone.stats["target_calls"])    # per-row large calls too
    if b < 2:
      sync = sd.bild_generate(large, small, enc[b:b + 1], batch_policy="sync", **kwargs)
      assert _row(alone) == _row(sync)
  sync = sd.bild_generate(large, small, enc, batch_policy="sync", **kwargs)
  # Sync verifies confident rows early: more large calls, fewer small tokens per call.
  assert int(sync.stats["target_calls"]) > int(wait.stats["target_calls"])
  assert int(sync.stats["drafter_calls"]) < int(wait.stats["drafter_calls"])
  assert (float(sync.stats["drafted"]) / float(sync.stats["target_calls"])
          < float(wait.stats["drafted"]) / float(wait.stats["target_calls"]))


def test_fallback_one_is_the_large_models_greedy_output(large, small):
  enc = ragged_tokens(5, 12, 512, seed=2)
  out = sd.bild_generate(large, small, enc, fallback_threshold=1.0, max_new_tokens=MAX_NEW)
  base = sd.generate(large, enc, max_new_tokens=MAX_NEW)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  assert int(out.stats["drafter_tokens"]) == 0
  assert float(out.stats["tokens_per_target_call"]) == 1.0
  assert out.stats["lossy"] is False          # the one threshold that is exact, and says so


@pytest.mark.slow
def test_fallback_zero_without_rollback_is_the_small_models_greedy_output(large, small):
  enc = ragged_tokens(5, 12, 512, seed=2)
  out = sd.bild_generate(large, small, enc, fallback_threshold=0.0,
                         rollback_threshold=math.inf, max_small_steps=MAX_NEW,
                         max_new_tokens=MAX_NEW)
  base = sd.generate(small, enc, max_new_tokens=MAX_NEW)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  # Every sentence ended under the small model's control: the large model never ran.
  assert int(out.stats["rounds"]) == 0 and int(out.stats["target_tokens"]) == 0


@pytest.mark.slow
def test_early_exit_is_algorithm_1_with_the_first_layer(large):
  """The small model is the large model's layer-1 exit, drafting in the large model's cache.

  The reference reads the exit with full forward passes; equality shows that the verify
  call filled the skipped layer's buffers for the drafted positions.
  """
  # jitted: `exit_logits` run op by op would compile every op for itself
  read = jax.jit(lambda model, enc, dec: model.exit_logits(enc, dec, (1,))[0][0])
  exit_logits = lambda enc, dec: read(large, enc, dec)
  counts = np.zeros(2)
  for seed, (fallback, rollback) in enumerate([(0.05, 3.0), (0.1, 6.0), (0.02, 2.0)]):
    enc = ragged_tokens(1, 10, 512, seed=seed)
    want, fb, rb = reference_bild(large, exit_logits, enc, fallback, rollback, 10, MAX_NEW)
    out = sd.bild_generate(large, sd.early_exit(large, 1), enc, fallback_threshold=fallback,
                           rollback_threshold=rollback, max_new_tokens=MAX_NEW)
    assert _row(out) == want, (seed, _row(out), want)
    counts += (fb + int(out.stats["drafter_tokens"] > 0), rb)
  assert counts[0] > 0 and counts[1] > 0, counts


@pytest.mark.slow
def test_sampling_is_lossy_labelled_and_in_bounds(large, small):
  enc = ragged_tokens(6, 12, 512, seed=4)
  out = sd.bild_generate(large, small, enc, fallback_threshold=0.5, rollback_threshold=2.0,
                         max_new_tokens=MAX_NEW, sampling=sd.Sampling(top_p=0.8),
                         rng=jax.random.PRNGKey(1))
  assert bool(out.stats["lossy"]) and out.stats["method"] == "bild"
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  for b in range(tokens.shape[0]):
    row = tokens[b, :lengths[b]]
    assert np.all(tokens[b, lengths[b]:] == 0) and not np.any(row[:-1] == EOS)
    assert lengths[b] == MAX_NEW or row[-1] == EOS
  other = sd.bild_generate(large, small, enc, fallback_threshold=0.5, rollback_threshold=2.0,
                           max_new_tokens=MAX_NEW, sampling=sd.Sampling(top_p=0.8),
                           rng=jax.random.PRNGKey(2))
  assert not np.array_equal(np.asarray(other.tokens), tokens)   # the key matters


@pytest.mark.slow
@pytest.mark.parametrize("fallback, sampled_by", [(1.0, "large"), (0.0, "small")])
def test_sampling_draws_each_token_from_the_model_that_decides_it(large, small, fallback,
                                                                  sampled_by):
  """First tokens of 4,000 copies of one prompt against the nucleus distributions.

  fallback 1: the large model decides every token; fallback 0 with no rollback: the small
  one. The other model's distribution is the negative control: it must be farther away.
  """
  from specdec_jax import sampling as sampling_lib
  method = sd.Sampling(top_p=0.8)
  prompt = ragged_tokens(1, 12, 512, seed=5)
  enc = np.repeat(prompt, 4000, axis=0)
  out = sd.bild_generate(large, small, enc, fallback_threshold=fallback,
                         rollback_threshold=math.inf, max_small_steps=4, max_new_tokens=1,
                         sampling=method, rng=jax.random.PRNGKey(7))
  freq = np.bincount(np.asarray(out.tokens)[:, 0], minlength=512) / len(enc)
  dist = {name: np.asarray(sampling_lib.probs(
      m.forward(prompt, np.zeros((1, 1), np.int32))[0, 0], method))
      for name, m in (("large", large), ("small", small))}
  tv = {name: 0.5 * np.abs(freq - p).sum() for name, p in dist.items()}
  other = "small" if sampled_by == "large" else "large"
  assert 0.5 * np.abs(dist["large"] - dist["small"]).sum() > 0.15   # the control can fail
  assert tv[sampled_by] < 0.05 and tv[other] > tv[sampled_by] + 0.1, tv


@pytest.mark.slow
def test_no_recompilation_for_new_prompt_contents(large, small):
  kwargs = dict(fallback_threshold=0.5, rollback_threshold=2.0, max_new_tokens=6)
  sd.bild_generate(large, small, ragged_tokens(2, 9, 512, seed=0), **kwargs)
  with compiles() as programs:
    for seed in (1, 2):
      sd.bild_generate(large, small, ragged_tokens(2, 9, 512, seed=seed), **kwargs)
  assert programs == []


@pytest.mark.slow
def test_bad_settings_give_clear_errors(large, small):
  enc = ragged_tokens(2, 9, 512, seed=0)
  for kwargs, message in [
      (dict(fallback_threshold=1.5), "fallback_threshold must be in \\[0, 1\\]"),
      (dict(fallback_threshold=-0.1), "fallback_threshold must be in \\[0, 1\\]"),
      (dict(rollback_threshold=0.0), "rollback_threshold must be > 0"),
      (dict(rollback_threshold=float("nan")), "rollback_threshold must be > 0"),
      (dict(max_small_steps=0), "max_small_steps must be an integer >= 1"),
      (dict(batch_policy="eager"), "batch_policy must be one of"),
  ]:
    with pytest.raises(sd.SpecdecError, match=message):
      sd.bild_generate(large, small, enc, **kwargs)
  other_vocab = sd.init_model(sd.get_config("t5_1_1_tiny_drafter").replace(vocab_size=300), 0)
  with pytest.raises(sd.InputError, match="vocabulary mismatch.*300.*512"):
    sd.bild_generate(large, other_vocab, enc)
  with pytest.raises(sd.InputError, match="exit_layer must be an integer in \\[1, 1\\]"):
    sd.early_exit(large, 2)
