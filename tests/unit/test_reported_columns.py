"""The reports' columns (`runs.REPORTED`) are derived from the method values: every method's
own statistics, so a new method's statistics are new columns with no list to edit."""

from typing import ClassVar

import pytest
from flax import struct

import specdec_jax as sd
from specdec_jax import experimental, runs
from specdec_jax.rounds import stats as stats_lib

pytestmark = pytest.mark.unit


@struct.dataclass
class Tallying(sd.Speculative):
  """Speculative decoding that also reports its rows' fallbacks and a statistic of its own."""

  name: ClassVar[str] = "tallying"
  statistics: ClassVar[tuple[str, ...]] = (*sd.Speculative.statistics, "fallback_rate")
  derived_statistics: ClassVar[tuple[str, ...]] = ("tallies_per_round",)


def test_the_columns_are_every_methods_own_statistics():
  """Each method's statistics are columns, but the fixed ones and those without a column."""
  for method in sd.methods.METHODS + experimental.METHODS:
    own = set(stats_lib.shown(method.statistics)) | set(method.derived_statistics)
    assert own - set(runs.NOT_COLUMNS) <= set(runs.REPORTED), method
  assert {"alpha", "fallback_rate", "mean_max_run", "steps_per_target_call"} <= set(
      runs.REPORTED)
  assert not set(runs.NOT_COLUMNS) & set(runs.REPORTED)
  assert len(set(runs.REPORTED)) == len(runs.REPORTED)


def test_a_new_methods_statistics_are_new_columns():
  """A method registered beside the others adds its own statistics, once, at the end."""
  before = runs.reported((sd.Autoregressive, sd.Speculative))
  assert "fallback_rate" not in before and "tallies_per_round" not in before
  after = runs.reported((sd.Autoregressive, sd.Speculative, Tallying))
  assert after == (*before, "fallback_rate", "tallies_per_round")
  row = runs.stats_row({"target_calls": 4, "rounds": 2, "tokens_per_target_call": 2.0,
                        "fallback_rate": 0.25, "tallies_per_round": 3.0})
  assert row["fallback_rate"] == 0.25 and "tallies_per_round" not in row   # not registered
