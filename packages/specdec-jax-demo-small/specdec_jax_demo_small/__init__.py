"""specdec-jax's small demo models as package data: ``assets/demo-de-en/``, ``assets/demo-en-lm/``.

Nothing to import: `specdec_jax.package_data` finds this package and resolves the names
``sd.load("demo-de-en/target")``, ``sd.load("demo-de-en/drafter")``,
``sd.load("demo-de-en/early-exit")``, ``sd.load_heads("demo-de-en/target", ...)``,
``sd.load("demo-en-lm/target")``, ``sd.load("demo-en-lm/drafter")`` and
``sd.load_tokenizer("demo-de-en")`` / ``sd.load_tokenizer("demo-en-lm")`` to its files.
"""

import pathlib

ASSETS = pathlib.Path(__file__).resolve().parent / "assets"
