"""What `specdec decode` prints: the rows not printed yet (or --json's object) on stdout;
on stderr a bundled demo's note (`demo_note`: what a toy model is, so that nobody mistakes
a toy translation for the library's quality), the --stats block (counts, timing, the
method's own statistics) and the --compare block (speed beside the target alone, why,
exact mode's cost), each figure once and labelled with what it measures."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import jax

from specdec_jax.costs import VERIFY_NOISE_NOTE, verify_cost_text
from specdec_jax.io.reports import fmt, to_jsonable
from specdec_jax.io.streams import emit
from specdec_jax.loading import note as print_note
from specdec_jax.runtime.jobs import Decoded

if TYPE_CHECKING:
  from specdec_jax.runtime.decode_setup import Setup

#: Bundled group -> what it is (figures: packages/specdec-jax-lab/results/*/quality.md and
#: results/lm-demo/alpha.md there).
DEMOS = {
    "demo-de-en": ("De→En demo pair: a 13.5M-parameter target trained on a laptop-scale "
                   "dictionary corpus, test BLEU 8.3", "translation quality"),
    "demo-de-en-large": ("De→En demo pair: a 48.6M-parameter target trained on a "
                         "laptop-scale dictionary corpus, test BLEU 10.4",
                         "translation quality"),
    "demo-en-lm": ("English demo pair: a 5.0M-parameter LM trained on a laptop-scale "
                   "dictionary corpus, perplexity 76", "text quality"),
}


def demo_note(*names: str | None) -> str | None:
  """One line saying what the first bundled demo group among `names` (model names as
  given on the command line) is; None when none is a demo."""
  for name in names:
    group = str(name or "").split("/", 1)[0]     # "demo-de-en" of "demo-de-en/target"
    if group in DEMOS:
      what, quality = DEMOS[group]
      return (f"{group} is a {what}; it is here for speed and exactness, not "
              f"{quality}")
  return None


# (key, label, note) of the statistics a method's stats may carry, in the order shown
_OWN = (
    ("tokens_per_target_call", "tokens/target call", "per row"),   # not beam search's
    ("steps_per_target_call", "beam steps/call", "{steps:.0f} steps: sd.Beam's calls"),
    ("drafter_calls", "drafter calls", ""),
    ("acceptance_rate", "acceptance rate", "accepted / drafted"),
    ("alpha", "alpha", "mean of sum_x min(p, q)"),
    *((key, key, "") for key in ("fallback_rate", "rollback_rate", "repeated_draft_rate",
                                 "mean_max_run", "oracle_tokens_per_target_call")),
)
_COUNTS = frozenset({"drafter_calls"})


def stats_block(stats: dict[str, Any], timing: dict[str, Any], method) -> str:
  """The --stats lines: the run's counts, its timing (unless --compare times it) and the
  method's own statistics (`Method.statistics`)."""
  def f(x, digits=3):
    return fmt(x, digits, missing="n/a")
  lines = ["-- specdec decode statistics --",
           f"method               {timing['method']}",
           f"prompts              {timing['prompts']} (batches of {timing['batch_size']})",
           f"generated tokens     {timing['generated_tokens']}"]
  if "compare" in timing:   # one figure per quantity: the comparison's medians, below
    lines.append("timing               see 'speed' below (medians of alternating rounds)")
  else:
    lines += [f"wall time            {timing['wall_s']:.3f} s, one timed run"
              + (" (compilation excluded)" if timing["warmup"] else
                 " (INCLUDES compilation: --no-warmup)"),
              f"tokens/s             {f(timing['tokens_per_s'], 1)}",
              f"ms/token             {f(timing['ms_per_token'], 2)}   (wall time / generated "
              "tokens, summed over rows)"]
  lines.append(f"target calls         {int(stats['target_calls'])} per-row verifier calls, "
               f"{int(stats['rounds'])} batched rounds")
  # the method's own statistics, where its stats carry them (`Method.statistics`)
  for key, label, note in _OWN:
    if key in stats:
      value = f"{int(stats[key])}" if key in _COUNTS else f(stats[key])
      lines.append(f"{label:<20} {value}" + (f"   ({note.format(**stats)})" if note else ""))
  if bool(stats.get("lossy", False)):
    lines.append("lossy                LOSSY: the output (or its distribution) is not the "
                 "target's" + (f" (lenience {stats['lenience']})" if "lenience" in stats else ""))
  return "\n".join(lines)


def compare_block(compare: dict[str, Any], kind: str) -> str:
  """The --compare lines: each figure once, labelled with what it measures."""
  base = compare.get("baseline", "target alone")
  yes = lambda same: "yes" if same else "NO"
  if "same_beams" in compare:       # a beam method: sd.Beam's beams and scores
    same = f"same beams and scores: {yes(compare['same_beams'])}"
  elif compare.get("sampled"):      # sampled with other keys' draws: tokens differ by design
    same = "sampled with the same settings: tokens not compared"
  else:
    same = f"same tokens: {yes(compare['same_tokens'])}"
  lines = [f"speed                {base} {compare['baseline_ms_per_token']:.2f} ms/token, "
           f"{kind} {compare['ms_per_token']:.2f} ms/token, speedup {compare['speedup']:.2f}x",
           f"                     (per generated token, median of {compare['rounds']} "
           f"alternating rounds after compilation, {base} at exact=False; {same})"]
  if "costs" in compare:
    k = compare["costs"]
    lines += [f"why                  {k['tokens_per_target_call']:.2f} tokens per target call, "
              f"a round costing {k['round_cost']:.2f} target steps: "
              f"{k['drafts_per_target_call']:.2f} drafter steps x c {k['c']:.3f} + verify cost "
              f"{verify_cost_text(k['verify_cost'])}",
              f"                     (c: a drafter step / a 1-token target step; verify cost: a "
              f"{k['call_tokens']}-token target call / a 1-token one; medians of "
              f"{k['repeats']} alternating rounds; the rest of a round is its own work)"]
    if k["verify_cost_noise"]:
      lines.append(f"                     {VERIFY_NOISE_NOTE} (measured {k['verify_cost']:.2f})")
  if compare["exact_cost"] is not None:
    lines.append(f"exact mode's cost    {compare['exact_cost']:.2f}x: {base} in exact "
                 f"mode {compare['exact_baseline_ms_per_token']:.2f} ms/token over "
                 f"{compare['baseline_ms_per_token']:.2f} at its natural width")
    lines.append("                     (natural width: each call as wide as its tokens; exact "
                 "mode pads every target call to the verify call's width, off the kernels)")
  return "\n".join(lines)


def print_report(s: Setup, d: Decoded, compared: dict[str, Any] | None) -> int:
  """Process 0 prints every process's rows not printed yet (neither streamed nor in
  --output's file) or --json's object on stdout, then a bundled demo's note, --stats and
  --compare's blocks on stderr; 0, the command's status."""
  if not d.corpus.outputs:     # --resume of a complete file
    if jax.process_index() == 0:
      print(f"specdec decode: {s.run.output!r} already holds all {len(s.lines)} outputs: "
            "nothing to decode", file=sys.stderr)
    return 0
  timing = {**d.timing, "load_s": s.load_s}
  if compared is not None:
    timing["compare"] = compared
  if jax.process_index() != 0:
    return 0
  blocks = ([stats_block(d.corpus.stats, timing, s.method)] if s.run.stats else []) + (
      [compare_block(compared, s.method.kind)] if compared is not None else [])
  about = demo_note(s.run.model, s.drafter)
  # the rows not printed yet: neither streamed nor in --output's file
  outputs = (None if s.run.output or (d.streamed and not s.run.json) else
             [s.job.format_row(row) for row in d.corpus.token_rows()])
  if s.run.json:   # the rest covers this run's batches; with --output the rows are in it
    payload = {"outputs": outputs, "lengths": None if s.run.output else d.corpus.lengths,
               "stats": d.corpus.stats, "prompt_lengths": s.prompts.lengths,
               "timing": timing, "settings": s.job.settings,
               **({"output": s.run.output, "resumed_at_row": d.resumed} if s.run.output
                  else {})}
    emit(json.dumps(to_jsonable(payload)))
  else:
    for o in outputs or ():
      emit(o if isinstance(o, str) else " ".join(map(str, o)))
  if about is not None:     # stderr, after the rows: a bundled demo's note, the blocks
    print_note(about)
  for block in blocks:
    print(block, file=sys.stderr)
  return 0
