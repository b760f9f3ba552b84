"""Every setting of a method value is documented: the CLI's flag help is built from the
"Attributes:" of the class docstrings (`methods.field_docs`), so an undocumented field would
reach `specdec decode --help` as its bare name."""

import argparse
import dataclasses

import pytest
from flax import struct

import specdec_jax as sd
from specdec_jax import methods, testing
from specdec_jax.flags import methods as method_args
from specdec_jax.rounds import engine

pytestmark = pytest.mark.unit

# The method values, and the settings values they hold or that go with them.
DOCUMENTED = testing.METHODS + (sd.AdaptiveGamma, sd.Sampling, engine.RoundConfig)


def undocumented(cls) -> list[str]:
  """The dataclass fields of `cls` without a description in its (or a base's) docstring."""
  docs = methods.field_docs(cls)
  return [f.name for f in dataclasses.fields(cls) if not docs.get(f.name, "").strip()]


@pytest.mark.parametrize("cls", DOCUMENTED, ids=lambda c: c.__name__)
def test_every_field_has_a_description(cls):
  assert undocumented(cls) == []


def test_the_check_finds_an_undocumented_field():
  @struct.dataclass
  class Patient(sd.BiLD):
    """BiLD that waits.

    Attributes:
      patience: rounds to wait before falling back.
    """

    patience: int = methods.setting(3)
    stubbornness: int = methods.setting(1)

  assert undocumented(Patient) == ["stubbornness"]
  assert methods.field_docs(Patient)["fallback_threshold"]       # a base's entries count


def test_every_setting_flag_carries_its_fields_description():
  """A flag's help is its field's description, or the CLI's own wording (the field's
  `setting(cli_help=)`) where the docstring reads as Python; never empty."""
  parser = argparse.ArgumentParser()
  method_args.add_method_flags(parser)
  helps = {flag: action.help for action in parser._actions for flag in action.option_strings}
  checked, seen = 0, set()
  for name, core in method_args.CORE.items():
    docs = methods.field_docs(core)
    for flag, field in method_args.setting_flags(core):
      if flag in seen:      # a flag two methods share: the first method's field explains it
        continue
      seen.add(flag)
      override = field.metadata.get("cli_help")
      text = (override or docs[field.name]).rstrip(".").replace("%", "%%")
      assert text and helps[flag].startswith(text), (name, flag)
      checked += 1
  assert checked >= 10
