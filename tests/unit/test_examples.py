"""The tests' registry of methods (`specdec_jax.testing.examples`) covers `METHODS`: the
stable ones (`sd.methods.METHODS`) and the experimental ones."""

import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import experimental, testing

pytestmark = pytest.mark.unit


def test_examples_hold_one_value_of_every_method_type():
  table = testing.TableModel(np.zeros((6, 6), np.float32))
  values = testing.examples(table, testing.table_drafter(np.zeros((6, 6), np.float32)),
                            heads="heads")
  assert sorted(type(v).__name__ for v in values.values()) == sorted(
      m.__name__ for m in testing.METHODS)
  assert set(values) == {m.name for m in testing.METHODS}


def test_every_example_names_its_baseline():
  values = testing.examples(None, None, heads="heads")
  for name, value in values.items():
    base = value.baseline()
    assert isinstance(base, (sd.Autoregressive, sd.Beam)), name
    if isinstance(value, (sd.Beam, experimental.SpeculativeBeam)):
      assert (base.num_beams, base.alpha) == (value.num_beams, value.alpha), name
      assert base.exact == value.exact, name     # the same call shape
