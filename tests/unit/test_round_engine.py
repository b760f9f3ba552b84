"""The round engine on table models (`specdec_jax.testing`): every wiring's greedy output is
the target's greedy output from a host loop, the counters of a scripted run are the
documented ones, BiLD is Algorithm 1, and speculative sampling keeps the target's law."""

import jax
import numpy as np
import pytest
from scipy import stats as scipy_stats

import specdec_jax as sd
from specdec_jax import testing
from specdec_jax.drafters import NoProposals
from specdec_jax.methods import autoregressive, bild, speculative
from specdec_jax.rounds import engine, stats

pytestmark = pytest.mark.unit

V, T, GAMMA, EOS = 8, 7, 3, 1
# Token 7 in a row's input forbids EOS (row 0 decodes all T tokens); token 6 favours it.
ENC = np.array([[7, 2, 1], [3, 4, 1], [6, 5, 1], [2, 3, 1]], np.int32)


def make_target(seed=0):
  rng = np.random.default_rng(seed)
  inputs = rng.normal(size=(V, V)).astype(np.float32)
  inputs[7, EOS], inputs[6, EOS] = -100.0, 3.0
  return testing.TableModel(next_logits=2.0 * rng.normal(size=(V, V)).astype(np.float32),
                            # strong enough that a position off by one changes tokens
                            position_logits=2.0 * rng.normal(size=(T + GAMMA + 1, V)).astype(
                                np.float32),
                            input_logits=inputs, eos_id=EOS)


@pytest.fixture(scope="module")
def target():
  return make_target()


@pytest.fixture(scope="module")
def reference(target):
  tokens, lengths = testing.reference_greedy(target, ENC, T)
  assert lengths[0] == T and EOS not in tokens[0]
  assert min(lengths) < T          # a row stops at EOS: the zeros after it are checked
  return tokens, lengths


def softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def assert_output(out, reference):
  np.testing.assert_array_equal(out.tokens, reference[0])     # 0 after EOS included
  np.testing.assert_array_equal(out.lengths, reference[1])


def run(target, proposer, config, enc=ENC, seed=0):
  return engine.run(target, proposer, enc, None, jax.random.key(seed), config=config)


def test_baseline_is_the_host_loop(target, reference):
  out = run(target, NoProposals(V), autoregressive.round_config(T, None, EOS))
  assert_output(out, reference)
  # engine.run directly: every statistic (sd.decode shows the method value's own)
  assert out.stats["tokens_per_target_call"] == 1.0 and out.stats["drafted"] == 0


def test_speculative_greedy_equals_autoregressive_greedy(target, reference):
  rng = np.random.default_rng(1)
  close = np.asarray(target.next_logits) + rng.normal(size=(V, V)).astype(np.float32)
  out = run(target, speculative.proposer(testing.table_drafter(close), target, GAMMA),
            speculative.round_config(GAMMA, T, None, EOS))
  assert_output(out, reference)
  s = out.stats
  assert 0 < s["accepted"] < s["drafted"]          # some drafts kept, some rejected
  assert s["tokens_per_target_call"] > 1.0
  assert s["drafter_tokens"] + s["target_tokens"] == s["tokens"] == reference[1].sum()


def test_scripted_rounds_give_the_documented_counters(target, reference):
  """The worked example of `rounds.stats` (row 0): drafts a b c, the target keeps a b
  and corrects c; then d e f all kept, plus a bonus token."""
  script = reference[0].copy()
  script[0, 2] = (script[0, 2] + 1) % V                 # c is wrong
  script[1, 0] = (script[1, 0] + 1) % V                 # row 1: its first draft is wrong
  out = run(target, testing.ScriptedProposer(script, vocab_size=V),
            speculative.round_config(GAMMA, T, None, EOS))
  assert_output(out, reference)
  row = stats.summarize(out.counters, raw=True)
  want = dict(target_calls=2, drafter_calls=6, drafted=6, accepted=5, rejections=1,
              emitted=7, drafter_tokens=5, target_tokens=2, beta_sum=5.0, beta_count=6)
  for name, value in want.items():
    assert float(row[f"{name}_per_row"][0]) == value, name
  np.testing.assert_array_equal(out.counters.per_position_accepted[0], [2, 2, 1])
  assert float(row["acceptance_rate_per_row"][0]) == pytest.approx(5 / 6)
  assert float(row["tokens_per_target_call_per_row"][0]) == 3.5
  assert float(row["log_prob_per_row"][0]) == 0.0      # greedy: every token the argmax
  assert int(out.counters.rounds) >= 2 and int(out.counters.rejections[1]) >= 1


def reference_bild(large, small_logits, enc_row, fallback, rollback, max_small):
  """Algorithm 1 of Kim et al. for one row, on tables: the small model proposes while
  max p_S > fallback (at most max_small in a row), the large one verifies, rolling back at
  the first token with -log p_L > rollback."""
  context = np.asarray(large.start(enc_row[None], 0).context)[0]
  nxt, pos = np.asarray(large.next_logits), np.asarray(large.position_logits)

  def large_logits(prefix, i):
    return nxt[prefix[i]] + context + pos[min(i, len(pos) - 1)]

  y, unverified, consecutive = [], 0, 0
  while len(y) < T and (not y or y[-1] != EOS):
    p_s = softmax(small_logits[([0] + y)[-1]])
    if p_s.max() > fallback and consecutive < max_small:
      y.append(int(p_s.argmax()))
      unverified, consecutive = unverified + 1, consecutive + 1
      continue
    prefix = [0] + y
    start = len(y) - unverified
    bad = [i for i in range(start, len(y))
           if -np.log(softmax(large_logits(prefix, i))[y[i]]) > rollback]
    if bad:
      y = y[:bad[0]] + [int(large_logits(prefix, bad[0]).argmax())]
    else:
      y.append(int(large_logits(prefix, len(y)).argmax()))
    unverified = consecutive = 0
  return y[:T]


def test_bild_is_algorithm_1_row_by_row(target):
  rng = np.random.default_rng(2)
  small = (np.asarray(target.next_logits) + 1.5 * rng.normal(size=(V, V))).astype(np.float32)
  fallback, rollback, steps = 0.5, 1.5, 3
  out = run(target, bild.proposer(testing.table_drafter(small), target, fallback),
            bild.round_config(fallback, rollback, steps, T, None, EOS))
  for b in range(len(ENC)):
    want = reference_bild(target, small, ENC[b], fallback, rollback, steps)
    got = np.asarray(out.tokens)[b, :int(out.lengths[b])].tolist()
    assert got == want, b
  s = out.stats
  assert s["fallbacks"] > 0 and s["rejections"] > 0     # both policies fired
  assert s["lossy"] is True


def sequence_probs(target, enc_row):
  """Exact probabilities [V * V] of the target's first two tokens (EOS off)."""
  context = np.asarray(target.start(enc_row[None], 0).context)[0]
  nxt, pos = np.asarray(target.next_logits), np.asarray(target.position_logits)
  first = softmax(nxt[0] + context + pos[0])
  second = softmax(nxt + context + pos[1])                   # [first token, V]
  return (first[:, None] * second).ravel()


def gof_pvalue(pairs, probs):
  """Chi-square p-value of the observed pairs [n, 2] against probs [V * V], bins whose
  expected count is under 5 pooled."""
  counts = np.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V)
  expected = np.asarray(probs, np.float64) * len(pairs)
  small = expected < 5
  obs = np.append(counts[~small], counts[small].sum())
  exp = np.append(expected[~small], expected[small].sum())
  return float(scipy_stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.mark.parametrize("lenience, exact", [(1.0, True), (0.2, False)],
                         ids=["exact", "lenient-negative-control"])
def test_speculative_sampling_keeps_the_targets_distribution(lenience, exact):
  """Two tokens of 4,000 rows with one input against their exact law; the lossy lenient
  rule (a wrong rule for exactness) must fail the same test."""
  target = make_target(3).replace(position_logits=np.zeros((T + GAMMA + 1, V), np.float32))
  rows = 4000
  enc = np.tile(ENC[1], (rows, 1))
  drafter = testing.table_drafter(np.zeros((V, V), np.float32))      # a uniform q
  config = speculative.round_config(2, 2, sd.Sampling(), -1, lenience=lenience)
  out = run(target, speculative.proposer(drafter, target, 2), config, enc, seed=5)
  pairs = np.asarray(out.tokens)
  assert np.all(np.asarray(out.lengths) == 2)
  p = gof_pvalue(pairs, sequence_probs(target, ENC[1]))
  assert (p > 1e-3) if exact else (p < 1e-8)
  assert out.stats["lossy"] is (not exact)
