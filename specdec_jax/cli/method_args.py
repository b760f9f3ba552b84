"""The decoding method of `specdec decode` / `specdec eval`, from flags, built once.

    --method autoregressive        the target alone (default without --drafter)
    --method speculative           --drafter proposes, the target verifies (default with
                                   --drafter): --gamma, --adaptive-gamma, --lenience
    --method bild                  BiLD: --drafter is the small model, or early-exit:K
                                   (the target read after K decoder layers)
    --method blockwise             prediction heads (--heads, default: those saved with
                                   --model), --lattice-k, --num-drafts, --rescoring
    --method beam                  T5X's beam search: --num-beams, --alpha (greedy only)
    --sampling greedy|sample       how every method picks tokens (default: greedy, or
                                   sample if --temperature / --top-k / --top-p is given)

The algorithm (`--method`) and the sampling mode (`--sampling`) are separate choices: any
method greedy or sampled.

The flags stop here: `method_from_args` checks them and returns a `MethodChoice` (the core
method value with its settings, its models still None, the sampling, and the names of the
models to load); `build_method` turns that into the tools method once the target is loaded.

The flags of every method's settings are derived from the core method values
(`sd.Speculative`, `sd.BiLD`, `sd.Blockwise`; `CORE`): one flag per setting, named after
the field (`--fallback-threshold`), typed and defaulted by it, its help taken from the
class's "Attributes:" docs (or `CLI_HELP`, where those read badly on a command line), its
value checked by the class itself before any model is loaded. `FLAG_NAMES` renames those
that would clash or read badly (`--lattice-k`: the lattice's top_k, beside sampling's
`--top-k`; `--adaptive-gamma`). A flag of another method than the chosen one is an error
naming the method it belongs to. The models
(`--drafter`, `--heads`, `--rescorer`) are paths, read here.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from typing import Any, Callable

import numpy as np
from jax.sharding import Mesh

import specdec_jax as sd
from specdec_jax import methods as core
from specdec_jax.cli.mesh_args import place_method
from specdec_jax.cli.models import DRAFTER_KINDS
from specdec_jax.cli.options import MODES, make_sampling
from specdec_jax.drafters.lattice import NGramLM
from specdec_jax.errors import CLIError, FileAccessError, InputError
from specdec_jax.runs import (
  Baseline,
  Beam,
  Bild,
  Blockwise,
  DecodeMethod,
  Speculative,
)

#: --method: the core method type of each algorithm, in `--help` order.
CORE = {"autoregressive": core.Autoregressive, "speculative": core.Speculative,
        "bild": core.BiLD, "blockwise": core.Blockwise, "beam": core.Beam}
METHOD_NAMES = tuple(CORE)
EARLY_EXIT = "early-exit:"

#: Flag names that differ from their field's: (core method type, field) -> flag.
FLAG_NAMES = {(core.Blockwise, "top_k"): "--lattice-k",
              (core.Speculative, "adaptive"): "--adaptive-gamma"}
#: Help texts written for the command line where the field's docstring reads badly there
#: (it names Python values or other modules): (core method type, field) -> help.
CLI_HELP = {
    (core.Speculative, "gamma"): "tokens drafted per round (with --adaptive-gamma: the most)",
    (core.Speculative, "adaptive"): "choose each row's gamma in 1..--gamma on device, from "
                                    "its acceptance so far",
    (core.Speculative, "lenience"): "1: exact; below 1: Leviathan et al.'s lenient "
                                    "acceptance (lossy)",
    (core.BiLD, "batch_policy"): "wait: each row decodes as if alone; sync: the first row "
                                 "to hand over ends every row's drafting (fewer small calls)",
    (core.Blockwise, "rescoring"): "rescore the lattice's paths with a bigram LM (ngram) or "
                                   "a small model (neural), given by --rescorer",
}
#: Flags of a method's models beside its settings (paths, read by `build_method`).
MODEL_FLAGS = {"blockwise": ("heads", "rescorer")}

_SCALARS = {"bool": bool, "int": int, "float": float, "str": str}


def _flag(core_type: type, name: str) -> str:
  """--name, or its `FLAG_NAMES` entry (a subclass's fields keep their base's flags)."""
  renamed = [FLAG_NAMES[(cls, name)] for cls in core_type.__mro__ if (cls, name) in FLAG_NAMES]
  return renamed[0] if renamed else "--" + name.replace("_", "-")


def setting_flags(core_type: type) -> list[tuple[str, dataclasses.Field]]:
  """(flag, field) of every setting of a core method type (`exact` is the tools' own)."""
  return [(_flag(core_type, f.name), f) for f in core.settings_fields(core_type)
          if f.name != "exact"]


def _dest(flag: str) -> str:
  return flag[2:].replace("-", "_")


def _value_type(f: dataclasses.Field) -> type:
  """The command-line type of a setting: its default's, or (default None) the first
  scalar of its annotation ("AdaptiveGamma | bool | None" -> bool)."""
  if f.default is not None:
    return type(f.default)
  annotation = f.type if isinstance(f.type, str) else str(f.type)
  for name in re.findall(r"[A-Za-z_]+", annotation):
    if name in _SCALARS:
      return _SCALARS[name]
  raise TypeError(f"setting {f.name}: no command-line type in its annotation {f.type!r}")


def add_setting_flags(group, core_type: type, skip: frozenset[str] = frozenset()) -> None:
  """One flag per setting of `core_type`: type, choices and help from the field (its
  docstring, or `CLI_HELP`); a bool setting is a switch. Flags whose dest is in `skip` are
  left out (already added)."""
  docs = core.field_docs(core_type)
  for flag, f in setting_flags(core_type):
    if _dest(flag) in skip:
      continue
    kind = _value_type(f)
    help = next((CLI_HELP[(cls, f.name)] for cls in core_type.__mro__
                 if (cls, f.name) in CLI_HELP), None) or docs.get(f.name, f.name).rstrip(".")
    if kind is not bool and f.default is not None:
      help += f" (default {f.default})"
    help = help.replace("%", "%%")
    choices = f.metadata.get("choices")
    if kind is bool:
      group.add_argument(flag, action="store_true", help=help)
    elif choices:
      group.add_argument(flag, choices=[c for c in choices if c is not None], help=help)
    else:
      group.add_argument(flag, type=kind, help=help)


def settings_from_args(args, core_type: type) -> dict[str, Any]:
  """{field: value} of the settings given on the command line (the rest keep the core's
  defaults)."""
  out = {}
  for flag, f in setting_flags(core_type):
    value = getattr(args, _dest(flag), None)
    if value is not None and value is not False:
      out[f.name] = value
  return out


def method_flags(method: str) -> tuple[str, ...]:
  """The dests of the flags that belong to `method` (its models' and its settings')."""
  return MODEL_FLAGS.get(method, ()) + tuple(_dest(flag) for flag, _ in
                                             setting_flags(CORE[method]))


def _method_name(text: str) -> str:
  """argparse type of --method: a sampling mode there gets a pointer to --sampling."""
  if text in MODES:
    raise argparse.ArgumentTypeError(
        f"{text!r} is a sampling mode: use --sampling {text} (--method is the algorithm: "
        f"{', '.join(METHOD_NAMES)})")
  return text


_GROUPS = {
    "speculative": "speculative decoding (--method speculative, the default with --drafter)",
    "bild": "BiLD (--method bild; the small model: --drafter)",
    "blockwise": "blockwise parallel decoding (--method blockwise)",
    "beam": "beam search, T5X's beam_search (--method beam)",
}


def add_method_flags(p: argparse.ArgumentParser) -> None:
  """--method, --sampling and the sampling options, then each method's flags."""
  p.add_argument("--method", type=_method_name, choices=METHOD_NAMES,
                 help="the algorithm (default: speculative with --drafter, else "
                 "autoregressive); bild: --drafter is the small model; blockwise: prediction "
                 "heads")
  p.add_argument("--sampling", choices=MODES,
                 help="greedy (argmax) or sample (default: greedy, or sample if --temperature, "
                 "--top-k or --top-p is given)")
  p.add_argument("--temperature", type=float, help="sampling temperature (>= 0; default 1)")
  p.add_argument("--top-k", type=int, help="keep the k most likely tokens (0 = off)")
  p.add_argument("--top-p", type=float, help="nucleus mass in (0, 1] (1 = off)")
  added: set[str] = set()
  for name, title in _GROUPS.items():
    group = p.add_argument_group(title)
    if name == "blockwise":
      group.add_argument("--heads", metavar="PATH",
                         help="heads file or model dir (default: the heads saved with --model)")
      group.add_argument("--rescorer", metavar="PATH",
                         help="neural: a small model path/name; ngram: a prepared data dir "
                         "whose train targets fit the bigram LM ('data' in specdec eval: "
                         "--data)")
    add_setting_flags(group, CORE[name], skip=frozenset(added))
    added.update(method_flags(name))


def _given(args, names) -> list[str]:
  return ["--" + n.replace("_", "-") for n in names
          if getattr(args, n, None) is not None and getattr(args, n) is not False]


def _owner(dest: str) -> str:
  return next(m for m in METHOD_NAMES if dest in method_flags(m))


def resolve_method(args) -> str:
  """The --method value, or its default: speculative with --drafter, else autoregressive."""
  if args.method is not None:
    return args.method
  return "autoregressive" if args.drafter is None else "speculative"


def _check_settings(args, method: str) -> core.Method:
  """The core value of the given settings, its models None: the core class's own checks
  (no model needed), its message naming the flag instead of the field."""
  core_type = CORE[method]
  settings = settings_from_args(args, core_type)
  models: dict[str, Any] = {f.name: None for f in core.model_fields(core_type)}
  if method == "blockwise" and args.rescoring is not None:
    models["rescorer"] = args.rescorer   # its name until loaded (checked given above)
  try:
    return core_type(**models, **settings)
  except InputError as e:
    message = str(e)
    for flag, f in setting_flags(core_type):
      message = re.sub(rf"^{f.name}\b", flag, message)
    raise CLIError(message) from None


def check_method_flags(args) -> core.Method:
  """The core value of the flags (its models None); flags that do not apply to the method
  and settings the core would reject are errors (before any model is loaded)."""
  method = resolve_method(args)
  own = set(method_flags(method))
  others = [d for m in METHOD_NAMES if m != method for d in method_flags(m) if d not in own]
  bad = _given(args, others)
  if bad:
    owners = sorted({_owner(_dest(flag)) for flag in bad}, key=METHOD_NAMES.index)
    verb = "applies" if len(bad) == 1 else "apply"
    hint = ": add --drafter" if owners == ["speculative"] and method == "autoregressive" else ""
    raise CLIError(f"{', '.join(bad)} only {verb} to --method {' / '.join(owners)}, not "
                   f"--method {method}{hint}")
  drafter = args.drafter
  if drafter is not None and drafter.startswith(EARLY_EXIT) and method != "bild":
    raise CLIError(f"--drafter {drafter} is BiLD's early-exit small model: add --method bild")
  if method == "speculative" and drafter is None:
    raise CLIError("--method speculative needs a drafter: --drafter PATH_OR_NAME, ngram or "
                   "prompt-lookup")
  if method == "bild" and drafter is None:
    raise CLIError("--method bild needs the small model: --drafter PATH or early-exit:K")
  if method == "blockwise" and drafter is not None:
    raise CLIError("--method blockwise drafts with prediction heads: drop --drafter")
  if method == "beam" and drafter is not None:
    raise CLIError("--method beam searches with the target alone: drop --drafter")
  if method == "autoregressive" and drafter is not None:
    raise CLIError("--method autoregressive decodes with the target alone: drop --drafter")
  if method == "beam" and (args.sampling == "sample" or _given(
      args, ("temperature", "top_k", "top_p"))):
    raise CLIError("--method beam is deterministic (T5X's beam search): drop --sampling "
                   "sample, --temperature, --top-k and --top-p")
  if method == "blockwise":
    if args.rescoring is None and args.rescorer is not None:
      raise CLIError("--rescorer needs --rescoring ngram|neural")
    if args.rescoring is not None and args.rescorer is None:
      raise CLIError(f"--rescoring {args.rescoring} needs --rescorer")
  return _check_settings(args, method)


@dataclasses.dataclass(frozen=True)
class MethodChoice:
  """The decoding method the flags ask for, before any model is loaded.

  Attributes:
    value: the core method value (`sd.Speculative(None, gamma=4)`, ...): its settings set
      and checked, its models None (a rescorer: its --rescorer name).
    sampling: `sd.Greedy()` or `sd.Sampling(...)`.
    drafter: --drafter: a model path/name, "ngram", "prompt-lookup" or "early-exit:K".
    heads: --heads (blockwise; None: the heads saved with the target).
    rescorer: --rescorer (blockwise): a model path/name (neural) or a data dir (ngram).
  """

  value: core.Method
  sampling: Any
  drafter: str | None = None
  heads: str | None = None
  rescorer: str | None = None

  @property
  def name(self) -> str:
    """The --method name ("autoregressive", "speculative", "bild", "blockwise")."""
    return next(name for name, t in CORE.items() if type(self.value) is t)

  @property
  def early_exit(self) -> bool:
    """BiLD's small model is the target itself, read after K layers."""
    return self.drafter is not None and self.drafter.startswith(EARLY_EXIT)

  def settings(self) -> dict[str, Any]:
    """{field: value} of the method's settings (`setting_flags`' fields)."""
    return {f.name: getattr(self.value, f.name) for _, f in setting_flags(type(self.value))}


def method_from_args(args) -> MethodChoice:
  """The `MethodChoice` of the flags (`check_method_flags`, `sampling_from_method_args`):
  where the method's flags leave argparse."""
  value = check_method_flags(args)
  blockwise = isinstance(value, core.Blockwise)
  return MethodChoice(value=value, sampling=sampling_from_method_args(args),
                      drafter=args.drafter, heads=args.heads if blockwise else None,
                      rescorer=args.rescorer if blockwise else None)


def sampling_from_method_args(args):
  """sd.Greedy() / sd.Sampling(...) from --sampling and the sampling options."""
  if args.sampling == "greedy":
    given = _given(args, ("temperature", "top_k", "top_p"))
    if given:
      raise CLIError(f"{', '.join(given)} only apply with --sampling sample")
  return make_sampling(args.sampling, args.temperature, args.top_k, args.top_p)


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
    raise CLIError(f"--rescorer {data_dir!r}: {path!r} is not a prepared split: {e}") from None
  return NGramLM.fit([r[r > 0] for r in targets], vocab_size=vocab_size)


def early_exit_layer(spec: str, target: sd.Model) -> int:
  """K of "early-exit:K", checked against the target's decoder depth."""
  text = spec[len(EARLY_EXIT):]
  layers = target.config.num_decoder_layers
  if layers < 2:
    raise CLIError(f"{spec!r}: early exit needs a target with at least 2 decoder layers, "
                   f"this one has {layers}")
  if not text.isdigit() or not 1 <= int(text) < layers:
    raise CLIError(f"{spec!r}: K must be an integer in [1, {layers - 1}] for a target with "
                   f"{layers} decoder layers")
  return int(text)


def build_method(choice: MethodChoice, target: sd.Model, model: str, drafter: Any,
                 load: Callable[[str], sd.Model]) -> DecodeMethod:
  """The tools method of `choice` on the loaded `target` (named `model`: blockwise reads
  its saved heads); `drafter` is the resolved --drafter (None for early-exit:K and
  blockwise), `load` reads a model path/name (a neural rescorer)."""
  settings, sampling = choice.settings(), choice.sampling
  if choice.name == "autoregressive":
    return Baseline(sampling=sampling)
  if choice.name == "beam":
    return Beam(**settings)
  if choice.name == "bild":
    small = drafter
    if choice.drafter is not None and choice.early_exit:
      small = sd.early_exit(target, early_exit_layer(choice.drafter, target))
    return Bild(sampling=sampling, small=small, small_name=choice.drafter, **settings)
  if isinstance(choice.value, core.Blockwise):
    heads = sd.load_heads(choice.heads or model, target)
    rescorer: sd.Model | NGramLM | None = None
    if choice.value.rescoring is not None and choice.rescorer is None:
      raise CLIError(f"--rescoring {choice.value.rescoring} needs --rescorer")
    if choice.value.rescoring == "neural" and choice.rescorer is not None:
      rescorer = load(choice.rescorer)
    elif choice.value.rescoring == "ngram" and choice.rescorer is not None:
      rescorer = fit_ngram(choice.rescorer, target.config.vocab_size)
    return Blockwise(sampling=sampling, heads=heads, heads_name=choice.heads or model,
                     rescorer=rescorer, **settings)
  name = choice.drafter if choice.drafter in DRAFTER_KINDS else "model"
  return Speculative(sampling=sampling, drafter=drafter, drafter_name=name, **settings)


def placed_method(choice: MethodChoice, target: sd.Model, model: str, drafter: Any,
                  load: Callable[[str], sd.Model], mesh: Mesh | None) -> Any:
  """`build_method` placed on `mesh` (`place_method`; None: as it is); an early-exit
  small model is the sharded target itself, left as it is."""
  return place_method(build_method(choice, target, model, drafter, load), mesh,
                      keep=("small",) if choice.early_exit else ())
