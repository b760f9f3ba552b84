"""specdec_jax.io.checkpoints: T5X (legacy, Orbax), Hugging Face, own format, names, errors."""

from __future__ import annotations

import gc
import json
import os
import pathlib
import shutil
import stat
import sys
import time

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts
from flax import serialization

from specdec_jax.config import T5Config
from specdec_jax.io import checkpoints as ckpt
from specdec_jax.io.checkpoints import CheckpointError, hf, resolve, t5x_legacy

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "t5x_tiny_v1_1"
CHUNK = "target.encoder.layers_0.attention.query.kernel"


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
  """The 52 params of the fixture (flat T5X keys), float32."""
  with np.load(FIXTURE / "reference.npz") as npz:
    params = {k: npz[k] for k in npz.files if "/" in k}
  assert len(params) == 52
  return params


@pytest.fixture(scope="module")
def fixture_config() -> T5Config:
  return T5Config.from_dict(json.loads((FIXTURE / "config.json").read_text()))


def writable_copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
  """Copy a fixture dir (its files are read-only) so a test may damage it."""
  shutil.copytree(src, dst)
  for root, dirs, files in os.walk(dst):
    for name in dirs + files:
      path = os.path.join(root, name)
      os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)
  return dst


def assert_params_equal(flat: dict, expected: dict) -> None:
  assert sorted(flat) == sorted(expected)
  for key, value in expected.items():
    assert flat[key].dtype == value.dtype, key
    assert flat[key].shape == value.shape, key
    assert np.array_equal(np.asarray(flat[key]), value), key


# ----------------------------------------------------------------------------- T5X fixture


@pytest.mark.parametrize("relative", ["legacy", "legacy/checkpoint_0"])
def test_legacy_fixture_bit_exact(relative, reference, fixture_config):
  config, params = ckpt.load_checkpoint(str(FIXTURE / relative))
  assert_params_equal(ckpt.flatten(params), reference)
  assert config == fixture_config  # config.json two levels above checkpoint_0


@pytest.mark.parametrize("relative", ["orbax", "orbax/checkpoint_0", "orbax/checkpoint_0/state"])
def test_orbax_fixture_bit_exact(relative, reference, fixture_config):
  config, params = ckpt.load_checkpoint(FIXTURE / relative)
  assert_params_equal(ckpt.flatten(params), reference)
  assert config == fixture_config


def test_config_json_equals_config_inferred_from_shapes(tmp_path, reference, fixture_config):
  inferred = ckpt.infer_config(reference, "reference.npz")
  # float32_attention_logits is a numerics option that no shape reveals: the only field the
  # fixture's config.json sets away from T5Config's default.
  assert inferred == fixture_config.replace(
      float32_attention_logits=inferred.float32_attention_logits)
  # Without a config.json near the checkpoint, load_checkpoint falls back to inference.
  copy = writable_copy(FIXTURE / "legacy", tmp_path / "legacy")
  config, params = ckpt.load_checkpoint(copy)
  assert config == inferred
  assert_params_equal(ckpt.flatten(params), reference)


def test_hf_style_config_json_above_t5x_checkpoints(tmp_path, reference, fixture_config):
  writable_copy(FIXTURE / "legacy", tmp_path / "run")
  hf_config = ckpt.config_to_hf_dict(fixture_config)
  (tmp_path / "run" / "config.json").write_text(json.dumps(hf_config))
  assert ckpt.detect_format(tmp_path / "run") == "t5x_legacy"
  config, params = ckpt.load_checkpoint(tmp_path / "run")
  assert config == ckpt.config_from_hf_dict(hf_config)
  assert config.mlp_activations == fixture_config.mlp_activations
  assert_params_equal(ckpt.flatten(params), reference)


def test_expected_shapes_match_fixture(reference, fixture_config):
  shapes = ckpt.expected_shapes(fixture_config)
  assert shapes == {k: v.shape for k, v in reference.items()}
  assert sum(int(np.prod(s)) for s in shapes.values()) == fixture_config.num_params()


def test_detect_format(tmp_path, reference, fixture_config):
  assert ckpt.detect_format(FIXTURE / "legacy") == "t5x_legacy"
  assert ckpt.detect_format(FIXTURE / "legacy/checkpoint_0") == "t5x_legacy"
  assert ckpt.detect_format(FIXTURE / "orbax") == "t5x_orbax"
  assert ckpt.detect_format(FIXTURE / "orbax/checkpoint_0/state") == "t5x_orbax"
  ckpt.save_checkpoint(tmp_path / "own", fixture_config, ckpt.unflatten(reference))
  assert ckpt.detect_format(tmp_path / "own") == "specdec"
  ckpt.export_hf(tmp_path / "hf", fixture_config, ckpt.unflatten(reference))
  assert ckpt.detect_format(tmp_path / "hf") == "hf"


# ------------------------------------------------------------------------ T5X legacy, synthetic


def _zarr_metadata(array: np.ndarray) -> dict:
  dtype = "bfloat16" if array.dtype == ml_dtypes.bfloat16 else array.dtype.str
  return {"shape": list(array.shape), "chunks": list(array.shape), "dtype": dtype,
          "compressor": {"id": "gzip", "level": 1}}


def write_legacy(step_dir: pathlib.Path, flat: dict, inline=(), gcs_style=False) -> None:
  """A T5X-layout legacy checkpoint: msgpack with zarr specs (+ inline arrays), written with
  tensorstore; optimizer state holds a spec to an array that does not exist (never read)."""
  leaves = {}
  for key, value in flat.items():
    name = "target." + key.replace("/", ".")
    if key in inline:
      leaves[key] = value
      continue
    metadata = _zarr_metadata(value)
    store = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": f"{step_dir}/{name}/"},
                     "metadata": metadata}, create=True).result()
    store.write(value).result()
    if gcs_style:  # what T5X writes on GCS: dummy bucket, top-level relative path
      leaves[key] = {"driver": "zarr", "dtype": metadata["dtype"], "path": name,
                     "kvstore": {"driver": "gcs", "bucket": "t5x-dummy-bucket"},
                     "metadata": metadata}
    else:
      leaves[key] = {"driver": "zarr", "dtype": metadata["dtype"], "metadata": metadata,
                     "kvstore": {"driver": "file", "path": name + "/"}}
  ghost = {"driver": "zarr", "kvstore": {"driver": "file", "path": "state.param_states.ghost/"},
           "metadata": {"shape": [3], "chunks": [3], "dtype": "<f4"}}
  state = {"version": 3, "optimizer": {"target": ckpt.unflatten(leaves),
                                       "state": {"step": np.int32(0),
                                                 "param_states": {"ghost": ghost}}}}
  (step_dir / "checkpoint").write_bytes(serialization.msgpack_serialize(state))


def test_legacy_bfloat16_inline_arrays_and_highest_step(tmp_path, reference):
  bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in reference.items()}
  older = {k: np.zeros_like(v) for k, v in bf16.items()}
  (tmp_path / "checkpoint_5").mkdir()
  (tmp_path / "checkpoint_20").mkdir()
  (tmp_path / "checkpoint_100.tmp-123").mkdir()  # unfinished save: ignored
  write_legacy(tmp_path / "checkpoint_5", older)
  write_legacy(tmp_path / "checkpoint_20", bf16, inline={"encoder/encoder_norm/scale"})
  config, params = ckpt.load_checkpoint(tmp_path)
  assert_params_equal(ckpt.flatten(params), bf16)
  assert config.emb_dim == 64 and not config.logits_via_embedding


def test_legacy_spec_written_on_gcs_reads_locally(tmp_path, reference):
  (tmp_path / "checkpoint_0").mkdir()
  write_legacy(tmp_path / "checkpoint_0", reference, gcs_style=True)
  _, params = ckpt.load_checkpoint(tmp_path / "checkpoint_0")
  assert_params_equal(ckpt.flatten(params), reference)


def test_zarr_spec_kvstore_depends_only_on_checkpoint_location():
  stored = {"driver": "zarr", "kvstore": {"driver": "file", "path": "target.a.kernel/"},
            "metadata": {"shape": [2, 2]}}
  remote = t5x_legacy.zarr_spec(stored, "gs://my-bucket/runs/t5/checkpoint_10", "a/kernel")
  assert remote == {"driver": "zarr", "fill_missing_data_reads": False,
                    "kvstore": {"driver": "gcs", "bucket": "my-bucket",
                                "path": "runs/t5/checkpoint_10/target.a.kernel/"}}
  gcs_written = {"driver": "zarr", "path": "target.a.kernel",
                 "kvstore": {"driver": "gcs", "bucket": "t5x-dummy-bucket"}}
  assert t5x_legacy.zarr_spec(gcs_written, "gs://other-bkt/c/checkpoint_1")["kvstore"] == {
      "driver": "gcs", "bucket": "other-bkt", "path": "c/checkpoint_1/target.a.kernel/"}
  local = t5x_legacy.zarr_spec(gcs_written, "/data/ckpt/checkpoint_1")
  assert local["kvstore"] == {"driver": "file", "path": "/data/ckpt/checkpoint_1/target.a.kernel/"}
  assert resolve.kvstore_spec("gs://bkt1") == {"driver": "gcs", "bucket": "bkt1", "path": ""}
  assert resolve.parent("gs://bkt1/a/checkpoint_3") == "gs://bkt1/a"
  with pytest.raises(CheckpointError, match="relative"):
    t5x_legacy.zarr_spec({"driver": "zarr", "kvstore": {"driver": "file", "path": "../x/"}},
                         "/data/c")


def test_local_legacy_load_goes_through_the_shared_spec_builder(monkeypatch, reference):
  specs = []
  original = t5x_legacy.zarr_spec

  def spy(*args, **kwargs):
    specs.append(original(*args, **kwargs))
    return specs[-1]

  monkeypatch.setattr(t5x_legacy, "zarr_spec", spy)
  ckpt.load_checkpoint(FIXTURE / "legacy")
  assert len(specs) == len(reference)
  assert {s["kvstore"]["driver"] for s in specs} == {"file"}


# ----------------------------------------------------------------------------- Hugging Face

try:
  import torch
  import transformers
except ImportError:  # the "interop" extra is optional
  torch = transformers = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch and transformers")

HF_SIZES = dict(vocab_size=512, d_model=64, num_heads=4, d_kv=16, d_ff=128, num_layers=2,
                decoder_start_token_id=0)


def make_hf_model(feed_forward_proj: str, tie: bool, seed: int, untie_lm_head: bool = False):
  """A random transformers T5; ``untie_lm_head`` gives it its own lm_head (as real T5 1.1)."""
  torch.manual_seed(seed)
  config = transformers.T5Config(feed_forward_proj=feed_forward_proj, tie_word_embeddings=tie,
                                 **HF_SIZES)
  model = transformers.T5ForConditionalGeneration(config).eval()
  if untie_lm_head:
    model.lm_head.weight = torch.nn.Parameter(torch.randn(512, 64))
  return model


def hf_state(model) -> dict[str, np.ndarray]:
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def assert_matches_hf(params: dict, state: dict, config: T5Config, hf_config: dict) -> None:
  """Every T5X param equals its HF tensor (transposed where HF is [out, in])."""
  flat = ckpt.flatten(params)
  names = hf.name_map(2, 2, len(config.mlp_activations) == 2)
  assert len(flat) == len(names) + (0 if config.logits_via_embedding else 1)
  for hf_name, t5x_key, transpose in names:
    expected = state[hf_name].T if transpose else state[hf_name]
    assert np.array_equal(flat[t5x_key], expected), t5x_key


def hf_logits_and_ours(model, config: T5Config, params: dict) -> tuple[np.ndarray, np.ndarray]:
  """HF's logits, and logits from the same decoder output through our output layer."""
  enc_ids = torch.tensor([[5, 7, 9, 1], [3, 4, 1, 0]])
  dec_ids = torch.tensor([[0, 11, 12], [0, 13, 14]])
  with torch.no_grad():
    logits = model(input_ids=enc_ids, decoder_input_ids=dec_ids).logits.numpy()
    encoded = model.encoder(input_ids=enc_ids).last_hidden_state
    hidden = model.decoder(input_ids=dec_ids, encoder_hidden_states=encoded).last_hidden_state
  hidden = hidden.numpy()
  if config.logits_via_embedding:
    ours = hidden @ params["token_embedder"]["embedding"].T / np.sqrt(config.emb_dim)
  else:
    ours = hidden @ params["decoder"]["logits_dense"]["kernel"]
  return logits, ours


HF_CASES = {
    "t5_1_0": ("relu", True, False),
    "t5_1_1": ("gated-gelu", False, True),
    "t5_1_1_head_tied_at_init": ("gated-gelu", False, False),  # transformers 5 ties at init
}


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_hf_load_and_export_round_trip(case, tmp_path):
  feed_forward_proj, tie, untie = HF_CASES[case]
  model = make_hf_model(feed_forward_proj, tie, seed=1, untie_lm_head=untie)
  model.save_pretrained(tmp_path / "hf", safe_serialization=True)
  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())

  config, params = ckpt.load_checkpoint(tmp_path / "hf")
  state = hf_state(model)
  assert_matches_hf(params, state, config, hf_config)
  assert (config.vocab_size, config.emb_dim, config.num_heads, config.head_dim, config.mlp_dim,
          config.num_encoder_layers, config.num_decoder_layers) == (512, 64, 4, 16, 128, 2, 2)
  assert config.mlp_activations == (("relu",) if case == "t5_1_0" else ("gelu", "linear"))
  assert config.logits_via_embedding == (case == "t5_1_0")
  if not config.logits_via_embedding:
    assert np.array_equal(params["decoder"]["logits_dense"]["kernel"], state["lm_head.weight"].T)
  logits, ours = hf_logits_and_ours(model, config, params)
  np.testing.assert_allclose(ours, logits, rtol=1e-5, atol=1e-5)

  ckpt.export_hf(tmp_path / "export", config, params)
  exported = json.loads((tmp_path / "export" / "config.json").read_text())
  assert exported["tie_word_embeddings"] is config.logits_via_embedding
  reloaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "export")
  reloaded_state = hf_state(reloaded)
  assert sorted(reloaded_state) == sorted(state)
  for name, value in state.items():
    assert np.array_equal(reloaded_state[name], value), name
  assert reloaded.config.scale_decoder_outputs == config.logits_via_embedding


@needs_torch
@pytest.mark.parametrize("scale_key", [None, False])
def test_hf_tie_trap_follows_transformers(scale_key, tmp_path):
  """A T5 1.1 config.json saying tie_word_embeddings: true with a different lm_head.weight.

  transformers 5 then uses lm_head.weight (it does not tie differing weights) and scales the
  decoder output by d_model**-0.5 unless scale_decoder_outputs is false; we give the same logits.
  """
  model = make_hf_model("gated-gelu", False, seed=2, untie_lm_head=True)
  model.save_pretrained(tmp_path, safe_serialization=True)
  hf_config = json.loads((tmp_path / "config.json").read_text())
  hf_config["tie_word_embeddings"] = True
  hf_config.pop("scale_decoder_outputs", None)
  if scale_key is not None:
    hf_config["scale_decoder_outputs"] = scale_key
  (tmp_path / "config.json").write_text(json.dumps(hf_config))

  loaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
  lm_head = model.lm_head.weight.detach().numpy()
  assert np.array_equal(loaded.lm_head.weight.detach().numpy(), lm_head)  # not tied
  assert loaded.config.scale_decoder_outputs == (scale_key is None)

  config, params = ckpt.load_checkpoint(tmp_path)
  assert not config.logits_via_embedding
  kernel = params["decoder"]["logits_dense"]["kernel"]
  if scale_key is None:
    np.testing.assert_allclose(kernel, lm_head.T / np.sqrt(64), rtol=1e-6)
  else:
    assert np.array_equal(kernel, lm_head.T)
  logits, ours = hf_logits_and_ours(loaded, config, params)
  np.testing.assert_allclose(ours, logits, rtol=1e-5, atol=1e-5)
  # Exported untied, HF reproduces the same logits.
  ckpt.export_hf(tmp_path / "export", config, params)
  again = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "export").eval()
  again_logits, _ = hf_logits_and_ours(again, config, params)
  np.testing.assert_allclose(again_logits, logits, rtol=1e-5, atol=1e-5)


@needs_torch
def test_hf_sharded_safetensors(tmp_path):
  model = make_hf_model("gated-gelu", False, seed=3, untie_lm_head=True)
  model.save_pretrained(tmp_path / "single", safe_serialization=True)
  model.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="60KB")
  shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
  assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").exists()
  config, params = ckpt.load_checkpoint(tmp_path / "sharded")
  reference_config, reference_params = ckpt.load_checkpoint(tmp_path / "single")
  assert config == reference_config
  assert_params_equal(ckpt.flatten(params), ckpt.flatten(reference_params))
  # A shard named in the index but missing is an error naming it.
  os.remove(tmp_path / "sharded" / shards[-1])
  with pytest.raises(CheckpointError, match=shards[-1]):
    ckpt.load_checkpoint(tmp_path / "sharded")


@needs_torch
@pytest.mark.parametrize("config", [
    T5Config(mlp_activations=("relu",), logits_via_embedding=True),
    T5Config(),
    T5Config(mlp_activations=("gelu_exact", "linear"), num_decoder_layers=3, eos_id=2),
    T5Config(mlp_activations=("silu", "linear"), pad_id=3, decoder_start_id=3),
    T5Config(mlp_activations=("gelu",)),
])
def test_hf_config_round_trip(config):
  config = config.replace(dropout_rate=0.1)
  assert ckpt.config_from_hf_dict(ckpt.config_to_hf_dict(config)) == config
  hf_config = transformers.T5Config(**ckpt.config_to_hf_dict(config))
  assert hf_config.scale_decoder_outputs == config.logits_via_embedding


def test_hf_feed_forward_proj_mapping():
  def acts(ffp):
    return ckpt.config_from_hf_dict({"model_type": "t5", "feed_forward_proj": ffp}).mlp_activations
  assert acts("relu") == ("relu",)
  assert acts("gated-gelu") == ("gelu", "linear")
  assert acts("gated-relu") == ("relu", "linear")
  assert acts("gated-silu") == ("silu", "linear")
  assert acts("gelu") == ("gelu_exact",)
  mt5 = ckpt.config_from_hf_dict({"model_type": "mt5"})  # transformers' MT5Config defaults
  assert (mt5.vocab_size, mt5.mlp_dim, mt5.mlp_activations, mt5.logits_via_embedding) == (
      250112, 1024, ("gelu", "linear"), False)
  with pytest.raises(CheckpointError, match="feed_forward_proj"):
    ckpt.config_from_hf_dict({"model_type": "t5", "feed_forward_proj": "gated-tanh"})
  with pytest.raises(CheckpointError, match="model_type 'bart'"):
    ckpt.config_from_hf_dict({"model_type": "bart"})


@needs_torch
def test_hub_id_goes_through_snapshot_download(monkeypatch, tmp_path):
  huggingface_hub = pytest.importorskip("huggingface_hub")
  model = make_hf_model("relu", True, seed=4)
  model.save_pretrained(tmp_path / "snapshot", safe_serialization=True)
  calls = []

  def fake_snapshot_download(repo_id, allow_patterns=None, **kwargs):
    calls.append((repo_id, allow_patterns))
    return str(tmp_path / "snapshot")

  monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
  config, params = ckpt.load_checkpoint("google/t5-tiny-test")
  assert calls[0][0] == "google/t5-tiny-test"
  assert {"config.json", "*.safetensors", "spiece.model"} <= set(calls[0][1])
  assert config.logits_via_embedding
  assert_matches_hf(params, hf_state(model), config, {})

  def failing(repo_id, **kwargs):
    raise OSError("404 repository not found")

  monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
  with pytest.raises(CheckpointError, match="Hugging Face Hub failed.*404"):
    ckpt.load_checkpoint("google/no-such-model")
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
  with pytest.raises(CheckpointError, match="needs huggingface_hub"):
    ckpt.load_checkpoint("google/t5-tiny-test")


# ----------------------------------------------------------------------------- own format


@pytest.mark.parametrize("dtype", [None, "float32", "bfloat16"])
def test_save_load_round_trip(dtype, tmp_path, reference, fixture_config):
  params = {k: jnp.asarray(v) for k, v in reference.items()}  # jax arrays are accepted too
  ckpt.save_checkpoint(tmp_path / "own", fixture_config, ckpt.unflatten(params), dtype=dtype)
  meta = json.loads((tmp_path / "own" / "specdec_config.json").read_text())
  assert (meta["format"], meta["version"], meta["dtype"]) == ("specdec-jax", 1, dtype or "float32")
  config, loaded = ckpt.load_checkpoint(tmp_path / "own")
  assert config == fixture_config
  cast = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
  assert_params_equal(ckpt.flatten(loaded), {k: v.astype(cast) for k, v in reference.items()})


def test_sd_load_gives_float32_device_arrays_unless_asked(tmp_path, reference, fixture_config):
  """Like T5X's restore and HF's from_pretrained: float32 by default, whatever is stored."""
  import jax

  import specdec_jax as sd
  ckpt.save_checkpoint(tmp_path / "bf16", fixture_config, ckpt.unflatten(reference),
                       dtype="bfloat16")
  leaves = jax.tree_util.tree_leaves(sd.load(str(tmp_path / "bf16")).params)
  assert all(isinstance(x, jax.Array) and x.dtype == np.float32 for x in leaves)
  stored = jax.tree_util.tree_leaves(sd.load(str(tmp_path / "bf16"), dtype=None).params)
  assert all(isinstance(x, jax.Array) and x.dtype == ml_dtypes.bfloat16 for x in stored)


def test_bundled_names(tmp_path, reference, fixture_config, monkeypatch):
  assets = tmp_path / "assets"
  ckpt.save_checkpoint(assets / "demo-de-en" / "target", fixture_config, ckpt.unflatten(reference))
  assert resolve.bundled_names(assets) == ["demo-de-en/target"]
  assert resolve.resolve("demo-de-en/target", assets) == str(assets / "demo-de-en" / "target")
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # a bundle is never a hub id
  with pytest.raises(CheckpointError, match="bundled names under .*: demo-de-en/target"):
    resolve.resolve("demo-de-en/drafter", assets)


# ----------------------------------------------------------------------------- errors


def test_error_missing_dir(tmp_path):
  with pytest.raises(CheckpointError, match="missing.*no such file or directory"):
    ckpt.load_checkpoint(str(tmp_path / "missing"))


def test_error_unknown_contents(tmp_path):
  (tmp_path / "notes.txt").write_text("hello")
  with pytest.raises(CheckpointError, match="unknown checkpoint format.*notes.txt"):
    ckpt.load_checkpoint(tmp_path)
  (tmp_path / "checkpoint_3").mkdir()
  with pytest.raises(CheckpointError, match="checkpoint_3.*holds a T5X checkpoint"):
    ckpt.load_checkpoint(tmp_path)


def test_error_unknown_bundled_name(monkeypatch):
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)
  with pytest.raises(CheckpointError, match="'no-such-demo' is not .* bundled names"):
    ckpt.load_checkpoint("no-such-demo")


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_error_damaged_zarr_chunk(damage, tmp_path):
  copy = writable_copy(FIXTURE / "legacy", tmp_path / "legacy")
  chunk = copy / "checkpoint_0" / CHUNK / "0.0"
  if damage == "delete":
    chunk.unlink()
  else:
    chunk.write_bytes(chunk.read_bytes()[:40])
  expected = "missing" if damage == "delete" else "truncated"
  with pytest.raises(CheckpointError, match=f"{CHUNK}.*{expected}"):
    ckpt.load_checkpoint(copy)


def test_error_missing_zarray(tmp_path):
  copy = writable_copy(FIXTURE / "legacy", tmp_path / "legacy")
  (copy / "checkpoint_0" / CHUNK / ".zarray").unlink()
  with pytest.raises(CheckpointError, match=CHUNK):
    ckpt.load_checkpoint(copy)


@pytest.mark.parametrize("content", [b"\xc1\xc1garbage", "truncate", b"\x93\x01\x02\x03"])
def test_error_corrupt_msgpack(content, tmp_path):
  copy = writable_copy(FIXTURE / "legacy", tmp_path / "legacy")
  msgpack_file = copy / "checkpoint_0" / "checkpoint"
  if content == "truncate":
    content = msgpack_file.read_bytes()[:100]
  msgpack_file.write_bytes(content)
  expected = "checkpoint_0/checkpoint: (corrupt|expected a msgpack)"
  with pytest.raises(CheckpointError, match=expected):
    ckpt.load_checkpoint(copy)


# On this error path orbax closes its private event loop while tensorstore reads are still
# finishing; their callbacks then report "Event loop is closed" as an unraisable exception.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_error_damaged_orbax_data(tmp_path):
  copy = writable_copy(FIXTURE / "orbax", tmp_path / "orbax")
  data = copy / "checkpoint_0" / "state" / "ocdbt.process_0" / "d"
  biggest = max(data.iterdir(), key=lambda p: p.stat().st_size)
  biggest.write_bytes(biggest.read_bytes()[:1000])
  with pytest.raises(CheckpointError, match="state: cannot read Orbax params"):
    ckpt.load_checkpoint(copy)
  time.sleep(0.5)  # let the stray callbacks run inside this test
  gc.collect()


def test_error_truncated_safetensors(tmp_path, reference, fixture_config):
  ckpt.save_checkpoint(tmp_path / "own", fixture_config, ckpt.unflatten(reference))
  weights = tmp_path / "own" / "params.safetensors"
  weights.write_bytes(weights.read_bytes()[:5000])
  with pytest.raises(CheckpointError, match="params.safetensors: corrupt or truncated"):
    ckpt.load_checkpoint(tmp_path / "own")
  ckpt.export_hf(tmp_path / "hf", fixture_config, ckpt.unflatten(reference))
  weights = tmp_path / "hf" / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:-10])
  with pytest.raises(CheckpointError, match="model.safetensors: corrupt or truncated"):
    ckpt.load_checkpoint(tmp_path / "hf")


@pytest.mark.parametrize("with_config", [True, False])
def test_error_pytorch_bin_only(with_config, tmp_path):
  # Not a real pickle: it must never be opened, only refused.
  (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
  if with_config:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
  with pytest.raises(CheckpointError, match="pytorch_model.bin.*safetensors is required"):
    ckpt.load_checkpoint(tmp_path)


def test_error_hf_config_missing(tmp_path, reference, fixture_config):
  ckpt.export_hf(tmp_path, fixture_config, ckpt.unflatten(reference))
  (tmp_path / "config.json").unlink()
  with pytest.raises(CheckpointError, match="config.json: not found"):
    ckpt.load_checkpoint(tmp_path)


def test_error_shape_mismatch_with_given_config(fixture_config):
  with pytest.raises(CheckpointError, match=r"wrong shape: .*mlp/wo/kernel \(128, 64\) "
                                            r"\(expected \(256, 64\)\)"):
    ckpt.load_checkpoint(FIXTURE / "legacy", fixture_config.replace(mlp_dim=256))
  with pytest.raises(CheckpointError, match="missing: encoder/layers_2/"):
    ckpt.load_checkpoint(FIXTURE / "orbax", fixture_config.replace(num_encoder_layers=3))
  with pytest.raises(CheckpointError, match="unexpected: decoder/logits_dense/kernel"):
    ckpt.load_checkpoint(FIXTURE / "legacy", fixture_config.replace(logits_via_embedding=True))


def test_error_bad_specdec_config(tmp_path, reference, fixture_config):
  ckpt.save_checkpoint(tmp_path, fixture_config, ckpt.unflatten(reference))
  (tmp_path / "specdec_config.json").write_text("{not json")
  with pytest.raises(CheckpointError, match="specdec_config.json: not valid JSON"):
    ckpt.load_checkpoint(tmp_path)


def test_error_save_rejects_mismatched_params(tmp_path, reference, fixture_config):
  with pytest.raises(CheckpointError, match="params to save.*missing"):
    ckpt.save_checkpoint(tmp_path, fixture_config.replace(num_decoder_layers=3),
                         ckpt.unflatten(reference))
