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
models to load: `loading.MethodChoice`); `loading.build_method` turns that into the run once
the target is loaded.

Everything here is derived from the method values (`sd.methods.METHODS`, then
`specdec_jax.experimental.METHODS`), each the method's one home: `--method` takes their
`name`s; each gets a flag group titled by its `summary`, with one flag per setting, named
after the field (`--fallback-threshold`) or its `setting(flag=)` (`--lattice-k`), typed
and defaulted by it, its help its
`setting(cli_help=)` or the class's "Attributes:" docs, its value checked by the class
itself before any model is loaded; its models' flags are their `carried(flag=)`
(`--heads`, `--rescorer`; `--drafter` is common); `drafter_role` says what `--drafter`
is for it, `greedy_only` refuses sampling. A flag of another method than the chosen one
is an error naming the method it belongs to. No table here names a method.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

from specdec_jax import experimental
from specdec_jax import methods as core
from specdec_jax.errors import InputError
from specdec_jax.flags import FlagError
from specdec_jax.loading import DRAFTER, EARLY_EXIT, MethodChoice
from specdec_jax.sampling import MODES, make_sampling

#: --method: each method value by its name, in `--help` order.
CORE = {m.name: m for m in core.METHODS + experimental.METHODS}
METHOD_NAMES = tuple(CORE)


_SCALARS = {"bool": bool, "int": int, "float": float, "str": str}


def _flag(f: dataclasses.Field) -> str:
  """The field's `setting(flag=)`, or --name."""
  return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def setting_flags(core_type: type) -> list[tuple[str, dataclasses.Field]]:
  """(flag, field) of every setting of a core method type (`exact` is the tools' own)."""
  return [(_flag(f), f) for f in core.settings_fields(core_type) if f.name != "exact"]


def model_flags(core_type: type) -> list[tuple[str, dataclasses.Field]]:
  """(flag, field) of a method's models other than --drafter's (`carried(flag=)`)."""
  return [(f.metadata["flag"], f) for f in core.model_fields(core_type)
          if f.metadata.get("flag") not in (None, DRAFTER)]


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
    help = f.metadata.get("cli_help") or docs.get(f.name, f.name).rstrip(".")
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
  return tuple(_dest(flag) for flag, _ in model_flags(CORE[method]) + setting_flags(CORE[method]))


def _method_name(text: str) -> str:
  """argparse type of --method: a sampling mode there gets a pointer to --sampling."""
  if text in MODES:
    raise argparse.ArgumentTypeError(
        f"{text!r} is a sampling mode: use --sampling {text} (--method is the algorithm: "
        f"{', '.join(METHOD_NAMES)})")
  return text


#: --help of the model flags (their fields' docs name Python values).
MODEL_HELP = {
    "--heads": "heads file or model dir (default: the heads saved with --model)",
    "--rescorer": "neural: a small model path/name; ngram: a prepared data dir whose train "
                  "targets fit the bigram LM ('data' in specdec eval: --data)",
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
  for name, method in CORE.items():
    if not method_flags(name):
      continue
    group = p.add_argument_group(f"--method {name}: {method.summary}")
    for flag, f in model_flags(method):
      if _dest(flag) not in added:
        group.add_argument(flag, metavar="PATH", help=MODEL_HELP.get(flag, f.name))
    add_setting_flags(group, method, skip=frozenset(added))
    added.update(method_flags(name))


def _given(args, names) -> list[str]:
  return ["--" + n.replace("_", "-") for n in names
          if getattr(args, n, None) is not None and getattr(args, n) is not False]


def _owners(dest: str) -> list[str]:
  """The methods a flag (its dest) belongs to."""
  return [m for m in METHOD_NAMES if dest in method_flags(m)]


def resolve_method(args) -> str:
  """The --method value, or its default: speculative with --drafter, else autoregressive.
  A method that takes no drafter, given one, is the method that says it is its drafted
  form (`with_drafter_for`: --method beam --drafter X is speculative-beam)."""
  if args.method is None:
    return (core.Autoregressive if args.drafter is None else core.Speculative).name
  if args.drafter is not None and CORE[args.method].drafter_role is None:
    drafted = [name for name, m in CORE.items() if m.with_drafter_for == args.method]
    if drafted:
      return drafted[0]
  return args.method


def _check_settings(args, method: str) -> core.Method:
  """The core value of the given settings, its models None: the core class's own checks
  (no model needed), its message naming the flag instead of the field."""
  core_type = CORE[method]
  settings = settings_from_args(args, core_type)
  # the models' flags as given (their names until loaded), for the class's own checks
  models: dict[str, Any] = {f.name: getattr(args, _dest(flag), None)
                            for flag, f in model_flags(core_type)}
  models.update({f.name: None for f in core.model_fields(core_type) if f.name not in models})
  try:
    return core_type(**models, **settings)
  except InputError as e:
    message = str(e)
    for flag, f in setting_flags(core_type) + model_flags(core_type):
      message = re.sub(rf"\b{f.name}\b(=(\S+))?", _as_flag(flag), message)
    raise FlagError(message) from None


def _as_flag(flag: str):
  """A re.sub replacement: "name=value" -> "--flag value", "name" -> "--flag"."""
  def replace(m: re.Match) -> str:
    return flag + (f" {m.group(2)}" if m.group(2) else "")
  return replace


def check_method_flags(args) -> core.Method:
  """The core value of the flags (its models None); flags that do not apply to the method
  and settings the core would reject are errors (before any model is loaded)."""
  method = resolve_method(args)
  own = set(method_flags(method))
  others = dict.fromkeys(d for m in METHOD_NAMES if m != method for d in method_flags(m)
                         if d not in own)
  bad = _given(args, others)
  if bad:
    owners = sorted({o for flag in bad for o in _owners(_dest(flag))}, key=METHOD_NAMES.index)
    verb = "applies" if len(bad) == 1 else "apply"
    drafted = all(CORE[o].drafter_role for o in owners) and args.drafter is None
    hint = ": add --drafter" if drafted and CORE[method].drafter_role is None else ""
    raise FlagError(f"{', '.join(bad)} only {verb} to --method {' / '.join(owners)}, not "
                   f"--method {method}{hint}")
  drafter, role = args.drafter, CORE[method].drafter_role
  if drafter is not None and drafter.startswith(EARLY_EXIT) and role != "small model":
    raise FlagError(f"--drafter {drafter} is BiLD's early-exit small model: add --method bild")
  if role is not None and drafter is None:
    kinds = "PATH_OR_NAME, ngram or prompt-lookup" if role == "drafter" else "PATH or early-exit:K"
    raise FlagError(f"--method {method} needs {'a' if role == 'drafter' else 'the'} {role}: "
                   f"--drafter {kinds}")
  if role is None and drafter is not None:
    raise FlagError(f"--method {method} ({CORE[method].summary}) takes no --drafter: drop "
                   f"--drafter")
  if CORE[method].greedy_only and (args.sampling == "sample" or _given(
      args, ("temperature", "top_k", "top_p"))):
    raise FlagError(f"--method {method} is deterministic ({CORE[method].summary}): drop "
                   "--sampling sample, --temperature, --top-k and --top-p")
  return _check_settings(args, method)


def method_from_args(args) -> MethodChoice:
  """The `MethodChoice` of the flags (`check_method_flags`, `sampling_from_method_args`):
  where the method's flags leave argparse."""
  value = check_method_flags(args)
  given = tuple((flag, getattr(args, _dest(flag))) for flag, _ in model_flags(type(value))
                if getattr(args, _dest(flag), None) is not None)
  return MethodChoice(value=value, sampling=sampling_from_method_args(args),
                      drafter=args.drafter, models=given)


def sampling_from_method_args(args):
  """sd.Greedy() / sd.Sampling(...) from --sampling and the sampling options."""
  if args.sampling == "greedy":
    given = _given(args, ("temperature", "top_k", "top_p"))
    if given:
      raise FlagError(f"{', '.join(given)} only apply with --sampling sample")
  return make_sampling(args.sampling, args.temperature, args.top_k, args.top_p)
