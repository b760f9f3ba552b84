"""The bad-input sweep (scripts/bad_input_sweep.py) finds nothing unclean on the Python
surface. Self-contained: it reads no fixture of the library's tests/conftest.py."""

import pytest
from lab_scripts import load_script


@pytest.mark.slow
def test_bad_input_sweep_python_surface_is_clean():
  """Every python-surface case of the sweep ends in a SpecdecError or its documented
  outcome (about 20 s)."""
  sweep = load_script("bad_input_sweep")
  cases = [c for c in sweep.all_cases() if c.surface == "python"]
  assert len(cases) > 200
  results = sweep.sweep(cases, timeout=120, progress=False)
  unclean = [f"{r.name}: {r.detail}" for r in results if r.outcome == "unclean"]
  assert not unclean, "\n".join(unclean)
