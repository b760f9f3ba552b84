"""The decoding method of `specdec decode` / `specdec eval`, from flags, built once.

    --method greedy|sample         baseline, or speculative decoding with --drafter
    --method bild                  BiLD: --drafter is the small model, or early-exit:K
                                   (the target read after K decoder layers)
    --method blockwise             prediction heads (--heads, default: those saved with
                                   --model), --lattice-k, --num-drafts, --rescoring

The flags of BiLD's and blockwise decoding's settings are derived from the core method
values (`sd.BiLD`, `sd.Blockwise`): one flag per setting, named after the field
(`--fallback-threshold`), typed and defaulted by it, its help taken from the class's
"Attributes:" docs. `FLAG_NAMES` renames the one that would clash (`--lattice-k`: the
lattice's top_k, beside sampling's `--top-k`). The models (`--drafter`, `--heads`,
`--rescorer`) are paths, read here.

BiLD and blockwise decoding sample when a sampling option (--temperature, --top-k,
--top-p) is given, else decode greedily.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable

import specdec_jax as sd
from specdec_jax.decoding import methods as core
from specdec_jax.decoding.lattice import NGramLM
from specdec_jax.tools.errors import CLIError
from specdec_jax.tools.methods import Baseline, Bild, Blockwise, DecodeMethod, Speculative
from specdec_jax.tools.models import DRAFTER_KINDS
from specdec_jax.tools.options import MODES, make_sampling

ALGORITHMS = ("bild", "blockwise")
EARLY_EXIT = "early-exit:"

#: Flag names that differ from their field's: (core method type, field) -> flag.
FLAG_NAMES = {(core.Blockwise, "top_k"): "--lattice-k",
              (core.Speculative, "adaptive"): "--adaptive-gamma"}


def setting_flags(core_type: type) -> list[tuple[str, dataclasses.Field]]:
  """(flag, field) of every setting of a core method type (`exact` is the tools' own)."""
  return [(FLAG_NAMES.get((core_type, f.name), "--" + f.name.replace("_", "-")), f)
          for f in core.settings_fields(core_type) if f.name != "exact"]


def _dest(flag: str) -> str:
  return flag[2:].replace("-", "_")


def add_setting_flags(group, core_type: type) -> None:
  """One flag per setting of `core_type`: type, choices and help from the field."""
  docs = core.field_docs(core_type)
  for flag, f in setting_flags(core_type):
    help = f"{docs.get(f.name, f.name).rstrip('.')} (default {f.default})".replace("%", "%%")
    choices = f.metadata.get("choices")
    if isinstance(f.default, bool):
      group.add_argument(flag, action="store_true", help=help)
    elif choices:
      group.add_argument(flag, choices=[c for c in choices if c is not None], help=help)
    else:
      group.add_argument(flag, type=type(f.default), help=help)


def settings_from_args(args, core_type: type) -> dict[str, Any]:
  """{field: value} of the settings given on the command line (the rest keep the core's
  defaults)."""
  out = {}
  for flag, f in setting_flags(core_type):
    value = getattr(args, _dest(flag), None)
    if value is not None and value is not False:
      out[f.name] = value
  return out


_BILD_FLAGS = tuple(_dest(flag) for flag, _ in setting_flags(core.BiLD))
_BLOCKWISE_FLAGS = ("heads", "rescorer") + tuple(_dest(flag)
                                                  for flag, _ in setting_flags(core.Blockwise))
# Speculative decoding's flags are the commands' own (`specdec decode`, `specdec eval`).
_SPECULATIVE_FLAGS = tuple(_dest(flag) for flag, _ in setting_flags(core.Speculative))


def add_method_flags(p: argparse.ArgumentParser) -> None:
  """--method and the sampling flags, then the flags of BiLD and blockwise decoding."""
  p.add_argument("--method", choices=MODES + ALGORITHMS,
                 help="greedy / sample: baseline, or speculative with --drafter; bild: BiLD "
                 "with --drafter as the small model; blockwise: prediction heads (default: "
                 "greedy, or sample if a sampling option is given)")
  p.add_argument("--temperature", type=float, help="sampling temperature (>= 0; default 1)")
  p.add_argument("--top-k", type=int, help="keep the k most likely tokens (0 = off)")
  p.add_argument("--top-p", type=float, help="nucleus mass in (0, 1] (1 = off)")
  bild = p.add_argument_group("BiLD (--method bild; the small model: --drafter)")
  add_setting_flags(bild, core.BiLD)
  heads = p.add_argument_group("blockwise parallel decoding (--method blockwise)")
  heads.add_argument("--heads", metavar="PATH",
                     help="heads file or model dir (default: the heads saved with --model)")
  add_setting_flags(heads, core.Blockwise)
  heads.add_argument("--rescorer", metavar="PATH",
                     help="neural: a small model path/name; ngram: a prepared data dir whose "
                     "train targets fit the bigram LM ('data' in specdec eval: --data)")


def _given(args, names) -> list[str]:
  return ["--" + n.replace("_", "-") for n in names
          if getattr(args, n, None) not in (None, False)]


def check_method_flags(args) -> None:
  """Flags that do not apply to the chosen method are an error (no model is loaded yet)."""
  algorithm = args.method if args.method in ALGORITHMS else None
  wrong = {"bild": _BLOCKWISE_FLAGS + _SPECULATIVE_FLAGS,
           "blockwise": _BILD_FLAGS + _SPECULATIVE_FLAGS, None: _BILD_FLAGS + _BLOCKWISE_FLAGS}
  bad = _given(args, wrong[algorithm])
  if bad:
    raise CLIError(f"{', '.join(bad)} do not apply to --method {args.method or 'greedy'}")
  if algorithm == "bild" and args.drafter is None:
    raise CLIError("--method bild needs the small model: --drafter PATH or early-exit:K")
  if algorithm == "blockwise" and args.drafter is not None:
    raise CLIError("--method blockwise drafts with prediction heads: drop --drafter")
  if args.drafter is not None and args.drafter.startswith(EARLY_EXIT) and algorithm != "bild":
    raise CLIError(f"--drafter {args.drafter} is BiLD's early-exit small model: add "
                   "--method bild")
  if args.rescoring is None and args.rescorer is not None:
    raise CLIError("--rescorer needs --rescoring ngram|neural")
  if args.rescoring is not None and args.rescorer is None:
    raise CLIError(f"--rescoring {args.rescoring} needs --rescorer")


def sampling_from_method_args(args):
  """sd.Greedy() / sd.Sampling(...); for bild / blockwise the sampling options decide."""
  mode = None if args.method in ALGORITHMS else args.method
  return make_sampling(mode, args.temperature, args.top_k, args.top_p)


def fit_ngram(data_dir: str, vocab_size: int) -> NGramLM:
  """The bigram LM of a prepared data dir's train targets (blockwise n-gram rescoring)."""
  from specdec_jax.tools.data import prepare
  targets = prepare.load_split(data_dir, "train")["targets"]
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


def build_method(args, target: sd.Model, sampling, drafter: Any,
                 load: Callable[[str], sd.Model]) -> DecodeMethod:
  """The method the flags ask for; `drafter` is the resolved --drafter (None for
  early-exit:K and blockwise), `load` reads a model path/name (neural rescorer)."""
  name = args.drafter if args.drafter in DRAFTER_KINDS else "model"
  if args.method == "bild":
    small = drafter
    if args.drafter.startswith(EARLY_EXIT):
      small, name = sd.early_exit(target, early_exit_layer(args.drafter, target)), args.drafter
    return Bild(sampling=sampling, small=small, small_name=args.drafter,
                **settings_from_args(args, core.BiLD))
  if args.method == "blockwise":
    heads = sd.load_heads(args.heads or args.model, target)
    rescorer = None
    if args.rescoring == "neural":
      rescorer = load(args.rescorer)
    elif args.rescoring == "ngram":
      rescorer = fit_ngram(args.rescorer, target.config.vocab_size)
    return Blockwise(sampling=sampling, heads=heads, heads_name=args.heads or args.model,
                     rescorer=rescorer, **settings_from_args(args, core.Blockwise))
  if drafter is None:
    return Baseline(sampling=sampling)
  return Speculative(sampling=sampling, drafter=drafter, drafter_name=name,
                     **settings_from_args(args, core.Speculative))
