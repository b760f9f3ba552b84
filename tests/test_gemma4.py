"""Gemma 4 text decoders: tiny random models made and saved by transformers, loaded with
`sd.load`; logits and greedy tokens against transformers (a sliding window shorter than
prompt + output, soft-capped logits, grouped heads, full layers of their own head size with
keys as values, ragged prompts at batch > 1); loaded onto a mesh, it decodes as on one
device; the cpu attention kernel takes the window (bitwise the masked row) and a decode
runs on the cpu kernels alone; the gpu and tpu kernels refuse it; the loader's refusals
(attn_logit_softcapping among them: Gemma 4's text attention has no soft-cap), and the
export's. Every method's exactness is the model-free factors' (tests/test_exact.py); on a
Gemma 4 target, speculative decoding with its assistant is tests/test_gemma4_assistant.py's.
(Every method lowers for TPU and CUDA: tests/test_lower.py's "gemma4" kind.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import randomized_torch

import specdec_jax as sd
from specdec_jax.io.checkpoints import hf_gemma
from specdec_jax.kernels import build, row_attention, shapes
from specdec_jax.models import layers

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, EOS, T = 96, 2, 8
WINDOW = 3
# Right-padded ragged prompts (pad 0): lengths 7, 4, 9.
PROMPTS = np.array([[5, 17, 33, 8, 91, 40, 12, 0, 0],
                    [64, 7, 7, 21, 0, 0, 0, 0, 0],
                    [3, 50, 11, 88, 9, 70, 26, 45, 14]], np.int32)


def _hf_config(layers, types=None, **extra):
  types = types or ["sliding_attention"] * (layers - 2) + ["sliding_attention", "full_attention"]
  settings = dict(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
      num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
      num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=WINDOW,
      layer_types=types, final_logit_softcapping=4.0, hidden_size_per_layer_input=0,
      max_position_embeddings=64, pad_token_id=0, eos_token_id=EOS, bos_token_id=1,
      rope_parameters={
          "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
          "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                             "rope_theta": 1000.0}})
  return transformers.Gemma4TextConfig(**{**settings, **extra})


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  """(HF target, our target, our drafter): the target a `Gemma4ForCausalLM` (3 layers) in
  one file, the drafter a text-only `Gemma4ForConditionalGeneration` (2 layers) in shards."""
  hf_target = randomized_torch(transformers.Gemma4ForCausalLM(_hf_config(3)), 0)
  target_dir = tmp_path_factory.mktemp("gemma4_target")
  hf_target.save_pretrained(target_dir)
  full = transformers.Gemma4Config(text_config=_hf_config(2).to_dict(), vision_config=None,
                                   audio_config=None)
  hf_drafter = randomized_torch(transformers.Gemma4ForConditionalGeneration(full), 1)
  drafter_dir = tmp_path_factory.mktemp("gemma4_drafter")
  hf_drafter.save_pretrained(drafter_dir, max_shard_size="20KB")
  assert (drafter_dir / "model.safetensors.index.json").is_file()
  return hf_target, sd.load(str(target_dir)), sd.load(str(drafter_dir))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  """(HF model, ours): a small target's features, per-layer inputs and the last two of five
  layers sharing K/V (layer 3 reads layer 1, the last cached sliding one; layer 4 reads 2),
  their MLPs double-wide."""
  s, f = "sliding_attention", "full_attention"
  config = _hf_config(5, [s, s, f, s, f], hidden_size_per_layer_input=8,
                      vocab_size_per_layer_input=VOCAB, num_kv_shared_layers=2,
                      use_double_wide_mlp=True)
  hf_model = randomized_torch(transformers.Gemma4ForCausalLM(config), 2)
  directory = tmp_path_factory.mktemp("gemma4_small")
  hf_model.save_pretrained(directory)
  return hf_model, sd.load(str(directory))


def test_config_is_read(pair):
  hf_target, target, drafter = pair
  cfg = target.config
  assert isinstance(cfg, sd.GemmaConfig) and cfg.layer_types == ("sliding", "sliding", "full")
  assert (cfg.sliding_window, cfg.global_head_dim, cfg.global_num_kv_heads) == (WINDOW, 16, 1)
  assert (cfg.rope_theta, cfg.global_rope_theta, cfg.global_rope_fraction) == (100.0, 1000.0, 0.5)
  assert cfg.final_logit_softcap == 4.0 and cfg.tie_embeddings and cfg.attention_k_eq_v
  assert target.num_params() == cfg.num_params() == sum(
      p.numel() for p in hf_target.parameters()) + cfg.num_layers   # + the layer scalars
  assert drafter.config.num_layers == 2


def assert_matches_transformers(hf_model, model):
  """Logits within 2e-5 of transformers', and each ragged row's greedy tokens its
  `generate`'s (the window shorter than prompt + output)."""
  with torch.no_grad():
    ref = hf_model(torch.tensor(PROMPTS[2:], dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(np.asarray(model.forward(PROMPTS[2:])), ref, atol=2e-5)
  out = sd.decode(model, sd.Autoregressive(), PROMPTS, T)
  for b, row in enumerate(PROMPTS):
    prompt = row[:np.flatnonzero(row)[-1] + 1]
    with torch.no_grad():
      hf = hf_model.generate(torch.tensor(prompt[None], dtype=torch.long), max_new_tokens=T,
                             do_sample=False, pad_token_id=0, eos_token_id=EOS)
    expected = hf[0, len(prompt):].numpy()
    n = int(out.lengths[b])
    np.testing.assert_array_equal(np.asarray(out.tokens[b, :n]), expected[:n])
    assert n == len(expected) and len(prompt) + n > WINDOW


def test_logits_and_greedy_tokens_match_transformers(pair):
  hf_target, target, _ = pair
  assert_matches_transformers(hf_target, target)


@pytest.mark.slow
def test_per_layer_inputs_and_shared_kv_match_transformers(small, tmp_path):
  """Logits and greedy tokens (sliding window shorter than prompt + output, ragged rows);
  the cache holds the three cached layers alone; `export_hf` writes them back."""
  hf_model, model = small
  cfg = model.config
  assert (cfg.per_layer_dim, cfg.cached_layers, cfg.kv_source(3), cfg.kv_source(4)) == (8, 3, 1, 2)
  assert model.num_params() == cfg.num_params() == sum(
      p.numel() for p in hf_model.parameters()) + cfg.num_layers   # + the layer scalars
  assert_matches_transformers(hf_model, model)
  _, cache, _ = model.begin(PROMPTS, T)
  assert len(cache.self_key) == len(cache.self_value) == 3
  again = sd.load(hf_gemma.export_hf(tmp_path, cfg, model.params))
  assert again.config == cfg
  jax.tree_util.tree_map(np.testing.assert_array_equal, again.params, model.params)


@pytest.mark.slow
def test_speculative_on_shared_kv_layers_is_the_baseline(pair, small):
  """k-token verify calls over the K/V-shared layers, drafts partly rejected."""
  _, model = small
  _, _, drafter = pair
  base = sd.decode(model, sd.Autoregressive(), PROMPTS, T)
  out = sd.decode(model, sd.Speculative(drafter, gamma=3), PROMPTS, T)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(base.tokens))
  np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(base.lengths))
  assert 0 < out.stats["alpha"] < 1


@pytest.mark.slow
def test_a_tree_decode_windows_keys_by_position(small):
  """A chain of drafts given as a tree (positions and a visibility mask, as blockwise
  verification calls it) reads what the plain k-token call reads: a sliding layer hides
  the keys a window before each query's position, not its slot (K/V-shared layers too;
  the small target holds the pair's sliding and full layers as well)."""
  target = small[1]
  _, cache, _ = target.begin(PROMPTS[2:], T)
  tokens = jnp.asarray([[14, 30, 31, 32]], jnp.int32)
  plain, _ = target.decode(tokens, cache)
  tree, _, _ = target.decode_with_hidden(tokens, cache, positions=jnp.arange(4)[None],
                                         visible=jnp.tril(jnp.ones((4, 4), bool))[None])
  np.testing.assert_array_equal(np.asarray(tree), np.asarray(plain))


@pytest.mark.slow
def test_loaded_onto_a_mesh_it_decodes_as_one_device(pair, tmp_path):
  """`sd.load(dir, mesh=)` puts each weight in its shards (the MLP split over "model"), and
  greedy decoding of ragged prompts split over "data" gives one device's tokens."""
  hf_target, target, _ = pair
  hf_target.save_pretrained(tmp_path)
  mesh = sd.make_mesh(data=2, model=2, devices=jax.devices()[:4])
  sharded = sd.load(str(tmp_path), mesh=mesh)
  split = [x for x in jax.tree_util.tree_leaves(sharded.params)
           if not x.sharding.is_fully_replicated]
  assert split and all(x.sharding.mesh == mesh for x in split)
  prompts = np.concatenate([PROMPTS, PROMPTS[1:2]])              # 4 rows: 2 per data shard
  out = sd.decode(sharded, sd.Autoregressive(), sd.sharding.shard_batch(prompts, mesh), T)
  one = sd.decode(target, sd.Autoregressive(), prompts, T)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
  np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(one.lengths))


needs_cpu_kernels = pytest.mark.skipif(not build.available(),
                                       reason="the C++ kernels are unavailable here")


@needs_cpu_kernels
def test_the_cpu_attention_kernel_takes_a_window():
  """A window is bitwise the same row with the keys before it masked in the bias, and a
  T-row call's rows are bitwise 1-row calls."""
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(2, 5, 4, 16)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(2, 2, 11, 16)), jnp.float32) for _ in range(2))
  lengths = jnp.asarray([[3, 5, 7, 9, 11], [1, 2, 6, 8, 10]], jnp.int32)
  out = row_attention.attention(q, k, v, None, lengths, window=WINDOW)
  before = jnp.arange(11)[None, None, :] < lengths[:, :, None] - WINDOW
  masked = row_attention.attention(q, k, v, shapes.additive(~before[:, None]), lengths)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(masked))
  assert not np.array_equal(np.asarray(out),
                            np.asarray(row_attention.attention(q, k, v, None, lengths)))
  rows = [row_attention.attention(q[:, t:t + 1], k, v, None, lengths[:, t:t + 1], WINDOW)
          for t in range(5)]
  np.testing.assert_array_equal(np.asarray(out), np.asarray(jnp.concatenate(rows, axis=1)))


@pytest.mark.slow
@needs_cpu_kernels
def test_a_decode_runs_every_product_on_the_cpu_kernels(pair):
  _, target, _ = pair
  packed = sd.pack(target, kernels="cpu")
  assert packed.decode_weights.xla == () and packed.width_invariant_decode
  on_kernels = sd.decode(packed, sd.Autoregressive(), PROMPTS, T)
  on_xla = sd.decode(sd.pack(target, kernels="xla"), sd.Autoregressive(), PROMPTS, T)
  np.testing.assert_array_equal(np.asarray(on_kernels.tokens), np.asarray(on_xla.tokens))


@pytest.mark.slow
def test_gpu_and_tpu_kernels_refuse_a_sliding_window(pair):
  _, target, _ = pair
  for kernels in ("gpu", "tpu"):
    with pytest.raises(sd.InputError, match="takes no sliding window"):
      sd.pack(target, kernels=kernels)


@pytest.mark.parametrize("key, value, message", [
    ("vocab_size_per_layer_input", 50, "vocab_size_per_layer_input 50 differs"),
    ("num_kv_shared_layers", 1, r"shared layer \(\['full'\]\) reads an earlier layer"),
    ("enable_moe_block", True, "mixture-of-experts"),
    ("attn_logit_softcapping", 50.0, "attn_logit_softcapping=50.0: transformers' Gemma 4"),
])
def test_unimplemented_settings_are_refused(key, value, message):
  d = {"model_type": "gemma4_text", "num_hidden_layers": 2, key: value}
  with pytest.raises(sd.CheckpointError, match=message):
    hf_gemma.config_from_hf_dict(d)


def test_soft_capped_attention_is_not_exported():
  """transformers' Gemma 4 has no attention-logit soft-cap to write it to."""
  with pytest.raises(sd.CheckpointError, match="no attention-logit soft-cap"):
    hf_gemma.config_to_hf_dict(sd.GemmaConfig(attn_logit_softcap=50.0))


def test_the_gemma_3_norm_scales_by_one_plus_its_weight():
  """`RMSNorm(scale_offset=1)` is transformers' Gemma 3 / T5Gemma 2 norm (for the
  families that reuse these layers); Gemma 4's multiplies by the weight itself."""
  gemma3 = pytest.importorskip("transformers.models.gemma3.modeling_gemma3")
  x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype(np.float32)
  weight = np.random.default_rng(1).normal(size=8).astype(np.float32) * 0.3
  theirs = gemma3.Gemma3RMSNorm(8, eps=1e-6)
  with torch.no_grad():
    theirs.weight.copy_(torch.tensor(weight))
    want = theirs(torch.tensor(x)).numpy()
  for offset, expected in ((1.0, want), (0.0, want / (1 + weight) * weight)):
    ours = layers.RMSNorm(1e-6, scale_offset=offset)
    got = ours.apply({"params": {"scale": jnp.asarray(weight)}}, jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)
