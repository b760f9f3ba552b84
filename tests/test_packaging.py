"""A built wheel works on its own: package data inside it, installed into a fresh virtualenv.

The wheel is built from a copy of the working tree (without build isolation, so nothing is
downloaded) and installed with ``--no-deps`` into a new virtualenv. That virtualenv sees the
test environment's dependencies (jax, flax, ...) through a ``.pth`` line naming this
environment's site-packages; ``.pth`` files inside a directory named that way are not run, so
this environment's editable install of specdec-jax stays invisible, and every check asserts
that ``specdec_jax`` is imported from the fresh virtualenv. Commands run outside the
repository.
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
NOT_COPIED = (".git", ".venv", ".jax_cache", "build", "dist", "runs", "packages", "*.egg-info", "__pycache__",
              ".pytest_cache")


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
           *(p for p in (PACKAGE / "assets").rglob("*") if p.is_file()),
           *(PACKAGE / "kernels").glob("*.cc"), *(PACKAGE / "kernels").glob("*.h")]
  return {p.relative_to(REPO).as_posix() for p in files}


def _quickstart_command() -> list[str]:
  """The quickstart's command on the pair the library's wheel ships (`specdec decode ...
  demo-de-en ...`, docs/quickstart.md), as argv. (README's main command needs the
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
  dist = work / "dist"
  _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "--no-index", "-q", "-w", str(dist), "."], cwd=source)
  wheels = list(dist.glob("specdec_jax-*.whl"))
  assert len(wheels) == 1, wheels
  return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> pathlib.Path:
  """A fresh virtualenv with the wheel installed, seeing this environment's dependencies."""
  root = tmp_path_factory.mktemp("venv") / "fresh"
  _run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=root.parent)
  python = root / "bin" / "python"
  # pip --python runs this environment's pip on the fresh interpreter (the venv has no pip).
  _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
        "--no-index", "--no-compile", "-q", str(wheel)], cwd=root.parent)
  site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
              cwd=root.parent).stdout.strip()
  deps = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
  (pathlib.Path(site) / "_test_environment_deps.pth").write_text("\n".join(deps) + "\n")
  return root


def test_repo_layout_keeps_top_level_configs():
  models = REPO / "configs" / "models"
  assert models.is_symlink() and not os.path.isabs(os.readlink(models))
  assert models.resolve() == (PACKAGE / "configs" / "models").resolve()
  assert (models / "t5_1_1_small.json").is_file()
  assert (REPO / "configs" / "demo" / "train.json").is_file()


def test_wheel_holds_configs_and_assets(wheel):
  with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    metadata = z.read("specdec_jax-0.1.0.dist-info/METADATA").decode()
    entry_points = z.read("specdec_jax-0.1.0.dist-info/entry_points.txt").decode()
  expected = _package_data()
  assert {"specdec_jax/configs/models/t5_1_1_tiny.json",
          "specdec_jax/assets/demo-de-en/spiece.model",
          "specdec_jax/assets/demo-de-en/target/params.safetensors",
          "specdec_jax/assets/demo-de-en/target/specdec_config.json",
          "specdec_jax/assets/demo-de-en/drafter/params.safetensors",
          "specdec_jax/assets/demo-de-en/drafter/specdec_config.json",
          "specdec_jax/kernels/skinny.cc", "specdec_jax/kernels/attention.cc",
          "specdec_jax/kernels/pool.h"} <= expected
  assert sorted(expected - names) == []
  assert "License-Expression: Apache-2.0" in metadata
  assert re.search(r"^specdec = specdec_jax\.[\w.]+:main$", entry_points, re.MULTILINE)


def test_wheel_install_loads_named_config_and_bundled_names(venv, tmp_path):
  script = (
      "import json, specdec_jax as sd\n"
      "from specdec_jax.io.checkpoints import bundled_names\n"
      "from specdec_jax.io.tokenizer import bundled_tokenizers\n"
      "model = sd.load('config:t5_1_1_tiny')\n"
      "print(json.dumps({'file': sd.__file__, 'vocab_size': model.config.vocab_size,\n"
      "                  'configs': sd.available_configs(), 'bundled': bundled_names(),\n"
      "                  'tokenizers': bundled_tokenizers()}))\n")
  out = json.loads(_run([str(venv / "bin" / "python"), "-c", script], cwd=tmp_path)
                   .stdout.strip().splitlines()[-1])
  assert pathlib.Path(out["file"]).resolve().is_relative_to(venv.resolve()), out["file"]
  assert out["vocab_size"] == 512
  assert out["configs"] == sorted(p.stem for p in (PACKAGE / "configs" / "models").glob("*.json"))
  assert out["bundled"] == ["demo-de-en/drafter", "demo-de-en/early-exit", "demo-de-en/target",
                            "demo-en-lm/drafter", "demo-en-lm/target"]
  assert out["tokenizers"] == ["demo-de-en", "demo-en-lm"]


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
  assert "speculative (drafter model, gamma 4)" in stats
  assert "acceptance rate" in stats and "alpha" in stats
