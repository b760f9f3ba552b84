"""The lab's two sweeps run from their settings: BiLD's grid of each small model, an early
exit's and speculative decoding's points (`bild_points`), or Kim et al.'s Table 4
(`blockwise_points`), each point timed beside the target alone (`run_points`) on the
data's split, the reports written as they grow (`run_sweep`).

    paths = run_sweep(BildSweep(data="pairs.jsonl", out="results/bild", small=(...)))
    paths["md"], paths["json"], paths["png"]

With a decoder-only model the split is texts (`lm_split`): each text's first
`prompt_len` tokens the prompt, its next `max_new_tokens` the reference continuation.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
from typing import Any

import numpy as np

import specdec_jax as sd
from specdec_jax.drafters.lattice import NGramLM
from specdec_jax.flags import FlagError
from specdec_jax.io.prompts import encode_lm_prompts, read_texts
from specdec_jax.io.reports import check_output_dir, read_json, to_jsonable
from specdec_jax.loading import early_exit_layer, fit_ngram, load_model
from specdec_jax.models.model import family
from specdec_jax.runs import Run
from specdec_jax_lab import evaluation
from specdec_jax_lab.data import prepare
from specdec_jax_lab.sweep.report import write_outputs
from specdec_jax_lab.sweep.run import (
  Point,
  Split,
  Timing,
  lattice_cost_ms,
  load_split,
  run_points,
)
from specdec_jax_lab.sweep.settings import (
  BildSweep,
  BlockwiseSweep,
  SweepSettings,
  recorded_config,
)


def bild_points(s: BildSweep, target) -> list[Point]:
  """The BiLD grid per small model, the early-exit grid, speculative decoding's points."""
  sampling, points, exact = s.sampling, [], s.exact_mode
  grid = [(f, r) for f in s.fallback for r in s.rollback]
  smalls = [(name, _same_kind(load_model(path, s.dtype, what="drafter"), target,
                              f"--small {name}={path}"))
            for name, path in s.smalls()]
  for name, small in smalls:
    for policy in s.batch_policies:
      tag = "" if policy == "wait" else f" ({policy})"
      for f, r in grid:
        points.append(Point(f"{name}/fb{f:g}/rb{r:g}" + ("" if policy == "wait" else
                                                         f"/{policy}"),
                            f"BiLD {name}{tag}",
                            Run(sd.BiLD(small, fallback_threshold=f, rollback_threshold=r,
                                        batch_policy=policy, exact=exact), sampling, name)))
  for name, small in smalls:
    for g in s.gammas:
      points.append(Point(f"speculative/{name}/g{g}", f"speculative {name} (exact)",
                          Run(sd.Speculative(small, gamma=g, exact=exact), sampling, name)))
  if s.early_exit:
    path, _, k = s.early_exit.rpartition(":")
    large = load_model(path, s.dtype, what="early-exit model")
    small = sd.early_exit(large, early_exit_layer(f"early-exit:{k}", large))
    for f, r in grid:
      points.append(Point(f"early-exit{k}/fb{f:g}/rb{r:g}", f"BiLD early exit (layer {k})",
                          Run(sd.BiLD(small, fallback_threshold=f, rollback_threshold=r,
                                      exact=exact), sampling, f"early-exit:{k}"),
                          target=large, target_name=path))
  return points


def _same_kind(model, target, flag: str):
  """`model`, refused when it is not of the target's kind (T5 vs decoder-only)."""
  if model.is_decoder_only != target.is_decoder_only:
    raise FlagError(f"{flag} is {family(model)} but --model is {family(target)}: an LM drafts "
                   "for an LM, a T5 for a T5")
  return model


def lm_split(s: SweepSettings, tokenizer, config) -> Split:
  """A decoder-only sweep's split: each text's first --prompt-len tokens (the prompt) and
  the text of its next --max-new-tokens tokens (the reference continuation)."""
  texts = read_texts(s.data)
  tokens, lengths = encode_lm_prompts(texts, tokenizer, config)
  p, t = s.prompt_len, s.lm_new_tokens
  keep = np.flatnonzero(lengths >= p + t)[:s.limit]
  if not keep.size:
    raise FlagError(f"--data {s.data!r}: no text has --prompt-len {p} + --max-new-tokens "
                   f"{t} tokens")
  references = tokenizer.decode(tokens[keep, p:p + t])
  return Split(tokens[keep, :p], tuple(references), t)


def _ngram(data: str, vocab_size: int, split: Split | None = None):
  """The bigram rescorer: a prepared dir's train targets, or a .jsonl file's English side;
  for a decoder-only model the evaluated prompts (`split`)."""
  if split is not None:
    print("sweep-blockwise: the n-gram rescorer is fitted on the evaluated prompts",
          file=sys.stderr)
    return NGramLM.fit(list(split.inputs), vocab_size=vocab_size)
  if not evaluation.is_jsonl(data):
    return fit_ngram(data, vocab_size)
  targets = prepare.load_jsonl_split(data)["targets"]
  print("sweep-blockwise: the n-gram rescorer is fitted on the evaluated references of "
        f"{data} (in-sample: no train split in a .jsonl file)", file=sys.stderr)
  return NGramLM.fit([r[r > 0] for r in targets], vocab_size=vocab_size)


def blockwise_points(s: BlockwiseSweep, target, split: Split | None = None) -> list[Point]:
  """Table 4 of Kim et al. 2024: base, n-gram, neural, parallel base / n-gram, oracle.
  `split`: a decoder-only sweep's split (the n-gram rescorer's texts)."""
  heads = sd.load_heads(s.heads or s.model, target)
  lm = _ngram(s.data, target.config.vocab_size, split if target.is_decoder_only else None)
  rescorer = _same_kind(load_model(s.rescorer, s.dtype, what="rescorer"), target,
                        f"--rescorer {s.rescorer}")
  k, p, w = s.lattice_k, s.num_drafts, s.rescoring_weight
  rows = [("base", {}), ("ngram", dict(top_k=k, rescoring="ngram", rescorer=lm)),
          ("neural", dict(top_k=k, rescoring="neural", rescorer=rescorer)),
          (f"parallel base p={p}", dict(top_k=k, num_drafts=p)),
          (f"parallel ngram p={p}", dict(top_k=k, num_drafts=p, rescoring="ngram",
                                         rescorer=lm)),
          (f"oracle k={k}", dict(top_k=k, oracle=True))]
  return [Point(label, sd.Blockwise.name, Run(sd.Blockwise(heads, rescoring_weight=w,
                                                     exact=s.exact_mode, **kw),
                                        label=s.heads or s.model))
          for label, kw in rows]


def _existing(s: SweepSettings, config: dict[str, Any]) -> dict[str, Any] | None:
  path = os.path.join(s.out, f"{s.kind}.json")
  if not (s.resume and os.path.exists(path)):
    return None
  old = read_json(path, "--resume: sweep file")
  now = to_jsonable(config)
  diff = [k for k in now if k != "command" and old.get("config", {}).get(k) != now[k]]
  if diff:
    raise FlagError(f"--resume: {path} was made with other settings ({', '.join(diff)}); drop "
                   "--resume or choose another --out")
  return old


def _split(s: SweepSettings, target) -> tuple[SweepSettings, Split, Any]:
  """(the settings, a decoder-only model's budget filled in; the split decoded; its
  tokenizer): a decoder-only model's texts (`lm_split`), or a T5 pair split."""
  if target.is_decoder_only:
    if not s.tokenizer:
      raise FlagError("a decoder-only --model needs --tokenizer: --data holds texts")
    s = dataclasses.replace(s, max_new_tokens=s.lm_new_tokens)
    if s.lm_new_tokens < 1 or s.prompt_len < 1:
      raise FlagError("--prompt-len and --max-new-tokens must be >= 1")
    tokenizer = sd.load_tokenizer(s.tokenizer)
    return s, lm_split(s, tokenizer, target.config), tokenizer
  given = [f for f, v in (("--tokenizer", s.tokenizer),
                          ("--max-new-tokens", s.max_new_tokens)) if v is not None]
  if given:
    raise FlagError(f"{', '.join(given)}: only for a decoder-only --model (a prepared "
                   "split holds its tokenizer and target length)")
  return (s, load_split(s.data, s.split, s.limit),
          evaluation.data_tokenizer(s.data, pathlib.Path(s.data)))


def _lattice_ms(s: BlockwiseSweep, points: list[Point]) -> dict[str, float]:
  """The lattice's own cost (ms per round) with one draft and with `num_drafts`."""
  methods = [p.method.method for p in points if isinstance(p.method.method, sd.Blockwise)]
  g = methods[0].heads.num_drafts
  lm = next(m.rescorer for m in methods if m.rescoring == "ngram")
  return {f"p={p}": lattice_cost_ms(s.batch_size, g, s.lattice_k, p, lm)
          for p in sorted({1, s.num_drafts})}


def run_sweep(s: SweepSettings) -> dict[str, str]:
  """Measure every point of a `BildSweep` or `BlockwiseSweep` (keeping, with `s.resume`,
  those `s.out` holds from the same settings) and write the reports after each: the
  paths of the JSON, Markdown and PNG (keys "json", "md", "png")."""
  if not isinstance(s, (BildSweep, BlockwiseSweep)):
    raise FlagError(f"no points to sweep for {type(s).__name__}: a BildSweep or BlockwiseSweep")
  check_output_dir(s.out, "--out")
  target = load_model(s.model, s.dtype, what="target")
  s, split, tokenizer = _split(s, target)
  config = recorded_config(s, target.is_decoder_only)
  if isinstance(s, BlockwiseSweep) and (evaluation.is_jsonl(s.data) or target.is_decoder_only):
    config["ngram_data"] = (f"{s.data} (the evaluated prompts)" if target.is_decoder_only
                            else f"{s.data} (in-sample: the evaluated references)")
  existing = _existing(s, config)
  points = (blockwise_points(s, target, split) if isinstance(s, BlockwiseSweep)
            else bild_points(s, target))
  results = run_points(target, split, tokenizer, points,
                       Timing(s.batch_size, s.repeats, s.seed, s.progress),
                       config=config, existing=existing,
                       on_update=lambda r: write_outputs(r, s.out, s.kind))
  if isinstance(s, BlockwiseSweep):
    results["lattice_ms"] = _lattice_ms(s, points)
  return write_outputs(results, s.out, s.kind)
