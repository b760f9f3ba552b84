"""The lab's commands with decoder-only models: `specdec eval --metric perplexity`, `specdec
bench` with an LM pair, the sweeps on texts (sweep-blockwise's points built, not timed). The
models, tokenizers and command runners are the library's tests/test_cli_lm.py's (tiny random
Llama and GPT-2 with real tokenizers)."""

import json

import numpy as np
import pytest
from helpers import DEMO_PAIRS_FILE

import specdec_jax as sd
from specdec_jax.io.tokenizer import load_tokenizer

pytest.importorskip("tokenizers")
from test_cli_lm import LLAMA_PROMPTS, ok, run, save_gpt2_pair, save_llama_pair  # noqa: E402
from test_lm_tokenizer import TEXTS  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
  return save_llama_pair(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
  return save_gpt2_pair(tmp_path_factory.mktemp("gpt2"))


def ppl_by_hand(model_dir, tok_path, texts) -> tuple[float, int]:
  """exp(mean NLL) of every token after each text's first, one text at a time."""
  import jax
  model, tok = sd.load(str(model_dir)), load_tokenizer(tok_path)
  total, count = 0.0, 0
  for text in texts:
    ids = np.asarray(tok.encode_one(text, add_eos=False))
    logp = np.asarray(jax.nn.log_softmax(model.forward(ids[None])[0], -1))
    total -= float(logp[np.arange(len(ids) - 1), ids[1:]].sum())
    count += len(ids) - 1
  return float(np.exp(total / count)), count


@pytest.mark.parametrize("fmt", ["txt", "jsonl"])
def test_eval_perplexity_equals_exp_mean_nll_of_the_forward_pass(capsys, gpt2, tmp_path, fmt):
  target, _, tok = gpt2
  texts = TEXTS[:5]
  data = tmp_path / f"texts.{fmt}"
  lines = texts if fmt == "txt" else [json.dumps({"text": t}) for t in texts[:3]] + [
      json.dumps(t) for t in texts[3:]]
  data.write_text("\n".join(lines[:2] + [""] + lines[2:]) + "\n")   # a blank line: skipped
  res = json.loads(ok(capsys, "eval", "--metric", "perplexity", "--model", target,
                      "--tokenizer", tok, "--data", data, "--batch-size", "2", "--json"))
  ppl, count = ppl_by_hand(target, tok, texts)
  assert res["tokens"] == count and res["sequences"] == len(texts)
  np.testing.assert_allclose(res["perplexity"], ppl, rtol=1e-5)
  out = ok(capsys, "eval", "--metric", "perplexity", "--model", target, "--tokenizer", tok,
           "--data", data, "--limit", "2")
  assert f"tokens scored        {ppl_by_hand(target, tok, texts[:2])[1]}" in out


def test_eval_perplexity_llama_cuts_at_max_length(capsys, llama, tmp_path):
  target, _, spm = llama
  data = tmp_path / "texts.txt"
  data.write_text("\n".join(TEXTS) + "\n")
  res = json.loads(ok(capsys, "eval", "--metric", "perplexity", "--model", target,
                      "--tokenizer", spm, "--data", data, "--max-length", "4", "--json"))
  cut = [t for t in TEXTS if len(load_tokenizer(spm).encode_one(t, add_eos=False)) > 4]
  assert res["truncated"] == len(cut) > 0 and res["max_length"] == 4
  tok = load_tokenizer(spm)
  rows = [tok.encode_one(t, add_eos=False)[:4] for t in TEXTS]
  assert res["tokens"] == sum(len(r) - 1 for r in rows)


def test_eval_perplexity_bad_input(capsys, llama, gpt2, tmp_path):
  target, _, spm = llama
  data = tmp_path / "texts.txt"
  data.write_text("one text\n")
  code, _, err = run(capsys, "eval", "--metric", "perplexity", "--model",
                     "config:t5_1_1_tiny", "--data", data, "--tokenizer", spm)
  assert code == 1 and "decoder-only" in err
  code, _, err = run(capsys, "eval", "--metric", "perplexity", "--model", target,
                     "--data", data, "--tokenizer", gpt2[2])
  assert code == 1 and "300 ids" in err
  code, _, err = run(capsys, "eval", "--metric", "perplexity", "--model", target,
                     "--data", data, "--drafter", "ngram")
  assert code == 1 and "--drafter" in err
  pairs = DEMO_PAIRS_FILE
  code, _, err = run(capsys, "eval", "--model", target, "--data", pairs)
  assert code == 1 and "--metric perplexity" in err
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"txt": "x"}\n')
  code, _, err = run(capsys, "eval", "--metric", "perplexity", "--model", target,
                     "--data", bad, "--tokenizer", spm)
  assert code == 1 and "line 1" in err


@pytest.mark.slow
def test_bench_writes_its_json_for_an_lm_pair(capsys, llama, tmp_path):
  target, drafter, spm = llama
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("\n".join(LLAMA_PROMPTS) + "\n")
  out = tmp_path / "bench"
  code, stdout, err = run(capsys, "bench", "--target", target, "--drafter", drafter,
                          "--prompts-file", prompts, "--tokenizer", spm, "--batch-sizes", "2",
                          "--gammas", "2", "--modes", "greedy", "--prompt-len", "6",
                          "--max-new-tokens", "6", "--repeats", "1", "--timing-steps", "2",
                          "--no-progress", "--out", out)
  assert code == 0, err
  res = json.loads((out / "bench.json").read_text())
  kinds = {r["method"] for r in res["results"]}
  assert {"autoregressive", "speculative"} <= kinds, kinds
  spec = next(r for r in res["results"] if r["method"] == "speculative")
  assert spec["gamma"] == 2 and 0.0 <= spec["alpha"] <= 1.0 and spec["ms_per_token"] > 0
  assert res["config"]["prompts_file"] == str(prompts)
  assert res["costs"][0]["c"] > 0
  assert "speculative" in stdout


@pytest.mark.slow
def test_sweeps_with_an_lm_pair(capsys, gpt2, tmp_path):
  """sweep-bild on texts: prompts of --prompt-len tokens, references their next
  --max-new-tokens tokens; greedy speculative points score the baseline's BLEU.
  sweep-blockwise's points on texts (the target's heads, the n-gram rescorer fitted on the
  evaluated prompts) are built, not timed: its six points are timed on a T5 pair in
  test_cli_train_eval.py's test_sweep_blockwise_table, and each is exact on an LM in the
  library's tests."""
  from specdec_jax.drafters.lattice import NGramLM
  from specdec_jax_lab.sweep import sweeps
  target, drafter, tok = gpt2
  sd.save_heads(target, sd.init_heads(sd.load(str(target)), 2))
  data = tmp_path / "texts.jsonl"
  data.write_text("\n".join(json.dumps({"text": t}) for t in TEXTS) + "\n")
  common = ["--model", target, "--tokenizer", tok, "--data", data, "--prompt-len", "3",
            "--max-new-tokens", "4", "--batch-size", "2", "--repeats", "1", "--no-progress"]
  out = tmp_path / "bild"
  ok(capsys, "sweep-bild", *common, "--small", f"small={drafter}", "--fallback", "0.5",
     "--rollback", "2", "--gammas", "2", "--out", out)
  res = json.loads((out / "bild.json").read_text())
  t = load_tokenizer(tok)
  long_enough = [x for x in TEXTS if len(t.encode_one(x)) >= 7]
  assert res["config"]["pairs"] == len(long_enough) and res["config"]["max_new_tokens"] == 4
  points = {p["label"]: p for p in res["points"]}
  spec = points["speculative/small/g2"]
  assert spec["bleu"] == spec["baseline_bleu"]     # exact: the target's own continuation
  assert "small/fb0.5/rb2" in points
  settings = sweeps.BlockwiseSweep(model=str(target), tokenizer=str(tok), data=str(data),
                                   out=str(tmp_path / "blockwise"), prompt_len=3,
                                   max_new_tokens=4, rescorer=str(drafter), lattice_k=2,
                                   num_drafts=2)
  model = sd.load(str(target))
  split = sweeps.lm_split(settings, t, model.config)
  assert len(split.inputs) == len(long_enough) and split.inputs.shape[1] == 3
  methods = {p.label: p.method.method for p in sweeps.blockwise_points(settings, model, split)}
  assert methods["base"].heads.num_heads == 2           # the heads saved beside the target
  ngram = methods["ngram"].rescorer
  want = NGramLM.fit(list(split.inputs), vocab_size=model.config.vocab_size)
  np.testing.assert_array_equal(np.asarray(ngram.unigram), np.asarray(want.unigram))
  assert not np.array_equal(np.asarray(ngram.unigram), np.asarray(NGramLM.fit(
      [np.asarray(t.encode_one(x)) for x in TEXTS], vocab_size=model.config.vocab_size
  ).unigram))                                          # not the whole texts
  # a T5 drafting model for an LM target
  code, _, err = run(capsys, "sweep-bild", *common, "--small", "t5=config:t5_1_1_tiny_drafter",
                     "--out", tmp_path / "bad")
  assert code == 1 and "T5 encoder-decoder" in err
