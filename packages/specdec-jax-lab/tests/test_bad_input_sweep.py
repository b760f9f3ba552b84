"""The bad-input sweep (scripts/bad_input_sweep.py) finds nothing unclean on the Python
surface. Self-contained: it reads no fixture of the library's tests/conftest.py."""

import importlib.util
import pathlib
import sys

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
  """scripts/NAME.py as a module (registered in sys.modules: its dataclasses look their
  module up)."""
  spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


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
