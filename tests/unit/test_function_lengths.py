"""No function of the library is longer than 80 lines (issue 47): a longer one is split
into named phases (as `kernels/gpu/decode_attention.py`'s kernel is)."""

from __future__ import annotations

import ast
import pathlib

import pytest

import specdec_jax

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(specdec_jax.__file__).parent
MAX_LINES = 80


def long_functions(root: pathlib.Path, limit: int = MAX_LINES) -> list[str]:
  """"file:name (n lines)" of every function, method or nested function under `root`
  longer than `limit` lines (decorators left out, docstring and comments counted)."""
  found = []
  for path in sorted(root.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > limit:
          found.append(f"{path.relative_to(root)}:{node.name} ({lines} lines)")
  return found


def test_no_library_function_is_over_80_lines():
  assert long_functions(ROOT) == []


def test_the_check_sees_a_long_nested_function(tmp_path):
  """Negative control: a nested function of 81 lines is found, one of 80 is not."""
  body = "".join("    x = 1\n" for _ in range(79))
  (tmp_path / "m.py").write_text(f"def outer():\n  def inner():\n{body}    return x\n"
                                 "  return inner\n")
  assert long_functions(tmp_path) == ["m.py:outer (83 lines)", "m.py:inner (81 lines)"]
  assert long_functions(tmp_path, limit=83) == []
