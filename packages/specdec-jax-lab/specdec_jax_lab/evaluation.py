"""Translation quality and speed of a model on a prepared split: BLEU, chrF, ms/token.

    import specdec_jax as sd
    from specdec_jax_lab.evaluation import EvalSettings, evaluate
    target = sd.load("runs/demo/target/final")
    evaluate(target, "runs/demo/data")                                 # baseline greedy
    evaluate(target, "runs/demo/data", EvalSettings(gamma=4),
             drafter=sd.load("runs/demo/drafter/final"))
    evaluate(target, "runs/demo/data", EvalSettings(method="sample", limit=200),
             drafter="ngram")

`data` is a directory written by `specdec_jax_lab.data.prepare.prepare_de_en` (its
`split`, default "test", is evaluated and its spiece.model decodes), a `.jsonl` file of
{"de", "en"} pairs such as tests/data/demo_test_pairs.jsonl (tokenised with `tokenizer`,
default the bundled demo tokenizer), or one split as returned by `prepare.load_split`
(then pass `tokenizer`). Hypotheses are
decoded in batches of a fixed size (`batching.padded_batches`: the last batch is
padded by repeating its final row, so one compiled shape serves every batch) and
scored against the English side of the split with sacrebleu's corpus BLEU and chrF.

Decode statistics are those of `stats.merge_outputs` over the real (unpadded) rows,
without the per-row values, as Python numbers: acceptance_rate = accepted / drafted,
tokens_per_target_call = generated tokens / target calls (counted per row),
alpha = sum(beta_sum) / sum(beta_count).
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any, Sequence

import jax
import numpy as np

import specdec_jax as sd
from specdec_jax import loading as models
from specdec_jax import sampling as sampling_lib
from specdec_jax.batching import padded_batches
from specdec_jax.io.reports import to_jsonable
from specdec_jax.io.tokenizer import check_tokenizer
from specdec_jax.models.model import Model
from specdec_jax.runs import (
  Run,
  decode_corpus,
  totals,
)
from specdec_jax.sampling import make_sampling
from specdec_jax_lab.data import prepare
from specdec_jax_lab.data.de_en import SPLITS
from specdec_jax_lab.errors import EvaluationError

# ----------------------------------------------------------------------------- inputs


def is_jsonl(data) -> bool:
  """Whether `data` names a `.jsonl` file of text pairs (not a prepared directory)."""
  return isinstance(data, (str, pathlib.Path)) and str(data).endswith(".jsonl")


def check_split(data, split: str) -> None:
  """EvaluationError unless `split` names a split of `data`: one of `SPLITS` ("test" alone
  for a `.jsonl` file, which is one split). Cheap: the tools call it before loading models."""
  if split not in SPLITS:
    raise EvaluationError(f"there is no split {split!r}: a prepared data directory holds "
                          f"{', '.join(SPLITS)}")
  if is_jsonl(data) and split != "test":
    raise EvaluationError(f"split {split!r}: a .jsonl file of pairs is one split (evaluated "
                          "as 'test'); the splits are a prepared data directory's")


def resolve_split(data, split: str = "test", tokenizer=None
                  ) -> tuple[dict, pathlib.Path | None]:
  """(split dict {'inputs', 'targets', 'pairs'}, data dir or None) from a dir, a `.jsonl`
  file of pairs (tokenised with `tokenizer`, default the bundled demo one) or a split dict."""
  if not isinstance(data, dict):
    check_split(data, split)
  if isinstance(data, dict):
    missing = {"inputs", "pairs"} - set(data)
    if missing:
      raise EvaluationError(f"split dict lacks {sorted(missing)} (use prepare.load_split)")
    return data, None
  if is_jsonl(data):
    if not pathlib.Path(data).is_file():
      raise EvaluationError(f"data file {str(data)!r} does not exist")
    return prepare.load_jsonl_split(data, tokenizer), None
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
  default = make_sampling(method)
  if sampling is None:
    return default
  sampling = sampling_lib.as_sampling(sampling)
  if default.is_greedy and not sampling.is_greedy:
    raise EvaluationError(f"method 'greedy' conflicts with sampling={sampling!r}")
  return sampling


def resolve_drafter(drafter, target: Model, data_dir: pathlib.Path | None,
                    train_targets: np.ndarray | None = None):
  """None, a Model, any drafter object, "ngram" (fitted on the TRAIN split's targets) or
  "prompt-lookup" -> a drafter for `target` (vocabulary checked), or None."""
  def ngram_rows():
    if train_targets is not None:
      return train_targets
    if data_dir is None:
      raise EvaluationError("drafter 'ngram' is fitted on the train split: give a data "
                            "directory, or pass train_targets")
    return prepare.load_split(data_dir, "train")["targets"]
  return models.resolve_drafter(drafter, target, ngram_rows=ngram_rows)


# ----------------------------------------------------------------------------- scoring


def detokenize(tokens: np.ndarray, lengths: np.ndarray, tokenizer) -> list[str]:
  """Texts of decoded rows; ids beyond the SentencePiece vocabulary show as <unk>."""
  texts = []
  for row, n in zip(np.asarray(tokens), np.asarray(lengths), strict=True):
    row = row[:int(n)]
    if tokenizer.unk_id is None:     # a tokenizer without <unk>: such ids are dropped
      row = row[row < tokenizer.vocab_size]
    else:
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


# ----------------------------------------------------------------------------- evaluate


def split_inputs(data, split: str, limit: int | None, tokenizer=None):
  """(inputs [N, L], English references, data dir or None, default max_new_tokens)."""
  split_data, data_dir = resolve_split(data, split, tokenizer)
  inputs = np.asarray(split_data["inputs"], np.int32)
  references = [p.en if hasattr(p, "en") else p["en"] for p in split_data["pairs"]]
  if len(references) != len(inputs):
    raise EvaluationError(f"split has {len(inputs)} inputs but {len(references)} text pairs")
  if limit is not None:
    inputs, references = inputs[:limit], references[:limit]
  if not len(inputs):
    raise EvaluationError("the split is empty: nothing to evaluate")
  targets = split_data.get("targets")
  width = int(targets.shape[1]) if targets is not None else int(inputs.shape[1])
  return inputs, references, data_dir, width


def data_tokenizer(data, data_dir: pathlib.Path | None):
  """The tokenizer of a prepared dir (its spiece.model) or of a `.jsonl` file (the bundled
  demo tokenizer)."""
  from specdec_jax.io.tokenizer import load_tokenizer
  if is_jsonl(data):
    return load_tokenizer(prepare.DEFAULT_TOKENIZER)
  if data_dir is None:
    raise EvaluationError("pass tokenizer= when evaluating a split dict")
  return load_tokenizer(data_dir / "spiece.model")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSettings:
  """How `evaluate` decodes and scores a split.

  Attributes:
    split: which split of a data directory ("test", "validation", "train").
    method: "greedy" or "sample"; `sampling` refines it.
    sampling: sd.Greedy() / sd.Sampling(...) (None: the default of `method`).
    gamma: drafts per round (speculative only).
    batch_size: rows per decode call (at most the number of pairs); the last batch is
      padded to this size.
    max_new_tokens: decode budget per row (None: the split's target width).
    limit: evaluate only the first `limit` pairs (None: all of them).
    seed: PRNG seed; batch i uses `methods.batch_key(seed, i)` (batch 0: PRNGKey(seed)).
    warmup: decode the first batch once untimed (every batch has its shape), so the
      reported time excludes compilation; False times the first call's compile too.
  """

  split: str = "test"
  method: str = "greedy"
  sampling: sampling_lib.SamplingSettings | None = None
  gamma: int = 5
  batch_size: int = 32
  max_new_tokens: int | None = None
  limit: int | None = None
  seed: int = 0
  warmup: bool = True

  def __post_init__(self):
    for name in ("batch_size", "gamma", "max_new_tokens", "limit"):
      value = getattr(self, name)
      if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
        raise EvaluationError(f"{name} must be an integer >= 1, got {value!r}")
    resolve_sampling(self.method, self.sampling)


def evaluate(model: Model, data, settings: EvalSettings = EvalSettings(), *, drafter=None,
             decode_method: Run | None = None, tokenizer=None,
             train_targets: np.ndarray | None = None) -> dict[str, Any]:
  """BLEU / chrF and speed of `model` (baseline, or speculative with `drafter`) on a split.

  Args:
    model: the (target) model.
    data: a prepared data directory, a `.jsonl` file of {"de", "en"} pairs, or a split
      dict from `prepare.load_split`.
    settings: how the split is decoded and scored (`EvalSettings`).
    drafter: None (baseline `sd.generate`), a Model, a drafter object, "ngram" (bigram
      tables fitted on the train split's targets, or on `train_targets`) or "prompt-lookup".
    decode_method: any `runs.Run` (BiLD, blockwise, ...) instead of the one
      `drafter` and the settings' gamma and sampling describe.
    tokenizer: a Tokenizer (default: the data directory's spiece.model).
    train_targets: the rows an "ngram" drafter is fitted on (default: the train split's).

  Returns:
    dict with bleu, chrf, pairs, generated_tokens, wall_s, ms_per_token, tokens_per_s,
    method, speculative, gamma, stats (decode statistics), hypotheses, references.
  """
  s = settings
  sampling = resolve_sampling(s.method, s.sampling)
  tokenizer = data_tokenizer(data, None) if tokenizer is None and is_jsonl(data) else tokenizer
  if tokenizer is not None:    # before it encodes a .jsonl file: another model's is refused
    check_tokenizer(tokenizer, model)
  inputs, references, data_dir, width = split_inputs(data, s.split, s.limit, tokenizer)
  if tokenizer is None:
    tokenizer = data_tokenizer(data, data_dir)
    check_tokenizer(tokenizer, model)
  max_new_tokens = width if s.max_new_tokens is None else s.max_new_tokens
  if decode_method is None:
    drafter = resolve_drafter(drafter, model, data_dir, train_targets)
    decode_method = Run(sd.Autoregressive() if drafter is None else
                        sd.Speculative(drafter, gamma=s.gamma), sampling)
  batch_size = min(s.batch_size, len(inputs))   # a small split needs no padding rows
  batches = padded_batches(inputs, batch_size)
  if s.warmup:
    jax.block_until_ready(decode_method.decode(model, batches[0].tokens,
                                               max_new_tokens=max_new_tokens, rng=s.seed))
  start = time.perf_counter()
  corpus = decode_corpus(decode_method, model, batches, max_new_tokens=max_new_tokens,
                         rng=s.seed)
  wall = time.perf_counter() - start
  hypotheses = detokenize(corpus.tokens(), corpus.lengths, tokenizer)
  generated = corpus.generated
  return {**corpus_scores(hypotheses, references),
          "pairs": len(references), "generated_tokens": generated, "wall_s": wall,
          "ms_per_token": 1e3 * wall / generated if generated else None,
          "tokens_per_s": generated / wall if wall > 0 else None,
          "includes_compile": not s.warmup, "batch_size": batch_size,
          "max_new_tokens": max_new_tokens, "method": decode_method.kind,
          "sampling": repr(decode_method.sampling),
          sd.Speculative.name: decode_method.method.drafter_role == "drafter",
          "gamma": getattr(decode_method.method, "gamma", None),
          "settings": decode_method.settings(),
          "stats": to_jsonable(totals(corpus.stats)), "hypotheses": hypotheses,
          "references": references}


# ----------------------------------------------------------------------------- perplexity


def _sequence_nll(model: Model):
  """A jitted (tokens [B, L], mask [B, L-1]) -> (summed NLL, token count) for `model`."""
  import jax.numpy as jnp

  @jax.jit
  def fn(params, tokens, mask):
    logits = model.replace(params=params).forward(tokens)[:, :-1]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.sum(nll * mask), jnp.sum(mask)
  return fn


def perplexity(model: Model, tokens, lengths=None, batch_size: int = 64) -> dict[str, float]:
  """Per-token perplexity of a decoder-only model on right-padded sequences (BiLD's LM metric).

  Each row's tokens 1 .. lengths[b]-1 are predicted from their prefix (the first token,
  BOS, is given): perplexity = exp(sum NLL / number of predicted tokens).

  Args:
    model: a decoder-only `Model`.
    tokens: int [N, L], right-padded.
    lengths: int [N] (default: one past each row's last token that is not the model's pad).
    batch_size: rows per forward pass; the last batch is padded by repeating a row.

  Returns:
    {"perplexity", "nll" (mean per token, nats), "tokens" (predicted), "sequences"}.
  """
  from specdec_jax import batching as lm
  if not model.is_decoder_only:
    raise EvaluationError("perplexity is for decoder-only models; a T5 model is scored with "
                          "BLEU and chrF (evaluate)")
  tokens = np.asarray(tokens)
  if tokens.ndim != 2 or tokens.shape[1] < 2 or tokens.dtype.kind not in "iu":
    raise EvaluationError(f"perplexity needs integer token sequences [N, L >= 2], got "
                          f"{tokens.dtype} {tokens.shape}")
  lengths = (lm.prompt_lengths(tokens, model.config.pad_id) if lengths is None
             else np.asarray(lengths))
  if lengths.shape != tokens.shape[:1] or (lengths < 1).any() or (lengths > tokens.shape[1]).any():
    raise EvaluationError(f"lengths must be [N] in [1, {tokens.shape[1]}], got {lengths}")
  mask = (np.arange(1, tokens.shape[1])[None, :] < lengths[:, None]).astype(np.float32)
  fn = _sequence_nll(model)
  total, count = 0.0, 0.0
  for start in range(0, len(tokens), batch_size):
    x, m = tokens[start:start + batch_size], mask[start:start + batch_size]
    if len(x) < batch_size:      # one compiled shape: pad with rows that count nothing
      x = np.concatenate([x, np.repeat(x[-1:], batch_size - len(x), 0)])
      m = np.concatenate([m, np.zeros((batch_size - len(m), m.shape[1]), m.dtype)])
    s, c = fn(model.params, np.asarray(x, np.int32), m)
    total, count = total + float(s), count + float(c)
  if count == 0:
    raise EvaluationError("perplexity: no token to predict (every row has length 1)")
  return {"perplexity": float(np.exp(total / count)), "nll": total / count,
          "tokens": int(count), "sequences": int(len(tokens))}
