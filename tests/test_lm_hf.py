"""Parity with Hugging Face transformers' PyTorch GPT-2, Llama and Gemma 4 on random weights:
logits of the full pass and of the cached decode, greedy tokens against
`generate(do_sample=False)` (GPT-2 and Llama; Gemma 4's are tests/test_gemma4.py's), the
round trip back to transformers, sharded files, and the loader's errors."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax.io import checkpoints

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 2e-5   # float32 logits of order 1-10


def _hf_config(kind):
  if kind == "gemma4":   # sliding window 5 < the prompts, full layers of their own shape
    return transformers.Gemma4TextConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
        num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=5,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        final_logit_softcapping=5.0, hidden_size_per_layer_input=0, max_position_embeddings=64,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                         "full_attention": {"rope_type": "proportional", "rope_theta": 1e4,
                                            "partial_rotary_factor": 0.5}},
        bos_token_id=1, eos_token_id=2)
  if kind == "gpt2":
    return transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                   bos_token_id=1, eos_token_id=2)
  return transformers.LlamaConfig(
      vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
      rope_theta=500.0, tie_word_embeddings=(kind == "llama_tied"), bos_token_id=1,
      eos_token_id=2)


def _hf_model(kind, seed=0):
  """A random transformers model with weights large enough that logits are far apart."""
  torch.manual_seed(seed)
  cls = {"gpt2": transformers.GPT2LMHeadModel,
         "gemma4": transformers.Gemma4ForCausalLM}.get(kind, transformers.LlamaForCausalLM)
  model = cls(_hf_config(kind)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "norm.weight")):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      elif p.ndim == 1:
        p.copy_(0.1 * torch.randn_like(p))
      else:
        p.copy_(torch.randn_like(p) * (0.5 if "wte" in name or "embed" in name else
                                       1.0 / p.shape[-1] ** 0.5 if kind != "gpt2" else
                                       1.0 / p.shape[0] ** 0.5))
  return model


KINDS = ["gpt2", "llama", "llama_tied", "gemma4"]


@pytest.fixture(scope="module", params=KINDS)
def pair(request, tmp_path_factory):
  """(kind, HF model, our Model loaded from its save_pretrained dir, that dir)."""
  kind = request.param
  hf_model = _hf_model(kind)
  path = tmp_path_factory.mktemp(kind)
  hf_model.save_pretrained(path, safe_serialization=True)
  return kind, hf_model, sd.load(str(path)), path


def _hf_logits(hf_model, tokens):
  with torch.no_grad():
    return hf_model(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()


def test_config_is_read(pair):
  kind, hf_model, model, _ = pair
  cfg = model.config
  assert model.is_decoder_only and cfg.family == kind.split("_")[0]
  assert cfg.tie_embeddings == (kind != "llama")
  if kind != "gpt2":
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.rope_theta) == (4, 2, 500.0)
  stored_buffers = [b for n, b in hf_model.named_buffers() if n.endswith("layer_scalar")]
  assert model.num_params() == sum(p.numel() for p in [*hf_model.parameters(), *stored_buffers])


def test_logits_match_transformers(pair):
  kind, hf_model, model, _ = pair
  tokens = np.random.default_rng(0).integers(3, 96, (2, 20))
  want = _hf_logits(hf_model, tokens)
  got = np.asarray(model.forward(jnp.asarray(tokens, jnp.int32)))
  diff = np.max(np.abs(got - want))
  print(f"\n{kind}: full-pass max |logit diff| {diff:.2e} (logits up to {np.abs(want).max():.1f})")
  assert diff < TOL
  # The cached path: prefill 8, then decode the rest 4 at a time.
  cache = model.start(jnp.asarray(tokens[:, :8], jnp.int32), capacity=24)
  pieces = []
  for lo in range(7, 20, 4):
    logits, cache = model.decode(jnp.asarray(tokens[:, lo:lo + 4], jnp.int32), cache)
    pieces.append(np.asarray(logits))
  cached = np.concatenate(pieces, axis=1)
  diff = np.max(np.abs(cached - want[:, 7:]))
  print(f"{kind}: cached-decode max |logit diff| {diff:.2e}")
  assert diff < TOL


def _our_greedy(model, prompts, steps):
  """Right-padded ragged prompts, one cached decode per step."""
  width = max(len(p) for p in prompts)
  pad = model.config.pad_id
  batch = jnp.asarray([list(p) + [pad] * (width - len(p)) for p in prompts], jnp.int32)
  lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
  cache = model.start(batch, capacity=width + steps, lengths=lengths)
  tok, out = model.first_tokens(batch, lengths)[:, None], []
  for _ in range(steps):
    logits, cache = model.decode(tok, cache)
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    out.append(np.asarray(tok[:, 0]))
  return np.stack(out, axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["gpt2", "llama"], indirect=True)
def test_greedy_tokens_match_generate(pair):
  """GPT-2 and Llama: Gemma 4's greedy tokens against `generate` are
  tests/test_gemma4.py::test_logits_and_greedy_tokens_match_transformers's; a tied Llama's
  differ from Llama's only in its logits (test_logits_match_transformers)."""
  kind, hf_model, model, _ = pair
  rng = np.random.default_rng(1)
  prompts = [rng.integers(3, 96, n).tolist() for n in (9, 3, 6)]
  ours = _our_greedy(model, prompts, 12)
  for b, prompt in enumerate(prompts):
    with torch.no_grad():
      out = hf_model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12,
                              min_new_tokens=12, eos_token_id=None, pad_token_id=0)
    np.testing.assert_array_equal(ours[b], out[0, len(prompt):].numpy(), err_msg=f"row {b}")


@pytest.mark.slow
def test_export_round_trips_through_transformers(pair, tmp_path):
  kind, hf_model, model, _ = pair
  out = checkpoints.export_hf(tmp_path / "hf", model.config, model.params)
  back = type(hf_model).from_pretrained(out).eval()
  want = hf_model.state_dict()
  for name, value in back.state_dict().items():
    np.testing.assert_array_equal(value.numpy(), want[name].numpy(), err_msg=name)
  tokens = np.random.default_rng(2).integers(3, 96, (1, 10))
  np.testing.assert_array_equal(_hf_logits(back, tokens), _hf_logits(hf_model, tokens))
  assert sd.load(out).config == model.config
  # Our own format too.
  sd.save(str(tmp_path / "ours"), model)
  again = sd.load(str(tmp_path / "ours"))
  assert again.config == model.config
  for a, b in zip(*(sorted(checkpoints.flatten(m.params).items()) for m in (again, model)),
                  strict=True):
    np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[1]), err_msg=a[0])


@pytest.mark.slow
def test_sharded_safetensors_load(tmp_path):
  hf_model = _hf_model("llama", seed=3)
  hf_model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
  assert os.path.isfile(tmp_path / "model.safetensors.index.json")
  assert len([n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]) > 1
  model = sd.load(str(tmp_path))
  tokens = np.random.default_rng(3).integers(3, 96, (1, 8))
  got = np.asarray(model.forward(jnp.asarray(tokens, jnp.int32)))
  assert np.max(np.abs(got - _hf_logits(hf_model, tokens))) < TOL


def _write(path, config, tensors=True):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  if tensors:
    import safetensors.numpy
    safetensors.numpy.save_file({"x": np.zeros(1, np.float32)},
                                os.path.join(path, "model.safetensors"))


def test_loader_errors(tmp_path):
  base = {"model_type": "llama", "vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 4, "intermediate_size": 48}
  _write(tmp_path / "scaled", {**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
  with pytest.raises(sd.CheckpointError, match="rope scaling 'llama3' is not supported"):
    sd.load(str(tmp_path / "scaled"))
  _write(tmp_path / "yarn", {**base, "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                                         "rope_theta": 1e4}})
  with pytest.raises(sd.CheckpointError, match="rope scaling 'yarn'"):
    sd.load(str(tmp_path / "yarn"))
  _write(tmp_path / "mistral", {**base, "model_type": "mistral"})
  with pytest.raises(sd.CheckpointError, match="model_type 'mistral' is not supported.*gpt2"):
    sd.load(str(tmp_path / "mistral"))
  _write(tmp_path / "nofile", base, tensors=False)
  (tmp_path / "nofile" / "pytorch_model.bin").write_bytes(b"not read")
  with pytest.raises(sd.CheckpointError, match="safetensors is required"):
    sd.load(str(tmp_path / "nofile"))
  _write(tmp_path / "wrong", base)
  with pytest.raises(sd.CheckpointError, match="missing.*model.embed_tokens.weight"):
    sd.load(str(tmp_path / "wrong"))
  _write(tmp_path / "gelu", {"model_type": "gpt2", "vocab_size": 96, "n_embd": 32, "n_layer": 1,
                             "n_head": 4, "activation_function": "relu", "eos_token_id": 2,
                             "bos_token_id": 1})
  with pytest.raises(sd.CheckpointError, match="activation_function 'relu'"):
    sd.load(str(tmp_path / "gelu"))


@pytest.mark.slow
def test_export_refuses_configs_without_a_hf_equivalent(tmp_path):
  cfg = sd.get_config("gpt2_tiny").replace(positions="rope")
  model = sd.init_model(cfg)
  with pytest.raises(sd.CheckpointError, match="no Hugging Face GPT-2 or Llama equivalent"):
    checkpoints.export_hf(tmp_path / "x", cfg, model.params)


@pytest.mark.slow
def test_bfloat16_checkpoint_loads_as_stored_and_exports_bitwise(tmp_path):
  hf_model = _hf_model("llama", seed=4).to(torch.bfloat16)
  hf_model.save_pretrained(tmp_path / "bf16", safe_serialization=True)
  model = sd.load(str(tmp_path / "bf16"), dtype=None)
  assert {str(x.dtype) for x in checkpoints.flatten(model.params).values()} == {"bfloat16"}
  out = checkpoints.export_hf(tmp_path / "back", model.config, model.params)
  back = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
  want = hf_model.state_dict()
  for name, value in back.state_dict().items():
    assert value.dtype == torch.bfloat16
    assert torch.equal(value, want[name]), name
  tokens = np.random.default_rng(5).integers(3, 96, (1, 10))
  got = np.asarray(sd.load(str(tmp_path / "bf16")).forward(jnp.asarray(tokens, jnp.int32)))
  # The same bfloat16 weights in float32 (loaded afresh: a model cast with .to() keeps its
  # rotary frequencies rounded to bfloat16).
  want32 = _hf_logits(transformers.LlamaForCausalLM.from_pretrained(
      tmp_path / "bf16", dtype=torch.float32), tokens)
  assert np.max(np.abs(got - want32)) < TOL


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2_tiny", "llama_tiny"])
def test_export_then_load_keeps_a_config_without_bos(tmp_path, name):
  """A model without BOS exports `bos_token_id: null`; loading it back must not fill in
  transformers' default BOS (50256 for GPT-2, outside a tiny vocabulary)."""
  from specdec_jax.io.checkpoints import export_hf
  model = sd.init_model(sd.get_config(name), 0)
  assert model.config.bos_id is None
  export_hf(tmp_path, model.config, model.params)
  back = sd.load(str(tmp_path))
  assert back.config == model.config.replace(dtype=back.config.dtype)
