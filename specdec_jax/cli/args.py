"""Flags several subcommands share, defined once."""

from __future__ import annotations

import argparse

from specdec_jax.loading import DTYPES


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
  """Shows a flag's default unless it is None or a bool (unset, or a switch whose help
  says which way it defaults)."""

  def _get_help_string(self, action):
    if action.default is None or isinstance(action.default, bool):
      return action.help
    return super()._get_help_string(action)


def add_dtype_flag(p: argparse.ArgumentParser) -> None:
  p.add_argument("--dtype", choices=DTYPES, default="float32",
                 help="compute dtype of parameters and activations (float32 as T5X and HF "
                 "load; bfloat16 halves memory; logits stay float32)")


def add_drafter_flag(p: argparse.ArgumentParser, extra: str) -> None:
  p.add_argument("--drafter", metavar="PATH_OR_NAME",
                 help=f"drafter model path/name, 'ngram' ({extra}) or 'prompt-lookup'; none: "
                 "baseline decoding")
