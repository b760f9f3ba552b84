"""The folders are the layers: a lower layer never imports a higher one, and nothing imports
in a circle -- function-local imports included (they hide a circle at import time, not in
the design).

The order, lowest first, is written here once. Modules of one layer may import each other
(without a circle); a layer of several names (cache, sampling, theory) holds peers that
import none of each other.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import specdec_jax

pytestmark = pytest.mark.unit

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("package_data",),          # files shipped as package data (named configs, assets)
    ("config",),                # T5Config, LMConfig and their shared base
    ("kernels",),               # the products' backends (C++ FFI, Pallas, XLA)
    ("cache", "sampling", "theory"),
    ("models",),                # T5 and decoder-only networks, the Model pytree
    ("io",),                    # checkpoints and tokenizers
    ("sharding",),              # meshes, placing and loading a Model onto one
    ("rounds",),                # the round engine, acceptance rules, buffer, statistics
    ("drafters",),              # proposers that plug into the engine
    ("methods",),               # method values, their wirings, decode, the functional API
    ("testing",),               # scripted proposers and table models for tests
    ("",),                      # specdec_jax/__init__.py: the public `sd` namespace
    ("tools",),                 # CLI, bench, results, training, comparisons
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
ROOT = pathlib.Path(specdec_jax.__file__).parent


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = ["specdec_jax", *path.relative_to(root).with_suffix("").parts]
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
  """{module: the specdec_jax modules it imports}, from every import statement anywhere in
  the file (module level or inside functions). `from pkg import sub` is an edge to the
  submodule `pkg.sub`; `from pkg import name` one to `pkg` itself."""
  paths = {module_name(p, root): p for p in root.rglob("*.py")}
  graph: dict[str, set[str]] = {}
  for name, path in paths.items():
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = graph.setdefault(name, set())
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          up = package.split(".")[: len(package.split(".")) - node.level + 1]
          base = ".".join(up + ([base] if base else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base
                   for a in node.names]
      else:
        continue
      for target in targets:
        while target and target not in paths:   # `import a.b.c` of a name inside a module
          target = target.rpartition(".")[0]
        if target.startswith("specdec_jax") and target != name:
          edges.add(target)
  return graph


def layer_of(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else ""


def back_edges(graph: dict[str, set[str]]) -> list[str]:
  """Imports of a module from a higher layer, or from a peer of the same rank."""
  bad = []
  for source, targets in sorted(graph.items()):
    for target in sorted(targets):
      a, b = layer_of(source), layer_of(target)
      if a != b and RANK[a] <= RANK[b]:
        bad.append(f"{source} ({a or 'sd'}) imports {target} ({b or 'sd'})")
  return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Every strongly connected set of more than one module (Tarjan), each sorted."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  on_stack: set[str] = set()
  found: list[list[str]] = []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_every_module_has_a_layer():
  """Each top-level module or package of specdec_jax is in one layer (a new one is placed
  in LAYERS before it lands)."""
  tops = {layer_of(m) for m in import_graph(ROOT)}
  assert sorted(tops - set(RANK)) == []


def test_no_import_goes_up_a_layer():
  assert back_edges(import_graph(ROOT)) == []


def test_no_import_cycles():
  assert cycles(import_graph(ROOT)) == []


def test_the_checks_see_function_local_imports_and_cycles(tmp_path):
  """Negative control: a package with a function-local back-edge and a circle fails."""
  pkg = tmp_path / "specdec_jax"
  (pkg / "rounds").mkdir(parents=True)
  (pkg / "methods").mkdir()
  for init in (pkg, pkg / "rounds", pkg / "methods"):
    (init / "__init__.py").write_text("")
  (pkg / "rounds" / "engine.py").write_text(
      "def run():\n  from specdec_jax.methods import values\n  return values\n")
  (pkg / "methods" / "values.py").write_text("from specdec_jax.methods import wiring\n")
  (pkg / "methods" / "wiring.py").write_text(
      "def f():\n  from specdec_jax.methods.values import X\n")
  graph = import_graph(pkg)
  assert graph["specdec_jax.rounds.engine"] == {"specdec_jax.methods.values"}
  assert back_edges(graph) == ["specdec_jax.rounds.engine (rounds) imports "
                               "specdec_jax.methods.values (methods)"]
  assert cycles(graph) == [["specdec_jax.methods.values", "specdec_jax.methods.wiring"]]
