"""Compiling once from a script (issue 38): prompt widths in buckets (`sd.pad_to_bucket`).
The persistent compilation cache (`sd.use_compilation_cache`, which `specdec` calls
itself): tests/test_cli_first_run.py."""

import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import compilation


@pytest.fixture(scope="module")
def tiny():
  return sd.load("config:t5_1_1_tiny")


def test_pad_to_bucket_widths_and_pad_ids():
  rows = np.array([[5, 6, 1, 0, 0, 0, 0, 0, 0, 0, 0]])
  assert sd.pad_to_bucket(rows).shape == (1, 8)            # trimmed to its bucket
  assert sd.pad_to_bucket(np.ones((2, 9), np.int32)).shape == (2, 16)
  assert sd.pad_to_bucket(np.ones((2, 17), np.int32)).shape == (2, 32)
  out = sd.pad_to_bucket(np.array([[3, 4, 9, 9]]), pad_id=9)   # an LM padding with its id
  assert out.tolist() == [[3, 4] + [9] * 6]
  with pytest.raises(sd.InputError, match="int token ids"):
    sd.pad_to_bucket(np.ones((2, 3), np.float32))


@pytest.mark.slow
def test_bucketed_prompts_compile_once_and_decode_alike(tiny):
  """Batches of widths 3 and 5 bucketed to 8: one decode program for both, the same tokens
  as each batch decoded at its own width."""
  a = np.array([[5, 6, 1], [7, 1, 0]], np.int32)
  b = np.array([[8, 9, 10, 11, 1], [12, 1, 0, 0, 0]], np.int32)
  method = sd.Autoregressive(exact=False)
  plain = [sd.decode(tiny, method, x, max_new_tokens=4).tokens for x in (a, b)]
  sd.decode(tiny, method, sd.pad_to_bucket(a), max_new_tokens=4)       # compile width 8
  with compilation.counting() as count:
    bucketed = [sd.decode(tiny, method, sd.pad_to_bucket(x), max_new_tokens=4).tokens
                for x in (a, b)]
  assert count.requests == 0          # the second width reuses the first one's program
  for p, q in zip(plain, bucketed, strict=True):
    np.testing.assert_array_equal(np.asarray(p), np.asarray(q))
  with compilation.counting() as count:   # control: a new width is a new program
    sd.decode(tiny, method, np.array([[5, 6, 7, 8, 9, 10, 1]], np.int32), max_new_tokens=4)
  assert count.requests >= 1

