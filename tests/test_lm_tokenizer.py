"""Hugging Face tokenizer.json loading, SentencePiece models with Llama's ids, BOS/EOS
conventions, prompt encoding for decoder-only models, and the tokenizer/model vocabulary
check (`specdec_jax.io.tokenizer`)."""

import json
import sys

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

import specdec_jax as sd  # noqa: E402
from specdec_jax.errors import TokenizerError  # noqa: E402
from specdec_jax.io.tokenizer import (  # noqa: E402
  HFTokenizer,
  Tokenizer,
  check_tokenizer,
  load_tokenizer,
  train_sentencepiece,
)

TEXTS = ["The dog sees the tree today.", "A cat likes the big house!",
         "Hello world, hello dogs.", "Über café naïve — unicode too.",
         "The baker paints the bridge every Sunday.", "dogs and cats and trees"]
PROBES = TEXTS + ["  two leading spaces", "cats", "an unseen wordzzz"]


def _gpt2_dir(d):
  """Byte-level BPE, one special token <|endoftext|> (BOS = EOS = unk, nothing prepended)."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(TEXTS * 3, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  d.mkdir(parents=True, exist_ok=True)
  tok.save(str(d / "tokenizer.json"))
  (d / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
       "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}))
  return d


def _llama_dir(d, template=True, config=None):
  """Metaspace BPE with <unk> 0, <s> 1, </s> 2; BOS from the post-processor's template."""
  tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.decoder = decoders.Metaspace()
  tok.train_from_iterator(TEXTS * 3, trainers.BpeTrainer(
      vocab_size=160, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
  if template:
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
  d.mkdir(parents=True, exist_ok=True)
  tok.save(str(d / "tokenizer.json"))
  (d / "tokenizer_config.json").write_text(json.dumps(
      config if config is not None else
      {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
       "unk_token": "<unk>"}))
  return d


def _llama_spm(d, vocab_size=300):
  """A SentencePiece model trained as Llama's tokenizer.model is: BPE with byte fallback,
  unk 0, BOS 1, EOS 2, no pad piece; written as d/tokenizer.model."""
  import sentencepiece
  d.mkdir(parents=True, exist_ok=True)
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(TEXTS * 4), model_prefix=str(d / "tokenizer"),
      vocab_size=vocab_size, model_type="bpe", byte_fallback=True, split_digits=True,
      unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=1.0, num_threads=1,
      normalization_rule_name="identity", minloglevel=2)
  return d / "tokenizer.model"


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
  return _gpt2_dir(tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
  return _llama_dir(tmp_path_factory.mktemp("llama"))


# ---------------------------------------------------------------------------- conventions


def test_gpt2_conventions(gpt2_dir):
  tok = load_tokenizer(gpt2_dir)
  assert isinstance(tok, HFTokenizer)
  eot = tok.processor.token_to_id("<|endoftext|>")
  assert (tok.eos_id, tok.pad_id, tok.add_bos) == (eot, eot, False)   # no pad: EOS pads
  ids = tok.encode_one("cats")
  assert eot not in ids and ids == tok.processor.encode("cats").ids


def test_llama_conventions(llama_dir):
  tok = load_tokenizer(llama_dir / "tokenizer.json")     # the file itself loads too
  assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.add_bos) == (1, 2, 0, True)
  ids = tok.encode_one("cats")
  assert ids[0] == 1 and 2 not in ids
  assert tok.encode_one("cats", add_eos=True) == ids + [2]


def test_the_template_decides_bos(tmp_path):
  # As transformers 5: the file's post-processor, not add_bos_token, decides.
  on = load_tokenizer(_llama_dir(tmp_path / "on", template=True, config={
      "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False}))
  off = load_tokenizer(_llama_dir(tmp_path / "off", template=False, config={
      "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}))
  assert on.encode_one("cats")[0] == 1 and on.add_bos
  assert off.encode_one("cats")[0] != 1 and not off.add_bos


def test_special_tokens_from_map_and_config(tmp_path):
  d = _llama_dir(tmp_path, config={})
  (d / "special_tokens_map.json").write_text(json.dumps(
      {"bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>"}))
  (d / "config.json").write_text(json.dumps({"pad_token_id": 0, "eos_token_id": [0, 1]}))
  tok = load_tokenizer(d)
  # The map names BOS/EOS (the map wins over config.json's ids); the pad id comes from config.
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)


def test_eos_falls_back_to_a_known_token(tmp_path):
  d = _llama_dir(tmp_path, config={})
  assert load_tokenizer(d).eos_id == 2          # "</s>" in the vocabulary


def test_bad_files(tmp_path):
  d = tmp_path / "bad"
  d.mkdir()
  (d / "tokenizer.json").write_text("{not json")
  with pytest.raises(TokenizerError, match="not a valid Hugging Face tokenizer.json"):
    load_tokenizer(d)
  good = _llama_dir(tmp_path / "unknown", config={"eos_token": "<eot>"})
  with pytest.raises(TokenizerError, match="eos_token '<eot>' is not in the vocabulary"):
    load_tokenizer(good)


def test_missing_library_names_the_install(llama_dir, monkeypatch):
  monkeypatch.setitem(sys.modules, "tokenizers", None)
  with pytest.raises(TokenizerError, match="pip install"):
    load_tokenizer(llama_dir)


def test_spiece_model_comes_first_in_a_directory(tmp_path, llama_dir):
  # A T5 directory holds spiece.model and tokenizer.json: the T5 SentencePiece model loads.
  d = tmp_path / "t5"
  train_sentencepiece(TEXTS * 20, d / "spiece", vocab_size=50)
  (d / "tokenizer.json").write_bytes((llama_dir / "tokenizer.json").read_bytes())
  assert isinstance(load_tokenizer(d), Tokenizer)


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_round_trip(kind, gpt2_dir, llama_dir):
  tok = load_tokenizer(gpt2_dir if kind == "gpt2" else llama_dir)
  for text in TEXTS:
    assert tok.decode_one(tok.encode_one(text)) == text


def test_encode_prompts_right_pads_with_lengths(llama_dir, gpt2_dir):
  for d in (llama_dir, gpt2_dir):
    tok = load_tokenizer(d)
    texts = ["cats", "The dog sees the tree today."]
    prompt, lengths = tok.encode_prompts(texts)
    rows = [tok.encode_one(t) for t in texts]
    assert prompt.dtype == np.int32 and lengths.dtype == np.int32
    assert prompt.shape == (2, max(map(len, rows)))
    assert lengths.tolist() == [len(r) for r in rows]
    for b, r in enumerate(rows):
      assert prompt[b, :len(r)].tolist() == r
      assert (prompt[b, len(r):] == tok.pad_id).all()
      assert tok.eos_id not in r
  with pytest.raises(TokenizerError, match="longer than max_length=3"):
    tok.encode_prompts(texts, max_length=3)
  cut, lengths = tok.encode_prompts(texts, max_length=3, truncate=True)
  assert cut.shape == (2, 3) and lengths.tolist() == [min(len(r), 3) for r in rows]
  with pytest.raises(TokenizerError, match="empty prompt"):
    tok.encode_prompts([""])       # GPT-2: no BOS, so "" has no token at all
  with pytest.raises(TokenizerError, match="single str"):
    tok.encode_prompts("cats")


def test_decode_continuations_stop_at_eos(llama_dir):
  tok = load_tokenizer(llama_dir)
  a, b = tok.encode_one("cats")[1:], tok.encode_one("dogs and cats")[1:]
  gen = np.asarray([a + [2] + b, b + [2, 2, 2][:len(a) + 1]])
  gen = np.asarray([row[:min(map(len, gen))] for row in gen])
  texts = tok.decode_continuations(gen)
  assert texts[0] == "cats"
  assert texts[1] == tok.decode_one(gen[1][:list(gen[1]).index(2)] if 2 in gen[1] else gen[1])
  with pytest.raises(TokenizerError, match="outside the tokenizer vocabulary"):
    tok.decode_continuations([[5, tok.vocab_size]])


def test_sentencepiece_prompts_have_no_eos(tmp_path):
  tok = train_sentencepiece(TEXTS * 20, tmp_path / "spiece", vocab_size=50)
  prompt, lengths = tok.encode_prompts(["cats", "The dog sees the tree today."])
  assert 1 not in prompt.tolist()[0] and 1 not in prompt.tolist()[1]
  assert lengths.tolist() == [len(tok.encode_one(t, add_eos=False))
                              for t in ["cats", "The dog sees the tree today."]]
  assert tok.encode(["cats"])[0, lengths[0]] == 1      # the encoder input keeps its EOS
  assert tok.decode_continuations(np.asarray(tok.encode(["cats"]))) == ["cats"]


# ----------------------------------------------------------------------- SentencePiece, Llama's ids


def test_sentencepiece_llama_conventions(tmp_path):
  """BOS/EOS/unk are the model's own ids; BOS prepended, no EOS in a prompt; pads are EOS
  (no pad piece); the ids are SentencePiece's own with add_bos."""
  path = _llama_spm(tmp_path)
  tok = load_tokenizer(tmp_path)                   # a directory holding tokenizer.model
  assert isinstance(tok, Tokenizer) and not tok.is_t5
  assert (tok.unk_id, tok.bos_id, tok.eos_id, tok.pad_id, tok.add_bos) == (0, 1, 2, 2, True)
  assert tok.vocab_size == 300
  for text in PROBES:
    ids = tok.encode_one(text, add_eos=False)
    assert ids == tok.processor.encode(text, add_bos=True), text
    assert tok.encode_one(text) == ids + [2]
    assert tok.decode_one(ids + [2, 7]) == tok.processor.decode(ids), text
  prompt, lengths = tok.encode_prompts(["cats", "The dog sees the tree today."])
  assert lengths.tolist() == [len(tok.encode_one(t, add_eos=False))
                              for t in ["cats", "The dog sees the tree today."]]
  assert (prompt[:, 0] == 1).all() and 2 not in prompt[1].tolist()
  assert (prompt[0, lengths[0]:] == 2).all()
  assert tok.encode_prompts([""])[1].tolist() == [1]          # BOS alone
  assert tok.decode_continuations(prompt) == ["cats", "The dog sees the tree today."]
  # T5 reads pad 0 / EOS 1: these ids are refused for T5 text, and for a T5 model.
  with pytest.raises(TokenizerError, match=r"T5 needs \(0, 1, 2, -1\).*decoder-only"):
    tok.encode(["cats"])
  with pytest.raises(TokenizerError, match="T5 needs"):
    check_tokenizer(tok, sd.get_config("t5_1_1_tiny").replace(vocab_size=320))
  assert load_tokenizer(path).path == str(path)


def _lm_config(vocab_size, eos_id=2, bos_id=1):
  return sd.get_config("llama_tiny").replace(vocab_size=vocab_size, eos_id=eos_id,
                                             bos_id=bos_id)


def test_sentencepiece_llama_against_the_model(tmp_path):
  tok = load_tokenizer(_llama_spm(tmp_path))
  check_tokenizer(tok, _lm_config(300))
  with pytest.raises(TokenizerError, match="has 300 ids but the model's vocabulary is 256"):
    check_tokenizer(tok, _lm_config(256))
  with pytest.raises(TokenizerError, match="eos_id 2, the model 1"):
    check_tokenizer(tok, _lm_config(300, eos_id=1, bos_id=None))
  with pytest.raises(TokenizerError, match="bos_id 1, the model 3"):
    check_tokenizer(tok, _lm_config(300, bos_id=3))


def test_sentencepiece_without_eos_is_refused(tmp_path):
  import sentencepiece
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(TEXTS * 4), model_prefix=str(tmp_path / "no_eos"), vocab_size=50,
      unk_id=0, bos_id=1, eos_id=-1, pad_id=-1, num_threads=1, minloglevel=2)
  with pytest.raises(TokenizerError, match="no EOS piece"):
    load_tokenizer(tmp_path / "no_eos.model")


def test_sentencepiece_llama_parity_with_transformers(tmp_path):
  """transformers builds its LlamaTokenizer from the same tokenizer.model: same special
  ids, vocabulary and pieces (it prepends BOS only when its config says so)."""
  transformers = pytest.importorskip("transformers")
  _llama_spm(tmp_path)
  ours = load_tokenizer(tmp_path)
  theirs = transformers.LlamaTokenizer.from_pretrained(str(tmp_path))
  assert (ours.bos_id, ours.eos_id, ours.unk_id) == (
      theirs.bos_token_id, theirs.eos_token_id, theirs.unk_token_id)
  assert ours.vocab_size == len(theirs)
  for text in TEXTS:
    ids = ours.encode_one(text, add_eos=False)
    assert ids[1:] == theirs.encode(text, add_special_tokens=False), text
    assert ours.decode_one(ids) == theirs.decode(ids, skip_special_tokens=True), text


# ---------------------------------------------------------------------------- vs the model


@pytest.mark.slow
def test_check_tokenizer(llama_dir):
  """A model (its config read through `.config`), then configs alone: the checks read
  nothing else, and a model per vocabulary would be an init each."""
  tok = load_tokenizer(llama_dir)
  check_tokenizer(tok, sd.init_model(_lm_config(tok.vocab_size), 0))
  check_tokenizer(tok, _lm_config(-(-tok.vocab_size // 64) * 64 + 64))   # a padded embedding
  with pytest.raises(TokenizerError, match=rf"has {tok.vocab_size} ids but the model's "
                                           rf"vocabulary is {tok.vocab_size - 1}"):
    check_tokenizer(tok, _lm_config(tok.vocab_size - 1))
  with pytest.raises(TokenizerError, match="vocabulary is 4096"):
    check_tokenizer(tok, _lm_config(4096))
  with pytest.raises(TokenizerError, match="eos_id 2, the model 3"):
    check_tokenizer(tok, _lm_config(tok.vocab_size, eos_id=3))


# ---------------------------------------------------------------------------- transformers


@pytest.mark.parametrize("kind", ["gpt2", "llama", "llama_class", "no_template"])
def test_parity_with_transformers(kind, gpt2_dir, llama_dir, tmp_path):
  transformers = pytest.importorskip("transformers")
  if kind in ("llama_class", "no_template"):
    d = _llama_dir(tmp_path, template=kind == "llama_class", config={
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True})
  else:
    d = gpt2_dir if kind == "gpt2" else llama_dir
  ours, theirs = load_tokenizer(d), transformers.AutoTokenizer.from_pretrained(str(d))
  assert (ours.bos_id, ours.eos_id) == (theirs.bos_token_id, theirs.eos_token_id)
  # transformers' LlamaTokenizer rebuilds the pipeline (byte fallback for unseen characters,
  # where the file maps them to <unk>): compared on text the vocabulary covers.
  for text in (TEXTS if kind in ("llama_class", "no_template") else PROBES):
    ids = theirs.encode(text)
    assert ours.encode_one(text) == ids, text
    assert ours.decode_one(ids) == theirs.decode(ids, skip_special_tokens=True), text
  assert ours.vocab_size == len(theirs)
