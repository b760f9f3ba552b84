"""Timing output a reader can trust: one labelled figure per quantity, the "why" line from
the same run's measured quantities, and no verify cost below 1.0 shown as a measurement
(in `specdec decode --compare`; the lab's results tables: its tests/test_results.py).
Model-free: seconds."""

from specdec_jax import costs, timing
from specdec_jax.cli.decode_report import compare_block


def _compare(verify_cost):
  k = {"c": 0.041, "verify_cost": verify_cost, "verify_cost_noise": verify_cost < 1.0,
       "call_tokens": 3, "repeats": 5, "tokens_per_target_call": 1.76,
       "drafts_per_target_call": 2.0}
  k["round_cost"] = 2.0 * 0.041 + costs.verify_cost_floor(verify_cost)
  k["expected_speedup"] = 1.76 / k["round_cost"]
  return {"ms_per_token": 3.94, "baseline_ms_per_token": 5.89, "speedup": 5.89 / 3.94,
          "rounds": 3, "exact_baseline_ms_per_token": 6.2, "exact_cost": 6.2 / 5.89,
          "same_tokens": True, "costs": k}


def test_compare_lines_label_each_figure_once():
  text = compare_block(_compare(1.153), "speculative")
  assert ("target alone 5.89 ms/token, speculative 3.94 ms/token, speedup 1.49x"
          in text.splitlines()[0])
  for figure in ("5.89", "3.94", "1.49x"):
    assert text.count(figure) == (2 if figure == "5.89" else 1), figure   # 5.89: exact's base
  why = next(line for line in text.splitlines() if line.startswith("why"))
  assert "1.76 tokens per target call, a round costing 1.24 target steps" in why
  assert "verify cost 1.15" in why and "c 0.041" in why
  assert "natural width: each call as wide as its tokens" in text     # explained where shown
  # no second speedup figure beside the measured one (the call-bound one stays in the JSON)
  assert "1.42x" not in text and "expected" not in text and "*" not in text


def test_a_verify_cost_below_one_is_shown_as_noise():
  text = compare_block(_compare(0.9), "speculative")
  footnote = next(line for line in text.splitlines() if "timing noise" in line)
  assert "verify cost 1.00*" in text and "0.90" in footnote
  assert "timing noise" in text and "verify cost 0.90" not in text
  assert costs.verify_cost_text(0.9) == "1.00*" and costs.verify_cost_text(1.0) == "1.00"
  # predictions floor it: a 0.90 measurement predicts what 1.00 predicts
  assert (costs.predictions(0.6, 2, 0.05, 0.9, 1.2)["predicted_speedup"]
          == costs.predictions(0.6, 2, 0.05, 1.0, 1.2)["predicted_speedup"])
  assert costs.predictions(0.6, 2, 0.05, 0.9, 1.2)["verify_cost"] == 0.9   # stored as measured


class _Clock:
  """`timing`'s clock: `perf_counter()` reads the seconds the fake timers have run."""

  def __init__(self):
    self.now = 0.0

  def perf_counter(self) -> float:
    return self.now


class _FakeTimer:
  """A step timer whose n-th loop takes `seconds[n]` on `clock` (steps per loop: `steps`)."""

  def __init__(self, clock, seconds, steps=1):
    self.clock, self.seconds, self.steps, self.compiled = clock, list(seconds), steps, False

  def compile(self):
    self.compiled = True
    return self

  def _run(self):
    self.clock.now += self.seconds.pop(0)


def test_relative_costs_are_medians_of_per_round_ratios(monkeypatch):
  """Round 2 runs everything 9x slower (a drift: each ratio keeps), round 1 slows the
  3-wide call alone (a spike: one ratio of three). The median of the per-round ratios is
  2 exactly; the ratio of the medians would be 18, their mean 22/3. On a fake clock: the
  figures are exact whatever the machine's load."""
  clock = _Clock()
  monkeypatch.setattr(timing, "time", clock)
  timers = {("target", 1): _FakeTimer(clock, [1.0, 1.0, 9.0]),
            ("target", 3): _FakeTimer(clock, [2.0, 18.0, 18.0]),
            ("drafter", "d"): _FakeTimer(clock, [0.5, 0.5, 4.5], steps=4)}
  ratio = costs.relative_costs(timers, repeats=3)
  assert all(t.compiled for t in timers.values())
  assert all(t.seconds == [] for t in timers.values())    # each timed once a round
  assert ratio == {("target", 1): 1.0, ("target", 3): 2.0, ("drafter", "d"): 0.125}
