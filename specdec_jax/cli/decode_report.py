"""What `specdec decode` reports on stderr beside its outputs: the --stats block (counts,
timing, the method's own statistics) and the --compare block (speed beside the target
alone, why, exact mode's cost), each figure once and labelled with what it measures."""

from __future__ import annotations

from typing import Any

from specdec_jax.costs import VERIFY_NOISE_NOTE, verify_cost_text
from specdec_jax.runtime.report import fmt


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
  if "tokens_per_target_call" in stats:    # not beam search's (a call scores K beams)
    lines.append(f"tokens/target call   {f(stats['tokens_per_target_call'])}   (per row)")
  # the method's own statistics, where its stats carry them (`Method.statistics`)
  if "steps_per_target_call" in stats:     # speculative beam search
    lines.append(f"beam steps/call      {f(stats['steps_per_target_call'])}   "
                 f"({int(stats['steps'])} steps: sd.Beam's calls)")
  if "drafter_calls" in stats:
    lines.append(f"drafter calls        {int(stats['drafter_calls'])}")
  if "acceptance_rate" in stats:
    lines.append(f"acceptance rate      {f(stats['acceptance_rate'])}   (accepted / drafted)")
  if "alpha" in stats:
    lines.append(f"alpha                {f(stats['alpha'])}   (mean of sum_x min(p, q))")
  for key in ("fallback_rate", "rollback_rate", "repeated_draft_rate", "mean_max_run",
              "oracle_tokens_per_target_call"):
    if key in stats:
      lines.append(f"{key:<20} {f(stats[key])}")
  if bool(stats.get("lossy", False)):
    lines.append("lossy                LOSSY: the output (or its distribution) is not the "
                 "target's" + (f" (lenience {stats['lenience']})" if "lenience" in stats else ""))
  return "\n".join(lines)


def compare_block(compare: dict[str, Any], kind: str) -> str:
  """The --compare lines: each figure once, labelled with what it measures."""
  lines = [f"speed                target alone {compare['baseline_ms_per_token']:.2f} ms/token, "
           f"{kind} {compare['ms_per_token']:.2f} ms/token, speedup {compare['speedup']:.2f}x",
           f"                     (per generated token, median of {compare['rounds']} "
           "alternating rounds after compilation, target alone at exact=False; same tokens: "
           f"{'yes' if compare['same_tokens'] else 'no'})"]
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
    lines.append(f"exact mode's cost    {compare['exact_cost']:.2f}x: the target alone in exact "
                 f"mode {compare['exact_baseline_ms_per_token']:.2f} ms/token over "
                 f"{compare['baseline_ms_per_token']:.2f} at its natural width")
    lines.append("                     (natural width: each call as wide as its tokens; exact "
                 "mode pads every target call to the verify call's width, off the kernels)")
  return "\n".join(lines)
