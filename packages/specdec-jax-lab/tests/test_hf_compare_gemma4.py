"""scripts/compare_hf.py on a Gemma 4 target and its assistant: tiny random transformers
directories (a window shorter than prompt + output, grouped heads, full layers of their own
head size, soft-capped logits), compared with transformers' greedy and assisted generation.
One module-scoped run of the script (and of `hf_compare.compare` on ragged prompts); the
tests read its JSON and Markdown."""

import importlib.util
import json
import pathlib
import sys

import numpy as np
import pytest
from helpers import randomized_torch

from specdec_jax.plan import config_of
from specdec_jax_lab import hf_compare

torch = pytest.importorskip("torch", reason="needs the interop extra (torch, transformers)")
transformers = pytest.importorskip("transformers")

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "scripts" / "compare_hf.py"
VOCAB, EOS, TARGET_DIM, GAMMA, PROMPTS, NEW = 96, 2, 32, 3, 3, 8


def _text_config(layers, hidden):
  return transformers.Gemma4TextConfig(
      vocab_size=VOCAB, hidden_size=hidden, intermediate_size=48, num_hidden_layers=layers,
      num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
      num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=3,
      layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"],
      final_logit_softcapping=4.0, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
      max_position_embeddings=64, pad_token_id=0, eos_token_id=EOS, bos_token_id=1)


def _script():
  spec = importlib.util.spec_from_file_location("compare_hf", SCRIPT)
  assert spec is not None and spec.loader is not None
  script = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = script
  spec.loader.exec_module(script)
  return script


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """The script's results on a 3-layer target and a 2-layer assistant with 8 centroids; the
  assistant's dir sets no num_assistant_tokens (transformers' own default)."""
  root = tmp_path_factory.mktemp("gemma4_pair")
  target = randomized_torch(transformers.Gemma4ForCausalLM(_text_config(3, TARGET_DIM)), 0)
  target.save_pretrained(root / "target")
  config = transformers.Gemma4AssistantConfig(
      text_config=_text_config(2, 24).to_dict(), backbone_hidden_size=TARGET_DIM,
      use_ordered_embeddings=True, num_centroids=8, centroid_intermediate_top_k=2)
  assistant = randomized_torch(transformers.Gemma4AssistantForCausalLM(config), 1)
  assert assistant.generation_config.num_assistant_tokens is None
  assistant.save_pretrained(root / "assistant")
  assistant.generation_config.num_assistant_tokens = 2        # a dir that sets it
  assistant.save_pretrained(root / "assistant_set")
  out = root / "out"
  code = _script().main(["--target", str(root / "target"), "--drafter", str(root / "assistant"),
                      "--limit", str(PROMPTS), "--prompt-len", "6", "--gamma", str(GAMMA),
                      "--max-new-tokens", str(NEW), "--batch-sizes", "1", "--repeats", "1",
                      "--no-progress", "--out", str(out)])
  assert code == 0
  # ragged prompts padded to the script's width (6): the same compiled programs; HF
  # assisted also with the dir's own num_assistant_tokens
  ragged = hf_compare.compare(
      str(root / "target"), str(root / "assistant_set"),
      [np.array([5, 17, 33, 8, 91, 40]), np.array([64, 7, 7, 21]), np.array([3, 50, 11, 88, 9])],
      hf_compare.CompareSettings(gamma=GAMMA, max_new_tokens=NEW, batch_sizes=(), repeats=1,
                                 progress=False))
  return (json.loads((out / "hf_compare.json").read_text()),
          (out / "hf_compare.md").read_text(), ragged, root)


@pytest.mark.slow
def test_the_same_tokens_as_transformers_greedy_and_assisted(run):
  results, _, ragged, _ = run
  for result in (results, ragged):
    rows = {r["name"]: r for r in result["methods"]}
    assert set(rows) - {"hf_assisted_default"} == {"hf_greedy", "hf_assisted", "ours_greedy",
                                                   "ours_speculative"}
    for name, r in rows.items():
      assert r["error"] is None, (name, r["error"])
      assert r["identical_per_prompt"] == [True] * PROMPTS, (name, r.get("mismatches"))
      assert r["identical_to_hf_greedy"] is True and r["ms_per_token"] > 0
    assert result["summary"]["all_greedy_identical_to_hf"] is True
  assert ragged["config"]["prompt_lengths"] == [6, 4, 5] and ragged["errors"] == {}
  default = {r["name"]: r for r in ragged["methods"]}["hf_assisted_default"]
  assert ragged["config"]["hf_default_assisted"]["num_assistant_tokens"] == 2
  assert default["gamma"] == 2 and "the drafter dir's generation config" in default["label"]
  rows = {r["name"]: r for r in results["methods"]}
  # the prompts' tokens are not in the output: HF's rows are cut after the prompt
  assert 0 < rows["ours_greedy"]["generated_tokens"] <= PROMPTS * NEW
  assert rows["hf_greedy"]["generated_tokens"] == rows["ours_greedy"]["generated_tokens"]
  assert rows["hf_greedy"]["tokens_per_target_call"] == pytest.approx(1.0)
  assert rows["hf_assisted"]["tokens_per_target_call"] >= 1.0
  ours = rows["ours_speculative"]
  assert ours["tokens_per_target_call"] >= 1.0 and 0.0 <= ours["acceptance_rate"] <= 1.0
  assert results["config"]["hf_assisted"]["num_assistant_tokens"] == GAMMA
  assert results["config"]["target"]["config"]["family"] == "gemma4"
  assert results["config"]["drafter"]["config"]["backbone_dim"] == TARGET_DIM


@pytest.mark.slow
def test_the_report_says_what_was_compared(run):
  results, md, _, root = run
  # transformers' defaults for this assistant: no num_assistant_tokens, so not run, said so
  assert "sets no num_assistant_tokens" in results["errors"]["hf_drafter_default_load"]
  assert "Same tokens as HF greedy, per prompt:" in md
  per_prompt = [line for line in md.splitlines() if line.startswith("| ") and
                line.split("|")[1].strip().isdigit()]
  assert len(per_prompt) == PROMPTS and all(line.count("| yes") == 4 for line in per_prompt)
  assert "reads keys of the rejected drafts" in md
  assert np.all(np.asarray(results["config"]["prompt_lengths"]) == 6)
  # `specdec plan` reads the same dirs (the script takes the vocabulary from it)
  target, assistant = (config_of(str(root / d)) for d in ("target", "assistant"))
  assert target.layer_types == ("sliding", "sliding", "full") and target.vocab_size == VOCAB
  assert assistant.backbone_dim == TARGET_DIM and assistant.num_centroids == 8


def test_text_prompts_are_the_tokenizers(tmp_path):
  """--prompts-file: a decoder-only model's prompts without EOS (`encode_prompts`), an
  encoder's inputs with it; blank lines skipped."""
  import specdec_jax as sd
  lines = ["Guten Morgen.", "Das Haus ist klein und alt."]
  path = tmp_path / "prompts.txt"
  path.write_text(f"{lines[0]}\n\n{lines[1]}\n")
  tokenizer = sd.load_tokenizer("demo-de-en")
  script = _script()
  rows = script._text_prompts(str(path), "demo-de-en", decoder_only=True)
  tokens, lengths = tokenizer.encode_prompts(lines)
  expected = [t[:n].tolist() for t, n in zip(tokens, lengths, strict=True)]
  assert [r.tolist() for r in rows] == expected
  rows = script._text_prompts(str(path), "demo-de-en", decoder_only=False)
  assert [r.tolist() for r in rows] == [tokenizer.encode_one(x) for x in lines]
  assert all(r[-1] == tokenizer.eos_id for r in rows)
