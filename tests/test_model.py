"""The cached decoder against the full forward pass, and the T5X fixture logits."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ragged_tokens

import specdec_jax as sd
from specdec_jax.models import layers as t5_lib


@pytest.fixture(scope="module", params=["t5_1_1_tiny", "t5_1_0_tiny"])
def model(request):
  return sd.init_model(sd.get_config(request.param), 3)


def _decoder_inputs(batch, length, vocab, seed=1):
  dec = np.random.RandomState(seed).randint(2, vocab, (batch, length)).astype(np.int32)
  dec[:, 0] = 0
  return dec


def test_fixture_logits_match_t5x(t5x_model, t5x_reference):
  logits = t5x_model.forward(t5x_reference["encoder_input_tokens"],
                             t5x_reference["decoder_input_tokens"])
  ref = t5x_reference["logits"]
  assert logits.dtype == jnp.float32
  assert np.max(np.abs(np.asarray(logits) - ref)) <= 1e-4 * np.max(np.abs(ref))


@pytest.mark.parametrize("chunks", [(4, 6), (1, 3, 6), (10,), (2, 2, 2, 2, 2)])
def test_k_token_decode_equals_full_forward(model, chunks):
  enc = ragged_tokens(2, 9, model.vocab_size, seed=4)
  dec = _decoder_inputs(2, 10, model.vocab_size, seed=5)
  full = model.forward(enc, dec)
  cache = model.start(enc, capacity=12)
  outs, start = [], 0
  for k in chunks:
    logits, cache = model.decode(dec[:, start:start + k], cache)
    outs.append(logits)
    start += k
  np.testing.assert_allclose(np.concatenate(outs, 1), full, atol=2e-5, rtol=1e-5)
  np.testing.assert_array_equal(cache.length, [10, 10])


# The cache's bookkeeping (offsets, rollback, capacity) is the variants' shared code: on
# T5 1.1 alone (their layers differ: test_k_token_decode_equals_full_forward, both).
ONE_VARIANT = pytest.mark.parametrize("model", ["t5_1_1_tiny"], indirect=True)


@pytest.mark.slow
@ONE_VARIANT
def test_ragged_batch_equals_rows_alone(model):
  """Rows at different offsets in one cache == each row decoded alone."""
  enc = ragged_tokens(3, 10, model.vocab_size, seed=7)
  dec = _decoder_inputs(3, 8, model.vocab_size, seed=8)
  offsets = np.array([0, 3, 5])
  cache = model.start(enc, capacity=12)
  # Bring each row to its own offset with its own prefix (k=5 call, then roll back).
  _, cache = model.decode(dec[:, :5], cache)
  cache = cache.with_length(offsets)
  tokens = np.stack([dec[b, offsets[b]:offsets[b] + 3] for b in range(3)])
  batched, _ = model.decode(tokens, cache)
  for b in range(3):
    alone = model.forward(enc[b:b + 1], dec[b:b + 1, :offsets[b] + 3])
    np.testing.assert_allclose(batched[b], alone[0, offsets[b]:], atol=2e-5, rtol=1e-5)


@pytest.mark.slow
@ONE_VARIANT
def test_rollback_overwrites_stale_entries(model):
  """Writing different tokens after a rollback gives the logits of the new prefix."""
  enc = ragged_tokens(2, 8, model.vocab_size, seed=9)
  dec_a = _decoder_inputs(2, 7, model.vocab_size, seed=10)
  dec_b = dec_a.copy()
  dec_b[:, 3:] = _decoder_inputs(2, 7, model.vocab_size, seed=11)[:, 3:]
  cache = model.start(enc, capacity=8)
  _, cache = model.decode(dec_a, cache)              # fills 7 positions with path a
  logits_b, cache = model.decode(dec_b[:, 3:], cache.with_length(jnp.array([3, 3])))
  full_b = model.forward(enc, dec_b)
  np.testing.assert_allclose(logits_b, full_b[:, 3:], atol=2e-5, rtol=1e-5)


@pytest.mark.slow
@ONE_VARIANT
def test_writes_past_capacity_are_dropped(model):
  enc = ragged_tokens(1, 6, model.vocab_size)
  cache = model.start(enc, capacity=4)
  _, cache = model.decode(jnp.array([[0, 5, 6]]), cache)
  before = [np.asarray(k) for k in cache.self_key]
  _, cache2 = model.decode(jnp.array([[7, 8, 9]]), cache.with_length(jnp.array([4])))
  for k_old, k_new in zip(before, cache2.self_key, strict=True):
    np.testing.assert_array_equal(k_old, k_new)


@pytest.mark.slow
def test_bfloat16_activations_track_float32():
  cfg = sd.get_config("t5_1_1_tiny")
  m32 = sd.init_model(cfg, 0)
  m16 = sd.Model(cfg.replace(dtype="bfloat16"), m32.params)
  enc = ragged_tokens(2, 8, cfg.vocab_size)
  dec = _decoder_inputs(2, 6, cfg.vocab_size)
  l32, l16 = m32.forward(enc, dec), m16.forward(enc, dec)
  assert l16.dtype == jnp.float32   # logits are float32 whatever the activation dtype
  assert np.max(np.abs(np.asarray(l16) - np.asarray(l32))) < 0.1 * np.max(np.abs(np.asarray(l32)))
  cache = m16.start(enc, 8)
  assert cache.self_key[0].dtype == jnp.bfloat16


def test_relative_position_buckets_match_t5_definition():
  # Hand-checked values of T5's bucketing (decoder: unidirectional, 32 buckets, 128 max).
  n = np.array([0, 1, 15, 16, 20, 31, 32, 63, 64, 127, 128, 1000])
  got = t5_lib.relative_position_bucket(-n, False, 32, 128)
  np.testing.assert_array_equal(got, [0, 1, 15, 16, 17, 21, 21, 26, 26, 31, 31, 31])
  # Encoder: bidirectional, keys after the query use the upper half.
  got = t5_lib.relative_position_bucket(np.array([-1, 1, -8, 8]), True, 32, 128)
  np.testing.assert_array_equal(got, [1, 17, 8, 24])


def test_logical_axes_cover_every_param():
  cfg = sd.get_config("t5_1_1_tiny")
  axes = sd.logical_axes(cfg)
  params = sd.init_model(cfg, 0).params
  flat_axes = jax.tree_util.tree_leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
  flat_params = jax.tree_util.tree_leaves(params)
  assert len(flat_axes) == len(flat_params)
  for spec, p in zip(flat_axes, flat_params, strict=True):
    assert len(spec) == p.ndim and all(isinstance(a, str) for a in spec)
  assert tuple(axes["decoder"]["logits_dense"]["kernel"]) == ("embed", "vocab")
  assert tuple(axes["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]) == ("embed", "mlp")


def test_param_tree_matches_t5x_fixture(t5x_model):
  ours = sd.init_model(t5x_model.config, 0).params
  shapes = lambda t: jax.tree_util.tree_map(lambda x: tuple(x.shape), t)
  assert shapes(ours) == shapes(t5x_model.params)


def test_num_params_formula():
  for name in ["t5_1_1_tiny", "t5_1_0_tiny"]:
    cfg = sd.get_config(name)
    assert sd.init_model(cfg, 0).num_params() == cfg.num_params()
  assert round(sd.get_config("t5_1_1_small").num_params() / 1e6, 1) == 77.0
  assert round(sd.get_config("t5_1_1_xxl").num_params() / 1e9, 1) == 11.1


def test_decode_macs_per_token_counts_the_weights_a_step_reads():
  """Every decoder kernel but the cached cross-attention K/V, plus the output projection."""
  for name in ["t5_1_1_tiny", "t5_1_0_tiny"]:
    cfg = sd.get_config(name)
    flat = flax.traverse_util.flatten_dict(sd.init_model(cfg, 0).params, sep="/")
    read = sum(v.size for k, v in flat.items()
               if k.endswith("kernel") and (k.startswith("decoder/layers_")
                                           or k.startswith("decoder/logits_dense"))
               and "encoder_decoder_attention/key" not in k
               and "encoder_decoder_attention/value" not in k)
    if cfg.logits_via_embedding:   # tied: the step reads the embedding as the projection
      read += flat["token_embedder/embedding"].size
    assert cfg.decode_macs_per_token() == read


def test_config_errors(tmp_path):
  with pytest.raises(sd.ConfigError, match="unknown config 'nope'"):
    sd.get_config("nope")
  with pytest.raises(sd.ConfigError, match="unknown T5 config keys"):
    sd.T5Config.from_dict({"vocab_size": 10, "emb_dimm": 3})
  with pytest.raises(sd.ConfigError, match="mlp_activations"):
    sd.T5Config(mlp_activations=("swish2",))
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  with pytest.raises(sd.ConfigError, match="not valid JSON"):
    sd.get_config(bad)


@pytest.mark.slow
def test_every_named_config_parses():
  names = sd.available_configs()
  for required in ["t5_1_1_small", "t5_1_1_xxl", "t5_1_0_11b", "mt5_xxl", "t5_1_1_tiny"]:
    assert required in names
  for name in names:
    sd.get_config(name)
