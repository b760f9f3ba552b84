"""The model input is `inputs` everywhere (issue 36); the public entry points still take its
old keyword, `encoder_tokens` (and `drafter_encoder_tokens`, `small_encoder_tokens`), with a
DeprecationWarning; both names at once is an InputError.

Model-free: a Model without weights, and a request whose token -3 is refused before any
trace, so the error proves which argument the value reached."""

import warnings

import numpy as np
import pytest

import specdec_jax as sd

pytestmark = pytest.mark.unit

M = sd.Model(config=sd.get_config("t5_1_1_tiny"), params=None)     # checks only, no weights
GOOD = np.array([[5, 6, 1]], np.int32)
BAD = np.array([[5, -3, 1]], np.int32)                            # refused, naming row 0
REFUSED = "row 0 holds token id -3"

CALLS = {
    "decode": lambda **kw: sd.decode(M, sd.Autoregressive(), **kw),
    "lower": lambda **kw: sd.lower(M, sd.Autoregressive(), max_new_tokens=2, **kw),
    "generate": lambda **kw: sd.generate(M, **kw),
    "speculative_generate": lambda **kw: sd.speculative_generate(M, M, **kw),
    "bild_generate": lambda **kw: sd.bild_generate(M, M, **kw),
    "blockwise_generate": lambda **kw: sd.blockwise_generate(M, None, **kw),
    "Model.forward": lambda **kw: M.forward(decoder_input_tokens=np.zeros((1, 1), np.int32),
                                            **kw),
    "speculative_generate, drafter": lambda **kw: sd.speculative_generate(M, M, GOOD, **kw),
    "bild_generate, small": lambda **kw: sd.bild_generate(M, M, GOOD, **kw),
}
CASES = [(name, "encoder_tokens", "inputs") for name in list(CALLS)[:7]] + [
    ("speculative_generate, drafter", "drafter_encoder_tokens", "drafter_inputs"),
    ("bild_generate, small", "small_encoder_tokens", "small_inputs")]


@pytest.mark.parametrize("name, old, new", CASES)
def test_the_old_keyword_reaches_the_new_one_with_a_warning(name, old, new):
  with pytest.warns(DeprecationWarning, match=f"{old}= is deprecated, pass {new}="), \
       pytest.raises(sd.InputError, match=REFUSED):
    CALLS[name](**{old: BAD})


@pytest.mark.parametrize("name, old, new", CASES)
def test_the_new_keyword_works_without_a_warning(name, old, new):
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with pytest.raises(sd.InputError, match=REFUSED):
      CALLS[name](**{new: BAD})


@pytest.mark.parametrize("name, old, new", CASES)
def test_both_names_at_once_is_an_input_error(name, old, new):
  with pytest.raises(sd.InputError, match=f"got both {new} and {old}"):
    CALLS[name](**{old: GOOD, new: GOOD})


def test_the_new_name_by_position_and_the_old_by_keyword_is_an_input_error():
  with pytest.raises(sd.InputError, match="generate: got both inputs and encoder_tokens"):
    sd.generate(M, GOOD, encoder_tokens=GOOD)


@pytest.mark.parametrize("make, old, new", [
    (lambda **kw: sd.Speculative(None, **kw), "drafter_encoder_tokens", "drafter_inputs"),
    (lambda **kw: sd.BiLD(None, **kw), "small_encoder_tokens", "small_inputs")])
def test_method_fields_take_their_old_names(make, old, new):
  with pytest.warns(DeprecationWarning, match=f"{old}= is deprecated, pass {new}="):
    method = make(**{old: GOOD})
  assert getattr(method, new) is GOOD
  with pytest.raises(sd.InputError, match=f"got both {new} and {old}"):
    make(**{old: GOOD, new: GOOD})
