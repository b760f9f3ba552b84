"""Models and drafters from the names users type (the `specdec` command's, the lab's).

    load_model("runs/demo/target/final")                     # sd.load, float32
    load_model("config:t5_1_1_tiny", overrides={"num_heads": 2})   # random weights, noted
    resolve_drafter("prompt-lookup", target)                 # a PromptLookupDrafter
    resolve_drafter("ngram", target, ngram_rows=prompts)     # bigram tables fitted on rows
    resolve_drafter("config:t5_1_1_tiny_drafter", target, load=load_model)
    early_exit_layer("early-exit:2", target)                 # 2, checked against its depth
    fit_ngram("runs/demo/data", vocab_size)                  # BiLD/blockwise n-gram rescorer
    placed_method(choice, target, "DIR", drafter, load_model, mesh)   # the Run of a choice

A drafter name is a path or bundled name, "config:NAME", "ngram" or "prompt-lookup";
an object (a Model or any drafter) passes through. The result is checked against the
target's vocabulary; a Gemma 4 assistant's directory gives an `sd.GemmaAssistant` bound
to the target (checked by its `for_target`). A `MethodChoice` (a method value whose models
are still names, as `specdec_jax.flags.methods` reads them from the flags) becomes a `Run`
once the target is loaded (`build_method`, `placed_method`): each model field filled from
its name.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Callable, Sequence, cast

import numpy as np
from flax.traverse_util import unflatten_dict
from jax.sharding import Mesh

import specdec_jax as sd
from specdec_jax import drafters as drafters_lib
from specdec_jax import methods as core
from specdec_jax.drafters.lattice import NGramLM
from specdec_jax.errors import FileAccessError, InputError
from specdec_jax.runs import Run

#: Drafters named by kind rather than by a checkpoint.
DRAFTER_KINDS = ("ngram", "prompt-lookup")
#: "early-exit:K": the target itself read after K decoder layers (BiLD's small model).
EARLY_EXIT = "early-exit:"
DTYPES = ("float32", "bfloat16")
#: The flag of a method's drafter field (`carried(flag=)`): the model `--drafter` names.
DRAFTER = "--drafter"


def note(message: str) -> None:
  """One "specdec: note: ..." line on stderr."""
  print(f"specdec: note: {message}", file=sys.stderr)


def _config_model(name: str, overrides: dict[str, Any], dtype: str | None, mesh=None):
  # What sd.load("config:NAME", dtype, mesh=) does: params AND activations in `dtype`,
  # drawn straight in it (a T5-XXL in bfloat16 never exists in float32), and on a mesh
  # straight into each parameter's shards (never whole on one device).
  config = sd.get_config(name, **overrides)
  shardings = None
  if mesh is not None:
    shardings = unflatten_dict({tuple(k.split("/")): v for k, v in
                                sd.sharding.config_shardings(config, mesh).items()})
  model = sd.init_model(config, 0, dtype, shardings=shardings)
  if mesh is not None:   # its activations constrained by the same rules (sd.sharding)
    model = model.replace(partitioner=sd.sharding.partitioner(mesh))
  return sd.pack(model)   # the kernels "auto" picks, as sd.load packs


def load_model(spec: str, dtype: str | None = "float32", what: str = "model",
               overrides: dict[str, Any] | None = None, mesh=None) -> sd.Model:
  """`sd.load` plus a note for random weights; "config:NAME" may take architecture
  `overrides`. dtype: the compute dtype (params and activations), as in `sd.load`; None
  keeps the stored dtype (config:NAME models: float32). mesh: a `jax.sharding.Mesh`:
  every parameter loaded (or initialised) straight into its `RULES_1D` shards
  (`sd.load(..., mesh=)`), the values those of `sd.shard(load_model(...), mesh)`."""
  if spec.startswith("config:"):   # built anew each time: jit's cache makes a repeat cheap
    model = _config_model(spec[len("config:"):], overrides or {}, dtype, mesh)
    extra = f" with overrides {overrides}" if overrides else ""
    note(f"{what} {spec}{extra} has RANDOM weights (seed 0): outputs are meaningless "
         "apart from speed")
    return model
  if overrides:
    raise InputError(f"{what} overrides only apply to config:NAME models, not {spec!r}")
  return sd.load(spec, dtype=dtype, mesh=mesh)


def resolve_drafter(spec, target: sd.Model, *,
                    ngram_rows: Sequence | Callable[[], Sequence] | None = None,
                    load: Callable[[str], Any] | None = None):
  """A drafter for `target` (vocabulary checked), or None for `spec` None.

  Args:
    spec: None, a Model or drafter object, "ngram", "prompt-lookup", or (with `load`) a
      model path / name.
    ngram_rows: token rows (0-padded) the "ngram" bigram tables are fitted on, or a
      function returning them (called only for "ngram").
    load: `name -> Model` for the other names (e.g. `load_model`); without it they are
      an error.
  """
  if spec is None:
    return None
  vocab = target.config.vocab_size
  drafter = spec
  if spec == "prompt-lookup":
    drafter = sd.PromptLookupDrafter(vocab_size=vocab)
  elif spec == "ngram":
    rows = ngram_rows() if callable(ngram_rows) else ngram_rows
    if rows is None:
      raise InputError("drafter 'ngram' needs token rows to fit its tables on")
    drafter = sd.NGramDrafter.fit([r[r > 0] for r in np.asarray(rows)], vocab_size=vocab)
  elif isinstance(spec, str):
    if load is None:
      raise InputError(f"drafter must be a Model, a drafter object or one of "
                        f"{DRAFTER_KINDS}, got {spec!r}")
    drafter = load(spec)
  if callable(getattr(drafter, "for_target", None)):   # a proposer that reads the target
    return drafter.for_target(target)                  # (sd.GemmaAssistant), checked
  return drafters_lib.as_drafter(drafter, target)


def drafter_loader(dtype: str | None) -> Callable[[str], sd.Model]:
  """`load` for `resolve_drafter`: `load_model(name, dtype, what="drafter")`."""
  return lambda name: load_model(name, dtype, what="drafter")


def fit_ngram(data_dir: str, vocab_size: int) -> NGramLM:
  """The bigram LM of a prepared data dir's train targets (`DATA/train.npz`, written by the
  lab's `specdec train --stages data`): blockwise n-gram rescoring."""
  path = os.path.join(data_dir, "train.npz")
  try:
    with np.load(path) as arrays:
      targets = arrays["targets"]
  except OSError as e:
    raise FileAccessError(f"--rescorer {data_dir!r}: cannot read {path!r}: "
                          f"{e.strerror or e}") from None
  except (KeyError, ValueError) as e:
    raise InputError(f"--rescorer {data_dir!r}: {path!r} is not a prepared split: {e}") from None
  return NGramLM.fit([r[r > 0] for r in targets], vocab_size=vocab_size)


def early_exit_layer(spec: str, target: sd.Model) -> int:
  """K of "early-exit:K", checked against the target's decoder depth."""
  text = spec[len(EARLY_EXIT):]
  layers = target.config.num_decoder_layers
  if layers < 2:
    raise InputError(f"{spec!r}: early exit needs a target with at least 2 decoder layers, "
                   f"this one has {layers}")
  if not text.isdigit() or not 1 <= int(text) < layers:
    raise InputError(f"{spec!r}: K must be an integer in [1, {layers - 1}] for a target with "
                   f"{layers} decoder layers")
  return int(text)


@dataclasses.dataclass(frozen=True)
class MethodChoice:
  """The decoding method the flags ask for, before any model is loaded.

  Attributes:
    value: the core method value (`sd.Speculative(None, gamma=4)`, ...): its settings set
      and checked, its models None.
    sampling: `sd.Greedy()` or `sd.Sampling(...)`.
    drafter: --drafter: a model path/name, "ngram", "prompt-lookup" or "early-exit:K".
    models: {flag: value} of the method's other model flags given (`--heads`, `--rescorer`).
  """

  value: core.Method
  sampling: Any
  drafter: str | None = None
  models: tuple[tuple[str, str], ...] = ()

  @property
  def name(self) -> str:
    """The --method name (the value's `name`)."""
    return self.value.name

  @property
  def early_exit(self) -> bool:
    """BiLD's small model is the target itself, read after K layers."""
    return self.drafter is not None and self.drafter.startswith(EARLY_EXIT)


def build_method(choice: MethodChoice, target: sd.Model, model: str, drafter: Any,
                 load: Callable[[str], sd.Model]) -> Run:
  """The run of `choice` on the loaded `target` (named `model`: blockwise reads its saved
  heads); `drafter` is the resolved --drafter (None for early-exit:K), `load` reads a
  model path/name (a neural rescorer). Each model field is filled from its flag."""
  value, given = choice.value, dict(choice.models)
  if choice.early_exit and choice.drafter is not None:
    drafter = sd.early_exit(target, early_exit_layer(choice.drafter, target))
  models: dict[str, Any] = {}
  label = choice.drafter
  for f in core.model_fields(type(value)):
    flag = f.metadata.get("flag")
    if flag == DRAFTER:
      models[f.name] = drafter
    elif flag == "--heads":
      label = given.get(flag) or model
      models[f.name] = sd.load_heads(label, target)
    elif flag == "--rescorer" and flag in given:
      rescoring = getattr(value, "rescoring", None)
      models[f.name] = (load(given[flag]) if rescoring == "neural"
                        else fit_ngram(given[flag], target.config.vocab_size))
  built = dataclasses.replace(cast(Any, value), **models)   # a flax.struct dataclass
  return Run(built, choice.sampling, label=label)


def placed_method(choice: MethodChoice, target: sd.Model, model: str, drafter: Any,
                  load: Callable[[str], sd.Model], mesh: Mesh | None) -> Run:
  """`build_method` placed on `mesh` (`Run.on`; None: as it is); an early-exit small model
  is the sharded target itself, left as it is."""
  return build_method(choice, target, model, drafter, load).on(
      mesh, keep=("small",) if choice.early_exit else ())
