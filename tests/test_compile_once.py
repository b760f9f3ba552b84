"""Compiling once from a script (issue 38): prompt widths in buckets (`sd.pad_to_bucket`)
and the persistent compilation cache for library users (`sd.use_compilation_cache`)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import REPO_DIR

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


SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import specdec_jax as sd
    from specdec_jax import compilation
    where = sd.use_compilation_cache()
    with compilation.counting() as count:
      target = sd.load("config:t5_1_1_tiny", kernels="xla")
      sd.decode(target, sd.Speculative(target, gamma=2), np.array([[5, 6, 1]]),
                max_new_tokens=3)
    print(json.dumps({"where": where, "compiled": count.compiled, "cached": count.cached}))
""")


@pytest.mark.slow
def test_a_scripts_second_run_reads_its_programs_from_the_cache(tmp_path):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
  env.update(SPECDEC_CACHE_DIR=str(tmp_path / "cache"), JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([str(REPO_DIR), env.get("PYTHONPATH", "")]))
  runs = []
  for _ in range(2):
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
  first, second = runs
  assert first["where"] == str(tmp_path / "cache" / "jax")
  assert first["compiled"] > 0 and first["cached"] == 0
  assert second["compiled"] == 0 and second["cached"] == first["compiled"]
  env["SPECDEC_COMPILE_CACHE"] = "0"                 # control: switched off, it compiles
  proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                        text=True, timeout=600, cwd=tmp_path)
  off = json.loads(proc.stdout.strip().splitlines()[-1])
  assert off["where"] is None and off["compiled"] > 0 and off["cached"] == 0
