"""The library's test set-up: its settings (suite_settings.py: the persistent compilation
cache and XLA's compile-speed flags, shared with the lab's tests) and the session fixtures
of the T5X-written tiny model (helpers.py). The xdist order is the repository's conftest.py.

Tiers: `pytest tests/unit` (marker `unit`) is the model-free tier: acceptance rules, buffer,
counters, theory, settings and the engine on table models (`specdec_jax.testing`), in seconds;
`pytest -m "not slow"` is the fast tier to run before every commit (within 2 minutes on
2 cores from an empty cache); the full suite (README's test command) adds the tests marked
`@pytest.mark.slow`: each costs 3 s or more from a cold cache (a costly model, program or
subprocess), and the fast tier keeps a cheaper test of the same feature.
"""

import jax
import suite_settings
from helpers import t5x_model, t5x_reference  # noqa: F401 (session fixtures)
from suite_settings import release_compiled_programs  # noqa: F401 (autouse, per module)

suite_settings.configure()    # before any test compiles

#: CPU devices in every test process (`jax_num_cpu_devices`): the mesh tests lay out meshes
#: of up to 8 in-process. Everything else runs on device 0, as on one device; the setting is
#: jax's, not the environment's, so `specdec` subprocesses still see one device. Set before
#: the CPU client starts (the first computation).
CPU_DEVICES = 8
jax.config.update("jax_num_cpu_devices", CPU_DEVICES)
