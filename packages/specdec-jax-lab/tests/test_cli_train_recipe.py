"""`specdec train --heads N` writes the recipe it runs beside the stages (a missing writer
made it fail with an ImportError before any stage ran)."""

from __future__ import annotations

import json

import pytest

from specdec_jax_lab.commands import train

pytestmark = pytest.mark.unit


def test_write_recipe_writes_the_recipe_as_run(tmp_path):
  recipe = {"heads": {"num_heads": 3, "steps": 10}, "target": {"steps": 5}}
  path = train._write_recipe(str(tmp_path / "work"), recipe)
  assert path == str(tmp_path / "work" / "recipe.json")
  assert json.loads((tmp_path / "work" / "recipe.json").read_text()) == recipe
