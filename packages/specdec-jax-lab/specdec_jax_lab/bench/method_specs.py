"""The bench's mini-syntax for more methods, derived from the method values.

    --bild 0.5:3                                   fallback_threshold:rollback_threshold
    --bild fallback_threshold=0.5,max_small_steps=4,batch_policy=sync
    --heads-lattice 2:2                            top_k:num_drafts
    --heads-lattice top_k=3,num_drafts=2,rescoring_weight=0.5
    --beam 4:0.6                                   num_beams:alpha (greedy modes only)
    --beam 4:0.6 with a drafter                    also speculative beam search per gamma

A spec is either the short form A:B (the value's `shorthand` settings) or field=value
pairs naming any setting of the method value (`sd.BiLD`, `sd.Blockwise`, `sd.Beam`;
typed by its default, checked by building it). The entry's label is the value's own
`describe()`: its name and the settings that differ from their defaults, in their short
names where they have one ("bild fb=0.5 rb=3", "blockwise k=2 p=2"). With a drafter, each
--beam spec is also timed as `experimental.SpeculativeBeam` (the same settings, the drafter drafting
gamma tokens per beam for each --gammas entry), its speedup taken over the `sd.Beam`
entry ("speculative-beam K=4 alpha=0.6 gamma=3" against "beam K=4 alpha=0.6").
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from specdec_jax import experimental
from specdec_jax import methods as core
from specdec_jax.errors import BenchError, InputError
from specdec_jax.runs import Run


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


def flag_of(core_type: type) -> str:
  """The bench's flag of a method type: --bild, --heads-lattice, --beam."""
  return {"blockwise": "--heads-lattice"}.get(core_type.name, f"--{core_type.name}")


def parse_settings(text: str, core_type: type, flag: str) -> dict[str, Any]:
  """{field: value} of one spec (module doc), checked against `core_type`'s settings."""
  fields = {f.name: f for f in core.settings_fields(core_type)}
  if "=" not in text:
    names = core_type.shorthand
    parts = text.split(":")
    if not names or len(parts) != len(names):
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


def label(core_type: type, settings: Mapping[str, Any]) -> str:
  """"bild fb=0.5 rb=3": the method's name, then each given setting in its short name
  (`setting(short=)`; numbers as %g)."""
  shorts = {f.name: f.metadata.get("short") or f.name for f in core.settings_fields(core_type)}
  show = lambda v: f"{v:g}" if isinstance(v, float) else str(v)
  return " ".join([core_type.name] + [f"{shorts[k]}={show(v)}" for k, v in settings.items()])


def extra_methods(specs: Mapping[type, Sequence[str]],
                  models: Mapping[type, tuple[Any, str | None]] | None = None
                  ) -> dict[str, Callable[[Any], Run]]:
  """{label: sampling -> run} for `run_bench(extras=...)`: a run per spec of each method
  type (`{sd.BiLD: ["0.5:3"], sd.Beam: ["4:0.6"]}`; "" is its defaults), its first model
  field set from `models` ({sd.BiLD: (small, how reports name it)}). A deterministic
  method (beam search) is timed in greedy modes only."""
  extras: dict[str, Callable[[Any], Run]] = {}
  models = dict(models or {})
  for core_type, texts in specs.items():
    fields = core.model_fields(core_type)
    model, name = models.get(core_type, (None, None))
    given = {fields[0].name: model} if fields else {}
    for text in texts:
      s = parse_settings(text, core_type, flag_of(core_type)) if text else {}
      value = core_type(**given, **s)

      def make(sampling, value=value, name=name) -> Run:
        return Run(value, sampling, name)
      extras[label(core_type, s)] = make
  return extras


def speculative_beam_specs(beam_texts: Sequence[str], gammas: Sequence[int]
                           ) -> tuple[list[str], dict[str, str]]:
  """For each --beam spec and gamma, the spec of `experimental.SpeculativeBeam` with the same
  settings (every `sd.Beam` setting is one of its own) drafting gamma tokens per beam; and
  {its entry's label: the label of the `sd.Beam` entry it is compared with}."""
  specs, references = [], {}
  for text in beam_texts:
    given = parse_settings(text, core.Beam, "--beam") if text else {}
    for gamma in gammas:
      settings = {**given, "gamma": int(gamma)}
      specs.append(",".join(f"{k}={v}" for k, v in settings.items()))
      references[label(experimental.SpeculativeBeam, settings)] = label(core.Beam, given)
  return specs, references
