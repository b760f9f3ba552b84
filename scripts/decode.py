#!/usr/bin/env python
"""Same as `specdec decode ...`: decode prompts, baseline or speculative.

    python scripts/decode.py --model config:t5_1_1_tiny --drafter config:t5_1_1_tiny_drafter \
        --stats "5 17 42 1"

`--help` for every option.
"""

import sys

from specdec_jax.tools import cli

if __name__ == "__main__":
  sys.exit(cli.main(["decode", *sys.argv[1:]]))
