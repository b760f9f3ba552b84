"""The lab's tests run under the library's test settings, taken from the one module that
holds them (tests/suite_settings.py: the persistent compilation cache, XLA's level-0
flags, compiled programs released after each module), and use the library's test helpers
(tests/helpers.py: paths, the demo's held-out pairs, the tiny models, the T5X-written
model's session fixtures).

Run them from the repository root: `python -m pytest packages/specdec-jax-lab/tests -q`
(the markers and options are the root pyproject.toml's).
"""

import pathlib
import sys

# The library's tests folder, for `suite_settings` and `helpers` (as pytest puts a
# conftest's own folder on sys.path).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests"))

import suite_settings  # noqa: E402
from helpers import t5x_model, t5x_reference  # noqa: E402,F401 (session fixtures)
from suite_settings import release_compiled_programs  # noqa: E402,F401 (autouse, per module)

suite_settings.configure()    # before any test compiles
