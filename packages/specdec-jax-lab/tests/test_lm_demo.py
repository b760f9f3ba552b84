"""The decoder-only demo pipeline (`tools/lm_demo.py`) on a tiny synthetic dictionary, the LM
loss (`training.LMLoss`) and held-out perplexity (`evaluation.perplexity`)."""

import json

import jax
import numpy as np
import pytest

pytest.importorskip("tokenizers")

from test_prepare import write_dictionary  # noqa: E402

import specdec_jax as sd  # noqa: E402
from specdec_jax.io.tokenizer import HFTokenizer, check_tokenizer  # noqa: E402
from specdec_jax_lab import (
  evaluation,
  lm_demo,
  training,  # noqa: E402
)
from specdec_jax_lab.errors import DataError, EvaluationError  # noqa: E402

TINY = {"family": "llama", "vocab_size": 64, "emb_dim": 32, "num_layers": 1, "num_heads": 2,
        "num_kv_heads": 1, "mlp_dim": 64, "max_positions": 32}
TRAIN = {"steps": 40, "batch_size": 16, "learning_rate": 0.01, "warmup_steps": 5,
         "checkpoint_every": 20, "optimizer": "adamw"}


def write_recipe(tmp, dictionary, steps=40):
  (tmp / "lm.json").write_text(json.dumps(TINY))
  recipe = {"data": {"vocab_size": 120, "max_len": 12, "min_words": 2, "valid_size": 20,
                     "test_size": 20, "path": str(dictionary)},
            "target": {"config": str(tmp / "lm.json"), **TRAIN, "steps": steps},
            "drafter": {"config": str(tmp / "lm.json"), **TRAIN, "seed": 1},
            "ngram": {"top_k": 8}}
  path = tmp / "recipe.json"
  path.write_text(json.dumps(recipe))
  return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("lm_demo")
  recipe = write_recipe(tmp, write_dictionary(tmp / "de-en", lines=400))
  workdir = tmp / "work"
  results = lm_demo.run_pipeline(recipe, workdir, "all")
  return tmp, recipe, workdir, results


@pytest.mark.slow
def test_pipeline_outputs(run):
  _, _, workdir, results = run
  meta = json.loads((workdir / "data" / "meta.json").read_text())
  tok = sd.load_tokenizer(workdir / "data")
  assert isinstance(tok, HFTokenizer) and (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  assert tok.add_bos and meta["vocab_size"] == tok.vocab_size
  train = lm_demo.load_tokens(workdir / "data", "train")
  assert (train[:, 0] == 1).all()                       # every row: <s> ... </s>, 0-padded
  lengths = (train > 0).sum(1)
  assert (train[np.arange(len(train)), lengths - 1] == 2).all()
  texts = (workdir / "data" / "train.txt").read_text(encoding="utf-8").splitlines()
  assert tok.decode_continuations(train[:, 1:]) == texts
  # The splits are disjoint texts.
  valid = set((workdir / "data" / "validation.txt").read_text(encoding="utf-8").splitlines())
  assert valid and not valid & set(texts)
  target = results["target"]
  check_tokenizer(tok, target)
  assert target.config.vocab_size == tok.vocab_size and target.config.bos_id == 1
  ev = json.loads((workdir / "eval.json").read_text())
  assert set(ev["perplexity"]) == {"target", "drafter", "unigram", "bigram"}
  # Trained models beat the unigram table, and every model beats uniform guessing.
  assert ev["perplexity"]["target"] < ev["perplexity"]["unigram"] < tok.vocab_size


@pytest.mark.slow
def test_rerun_skips_and_more_steps_resume(run, monkeypatch):
  tmp, recipe, workdir, _ = run
  final = workdir / "target" / "final" / "train_log.json"
  before = final.read_text()
  calls = []
  real_fit = training.fit

  def spy(params, objective, inputs, targets, cfg, workdir_, progress=True):
    calls.append((workdir_.name, cfg.steps))
    return real_fit(params, objective, inputs, targets, cfg, workdir_, progress)

  monkeypatch.setattr(training, "fit", spy)
  lm_demo.run_pipeline(recipe, workdir, ("data", "target", "drafter", "ngram"))
  assert calls == [] and final.read_text() == before    # everything current: skipped
  (tmp / "longer").mkdir()
  longer = write_recipe(tmp / "longer", tmp / "de-en", steps=60)
  lm_demo.run_pipeline(longer, workdir, ("target",))
  assert calls == [("target", 60)]
  history = [json.loads(line) for line in
             (workdir / "target" / "history.jsonl").read_text().splitlines()]
  # Resumed from the step-40 checkpoint: the history continues, it does not start over.
  assert json.loads(final.read_text())["steps"] == 60
  assert [h["step"] for h in history if h["step"] > 40] == [50, 60]


def _by_hand(model, tokens, lengths):
  """exp(mean NLL) with one forward pass per predicted token, on its prefix alone."""
  nll = []
  for row, n in zip(tokens, lengths, strict=True):
    for t in range(1, n):
      logits = np.asarray(model.forward(row[None, :t]))[0, -1].astype(np.float64)
      logp = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
      nll.append(-logp[row[t]])
  return float(np.exp(np.mean(nll))), len(nll)


@pytest.mark.slow
def test_perplexity_is_exp_mean_nll():
  model = sd.init_model(sd.get_config("llama_tiny"), 3)
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, model.vocab_size, size=(3, 7)).astype(np.int32)
  lengths = np.asarray([7, 2, 5])
  tokens[1, 2:] = 0
  tokens[2, 5:] = 0
  want, count = _by_hand(model, tokens, lengths)
  got = evaluation.perplexity(model, tokens, batch_size=2)     # ragged last batch
  assert got["tokens"] == count == 6 + 1 + 4
  np.testing.assert_allclose(got["perplexity"], want, rtol=1e-5)
  # The training loss on the same rows is the log of the perplexity.
  x, y = training.next_token_pairs(tokens)
  loss, _ = training.lm_loss_fn(model.params, model.config, {"inputs": x, "targets": y},
                                jax.random.PRNGKey(0))
  np.testing.assert_allclose(float(loss), np.log(want), rtol=1e-5)
  with pytest.raises(EvaluationError, match="lengths must be"):
    evaluation.perplexity(model, tokens, lengths=[7, 8, 1])


def test_negative_controls(run):
  """A target with its weights shuffled, or text with its tokens shuffled, scores worse."""
  _, _, workdir, results = run
  target = results["target"]
  valid = lm_demo.load_tokens(workdir / "data", "validation")
  ppl = evaluation.perplexity(target, valid)["perplexity"]
  rng = np.random.default_rng(0)
  shuffled = jax.tree_util.tree_map(
      lambda p: rng.permutation(np.asarray(p).reshape(-1)).reshape(p.shape), target.params)
  assert evaluation.perplexity(target.replace(params=shuffled), valid)["perplexity"] > 1.5 * ppl
  scrambled = valid.copy()
  for row in scrambled:
    n = int((row > 0).sum())
    row[1:n - 1] = rng.permutation(row[1:n - 1])
  assert evaluation.perplexity(target, scrambled)["perplexity"] > ppl


def test_ngram_perplexity_by_hand(run):
  _, _, workdir, results = run
  unigram = results["ngram"]["unigram"]
  valid = lm_demo.load_tokens(workdir / "data", "validation")
  q = np.asarray(unigram.unigram, np.float64)
  nxt = valid[:, 1:][valid[:, 1:] > 0]
  np.testing.assert_allclose(lm_demo.ngram_perplexity(unigram, valid),
                             np.exp(-np.log(q[nxt] / q.sum()).mean()), rtol=1e-4)
  assert lm_demo.ngram_perplexity(results["ngram"]["bigram"], valid) < \
      lm_demo.ngram_perplexity(unigram, valid)


@pytest.mark.slow
def test_lm_loss_masks_pads_only():
  model = sd.init_model(sd.get_config("llama_tiny"), 0)
  seq = np.asarray([[1, 5, 6, 7, 2, 0, 0]], np.int32)
  x, y = training.next_token_pairs(seq)
  base, _ = training.lm_loss_fn(model.params, model.config, {"inputs": x, "targets": y},
                                jax.random.PRNGKey(0))
  longer = np.asarray([[1, 5, 6, 7, 2, 0, 0, 0, 0]], np.int32)       # more padding: same loss
  x2, y2 = training.next_token_pairs(longer)
  same, _ = training.lm_loss_fn(model.params, model.config, {"inputs": x2, "targets": y2},
                                jax.random.PRNGKey(0))
  np.testing.assert_allclose(float(same), float(base), rtol=1e-6)
  changed = np.asarray([[1, 5, 6, 7, 9, 0, 0]], np.int32)           # the EOS target counts
  x3, y3 = training.next_token_pairs(changed)
  other, _ = training.lm_loss_fn(model.params, model.config, {"inputs": x3, "targets": y3},
                                 jax.random.PRNGKey(0))
  assert float(other) != pytest.approx(float(base))


def _beta_by_hand(p_logits, q_logits, t):
  p_logits, q_logits = np.asarray(p_logits, np.float64), np.asarray(q_logits, np.float64)
  if t == 0:
    return float(np.argmax(p_logits) == np.argmax(q_logits))
  p = np.exp(p_logits / t - (p_logits / t).max())
  q = np.exp(q_logits / t - (q_logits / t).max())
  return float(np.minimum(p / p.sum(), q / q.sum()).sum())


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.5])
def test_teacher_forced_alpha_by_hand(temperature):
  cfg = sd.get_config("llama_tiny")
  target, drafter = sd.init_model(cfg, 0), sd.init_model(cfg, 1)
  ngram = lm_demo.fit_ngrams(np.asarray([[1, 5, 6, 7, 2], [1, 6, 5, 2, 0]]), cfg.vocab_size, 4)
  rng = np.random.default_rng(1)
  tokens = rng.integers(3, cfg.vocab_size, size=(2, 6)).astype(np.int32)
  tokens[1, 4:] = 0
  lengths = [6, 4]
  for q_model in (drafter, ngram):
    want = []
    for row, n in zip(tokens, lengths, strict=True):
      for t in range(1, n):
        p = np.asarray(target.forward(row[None, :t]))[0, -1]
        q = (np.asarray(q_model.forward(row[None, :t]))[0, -1] if q_model is drafter
             else np.asarray(ngram.logits_after(np.asarray([row[t - 1]])))[0])
        want.append(_beta_by_hand(p, q, temperature))
    got = lm_demo.teacher_forced_alpha(target, q_model, tokens, temperature=temperature)
    assert got["positions"] == len(want) == 5 + 3
    np.testing.assert_allclose(got["alpha"], np.mean(want), rtol=1e-5, atol=1e-6)
  same = lm_demo.teacher_forced_alpha(target, target, tokens, temperature=temperature)
  assert same["alpha"] == pytest.approx(1.0, abs=1e-5)


def test_alpha_table_and_controls(run):
  """The trained drafters agree with the target more than their shuffled versions do."""
  _, _, workdir, results = run
  rows = lm_demo.alpha_table(workdir, temperatures=(0.0, 1.0), limit=20)
  assert {(r["drafter"], r["temperature"]) for r in rows} == {
      (d, t) for d in ("drafter", "unigram", "bigram") for t in (0.0, 1.0)}
  assert all(0.0 <= r["alpha_without_eos"] <= r["alpha"] <= 1.0 and r["gamma"] >= 1
             for r in rows)
  from specdec_jax import theory  # Theorem 8 for the acceptances that gain a token
  assert all(r["gamma"] == theory.optimal_gamma(r["alpha_without_eos"], r["c"], 8).gamma
             for r in rows)
  assert [r["paper_alpha"] for r in rows if r["drafter"] == "drafter"] == [0.88, 0.89]
  table = lm_demo.alpha_markdown(rows, {})
  assert table.count("\n") == 2 + len(rows) and "| small LM | 0 |" in table
  target, drafter = results["target"], results["drafter"]
  valid = lm_demo.load_tokens(workdir / "data", "validation")
  rng = np.random.default_rng(0)
  shuffled = drafter.replace(params=jax.tree_util.tree_map(
      lambda p: rng.permutation(np.asarray(p).reshape(-1)).reshape(p.shape), drafter.params))
  a = lm_demo.teacher_forced_alpha(target, drafter, valid, temperature=1.0)["alpha"]
  assert lm_demo.teacher_forced_alpha(target, shuffled, valid, temperature=1.0)["alpha"] < a


def test_main_writes_results(run, tmp_path):
  _, recipe, workdir, _ = run
  assert lm_demo.main(["--recipe", str(recipe), "--workdir", str(workdir), "--stages", "ngram",
                       "--results", str(tmp_path / "res")]) == 0
  text = (tmp_path / "res" / "alpha.md").read_text()
  record = json.loads((tmp_path / "res" / "alpha.json").read_text())
  assert len(record["alpha"]) == 6 and "| small LM | 1 |" in text and "| target |" in text
  assert f"{record['eval']['perplexity']['target']:.1f}" in text
  assert "seeded from" not in text                     # the workdir trained both models


def test_results_name_seeded_models(run, tmp_path):
  """A model copied into the workdir (its train_log's "seeded_from", e.g. the bundled
  bfloat16 pair) is named in the table's header, not passed off as trained there."""
  import shutil
  _, _, workdir, _ = run
  seeded = tmp_path / "work"
  shutil.copytree(workdir, seeded)
  log_path = seeded / "target" / "final" / "train_log.json"
  log = json.loads(log_path.read_text())
  log_path.write_text(json.dumps({**log, "seeded_from": "demo-en-lm/target (bfloat16)"}))
  text = lm_demo.write_results(seeded, tmp_path / "res", limit=5).read_text()
  assert "The target is not trained in the workdir but seeded from " \
         "`demo-en-lm/target (bfloat16)`: training steps are those of the run that " \
         "produced it." in text


def test_refusals(tmp_path):
  t5 = sd.init_model(sd.get_config("t5_1_1_tiny"), 0)
  with pytest.raises(EvaluationError, match="decoder-only"):
    evaluation.perplexity(t5, np.ones((1, 4), np.int32))
  lm = sd.init_model(sd.get_config("llama_tiny"), 0)
  with pytest.raises(EvaluationError, match=r"\[N, L >= 2\]"):
    evaluation.perplexity(lm, np.ones((2, 1), np.int32))
  x, y = training.next_token_pairs(np.ones((2, 4), np.int32))
  with pytest.raises(training.TrainingError, match="no teacher"):
    training.train(lm, x, y, training.TrainConfig(steps=1), tmp_path, teacher=lm,
                   progress=False)
  with pytest.raises(training.TrainingError, match=r"\[N, L >= 2\]"):
    training.next_token_pairs(np.ones((2, 1), np.int32))
  recipe = tmp_path / "recipe.json"        # a typo in the data section, before any work
  recipe.write_text(json.dumps({"data": {"vocab_sise": 512}}))
  with pytest.raises(training.TrainingError,
                     match=r"section 'data': .*vocab_sise.*; known: vocab_size"):
    lm_demo.run_pipeline(recipe, tmp_path / "work", stages=("data",))
  assert not (tmp_path / "work" / "data" / "meta.json").exists()


@pytest.mark.slow
def test_decoded_alpha():
  """alpha while speculative decoding: 1 for the target as its own drafter (gamma + 1 tokens
  per target call), below 1 for another model."""
  cfg = sd.get_config("llama_tiny")
  target, other = sd.init_model(cfg, 0), sd.init_model(cfg, 1)
  prompts = np.asarray([[1, 5, 6], [1, 7, 0]], np.int32)
  lengths = np.asarray([3, 2], np.int32)
  same = lm_demo.decoded_alpha(target, target, prompts, lengths, gamma=3, max_new_tokens=8)
  assert same["alpha"] == 1.0 and same["tokens_per_target_call"] == 4.0
  assert same["positions"] == 2 * 8                      # every output token, no EOS here
  low = lm_demo.decoded_alpha(target, other, prompts, lengths, gamma=3, max_new_tokens=8)
  assert low["alpha"] < 1.0 and low["tokens_per_target_call"] < 4.0


@pytest.mark.slow
def test_an_eos_drafter_gains_nothing():
  """A unigram whose most frequent token is EOS (the demo's) drafts only EOS at t = 0: its
  accepted drafts end rows, one token per target call. alpha counts those acceptances
  (the EOS positions of the target's own output, nothing after them); alpha without EOS,
  what Theorem 8's tokens per call needs, is 0. (test_decoded_alpha's shapes.)"""
  from helpers import peaked
  cfg = sd.get_config("llama_tiny")                     # EOS 1
  target = peaked(sd.init_model(cfg, 0), scale=4.0, eos_boost=2.0)
  unigram = sd.NGramDrafter.fit([[5, 1], [6, 1], [7, 1]], cfg.vocab_size, 4, lam=0.0,
                                start_id=None)
  assert int(np.argmax(np.asarray(unigram.unigram))) == 1
  prompts, lengths = np.asarray([[1, 5, 6], [1, 7, 0]], np.int32), np.asarray([3, 2], np.int32)
  d = lm_demo.decoded_alpha(target, unigram, prompts, lengths, gamma=3, max_new_tokens=8)
  out = sd.decode(target, sd.Speculative(unigram, gamma=3), prompts, 8, prompt_lengths=lengths)
  n, ended = np.asarray(out.lengths), int(np.sum(np.asarray(out.lengths) < 8))
  assert ended > 0 and d["positions"] == n.sum()
  assert d["alpha"] == pytest.approx(ended / n.sum())         # the EOS positions
  assert d["alpha_without_eos"] == 0.0 and d["tokens_per_target_call"] == 1.0
  tf = lm_demo.teacher_forced_alpha(target, unigram, prompts, lengths)
  assert tf["alpha_without_eos"] == 0.0


def test_ngram_tables_leave_bos_out_of_the_unigram():
  rows = np.asarray([[1, 5, 6, 7, 2], [1, 6, 5, 2, 0], [1, 5, 2, 0, 0]])
  bigram = lm_demo.fit_ngrams(rows, 16, top_k=4)
  unigram = np.asarray(bigram.unigram)
  assert unigram[1] == unigram.min() and unigram[5] == unigram.max()   # <s>: smoothing only
  followers = dict(zip(np.asarray(bigram.bigram_ids[1]).tolist(),
                       np.asarray(bigram.bigram_probs[1]).tolist(), strict=True))
  assert followers[5] == pytest.approx(2 / 3) and followers[6] == pytest.approx(1 / 3)
  with pytest.raises(DataError, match="start with <s>"):
    lm_demo.fit_ngrams(rows[:, 1:], 16)
