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
    ("batching", "cache", "compilation", "sampling", "theory", "timing"),
    ("models",),                # T5 and decoder-only networks, the Model pytree
    ("io",),                    # checkpoints and tokenizers
    ("sharding",),              # meshes, placing and loading a Model onto one
    ("rounds",),                # the round engine, acceptance rules, buffer, statistics
    ("drafters",),              # proposers that plug into the engine
    ("methods",),               # method values, their wirings, decode, the functional API
    ("experimental",),          # research methods on the methods' values (SpeculativeBeam)
    ("costs", "plan", "runs"),  # step costs; memory plans; runs of a method over a corpus
    ("testing",),               # scripted proposers and table models for tests
    ("",),                      # specdec_jax/__init__.py: the public `sd` namespace
    ("loading",),               # models and drafters from the names users type
    ("flags",),                 # command-line flags derived from the values (CLI and lab)
    ("runtime",),               # several processes, output files, streams
    ("cli",),                   # the `specdec` command: parse flags, call the library
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
ROOT = pathlib.Path(specdec_jax.__file__).parent
REPO = ROOT.parent
LAB = REPO / "packages" / "specdec-jax-lab" / "specdec_jax_lab"
API_INDEX = REPO / "docs" / "api" / "index.md"


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


# ----------------------------------------------------------------------------- the lab


def public_modules(index: pathlib.Path = API_INDEX) -> set[str]:
  """The library's public modules: the backticked `specdec_jax...` names of the "Public
  modules" section of docs/api/index.md (a name ending in `.*` covers its submodules)."""
  text = index.read_text(encoding="utf-8")
  section = text.split("## Public modules", 1)[1].split("\n## ", 1)[0]
  return {part for part in section.split("`")[1::2] if part.startswith("specdec_jax")}


def is_public(module: str, public: set[str]) -> bool:
  return module in public or any(
      p.endswith(".*") and (module == p[:-2] or module.startswith(p[:-1])) for p in public)


def library_imports(root: pathlib.Path) -> dict[str, set[str]]:
  """{lab module: the specdec_jax modules it imports, as written}, every import statement
  (module level or function-local): `from a.b import c` counts as a.b (or a.b.c when that
  is a module of the library)."""
  modules = {module_name(p, ROOT) for p in ROOT.rglob("*.py")}
  found: dict[str, set[str]] = {}
  for path in sorted(root.rglob("*.py")):
    edges = found.setdefault(str(path.relative_to(root)), set())
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level:
        base = node.module or ""
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
      else:
        continue
      edges.update(n for n in names if n == "specdec_jax" or n.startswith("specdec_jax."))
  return found


def private_imports(root: pathlib.Path, public: set[str]) -> list[str]:
  return [f"{source} imports {target}" for source, targets in library_imports(root).items()
          for target in sorted(targets) if not is_public(target, public)]


def private_attributes(root: pathlib.Path) -> list[str]:
  """`x._name` where x is a name a file bound to a specdec_jax module or value by import
  (`from specdec_jax.experimental import speculative_beam as sb`: `sb._draft`)."""
  found = []
  for path in sorted(root.rglob("*.py")):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    ours = lambda name: name == "specdec_jax" or name.startswith("specdec_jax.")
    bound = {a.asname or a.name.partition(".")[0] for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and ours(node.module or "")
             or isinstance(node, ast.Import) and any(ours(a.name) for a in node.names)
             for a in node.names}
    found += [f"{path.relative_to(root)}:{node.lineno} {node.value.id}.{node.attr}"
              for node in ast.walk(tree) if isinstance(node, ast.Attribute)
              and isinstance(node.value, ast.Name) and node.value.id in bound
              and node.attr.startswith("_") and not node.attr.startswith("__")]
  return found


@pytest.mark.parametrize("root", [LAB, LAB.parent / "scripts"], ids=["package", "scripts"])
def test_the_lab_uses_only_the_public_api(root):
  """The lab (packages/specdec-jax-lab: its package and its research scripts) imports
  specdec_jax through `sd` and the public modules of docs/api/index.md only, and reads no
  private name of them: what it needs is what any user gets."""
  public = public_modules()
  assert "specdec_jax" in public and "specdec_jax.errors" in public
  assert private_imports(root, public) == []
  assert private_attributes(root) == []


def test_the_public_modules_exist():
  import importlib
  for name in public_modules():
    importlib.import_module(name.removesuffix(".*"))


def test_the_lab_check_sees_a_private_import(tmp_path):
  """Negative control: a lab module importing the engine's internals (function-local)."""
  (tmp_path / "x.py").write_text(
      "import specdec_jax as sd\n"
      "def f():\n  from specdec_jax.rounds.requests import as_rng\n  return as_rng\n")
  public = {"specdec_jax", "specdec_jax.flags.*"}
  assert private_imports(tmp_path, public) == ["x.py imports specdec_jax.rounds.requests"]
  (tmp_path / "x.py").write_text("from specdec_jax.flags import mesh\n")
  assert private_imports(tmp_path, public) == []
  (tmp_path / "x.py").write_text("from specdec_jax.experimental import speculative_beam as sb\n"
                                 "import numpy as np\nf = sb._draft\ng = np._NoValue\n")
  assert private_attributes(tmp_path) == ["x.py:3 sb._draft"]

