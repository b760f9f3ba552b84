"""`specdec train`: the demo training pipeline of a recipe JSON."""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import time
from typing import Any, Sequence

from specdec_jax.flags import FlagError
from specdec_jax.io.reports import read_json
from specdec_jax.io.streams import emit
from specdec_jax_lab import demo, training
from specdec_jax_lab.data import prepare
from specdec_jax_lab.errors import TrainingError


def parse_stages(text: str | None) -> tuple[str, ...] | None:
  """--stages: "all" (None: the recipe's stages, `demo.recipe_stages`) or a comma-separated
  subset of demo.STAGES, kept in pipeline order."""
  if text is None or text.strip() == "all":
    return None
  names = [t.strip() for t in text.split(",") if t.strip()]
  unknown = [n for n in names if n not in demo.STAGES]
  if unknown or not names:
    raise FlagError(f"unknown stage(s) {', '.join(map(repr, unknown)) or repr(text)}; "
                   f"stages: {', '.join(demo.STAGES)} or all")
  return tuple(n for n in demo.STAGES if n in names)


def read_recipe(path: str, stages: Sequence[str]) -> dict[str, Any]:
  """The recipe JSON, checked to hold a section for every requested stage."""
  recipe = read_json(path, "recipe")
  if not isinstance(recipe, dict):
    raise FlagError(f"recipe {path!r} must hold a JSON object")
  needed = [s for s in stages if s != "bundle"]
  if "distilled" in stages or ("aligned" in stages
                               and "init" not in (recipe.get("aligned") or {})):
    needed += ["drafter"]   # their starting point and its architecture
  missing = sorted({s for s in needed if not isinstance(recipe.get(s), dict)})
  if missing:
    raise FlagError(f"recipe {path!r} has no section for stage(s) {', '.join(missing)}")
  for name in demo.NEEDS_INIT:
    if name in needed and not isinstance(recipe[name].get("init"), str):
      raise FlagError(f"recipe {path!r}: section {name!r} needs an \"init\" (the model it "
                     "starts from, e.g. \"demo-de-en/drafter\")")
  bundle = recipe.get("bundle", {})
  if "bundle" in stages and not isinstance(bundle, dict):
    raise FlagError(f"recipe {path!r}: section 'bundle' must be a JSON object")
  if "bundle" in stages and set(bundle) - demo.BUNDLE_KEYS:
    raise FlagError(f"recipe {path!r}, section 'bundle': unknown key(s) "
                   f"{', '.join(sorted(set(bundle) - demo.BUNDLE_KEYS))}; "
                   f"known: {', '.join(sorted(demo.BUNDLE_KEYS))}")
  for name in ("target", "drafter"):
    if name in needed and "config" not in recipe[name]:
      raise FlagError(f"recipe {path!r}: section {name!r} needs a \"config\" (model config JSON)")
  _check_recipe_arguments(path, recipe, needed)
  return recipe


def _check_recipe_arguments(path: str, recipe: dict[str, Any], sections: Sequence[str]) -> None:
  """Settings the pipeline would only reject mid-run: unknown prepare_de_en arguments,
  invalid TrainConfig values."""
  fields = {f.name for f in dataclasses.fields(training.TrainConfig)}
  for name in sections:
    if name == "data":
      try:
        inspect.signature(prepare.prepare_de_en).bind("out_dir", **recipe["data"])
      except TypeError as e:
        raise FlagError(f"recipe {path!r}, section 'data': {e}") from None
      continue
    own = demo.STAGE_KEYS.get(name, set())
    unknown = sorted(set(recipe[name]) - fields - own)
    if unknown:     # a typo must not silently train with the default
      raise FlagError(f"recipe {path!r}, section {name!r}: unknown key(s) {', '.join(unknown)}; "
                     f"known: {', '.join(sorted(own | fields))}")
    try:
      training.TrainConfig(**{k: v for k, v in recipe[name].items() if k in fields})
    except (TypeError, TrainingError) as e:   # the section's name makes the message useful
      raise FlagError(f"recipe {path!r}, section {name!r}: {e}") from None


def run(args) -> int:
  stages = parse_stages("heads" if args.heads and args.stages is None else args.stages)
  if stages is None:
    raw = read_json(args.recipe, "recipe")
    if not isinstance(raw, dict):
      raise FlagError(f"recipe {args.recipe!r} must hold a JSON object")
    stages = demo.recipe_stages(raw)
  recipe_path = args.recipe
  recipe = read_recipe(recipe_path, stages)
  if args.heads is not None:
    if args.heads < 2:
      raise FlagError(f"--heads must be >= 2 (head 1 is the model itself), got {args.heads}")
    if "heads" not in stages:
      raise FlagError("--heads sets the heads stage's number of heads: add 'heads' to --stages")
    recipe["heads"]["num_heads"] = args.heads
    recipe_path = _write_recipe(args.workdir, recipe)
  data_ready = os.path.isfile(os.path.join(args.workdir, "data", "meta.json"))
  if "data" not in stages and not data_ready:   # every stage reads the train split
    raise FlagError(f"{os.path.join(args.workdir, 'data')!r} holds no prepared data: "
                   "add the 'data' stage")
  start = time.perf_counter()
  results = demo.run_pipeline(recipe_path, args.workdir, stages=stages)
  for name, result in results.items():
    size = (f"{result.num_params():,} parameters" if hasattr(result, "num_params")
            else f"{result.num_heads} heads")
    emit(f"{name}: {os.path.join(args.workdir, name, 'final')} ({size})")
  if "bundle" in stages:
    section = recipe.get("bundle") or {}
    emit(f"bundle: {demo.REPO / section['assets'] if 'assets' in section else demo.ASSETS}")
  print(f"specdec train: stages {', '.join(stages)} done in {time.perf_counter() - start:.1f} s",
        file=sys.stderr)
  return 0


def _write_recipe(workdir: str, recipe: dict[str, Any]) -> str:
  """The recipe as run (with --heads applied), written beside the stages it drives."""
  from specdec_jax.io.reports import write_json
  path = os.path.join(workdir, "recipe.json")
  write_json(path, recipe)
  return path


def add(subparsers) -> None:
  p = subparsers.add_parser(
      "train", help="run the demo training pipeline (data, target, drafters, bundle)",
      description="Run the De->En demo pipeline of a recipe JSON: 'data' prepares the "
      "dictionary (the recipe's \"data\" section is passed to prepare_de_en), 'target' and "
      "'drafter' train from scratch, 'aligned' / 'distilled' fine-tune the drafter on the "
      "target's greedy outputs / softmax ('aligned', 'aligned_small', 'aligned_mid' start "
      "from their section's \"init\" model when it names one, e.g. demo-de-en/target), "
      "'bundle' ships target + aligned drafter into specdec-jax-demo-small's assets (or "
      "what the "
      "recipe's \"bundle\" section names). Finished stages are skipped and interrupted ones "
      "resume from their "
      "Orbax checkpoints; raising a stage's steps continues it from its last checkpoint, and "
      "a retrained target or drafter makes aligned / distilled start over.")
  p.add_argument("--recipe", required=True, metavar="JSON",
                 help="recipe file, e.g. configs/demo/train.json (model \"config\" paths are "
                 "relative to the repository root, or absolute)")
  p.add_argument("--workdir", required=True, metavar="DIR", help="where every stage writes")
  p.add_argument("--stages", default=None, metavar="LIST",
                 help="comma-separated subset of " + ",".join(demo.STAGES) + ", or all "
                 "(default: all = data, every stage the recipe has a section for, bundle; "
                 "only heads with --heads)")
  p.add_argument("--heads", type=int, default=None, metavar="H",
                 help="train H prediction heads (head 1 is the target itself) for the "
                 "pipeline's target, frozen, on its own greedy outputs; progress bar, resumes "
                 "from its checkpoints (the recipe's \"heads\" section sets the rest)")
  p.set_defaults(func=run)
