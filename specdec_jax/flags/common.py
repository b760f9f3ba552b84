"""Flags several commands share, and settings as users write them, parsed once for every
command (`specdec`'s and the lab's).

    add_dtype_flag(parser); add_drafter_flag(parser, "what 'ngram' fits on")
    int_list("1,4-6")                             -> [1, 4, 5, 6]       (an argparse type)
    parse_overrides("vocab_size=300,num_heads=2") -> {"vocab_size": 300, "num_heads": 2}
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from specdec_jax.flags import FlagError
from specdec_jax.loading import DTYPES
from specdec_jax.sampling import MODES


def mode_list(text: str) -> list[str]:
  """argparse type: "greedy,sample" -> the modes, each once, in order."""
  modes = [m.strip() for m in text.split(",") if m.strip()]
  bad = [m for m in modes if m not in MODES]
  if bad or not modes:
    raise argparse.ArgumentTypeError(f"modes must be among {', '.join(MODES)}, got {text!r}")
  return list(dict.fromkeys(modes))


def int_list(text: str) -> list[int]:
  """argparse type: "1,2,4" or "1-8" (or a mix, "1,4-6") -> positive ints."""
  values: list[int] = []
  try:
    for part in (p.strip() for p in text.split(",")):
      if "-" in part[1:]:
        lo, hi = part.split("-", 1)
        values += range(int(lo), int(hi) + 1)
      elif part:
        values.append(int(part))
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected integers like 1,2,4 or 1-8, got {text!r}") from None
  if not values or min(values) < 1:
    raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
  return values


def parse_overrides(text: str | None) -> dict[str, Any]:
  """"vocab_size=32128,num_decoder_layers=2" -> dict (values parsed as JSON, else strings)."""
  out: dict[str, Any] = {}
  for item in (text or "").split(","):
    if not item.strip():
      continue
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
      raise FlagError(f"override {item!r} is not KEY=VALUE")
    try:
      out[key.strip()] = json.loads(value)
    except json.JSONDecodeError:
      out[key.strip()] = value.strip()
  return out


def check_at_least_one(**values) -> None:
  """FlagError "--name must be an integer >= 1, got v" for the first value below 1 (None
  values are unset and pass): check_at_least_one(batch_size=args.batch_size)."""
  for name, value in values.items():
    if value is not None and value < 1:
      raise FlagError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value}")


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
