"""The bench's flags for more methods and their mini-syntax, derived from the method values.

    --bild 0.5:3                                   fallback_threshold:rollback_threshold
    --bild fallback_threshold=0.5,max_small_steps=4,batch_policy=sync
    --heads-lattice 2:2                            top_k:num_drafts
    --heads-lattice top_k=3,num_drafts=2,rescoring_weight=0.5
    --beam 4:0.6                                   num_beams:alpha (greedy modes only)
    --beam 4:0.6 with a drafter                    also speculative beam search per gamma

Every method value with a `shorthand` has a flag (`spec_methods`): its `bench_flag`, or
--NAME; its metavar the short names of the shorthand settings, its help from its `summary`,
its model (`carried(flag=)`: --drafter, --heads) and `greedy_only`. A method's drafted form
(`with_drafter_for`: `experimental.SpeculativeBeam` for `sd.Beam`) is timed under its base's
flag when the bench has a drafter. A new method with a shorthand is a new bench flag.

A spec is either the short form A:B (the value's `shorthand` settings) or field=value
pairs naming any setting of the method value (typed by its default, checked by building
it). The entry's label is the value's own `describe()`: its name and the settings that
differ from their defaults, in their short names where they have one ("bild fb=0.5 rb=3",
"blockwise k=2 p=2"). A drafted form is timed with the same settings, the drafter drafting
gamma tokens per beam for each --gammas entry, its speedup taken over its base's entry
("speculative-beam K=4 alpha=0.6 gamma=3" against "beam K=4 alpha=0.6").
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from specdec_jax import experimental
from specdec_jax import methods as core
from specdec_jax.errors import InputError
from specdec_jax.runs import Run
from specdec_jax_lab.errors import BenchError


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


#: The method types the bench can time: the stable ones, then the experimental ones.
METHODS = core.METHODS + experimental.METHODS
DRAFTER = "--drafter"


def spec_methods(methods: Sequence[type] = METHODS) -> tuple[type, ...]:
  """The method types with a bench flag: those with a `shorthand`, except a method's drafted
  form (`with_drafter_for`: speculative beam search), timed under its base's flag."""
  return tuple(m for m in methods if m.shorthand and m.with_drafter_for is None)


def flag_of(core_type: type) -> str:
  """The bench's flag of a method type: its `bench_flag`, or --NAME (--bild, --heads-lattice,
  --beam)."""
  return core_type.bench_flag or f"--{core_type.name}"


def dest_of(core_type: type) -> str:
  """The argparse dest of the method's flag (bild, heads_lattice, beam)."""
  return flag_of(core_type)[2:].replace("-", "_")


def model_flag(core_type: type) -> str | None:
  """The flag that names the method's model (its first model field's `carried(flag=)`):
  --drafter (the bench's drafter), --heads, or None (the target alone)."""
  fields = core.model_fields(core_type)
  return fields[0].metadata.get("flag") if fields else None


def drafted_form(core_type: type, methods: Sequence[type] = METHODS) -> type | None:
  """The method that is `core_type` drafted by the bench's drafter (`with_drafter_for`)."""
  return next((m for m in methods if m.with_drafter_for == core_type.name), None)


def spelled(core_type: type) -> str:
  """sd.BiLD, experimental.SpeculativeBeam: how a user writes the type."""
  home = "sd" if getattr(core, core_type.__name__, None) is core_type else "experimental"
  return f"{home}.{core_type.__name__}"


def metavar(core_type: type) -> str:
  """The short form's metavar: each `shorthand` setting's short name, upper case (FB:RB)."""
  fields = {f.name: f for f in core.settings_fields(core_type)}
  return ":".join((fields[n].metadata.get("short") or n).upper() for n in core_type.shorthand)


def spec_help(core_type: type, methods: Sequence[type] = METHODS) -> str:
  """The --help of a method's flag, from the value: what it is, its short form (with its
  defaults as the example), the model it needs and its modes."""
  fields = {f.name: f for f in core.settings_fields(core_type)}
  example = ":".join(f"{fields[n].default:g}" if isinstance(fields[n].default, float)
                     else str(fields[n].default) for n in core_type.shorthand)
  flag, needs = flag_of(core_type), model_flag(core_type)
  text = (f"also time {core_type.summary} ({spelled(core_type)}) at {metavar(core_type)} = "
          f"{', '.join(core_type.shorthand)} (repeatable), e.g. {flag} {example}, or any of its "
          f"settings as field=value pairs")
  if needs == DRAFTER:
    text += f"; --drafter is its {core_type.drafter_role}"
  elif needs is not None:
    text += f"; needs {needs} (given, it is timed at its defaults too)"
  if core_type.greedy_only:
    text += "; greedy modes only"
  drafted = drafted_form(core_type, methods)
  if drafted is not None:
    text += (f"; with a drafter, also {spelled(drafted)} at each of --gammas, its speedup "
             f"over {spelled(core_type)} reported")
  return text.replace("%", "%%")


def add_spec_flags(p, methods: Sequence[type] = METHODS) -> None:
  """One repeatable flag per method of `spec_methods` (its specs: module doc)."""
  for m in spec_methods(methods):
    p.add_argument(flag_of(m), dest=dest_of(m), action="append", default=[],
                   metavar=metavar(m), help=spec_help(m, methods))


def check_specs(specs: Mapping[type, Sequence[str]], *, drafter: bool, given: set[str],
                modes: Sequence[str]) -> None:
  """BenchError for specs the run cannot time, before any model is loaded: a method drafted
  by --drafter without one, a method whose model flag is not given (`given`), a
  deterministic one with sampling modes."""
  for m, texts in specs.items():
    if not texts:
      continue
    flag, needs = flag_of(m), model_flag(m)
    if needs == DRAFTER and not drafter:
      raise BenchError(f"{flag} uses --drafter as {m.__name__}'s {m.drafter_role}: drop "
                       "--baseline-only")
    if needs not in (None, DRAFTER) and needs not in given:
      raise BenchError(f"{flag} needs {needs}")
    if m.greedy_only and "sample" in modes:
      raise BenchError(f"{flag} times {m.summary}: deterministic, add --modes greedy")


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


def drafted_specs(base: type, drafted: type, texts: Sequence[str], gammas: Sequence[int]
                  ) -> tuple[list[str], dict[str, str]]:
  """For each spec of `base` (`sd.Beam`) and gamma, the spec of its drafted form `drafted`
  (`experimental.SpeculativeBeam`) with the same settings (every setting of `base` is one
  of its own) drafting gamma tokens per beam; and {its entry's label: the label of the
  `base` entry it is compared with}."""
  specs, references = [], {}
  for text in texts:
    given = parse_settings(text, base, flag_of(base)) if text else {}
    for gamma in gammas:
      settings = {**given, "gamma": int(gamma)}
      specs.append(",".join(f"{k}={v}" for k, v in settings.items()))
      references[label(drafted, settings)] = label(base, given)
  return specs, references
