"""The decoding method of `specdec decode` / `specdec eval`, from flags, built once.

    --method greedy|sample         baseline, or speculative decoding with --drafter
    --method bild                  BiLD: --drafter is the small model, or early-exit:K
                                   (the target read after K decoder layers)
    --method blockwise             prediction heads (--heads, default: those saved with
                                   --model), --lattice-k, --num-drafts, --rescoring

BiLD and blockwise decoding sample when a sampling option (--temperature, --top-k,
--top-p) is given, else decode greedily.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import specdec_jax as sd
from specdec_jax.decoding.lattice import NGramLM
from specdec_jax.tools.errors import CLIError
from specdec_jax.tools.methods import Baseline, Bild, Blockwise, DecodeMethod, Speculative
from specdec_jax.tools.models import DRAFTER_KINDS
from specdec_jax.tools.options import MODES, make_sampling

ALGORITHMS = ("bild", "blockwise")
EARLY_EXIT = "early-exit:"

_BILD_FLAGS = ("fallback_threshold", "rollback_threshold", "max_small_steps", "batch_policy")
_BLOCKWISE_FLAGS = ("heads", "lattice_k", "num_drafts", "rescoring", "rescorer",
                    "rescoring_weight", "oracle")
_SPECULATIVE_FLAGS = ("gamma", "adaptive_gamma", "lenience")


def add_method_flags(p: argparse.ArgumentParser) -> None:
  """--method and the sampling flags, then the flags of BiLD and blockwise decoding."""
  p.add_argument("--method", choices=MODES + ALGORITHMS,
                 help="greedy / sample: baseline, or speculative with --drafter; bild: BiLD "
                 "with --drafter as the small model; blockwise: prediction heads (default: "
                 "greedy, or sample if a sampling option is given)")
  p.add_argument("--temperature", type=float, help="sampling temperature (>= 0; default 1)")
  p.add_argument("--top-k", type=int, help="keep the k most likely tokens (0 = off)")
  p.add_argument("--top-p", type=float, help="nucleus mass in (0, 1] (1 = off)")
  bild = p.add_argument_group("BiLD (--method bild)")
  bild.add_argument("--fallback-threshold", type=float,
                    help="the small model hands over when max p_S <= it (default 0.5)")
  bild.add_argument("--rollback-threshold", type=float,
                    help="roll back a small token y when -log p_L(y) > it (default 5)")
  bild.add_argument("--max-small-steps", type=int,
                    help="most consecutive small-model tokens (default 10)")
  bild.add_argument("--batch-policy", choices=("wait", "sync"),
                    help="rows that fall back wait for the others (default) or stop them")
  heads = p.add_argument_group("blockwise parallel decoding (--method blockwise)")
  heads.add_argument("--heads", metavar="PATH",
                     help="heads file or model dir (default: the heads saved with --model)")
  heads.add_argument("--lattice-k", type=int, help="top-k lattice width per head (default 1)")
  heads.add_argument("--num-drafts", type=int,
                     help="p best lattice paths verified in one call (default 1)")
  heads.add_argument("--rescoring", choices=("ngram", "neural"), help="rescore the lattice")
  heads.add_argument("--rescorer", metavar="PATH",
                     help="neural: a small model path/name; ngram: a prepared data dir whose "
                     "train targets fit the bigram LM ('data' in specdec eval: --data)")
  heads.add_argument("--rescoring-weight", type=float, help="default 1.0")
  heads.add_argument("--oracle", action="store_true",
                     help="also report the oracle top-k block efficiency")


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
                **{k: getattr(args, k) for k in _BILD_FLAGS if getattr(args, k) is not None})
  if args.method == "blockwise":
    heads = sd.load_heads(args.heads or args.model, target)
    rescorer = None
    if args.rescoring == "neural":
      rescorer = load(args.rescorer)
    elif args.rescoring == "ngram":
      rescorer = fit_ngram(args.rescorer, target.config.vocab_size)
    settings = {"top_k": args.lattice_k, "num_drafts": args.num_drafts,
                "rescoring_weight": args.rescoring_weight}
    return Blockwise(sampling=sampling, heads=heads, heads_name=args.heads or args.model,
                     rescoring=args.rescoring, rescorer=rescorer, oracle=args.oracle,
                     **{k: v for k, v in settings.items() if v is not None})
  if drafter is None:
    return Baseline(sampling=sampling)
  return Speculative(sampling=sampling, drafter=drafter, drafter_name=name,
                     gamma=getattr(args, "gamma", None) or 5,
                     lenience=getattr(args, "lenience", None) or 1.0,
                     adaptive=bool(getattr(args, "adaptive_gamma", False)))
