"""The experimental corner (`specdec_jax.experimental`): its methods are not `sd`'s, the CLI
and the tests' registry still find them, and their loops stay in small phases (that a
method's name is written once: tests/unit/test_method_names.py)."""

import ast
import pathlib
import re

import jax.numpy as jnp
import pytest

import specdec_jax as sd
from specdec_jax import experimental, testing
from specdec_jax.flags import methods as method_args
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

