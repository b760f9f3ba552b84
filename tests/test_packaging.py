"""A built wheel works on its own: package data inside it, installed into a fresh virtualenv.

The library's wheel is code only (no models; under 2 MB); the demo models ship in
``packages/specdec-jax-demo-small``, whose wheel is built and installed beside it. Both are
built from copies of the working tree (without build isolation, so nothing is downloaded)
and installed with ``--no-deps`` into new virtualenvs: one with the library alone, one with
both. That virtualenv sees the
test environment's dependencies (jax, flax, ...) through a ``.pth`` line naming a directory
of links to this environment's installed packages LESS specdec-jax's own distributions
(the library, the lab, the demo models; installed editable or not, as README's and CI's
set-ups differ), so they stay invisible, and every check asserts that ``specdec_jax`` is
imported from the fresh virtualenv.
Commands run outside the repository.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "specdec_jax"
DEMO_SMALL = REPO / "packages" / "specdec-jax-demo-small"
NOT_COPIED = (".git", ".venv", ".jax_cache", "build", "dist", "runs", "packages", "*.egg-info",
              "__pycache__", ".pytest_cache")
#: The library's wheel is code, configs and kernel sources (the demo models' wheels stay
#: under the package index's limit, `demo.MAX_WHEEL_MB`).
MAX_LIBRARY_WHEEL_MB = 2.0
#: No file this large is tracked inside the library package (models go to packages/).
MAX_PACKAGE_FILE_BYTES = 1_000_000


def _run(cmd, cwd, timeout=300, env=None) -> subprocess.CompletedProcess:
  env = {k: v for k, v in (os.environ if env is None else env).items()
         if k not in ("PYTHONPATH", "PYTHONHOME")}
  env["JAX_PLATFORMS"] = "cpu"
  proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, (
      f"{shlex.join(map(str, cmd))} exited {proc.returncode}\n"
      f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
  return proc


def _package_data() -> set[str]:
  """Wheel paths of the data files the package must ship."""
  files = [*(PACKAGE / "configs" / "models").glob("*.json"),
           *(PACKAGE / "kernels").glob("*.cc"), *(PACKAGE / "kernels").glob("*.h")]
  return {p.relative_to(REPO).as_posix() for p in files}


def _demo_assets() -> set[str]:
  """Wheel paths of the models and tokenizers specdec-jax-demo-small must ship."""
  return {p.relative_to(DEMO_SMALL).as_posix()
          for p in (DEMO_SMALL / "specdec_jax_demo_small" / "assets").rglob("*") if p.is_file()}


def _build_wheel(source: pathlib.Path, dist: pathlib.Path, pattern: str) -> pathlib.Path:
  """`pip wheel` of a copied source tree, offline; the one wheel it writes."""
  _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "--no-index", "-q", "-w", str(dist), "."], cwd=source)
  wheels = list(dist.glob(pattern))
  assert len(wheels) == 1, wheels
  return wheels[0]


def _make_venv(root: pathlib.Path, wheels: list[pathlib.Path]) -> pathlib.Path:
  """A fresh virtualenv at `root` with `wheels` installed, seeing this environment's
  dependencies."""
  _run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=root.parent)
  python = root / "bin" / "python"
  # pip --python runs this environment's pip on the fresh interpreter (the venv has no pip).
  _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
        "--no-index", "--no-compile", "-q", *map(str, wheels)], cwd=root.parent)
  site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
              cwd=root.parent).stdout.strip()
  (pathlib.Path(site) / "_test_environment_deps.pth").write_text(
      f"{_dependencies(root.parent / 'deps')}\n")
  return root


#: Names (lower case) of this project's own distributions and their import packages, and of
#: editable installs' hooks: what a fresh virtualenv must not see from the test environment.
OWN = ("specdec_jax", "specdec-jax", "__editable__", "_specdec")


def _dependencies(out: pathlib.Path) -> pathlib.Path:
  """A directory of links to this environment's installed packages (site-packages'
  entries) except this project's own distributions and any .pth file: a fresh virtualenv
  sees jax, flax, ... there and nothing of specdec-jax's."""
  if out.exists():
    return out
  out.mkdir(parents=True)
  for site in sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}):
    for entry in sorted(pathlib.Path(site).iterdir()):
      name = entry.name.lower()
      if (name.startswith(OWN) or name.endswith((".pth", ".egg-link"))
          or (out / entry.name).exists()):
        continue
      (out / entry.name).symlink_to(entry)
  return out


def _run_json(venv: pathlib.Path, script: str, cwd: pathlib.Path) -> dict:
  """`script` run by the virtualenv's python; the JSON object its last line prints."""
  out = _run([str(venv / "bin" / "python"), "-c", script], cwd=cwd).stdout
  return json.loads(out.strip().splitlines()[-1])


def _quickstart_command() -> list[str]:
  """The quickstart's command on the pair specdec-jax-demo-small's wheel ships (`specdec
  decode ... demo-de-en ...`, docs/quickstart.md), as argv. (README's main command needs the
  specdec-jax-demo distribution: tests/test_demo_large.py runs it.)"""
  for line in (REPO / "docs" / "quickstart.md").read_text().splitlines():
    start = line.find("specdec decode --model demo-de-en/target")
    if start >= 0:
      return shlex.split(line[start:])
  raise AssertionError("docs/quickstart.md has no `specdec decode --model demo-de-en/target "
                       "...` line")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
  """The wheel built from a copy of the working tree (top-level configs/ symlink included)."""
  work = tmp_path_factory.mktemp("wheel")
  source = work / "src"
  shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_COPIED))
  return _build_wheel(source, work / "dist", "specdec_jax-*.whl")


@pytest.fixture(scope="module")
def demo_wheel(tmp_path_factory) -> pathlib.Path:
  """specdec-jax-demo-small's wheel, built from a copy of packages/specdec-jax-demo-small."""
  work = tmp_path_factory.mktemp("demo-wheel")
  source = work / "src"
  shutil.copytree(DEMO_SMALL, source, ignore=shutil.ignore_patterns(
      "build", "dist", "*.egg-info", "__pycache__"))
  return _build_wheel(source, work / "dist", "specdec_jax_demo_small-*.whl")


@pytest.fixture(scope="module")
def bare_venv(wheel, tmp_path_factory) -> pathlib.Path:
  """A fresh virtualenv with the library's wheel alone (no demo models)."""
  return _make_venv(tmp_path_factory.mktemp("bare-venv") / "fresh", [wheel])


@pytest.fixture(scope="module")
def venv(wheel, demo_wheel, tmp_path_factory) -> pathlib.Path:
  """A fresh virtualenv with the library's wheel and specdec-jax-demo-small's."""
  return _make_venv(tmp_path_factory.mktemp("venv") / "fresh", [wheel, demo_wheel])


def test_library_package_tracks_no_large_file():
  """Models and other large files live in packages/, never in the library package (its
  wheel stays code only): git tracks no file over 1 MB under specdec_jax/."""
  proc = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--", "specdec_jax"],
                        capture_output=True, text=True, timeout=60)
  if proc.returncode != 0:
    pytest.skip(f"not a git checkout: {proc.stderr.strip()}")
  tracked = [REPO / name for name in proc.stdout.split("\0") if name]
  assert any(p.name == "__init__.py" for p in tracked)          # it did list the package
  large = {p.relative_to(REPO).as_posix(): p.stat().st_size for p in tracked
           if p.is_file() and p.stat().st_size > MAX_PACKAGE_FILE_BYTES}
  assert large == {}, f"files over {MAX_PACKAGE_FILE_BYTES:,} bytes in specdec_jax/: {large}"


def test_repo_layout_keeps_top_level_configs():
  models = REPO / "configs" / "models"
  assert models.is_symlink() and not os.path.isabs(os.readlink(models))
  assert models.resolve() == (PACKAGE / "configs" / "models").resolve()
  assert (models / "t5_1_1_small.json").is_file()
  assert (REPO / "configs" / "demo" / "train.json").is_file()


@pytest.mark.slow
def test_wheel_is_code_with_configs_and_kernel_sources(wheel):
  with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    metadata = z.read("specdec_jax-0.1.0.dist-info/METADATA").decode()
    entry_points = z.read("specdec_jax-0.1.0.dist-info/entry_points.txt").decode()
  expected = _package_data()
  assert {"specdec_jax/configs/models/t5_1_1_tiny.json",
          "specdec_jax/kernels/skinny.cc", "specdec_jax/kernels/attention.cc",
          "specdec_jax/kernels/pool.h"} <= expected
  assert sorted(expected - names) == []
  assert "License-Expression: Apache-2.0" in metadata
  assert re.search(r"^specdec = specdec_jax\.[\w.]+:main$", entry_points, re.MULTILINE)
  # code only: no models, no assets directory, well under the limit
  assert [n for n in names if "assets/" in n or n.endswith((".safetensors", ".model"))] == []
  assert wheel.stat().st_size < MAX_LIBRARY_WHEEL_MB * 1e6, wheel.stat().st_size


@pytest.mark.slow
def test_demo_wheel_ships_every_model_under_the_index_limit(demo_wheel):
  from specdec_jax_lab.demo import MAX_WHEEL_MB
  with zipfile.ZipFile(demo_wheel) as z:
    names = set(z.namelist())
    metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
  assert {"specdec_jax_demo_small/assets/demo-de-en/target/params.safetensors",
          "specdec_jax_demo_small/assets/demo-en-lm/tokenizer.json"} <= _demo_assets()
  assert sorted(_demo_assets() - names) == []
  assert "Requires-Dist: specdec-jax>=0.1.0" in metadata
  assert demo_wheel.stat().st_size < MAX_WHEEL_MB * 1e6, demo_wheel.stat().st_size


@pytest.mark.slow
def test_library_alone_names_the_demo_package_to_install(bare_venv, tmp_path):
  """Without specdec-jax-demo-small, a bundled name says how to install it, in the API and in
  the CLI (one line, no traceback), and nothing is listed as bundled."""
  script = (
      "import json, specdec_jax as sd\n"
      "from specdec_jax.io.checkpoints import bundled_names\n"
      "from specdec_jax.io.tokenizer import bundled_tokenizers\n"
      "errors = []\n"
      "for load, name in ((sd.load, 'demo-de-en/target'), (sd.load_tokenizer, 'demo-en-lm')):\n"
      "  try:\n"
      "    load(name)\n"
      "  except sd.errors.SpecdecError as e:\n"
      "    errors.append([type(e).__name__, str(e)])\n"
      "print(json.dumps({'file': sd.__file__, 'errors': errors, 'bundled': bundled_names(),\n"
      "                  'tokenizers': bundled_tokenizers()}))\n")
  out = _run_json(bare_venv, script, tmp_path)
  assert pathlib.Path(out["file"]).resolve().is_relative_to(bare_venv.resolve()), out["file"]
  assert [kind for kind, _ in out["errors"]] == ["MissingAssets", "MissingAssets"]
  for _, message in out["errors"]:
    assert "pip install ./packages/specdec-jax-demo-small" in message, message
  assert out["bundled"] == [] and out["tokenizers"] == []
  argv = _quickstart_command()
  proc = subprocess.run([str(bare_venv / "bin" / argv[0]), *argv[1:]], cwd=tmp_path,
                        capture_output=True, text=True, timeout=300,
                        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                             "JAX_PLATFORMS": "cpu"})
  assert proc.returncode != 0 and proc.stdout == ""
  assert "pip install ./packages/specdec-jax-demo-small" in proc.stderr
  assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_wheel_install_loads_named_config_and_bundled_names(venv, tmp_path):
  script = (
      "import json, specdec_jax as sd\n"
      "from specdec_jax import package_data\n"
      "from specdec_jax.io.checkpoints import bundled_names\n"
      "from specdec_jax.io.tokenizer import bundled_tokenizers\n"
      "model = sd.load('config:t5_1_1_tiny')\n"
      "print(json.dumps({'file': sd.__file__, 'vocab_size': model.config.vocab_size,\n"
      "                  'configs': sd.available_configs(), 'bundled': bundled_names(),\n"
      "                  'tokenizers': bundled_tokenizers(),\n"
      "                  'assets': str(package_data.assets('demo-de-en/target'))}))\n")
  out = _run_json(venv, script, tmp_path)
  assert pathlib.Path(out["file"]).resolve().is_relative_to(venv.resolve()), out["file"]
  assert pathlib.Path(out["assets"]).resolve().is_relative_to(venv.resolve()), out["assets"]
  assert out["vocab_size"] == 512
  assert out["configs"] == sorted(p.stem for p in (PACKAGE / "configs" / "models").glob("*.json"))
  assert out["bundled"] == ["demo-de-en/drafter", "demo-de-en/early-exit", "demo-de-en/target",
                            "demo-en-lm/drafter", "demo-en-lm/target"]
  assert out["tokenizers"] == ["demo-de-en", "demo-en-lm"]


@pytest.mark.slow
def test_wheel_install_builds_cpu_kernels_from_package_data(venv, tmp_path):
  """The installed wheel compiles its own kernel sources (fresh cache), where this checkout can."""
  from specdec_jax import kernels
  if not kernels.available():
    pytest.skip(f"CPU kernels unavailable here: {kernels.status().reason}")
  script = ("import json\nfrom specdec_jax import kernels\ns = kernels.status()\n"
            "print(json.dumps({'available': s.available, 'library': s.library}))\n")
  env = {**os.environ, "SPECDEC_CACHE_DIR": str(tmp_path / "cache")}
  env.pop(kernels.ENV_VAR, None)
  out = json.loads(_run([str(venv / "bin" / "python"), "-c", script], cwd=tmp_path, env=env)
                   .stdout.strip().splitlines()[-1])
  assert out["available"], out
  assert pathlib.Path(out["library"]).parent == tmp_path / "cache"


@pytest.mark.slow
def test_wheel_install_runs_the_quickstart_command(venv, tmp_path):
  argv = _quickstart_command()
  script = venv / "bin" / argv[0]
  assert script.is_file(), "the wheel did not install the `specdec` console script"
  first_line = script.read_text().splitlines()[0]
  assert first_line.startswith("#!") and str(venv) in first_line, first_line
  proc = _run([str(script), *argv[1:]], cwd=tmp_path)
  assert "I have no time." in proc.stdout.splitlines()  # translations on stdout
  assert len(proc.stdout.splitlines()) == 2
  stats = proc.stderr  # the --stats block on stderr
  assert "-- specdec decode statistics --" in stats
  assert "speculative drafter=demo-de-en/drafter gamma=4, greedy" in stats
  assert "acceptance rate" in stats and "alpha" in stats


LAB = REPO / "packages" / "specdec-jax-lab"


#: Every lab command, each a `specdec` subcommand once the lab is installed.
LAB_COMMANDS = ("bench", "train", "eval", "sweep-bild", "sweep-blockwise")

#: Each command's --help in one process: the usage line each prints, or its error.
HELP_SCRIPT = """
import contextlib, io, json, sys
from specdec_jax import cli
usages = {}
for command in sys.argv[1:]:
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    try:
      code = cli.main([command, "--help"])
    except SystemExit as e:
      code = e.code
  assert code in (0, None), (command, code)
  usages[command] = out.getvalue().splitlines()[0]
print(json.dumps(usages))
"""


@pytest.mark.slow
def test_the_lab_is_a_wheel_whose_commands_join_specdec(wheel, bare_venv, tmp_path_factory,
                                                         tmp_path):
  """specdec-jax-lab builds a wheel of every lab module with its entry points; installed
  beside the library its commands are `specdec` subcommands, and the library alone says
  how to get them (exit 1, one line)."""
  work = tmp_path_factory.mktemp("lab-wheel")
  shutil.copytree(LAB, work / "src", ignore=shutil.ignore_patterns(
      "build", "dist", "*.egg-info", "__pycache__"))
  lab = _build_wheel(work / "src", work / "dist", "specdec_jax_lab-*.whl")
  names = set(zipfile.ZipFile(lab).namelist())
  modules = {p.relative_to(LAB).as_posix() for p in (LAB / "specdec_jax_lab").rglob("*.py")}
  assert sorted(modules - names) == []
  entry = next(n for n in names if n.endswith("entry_points.txt"))
  points = zipfile.ZipFile(lab).read(entry).decode()
  assert "[specdec_jax.commands]" in points and "bench = specdec_jax_lab.commands.bench" in points
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  env["JAX_PLATFORMS"] = "cpu"
  proc = subprocess.run([str(bare_venv / "bin" / "specdec"), "bench", "--target", "config:x"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines() == [
      "specdec bench: error: `specdec bench` comes with the lab, specdec-jax-lab, which is not "
      "installed (or cannot be imported): pip install ./packages/specdec-jax-lab "
      "(docs/install.md)"]
  both = _make_venv(tmp_path_factory.mktemp("with-lab") / "fresh", [wheel, lab])
  proc = subprocess.run([str(both / "bin" / "python"), "-c", HELP_SCRIPT, *LAB_COMMANDS],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  usages = json.loads(proc.stdout.strip().splitlines()[-1])
  assert {c: u.split()[:3] for c, u in usages.items()} == {
      c: ["usage:", "specdec", c] for c in LAB_COMMANDS}, usages
