"""Decode statistics: one counters dataclass that every method fills the same way.

Counters are accumulated on device, per row, inside the jitted loop; ratios are
derived from counters only when asked (`summarize`), so statistics of several
calls merge exactly (`merge`): alpha of a corpus is sum(beta_sum) / sum(beta_count)
over all its rows, never an average of per-call ratios.

A "target call" is counted per ROW: a row that is live when the verifier runs
gets +1. Over a batch of B rows that finish at different times this is the
number of (row, call) pairs, so `tokens_per_target_call` = emitted / target_calls
is the block efficiency (tokens a row gains per verifier call; 1.0 for the
autoregressive baseline) in every method, report and tool. The number of batched
verifier invocations (loop iterations, what wall time follows) is `rounds`.

Worked example (one row, speculative decoding, gamma 3, EOS off, 7 tokens):

    round 1: drafts a b c, target accepts a b, corrects -> x     emitted 3
    round 2: drafts d e f, target accepts all, bonus     -> y     emitted 4

    rounds 2, target_calls 2, drafter_calls 6, drafted 6, accepted 5, rejections 1,
    per_position_accepted [2, 2, 1], emitted 7, drafter_tokens 5,
    acceptance_rate 5/6, tokens_per_target_call 3.5

`DecodeOutput.stats` is `summarize`'s readable view: host Python numbers under the
names documented there (tokens, rounds, target_calls, tokens_per_target_call, alpha,
...); the per-row counters stay on `DecodeOutput.counters`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.errors import InputError

Array = jax.Array


class DecodeStats(struct.PyTreeNode):
  """Per-row counters of one decode call ([B] unless noted; int32 unless noted).

  Attributes:
    rounds: [] batched verifier invocations (loop iterations that called the target).
    target_calls: verifier calls in which the row was live.
    drafter_calls: proposer invocations in which the row was drafting.
    drafted: proposals made for the row (per round: its number of proposals).
    accepted: proposals committed: accepted by the verifier, or committed unverified
      (BiLD's small model ending a sentence).
    rejections: rounds in which one of the row's proposals was rejected (BiLD: rollbacks).
    fallbacks: rounds the proposer ended because it was unsure (BiLD's fallback policy).
    per_position_accepted: [B, G] rounds in which proposal i (0-based) was accepted.
    beta_sum: float32, sum over scored proposals of beta = sum_x min(p(x), q(x))
      (Leviathan et al.'s acceptance probability; greedy: 1 if the proposal is the argmax).
    beta_count: scored proposals (those the target saw on its own path: up to and
      including the first rejected one).
    emitted: tokens emitted (EOS included): the row's output length.
    drafter_tokens: emitted tokens that came from the proposer; the rest are the target's.
    log_prob: float32, sum over emitted tokens of the target's log-probability under the
      adjusted (temperature / top-k / top-p) distribution, as T5X's rescale_log_probs.
    repeated_drafts: adjacent proposal pairs with equal tokens (blockwise drafts' repetition).
    draft_pairs: adjacent proposal pairs made.
    max_run: sum over drafting rounds of the round's longest run of equal adjacent
      proposals (1 when no two neighbours are equal; Kim et al.'s "max run" is its mean).
    drafting_rounds: rounds in which the row made at least one proposal.
    oracle_calls: target calls an oracle choosing each draft token from the heads' top-k
      would need for the row's final output (blockwise, when asked; 0 otherwise).
  """

  rounds: Array
  target_calls: Array
  drafter_calls: Array
  drafted: Array
  accepted: Array
  rejections: Array
  fallbacks: Array
  per_position_accepted: Array
  beta_sum: Array
  beta_count: Array
  emitted: Array
  drafter_tokens: Array
  log_prob: Array
  repeated_drafts: Array
  draft_pairs: Array
  max_run: Array
  drafting_rounds: Array
  oracle_calls: Array

  @classmethod
  def zeros(cls, batch: int, max_proposals: int) -> "DecodeStats":
    i = jnp.zeros((batch,), jnp.int32)
    f = jnp.zeros((batch,), jnp.float32)
    return cls(rounds=jnp.zeros((), jnp.int32), target_calls=i, drafter_calls=i, drafted=i,
               accepted=i, rejections=i, fallbacks=i,
               per_position_accepted=jnp.zeros((batch, max_proposals), jnp.int32),
               beta_sum=f, beta_count=i, emitted=i, drafter_tokens=i, log_prob=f,
               repeated_drafts=i, draft_pairs=i, max_run=i, drafting_rounds=i,
               oracle_calls=i)

  def add(self, **increments) -> "DecodeStats":
    """Counters plus `increments` (same shapes): stats.add(accepted=m, drafted=count)."""
    return self.replace(**{k: getattr(self, k) + v for k, v in increments.items()})


# Ratios derived from the counters: name -> (numerator, denominator).
_RATIOS = {
    "acceptance_rate": ("accepted", "drafted"),
    "tokens_per_target_call": ("emitted", "target_calls"),
    "alpha": ("beta_sum", "beta_count"),
    "fallback_rate": ("fallbacks", "emitted"),
    "rollback_rate": ("rejections", "emitted"),
    "repeated_draft_rate": ("repeated_drafts", "draft_pairs"),
    "mean_max_run": ("max_run", "drafting_rounds"),
}
_ROW_COUNTERS = ("target_calls", "drafter_calls", "drafted", "accepted", "rejections",
                 "fallbacks", "beta_sum", "beta_count", "emitted", "drafter_tokens",
                 "log_prob", "repeated_drafts", "draft_pairs", "max_run", "drafting_rounds",
                 "oracle_calls")


def _ratio(num, den):
  return num / jnp.maximum(den, 1)


#: The readable summary's names (`summarize`), in order; each is documented there.
SUMMARY = ("rows", "tokens", "rounds", "target_calls", "tokens_per_target_call", "drafter_calls",
           "drafted", "accepted", "acceptance_rate", "alpha", "beta_sum", "beta_count",
           "per_position_accepted", "rejections", "fallbacks", "drafter_tokens",
           "target_tokens", "fallback_rate", "rollback_rate", "repeated_draft_rate",
           "mean_max_run", "oracle_tokens_per_target_call", "log_prob")


#: What the round engine's methods' readable statistics carry (`summarize`); each method
#: value lists all of its own (`Method.statistics`, e.g. `(*COMMON_STATS, "drafter_calls",
#: *PROPOSED, *SCORED)`); docs/methods/*.md tables list the same names. A run with no such
#: list (a research method run by the engine directly) shows them all. A method with a
#: loop of its own lists what means something for it (beam search: `OWN_LOOP_STATS`).
COMMON_STATS = ("rows", "tokens", "rounds", "target_calls", "tokens_per_target_call",
                "log_prob")
#: Beam search's: a step is one call over the row's K beams and the search goes on after
#: the best beam ends, so tokens per call, proposals and alpha do not apply.
OWN_LOOP_STATS = ("rows", "tokens", "rounds", "target_calls")
#: Statistics of methods that propose tokens, and of those whose proposals are scored.
PROPOSED = ("drafted", "accepted", "acceptance_rate", "per_position_accepted", "rejections",
            "drafter_tokens", "target_tokens")
SCORED = ("alpha", "beta_sum", "beta_count")


def shown(statistics: Sequence[str] | None) -> tuple[str, ...]:
  """The readable statistics of a run whose method reports `statistics`, in SUMMARY
  order; every name for None."""
  if statistics is None:
    return SUMMARY
  own = set(statistics)
  return tuple(k for k in SUMMARY if k in own)


def summarize(stats: DecodeStats, info: Mapping[str, Any] | None = None, *,
              raw: bool = False, statistics: Sequence[str] | None = None) -> dict[str, Any]:
  """The statistics of a decode call as host Python numbers, plus the run's `info`.

  Totals over the rows (ints unless noted); ratios are ratios of totals:

    rows                     B, the rows decoded.
    tokens                   tokens emitted, EOS included (the rows' output lengths summed).
    rounds                   batched verifier invocations (what wall time follows).
    target_calls             verifier calls counted per row: a row live in a call adds 1.
    tokens_per_target_call   float, tokens / target_calls: the block efficiency (tokens a
                             row gains per verifier call; 1.0 for the baseline).
    drafter_calls            proposer invocations counted per row.
    drafted, accepted        proposals made / committed (accepted, or BiLD's unverified end).
    acceptance_rate          float, accepted / drafted.
    alpha                    float, beta_sum / beta_count: the mean over scored proposals of
                             beta = sum_x min(p(x), q(x)) (Leviathan et al.'s alpha).
    beta_sum, beta_count     float / int, alpha's numerator and denominator (merge exactly).
    per_position_accepted    list [G]: rounds in which proposal i (0-based) was accepted.
    rejections               rounds with a rejected proposal (BiLD: rollbacks).
    fallbacks                rounds ended by an unsure proposer (BiLD's fallback policy).
    drafter_tokens           emitted tokens that came from the proposer.
    target_tokens            tokens - drafter_tokens: the verifier's own tokens.
    fallback_rate            float, fallbacks / tokens (BiLD).
    rollback_rate            float, rejections / tokens (BiLD).
    repeated_draft_rate      float, adjacent equal proposal pairs / pairs (blockwise).
    mean_max_run             float, mean longest run of equal adjacent proposals (blockwise).
    oracle_tokens_per_target_call  float, only when `info` names an `oracle_top_k`.
    log_prob                 float, the emitted tokens' summed log-probability under the
                             target's adjusted distribution.

  of which a run reports its method's (`statistics`, the method value's; None: all,
  `shown`): speculative decoding has no rollback_rate, the baseline no alpha, beam search
  only rows, tokens, rounds (search steps) and target_calls (steps per row, each over K
  beams). Then `info` (method, gamma, lossy, exact, ...),
  the run's settings. The per-row counters stay in the
  `DecodeStats` (`out.counters`, [B] each); `raw=True` returns the full mapping of
  device arrays instead: every counter's total, the ratios, and each per row under
  `<name>_per_row` (also usable inside `jax.jit`).
  """
  if raw:
    return _raw_summary(stats, info)
  if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(stats)):
    raise InputError("the readable statistics are host numbers: inside jax.jit use "
                     "stats.summarize(counters, raw=True)")
  host = jax.tree_util.tree_map(np.asarray, jax.device_get(stats))
  total = {k: getattr(host, k).sum(axis=0) for k in _ROW_COUNTERS}
  out: dict[str, float] = {"rows": int(host.emitted.shape[0]), "tokens": int(total["emitted"]),
         "rounds": int(host.rounds)}
  ratio = lambda num, den: float(num) / max(float(den), 1.0)
  out["target_tokens"] = int(total["emitted"] - total["drafter_tokens"])
  for name, (num, den) in _RATIOS.items():
    out[name] = ratio(total[num], total[den])
  if info and dict(info).get("oracle_top_k"):
    out["oracle_tokens_per_target_call"] = ratio(total["emitted"], total["oracle_calls"])
  for name in SUMMARY:
    if name in total and name not in out:
      out[name] = float(total[name]) if name in _FLOAT_COUNTERS else int(total[name])
  out["per_position_accepted"] = host.per_position_accepted.sum(axis=0).astype(int).tolist()
  out = {k: out[k] for k in shown(statistics) if k in out}
  out.update(dict(info or {}))
  return out


_FLOAT_COUNTERS = ("beta_sum", "log_prob")


def _raw_summary(stats: DecodeStats, info: Mapping[str, Any] | None) -> dict[str, Any]:
  """Device arrays: totals, ratios of totals, the same per row (`*_per_row`), and `info`."""
  total = {k: jnp.sum(getattr(stats, k), axis=0) for k in _ROW_COUNTERS}
  per_row = {k: getattr(stats, k) for k in _ROW_COUNTERS}
  for view in (total, per_row):
    view["per_position_accepted"] = (jnp.sum(stats.per_position_accepted, axis=0)
                                     if view is total else stats.per_position_accepted)
    view["target_tokens"] = view["emitted"] - view["drafter_tokens"]
    for name, (num, den) in _RATIOS.items():
      view[name] = _ratio(view[num], view[den])
    if info and dict(info).get("oracle_top_k"):
      view["oracle_tokens_per_target_call"] = _ratio(view["emitted"], view["oracle_calls"])
  out = dict(total)
  out["rounds"] = stats.rounds
  out.update({f"{k}_per_row": v for k, v in per_row.items()})
  out.update(dict(info or {}))
  return out


def merge(parts: Sequence[tuple[DecodeStats, int]]) -> DecodeStats:
  """One DecodeStats for several calls: (stats, real_rows) each, padding rows dropped.

  Per-row counters are concatenated (the first `real_rows` rows of each part),
  `rounds` add up. Proposal widths may differ between parts (adaptive gamma,
  different gammas): per-position counters are zero-padded to the widest.
  """
  if not parts:
    raise InputError("stats.merge needs at least one part")
  parts = [(jax.tree_util.tree_map(np.asarray, s), int(r)) for s, r in parts]
  for s, r in parts:
    if not 0 <= r <= s.emitted.shape[0]:
      raise InputError(f"stats.merge: {r} real rows in a part of {s.emitted.shape[0]} rows")
  width = max(s.per_position_accepted.shape[1] for s, _ in parts)
  fields = {}
  for name in DecodeStats.__dataclass_fields__:
    if name == "rounds":
      fields[name] = np.sum([s.rounds for s, _ in parts]).astype(np.int32)
      continue
    rows = [getattr(s, name)[:r] for s, r in parts]
    if name == "per_position_accepted":
      rows = [np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in rows]
    fields[name] = np.concatenate(rows, axis=0)
  return DecodeStats(**fields)


def merge_outputs(outputs: Sequence[Any], real_rows: Sequence[int] | None = None, *,
                  raw: bool = False) -> dict[str, Any]:
  """`summarize` over several `DecodeOutput`s (e.g. the batches of a corpus) as one run.

  real_rows[i]: rows of output i that are real (the rest pad a short last batch).
  The outputs must come from one kind of run (the same `info`: method, gamma, ...).
  raw: the full mapping with per-row values (`summarize(..., raw=True)`); otherwise the
  outputs' class derives its own statistics from the merged ones (`derive_stats`:
  speculative beam's steps per target call = total steps / total rounds).
  """
  if any(o.info != outputs[0].info for o in outputs):
    raise InputError("stats.merge_outputs: outputs of different runs (their info differs: "
                     f"{dict(outputs[0].info)} vs another)")
  rows = real_rows or [o.lengths.shape[0] for o in outputs]
  if len(rows) != len(outputs):
    raise InputError(f"stats.merge_outputs: {len(rows)} real_rows for {len(outputs)} outputs")
  merged = merge([(o.counters, r) for o, r in zip(outputs, rows, strict=True)])
  out = summarize(merged, dict(outputs[0].info), raw=raw,
                  statistics=getattr(outputs[0], "statistics", None))
  # the output's own statistics beyond the counters (`DecodeOutput.derive_stats`)
  derive = getattr(type(outputs[0]), "derive_stats", None)
  return out if raw or derive is None else derive(out, outputs)
