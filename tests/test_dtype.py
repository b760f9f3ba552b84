"""Compute dtype end to end: one argument sets params and activations; direct bf16 init."""

import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from helpers import users_xla_env

import specdec_jax as sd


@pytest.mark.slow
def test_direct_bf16_init_matches_the_float32_initialiser_leaf_by_leaf():
  """T5 1.1's leaves (one layer a side holds every kind of leaf: embedding, relative
  position biases, self- and cross-attention, gated MLP, norms, logits), drawn directly in
  bfloat16, have the float32 initialiser's distribution (small's layout, narrowed: the
  initialiser's scales follow the shapes)."""
  cfg = sd.get_config("t5_1_1_small", num_encoder_layers=1, num_decoder_layers=1,
                      vocab_size=8192, emb_dim=128, mlp_dim=256)
  f32 = flatten_dict(sd.init_model(cfg, 0).params)
  bf16 = sd.init_model(cfg, 0, "bfloat16")
  assert bf16.config.dtype == "bfloat16"
  direct = flatten_dict(bf16.params)
  assert direct.keys() == f32.keys()
  for path, x in f32.items():
    y = direct[path]
    assert y.dtype == jnp.bfloat16 and y.shape == x.shape, path
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.std() == 0:                         # norm scales: ones
      np.testing.assert_array_equal(y, x)
      continue
    # Same distribution: means and stds within 5 standard errors of their difference
    # (two samples of n values: se(mean) ~ std sqrt(2/n), relative se(std) ~ 1/sqrt(n)).
    n = x.size
    assert abs(y.mean() - x.mean()) < 5 * x.std() * np.sqrt(2 / n), path
    assert abs(y.std() / x.std() - 1) < 5 / np.sqrt(n), path
    assert not np.array_equal(y, x)          # drawn anew, not cast from the float32 init


@pytest.mark.slow
@pytest.mark.soak     # a real process's peak memory; most of its 20 s is drawing 783M numbers
def test_direct_bf16_init_peak_memory_is_below_the_float32_size():
  """T5 1.1 large (783M params, 3.1 GB in float32): the process grows by less than that.
  The child compiles at XLA's own level (`users_xla_env`): its time is drawing 783M random
  numbers, which code compiled at the suite's level 0 does 3x slower (47 s against 17 s)."""
  script = textwrap.dedent("""
      import resource, jax, specdec_jax as sd
      jax.block_until_ready(sd.init_model(sd.get_config("t5_1_1_tiny"), 0, "bfloat16").params)
      with open("/proc/self/statm") as f:      # resident pages now
        before = int(f.read().split()[1]) * resource.getpagesize()
      m = sd.load("config:t5_1_1_large", dtype="bfloat16", kernels="xla")   # no packed copy
      jax.block_until_ready(m.params)
      # VmHWM: this address space's peak. Not ru_maxrss: Linux carries that over exec
      # from the parent (pytest, several GB by then), so it read 4.2 GB in CI.
      with open("/proc/self/status") as f:
        peak = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) * 1024
      print(peak - before, 4 * m.num_params(), 2 * m.num_params())
  """)
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       cwd=pathlib.Path(__file__).parent, env=users_xla_env())
  assert out.returncode == 0, out.stderr[-3000:]
  growth, f32_bytes, bf16_bytes = map(int, out.stdout.split())
  print(f"growth {growth / 1e9:.2f} GB, float32 size {f32_bytes / 1e9:.2f} GB, "
        f"bfloat16 size {bf16_bytes / 1e9:.2f} GB")
  assert bf16_bytes <= growth < f32_bytes, (growth, f32_bytes, bf16_bytes)


@pytest.mark.slow
def test_load_dtype_sets_params_and_activations():
  """`dtype=` sets the params and the config's compute dtype; what a bfloat16 config
  computes in (float32 logits, a bfloat16 cache) is
  test_model.py::test_bfloat16_activations_track_float32's. On XLA's ops: packing for
  the kernels copies the weights and is no part of the dtype."""
  model = sd.load("demo-de-en/target", dtype="bfloat16", kernels="xla")
  assert model.config.dtype == "bfloat16"
  assert {x.dtype for x in jax.tree_util.tree_leaves(model.params)} == {jnp.dtype("bfloat16")}
  kept = sd.load("demo-de-en/target", dtype=None, kernels="xla")   # as stored: bfloat16 params
  assert kept.config.dtype == "float32"
  assert {x.dtype for x in jax.tree_util.tree_leaves(kept.params)} == {jnp.dtype("bfloat16")}
  f32 = sd.load("demo-de-en/target", kernels="xla")
  assert f32.config.dtype == "float32"
  assert {x.dtype for x in jax.tree_util.tree_leaves(f32.params)} == {jnp.dtype("float32")}
  with pytest.raises(sd.InputError, match="dtype must be one of float32, bfloat16"):
    sd.load("demo-de-en/target", dtype="bfloat17")
