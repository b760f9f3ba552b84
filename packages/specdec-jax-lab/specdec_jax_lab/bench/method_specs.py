"""The bench's mini-syntax for more methods, derived from the core method values' fields.

    --bild 0.5:3                                   fallback_threshold:rollback_threshold
    --bild fallback_threshold=0.5,max_small_steps=4,batch_policy=sync
    --heads-lattice 2:2                            top_k:num_drafts
    --heads-lattice top_k=3,num_drafts=2,rescoring_weight=0.5
    --beam 4:0.6                                   num_beams:alpha (greedy modes only)

A spec is either the short form A:B (the fields of `SHORTHAND`) or field=value pairs
naming any setting of the core value (`sd.BiLD`, `sd.Blockwise`, `sd.Beam`; typed by its default,
checked by building it). The entry's label lists the settings given, in short names
where `LABEL_NAMES` has one: "bild fb=0.5 rb=3", "blockwise k=2 p=2".
"""

from __future__ import annotations

from typing import Any, Callable

from specdec_jax import methods as core
from specdec_jax.errors import BenchError, InputError
from specdec_jax.runs import Beam, Bild, Blockwise, DecodeMethod

#: Fields of the A:B short form, per core method type.
SHORTHAND = {core.BiLD: ("fallback_threshold", "rollback_threshold"),
             core.Blockwise: ("top_k", "num_drafts"), core.Beam: ("num_beams", "alpha")}
#: Short names of settings in entry labels.
LABEL_NAMES = {"fallback_threshold": "fb", "rollback_threshold": "rb", "top_k": "k",
               "num_drafts": "p", "num_beams": "K"}


def _value(text: str, default: Any, name: str, flag: str) -> Any:
  """`text` as the type of the field's default (None default: a string, "none" -> None)."""
  try:
    if isinstance(default, bool):
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(text)
      return text.lower() in ("true", "1")
    if isinstance(default, int):
      return int(text)
    if isinstance(default, float):
      return float(text)
  except ValueError:
    raise BenchError(f"{flag}: {name}={text!r} is not a {type(default).__name__}") from None
  return None if text.lower() == "none" else text


def parse_settings(text: str, core_type: type, flag: str) -> dict[str, Any]:
  """{field: value} of one spec (module doc), checked against `core_type`'s settings."""
  fields = {f.name: f for f in core.settings_fields(core_type)}
  if "=" not in text:
    names = SHORTHAND[core_type]
    parts = text.split(":")
    if len(parts) != len(names):
      raise BenchError(f"{flag} {text!r}: expected {':'.join(n.upper() for n in names)} "
                       f"({', '.join(names)}) or field=value pairs")
    pairs = list(zip(names, parts, strict=True))
  else:
    pairs = [part.partition("=")[::2] for part in text.split(",")]
  settings = {}
  for name, value in pairs:
    name = name.strip()
    if name not in fields:
      raise BenchError(f"{flag} {text!r}: unknown setting {name!r}; settings of "
                       f"sd.{core_type.__name__}: {', '.join(fields)}")
    settings[name] = _value(value.strip(), fields[name].default, name, flag)
  try:
    core_type(**settings)                     # the core's checks, before anything runs
  except InputError as e:
    raise BenchError(f"{flag} {text!r}: {e}") from None
  return settings


def label(kind: str, settings: dict[str, Any]) -> str:
  """"bild fb=0.5 rb=3": the kind, then each given setting (numbers as %g)."""
  show = lambda v: f"{v:g}" if isinstance(v, float) else str(v)
  return " ".join([kind] + [f"{LABEL_NAMES.get(k, k)}={show(v)}" for k, v in settings.items()])


def extra_methods(bild_specs=(), lattice_specs=(), *, small: Any = None,
                  small_name: str | None = None, heads: Any = None,
                  heads_name: str | None = None,
                  beam_specs=()) -> dict[str, Callable[[Any], DecodeMethod]]:
  """{label: sampling -> method} for `run_bench(extras=...)`: BiLD per --bild spec (with
  `small`), with `heads` blockwise decoding plain and per --heads-lattice spec, and beam
  search per --beam spec (deterministic: the bench times it in greedy mode only)."""
  extras: dict[str, Callable[[Any], DecodeMethod]] = {}
  for text in beam_specs:
    s = parse_settings(text, core.Beam, "--beam")

    def beam(sampling, s=s) -> DecodeMethod:   # a def: mypy cannot type a lambda's s=s
      return Beam(**s)
    extras[label("beam", s)] = beam
  for text in bild_specs:
    s = parse_settings(text, core.BiLD, "--bild")

    def bild(sampling, s=s) -> DecodeMethod:
      return Bild(small=small, small_name=small_name, sampling=sampling, **s)
    extras[label("bild", s)] = bild
  if heads is not None:
    specs: list[dict[str, Any]] = [{}] + [parse_settings(t, core.Blockwise, "--heads-lattice")
                                          for t in lattice_specs]
    for s in specs:
      plain = all(s.get(k, 1) == 1 for k in ("top_k", "num_drafts")) and len(s) <= 2

      def blockwise(sampling, s=s) -> DecodeMethod:
        return Blockwise(heads=heads, heads_name=heads_name, sampling=sampling, **s)
      extras["blockwise" if plain else label("blockwise", s)] = blockwise
  return extras
