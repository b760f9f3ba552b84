"""The Python API warns or refuses where the CLI does: a T5 input without EOS (a warning,
once), a left-padded decoder-only prompt given without lengths (refused, naming the fix),
and the platform names users type to `sd.lower` ("gpu" is CUDA)."""

import warnings

import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax.rounds import requests

T = 3


@pytest.fixture(scope="module")
def t5():
  return sd.load("config:t5_1_1_tiny", kernels="xla")


@pytest.fixture(scope="module")
def lm():
  return sd.load("config:llama_tiny", kernels="xla")


@pytest.fixture()
def fresh(monkeypatch):
  """No InputWarning given yet in this process."""
  monkeypatch.setattr(requests, "_WARNED", set())


@pytest.mark.slow
def test_a_t5_input_without_eos_warns_once(t5, fresh):
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    sd.generate(t5, np.array([[5, 6, 1], [7, 8, 0]], np.int32), T)     # row 1: no EOS
    sd.generate(t5, np.array([[9, 8, 7]], np.int32), T)
  given = [w for w in seen if issubclass(w.category, sd.InputWarning)]
  assert len(given) == 1
  assert "inputs row 1 does not end in EOS (1)" in str(given[0].message)
  assert given[0].filename == __file__            # it points at the caller's line


def test_eos_terminated_inputs_give_no_warning(t5, fresh):
  with warnings.catch_warnings():
    warnings.simplefilter("error", sd.InputWarning)
    sd.generate(t5, np.array([[5, 6, 1], [7, 1, 0]], np.int32), T)


def test_left_padded_prompts_without_lengths_are_refused_with_the_fix(lm):
  left = np.array([[0, 0, 5, 6], [7, 8, 9, 10]], np.int32)    # Hugging Face's padding_side="left"
  with pytest.raises(sd.InputError, match=r"prompt rows \[0\] look left-padded.*"
                                          r"Right-pad them and pass prompt_lengths"):
    sd.generate(lm, left, T)
  # right-padded, or with the lengths said, decodes
  right = np.array([[5, 6, 0, 0], [7, 8, 9, 10]], np.int32)
  sd.generate(lm, right, T)
  sd.generate(lm, left, T, prompt_lengths=np.array([4, 4], np.int32))


@pytest.mark.parametrize("typed", [("gpu",), ("GPU",), ("cuda",)])
def test_lower_reads_gpu_as_cuda(t5, typed):
  enc = np.array([[5, 6, 1]], np.int32)
  lowered = sd.lower(t5, sd.Autoregressive(), enc, max_new_tokens=T, platforms=typed)
  assert "stablehlo.while" in lowered.as_text()


def test_lower_names_the_platforms_it_knows(t5):
  enc = np.array([[5, 6, 1]], np.int32)
  with pytest.raises(sd.InputError, match=r"unknown platform 'metal': lower for one of cpu, "
                                          r"cuda, rocm, tpu .*no such device is needed"):
    sd.lower(t5, sd.Autoregressive(), enc, max_new_tokens=T, platforms=("metal",))
