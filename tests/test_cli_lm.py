"""The command line with decoder-only models: `specdec decode` continues text prompts (with
the drafters and heads the CLI builds for an LM, a model drafter, sampling), `specdec
convert --to hf` and back with the tokenizer carried along. (The lab's commands with
them, `eval --metric perplexity`, `bench`, the sweeps: the lab's
tests/test_lab_lm_commands.py, on this module's models.)

Tiny random Llama and GPT-2 models saved in our format, with real tokenizers trained here:
a SentencePiece model (T5 ids: pad 0, EOS 1, no BOS, as `LMConfig`'s defaults) for the
Llama, a byte-level BPE `tokenizer.json` with GPT-2's conventions (`<|endoftext|>` is EOS
and pad, no BOS) for the GPT-2.
"""

import json
import pathlib

import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import cli
from specdec_jax.io import checkpoints
from specdec_jax.io.tokenizer import check_tokenizer, load_tokenizer, train_sentencepiece

tokenizers = pytest.importorskip("tokenizers")
from test_lm_tokenizer import TEXTS, _gpt2_dir, _llama_spm  # noqa: E402

T = 8
COMMON = ["--max-new-tokens", str(T)]
# Row 1 ends in GPT-2's <|endoftext|>, its pad id: only the prompt lengths tell where it ends.
GPT2_PROMPTS = ["The dog sees", "Hello world<|endoftext|>", "cats"]
LLAMA_PROMPTS = ["The dog sees the", "Hello", "A cat likes the big house"]


def run(capsys, *argv):
  code = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return code, out, err


def ok(capsys, *argv) -> str:
  code, out, err = run(capsys, *argv)
  assert code == 0, err
  assert "Traceback" not in err
  return out


def save_llama_pair(d: pathlib.Path) -> tuple:
  """(target dir, drafter dir, SentencePiece file) saved under `d`: Llama-style (GQA,
  rotary), the tokenizer's vocabulary."""
  spm = train_sentencepiece(TEXTS * 4, d / "spm", vocab_size=50)
  config = sd.get_config("llama_tiny", vocab_size=spm.vocab_size)
  target = sd.init_model(config, 1)
  sd.save(d / "target", target)
  sd.save(d / "drafter", sd.init_model(config, 2))
  sd.save_heads(d / "target", sd.init_heads(target, 3))
  return d / "target", d / "drafter", d / "spm.model"


def save_gpt2_pair(d: pathlib.Path) -> tuple:
  """(target dir, drafter dir, tokenizer dir) saved under `d`: GPT-2 and a one-layer
  drafter."""
  tok_dir = _gpt2_dir(d / "tok")
  tok = load_tokenizer(tok_dir)
  eot, vocab = tok.eos_id, tok.vocab_size
  config = sd.get_config("gpt2_tiny", vocab_size=vocab, eos_id=eot, pad_id=eot)
  sd.save(d / "target", sd.init_model(config, 3))
  sd.save(d / "drafter", sd.init_model(sd.get_config("gpt2_tiny", vocab_size=vocab,
                                                     eos_id=eot, pad_id=eot, num_layers=1), 4))
  return d / "target", d / "drafter", tok_dir


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
  return save_llama_pair(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
  return save_gpt2_pair(tmp_path_factory.mktemp("gpt2"))


def by_hand(model_dir, tok_path, texts, max_new_tokens=T) -> list[str]:
  """The continuations from the library: prompts without EOS, their lengths passed."""
  model, tok = sd.load(str(model_dir)), load_tokenizer(tok_path)
  rows = [tok.encode_one(t, add_eos=False) for t in texts]
  lengths = np.asarray([len(r) for r in rows], np.int32)
  prompt = np.full((len(rows), lengths.max()), model.config.pad_id, np.int32)
  for i, r in enumerate(rows):
    prompt[i, :len(r)] = r
  out = sd.decode(model, sd.Autoregressive(), prompt, max_new_tokens,
                  prompt_lengths=lengths)
  return tok.decode_continuations(np.asarray(out.tokens))


# ----------------------------------------------------------------------------- decode


@pytest.mark.slow
def test_decode_llama_text_continuations_equal_the_library(capsys, llama):
  target, _, spm = llama
  out = ok(capsys, "decode", "--model", target, "--tokenizer", spm, *COMMON, *LLAMA_PROMPTS)
  assert out.splitlines() == by_hand(target, spm, LLAMA_PROMPTS)


@pytest.mark.slow
def test_decode_gpt2_passes_prompt_lengths(capsys, gpt2):
  """A prompt ending in the pad id (GPT-2's EOS) is continued from its real last token."""
  target, _, tok = gpt2
  res = json.loads(ok(capsys, "decode", "--model", target, "--tokenizer", tok, *COMMON,
                      "--json", *GPT2_PROMPTS))
  expected = by_hand(target, tok, GPT2_PROMPTS)
  assert res["outputs"] == expected
  t = load_tokenizer(tok)
  assert res["prompt_lengths"] == [len(t.encode_one(p)) for p in GPT2_PROMPTS]
  # the check has teeth: without the lengths, row 1 would lose its last token
  cut = by_hand(target, tok, ["Hello world"])
  assert cut[0] != expected[1]


# What the CLI builds for an LM itself: an n-gram table fitted on its prompts, an early-exit
# drafter cut from the target, the heads saved beside the model. (Each method's exactness on
# an LM: tests/test_exact.py; a model drafter through this CLI: the GPT-2 test below;
# --adaptive-gamma reaching the method, the prompt-lookup drafter: tests/test_cli.py.)
@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    ["--drafter", "ngram", "--gamma", "2"],
    ["--method", "bild", "--drafter", "early-exit:1", "--fallback-threshold", "1"],
    ["--method", "blockwise"],
], ids=["ngram", "bild-early-exit", "blockwise"])
def test_decode_llama_greedy_methods_print_the_autoregressive_continuation(capsys, llama,
                                                                           flags):
  target, _, spm = llama
  base = ok(capsys, "decode", "--model", target, "--tokenizer", spm, *COMMON, *LLAMA_PROMPTS)
  out = ok(capsys, "decode", "--model", target, "--tokenizer", spm, *COMMON, *flags,
           "--batch-size", "2", *LLAMA_PROMPTS)
  assert out == base
  assert len(out.splitlines()) == len(LLAMA_PROMPTS)


@pytest.mark.slow
def test_decode_gpt2_speculative_stats_compare_json(capsys, gpt2):
  target, drafter, tok = gpt2
  base = json.loads(ok(capsys, "decode", "--model", target, "--tokenizer", tok, *COMMON,
                       "--json", *GPT2_PROMPTS))
  code, out, err = run(capsys, "decode", "--model", target, "--tokenizer", tok, *COMMON,
                       "--drafter", drafter, "--gamma", "3", "--json", "--stats", "--compare",
                       *GPT2_PROMPTS)
  assert code == 0, err
  res = json.loads(out)
  assert res["outputs"] == base["outputs"]
  assert res["stats"]["drafted"] > 0 and 0.0 <= res["stats"]["alpha"] <= 1.0
  assert res["timing"]["compare"]["same_tokens"] is True
  assert "acceptance rate" in err and "target alone" in err and "speedup" in err


@pytest.mark.slow
def test_decode_lm_sampling_is_seeded(capsys, gpt2):
  target, drafter, tok = gpt2
  argv = ["decode", "--model", target, "--tokenizer", tok, *COMMON, "--drafter", drafter,
          "--temperature", "0.9", "--top-p", "0.95", "--json", *GPT2_PROMPTS]
  a = json.loads(ok(capsys, *argv, "--seed", "1"))
  b = json.loads(ok(capsys, *argv, "--seed", "1"))
  assert a["outputs"] == b["outputs"] and all(isinstance(o, str) for o in a["outputs"])
  assert a["settings"]["sampling"].startswith("Sampling(")


@pytest.mark.slow
def test_decode_lm_token_ids_verbatim(capsys, llama):
  """Without --tokenizer a prompt is ids, used as they are (no EOS added)."""
  target, _, _ = llama
  out = ok(capsys, "decode", "--model", target, *COMMON, "5 17 42", "7")
  model = sd.load(str(target))
  ref = sd.decode(model, sd.Autoregressive(), np.asarray([[5, 17, 42], [7, 0, 0]]), T,
                  prompt_lengths=np.asarray([3, 1]))
  rows = [[int(t) for t in line.split()] for line in out.splitlines()]
  assert rows == [list(r[:n]) for r, n in zip(np.asarray(ref.tokens), np.asarray(ref.lengths),
                                               strict=True)]


@pytest.mark.slow
def test_decode_lm_bad_input(capsys, llama, gpt2):
  target, _, spm = llama
  g_target, g_drafter, g_tok = gpt2
  # a tokenizer with more ids than the model's vocabulary
  code, _, err = run(capsys, "decode", "--model", target, "--tokenizer", g_tok, *COMMON, "hi")
  assert code == 1 and "300 ids" in err and "50" in err and "Traceback" not in err
  # a tokenizer whose EOS is not the model's (the GPT-2 model's embedding holds its ids)
  code, _, err = run(capsys, "decode", "--model", g_target, "--tokenizer", spm, *COMMON, "hi")
  assert code == 1 and "eos_id 1, the model 0" in err
  # a T5 drafter for an LM target, an LM drafter for a T5 target
  code, _, err = run(capsys, "decode", "--model", target, "--drafter",
                     "config:t5_1_1_tiny_drafter", *COMMON, "5 6")
  assert code == 1 and "T5 encoder-decoder" in err and "decoder-only" in err
  code, _, err = run(capsys, "decode", "--model", "config:t5_1_1_tiny", "--drafter",
                     g_drafter, *COMMON, "5 6 1")
  assert code == 1 and "decoder-only" in err
  # a prompt that encodes to nothing
  code, _, err = run(capsys, "decode", "--model", target, "--tokenizer", spm, *COMMON, " ")
  assert code == 1 and "no tokens" in err


# ----------------------------------------------------------------------------- bench


@pytest.mark.slow
def test_file_prompts_of_an_lm_have_no_eos(gpt2, tmp_path):
  from specdec_jax.io.prompts import file_prompts
  target, _, tok_dir = gpt2
  tok, config = load_tokenizer(tok_dir), sd.load(str(target)).config
  path = tmp_path / "p.txt"
  path.write_text("The dog sees the tree today.\ncats\n")
  rows = file_prompts(str(path), 5, tok, config.vocab_size, config=config)
  first, cats = tok.encode_one("The dog sees the tree today."), tok.encode_one("cats")
  assert len(first) > 5 and rows.shape == (2, 5)
  assert rows[0].tolist() == first[:5]
  assert rows[1].tolist() == cats + [config.pad_id] * (5 - len(cats))


# ----------------------------------------------------------------------------- convert


def _flat(model) -> dict:
  return {k: np.asarray(v) for k, v in checkpoints.flatten(model.params).items()}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_convert_lm_to_hf_and_back_with_its_tokenizer(capsys, gpt2, tmp_path, kind):
  """Our format -> a transformers dir -> our format: the same config and weights, the
  tokenizer files copied each way (GPT-2's tokenizer.json with its tokenizer_config.json;
  a Llama tokenizer.model with Llama's ids); transformers loads the dir."""
  import shutil
  src = tmp_path / "ours"
  if kind == "gpt2":
    shutil.copytree(gpt2[0], src)
    for name in ("tokenizer.json", "tokenizer_config.json"):
      shutil.copy(gpt2[2] / name, src / name)
    files = ["tokenizer.json", "tokenizer_config.json"]
  else:      # Llama's tokenizer.model ids (unk 0, BOS 1, EOS 2); a tiny untied GQA Llama
    _llama_spm(src)
    (src / "tokenizer.vocab").unlink()
    config = sd.get_config("llama_tiny", vocab_size=300, eos_id=2, bos_id=1, pad_id=2)
    sd.save(src, sd.init_model(config, 5))
    files = ["tokenizer.model"]
  model = sd.load(str(src))
  err = run(capsys, "convert", src, tmp_path / "hf", "--to", "hf")[2]
  assert "tokenizer: " + ", ".join(files) in err
  hf_dir = tmp_path / "hf"
  assert sorted(p.name for p in hf_dir.iterdir()) == sorted(
      ["config.json", "model.safetensors", *files])
  assert json.loads((hf_dir / "config.json").read_text())["model_type"] == kind
  back = sd.load(str(hf_dir))
  assert back.config == model.config and _flat(back).keys() == _flat(model).keys()
  for key, value in _flat(model).items():
    np.testing.assert_array_equal(_flat(back)[key], value, err_msg=key)
  tok = load_tokenizer(hf_dir)
  eot = back.config.eos_id
  assert (tok.eos_id, tok.bos_id, tok.add_bos) == ((eot, eot, False) if kind == "gpt2" else
                                                   (2, 1, True))
  check_tokenizer(tok, back)
  ok(capsys, "convert", hf_dir, tmp_path / "again")
  assert sd.load(str(tmp_path / "again")).config == model.config
  assert all((tmp_path / "again" / f).read_bytes() == (src / f).read_bytes() for f in files)
  # transformers reads the same tensors (its logits are tests/test_lm_hf.py's, on export_hf).
  pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir))
  assert type(hf_model).__name__ == {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[kind]
  assert sum(p.numel() for p in hf_model.parameters()) == model.num_params()
  np.testing.assert_array_equal(hf_model.get_input_embeddings().weight.detach().numpy(),
                                _flat(model)["token_embedder/embedding"])
