"""Side-by-side decoding benchmark: baseline vs speculative decoding in ONE process.

For every batch size and sampling mode, the baseline (`sd.generate`) and speculative
decoding at each gamma run on the same prompts with the same PRNG key. First every
method (and every step-cost loop) is called once to compile it, excluded from the
numbers; these warm-up calls run `compile_workers` at a time, since XLA compiles in
parallel threads. Then, one call at a time, `repeats` rounds each run every method of a
(batch, mode) group once, the order rotated by one method per round, and the median wall
time over rounds is reported. Alternating methods spreads slow drifts of the machine
(thermal, other processes) over all methods instead of whichever ran last.

Definitions (also written into bench.json under "definitions"):

* ms/token: median wall time of one batched decode call (encoder included) divided by
  the tokens it generated summed over rows (EOS included). At batch 8 this is the
  amortised cost of one row-token, not the latency of a step.
* tokens/s: the inverse, generated row-tokens per second.
* speedup: the method's baseline's ms/token / its ms/token (same batch size and mode);
  the baseline is `Method.baseline()`: the target alone for speculative decoding, BiLD and
  blockwise decoding, `sd.Beam` with the same beams for speculative beam search.
* alpha: stats["alpha"] = sum(beta) / scored draft positions, beta = sum_x min(p, q).
* acceptance rate: accepted drafts / drafted tokens.
* block efficiency: generated tokens per target (verifier) call, calls counted per row
  (1.0 for the baseline); target_calls is that per-row count, rounds the batched calls.
* c: time of one 1-token drafter `decode` / one 1-token target `decode`, each measured
  as a jitted `lax.fori_loop` of `timing_steps` calls on a started cache of the bench's
  capacity at the same batch size (each step also takes an argmax over the vocabulary).
* verify cost: time of one (gamma+1)-token target `decode` / one 1-token call, measured
  the same way.
* predicted: `theory.walltime_improvement_measured(alpha, gamma, c, verify_cost)`
  = E / (gamma c + verify_cost) with E = (1 - alpha^(gamma+1)) / (1 - alpha).

Prompts are uniform random token ids in [3, vocab) of length `prompt_len` whose last
token is EOS (1), the same rows for every batch size (batch B takes the first B rows);
or the non-blank lines of `--prompts-file` (text with `--tokenizer`, else token ids),
padded or cut to `prompt_len`, every line decoded at every batch size (a call decodes
them all in batches of B rows, the last padded; ms/token counts the real rows' tokens).
Random-weight
models ("config:NAME") give alpha ~ 0: the numbers then measure the machinery's cost.

    results = run_bench(target, drafter, BenchSettings(batch_sizes=(1,), gammas=(1, 3),
                                                       modes=("greedy",)))
    write_report(results, "bench_out")     # bench.json, bench.md, bench.png
"""

from specdec_jax.costs import StepTimer, time_decode_step
from specdec_jax_lab.bench.report import (
  TABLE_COLUMNS,
  markdown_report,
  markdown_table,
  plot,
  write_report,
)
from specdec_jax_lab.bench.run import (
  DEFINITIONS,
  RESUME_KEYS,
  SCHEMA_VERSION,
  BenchRecord,
  BenchSettings,
  CostTiming,
  measure_costs,
  run_bench,
)
from specdec_jax_lab.errors import BenchError

DESCRIPTION = __doc__.split("\n\n    results =")[0]

__all__ = ["BenchError", "BenchRecord", "BenchSettings", "CostTiming", "DEFINITIONS",
           "DESCRIPTION", "RESUME_KEYS", "SCHEMA_VERSION", "StepTimer", "TABLE_COLUMNS",
           "markdown_report", "markdown_table", "measure_costs", "plot", "run_bench",
           "time_decode_step", "write_report"]
