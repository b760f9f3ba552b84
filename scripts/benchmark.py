#!/usr/bin/env python
"""Same as `specdec bench ...`: baseline vs speculative decoding timed side by side.

    python scripts/benchmark.py --target config:t5_1_1_small --drafter config:t5_1_1_tiny_drafter \
        --batch-sizes 1 --gammas 1,3 --modes greedy --max-new-tokens 32 --out bench_out

See `specdec_jax/tools/bench/` for the definitions; `--help` for every option.
"""

import sys

from specdec_jax.tools import cli

if __name__ == "__main__":
  sys.exit(cli.main(["bench", *sys.argv[1:]]))
