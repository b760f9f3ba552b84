"""`specdec-lab ...` (and `python -m specdec_jax_lab ...`) is `specdec ...`: the lab's
subcommands are `specdec` subcommands."""

import sys

from specdec_jax.cli import main

if __name__ == "__main__":
  sys.exit(main())
