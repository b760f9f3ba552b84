"""The larger De->En pair of the separate `specdec-jax-demo` distribution (README's main
command): a 48.6M target whose decode step is bandwidth-bound on a laptop CPU, the 2.0M
drafter aligned to it, its prediction heads; all bfloat16.

tests/data/demo_test_pairs.jsonl: held-out pairs of the demo's test split (never trained on).
"""

import pathlib

import numpy as np
import pytest
from helpers import DEMO_SENTENCES

import specdec_jax as sd
from specdec_jax import package_data

pytestmark = pytest.mark.skipif(
    "demo-de-en-large" not in package_data.separate_groups(),
    reason="specdec-jax-demo is not installed (pip install ./packages/specdec-jax-demo)")


@pytest.fixture(scope="module")
def pair():
  return (sd.load("demo-de-en-large/target", dtype="bfloat16"),
          sd.load("demo-de-en-large/drafter", dtype="bfloat16"),
          sd.load_tokenizer("demo-de-en-large"))


@pytest.mark.slow
def test_bundle_shapes_sizes_and_shared_vocabulary(pair):
  target, drafter, tok = pair
  assert target.config.vocab_size == drafter.config.vocab_size == tok.vocab_size == 8000
  assert 45e6 < target.num_params() < 50e6 and drafter.num_params() < 2.5e6
  # the target's decode weights (bfloat16) exceed a laptop CPU's last-level cache
  assert target.num_params() * 2 > 64 * 2 ** 20
  heads = sd.load_heads("demo-de-en-large/target", target)
  assert heads.num_heads >= 2


@pytest.mark.slow
def test_speculative_translation_equals_greedy_and_the_drafter_is_aligned(pair):
  target, drafter, tok = pair
  enc = tok.encode(DEMO_SENTENCES)
  base = sd.decode(target, sd.Autoregressive(), enc, max_new_tokens=20)
  spec = sd.decode(target, sd.Speculative(drafter, gamma=3), enc, max_new_tokens=20)
  np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(base.tokens))
  np.testing.assert_array_equal(np.asarray(spec.lengths), np.asarray(base.lengths))
  # aligned to THIS target: its drafts are accepted more often than those of the same
  # drafter before alignment (the library's demo-de-en/drafter, aligned to the small target)
  before = sd.decode(target, sd.Speculative(sd.load("demo-de-en/drafter", dtype="bfloat16"),
                                            gamma=3), enc, max_new_tokens=20)
  assert spec.stats["acceptance_rate"] > before.stats["acceptance_rate"] + 0.05
  assert spec.stats["tokens_per_target_call"] > 1.5
  assert all(t.strip() for t in tok.decode(base.tokens))


@pytest.mark.docs
@pytest.mark.slow
def test_readme_main_command(capsys):
  """README's main command, as written there: the translations on stdout, then the
  statistics, the speedup over the target alone with the same tokens, and its "why" line
  (tokens per target call over the round's cost in target steps, c and v measured)."""
  import re
  import shlex

  from specdec_jax import cli
  readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
  line = next(s for s in readme.splitlines() if "specdec decode --model demo-de-en-large" in s)
  argv = shlex.split(line[line.index("specdec decode") + len("specdec "):])
  sentences = [a for a in argv if " " in a]
  assert argv[argv.index("--batch-size") + 1] == "1" and len(sentences) >= 3
  assert cli.main(argv) == 0
  out, err = capsys.readouterr()
  assert len(out.splitlines()) == len(sentences) and all(t.strip() for t in out.splitlines())
  assert "-- specdec decode statistics --" in err
  speedup = re.search(r"speed\s+target alone ([\d.]+) ms/token, speculative ([\d.]+) "
                      r"ms/token, speedup ([\d.]+)x.*?same tokens: yes", err, re.S)
  why = re.search(r"why\s+([\d.]+) tokens per target call, a round costing ([\d.]+) target "
                  r"steps: ([\d.]+) drafter steps x c ([\d.]+) \+ verify cost ([\d.]+)", err)
  assert speedup and why, err
  base_ms, spec_ms, ratio = map(float, speedup.groups())
  assert ratio == pytest.approx(base_ms / spec_ms, abs=0.01)
  per_call, round_cost, drafts, c, v = map(float, why.groups())
  assert per_call > 1.3 and 0 < c < 0.5 and v >= 1.0
  assert round_cost == pytest.approx(drafts * c + v, abs=0.01)
