#!/usr/bin/env python
"""Greedy decode time per token: the real T5X decoder vs specdec-jax, same weights, one process.

    git clone https://github.com/google-research/t5x /path/to/t5x     # T5X is not on PyPI
    python scripts/compare_t5x.py --t5x-src /path/to/t5x --model config:t5_1_1_small \
        --batch-sizes 1,8 --repeats 7 --out results/t5x_compare
    python scripts/compare_t5x.py --t5x-src /path/to/t5x --model config:t5_1_1_small \
        --dtype bfloat16 --out results/t5x_compare_bf16

    python scripts/compare_t5x.py --t5x-src /path/to/t5x --model config:t5_1_1_small \
        --beam 4:0.6 --out results/t5x_compare_beam          # T5X's beam_search vs sd.Beam
    python scripts/compare_t5x.py --t5x-src /path/to/t5x --model config:t5_1_1_small \
        --beam 4:0.6 --drafter config:t5_1_1_tiny --gamma 3   # vs experimental.SpeculativeBeam

--dtype bfloat16 runs both sides in bfloat16 (params and activations; `sd.load`'s
dtype) and reports token agreement instead of requiring identical tokens.
Writes OUT/t5x_compare.json, .md and .png. See `specdec_jax_lab/t5x_bench.py` for what
runs on each side (only four pure-JAX files of the checkout are imported).
"""

from __future__ import annotations

import argparse
import os
import sys

from specdec_jax.errors import SpecdecError
from specdec_jax.flags.common import int_list
from specdec_jax.loading import DTYPES


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=__doc__.split("\n\n", 1)[1])
  p.add_argument("--t5x-src", required=True, help="a google-research/t5x source checkout")
  p.add_argument("--model", default="config:t5_1_1_small",
                 help="checkpoint path or config:NAME (random weights, seed 0)")
  p.add_argument("--batch-sizes", type=int_list, default=[1, 8], metavar="1,8")
  p.add_argument("--prompt-len", type=int, default=32)
  p.add_argument("--steps", type=int, default=32)
  p.add_argument("--repeats", type=int, default=7)
  p.add_argument("--dtype", choices=DTYPES, default="float32",
                 help="compute dtype of both sides, params and activations (default float32)")
  p.add_argument("--beam", metavar="K:ALPHA",
                 help="compare beam search (t5x.decoding.beam_search vs sd.Beam) with K beams "
                 "and brevity penalty ALPHA instead of greedy decoding")
  p.add_argument("--drafter", metavar="PATH_OR_NAME",
                 help="with --beam: ours is exact speculative beam search "
                 "(experimental.SpeculativeBeam) with this drafter (checkpoint path or "
                 "config:NAME); every beam still compared with T5X's")
  p.add_argument("--gamma", type=int, default=3,
                 help="with --drafter: drafted tokens per beam and round (default 3)")
  p.add_argument("--out", default="results/t5x_compare")
  args = p.parse_args(argv)

  from specdec_jax.io.reports import atomic_write, write_json, write_plot
  from specdec_jax.loading import load_model
  from specdec_jax_lab import t5x_bench
  beam = None
  if args.beam is not None:
    k, _, alpha = args.beam.partition(":")
    try:
      beam = (int(k), float(alpha or 0.6))
    except ValueError:
      p.error(f"--beam {args.beam!r}: expected K:ALPHA, e.g. 4:0.6")
  if args.drafter is not None and beam is None:
    p.error("--drafter is compared with T5X's beam search: add --beam K:ALPHA")
  try:
    t5x = t5x_bench.load_t5x(args.t5x_src)      # fail before building the model
    model = load_model(args.model, args.dtype)
    drafter = None if args.drafter is None else load_model(args.drafter, args.dtype)
    timing = t5x_bench.T5XTiming(batch_sizes=args.batch_sizes, prompt_len=args.prompt_len,
                                 steps=args.steps, repeats=args.repeats)
    extra = {} if drafter is None else {"drafter": drafter, "gamma": args.gamma}
    results = t5x_bench.run_t5x_compare(model, t5x, timing, dtype=args.dtype, beam=beam,
                                        **extra)
  except SpecdecError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  results["model"]["source"] = args.model
  if args.drafter is not None:
    results["beam"]["speculative"]["drafter"] = args.drafter
  base = os.path.join(args.out, "t5x_compare")
  write_json(base + ".json", results)
  atomic_write(base + ".md", t5x_bench.markdown(results))
  write_plot(base + ".png", t5x_bench.plot, results)
  print(t5x_bench.markdown(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
