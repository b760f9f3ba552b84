"""Flags several subcommands share, defined once."""

from __future__ import annotations

import argparse

from specdec_jax.tools.models import DTYPES
from specdec_jax.tools.options import MODES, make_sampling


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
  """--method greedy|sample, --temperature, --top-k, --top-p (see `sampling_from_args`)."""
  p.add_argument("--method", choices=MODES,
                 help="default: greedy, or sample if a sampling option is given")
  p.add_argument("--temperature", type=float, help="sampling temperature (>= 0; default 1)")
  p.add_argument("--top-k", type=int, help="keep the k most likely tokens (0 = off)")
  p.add_argument("--top-p", type=float, help="nucleus mass in (0, 1] (1 = off)")


def sampling_from_args(args):
  """sd.Greedy() or sd.Sampling(...) from the flags of `add_sampling_flags`."""
  return make_sampling(args.method, args.temperature, args.top_k, args.top_p)


def add_dtype_flag(p: argparse.ArgumentParser) -> None:
  p.add_argument("--dtype", choices=DTYPES, default="float32",
                 help="compute dtype: parameters AND activations (default float32, as T5X "
                 "and HF load; bfloat16 halves memory; logits stay float32)")


def add_drafter_flag(p: argparse.ArgumentParser, extra: str) -> None:
  p.add_argument("--drafter", metavar="PATH_OR_NAME",
                 help=f"drafter model path/name, 'ngram' ({extra}) or 'prompt-lookup'; none: "
                 "baseline decoding")
