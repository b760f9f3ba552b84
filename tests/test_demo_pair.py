"""The bundled De->En pair (demo-de-en, shipped by packages/specdec-jax-demo-small) as users
get it (that the lab trained it well: the lab's tests/test_demo_bundles.py).

tests/data/demo_test_pairs.jsonl: 32 sentences and 32 phrases of the demo's test split
(Debian trans-de-en, TU Chemnitz Ding dictionary, GPL-2.0-or-later), never trained on.
"""

import json
import pathlib

import jax
import numpy as np
import pytest
from helpers import DEMO_SENTENCES
from test_cli import assert_same_stats

import specdec_jax as sd
from specdec_jax import cli, package_data


@pytest.fixture(scope="module")
def pair():
  return (sd.load("demo-de-en/target"), sd.load("demo-de-en/drafter"),
          sd.load_tokenizer("demo-de-en"))


@pytest.mark.slow
def test_bundle_shapes_and_shared_vocabulary(pair):
  target, drafter, tok = pair
  assert target.config.vocab_size == drafter.config.vocab_size == tok.vocab_size == 8000
  # the budget: the target costs at least 6x the drafter per decoded token
  assert target.config.decode_macs_per_token() >= 6 * drafter.config.decode_macs_per_token()
  group = pathlib.Path(str(package_data.assets("demo-de-en"))) / "demo-de-en"   # installed
  files = {f.relative_to(group).as_posix(): f.stat().st_size
           for f in group.rglob("*") if f.is_file()}
  # the pair (target, drafter, tokenizer) within the demo issue's 40 MB; beside it the
  # target's prediction heads and BiLD's early-exit target (bfloat16 each)
  extras = ("target/heads.safetensors", "early-exit/")
  pair_bytes = sum(n for name, n in files.items() if not name.startswith(extras))
  assert pair_bytes <= 40 * 2 ** 20
  assert files["target/heads.safetensors"] <= 8 * 2 ** 20
  assert sum(files.values()) <= 70 * 2 ** 20
  early = sd.load("demo-de-en/early-exit")
  assert early.config == target.config and early.params is not None
  assert sd.load_heads("demo-de-en/target", target).num_heads == 8


@pytest.mark.slow
def test_speculative_translation_equals_greedy(pair):
  """The bundled pair as users load it, at the main command's gamma (gamma 1, a drafter
  of its own: tests/test_speculative.py's greedy equivalence)."""
  target, drafter, tok = pair
  gamma = 4
  enc = tok.encode(DEMO_SENTENCES)
  base = sd.generate(target, enc, max_new_tokens=24)
  spec = sd.speculative_generate(target, drafter, enc, gamma=gamma, max_new_tokens=24)
  np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(base.tokens))
  np.testing.assert_array_equal(np.asarray(spec.lengths), np.asarray(base.lengths))
  # the aligned drafter's drafts are accepted far more often than an untrained drafter's
  # (same config, random weights: the negative control), and save target calls
  control = sd.speculative_generate(target, sd.init_model(drafter.config, 0), enc, gamma=gamma,
                                    max_new_tokens=24)
  assert float(spec.stats["acceptance_rate"]) > float(control.stats["acceptance_rate"]) + 0.15
  assert float(spec.stats["tokens_per_target_call"]) > 1.3
  texts = tok.decode(base.tokens)
  assert all(t.strip() for t in texts)


@pytest.mark.slow
def test_main_command_prints_translation_and_stats(capsys, pair):
  """`specdec decode --json` on the demo pair: the translations and statistics are exactly
  what sd.speculative_generate returns for the same input."""
  target, drafter, tok = pair
  texts = ["Ich habe keine Zeit.", "Das ist mir egal."]
  code = cli.main(["decode", "--model", "demo-de-en/target", "--drafter", "demo-de-en/drafter",
                   "--tokenizer", "demo-de-en", "--gamma", "4", "--json", *texts])
  out, err = capsys.readouterr()
  assert code == 0, err
  assert "specdec: note: demo-de-en is a De→En demo pair" in err     # said by the output, on stderr
  assert "not translation quality" in err
  result = json.loads(out)
  direct = sd.speculative_generate(target, drafter, tok.encode(texts), gamma=4,
                                   max_new_tokens=64, rng=jax.random.PRNGKey(0))
  lengths = np.asarray(direct.lengths)
  assert result["lengths"] == lengths.tolist()
  assert result["outputs"] == [tok.decode_one(np.asarray(row)[:n])
                               for row, n in zip(direct.tokens, lengths, strict=True)]
  assert all(t.strip() for t in result["outputs"])
  stats = result["stats"]
  assert_same_stats(stats, direct.stats)
  # the counters are consistent with the tokens and with each other
  assert stats["tokens"] == sum(result["lengths"]) == result["timing"]["generated_tokens"]
  assert 0 < stats["accepted"] <= stats["drafted"]
  assert 0.0 <= stats["acceptance_rate"] <= 1.0
  assert stats["acceptance_rate"] == pytest.approx(stats["accepted"] / stats["drafted"])
  assert 0.0 <= stats["alpha"] <= 1.0
  assert stats["alpha"] == pytest.approx(stats["beta_sum"] / stats["beta_count"])
  assert stats["tokens_per_target_call"] == pytest.approx(stats["tokens"]
                                                          / stats["target_calls"])
  assert stats["tokens_per_target_call"] > 1.0 and stats["gamma"] == 4
  calls = np.asarray(direct.counters.target_calls)
  assert stats["target_calls"] == calls.sum()
  assert stats["rounds"] >= calls.max()
