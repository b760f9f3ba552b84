"""T5Gemma 2 (text) encoder-decoders: tiny random models made and saved by transformers,
loaded with `sd.load`; logits and greedy tokens against transformers' `generate` (sliding
windows shorter than input + output, grouped heads, soft-capped logits, a linear global
rope, the end-of-image token's own embedding, ragged inputs at batch > 1); the vision
tower skipped with a note; speculative decoding with a smaller T5Gemma 2 drafting equals
its baseline (on XLA's ops; every method's exactness is tests/test_exact.py's); a decode
on the cpu kernels alone (and, in the device tier, on the gpu and tpu kernels); a tree
decode, the own format's round trip, the tokenizer; attention-logit soft-capping loaded
and applied (the gpu and tpu kernels refuse it); the loader's refusals. (Every method
lowers for TPU and CUDA: tests/test_lower.py's "t5gemma2" kind.)"""

import json
import shutil
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import testing
from specdec_jax.io.checkpoints import hf_t5gemma2
from specdec_jax.kernels import build

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, EOS, EOI, T = 96, 27, 90, 8
WINDOW = 3
# Right-padded ragged inputs (pad 0) ending in EOS, as T5Gemma's preprocessing ends them;
# row 0 holds the end-of-image token.
INPUTS = np.array([[5, 17, 33, 8, EOI, 40, 12, EOS, 0],
                   [64, 7, 7, 21, EOS, 0, 0, 0, 0],
                   [3, 50, 11, 87, 9, 70, 26, 45, EOS]], np.int32)


def _text(layers, **extra):
  types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
  return dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=WINDOW,
              final_logit_softcapping=4.0, query_pre_attn_scalar=16, layer_types=types,
              pad_token_id=0, eos_token_id=EOS, bos_token_id=2,
              rope_parameters={
                  "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                  "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}},
              **extra)


def _hf_config(encoder_layers, decoder_layers):
  """transformers always builds a vision tower (its default SigLIP without a config): a
  tiny one."""
  tower = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
               image_size=16, patch_size=8)
  encoder = dict(text_config=_text(encoder_layers), vision_config=tower,
                 mm_tokens_per_image=4, eoi_token_index=EOI)
  return transformers.T5Gemma2Config(encoder=encoder, decoder=_text(decoder_layers),
                                     eoi_token_index=EOI)


def _randomized(model, seed):
  """Every weight random; the post-norms large enough that the output is not the input
  token again (tied embeddings), the end-of-image vector random."""
  torch.manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_((4.0 if "post" in name else 0.0) + 0.5 * torch.randn_like(p))
      elif name.endswith("eoi_embedding"):
        p.copy_(torch.randn_like(p))
      elif p.ndim == 2:
        p.copy_(torch.randn_like(p) * (0.3 if "embed" in name else p.shape[-1] ** -0.5))
  return model.eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  """(HF target, its dir, our target, our drafter): the target 3 + 2 layers in one file,
  the drafter 3 + 1 layers in shards and their index, its weights the target's where the
  names match (a truncated sibling: it agrees with the target often, not always)."""
  hf_target = _randomized(transformers.T5Gemma2ForConditionalGeneration(_hf_config(3, 2)), 4)
  target_dir = tmp_path_factory.mktemp("t5gemma2_target")
  hf_target.save_pretrained(target_dir)
  hf_drafter = _randomized(transformers.T5Gemma2ForConditionalGeneration(_hf_config(3, 1)), 1)
  hf_drafter.load_state_dict({k: v for k, v in hf_target.state_dict().items()
                              if k in hf_drafter.state_dict()}, strict=False)
  drafter_dir = tmp_path_factory.mktemp("t5gemma2_drafter")
  hf_drafter.save_pretrained(drafter_dir, max_shard_size="20KB")
  assert (drafter_dir / "model.safetensors.index.json").is_file()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", sd.InputWarning)
    target, drafter = sd.load(str(target_dir)), sd.load(str(drafter_dir))
  return hf_target, target_dir, target, drafter


def test_config_is_read(pair):
  hf_target, _, target, drafter = pair
  cfg = target.config
  assert isinstance(cfg, sd.config.T5Gemma2Config) and not target.is_decoder_only
  assert cfg.encoder_layer_types == ("sliding", "sliding", "full")
  assert cfg.decoder_layer_types == ("sliding", "full")
  assert (cfg.num_kv_heads, cfg.sliding_window, cfg.query_pre_attn_scalar) == (2, WINDOW, 16)
  assert (cfg.rope_theta, cfg.global_rope_theta, cfg.global_rope_factor) == (100.0, 1000.0, 2.0)
  assert (cfg.final_logit_softcap, cfg.eos_id, cfg.decoder_start_id, cfg.eoi_id) == (
      4.0, EOS, 2, EOI)
  assert cfg.logits_via_embedding
  text = sum(p.numel() for n, p in hf_target.named_parameters()
             if not n.startswith(("model.encoder.vision_tower", "model.encoder.multi_modal")))
  assert target.num_params() == cfg.num_params() == text
  assert (drafter.config.num_encoder_layers, drafter.config.num_decoder_layers) == (3, 1)


def test_the_vision_tower_is_not_loaded_and_says_so(pair):
  _, target_dir, target, drafter = pair
  with pytest.warns(sd.InputWarning, match="vision tower is not loaded"):
    sd.load(str(target_dir))
  assert not any("vision" in k or "multi_modal" in k for k in sd.io.checkpoints.flatten(
      target.params))


def test_logits_and_greedy_tokens_match_transformers(pair):
  hf_target, _, target, _ = pair
  inputs = torch.tensor(INPUTS, dtype=torch.long)
  mask = torch.tensor(INPUTS > 0)
  dec = np.array([[2, 5, 9, 33, 40, 41, 7, 12]] * 3, np.int32)
  with torch.no_grad():
    ref = hf_target(input_ids=inputs, attention_mask=mask,
                    decoder_input_ids=torch.tensor(dec, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(np.asarray(target.forward(INPUTS, dec)), ref, atol=2e-5)
  out = sd.decode(target, sd.Autoregressive(), INPUTS, T)
  with torch.no_grad():
    hf = hf_target.generate(input_ids=inputs, attention_mask=mask, max_new_tokens=T,
                            do_sample=False)[:, 1:].numpy()     # after the start token
  lengths = np.asarray(out.lengths)
  for b in range(len(INPUTS)):
    n = int(lengths[b])
    np.testing.assert_array_equal(np.asarray(out.tokens[b, :n]), hf[b, :n])
  assert lengths.tolist() == [5, 1, T] and T + 1 > WINDOW   # EOS at two steps, and the cap


@pytest.mark.slow
def test_a_tree_decode_equals_the_plain_call(pair):
  """A chain of drafts given as a tree (positions and a visibility mask, as blockwise
  verification calls it) reads what the plain k-token call reads: a sliding layer hides
  the own keys a window before each query's position, and no cross key."""
  _, _, target, _ = pair
  _, cache, _ = target.begin(INPUTS, T)
  tokens = jnp.asarray([[2, 30, 31, 32]] * 3, jnp.int32)
  plain, _ = target.decode(tokens, cache)
  tree, _, _ = target.decode_with_hidden(tokens, cache, positions=jnp.arange(4)[None],
                                         visible=jnp.tril(jnp.ones((4, 4), bool))[None])
  np.testing.assert_array_equal(np.asarray(tree), np.asarray(plain))


@pytest.mark.slow
def test_speculative_with_a_smaller_sibling_drafting_is_the_baseline(pair):
  """On XLA's ops; speculative decoding with the 3 + 1 layer T5Gemma 2 drafting for the
  3 + 2 layer one gives the larger one's greedy tokens bitwise (its baseline's), some of
  its drafts accepted and some rejected. (Every other method's exactness is the factors':
  tests/test_exact.py.)"""
  _, _, target, drafter = pair
  target, drafter = sd.pack(target, kernels="xla"), sd.pack(drafter, kernels="xla")
  method = testing.examples(target, drafter)["speculative"]
  base = sd.decode(target, method.baseline(), INPUTS, T)
  out = sd.decode(target, method, INPUTS, T)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(base.tokens))
  np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(base.lengths))
  assert 0 < out.stats["accepted"] < out.stats["drafted"]


@pytest.mark.slow
@pytest.mark.skipif(not build.available(), reason="the C++ kernels are unavailable here")
def test_a_decode_runs_every_product_on_the_cpu_kernels(pair):
  """The merged attention's mask and window are its bias: the cpu attention kernel takes
  them, every product is packed, and the decode is XLA's."""
  _, _, target, _ = pair
  packed = sd.pack(target, kernels="cpu")
  assert packed.decode_weights.xla == () and packed.width_invariant_decode
  on_kernels = sd.decode(packed, sd.Autoregressive(), INPUTS, T)
  on_xla = sd.decode(sd.pack(target, kernels="xla"), sd.Autoregressive(), INPUTS, T)
  np.testing.assert_array_equal(np.asarray(on_kernels.tokens), np.asarray(on_xla.tokens))


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["gpu", "tpu"])
def test_the_gpu_and_tpu_kernels_take_every_product(pair, kernels):
  """Every product of its decode is dispatched to the gpu and tpu kernels (no window
  reaches their attention: it is in the bias). With their rows invariant
  (test_gpu_kernels, test_tpu_kernels) and every method exact on XLA (test_exact), its
  decodes there are exact (CONTRIBUTING: what the tests prove)."""
  _, _, target, _ = pair
  assert sd.pack(target, kernels=kernels).decode_weights.xla == ()


@pytest.mark.slow
def test_our_own_format_round_trips(pair, tmp_path):
  _, _, target, _ = pair
  sd.save(str(tmp_path / "ours"), target)
  again = sd.load(str(tmp_path / "ours"))
  assert again.config == target.config
  np.testing.assert_array_equal(np.asarray(again.forward(INPUTS[:1], INPUTS[:1, :3])),
                                np.asarray(target.forward(INPUTS[:1], INPUTS[:1, :3])))


def test_the_tokenizer_json_beside_it_is_read(pair):
  """`sd.load_tokenizer(dir)` reads the model directory's tokenizer.json (a word-level one
  here, its special tokens named in tokenizer_config.json)."""
  tokenizers = pytest.importorskip("tokenizers")
  _, target_dir, target, _ = pair
  words = [f"w{i}" for i in range(VOCAB)]
  for i, word in ((0, "<pad>"), (2, "<bos>"), (3, "<unk>"), (4, "hello"), (EOS, "<eos>")):
    words[i] = word
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                         unk_token="<unk>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.save(str(target_dir / "tokenizer.json"))
  (target_dir / "tokenizer_config.json").write_text(json.dumps(
      {"eos_token": "<eos>", "pad_token": "<pad>", "bos_token": "<bos>"}))
  loaded = sd.load_tokenizer(str(target_dir))
  assert (loaded.eos_id, loaded.vocab_size) == (target.config.eos_id, VOCAB)
  assert np.asarray(loaded.encode(["hello w9 x"], add_eos=True)).tolist() == [[4, 9, 3, EOS]]


def test_export_to_transformers_is_refused(pair, tmp_path):
  _, _, target, _ = pair
  with pytest.raises(sd.CheckpointError, match="not implemented for T5Gemma 2"):
    sd.io.checkpoints.export_hf(tmp_path / "hf", target.config, target.params)
  assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_attention_logit_softcapping_is_loaded_and_applied(pair, tmp_path):
  """transformers' T5Gemma 2 stores attn_logit_softcapping without applying it; we apply it:
  the same weights' logits move, a cached decode call on the cpu kernels is XLA's, and
  the gpu and tpu attention kernels, which take no soft-cap, refuse the model."""
  _, target_dir, target, _ = pair
  capped_dir = tmp_path / "capped"
  shutil.copytree(target_dir, capped_dir)
  d = json.loads((capped_dir / "config.json").read_text())
  for stack in (d["encoder"]["text_config"], d["decoder"]):
    stack["attn_logit_softcapping"] = 1.0
  (capped_dir / "config.json").write_text(json.dumps(d))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", sd.InputWarning)
    capped = sd.load(str(capped_dir), kernels="xla")
  assert capped.config.attn_logit_softcap == 1.0
  tokens = jnp.asarray([[2, 30, 31, 32]] * 3, jnp.int32)
  calls = {}
  # the plain call is test_a_tree_decode_equals_the_plain_call's (on the kernels "auto" chose)
  for name, model in (("plain", target), ("capped", capped)) + (
      (("cpu", sd.pack(capped, kernels="cpu")),) if build.available() else ()):
    _, cache, _ = model.begin(INPUTS, T)
    calls[name] = np.asarray(model.decode(tokens, cache)[0])
  assert np.abs(calls["capped"] - calls["plain"]).max() > 0.1
  if "cpu" in calls:
    np.testing.assert_allclose(calls["cpu"], calls["capped"], atol=1e-5)
  for kernels in ("gpu", "tpu"):
    with pytest.raises(sd.InputError, match="takes no attention-logit soft-cap"):
      sd.pack(capped, kernels=kernels)


def _dict(**decoder):
  text = _text(2)
  return {"model_type": "t5gemma2", "encoder": {"text_config": text},
          "decoder": dict(text, **decoder)}


def test_the_start_token_and_eos_are_read():
  """The decoder starts from generation_config.json's decoder_start_token_id, else the
  decoder's bos_token_id; a list of EOS ids stops at its first."""
  d = _dict(eos_token_id=[EOS, 106])
  assert hf_t5gemma2.config_from_hf_dict(d).eos_id == EOS
  assert hf_t5gemma2.config_from_hf_dict(d).decoder_start_id == 2
  assert hf_t5gemma2.config_from_hf_dict(d, generation={"decoder_start_token_id": 5,
                                                        "bos_token_id": 2}).decoder_start_id == 5


@pytest.mark.slow
def test_the_older_rope_keys_are_read():
  d = _dict(rope_parameters=None, rope_theta=5e5, rope_local_base_freq=50.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0})
  d["encoder"]["text_config"] = dict(d["encoder"]["text_config"], rope_parameters=None,
                                     rope_theta=5e5, rope_local_base_freq=50.0,
                                     rope_scaling={"rope_type": "linear", "factor": 8.0})
  cfg = hf_t5gemma2.config_from_hf_dict(d)
  assert (cfg.rope_theta, cfg.global_rope_theta, cfg.global_rope_factor) == (50.0, 5e5, 8.0)


@pytest.mark.parametrize("setting, message", [
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping differs between the encoder"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(head_dim=16), "head_dim differs between the encoder"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2.0,
                                              "rope_theta": 1e4}}), "rope"),
    (dict(pad_token_id=3), "pad_token_id"),
    (dict(hidden_activation="silu"), "hidden_activation"),
])
def test_unsupported_settings_are_refused(setting, message):
  d = _dict(**setting)
  if "pad_token_id" in setting or "hidden_activation" in setting:
    d["encoder"]["text_config"] = dict(d["encoder"]["text_config"], **setting)
  with pytest.raises(sd.CheckpointError, match=message):
    hf_t5gemma2.config_from_hf_dict(d)
