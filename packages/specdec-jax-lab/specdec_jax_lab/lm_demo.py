"""The decoder-only demo: English text, a BPE vocabulary, a Llama-style LM pair, n-gram drafters.

Leviathan et al.'s Table 3 measures a 97M GPT-like target on lm1b with unigram, bigram and
6M drafters. This builds the same kind of set from text this machine has, the English
side of the De->En dictionary (Debian's trans-de-en), at CPU scale::

    run_pipeline("configs/lm-demo/train.json", "runs/lm-demo")   # or stages=("data", ...)

Stages, each skipped when its result under `workdir` is current (the training stages also
resume mid-stage from their Orbax checkpoints, as `demo.run_pipeline`'s):

  data     English texts of >= `min_words` words, de-duplicated, split by a hash of the
           text (disjoint); a BPE vocabulary (`tokenizers`, Metaspace
           pre-tokenizer; <pad> 0, <s> 1, </s> 2, <unk> 3, BOS prepended by its template)
           written as tokenizer.json, so `sd.load_tokenizer(workdir / "data")` reads it;
           {split}.npz: "tokens" int32 [N, max_len] = <s> text </s>, right-padded with 0.
  target   a Llama-style LM (the recipe's "config"; vocabulary and special ids from the
  drafter  data), next-token cross-entropy (`training.LMLoss`).
  ngram    unigram and bigram tables of the training tokens (`NGramDrafter.fit`).
  eval     held-out perplexity of every model (`evaluation.perplexity`; the n-gram
           drafters' own, from their tables) into workdir/eval.json.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from typing import Any

import numpy as np

import specdec_jax as sd
from specdec_jax import config as config_lib
from specdec_jax.drafters.ngram import NGramDrafter
from specdec_jax.io.reports import make_dirs, read_json
from specdec_jax.models.model import Model, init_model
from specdec_jax_lab import demo, evaluation, training
from specdec_jax_lab.data import de_en
from specdec_jax_lab.errors import DataError, TrainingError

STAGES = ("data", "target", "drafter", "ngram", "eval")
SPLITS = ("train", "validation", "test")
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)        # ids 0, 1, 2, 3
REPO = demo.REPO


# ----------------------------------------------------------------------------- data


def english_texts(path: str = de_en.DEFAULT_PATH, min_words: int = 3,
                  max_chars: int | None = 200) -> list[str]:
  """The dictionary's English sides of >= `min_words` words, de-duplicated, sorted."""
  pairs = de_en.load_pairs(path, min_words=1, max_chars=max_chars)
  return sorted({p.en for p in pairs if de_en.word_count(p.en) >= min_words})


def split_texts(texts: list[str], valid_size: int, test_size: int, seed: int = 0
                ) -> dict[str, list[str]]:
  """Deterministic disjoint split: texts ordered by SHA-256 of (seed, text); the first
  `test_size` are test, the next `valid_size` validation, the rest train."""
  if len(texts) <= valid_size + test_size:
    raise DataError(f"{len(texts)} texts are too few for valid_size={valid_size} + "
                    f"test_size={test_size} plus a non-empty train split")
  order = sorted(texts, key=lambda t: hashlib.sha256(f"{seed}\x00{t}".encode()).digest())
  return {"test": order[:test_size], "validation": order[test_size:test_size + valid_size],
          "train": order[test_size + valid_size:]}


def train_bpe(texts: list[str], out_dir: str | pathlib.Path, vocab_size: int):
  """A BPE vocabulary with Llama's conventions, written as out_dir/tokenizer.json (+ its
  tokenizer_config.json); returns the loaded `HFTokenizer`."""
  try:
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers
  except ImportError as e:
    raise TrainingError("the LM demo's vocabulary needs the `tokenizers` library: "
                        "pip install 'specdec-jax[lm]'") from e
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  tok = tokenizers.Tokenizer(models.BPE(unk_token=UNK, fuse_unk=True))
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.decoder = decoders.Metaspace()
  tok.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False))
  tok.post_processor = processors.TemplateProcessing(
      single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 1)])
  tok.save(str(out / "tokenizer.json"))
  (out / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
       "pad_token": PAD, "unk_token": UNK}, indent=1) + "\n")
  return sd.load_tokenizer(out)


def encode_texts(tok, texts: list[str], max_len: int) -> tuple[np.ndarray, list[str]]:
  """(<s> text </s> rows int32 [N, max_len] right-padded with 0, the texts kept): rows
  longer than `max_len` are dropped."""
  rows, kept = [], []
  for t in texts:
    ids = tok.encode_one(t, add_eos=True)
    if len(ids) <= max_len:
      rows.append(ids)
      kept.append(t)
  out = np.zeros((len(rows), max_len), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out, kept


@dataclasses.dataclass(frozen=True)
class EnglishData:
  """What the data stage (`prepare_english`) builds: a recipe's "data" section.

  Attributes:
    vocab_size: the BPE vocabulary's size (special tokens included).
    max_len: tokens per row (<s> text </s>); longer texts are dropped.
    min_words: texts of fewer words are left out.
    valid_size, test_size: texts in the validation and test splits (the rest: train).
    seed: the seed of the hash order that splits the texts.
    path: the De->En dictionary file whose English side is read.
    limit: use only the first `limit` texts of the hash order (a quick slice); None: all.
  """

  vocab_size: int = 4096
  max_len: int = 32
  min_words: int = 3
  valid_size: int = 2000
  test_size: int = 2000
  seed: int = 0
  path: str = de_en.DEFAULT_PATH
  limit: int | None = None


def prepare_english(out_dir: str | pathlib.Path, data: EnglishData = EnglishData()) -> dict:
  """The data stage: tokenizer.json, {split}.npz ("tokens") and .txt, meta.json."""
  out = pathlib.Path(out_dir)
  texts = english_texts(data.path, data.min_words)
  if data.limit is not None:
    texts = sorted(texts, key=lambda t: hashlib.sha256(t.encode()).digest())[:data.limit]
  splits = split_texts(texts, data.valid_size, data.test_size, data.seed)
  tok = train_bpe(splits["train"], out, data.vocab_size)
  meta = {"source": data.path, "licence": "GPL-2.0-or-later (Debian trans-de-en, TU Chemnitz Ding)",
          "vocab_size": tok.vocab_size, "max_len": data.max_len, "min_words": data.min_words,
          "seed": data.seed, "limit": data.limit, "texts": len(texts), "splits": {}}
  for name in SPLITS:
    tokens, kept = encode_texts(tok, splits[name], data.max_len)
    np.savez(out / f"{name}.npz", tokens=tokens)
    (out / f"{name}.txt").write_text("".join(t + "\n" for t in kept), encoding="utf-8")
    meta["splits"][name] = {"texts": len(kept), "dropped_too_long": len(splits[name]) - len(kept),
                            "mean_tokens": float((tokens > 0).sum(1).mean()) if len(kept) else 0}
  meta["fingerprint"] = hashlib.sha256(
      (out / "tokenizer.json").read_bytes()
      + json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]
  (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
  return meta


def load_tokens(data_dir: str | pathlib.Path, split: str) -> np.ndarray:
  """int32 [N, max_len] sequences of one split of a prepared directory."""
  path = pathlib.Path(data_dir) / f"{split}.npz"
  try:
    with np.load(path) as arrays:
      return arrays["tokens"]
  except OSError as e:
    raise DataError(f"cannot read {str(path)!r}: {e.strerror or e}") from None
  except KeyError:
    raise DataError(f"{str(path)!r} holds no \"tokens\" array: not an LM demo split") from None


# ----------------------------------------------------------------------------- n-grams


def fit_ngrams(tokens: np.ndarray, vocab_size: int, top_k: int = 64) -> NGramDrafter:
  """The bigram table of the training sequences <s> text </s> (right-padded with 0).

  <s> is the context of each text's first token, never a predicted token: it stays out of
  the unigram (the most frequent token otherwise, and one the target never predicts).
  `.replace(lam=0.0)` is the unigram drafter; the default `lam` interpolates a little
  unigram mass into the bigram (a follower outside the top-k keeps a nonzero q)."""
  tokens = np.asarray(tokens)
  if tokens.size and not (tokens[:, 0] == 1).all():
    raise DataError("fit_ngrams expects rows that start with <s> (id 1)")
  rows = [row[1:int((row > 0).sum())] for row in tokens]
  return NGramDrafter.fit(rows, vocab_size, top_k=top_k, start_id=1)


def save_ngrams(path: pathlib.Path, drafter: NGramDrafter) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  np.savez(path, unigram=np.asarray(drafter.unigram), bigram_ids=np.asarray(drafter.bigram_ids),
           bigram_probs=np.asarray(drafter.bigram_probs), lam=drafter.lam)


def load_ngrams(path: str | pathlib.Path) -> dict[str, NGramDrafter]:
  """{"unigram", "bigram"} drafters from `save_ngrams`' file."""
  import jax.numpy as jnp
  with np.load(path) as a:
    bigram = NGramDrafter(unigram=jnp.asarray(a["unigram"]),
                          bigram_ids=jnp.asarray(a["bigram_ids"]),
                          bigram_probs=jnp.asarray(a["bigram_probs"]), lam=float(a["lam"]))
  return {"unigram": bigram.replace(lam=0.0), "bigram": bigram}


def ngram_perplexity(drafter: NGramDrafter, tokens: np.ndarray) -> float:
  """Perplexity of an n-gram drafter's q(x_t | x_{t-1}) on right-padded (pad 0) sequences,
  the first token of each row given, as `evaluation.perplexity`."""
  import jax
  import jax.numpy as jnp
  tokens = np.asarray(tokens)
  prev, nxt = tokens[:, :-1].reshape(-1), tokens[:, 1:].reshape(-1)
  keep = nxt != 0
  prev, nxt = prev[keep], nxt[keep]
  total = 0.0
  for i in range(0, len(prev), 4096):
    logq = drafter.logits_after(jnp.asarray(prev[i:i + 4096]))
    logq = logq - jax.nn.logsumexp(logq, axis=-1, keepdims=True)
    total -= float(jnp.sum(jnp.take_along_axis(logq, jnp.asarray(nxt[i:i + 4096])[:, None],
                                               axis=1)))
  return float(np.exp(total / max(len(nxt), 1)))


# ----------------------------------------------------------------------------- pipeline


def lm_config(recipe_section: dict, meta: dict):
  """The section's model config, with the data's vocabulary and special ids."""
  cfg = config_lib.get_config(REPO / recipe_section["config"])
  if not getattr(cfg, "is_decoder_only", False):
    raise TrainingError(f"{recipe_section['config']}: the LM demo trains decoder-only models "
                        "(a config with a \"family\")")
  return cfg.replace(vocab_size=int(meta["vocab_size"]), pad_id=0, bos_id=1, eos_id=2)


def run_pipeline(recipe_path: str | pathlib.Path, workdir: str | pathlib.Path,
                 stages=STAGES) -> dict:
  """Run `stages` ("all": every stage) of the recipe in `workdir`; {stage: its result}."""
  recipe = read_json(recipe_path, "recipe")
  workdir = pathlib.Path(workdir)
  make_dirs(workdir)
  stages = STAGES if stages in ("all", None) else tuple(stages)
  unknown = set(stages) - set(STAGES)
  if unknown:
    raise TrainingError(f"unknown stages {sorted(unknown)}; stages: {', '.join(STAGES)}")
  data_dir = workdir / "data"
  if "data" in stages and not (data_dir / "meta.json").exists():
    try:
      data = EnglishData(**recipe["data"])
    except TypeError as e:     # a typo must not surface as a raw TypeError
      raise TrainingError(f"recipe {recipe_path}, section 'data': {e}; known: "
                          f"{', '.join(f.name for f in dataclasses.fields(EnglishData))}") from None
    prepare_english(data_dir, data)
  meta = read_json(data_dir / "meta.json", "LM demo data")
  upstream = {"data": meta["fingerprint"]}     # other data: the models start over
  train = load_tokens(data_dir, "train")
  inputs, targets = training.next_token_pairs(train)
  pairs = {"inputs": inputs, "targets": targets}
  results = {}
  for name, seed in (("target", 0), ("drafter", 1)):
    if name in stages:
      results[name] = demo._stage_train(
          name, workdir, recipe, pairs,
          lambda name=name, seed=seed: init_model(lm_config(recipe[name], meta),
                                                  recipe[name].get("seed", seed)),
          upstream=upstream)
  ngram_path = workdir / "ngram" / "tables.npz"
  if "ngram" in stages:
    log_path = ngram_path.with_suffix(".json")
    # The tables are current for the same data and fit settings (context <s>: start_id 1).
    settings: dict[str, Any] = {"upstream": upstream, "start_id": 1,
                "top_k": int((recipe.get("ngram") or {}).get("top_k", 64))}
    if not ngram_path.exists() or not log_path.exists() \
        or read_json(log_path, "n-gram log") != settings:
      save_ngrams(ngram_path, fit_ngrams(train, int(meta["vocab_size"]), settings["top_k"]))
      log_path.write_text(json.dumps(settings) + "\n")
    results["ngram"] = load_ngrams(ngram_path)
  if "eval" in stages:
    results["eval"] = evaluate_all(workdir, (recipe.get("eval") or {}).get("split", "validation"))
  return results


def evaluate_all(workdir: str | pathlib.Path, split: str = "validation") -> dict:
  """Held-out perplexity of the workdir's target, drafter and n-gram drafters (those that
  exist), written to workdir/eval.json."""
  workdir = pathlib.Path(workdir)
  tokens = load_tokens(workdir / "data", split)
  out: dict[str, Any] = {"split": split, "sequences": int(len(tokens)),
         "tokens": int((tokens[:, 1:] > 0).sum()), "perplexity": {}, "num_params": {}}
  for name in ("target", "drafter"):
    if (workdir / name / "final").is_dir():
      model = sd.load(str(workdir / name / "final"))
      out["perplexity"][name] = evaluation.perplexity(model, tokens)["perplexity"]
      out["num_params"][name] = model.num_params()
  if (workdir / "ngram" / "tables.npz").exists():
    for name, drafter in load_ngrams(workdir / "ngram" / "tables.npz").items():
      out["perplexity"][name] = ngram_perplexity(drafter, tokens)
  (workdir / "eval.json").write_text(json.dumps(out, indent=1) + "\n")
  return out


def load_models(workdir: str | pathlib.Path) -> tuple[Model, dict]:
  """(target, {"drafter": the small LM, "unigram": ..., "bigram": ...}) of a workdir."""
  workdir = pathlib.Path(workdir)
  target = sd.load(str(workdir / "target" / "final"))
  drafters: dict[str, Any] = {"drafter": sd.load(str(workdir / "drafter" / "final"))}
  drafters.update(load_ngrams(workdir / "ngram" / "tables.npz"))
  return target, drafters


# ----------------------------------------------------------------------------- alpha


#: Leviathan et al. (2023), Table 3: a GPT-like 97M target on lm1b (8k BERT vocabulary).
PAPER_ALPHA = {("unigram", 0.0): 0.03, ("bigram", 0.0): 0.05, ("drafter", 0.0): 0.88,
               ("unigram", 1.0): 0.03, ("bigram", 1.0): 0.05, ("drafter", 1.0): 0.89}


def _drafter_logits(drafter, tokens: np.ndarray):
  """[B, L] -> [B, L, V]: the drafter's logits for the token after each position."""
  import jax.numpy as jnp
  if isinstance(drafter, NGramDrafter):
    b, n = tokens.shape
    return drafter.logits_after(jnp.asarray(tokens.reshape(-1))).reshape(b, n, -1)
  return drafter.forward(tokens)


def beta(p_logits, q_logits, temperature: float, eos_id: int | None = None):
  """Leviathan's beta = sum_x min(p(x), q(x)) per position: [..., V] x 2 -> [...].

  At temperature 0 both distributions are their argmax's one-hot: beta = [argmax p ==
  argmax q] (ties to the lowest id). `eos_id`: leave EOS's term out (the acceptance of
  any other token), see `teacher_forced_alpha`."""
  import jax
  import jax.numpy as jnp
  if temperature == 0:
    p_max, q_max = jnp.argmax(p_logits, -1), jnp.argmax(q_logits, -1)
    match = p_max == q_max
    if eos_id is not None:
      match = match & (p_max != eos_id)
    return match.astype(jnp.float32)
  p = jax.nn.softmax(p_logits.astype(jnp.float32) / temperature, axis=-1)
  q = jax.nn.softmax(q_logits.astype(jnp.float32) / temperature, axis=-1)
  both = jnp.minimum(p, q)
  if eos_id is not None:
    both = both.at[..., eos_id].set(0.0)
  return jnp.sum(both, axis=-1)


def teacher_forced_alpha(target: Model, drafter, tokens, lengths=None,
                         temperature: float = 0.0, batch_size: int = 64,
                         start=None) -> dict:
  """alpha = E[beta] over every position of given right-padded sequences.

  Position t of row b (start[b] <= t < lengths[b]) scores the drafter's and the target's
  next-token distributions given tokens[b, :t]: the beta the round engine scores when
  it proposes there. On the target's own outputs this is the engine's alpha; on
  held-out text, alpha on that text's prefixes.

  alpha_without_eos leaves EOS's term out of beta. An accepted EOS ends the row: no
  token follows it, so it yields the one token a rejection there would (the target's
  own), and the expected tokens per target call of Leviathan's Theorem 8,
  1 + a + ... + a^gamma, holds with a = alpha_without_eos, not alpha. (A unigram drafter
  whose most frequent token is EOS drafts only EOS at t = 0: alpha > 0, one token per call.)

  Args:
    target: a decoder-only `Model`.
    drafter: a decoder-only `Model` or an `NGramDrafter` (same vocabulary).
    tokens: int [N, L]; lengths: [N] (default: one past the last token != pad).
    temperature: 0 (greedy: agreement of the argmaxes) or > 0 (both distributions
      divided by it, as the sampler's adjusted distributions).
    start: [N] first scored position of each row (default 1: every token after the first).

  Returns:
    {"alpha", "alpha_without_eos", "positions"}.
  """
  import jax.numpy as jnp

  from specdec_jax import batching as lm
  tokens = np.asarray(tokens, np.int32)
  lengths = (lm.prompt_lengths(tokens, target.config.pad_id) if lengths is None
             else np.asarray(lengths))
  start = np.ones(len(tokens), np.int64) if start is None else np.asarray(start)
  t = np.arange(1, tokens.shape[1])[None, :]
  mask = (t < lengths[:, None]) & (t >= start[:, None])
  eos = target.config.eos_id
  total, total_no_eos, count = 0.0, 0.0, 0
  for i in range(0, len(tokens), batch_size):
    x, m = tokens[i:i + batch_size], mask[i:i + batch_size]
    p, q = target.forward(x)[:, :-1], _drafter_logits(drafter, x)[:, :-1]
    total += float(jnp.sum(beta(p, q, temperature) * m))
    total_no_eos += float(jnp.sum(beta(p, q, temperature, eos_id=eos) * m))
    count += int(m.sum())
  return {"alpha": total / max(count, 1), "alpha_without_eos": total_no_eos / max(count, 1),
          "positions": count}


def decoded_alpha(target: Model, drafter, prompts, prompt_lengths, temperature: float = 0.0,
                  gamma: int = 4, max_new_tokens: int = 24, rng: int = 0) -> dict:
  """alpha on the target's own path: speculative decoding of the prompts (right-padded
  [B, P], lengths [B]) with `drafter` and `gamma` (`sd.decode`), then beta at every
  position of each row's output, EOS included and nothing after it (`teacher_forced_alpha`
  on prompt + output). The engine's tokens per target call.

  Returns:
    {"alpha", "alpha_without_eos", "positions", "tokens_per_target_call"}.
  """
  sampling = sd.Greedy() if temperature == 0 else sd.Sampling(temperature=temperature)
  out = sd.decode(target, sd.Speculative(drafter, gamma=gamma), prompts,
                  max_new_tokens=max_new_tokens, sampling=sampling, rng=rng,
                  prompt_lengths=prompt_lengths)
  prompts, starts = np.asarray(prompts), np.asarray(prompt_lengths)
  new, n = np.asarray(out.tokens), np.asarray(out.lengths)
  path = np.full((len(prompts), prompts.shape[1] + new.shape[1]), target.config.pad_id,
                 np.int32)
  for b, (p, k) in enumerate(zip(starts, n, strict=True)):
    path[b, :p], path[b, p:p + k] = prompts[b, :p], new[b, :k]
  a = teacher_forced_alpha(target, drafter, path, lengths=starts + n,
                           temperature=temperature, start=starts)
  return {**a, "tokens_per_target_call": float(out.stats["tokens_per_target_call"])}


def alpha_table(workdir: str | pathlib.Path, split: str = "validation",
                temperatures=(0.0, 1.0), limit: int | None = 1000, decoded: bool = False,
                gamma: int = 4, prompt_tokens: int = 3) -> list[dict]:
  """alpha of every drafter of a workdir against its target, per temperature, with
  the best gamma by Leviathan's Theorem 8 for alpha_without_eos (`teacher_forced_alpha`;
  cost ratio c: the drafter's decode MACs per token over the target's for the LM
  drafter, 0 for the tables; gamma <= 8).

  `decoded`: also `decoded_alpha` at `gamma`, the target continuing the first
  `prompt_tokens` tokens (BOS included) of each text."""
  from specdec_jax import theory
  target, drafters = load_models(workdir)
  tokens = load_tokens(pathlib.Path(workdir) / "data", split)[:limit]
  lengths = np.minimum((tokens > 0).sum(1), prompt_tokens).astype(np.int32)
  prompts = np.where(np.arange(prompt_tokens)[None, :] < lengths[:, None],
                     tokens[:, :prompt_tokens], 0).astype(np.int32)
  rows = []
  for name, drafter in drafters.items():
    c = (drafter.config.decode_macs_per_token() / target.config.decode_macs_per_token()
         if isinstance(drafter, Model) else 0.0)
    for t in temperatures:
      a = teacher_forced_alpha(target, drafter, tokens, temperature=t)
      best = theory.optimal_gamma(a["alpha_without_eos"], c, max_gamma=8)
      row = {"drafter": name, "temperature": t, "alpha": a["alpha"],
             "alpha_without_eos": a["alpha_without_eos"],
             "positions": a["positions"], "c": c, "gamma": best.gamma,
             "improvement": best.improvement, "paper_alpha": PAPER_ALPHA.get((name, t))}
      if decoded:
        d = decoded_alpha(target, drafter, prompts, lengths, t, gamma)
        row.update(decoded_alpha=d["alpha"], decoded_positions=d["positions"],
                   decoded_gamma=gamma, tokens_per_target_call=d["tokens_per_target_call"])
      rows.append(row)
  return rows


def alpha_markdown(rows: list[dict], meta: dict) -> str:
  """The Markdown table of `alpha_table`'s rows beside Leviathan's Table 3."""
  names = {"unigram": "unigram", "bigram": "bigram", "drafter": "small LM"}
  decoded = bool(rows) and "decoded_alpha" in rows[0]
  head = "| drafter | t | alpha, held-out prefixes | alpha (Leviathan, lm1b) | " \
         "alpha without EOS | c | best gamma | expected improvement |"
  if decoded:
    head += f" alpha decoding, gamma {rows[0]['decoded_gamma']} | tokens per target call |"
  lines = [head, "|---" * head.count(" | ") + "|---|"]
  for r in rows:
    paper = "" if r["paper_alpha"] is None else f"{r['paper_alpha']:.2f}"
    line = (f"| {names.get(r['drafter'], r['drafter'])} | {r['temperature']:g} | "
            f"{r['alpha']:.3f} | {paper} | {r['alpha_without_eos']:.3f} | {r['c']:.3f} | "
            f"{r['gamma']} | "
            f"{r['improvement']:.2f}x |")
    if decoded:
      line += f" {r['decoded_alpha']:.3f} | {r['tokens_per_target_call']:.2f} |"
    lines.append(line)
  return "\n".join(lines) + "\n"


def write_results(workdir: str | pathlib.Path, out_dir: str | pathlib.Path,
                  split: str = "validation", limit: int | None = 1000,
                  decoded: bool = False) -> pathlib.Path:
  """out_dir/alpha.md (perplexities, then alpha beside Table 3) and out_dir/alpha.json."""
  workdir, out_dir = pathlib.Path(workdir), pathlib.Path(out_dir)
  meta = read_json(workdir / "data" / "meta.json", "LM demo data")
  ev = evaluate_all(workdir, split)
  rows = alpha_table(workdir, split, limit=limit, decoded=decoded)
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / "alpha.json").write_text(json.dumps({"eval": ev, "alpha": rows}, indent=1) + "\n")
  ppl = ["| model | parameters | training steps (batch) | perplexity |", "|---|---|---|---|"]
  for name in ("target", "drafter", "bigram", "unigram"):
    if name in ev["perplexity"]:
      params = ev["num_params"].get(name)
      log = demo._final_log(workdir, name) or {}
      batch = (read_json(workdir / name / "train_config.json", "train config")["batch_size"]
               if (workdir / name / "train_config.json").exists() else None)
      steps = f"{log['steps']} ({batch})" if "steps" in log else ""
      ppl.append(f"| {name} | {'' if params is None else f'{params / 1e6:.2f}M'} | {steps} | "
                 f"{ev['perplexity'][name]:.1f} |")
  n = rows[0]["positions"] if rows else 0
  # A model the workdir did not train (its train_log's "seeded_from": e.g. the bundled
  # bfloat16 pair copied in) is named as such: its steps are those of the run that made it.
  seeded = {name: log["seeded_from"] for name in ("target", "drafter")
            if "seeded_from" in (log := demo._final_log(workdir, name) or {})}
  text = (
      "# Decoder-only demo: perplexity and alpha per drafter\n\n"
      f"English side of the De-En dictionary ({meta['splits']['train']['texts']} training "
      f"texts of >= {meta['min_words']} words), BPE vocabulary of {meta['vocab_size']}; "
      f"Llama-style target and drafter (`configs/lm-demo/`)."
      + ("" if not seeded else
         f" The {' and '.join(seeded)} {'is' if len(seeded) == 1 else 'are'} not trained in "
         f"the workdir but seeded from {' and '.join(f'`{s}`' for s in seeded.values())}: "
         f"training steps are those of the run that produced "
         f"{'it' if len(seeded) == 1 else 'them'}.")
      + f" Held-out {split} split: "
      f"{ev['sequences']} texts, {ev['tokens']} predicted tokens (BOS given).\n\n"
      + "\n".join(ppl) + "\n\n"
      f"alpha = E[beta], beta = sum_x min(p(x), q(x)), over {n} next-token positions of the "
      f"first {limit} {split} texts (teacher-forced prefixes of held-out text); t = 0 is the "
      "agreement of the argmaxes. Leviathan et al. measure a GPT-like 97M target on lm1b "
      "(unigram, bigram and a 6M GPT-like drafter). Best gamma <= 8 and its expected "
      "walltime improvement by their Theorem 8, with c the ratio of decode MACs per token "
      "(0 for the tables), for alpha without EOS: an accepted EOS ends the row, so it "
      "yields no more tokens than a rejection (the unigram's most frequent token is EOS, "
      "its only draft at t = 0)."
      + (" The decoding columns run `sd.decode` with `sd.Speculative` continuing the first "
         "3 tokens of each text for up to 24 tokens: alpha is beta along the target's own "
         "output, up to its EOS (as Leviathan measure it), tokens per target call the "
         "engine's." if decoded else "")
      + "\n\n" + alpha_markdown(rows, meta)
      + "\nRegenerate: `python -m specdec_jax_lab.lm_demo --workdir runs/lm-demo --results "
        f"packages/specdec-jax-lab/results/lm-demo{' --decoded' if decoded else ''}`\n")
  (out_dir / "alpha.md").write_text(text)
  return out_dir / "alpha.md"


LM_ASSETS = demo.source_assets("demo-en-lm")   # bundle's default destination


def bundle(workdir: str | pathlib.Path, assets: pathlib.Path = LM_ASSETS) -> pathlib.Path:
  """Ship the trained pair into specdec-jax-demo-small's assets in bfloat16, with its tokenizer:
  `sd.load("demo-en-lm/target")`, `"demo-en-lm/drafter"`, `sd.load_tokenizer("demo-en-lm")`."""
  import shutil

  from specdec_jax.io.checkpoints import save_checkpoint
  workdir, assets = pathlib.Path(workdir), pathlib.Path(assets)
  assets.mkdir(parents=True, exist_ok=True)
  for name in ("target", "drafter"):
    model = sd.load(str(workdir / name / "final"))
    dest = assets / name
    shutil.rmtree(dest, ignore_errors=True)
    save_checkpoint(str(dest), model.config, model.params, dtype="bfloat16")
    for f in dest.iterdir():
      f.chmod(0o644)
  for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(workdir / "data" / name, assets / name)
  return assets


def main(argv=None) -> int:
  import argparse
  parser = argparse.ArgumentParser(
      prog="python -m specdec_jax_lab.lm_demo",
      description="Train the decoder-only demo (resumable) and write its perplexity and "
                  "alpha tables.")
  parser.add_argument("--recipe", default=str(REPO / "configs" / "lm-demo" / "train.json"))
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--stages", default="all", help=f"comma-separated of {', '.join(STAGES)}")
  parser.add_argument("--results", help="write alpha.md / alpha.json into this directory")
  parser.add_argument("--decoded", action="store_true",
                      help="also measure alpha while speculative decoding (sd.decode)")
  parser.add_argument("--bundle", action="store_true",
                      help="ship the trained pair into specdec-jax-demo-small's assets "
                           "(demo-en-lm)")
  args = parser.parse_args(argv)
  stages = "all" if args.stages == "all" else args.stages.split(",")
  run_pipeline(args.recipe, args.workdir, stages)
  if args.results:
    print(write_results(args.workdir, args.results, decoded=args.decoded))
  if args.bundle:
    print(bundle(args.workdir))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
