"""`python -m specdec_jax.tools.cli ...` is `specdec ...`."""

import sys

from specdec_jax.tools.cli import main

sys.exit(main())
