"""Settings as users write them, parsed once for every tool.

    int_list("1,4-6")                             -> [1, 4, 5, 6]       (an argparse type)
    parse_overrides("vocab_size=300,num_heads=2") -> {"vocab_size": 300, "num_heads": 2}
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from specdec_jax.errors import OptionError
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
      raise OptionError(f"override {item!r} is not KEY=VALUE")
    try:
      out[key.strip()] = json.loads(value)
    except json.JSONDecodeError:
      out[key.strip()] = value.strip()
  return out


def check_at_least_one(**values) -> None:
  """OptionError "--name must be an integer >= 1, got v" for the first value below 1 (None
  values are unset and pass): check_at_least_one(batch_size=args.batch_size)."""
  for name, value in values.items():
    if value is not None and value < 1:
      raise OptionError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value}")
