"""The first run talks and the second is fast: `specdec decode` announces its compilations
and the kernel build on stderr, keeps compiled programs in a per-user persistent cache (so
a second run compiles nothing for the decode), which `--no-compile-cache` and
SPECDEC_COMPILE_CACHE=0 turn off; prompts of nearby lengths share a compiled width."""

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import REPO_DIR

import specdec_jax as sd
from specdec_jax import cli, compilation
from specdec_jax.batching import prompt_batches
from specdec_jax.cli import decode
from specdec_jax.kernels import build, dispatch
from specdec_jax.models import packing
from specdec_jax.runtime import decode_setup, jobs

TARGET = "config:t5_1_1_tiny"
READY = re.compile(r"^specdec: ready in [0-9.]+ s: (\d+) compiled, (\d+) from the cache$",
                   re.M)


@pytest.mark.slow
def test_progress_lines_go_to_stderr_and_stdout_stays_the_output(capsys):
  code = cli.main(["decode", "--model", TARGET, "--max-new-tokens", "3", "--json", "5 17 1"])
  out, err = capsys.readouterr()
  assert code == 0, err
  json.loads(out)                                   # nothing but the JSON on stdout
  assert "specdec: preparing the decode programs for batch 1 (" in err
  ready = READY.search(err)
  assert ready and ready.start() > err.index("preparing the decode programs")
  assert "preparing" not in out and "first run only" not in err


def test_the_kernel_build_is_announced(capsys):
  compilation.announce_kernel_build()
  compilation.announce_kernel_build()       # once: no second handler
  logging.getLogger(build.__name__).info("specdec_jax: building the CPU decode kernels "
                                         "(first run only; cached in %s)", "/x")
  err = capsys.readouterr().err
  assert err == "specdec: building the CPU decode kernels (first run only; cached in /x)\n"


def test_cache_directory_is_per_user_and_switches_off(monkeypatch, tmp_path, capsys):
  monkeypatch.delenv("SPECDEC_CACHE_DIR", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert compilation.cache_dir() == str(tmp_path / "xdg" / "specdec_jax" / "jax")
  monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "mine"))
  assert compilation.cache_dir() == str(tmp_path / "mine" / "jax")
  monkeypatch.delenv(compilation.ENV_VAR, raising=False)
  assert not compilation.switched_off() and compilation.switched_off(False)
  for off in ("0", "off", "False"):
    monkeypatch.setenv(compilation.ENV_VAR, off)
    assert compilation.switched_off()
  monkeypatch.setenv(compilation.ENV_VAR, "1")
  assert not compilation.switched_off()
  # the flag reaches the job, which asks for no cache and says so when it compiles
  asked = []
  monkeypatch.setattr(jobs, "use_persistent_cache", lambda flag: asked.append(flag))
  for flags in ([], ["--no-compile-cache"]):
    args = cli.build_parser().parse_args(["decode", "--model", TARGET, *flags])
    decode_setup.job_of(decode.from_args(args)[1]).start()
  assert asked == [True, False]
  capsys.readouterr()
  with compilation.compiling("the programs", None):
    pass
  assert "specdec: preparing the programs (compilation cache off: compiled on every run)" in (
      capsys.readouterr().err)
  # switched off, by the flag or the environment: JAX's cache is disabled (restored after:
  # the suite uses its own cache). A script's `sd.use_compilation_cache()` is the function
  # `specdec` calls: the second run below reads back for both.
  assert sd.use_compilation_cache is compilation.use_persistent_cache
  was = jax.config.jax_enable_compilation_cache
  try:
    assert compilation.use_persistent_cache(False) is None
    assert jax.config.jax_enable_compilation_cache is False
    jax.config.update("jax_enable_compilation_cache", True)
    monkeypatch.setenv(compilation.ENV_VAR, "0")
    assert sd.use_compilation_cache() is None
    assert jax.config.jax_enable_compilation_cache is False
  finally:
    jax.config.update("jax_enable_compilation_cache", was)


@pytest.mark.slow
def test_packing_a_model_compiles_no_random_init():
  """`pack_model` finds the decode products by an abstract trace; run under compile-time
  eval it executed the model's random init op by op (84 programs for the tiny T5, 15 now)."""
  config = dataclasses.replace(sd.get_config("t5_1_1_tiny"), vocab_size=576)   # a new config
  model = sd.init_model(config, 0)
  with compilation.counting() as count:
    packed = packing.pack_model(model, dispatch.Policy("cpu", "test"))
  assert packed.decode_weights is not None
  random = [n for n in count.names if "normal" in n or "uniform" in n or "threefry" in n]
  assert random == [] and count.requests < 30, count.names


def test_nearby_prompt_lengths_share_one_compiled_width():
  tokens = np.zeros((4, 13), np.int32)
  for i, n in enumerate((8, 13, 9, 9)):           # README's main command's prompt lengths
    tokens[i, :n - 1], tokens[i, n - 1] = 5, 1
  widths = {b.tokens.shape[1] for b in prompt_batches(tokens, None, 1)[0]}
  assert widths == {8, 13}                         # not {8, 9, 13}; never past the input
  lm, _ = prompt_batches(tokens, np.array([3, 9, 10, 11]), 1)
  assert [b.tokens.shape[1] for b in lm] == [8, 13, 13, 13]


@pytest.mark.slow
def test_bucketed_batches_decode_as_the_unpadded_prompts(capsys):
  """The pad columns a bucket adds leave each row's output as decoding it alone."""
  prompts = ["5 17 1", "7 8 9 11 12 13 14 15 1"]
  code = cli.main(["decode", "--model", TARGET, "--max-new-tokens", "5", "--batch-size", "1",
                   "--json", *prompts])
  out, err = capsys.readouterr()
  assert code == 0, err
  target = sd.load(TARGET)
  for text, row in zip(prompts, json.loads(out)["outputs"], strict=True):
    enc = np.array([[int(t) for t in text.split()]], np.int32)
    alone = sd.decode(target, sd.Autoregressive(), enc, max_new_tokens=5)
    assert row == np.asarray(alone.tokens)[0, :int(alone.lengths[0])].tolist()


def _decode_child(cache_home, *extra):
  environment = {k: v for k, v in os.environ.items()
                 if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
  environment.update(SPECDEC_CACHE_DIR=str(cache_home), SPECDEC_CPU_KERNELS="0",
                     PYTHONPATH=os.pathsep.join([str(REPO_DIR), os.environ.get("PYTHONPATH",
                                                                                 "")]))
  run = subprocess.run([sys.executable, "-m", "specdec_jax.cli", "decode", "--model",
                        TARGET, "--max-new-tokens", "3", *extra, "5 17 42 1"],
                       env=environment, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  compiled, cached = map(int, READY.search(run.stderr).groups())
  return run.stdout, run.stderr, compiled, cached


@pytest.mark.slow
def test_second_run_compiles_nothing_and_the_switch_turns_the_cache_off(tmp_path):
  first, err, compiled, cached = _decode_child(tmp_path)
  jax_dir = tmp_path / "jax"
  assert f"(compiled once, then read back from {jax_dir})" in err and compiled > 0
  entries = len(os.listdir(jax_dir))
  assert entries > 0
  second, _, compiled2, cached2 = _decode_child(tmp_path)
  assert (compiled2, second) == (0, first) and cached2 > 0     # read back, not compiled
  assert len(os.listdir(jax_dir)) == entries                  # and nothing added
  # switched off (--no-compile-cache, SPECDEC_COMPILE_CACHE=0): the job asks for no cache,
  # which turns JAX's off: test_cache_directory_is_per_user_and_switches_off
