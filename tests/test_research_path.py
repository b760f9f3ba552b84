"""The research user's path (issue 38): decoding inside the user's own jit / vmap, and
requests that would otherwise come out silently wrong (non-finite weights, ids past the
vocabulary, a cache too small for a T5X drop-in call, absurd sizes), plus the smaller
items (dtype objects, file modes, beam search's statistics, BiLD's exact limit)."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

import specdec_jax as sd
from specdec_jax.io import checkpoints
from specdec_jax.io.checkpoints import finite
from specdec_jax.methods import bild, t5x_compat
from specdec_jax.rounds import requests
from specdec_jax.rounds import stats as stats_lib

ENC = np.array([[5, 6, 7, 1], [8, 9, 1, 0]], np.int32)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model():
  return sd.load("config:t5_1_1_tiny")


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory):
  """The tiny T5 written by sd.save (a fresh copy per test: `_copy`)."""
  path = tmp_path_factory.mktemp("saved") / "model"
  sd.save(path, model)
  return path


def _copy(saved, tmp_path):
  import shutil
  return shutil.copytree(saved, tmp_path / "copy")


# ----------------------------------------------------------------------------- jit safety

# Each order in a fresh process: a key cached while tracing is only caught by whatever
# decodes next in the same process.
_SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    import specdec_jax as sd
    m = sd.load("config:t5_1_1_tiny")
    enc = jnp.array([[5, 6, 7, 1], [8, 9, 1, 0]], jnp.int32)
    S = sd.Sampling(temperature=0.8)
    fns = {
        "greedy": lambda e: sd.decode(m, sd.Autoregressive(), e, max_new_tokens=4).tokens,
        "seed": lambda e: sd.decode(m, sd.Autoregressive(), e, max_new_tokens=4, sampling=S,
                                    rng=3).tokens,
    }
    how = {
        "eager": lambda f: f(enc),
        "jit": lambda f: jax.jit(f)(enc),
        # two copies of the batch under vmap: each must be the eager batch's output
        "vmap": lambda f: jax.vmap(f)(jnp.stack([enc, enc])),
    }
    got = {}
    for step in sys.argv[1].split(","):
      for name, f in fns.items():
        out = np.asarray(how[step](f))
        for row in (out if step == "vmap" else [out]):
          got.setdefault(name, []).append((step, row))
    for name, runs in got.items():
      for step, row in runs[1:]:
        np.testing.assert_array_equal(row, runs[0][1], err_msg=f"{name}: {step}")
    print("same tokens:", sys.argv[1])
""")


@pytest.mark.slow
def test_decode_inside_vmap_first_then_eager_and_jit():
  """The first greedy decode of a process, or the first use of a seed, inside the user's
  vmap: every later decode still works and gives the same tokens (a key cached while
  tracing was a leaked tracer: UnexpectedTracerError in every later decode). A seed's key
  first made under jit: the next test, in this process."""
  order = "vmap,eager,jit"
  env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  done = subprocess.run([sys.executable, "-c", _SCRIPT, order], capture_output=True, text=True,
                        env=env, cwd=ROOT, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"same tokens: {order}" in done.stdout


def test_seed_key_built_under_jit_is_not_reused_eagerly():
  """The in-process core of the test above, without a model: a seed first turned into a
  key while tracing, then eagerly."""
  seed = 918_273     # a seed no other test uses: a memo would be cold
  traced = jax.jit(lambda: requests.as_rng(seed))()
  eager = requests.as_rng(seed)
  assert not isinstance(eager, jax.core.Tracer)
  np.testing.assert_array_equal(eager + 0, traced)
  jax.vmap(lambda x: x + requests.as_rng(seed + 1)[0])(jnp.ones(2, jnp.uint32))
  assert not isinstance(requests.as_rng(seed + 1), jax.core.Tracer)
  assert not isinstance(requests.as_rng(None), jax.core.Tracer)     # greedy's default key


@pytest.mark.slow
def test_target_as_an_argument_of_the_users_jit(model):
  """The model a traced argument, and heads made inside the trace: blockwise decoding's
  check that the heads fit the model cannot read traced weights, and skips it."""
  enc = jnp.asarray(ENC)
  want = sd.generate(model, ENC, 3).tokens
  heads = sd.init_heads(model, 3)
  for make in (lambda t: sd.Autoregressive(), lambda t: sd.Blockwise(heads),
               lambda t: sd.Blockwise(sd.init_heads(model, 3))):
    got = jax.jit(lambda t, e, make=make: sd.decode(t, make(t), e, max_new_tokens=3).tokens)(
        model, enc)
    np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- finite weights

def _nan_in(path, name: str, value=np.nan) -> None:
  file = path / "params.safetensors"
  tensors = safetensors.numpy.load_file(str(file))
  bad = tensors[name].copy()
  bad.reshape(-1)[3] = value
  tensors[name] = bad
  safetensors.numpy.save_file(tensors, str(file), metadata={"format": "specdec-jax"})


def test_load_refuses_a_nan_parameter_and_names_it(saved, tmp_path):
  path = _copy(saved, tmp_path)
  name = "decoder/layers_1/mlp/wi_0/kernel"
  _nan_in(path, name)
  with pytest.raises(sd.CheckpointError, match=f"parameter '{name}' holds non-finite values "
                                               r"\(1 NaN, 0 inf of \d+\)") as e:
    sd.load(str(path))
  assert "check_finite=False" in str(e.value)
  loaded = sd.load(str(path), check_finite=False)
  kernel = loaded.params["decoder"]["layers_1"]["mlp"]["wi_0"]["kernel"]
  assert np.isnan(np.asarray(kernel)).sum() == 1


def test_load_refuses_0xff_bytes_in_the_payload(saved, tmp_path):
  """A damaged block of the file (0xff bytes: NaN in float32) in its last tensor's data."""
  path = _copy(saved, tmp_path)
  file = path / "params.safetensors"
  data = bytearray(file.read_bytes())
  header_len = int.from_bytes(data[:8], "little")
  header = json.loads(data[8:8 + header_len])
  last = max((k for k in header if k != "__metadata__"),
             key=lambda k: header[k]["data_offsets"][1])
  end = 8 + header_len + header[last]["data_offsets"][1]
  data[end - 64:end] = b"\xff" * 64
  file.write_bytes(bytes(data))
  with pytest.raises(sd.CheckpointError, match=f"parameter '{last}' holds non-finite"):
    sd.load(str(path))
  with pytest.raises(sd.CheckpointError):
    sd.load(str(path), dtype=None)          # as stored: still checked
  sd.load(str(path), check_finite=False)


def test_finite_check_inf_overflow_and_device_arrays():
  big = np.full((4, 4), 3e38, np.float32)   # finite, but its float32 sum overflows
  ok = {"a": {"kernel": big}, "ids": np.array([1, 2], np.int32)}
  finite.check_finite(ok, "big")
  for holder in (np.asarray, jnp.asarray):   # host arrays, and device arrays (a mesh load)
    bad = {"a": {"kernel": holder(big)}, "b": {"scale": holder(np.array([1.0, -np.inf]))}}
    assert finite.first_nonfinite(bad) == "b/scale"
    with pytest.raises(sd.CheckpointError, match=r"'b/scale' .* \(0 NaN, 1 inf of 2\)"):
      finite.check_finite(bad, "here")
  with pytest.raises(sd.InputError, match="check_finite must be True or False"):
    sd.load("config:t5_1_1_tiny", check_finite="no")


@pytest.mark.slow
def test_load_onto_a_mesh_checks_the_shards(saved, tmp_path):
  path = _copy(saved, tmp_path)
  _nan_in(path, "encoder/relpos_bias/rel_embedding")
  mesh = sd.make_mesh(data=2, model=4)
  with pytest.raises(sd.CheckpointError, match="'encoder/relpos_bias/rel_embedding'"):
    sd.load(str(path), mesh=mesh)
  sd.load(str(path), mesh=mesh, check_finite=False)


# ----------------------------------------------------------------------------- token ids

def test_ids_outside_the_vocabulary_name_the_row_id_and_vocab_size(model):
  v = model.config.vocab_size
  bad = ENC.copy()
  bad[1, 1] = v + 7
  with pytest.raises(sd.InputError, match=rf"inputs row 1 holds token id {v + 7} "
                                          rf"\(column 1\), outside .*vocab_size {v}"):
    sd.generate(model, bad, 2)
  bad[0, 2] = -4
  with pytest.raises(sd.InputError, match=r"row 0 holds token id -4 .* 2 such ids"):
    sd.decode(model, sd.Speculative(model, gamma=2), bad, 2)
  lm = sd.init_model(sd.get_config("llama_tiny"), 0)
  prompt = np.array([[5, 6, 7], [8, lm.config.vocab_size, 0]], np.int32)
  with pytest.raises(sd.InputError, match=rf"prompt tokens row 1 holds token id "
                                          rf"{lm.config.vocab_size}"):
    sd.generate(lm, prompt, 2)


@pytest.mark.slow
def test_ids_are_not_checked_under_the_users_jit(model):
  """Traced ids cannot be read: the check is skipped, the decode runs."""
  bad = jnp.asarray(ENC).at[1, 1].set(model.config.vocab_size + 7)
  out = jax.jit(lambda e: sd.generate(model, e, 2).tokens)(bad)
  assert out.shape == (2, 2)


# ----------------------------------------------------------------------------- T5X drop-in

@pytest.mark.parametrize("fn", ["temperature_sample", "beam_search"])
def test_t5x_drop_in_refuses_a_cache_smaller_than_the_decode(model, fn):
  length = 10
  call = getattr(t5x_compat, fn)
  kwargs = {"temperature": 0.0} if fn == "temperature_sample" else {"num_decodes": 2}
  cache = model.start(jnp.asarray(ENC), capacity=length - 1)
  with pytest.raises(sd.InputError, match=rf"{fn}: the cache holds {length - 1} positions, "
                                          rf"the decode needs {length}"):
    call(jnp.zeros((2, length), jnp.int32), cache, t5x_compat.tokens_to_logits_for(model),
         eos_id=1, **kwargs)
  with pytest.raises(sd.InputError, match=f"needs {length}"):     # under jit: shapes suffice
    jax.jit(lambda c: call(jnp.zeros((2, length), jnp.int32), c,
                           t5x_compat.tokens_to_logits_for(model), eos_id=1, **kwargs))(cache)
  if fn == "beam_search":    # max_decode_len, not the inputs' width, sets the length
    with pytest.raises(sd.InputError, match="needs 12"):
      call(jnp.zeros((2, length), jnp.int32), model.start(jnp.asarray(ENC), capacity=11),
           t5x_compat.tokens_to_logits_for(model), eos_id=1, max_decode_len=12, **kwargs)


def test_t5x_flax_cache_capacity_is_its_cached_key_length():
  """A T5X flax cache: cached_key [B, heads, head_dim, length]."""
  cache = {"decoder": {"layers_0": {"self_attention": {
      "cached_key": jnp.zeros((2, 1, 4, 5)), "cached_value": jnp.zeros((2, 1, 4, 5)),
      "cache_index": jnp.zeros((), jnp.int32)}}}}
  with pytest.raises(sd.InputError, match="holds 5 positions, the decode needs 6"):
    t5x_compat.temperature_sample(jnp.zeros((2, 6), jnp.int32), cache, None, eos_id=1)
  t5x_compat.check_capacity(cache, 5, "x")
  t5x_compat.check_capacity({"t": jnp.zeros(2)}, 100, "x")     # a callback's own state


# ----------------------------------------------------------------------------- sizes

@pytest.mark.parametrize("make,limit", [
    (lambda n: sd.Speculative(None, gamma=n), 64),
    (lambda n: sd.BiLD(None, max_small_steps=n), 64),
    (lambda n: sd.Blockwise(None, top_k=n), 64),
    (lambda n: sd.Blockwise(None, num_drafts=n), 64),
    (lambda n: sd.Beam(num_beams=n), 128),
])
def test_size_settings_have_an_upper_bound(make, limit):
  make(limit)
  for bad in (limit + 1, 100_000):
    with pytest.raises(sd.InputError, match=rf"={bad} is above the limit of {limit} \("):
      make(bad)


@pytest.mark.slow
def test_lattice_k_past_a_small_vocabulary_is_still_refused():
  """Under the bound, top_k is also checked against the vocabulary (a model of 32 ids)."""
  small = sd.init_model(sd.get_config("t5_1_1_tiny", vocab_size=32), 0)
  with pytest.raises(sd.InputError, match="top_k=40 exceeds the vocabulary size 32"):
    sd.blockwise_generate(small, sd.init_heads(small, 3), ENC, 4, top_k=40)


def test_gamma_bound_through_the_functional_wrapper_and_max_new_tokens(model):
  with pytest.raises(sd.InputError, match="gamma=100000 is above the limit of 64"):
    sd.speculative_generate(model, model, ENC, gamma=100_000, max_new_tokens=4)
  with pytest.raises(sd.InputError, match=rf"max_new_tokens={2**20 + 1} is above the limit"):
    sd.generate(model, ENC[:1], 2**20 + 1)     # 1 GiB of cache: passes the memory check
  with pytest.raises(sd.InputError, match="max_small_steps=65 is above"):
    sd.bild_generate(model, model, ENC, max_new_tokens=4, max_small_steps=65)


# ----------------------------------------------------------------------------- smaller items

def test_load_takes_dtype_objects(saved):
  for dtype, name in ((jnp.bfloat16, "bfloat16"), (np.float16, "float16"),
                      (jnp.dtype("float32"), "float32")):
    m = sd.load(str(saved), dtype=dtype)
    assert m.config.dtype == name
    assert {x.dtype.name for x in jax.tree_util.tree_leaves(m.params)} == {name}
  with pytest.raises(sd.InputError, match="dtype must be one of"):
    sd.load(str(saved), dtype=np.int32)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_saved_weight_files_honour_the_umask(model, tmp_path, mask):
  old = os.umask(mask)
  try:
    sd.save(tmp_path / "ours", model)
    checkpoints.export_hf(tmp_path / "hf", model.config, model.params)
    lm = sd.init_model(sd.get_config("llama_tiny"), 0)
    checkpoints.export_hf(tmp_path / "hf_lm", lm.config, lm.params)
    heads = sd.save_heads(tmp_path / "heads.safetensors", sd.init_heads(model, 2))
  finally:
    os.umask(old)
  want = 0o666 & ~mask
  files = [tmp_path / "ours" / "params.safetensors", tmp_path / "hf" / "model.safetensors",
           tmp_path / "hf_lm" / "model.safetensors", heads]
  assert {str(f): f.stat().st_mode & 0o777 for f in files} == {str(f): want for f in files}


def test_beam_statistics_are_beam_searchs_own(model):
  info = {"method": "beam", "num_beams": 2}
  summary = stats_lib.summarize(stats_lib.DecodeStats.zeros(2, 0), info,
                                statistics=sd.Beam.statistics)
  assert set(summary) - set(info) == {"rows", "tokens", "rounds", "target_calls"}
  out = sd.decode(model, sd.Beam(num_beams=2), ENC, max_new_tokens=3)
  stats = out.stats
  assert set(stats) - set(dict(out.info)) == {"rows", "tokens", "rounds", "target_calls"}
  assert stats["tokens"] == int(np.sum(out.lengths)) and stats["rows"] == 2
  assert "tokens_per_target_call" not in stats and "alpha" not in stats


def test_bild_at_fallback_one_is_labelled_exact():
  info = lambda f: dict(bild.round_config(f, 2.0, 4, 8).info)
  assert info(1.0)["lossy"] is False
  assert info(0.999)["lossy"] is True and info(0.0)["lossy"] is True
