"""specdec-jax's larger demo models as package data: ``assets/demo-de-en-large/``.

Nothing to import: `specdec_jax.package_data` finds this package and resolves the names
``sd.load("demo-de-en-large/target")``, ``sd.load("demo-de-en-large/drafter")`` and
``sd.load_tokenizer("demo-de-en-large")`` to its files.
"""

import pathlib

ASSETS = pathlib.Path(__file__).resolve().parent / "assets"
