"""Bundled names in the asset distributions (packages/specdec-jax-demo-small,
packages/specdec-jax-demo): resolved when installed, a clear error naming the pip command
when not; and the larger pair's wheel, built with tiny stand-in models, ships them where the
names resolve. (The small distribution's real wheel: tests/test_packaging.py.)"""

from __future__ import annotations

import importlib.resources
import pathlib
import shutil
import subprocess
import sys
import zipfile

import jax
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import package_data
from specdec_jax.errors import CheckpointError, TokenizerError
from specdec_jax.io.tokenizer import load_tokenizer

REPO = pathlib.Path(__file__).resolve().parents[1]
DEMO_PACKAGE = REPO / "packages" / "specdec-jax-demo"
SMALL_PACKAGE = REPO / "packages" / "specdec-jax-demo-small"
SPIECE = SMALL_PACKAGE / "specdec_jax_demo_small" / "assets" / "demo-de-en" / "spiece.model"


def tiny_model(seed=0):
  return sd.init_model(sd.get_config("t5_1_1_tiny").replace(vocab_size=8000), seed)


def write_group(assets: pathlib.Path, group: str, model) -> None:
  """assets/<group>/{target, spiece.model}, as the bundle stage writes them."""
  sd.save(assets / group / "target", model, dtype="bfloat16")
  shutil.copy(SPIECE, assets / group / "spiece.model")


def same_params(a, b) -> bool:
  return all(np.array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
             for x, y in zip(jax.tree_util.tree_leaves(a.params),
                             jax.tree_util.tree_leaves(b.params), strict=True))


@pytest.mark.slow
def test_installed_group_resolves_to_its_package(tmp_path, monkeypatch):
  site = tmp_path / "site"
  (site / "fake_demo").mkdir(parents=True)
  (site / "fake_demo" / "__init__.py").write_text("")
  model = tiny_model()
  write_group(site / "fake_demo" / "assets", "tiny-large", model)
  monkeypatch.setitem(package_data.SEPARATE, "tiny-large",
                      ("fake_demo", "fake-demo", "packages/fake-demo"))
  monkeypatch.syspath_prepend(str(site))

  loaded = sd.load("tiny-large/target", dtype=None)
  assert same_params(loaded, model.with_dtype("bfloat16"))
  assert load_tokenizer("tiny-large").vocab_size == load_tokenizer("demo-de-en").vocab_size
  assert "tiny-large" in package_data.separate_groups()   # (beside specdec-jax-demo's own)
  assert package_data.assets("tiny-large/target") == site / "fake_demo" / "assets"
  assert package_data.assets("demo-de-en/target") == (               # specdec-jax-demo-small's
      importlib.resources.files("specdec_jax_demo_small") / "assets")
  assert package_data.assets("no-such-group/target") is None
  with pytest.raises(CheckpointError, match="bundled names under .*: tiny-large/target"):
    sd.load("tiny-large/drafter")                       # the group's own names are listed


@pytest.mark.slow
def test_missing_package_names_the_pip_command(monkeypatch):
  monkeypatch.setitem(package_data.SEPARATE, "tiny-large",
                      ("no_such_demo_package", "fake-demo", "packages/fake-demo"))
  message = r"separate package fake-demo.*pip install fake-demo .*pip install \./packages/fake-demo"
  with pytest.raises(CheckpointError, match=message):   # not a Hugging Face Hub download
    sd.load("tiny-large/target")
  with pytest.raises(TokenizerError, match=message):
    load_tokenizer("tiny-large")
  with pytest.raises(CheckpointError, match=message):
    sd.load_heads("tiny-large/target", tiny_model())
  assert "tiny-large" not in package_data.separate_groups()


@pytest.mark.parametrize("group", sorted(package_data.SEPARATE))
def test_each_group_names_its_distribution(group, monkeypatch):
  """Every demo group (the library ships none) maps to a distribution of this repository
  whose pyproject has that pip name; with the distribution missing, a name in the group
  raises MissingAssets with its pip commands, for models and tokenizers alike."""
  module, pip_name, source = package_data.SEPARATE[group]
  pyproject = (REPO / source / "pyproject.toml").read_text()
  assert f'name = "{pip_name}"' in pyproject and f'packages = ["{module}"]' in pyproject
  monkeypatch.setitem(package_data.SEPARATE, group, ("no_such_demo_package", pip_name, source))
  message = rf"pip install {pip_name} .*pip install \./{source}\)"
  with pytest.raises(package_data.MissingAssets, match=message):
    sd.load(f"{group}/target")
  with pytest.raises(package_data.MissingAssets, match=message):
    load_tokenizer(group)
  assert group not in package_data.separate_groups()


def test_demo_large_names_need_specdec_jax_demo():
  if "demo-de-en-large" in package_data.separate_groups():
    pytest.skip("specdec-jax-demo is installed here")
  with pytest.raises(package_data.MissingAssets,
                     match=r"pip install specdec-jax-demo .*pip install \./packages/"
                           r"specdec-jax-demo\)"):
    sd.load("demo-de-en-large/target")
  assert (REPO / package_data.SEPARATE["demo-de-en-large"][2] / "pyproject.toml").is_file()


@pytest.mark.slow
def test_demo_package_wheel_ships_its_assets(tmp_path):
  """packages/specdec-jax-demo built as a wheel (stand-in models): the assets are inside,
  it depends on specdec-jax, and unpacked, its checkpoint loads (name resolution of an
  installed group: test_installed_group_resolves_to_its_package)."""
  source = shutil.copytree(DEMO_PACKAGE, tmp_path / "src", ignore=shutil.ignore_patterns(
      "*.egg-info", "build", "__pycache__", "assets"))
  model = tiny_model(3)
  write_group(source / "specdec_jax_demo" / "assets", "demo-de-en-large", model)
  proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                         "--no-build-isolation", "--no-index", "-q", "-w",
                         str(tmp_path / "dist"), "."], cwd=source, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (wheel,) = (tmp_path / "dist").glob("specdec_jax_demo-*.whl")
  with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    z.extractall(tmp_path / "site")
    metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
  group = "specdec_jax_demo/assets/demo-de-en-large/"
  assert {group + "target/params.safetensors", group + "target/specdec_config.json",
          group + "spiece.model"} <= names
  assert "Requires-Dist: specdec-jax>=0.1.0" in metadata
  assert same_params(sd.load(str(tmp_path / "site" / group / "target"), dtype=None),
                     model.with_dtype("bfloat16"))
