"""A method's name is written once: its value's `name` class attribute. The run's info, the
CLI's defaults, the lab's flags, reports and tables read it from the value, so no module of
the library or of the lab's package spells a method's name (or its name with underscores,
"speculative_beam" for "speculative-beam") as a string of its own."""

import ast
import inspect
import pathlib

import pytest

import specdec_jax as sd
from specdec_jax import testing

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(sd.__file__).parent
LAB = ROOT.parent / "packages" / "specdec-jax-lab" / "specdec_jax_lab"


def _homes(tree: ast.Module, classes: set[str]) -> set[int]:
  """The ids of the constants assigned to `name` in the body of the classes `classes`."""
  return {id(node.value) for cls in ast.walk(tree)
          if isinstance(cls, ast.ClassDef) and cls.name in classes
          for node in cls.body if isinstance(node, (ast.Assign, ast.AnnAssign))
          and any(getattr(t, "id", None) == "name"
                  for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))}


def _exports(tree: ast.Module) -> set[int]:
  """The ids of the constants of `__all__` (a module's name there is a module's, not a
  method's: `experimental.speculative_beam`)."""
  return {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
          and any(getattr(t, "id", None) == "__all__" for t in node.targets)
          for c in ast.walk(node.value)}


def homes(methods: tuple[type, ...]) -> dict[pathlib.Path, set[str]]:
  """{the file that defines a method class: the names of those classes}."""
  out: dict[pathlib.Path, set[str]] = {}
  for m in methods:
    out.setdefault(pathlib.Path(inspect.getfile(m)).resolve(), set()).add(m.__name__)
  return out


def name_literals(roots: list[pathlib.Path], names: set[str],
                  classes: dict[pathlib.Path, set[str]]) -> list[str]:
  """String constants spelling one of `names`, or it with underscores, in the Python files
  under `roots`, other than the `name` attribute of the method classes `classes` (by file)."""
  spellings = names | {n.replace("-", "_") for n in names}
  found = []
  for path in sorted(p for root in roots for p in root.rglob("*.py")):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    allowed = _homes(tree, classes.get(path.resolve(), set())) | _exports(tree)
    found += [f"{path.relative_to(path.parents[1])}:{node.lineno} {node.value!r}"
              for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and node.value in spellings
              and id(node) not in allowed]
  return found


def test_a_methods_name_is_written_once():
  """In the library and the lab's package, every method's name is a string only in its
  class: the run's info, the reports and the lab take the value's `name`."""
  assert {"autoregressive", "speculative", "bild", "blockwise", "beam",
          "speculative-beam"} <= {m.name for m in testing.METHODS}
  names = {m.name for m in testing.METHODS}
  assert name_literals([ROOT, LAB], names, homes(testing.METHODS)) == []


def test_the_name_check_sees_a_second_spelling(tmp_path):
  """Negative control: a method's name written outside its class (as a report's key, or with
  underscores) is found; its class attribute and a module's name in `__all__` are not."""
  (tmp_path / "pkg").mkdir()
  home = tmp_path / "pkg" / "m.py"
  home.write_text('__all__ = ["patient_speculative"]\n'
                  'class Patient:\n  name = "patient-speculative"\n'
                  'class Other:\n  name = "patient-speculative"\n'
                  'INFO = (("method", "patient_speculative"),)\n'
                  'def spec(r):\n  return r["method"] == "patient-speculative"\n')
  assert name_literals([tmp_path], {"patient-speculative"}, {home: {"Patient"}}) == [
      "pkg/m.py:5 'patient-speculative'", "pkg/m.py:6 'patient_speculative'",
      "pkg/m.py:8 'patient-speculative'"]


def test_every_method_class_has_its_home():
  """The classes the check allows are the method types', found in their files."""
  found = homes(testing.METHODS)
  assert found[ROOT / "methods" / "bild.py"] == {"BiLD"}
  assert found[ROOT / "experimental" / "speculative_beam.py"] == {"SpeculativeBeam"}
