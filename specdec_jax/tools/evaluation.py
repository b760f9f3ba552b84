"""Translation quality and speed of a model on a prepared split: BLEU, chrF, ms/token.

    import specdec_jax as sd
    from specdec_jax.tools.evaluation import evaluate
    target = sd.load("runs/demo/target/final")
    evaluate(target, "runs/demo/data")                                 # baseline greedy
    evaluate(target, "runs/demo/data", drafter=sd.load("runs/demo/drafter/final"), gamma=4)
    evaluate(target, "runs/demo/data", drafter="ngram", method="sample", limit=200)

`data` is a directory written by `specdec_jax.tools.data.prepare.prepare_de_en` (its
`split`, default "test", is evaluated and its spiece.model decodes) or one split
as returned by `prepare.load_split` (then pass `tokenizer`). Hypotheses are
decoded in batches of a fixed size (the last batch is padded by repeating its
final row, so one compiled shape serves every batch) and scored against the
English side of the split with sacrebleu's corpus BLEU and chrF.

Speculative statistics are aggregated over the real (unpadded) rows from the
per-row counters: acceptance_rate = accepted / drafted, tokens_per_target_call =
generated tokens / target calls, alpha = drafted-weighted mean of the rows' alpha.
"""

from __future__ import annotations

import pathlib
import time
from typing import Any, Sequence

import jax
import numpy as np

from specdec_jax import drafters as drafters_lib
from specdec_jax import sampling as sampling_lib
from specdec_jax.tools.data import prepare
from specdec_jax.decoding.autoregressive import generate
from specdec_jax.decoding.speculative import speculative_generate
from specdec_jax.drafters import NGramDrafter, PromptLookupDrafter
from specdec_jax.models.model import Model

METHODS = ("greedy", "sample")
DRAFTER_KINDS = ("ngram", "prompt-lookup")


class EvaluationError(ValueError):
  """An evaluation request that cannot be served (bad data, drafter, method, sizes)."""


# ----------------------------------------------------------------------------- inputs


def resolve_split(data, split: str = "test") -> tuple[dict, pathlib.Path | None]:
  """(split dict {'inputs', 'targets', 'pairs'}, data dir or None) from a dir or a split dict."""
  if isinstance(data, dict):
    missing = {"inputs", "pairs"} - set(data)
    if missing:
      raise EvaluationError(f"split dict lacks {sorted(missing)} (use prepare.load_split)")
    return data, None
  data_dir = pathlib.Path(data)
  if not data_dir.is_dir():
    raise EvaluationError(f"data directory {str(data_dir)!r} does not exist")
  if not (data_dir / f"{split}.npz").is_file():
    have = sorted(p.stem for p in data_dir.glob("*.npz"))
    raise EvaluationError(f"{str(data_dir)!r} has no split {split!r} (splits: "
                          f"{', '.join(have) or 'none'}; prepare it with prepare_de_en)")
  return prepare.load_split(data_dir, split), data_dir


def resolve_sampling(method: str = "greedy", sampling=None):
  """`method` "greedy" / "sample" (default sd.Sampling()) or an explicit `sampling` object."""
  if method not in METHODS:
    raise EvaluationError(f"method must be one of {METHODS}, got {method!r}")
  if sampling is None:
    return sampling_lib.Greedy() if method == "greedy" else sampling_lib.Sampling()
  sampling = sampling_lib.as_method(sampling)
  if method == "greedy" and not sampling.is_greedy:
    raise EvaluationError(f"method 'greedy' conflicts with sampling={sampling!r}")
  return sampling


def resolve_drafter(drafter, target: Model, data_dir: pathlib.Path | None,
                    train_targets: np.ndarray | None = None):
  """None, a Model, any drafter object, "ngram" (fitted on the TRAIN split's targets) or
  "prompt-lookup" -> a drafter for `target` (vocabulary checked), or None."""
  if drafter is None:
    return None
  vocab = target.config.vocab_size
  if isinstance(drafter, str):
    if drafter == "prompt-lookup":
      drafter = PromptLookupDrafter(vocab_size=vocab)
    elif drafter == "ngram":
      if train_targets is None:
        if data_dir is None:
          raise EvaluationError("drafter 'ngram' is fitted on the train split: give a data "
                                "directory, or pass train_targets")
        train_targets = prepare.load_split(data_dir, "train")["targets"]
      drafter = NGramDrafter.fit([row[row > 0] for row in np.asarray(train_targets)],
                                 vocab_size=vocab)
    else:
      raise EvaluationError(f"drafter must be a Model, a drafter object or one of "
                            f"{DRAFTER_KINDS}, got {drafter!r}")
  return drafters_lib.as_drafter(drafter, target)


def padded_batches(inputs: np.ndarray, batch_size: int) -> list[tuple[np.ndarray, int]]:
  """[(batch [batch_size, L], real rows)]: the last batch padded by repeating its final row."""
  out = []
  for i in range(0, len(inputs), batch_size):
    chunk = inputs[i:i + batch_size]
    real = len(chunk)
    if real < batch_size:
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real, 0)])
    out.append((chunk, real))
  return out


# ----------------------------------------------------------------------------- scoring


def detokenize(tokens: np.ndarray, lengths: np.ndarray, tokenizer) -> list[str]:
  """Texts of decoded rows; ids beyond the SentencePiece vocabulary show as <unk>."""
  texts = []
  for row, n in zip(np.asarray(tokens), np.asarray(lengths)):
    row = row[:int(n)]
    row = np.where(row < tokenizer.vocab_size, row, tokenizer.unk_id)
    texts.append(tokenizer.decode_one(row))
  return texts


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
  """sacrebleu corpus BLEU and chrF (0-100) of hypotheses against one reference each."""
  import sacrebleu
  if len(hypotheses) != len(references):
    raise EvaluationError(f"{len(hypotheses)} hypotheses for {len(references)} references")
  refs = [list(references)]
  return {"bleu": float(sacrebleu.corpus_bleu(list(hypotheses), refs).score),
          "chrf": float(sacrebleu.corpus_chrf(list(hypotheses), refs).score)}


def aggregate_stats(rows: list[dict[str, np.ndarray]], lengths: np.ndarray,
                    speculative: bool) -> dict[str, Any]:
  """Decode statistics of all real rows, from per-batch dicts already cut to the real rows.

  Each dict holds, speculative: per-row `target_calls`, `drafter_calls`, `drafted`,
  `accepted`, `alpha`; baseline: the batch's scalar `target_calls` and its `rows`.
  """
  tokens = float(np.sum(lengths))
  if not speculative:
    calls = sum(int(r["target_calls"]) for r in rows)
    row_calls = sum(float(r["target_calls"]) * int(r["rows"]) for r in rows)
    return {"target_calls": calls, "tokens_per_target_call": tokens / max(row_calls, 1.0)}
  cat = {k: np.concatenate([np.asarray(r[k]) for r in rows])
         for k in ("target_calls", "drafter_calls", "drafted", "accepted", "alpha")}
  drafted = cat["drafted"].astype(np.float64)
  return {"target_calls": int(cat["target_calls"].sum()),
          "drafter_calls": int(cat["drafter_calls"].sum()),
          "drafted": int(drafted.sum()), "accepted": int(cat["accepted"].sum()),
          "acceptance_rate": float(cat["accepted"].sum()) / max(float(drafted.sum()), 1.0),
          "tokens_per_target_call": tokens / max(float(cat["target_calls"].sum()), 1.0),
          "alpha": float(np.sum(cat["alpha"] * drafted)) / max(float(drafted.sum()), 1.0)}


def _batch_stats(stats, real: int, speculative: bool) -> dict[str, np.ndarray]:
  if not speculative:
    return {"target_calls": np.asarray(stats["target_calls"]), "rows": real}
  return {k: np.asarray(stats[f"{k}_per_row"])[:real]
          for k in ("target_calls", "drafter_calls", "drafted", "accepted", "alpha")}


# ----------------------------------------------------------------------------- evaluate


def _decode_fn(model: Model, drafter, gamma: int, max_new_tokens: int, sampling):
  if drafter is None:
    return lambda tokens, rng: generate(model, tokens, max_new_tokens=max_new_tokens,
                                        sampling=sampling, rng=rng)
  return lambda tokens, rng: speculative_generate(model, drafter, tokens, gamma=gamma,
                                                  max_new_tokens=max_new_tokens,
                                                  sampling=sampling, rng=rng)


def _check_sizes(batch_size: int, gamma: int, max_new_tokens, limit) -> None:
  for name, value, least in (("batch_size", batch_size, 1), ("gamma", gamma, 1),
                             ("max_new_tokens", max_new_tokens, 1), ("limit", limit, 1)):
    if value is not None and (not isinstance(value, (int, np.integer)) or value < least):
      raise EvaluationError(f"{name} must be an integer >= {least}, got {value!r}")


def evaluate(model: Model, data, *, split: str = "test", method: str = "greedy",
             drafter=None, gamma: int = 5, sampling=None, batch_size: int = 32,
             max_new_tokens: int | None = None, limit: int | None = None, tokenizer=None,
             seed: int = 0, warmup: bool = False,
             train_targets: np.ndarray | None = None) -> dict[str, Any]:
  """BLEU / chrF and speed of `model` (baseline, or speculative with `drafter`) on a split.

  Args:
    model: the (target) model.
    data: a prepared data directory, or a split dict from `prepare.load_split`.
    split: which split of a data directory ("test", "validation", "train").
    method: "greedy" or "sample"; `sampling` (sd.Greedy() / sd.Sampling(...)) refines it.
    drafter: None (baseline `sd.generate`), a Model, a drafter object, "ngram" (bigram
      tables fitted on the train split's targets, or on `train_targets`) or "prompt-lookup".
    gamma: drafts per round (speculative only).
    batch_size: rows per decode call (at most the number of pairs); the last batch is
      padded to this size.
    max_new_tokens: decode budget per row (default: the split's target width).
    limit: evaluate only the first `limit` pairs.
    tokenizer: a Tokenizer (default: the data directory's spiece.model).
    seed: PRNG seed; batch i uses fold_in(PRNGKey(seed), i).
    warmup: decode the first batch once untimed, so timing excludes compilation.

  Returns:
    dict with bleu, chrf, pairs, generated_tokens, wall_s, ms_per_token, tokens_per_s,
    method, speculative, gamma, stats (decode statistics), hypotheses, references.
  """
  _check_sizes(batch_size, gamma, max_new_tokens, limit)
  sampling = resolve_sampling(method, sampling)
  split_data, data_dir = resolve_split(data, split)
  inputs = np.asarray(split_data["inputs"], np.int32)
  references = [p.en if hasattr(p, "en") else p["en"] for p in split_data["pairs"]]
  if len(references) != len(inputs):
    raise EvaluationError(f"split has {len(inputs)} inputs but {len(references)} text pairs")
  if limit is not None:
    inputs, references = inputs[:limit], references[:limit]
  if not len(inputs):
    raise EvaluationError("the split is empty: nothing to evaluate")
  if tokenizer is None:
    if data_dir is None:
      raise EvaluationError("pass tokenizer= when evaluating a split dict")
    from specdec_jax.io.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(data_dir / "spiece.model")
  if max_new_tokens is None:
    targets = split_data.get("targets")
    max_new_tokens = int(targets.shape[1]) if targets is not None else int(inputs.shape[1])
  drafter = resolve_drafter(drafter, model, data_dir, train_targets)
  speculative = drafter is not None
  decode = _decode_fn(model, drafter, gamma, max_new_tokens, sampling)

  batch_size = min(batch_size, len(inputs))   # a small split needs no padding rows
  batches = padded_batches(inputs, batch_size)
  base = jax.random.PRNGKey(seed)
  if warmup:
    jax.block_until_ready(decode(batches[0][0], base))
  start = time.perf_counter()
  outputs = []
  for i, (chunk, real) in enumerate(batches):
    out = jax.device_get(decode(chunk, jax.random.fold_in(base, i)))
    outputs.append((out, real))
  wall = time.perf_counter() - start

  hypotheses, lengths, rows = [], [], []
  for out, real in outputs:
    lengths.append(np.asarray(out.lengths)[:real])
    hypotheses += detokenize(np.asarray(out.tokens)[:real], lengths[-1], tokenizer)
    rows.append(_batch_stats(out.stats, real, speculative))
  lengths = np.concatenate(lengths)
  generated = int(lengths.sum())
  return {**corpus_scores(hypotheses, references),
          "pairs": len(references), "generated_tokens": generated, "wall_s": wall,
          "ms_per_token": 1e3 * wall / generated if generated else None,
          "tokens_per_s": generated / wall if wall > 0 else None,
          "includes_compile": not warmup, "batch_size": batch_size,
          "max_new_tokens": max_new_tokens, "method": "speculative" if speculative else "baseline",
          "sampling": repr(sampling), "speculative": speculative,
          "gamma": gamma if speculative else None,
          "stats": aggregate_stats(rows, lengths, speculative),
          "hypotheses": hypotheses, "references": references}
