"""The experimental corner (`specdec_jax.experimental`): its methods are not `sd`'s, the CLI
and the tests' registry still find them, their loops stay in small phases, and a method's
name is written once (its value's `name`)."""

import ast
import pathlib
import re

import jax.numpy as jnp
import pytest

import specdec_jax as sd
from specdec_jax import experimental, testing
from specdec_jax.cli import method_args
from specdec_jax.rounds.stats import DecodeStats

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(sd.__file__).parent
LAB = ROOT.parent / "packages" / "specdec-jax-lab"
#: The most lines and parameters of one function in the experimental modules (issue 47).
MAX_LINES, MAX_PARAMS = 60, 8


def function_sizes(path: pathlib.Path) -> list[tuple[str, int, int]]:
  """(name, lines, parameters) of every function and method of a Python file."""
  out = []
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      a = node.args
      params = (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None)
                + (a.kwarg is not None))
      out.append((node.name, node.end_lineno - node.lineno + 1, params))
  return out


def oversized(root: pathlib.Path) -> list[str]:
  return [f"{path.name}:{name} ({lines} lines, {params} parameters)"
          for path in sorted(root.rglob("*.py"))
          for name, lines, params in function_sizes(path)
          if lines > MAX_LINES or params > MAX_PARAMS]


def test_experimental_functions_are_small():
  assert oversized(ROOT / "experimental") == []


def test_the_size_check_sees_a_long_function(tmp_path):
  """Negative control: a 61-line function and one of 9 parameters."""
  body = "\n".join(["  x = 0"] * 59)
  (tmp_path / "m.py").write_text(f"def long():\n{body}\n  return x\n\n"
                                 "def wide(a, b, c, d, e, f, g, h, *args):\n  return a\n")
  assert oversized(tmp_path) == ["m.py:long (61 lines, 0 parameters)",
                                 "m.py:wide (2 lines, 9 parameters)"]


def test_experimental_methods_are_registered_apart():
  """Not exported by `sd` nor listed in `sd.methods.METHODS`; the CLI's `--method` and the
  tests' registry (every method's tests) take them all the same."""
  assert experimental.METHODS == (experimental.SpeculativeBeam,)
  assert not hasattr(sd, "SpeculativeBeam") and "SpeculativeBeam" not in sd.__all__
  assert set(sd.methods.METHODS).isdisjoint(experimental.METHODS)
  assert testing.METHODS == sd.methods.METHODS + experimental.METHODS
  assert method_args.CORE["speculative-beam"] is experimental.SpeculativeBeam
  with_drafter = [m for m in method_args.CORE.values() if m.with_drafter_for == "beam"]
  assert with_drafter == [experimental.SpeculativeBeam]       # --method beam --drafter X


def second_spellings(roots: list[pathlib.Path], names: set[str]) -> list[str]:
  """String constants that spell a method's name with underscores ("speculative_beam" for
  "speculative-beam"), in the Python files under `roots` (a module's name in `__all__` is
  a module's, not a method's)."""
  wrong = {n.replace("-", "_") for n in names if "-" in n}
  found = []
  for path in sorted(p for root in roots for p in root.rglob("*.py")):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    exports = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and any(getattr(t, "id", None) == "__all__" for t in node.targets)
               for c in ast.walk(node.value)}
    found += [f"{path.name}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and node.value in wrong
              and id(node) not in exports]
  return found


def test_a_methods_name_is_written_once():
  """No "speculative_beam" as a method name in the library or the lab's package: the run's
  info and every report take the value's `name`."""
  names = {m.name for m in testing.METHODS}
  assert "speculative-beam" in names
  assert second_spellings([ROOT, LAB / "specdec_jax_lab"], names) == []


def test_the_spelling_check_sees_one(tmp_path):
  (tmp_path / "m.py").write_text('__all__ = ["speculative_beam"]\n'
                                 'INFO = (("method", "speculative_beam"),)\n')
  assert second_spellings([tmp_path], {"speculative-beam"}) == ["m.py:2 'speculative_beam'"]


def table_names(page: pathlib.Path) -> list[str]:
  """The first-column names (`name`) of the table under the page's "## Statistics"."""
  body = page.read_text(encoding="utf-8").split("## Statistics\n", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"^\| `([a-z_]+)` \|", body, flags=re.M)


def test_the_docs_statistics_table_lists_what_out_stats_reports():
  """docs/methods/speculative-beam.md lists each name of `out.stats` once: the value's
  `statistics` and what its output derives from them (steps, ...), no other."""
  beam = experimental.SpeculativeBeam
  out = experimental.SpeculativeBeamOutput(
      tokens=jnp.zeros((2, 3), jnp.int32), lengths=jnp.ones((2,), jnp.int32),
      counters=DecodeStats.zeros(2, 2), info=(("method", beam.name),),
      statistics=beam.statistics, steps=jnp.array(1))
  names = table_names(ROOT.parent / "docs" / "methods" / "speculative-beam.md")
  assert len(names) == len(set(names))
  assert set(names) == set(out.stats) - {"method"}
  assert set(beam.statistics) < set(names)
  assert set(beam.derived_statistics) <= set(names)   # the reports' columns read them

