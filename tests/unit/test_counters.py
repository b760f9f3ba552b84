"""The statistics counters: a round's counts (EOS inside accepted drafts), the readable summary
as ratios of totals, merging calls exactly, the longest run of repeated drafts."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import testing
from specdec_jax.rounds import engine, stats
from specdec_jax.rounds.phases import Acceptance, Verified
from specdec_jax.rounds.stats import DecodeStats

pytestmark = pytest.mark.unit


def counters(**rows):
  """DecodeStats of len(rows[...]) rows, the named counters set (others 0), G = 2."""
  batch = len(next(iter(rows.values())))
  s = DecodeStats.zeros(batch, 2)
  return s.replace(**{k: jnp.asarray(v) for k, v in rows.items()})


def test_summary_is_ratios_of_totals_plus_info():
  s = counters(target_calls=[2, 8], drafted=[6, 10], accepted=[5, 1], emitted=[7, 9],
               drafter_tokens=[5, 1], beta_sum=jnp.array([5.0, 1.0]), beta_count=[6, 10],
               per_position_accepted=jnp.array([[2, 2], [1, 0]]), fallbacks=[0, 3])
  s = s.replace(rounds=jnp.array(8))
  out = stats.summarize(s, {"gamma": 3})     # no method named: every statistic
  assert (out["rows"], out["tokens"], out["rounds"], out["target_calls"]) == (2, 16, 8, 10)
  assert out["tokens_per_target_call"] == 1.6            # 16 / 10, not mean(3.5, 1.125)
  assert out["acceptance_rate"] == 6 / 16 and out["alpha"] == 6 / 16
  assert out["target_tokens"] == 10 and out["fallback_rate"] == 3 / 16
  assert out["per_position_accepted"] == [3, 2]
  assert isinstance(out["beta_sum"], float) and isinstance(out["drafted"], int)
  assert list(out)[:3] == ["rows", "tokens", "rounds"] and out["gamma"] == 3
  raw = stats.summarize(s, raw=True)
  np.testing.assert_allclose(raw["tokens_per_target_call_per_row"], [3.5, 9 / 8])
  assert float(raw["tokens_per_target_call"]) == pytest.approx(1.6)


def test_merge_concatenates_real_rows_and_pads_widths():
  a = counters(emitted=[3, 4, 99], target_calls=[1, 2, 99], beta_sum=jnp.array([1., 1., 9.]),
               beta_count=[1, 3, 9]).replace(rounds=jnp.array(2))
  b = DecodeStats.zeros(1, 4).replace(emitted=jnp.array([5]), target_calls=jnp.array([5]),
                                      beta_sum=jnp.array([4.0]), beta_count=jnp.array([4]),
                                      per_position_accepted=jnp.array([[1, 1, 1, 1]]),
                                      rounds=jnp.array(5))
  merged = stats.merge([(a, 2), (b, 1)])          # a's third row pads a short batch
  np.testing.assert_array_equal(merged.emitted, [3, 4, 5])
  assert int(merged.rounds) == 7 and merged.per_position_accepted.shape == (3, 4)
  out = stats.summarize(merged)
  assert out["alpha"] == 6 / 8                     # not the mean of the parts' 0.5 and 1.0
  assert out["tokens_per_target_call"] == 12 / 8


def test_merge_outputs_refuses_outputs_of_different_runs():
  def out(info):
    return sd.DecodeOutput(tokens=jnp.zeros((1, 2), jnp.int32), lengths=jnp.array([2]),
                           counters=counters(emitted=[2]), info=info)

  merged = stats.merge_outputs([out((("gamma", 3),)), out((("gamma", 3),))])
  assert merged["tokens"] == 4 and merged["gamma"] == 3
  with pytest.raises(sd.InputError, match="outputs of different runs"):
    stats.merge_outputs([out((("gamma", 3),)), out((("gamma", 4),))])


@functools.partial(jax.jit, static_argnums=3)
def round_counts(tokens, m, emitted, eos_id):
  """One round's counters for one row: drafts `tokens` [G], m accepted, `emitted` kept."""
  prop = testing.proposal(tokens[None])
  g = tokens.shape[0]
  acceptance = Acceptance(m=jnp.array([m]), next_token=jnp.array([6]),
                          beta=jnp.ones((1, g)), scored=jnp.arange(g)[None] <= m)
  verified = Verified(logits=jnp.zeros((1, g + 1, 8)), hidden=None, cache=None,
                      ran=jnp.array(True))
  candidates = jnp.append(tokens, 6)[None]
  return engine.count_round(DecodeStats.zeros(1, g), jnp.array([True]), prop, verified,
                            acceptance, jnp.array([m]), candidates, jnp.array([emitted]),
                            sd.Greedy(), eos_id)


def test_drafts_after_an_accepted_eos_are_not_counted():
  # Drafts [4, EOS, 5] all accepted; the buffer keeps 4, EOS (the sentence ended there).
  after_eos = round_counts(jnp.array([4, 1, 5]), 3, 2, 1)
  assert int(after_eos.accepted[0]) == 2 and int(after_eos.drafter_tokens[0]) == 2
  assert int(after_eos.beta_count[0]) == 2 and int(after_eos.rejections[0]) == 0
  np.testing.assert_array_equal(after_eos.per_position_accepted[0], [1, 1, 0])
  # Without a stop token the same round counts all three (the rule is about EOS).
  no_eos = round_counts(jnp.array([4, 1, 5]), 3, 4, -1)
  assert int(no_eos.accepted[0]) == 3 and int(no_eos.beta_count[0]) == 3
  assert int(no_eos.drafted[0]) == 3 and int(no_eos.drafting_rounds[0]) == 1


def test_longest_run_of_equal_drafts():
  drafts = jnp.array([[5, 5, 5, 2, 2], [1, 2, 3, 4, 5], [7, 7, 1, 7, 7]])
  np.testing.assert_array_equal(engine.longest_run(drafts[:, 1:] == drafts[:, :-1]), [3, 1, 2])


def test_speculative_beam_batches_merge_as_ratios_of_totals():
  """A corpus of speculative beam search batches (the CLI's --json): steps per target call
  is total steps / total rounds (not the mean of 4/1 and 4/4), drafted nodes per round and
  acceptance by depth are over every real row's rounds."""
  from specdec_jax.experimental import SpeculativeBeam, SpeculativeBeamOutput

  def out(steps, rounds, rows, depth):
    c = counters(target_calls=[rounds] * rows, drafted=[7 * rounds] * rows,
                 per_position_accepted=jnp.array([depth] * rows), emitted=[steps] * rows)
    return SpeculativeBeamOutput(tokens=jnp.zeros((rows, 4), jnp.int32),
                                 lengths=jnp.full((rows,), steps), info=(("gamma", 2),),
                                 counters=c.replace(rounds=jnp.array(rounds)),
                                 statistics=SpeculativeBeam.statistics, steps=jnp.array(steps))

  a, b = out(4, 1, 2, [1, 1]), out(4, 4, 2, [2, 1])        # b's second row pads the batch
  assert a.stats["steps_per_target_call"] == 4.0 and b.stats["steps"] == 4
  merged = stats.merge_outputs([a, b], [2, 1])
  assert (merged["steps"], merged["rounds"]) == (8, 5)
  assert merged["steps_per_target_call"] == 8 / 5
  assert merged["drafted_nodes_per_round"] == 7.0
  assert merged["acceptance_by_depth"] == [4 / 6, 3 / 6]    # rows' rounds: 1 + 1 + 4
  assert list(merged)[-1] == "gamma"                         # the run's info last
