"""Decoder-only LMs (models.lm): cached prefill + decode against the full causal pass,
ragged prompts, grouped-query attention, tied output, trees of drafts, configs."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict

import specdec_jax as sd
from specdec_jax import sharding
from specdec_jax.config.lm import LMConfig
from specdec_jax.kernels import build
from specdec_jax.models import lm

NAMES = ["gpt2_tiny", "llama_tiny"]
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module", params=NAMES)
def model(request):
  return sd.pack(sd.init_model(sd.get_config(request.param), 1))   # the kernels "auto" picks


def tokens(shape, vocab, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(2, vocab, shape), jnp.int32)


def test_named_configs_are_decoder_only():
  gpt2, llama = sd.get_config("gpt2_tiny"), sd.get_config("llama_tiny")
  assert isinstance(gpt2, LMConfig) and isinstance(llama, LMConfig)
  assert (gpt2.norm, gpt2.positions, gpt2.mlp, gpt2.tie_embeddings) == (
      "layernorm", "learned", "gelu_tanh", True)
  assert (llama.norm, llama.positions, llama.mlp, llama.tie_embeddings) == (
      "rmsnorm", "rope", "swiglu", False)
  assert llama.num_kv_heads < llama.num_heads
  assert LMConfig.from_dict(json.loads(json.dumps(llama.to_dict()))) == llama
  assert sd.init_model(llama).is_decoder_only
  assert not sd.init_model(sd.get_config("t5_1_1_tiny")).is_decoder_only


def test_num_params_matches_the_tree(model):
  assert model.num_params() == model.config.num_params()


def test_every_parameter_has_logical_axes(model):
  axes = flatten_dict(sd.logical_axes(model.config))
  params = flatten_dict(model.params)
  assert set(axes) == set(params)
  for path, names in axes.items():
    assert len(tuple(names)) == params[path].ndim, path
    assert set(names) <= sharding.LOGICAL_AXES, (path, names)


def test_cached_prefill_and_decode_equal_the_full_pass(model):
  """Prefill a prompt, then decode the rest k at a time: the logits of every position
  are the full causal pass's, and so are the greedy tokens."""
  seq = tokens((2, 12), model.vocab_size)
  full = np.asarray(model.forward(seq))
  prompt = seq[:, :5]
  cache = model.start(prompt, capacity=16)
  np.testing.assert_array_equal(np.asarray(cache.length), [4, 4])
  np.testing.assert_array_equal(np.asarray(model.first_tokens(prompt)), np.asarray(seq[:, 4]))
  got = []
  for lo, hi in ((4, 5), (5, 8), (8, 12)):
    logits, cache = model.decode(seq[:, lo:hi], cache)
    got.append(np.asarray(logits))
  got = np.concatenate(got, axis=1)
  np.testing.assert_allclose(got, full[:, 4:], **TOL)
  np.testing.assert_array_equal(got.argmax(-1), full[:, 4:].argmax(-1))
  np.testing.assert_array_equal(np.asarray(cache.length), [12, 12])


def test_k_token_decode_equals_k_one_token_decodes(model):
  seq = tokens((3, 9), model.vocab_size, seed=1)
  cache = model.start(seq[:, :3], capacity=12)
  big, _ = model.decode(seq[:, 2:9], cache)
  steps, c = [], cache
  for j in range(2, 9):
    logits, c = model.decode(seq[:, j:j + 1], c)
    steps.append(np.asarray(logits)[:, 0])
  steps = np.stack(steps, axis=1)
  if model.width_invariant_decode:    # every product on a kernel: bitwise
    np.testing.assert_array_equal(np.asarray(big), steps)
  np.testing.assert_allclose(np.asarray(big), steps, **TOL)


@pytest.mark.skipif(not build.available(), reason="CPU kernels not built")
def test_packed_decode_is_width_invariant(model):
  assert model.decode_weights.policy.backend == "cpu"
  assert model.width_invariant_decode, model.decode_weights.xla


@pytest.mark.slow
def test_ragged_prompts_equal_each_row_alone(model):
  """Right-padded prompts of different lengths in one batch: each row's prefill, logits and
  greedy continuation are those of the row alone."""
  pad = model.config.pad_id
  lengths = [6, 2, 4]
  seq = np.array(tokens((3, 6), model.vocab_size, seed=2))
  for b, n in enumerate(lengths):
    seq[b, n:] = pad
  seq = jnp.asarray(seq)
  np.testing.assert_array_equal(np.asarray(model.prompt_lengths(seq)), lengths)
  cache = model.start(seq, capacity=14)
  np.testing.assert_array_equal(np.asarray(cache.length), np.asarray(lengths) - 1)
  tok = model.first_tokens(seq)[:, None]
  batch_tokens, batch_logits = greedy(model, cache, tok, 6)
  for b, n in enumerate(lengths):
    alone = model.start(seq[b:b + 1, :n], capacity=14)
    toks, logits = greedy(model, alone, seq[b:b + 1, n - 1:n], 6)
    np.testing.assert_array_equal(batch_tokens[b], toks[0])
    np.testing.assert_allclose(batch_logits[b], logits[0], **TOL)


def greedy(model, cache, tok, steps):
  out, logits = [], []
  for _ in range(steps):
    step, cache = model.decode(tok, cache)
    logits.append(np.asarray(step[:, 0]))
    tok = jnp.argmax(step[:, -1:], axis=-1).astype(jnp.int32)
    out.append(np.asarray(tok[:, 0]))
  return np.stack(out, axis=1), np.stack(logits, axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama_tiny"], indirect=True)
def test_explicit_lengths_override_the_pad_id(model):
  """A prompt whose last real token is the pad id needs lengths=; with them it matches.
  (On Llama: `lengths=` is the families' shared code; their positions, learned or
  rotary, at ragged lengths are test_ragged_prompts_equal_each_row_alone's, both.)"""
  seq = np.array(tokens((1, 5), model.vocab_size, seed=3))
  seq[0, 4] = model.config.pad_id
  seq = jnp.asarray(seq)
  assert int(model.prompt_lengths(seq)[0]) == 4
  cache = model.start(seq, capacity=8, lengths=jnp.asarray([5]))
  logits, _ = model.decode(model.first_tokens(seq, jnp.asarray([5]))[:, None], cache)
  np.testing.assert_allclose(np.asarray(logits[0, 0]), np.asarray(model.forward(seq))[0, 4],
                             **TOL)


@pytest.mark.slow
def test_grouped_query_attention_equals_attention_with_repeated_heads():
  """num_kv_heads=2 of 4: each key/value head serves two consecutive query heads, which is
  full multi-head attention with those key/value weights repeated per head."""
  gqa_cfg = sd.get_config("llama_tiny")
  mha_cfg = gqa_cfg.replace(num_kv_heads=gqa_cfg.num_heads)
  gqa = sd.init_model(gqa_cfg, 5)
  group, dh = gqa_cfg.num_heads // gqa_cfg.num_kv_heads, gqa_cfg.head_dim
  flat = flatten_dict(gqa.params)
  for path, w in list(flat.items()):
    if path[-2] in ("key", "value"):
      heads = w.reshape(w.shape[0], gqa_cfg.num_kv_heads, dh)
      flat[path] = jnp.repeat(heads, group, axis=1).reshape(w.shape[0], -1)
  mha = sd.Model(config=mha_cfg, params=unflatten_dict(flat))
  seq = tokens((2, 7), gqa_cfg.vocab_size, seed=4)
  np.testing.assert_allclose(np.asarray(gqa.forward(seq)), np.asarray(mha.forward(seq)), **TOL)
  cache = gqa.start(seq[:, :4], capacity=8)
  assert cache.self_key[0].shape == (2, gqa_cfg.num_kv_heads, 8, dh)   # the cache is smaller
  a, _ = gqa.decode(seq[:, 3:], cache)
  b, _ = mha.decode(seq[:, 3:], mha.start(seq[:, :4], capacity=8))
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)
  # A wrong grouping (interleaved instead of consecutive) gives other logits.
  flat_bad = dict(flat)
  for path, w in flatten_dict(gqa.params).items():
    if path[-2] in ("key", "value"):
      heads = w.reshape(w.shape[0], gqa_cfg.num_kv_heads, dh)
      flat_bad[path] = jnp.tile(heads, (1, group, 1)).reshape(w.shape[0], -1)
  bad = sd.Model(config=mha_cfg, params=unflatten_dict(flat_bad))
  assert np.max(np.abs(np.asarray(bad.forward(seq)) - np.asarray(gqa.forward(seq)))) > 1e-3


@pytest.mark.skipif(not build.available(), reason="CPU kernels not built")
def test_decode_attention_takes_grouped_kv_and_lengths_not_a_bias():
  """A causal decode call's attention kernels read the cache as grouped (2 K/V heads for 4
  query heads), each query row's valid length [B, k], and no bias (zero elements): no
  [B, H, k, capacity] mask is built for them."""
  model = sd.pack(sd.init_model(sd.get_config("llama_tiny"), 1))
  cfg = model.config
  seq = tokens((2, 7), cfg.vocab_size, seed=4)
  cache = model.start(seq[:, :4], capacity=8)
  hlo = jax.jit(lambda m, t, c: m.decode(t, c)).lower(model, seq[:, 4:6], cache).as_text()
  calls = [line for line in hlo.splitlines() if f"@{build.ATTENTION}(" in line]
  assert len(calls) == cfg.num_layers
  kv = f"tensor<2x{cfg.num_kv_heads}x8x{cfg.head_dim}x"
  for line in calls:
    operands = line.rsplit(" : (", 1)[1].split(") -> ")[0]
    assert operands.count(kv) == 2 and "tensor<1x1x1x0xf32>" in operands, operands
    assert operands.endswith("tensor<2x2xi32>"), operands


@pytest.mark.slow
@pytest.mark.parametrize("tie", [True, False])
def test_tied_and_untied_output(tie):
  cfg = sd.get_config("gpt2_tiny").replace(tie_embeddings=tie)
  model = sd.init_model(cfg, 2)
  assert ("logits_dense" in model.params["decoder"]) == (not tie)
  seq = tokens((1, 4), cfg.vocab_size)
  hidden = np.asarray(model.hidden_states(seq))
  weight = (np.asarray(model.params["token_embedder"]["embedding"]).T if tie
            else np.asarray(model.params["decoder"]["logits_dense"]["kernel"]))
  np.testing.assert_allclose(np.asarray(model.forward(seq)), hidden @ weight, rtol=1e-4,
                             atol=1e-3)


@pytest.mark.slow
def test_tree_of_drafts_equals_each_branch_decoded_alone(model):
  """Two drafts [a1] and [b1, b2] after one shared token, in one call (positions/visible):
  each new token's logits are those of decoding its own branch."""
  seq = tokens((1, 8), model.vocab_size, seed=6)
  cache = model.start(seq[:, :3], capacity=12)
  shared, a1, b1, b2 = (int(t) for t in np.asarray(seq[0, 2:6]))
  tree = jnp.asarray([[shared, a1, b1, b2]], jnp.int32)
  p = int(cache.length[0])
  positions = jnp.asarray([[p, p + 1, p + 1, p + 2]], jnp.int32)
  visible = jnp.asarray([[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]], bool)
  logits, _, _ = model.decode_with_hidden(tree, cache, positions=positions, visible=visible)
  logits = np.asarray(logits)
  branch_a, _ = model.decode(jnp.asarray([[shared, a1]], jnp.int32), cache)
  branch_b, _ = model.decode(jnp.asarray([[shared, b1, b2]], jnp.int32), cache)
  np.testing.assert_allclose(logits[0, [0, 1]], np.asarray(branch_a)[0], **TOL)
  np.testing.assert_allclose(logits[0, [0, 2, 3]], np.asarray(branch_b)[0], **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama_tiny"], indirect=True)
def test_early_exit_decode_reads_the_exit_logits(model):
  """On Llama: the exit is the families' shared code (their layers and final norms are
  test_cached_prefill_and_decode_equal_the_full_pass's, both)."""
  seq = tokens((2, 6), model.vocab_size, seed=7)
  (teacher,) = model.exit_logits(seq, exits=(1,))
  cache = model.start(seq[:, :2], capacity=8)
  logits, cache = model.decode(seq[:, 1:6], cache, exit_layer=1)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(teacher)[:, 1:], **TOL)


@pytest.mark.slow
def test_bfloat16_init_and_compute():
  model = sd.init_model(sd.get_config("llama_tiny"), 0, "bfloat16")
  assert model.config.dtype == "bfloat16"
  assert {x.dtype for x in jax.tree_util.tree_leaves(model.params)} == {jnp.dtype("bfloat16")}
  seq = tokens((1, 5), model.vocab_size)
  full = np.asarray(model.forward(seq))
  assert full.dtype == np.float32 and np.all(np.isfinite(full))
  logits, _ = model.decode(seq[:, 2:], model.start(seq[:, :3], capacity=8))
  np.testing.assert_allclose(np.asarray(logits), full[:, 2:], atol=0.1)


def test_load_named_config_through_sd_load():
  model = sd.load("config:gpt2_tiny")
  assert model.is_decoder_only and model.config.family == "gpt2"


def test_t5_first_tokens_are_the_decoder_start_id():
  t5 = sd.init_model(sd.get_config("t5_1_1_tiny"))
  enc = jnp.asarray([[5, 6, 1, 0]], jnp.int32)
  np.testing.assert_array_equal(np.asarray(t5.first_tokens(enc)), [t5.config.decoder_start_id])
  with pytest.raises(sd.InputError, match="lengths= is for decoder-only"):
    t5.start(enc, capacity=4, lengths=jnp.asarray([3]))


def test_bad_configs_are_config_errors(tmp_path):
  with pytest.raises(sd.ConfigError, match="not a multiple of num_kv_heads"):
    LMConfig(num_heads=8, num_kv_heads=3)
  with pytest.raises(sd.ConfigError, match="family"):
    LMConfig(family="gpt3")
  with pytest.raises(sd.ConfigError, match="norm"):
    LMConfig(norm="batchnorm")
  with pytest.raises(sd.ConfigError, match="even head_dim"):
    LMConfig(emb_dim=60, num_heads=4, head_dim=15)
  with pytest.raises(sd.ConfigError, match="eos_id"):
    LMConfig(vocab_size=10, eos_id=10)
  with pytest.raises(sd.ConfigError, match="unknown decoder-only config keys"):
    LMConfig.from_dict({"family": "gpt2", "n_embd": 64})
  bad = tmp_path / "lm.json"
  bad.write_text(json.dumps({"family": "llama", "num_kv_heads": 3}))
  with pytest.raises(sd.ConfigError, match="num_kv_heads"):
    sd.get_config(bad)


def test_bad_prompts_are_input_errors():
  model = sd.init_model(sd.get_config("gpt2_tiny"))
  seq = tokens((2, 5), model.vocab_size)
  with pytest.raises(sd.InputError, match="shorter than the prompt"):
    model.start(seq, capacity=4)
  with pytest.raises(sd.InputError, match="learned positions"):
    model.start(seq, capacity=model.config.max_positions + 1)
  with pytest.raises(sd.InputError, match="only the pad id"):
    model.start(jnp.zeros((1, 3), jnp.int32), capacity=8)
  with pytest.raises(sd.InputError, match=r"lie in \[1, 5\]"):
    model.start(seq, capacity=8, lengths=jnp.asarray([5, 6]))
  with pytest.raises(sd.InputError, match="one token array"):
    model.forward(seq, seq)
  with pytest.raises(sd.InputError, match="outside"):
    model.forward(seq + model.vocab_size)
  with pytest.raises(sd.InputError, match="no encoder"):
    model.encode(seq)


@pytest.mark.slow
def test_rope_matches_the_rotate_half_formula():
  """HF's convention: dimension i pairs with i + Dh/2, angle pos * theta ** (-2i / Dh)."""
  dh, theta = 8, 10000.0
  x = np.random.default_rng(8).normal(size=(1, 1, 3, dh)).astype(np.float32)
  pos = np.asarray([[0, 1, 7]])
  cos, sin = lm.rope_tables(jnp.asarray(pos), dh, theta, 8)
  got = np.asarray(lm.apply_rope(jnp.asarray(x), cos, sin))
  want = np.empty_like(x)
  for t, p in enumerate(pos[0]):
    for i in range(dh // 2):
      a = p * theta ** (-2 * i / dh)
      x1, x2 = x[0, 0, t, i], x[0, 0, t, i + dh // 2]
      want[0, 0, t, i] = x1 * np.cos(a) - x2 * np.sin(a)
      want[0, 0, t, i + dh // 2] = x2 * np.cos(a) + x1 * np.sin(a)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[..., 0, :], x[..., 0, :])     # position 0: unrotated


@pytest.mark.slow
def test_sharding_rules_place_the_lm(model):
  """T5X's rules apply to the LM tree (strict: every leaf has a rule): projections split
  over "model" along heads / mlp / vocab. A sharded LM decoding as one device is
  tests/test_sharding.py::test_decoder_only_on_a_mesh's (llama_tiny on 2 x 4)."""
  mesh = sd.make_mesh(1, 1, devices=jax.devices()[:1])
  specs = flatten_dict(sharding.param_shardings(model, mesh, strict=True))
  attn = ("decoder", "layers_0", "self_attention")
  assert tuple(specs[attn + ("query", "kernel")].spec) == (None, "model")
  assert tuple(specs[attn + ("out", "kernel")].spec) == ("model", None)
  assert tuple(specs[("token_embedder", "embedding")].spec) == ("model", None)


@pytest.mark.slow
def test_prefill_and_greedy_loop_inside_jit(model):
  """The engine's use: start and decode traced in one jitted function (lengths given), the
  same tokens as the eager calls; without lengths, a traced prompt is a clear error."""
  seq = np.array(tokens((2, 5), model.vocab_size, seed=10))
  seq[1, 3:] = model.config.pad_id
  lengths = jnp.asarray([5, 3], jnp.int32)
  packed = sd.pack(model)

  @jax.jit
  def run(m, prompt, lengths):
    cache = m.start(prompt, 10, lengths)
    tok = m.first_tokens(prompt, lengths)[:, None]

    def step(carry, _):
      tok, cache = carry
      logits, cache = m.decode(tok, cache)
      tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
      return (tok, cache), tok[:, 0]

    _, out = jax.lax.scan(step, (tok, cache), None, length=4)
    return out.T

  eager, _ = greedy(model, model.start(jnp.asarray(seq), 10), model.first_tokens(seq)[:, None], 4)
  np.testing.assert_array_equal(np.asarray(run(packed, jnp.asarray(seq), lengths)), eager)
  with pytest.raises(sd.InputError, match="pass lengths="):
    jax.jit(lambda m, p: m.start(p, 10).length)(packed, jnp.asarray(seq))
