"""Statistics per method: a run's `out.stats` carries the common statistics and its method's
own, no other method's (speculative decoding reports no rollback_rate), and the tables in
docs/methods/*.md (docs/api/decode.md: the common ones) list exactly those names."""

import pathlib
import re

import pytest
from helpers import REPO_DIR, model_fixtures, ragged_tokens

import specdec_jax as sd
from specdec_jax import testing
from specdec_jax.rounds import stats as stats_lib
from specdec_jax.testing import METHODS

MAX_NEW = 8
SAMPLE = sd.Sampling(temperature=0.8)
DOCS = {"autoregressive": "docs/api/decode.md", "speculative": "docs/methods/speculative.md",
        "bild": "docs/methods/bild.md", "blockwise": "docs/methods/blockwise.md"}
#: Each method's statistics: its value's own (`Method.statistics`), by its name.
STATS = {m.name: stats_lib.shown(m.statistics) for m in METHODS}
ORACLE_ONLY = {"oracle_tokens_per_target_call"}


def _table_names(path: pathlib.Path) -> list[str]:
  """The first-column names (`name`) of the table under the page's "## Statistics"."""
  section = path.read_text(encoding="utf-8").split("## Statistics\n", 1)
  assert len(section) == 2, f"{path} has no '## Statistics' section"
  body = section[1].split("\n## ", 1)[0]
  return re.findall(r"^\| `([a-z_]+)` \|", body, flags=re.M)


@pytest.mark.parametrize("method", sorted(DOCS))
def test_docs_tables_list_each_methods_statistics(method):
  names = _table_names(REPO_DIR / DOCS[method])
  assert len(names) == len(set(names)), f"{DOCS[method]} lists a name twice"
  assert set(names) == set(STATS[method])


def test_method_stats_are_the_common_ones_plus_their_own():
  """The round engine's methods report the common statistics and their own; beam search,
  a loop of its own, what means something for it."""
  assert STATS["autoregressive"] == stats_lib.COMMON_STATS
  every = set(stats_lib.SUMMARY)
  for method in METHODS:
    own = set(method.statistics)
    assert own <= every and len(own) == len(method.statistics), method
    if method.name not in ("beam", "speculative-beam"):
      assert set(stats_lib.COMMON_STATS) <= own, method
    else:   # a beam method: a step is one call over K beams, no tokens per call
      assert set(stats_lib.OWN_LOOP_STATS) <= own, method
      assert not {"tokens_per_target_call", "log_prob"} & own, method
  assert set(STATS["beam"]) == {"rows", "tokens", "rounds", "target_calls"}
  assert "rollback_rate" not in STATS["speculative"]
  assert "alpha" not in STATS["bild"]
  assert stats_lib.shown(None) == stats_lib.SUMMARY   # a research method: all


target, drafter, heads = model_fixtures(5.0, 2.5, drafter="drafter", heads="heads")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STATS))
def test_each_methods_stats_keys_are_exactly_its_own(target, drafter, heads, name):
  """Every method of the registry (`testing.examples`), sampled where it samples: its
  statistics, and of the engine's summary (`stats.SUMMARY`) no other; a method's own
  derived numbers beyond it (speculative beam search's `steps`, ...) are its own names."""
  enc = ragged_tokens(3, 8, 512, seed=4)
  method = testing.examples(target, drafter, heads)[name]
  sampling = None if method.greedy_only or name == "blockwise" else SAMPLE
  out = sd.decode(target, method, enc, MAX_NEW, sampling=sampling, rng=7)
  info = dict(out.info)
  assert info["method"] == name
  statistics = set(out.stats) - set(info)
  own = set(STATS[name]) - ORACLE_ONLY
  assert own <= statistics and not (statistics - own) & set(stats_lib.SUMMARY), name
  # a corpus of batches (what `specdec decode --json` prints) reports the same names
  merged = stats_lib.merge_outputs([out, out])
  assert set(merged) - set(info) == statistics


@pytest.mark.slow
def test_summary_of_another_methods_counters_keeps_its_own_names():
  """The filter is by the run's method (its value's `statistics`), not by which counters
  happen to be nonzero."""
  zeros = stats_lib.DecodeStats.zeros(2, 3)
  spec = stats_lib.summarize(zeros, {"method": "speculative"}, statistics=sd.Speculative.statistics)
  bild = stats_lib.summarize(zeros, {"method": "bild"}, statistics=sd.BiLD.statistics)
  assert "rollback_rate" in bild and "rollback_rate" not in spec
  assert "alpha" in spec and "alpha" not in bild
  assert set(stats_lib.summarize(zeros)) == set(stats_lib.SUMMARY) - ORACLE_ONLY
