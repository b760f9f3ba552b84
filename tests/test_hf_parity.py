"""Parity with Hugging Face transformers' PyTorch T5 on random weights, through `sd.load`."""

import numpy as np
import pytest
from helpers import FIXTURE_DIR

import specdec_jax as sd
from specdec_jax.io import checkpoints

torch = pytest.importorskip("torch", reason="needs the interop extra (torch, transformers)")
transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=512, d_model=64, num_heads=4, d_kv=16, d_ff=128, num_layers=3,
             num_decoder_layers=3, decoder_start_token_id=0, eos_token_id=1, pad_token_id=0,
             dropout_rate=0.0)


def _hf_model(feed_forward_proj: str, tie: bool, seed: int):
  torch.manual_seed(seed)
  config = transformers.T5Config(feed_forward_proj=feed_forward_proj, tie_word_embeddings=tie,
                                 **SIZES)
  model = transformers.T5ForConditionalGeneration(config).eval()
  with torch.no_grad():
    if not tie:   # a real T5 1.1 has its own output layer
      model.lm_head.weight = torch.nn.Parameter(torch.randn(512, 64) * 0.5)
    # Sharpen the output so that greedy paths are not decided by float noise.
    model.lm_head.weight.mul_(4.0) if not tie else model.shared.weight.mul_(2.0)
  return model


def _inputs():
  rng = np.random.RandomState(0)
  enc = rng.randint(2, 512, (4, 10)).astype(np.int64)
  enc[1, 6:] = 0
  enc[2, 3:] = 0
  enc[[0, 1, 2, 3], [9, 5, 2, 9]] = 1
  dec = rng.randint(2, 512, (4, 8)).astype(np.int64)
  dec[:, 0] = 0
  return enc, dec


@pytest.fixture(scope="module", params=[("relu", True), ("gated-gelu", False)],
                ids=["t5_1_0", "t5_1_1"])
def pair(request, tmp_path_factory):
  hf = _hf_model(*request.param, seed=3)
  path = tmp_path_factory.mktemp("hf")
  hf.save_pretrained(path, safe_serialization=True)
  return hf, sd.load(str(path)), request.param[1]


@pytest.mark.slow
def test_loaded_variant(pair):
  _, ours, tied = pair   # (transformers 5 rewrites tie_word_embeddings; use what we asked for)
  assert ours.config.logits_via_embedding == tied
  assert ours.config.mlp_activations == (("relu",) if ours.config.logits_via_embedding
                                         else ("gelu", "linear"))


@pytest.mark.slow
def test_logits_match_hf(pair):
  hf, ours, _ = pair
  enc, dec = _inputs()
  with torch.no_grad():
    expected = hf(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
                  decoder_input_ids=torch.tensor(dec)).logits.numpy()
  got = np.asarray(ours.forward(enc.astype(np.int32), dec.astype(np.int32)))
  np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
  # cached decode agrees with HF as well
  cache = ours.start(enc.astype(np.int32), capacity=8)
  step, _ = ours.decode(dec[:, :8].astype(np.int32), cache)
  np.testing.assert_allclose(np.asarray(step), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("pair", [("gated-gelu", False)], ids=["t5_1_1"], indirect=True)
def test_greedy_generate_matches_hf(pair):
  """T5 1.1 (T5 1.0 differs in its layers and tied output: test_logits_match_hf, both)."""
  hf, ours, _ = pair
  enc, _ = _inputs()
  with torch.no_grad():
    hf_out = hf.generate(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
                         do_sample=False, num_beams=1, max_new_tokens=12, min_new_tokens=0)
  hf_tokens = hf_out.numpy()[:, 1:]                       # drop the decoder start token
  out = sd.generate(ours, enc.astype(np.int32), max_new_tokens=12)
  ours_tokens = np.asarray(out.tokens)[:, :hf_tokens.shape[1]]
  np.testing.assert_array_equal(ours_tokens, hf_tokens)   # HF pads finished rows with 0 too
  assert np.all(np.asarray(out.tokens)[:, hf_tokens.shape[1]:] == 0)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["legacy", "orbax"])
def test_sd_load_t5x_fixture_reproduces_reference(layout, t5x_model):
  """Both T5X checkpoint layouts load as the reference's config and params, bitwise: the
  model whose logits and greedy tokens are T5X's (test_model.py::test_fixture_logits_match_t5x,
  test_generate.py::test_generate_reproduces_t5x_greedy)."""
  model = sd.load(str(FIXTURE_DIR / layout), kernels="xla")
  assert model.config == t5x_model.config
  got, want = (checkpoints.flatten(m.params) for m in (model, t5x_model))
  assert got.keys() == want.keys()
  for name, value in want.items():
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(value), err_msg=name)


@pytest.mark.slow
def test_save_load_round_trip_and_hf_export(tmp_path, t5x_model):
  sd.save(tmp_path / "ours", t5x_model)
  again = sd.load(str(tmp_path / "ours"))
  for a, b in zip(*(map(np.asarray, __import__("jax").tree_util.tree_leaves(m.params))
                    for m in (t5x_model, again)), strict=True):
    np.testing.assert_array_equal(a, b)
  checkpoints.export_hf(tmp_path / "hf", t5x_model.config, t5x_model.params)
  hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
  enc = np.array([[5, 6, 7, 1]], np.int64)
  dec = np.array([[0, 9, 10]], np.int64)
  with torch.no_grad():
    expected = hf(input_ids=torch.tensor(enc), decoder_input_ids=torch.tensor(dec)).logits.numpy()
  np.testing.assert_allclose(np.asarray(t5x_model.forward(enc.astype(np.int32),
                                                          dec.astype(np.int32))),
                             expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_load_with_dtype_casts_params():
  model = sd.load(str(FIXTURE_DIR / "legacy"), dtype="bfloat16")
  leaf = model.params["decoder"]["logits_dense"]["kernel"]
  assert str(leaf.dtype) == "bfloat16"
