"""The bundled decoder-only pair (demo-en-lm): loads by name offline, its tokenizer matches
it, speculative greedy output is the target's (that the trained models beat controls: the
lab's tests/test_demo_bundles.py)."""

import json
import pathlib

import numpy as np
import pytest

import specdec_jax as sd

pytest.importorskip("tokenizers")

TEXTS = [json.loads(line)["en"] for line in
         (pathlib.Path(__file__).parent / "data" / "demo_test_pairs.jsonl")
         .read_text().splitlines()]


@pytest.fixture(scope="module")
def pair():
  target, drafter = sd.load("demo-en-lm/target"), sd.load("demo-en-lm/drafter")
  return target, drafter, sd.load_tokenizer("demo-en-lm")


def test_bundled_pair_is_a_decoder_only_pair_with_its_tokenizer(pair):
  target, drafter, tok = pair
  assert target.is_decoder_only and drafter.is_decoder_only
  assert target.num_params() > 3 * drafter.num_params()
  sd.io.tokenizer.check_tokenizer(tok, target)
  prompts, lengths = tok.encode_prompts(["I have no", "Can you help"])
  assert prompts.shape[0] == 2 and (np.asarray(lengths) >= 2).all()   # BOS + words, no EOS
  assert "demo-en-lm" in sd.io.tokenizer.bundled_tokenizers()


@pytest.mark.slow
def test_speculative_greedy_continuations_are_the_targets(pair):
  target, drafter, tok = pair
  prompts, lengths = tok.encode_prompts([" ".join(t.split()[:2]) for t in TEXTS[:6]])
  base = sd.decode(target, sd.Autoregressive(), prompts, prompt_lengths=lengths,
                   max_new_tokens=12)
  out = sd.decode(target, sd.Speculative(drafter, gamma=3), prompts, prompt_lengths=lengths,
                  max_new_tokens=12)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  assert out.stats["tokens_per_target_call"] > 1.2        # the drafter is aligned enough to help
  assert all(isinstance(s, str) for s in tok.decode_continuations(out.tokens))


@pytest.mark.slow
def test_convert_to_hf_carries_the_groups_tokenizer(tmp_path, capsys):
  """`specdec convert demo-en-lm/drafter DST --to hf`: the bundled group's tokenizer.json
  and tokenizer_config.json go along, so DST loads as model and tokenizer alike."""
  from specdec_jax import cli
  from specdec_jax.io import checkpoints
  assert cli.main(["convert", "demo-en-lm/drafter", str(tmp_path), "--to", "hf"]) == 0, \
      capsys.readouterr().err
  assert {p.name for p in tmp_path.iterdir()} == {
      "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
  bundled, back = sd.load("demo-en-lm/drafter", dtype=None), sd.load(str(tmp_path), dtype=None)
  for (k, a), (_, b) in zip(*(sorted(checkpoints.flatten(m.params).items())
                              for m in (bundled, back)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=k)
  tok, ours = sd.load_tokenizer(tmp_path), sd.load_tokenizer("demo-en-lm")
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.add_bos) == (
      ours.bos_id, ours.eos_id, ours.pad_id, ours.add_bos)
  assert tok.encode_one("Can you help") == ours.encode_one("Can you help")
