"""The lab's scripts (packages/specdec-jax-lab/scripts/NAME.py) as modules, for their tests."""

import importlib.util
import pathlib
import sys

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
