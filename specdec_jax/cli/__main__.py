"""`python -m specdec_jax.cli ...` is `specdec ...`."""

import sys

from specdec_jax.cli import main

sys.exit(main())
