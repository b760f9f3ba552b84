"""Tests for specdec_jax.io.tokenizer, on a tiny SentencePiece model trained here."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm

from specdec_jax.io.tokenizer import (
  EOS_ID,
  PAD_ID,
  UNK_ID,
  Tokenizer,
  TokenizerError,
  bundled_tokenizers,
  load_tokenizer,
  train_sentencepiece,
)

VOCAB_SIZE = 100

_DE_SUBJECTS = ["Der Hund", "Die Katze", "Das Mädchen", "Der Bäcker", "Die Ärztin", "Ein Junge"]
_DE_VERBS = ["sieht", "mag", "grüßt", "öffnet", "sucht", "malt"]
_DE_OBJECTS = ["den Baum", "die Brücke", "das schöne Haus", "die große Übung", "den Apfel",
               "das Öl"]
_DE_PLACES = ["heute", "morgen früh", "im Garten", "am Fluss", "ohne Grund", "jeden Sonntag",
              "während der Woche"]
_EN_SUBJECTS = ["The dog", "The cat", "The girl", "The baker", "The doctor", "A boy"]
_EN_VERBS = ["sees", "likes", "greets", "opens", "looks for", "paints"]
_EN_OBJECTS = ["the tree", "the bridge", "the nice house", "the big exercise", "the apple",
               "the oil"]
_EN_PLACES = ["today", "early tomorrow", "in the garden", "by the river", "for no reason",
              "every Sunday", "during the week"]


def _corpus() -> list[str]:
  """432 short German and English sentences (with umlauts and ß)."""
  de = [
      f"{s} {v} {o} {_DE_PLACES[i % len(_DE_PLACES)]}."
      for i, (s, v, o) in enumerate(itertools.product(_DE_SUBJECTS, _DE_VERBS, _DE_OBJECTS))
  ]
  en = [
      f"{s} {v} {o} {_EN_PLACES[i % len(_EN_PLACES)]}!"
      for i, (s, v, o) in enumerate(itertools.product(_EN_SUBJECTS, _EN_VERBS, _EN_OBJECTS))
  ]
  return de + en


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("spm")
  train_sentencepiece(_corpus(), directory / "spiece", vocab_size=VOCAB_SIZE)
  return directory


@pytest.fixture(scope="module")
def tok(model_dir) -> Tokenizer:
  return load_tokenizer(model_dir / "spiece.model")


# ---------------------------------------------------------------------------- conventions


def test_t5_special_ids(tok):
  assert (tok.pad_id, tok.eos_id, tok.unk_id) == (0, 1, 2) == (PAD_ID, EOS_ID, UNK_ID)
  sp = tok.processor
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
  assert tok.is_t5 and (tok.pad_id, tok.eos_id, tok.unk_id, tok.bos_id) == (0, 1, 2, None)
  assert [sp.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
  assert tok.vocab_size == VOCAB_SIZE


def test_train_writes_model_and_vocab(model_dir):
  assert (model_dir / "spiece.model").stat().st_size > 0
  vocab_lines = (model_dir / "spiece.vocab").read_text(encoding="utf-8").splitlines()
  assert len(vocab_lines) == VOCAB_SIZE


# ---------------------------------------------------------------------------- encode


def test_encode_shape_padding_eos(tok):
  texts = ["Der Hund sieht den Baum.", "Die Ärztin grüßt das schöne Haus.", "Öl", ""]
  ids = tok.encode(texts)
  rows = [tok.encode_one(t) for t in texts]
  assert ids.dtype == np.int32
  assert ids.shape == (4, max(len(r) for r in rows))
  for i, row in enumerate(rows):
    assert row[-1] == EOS_ID and EOS_ID not in row[:-1] and PAD_ID not in row
    np.testing.assert_array_equal(ids[i, : len(row)], row)
    assert (ids[i, len(row):] == PAD_ID).all()
  np.testing.assert_array_equal(ids[3, :1], [EOS_ID])


def test_encode_without_eos(tok):
  ids = tok.encode(["Der Hund", "Die Katze malt"], add_eos=False)
  assert EOS_ID not in ids
  assert ids.shape[1] == len(tok.encode_one("Die Katze malt", add_eos=False))


def test_encode_pads_to_max_length(tok):
  ids = tok.encode(["Der Hund", "Die Katze"], max_length=20)
  assert ids.shape == (2, 20)
  assert (ids[:, -1] == PAD_ID).all()


def test_encode_empty_batch(tok):
  assert tok.encode([]).shape == (0, 0)
  assert tok.encode([], max_length=7).shape == (0, 7)


def test_encode_too_long_names_row_and_lengths(tok):
  long_text = "Das Mädchen grüßt die große Übung und den Apfel."
  n = len(tok.encode_one(long_text))
  with pytest.raises(TokenizerError, match=rf"row 1 has {n} tokens.*max_length=5"):
    tok.encode(["Hund", long_text], max_length=5)


def test_encode_truncate_keeps_eos_last(tok):
  long_text = "Das Mädchen grüßt die große Übung und den Apfel."
  full = tok.encode_one(long_text)
  ids = tok.encode(["Öl", long_text], max_length=5, truncate=True)
  assert ids.shape == (2, 5)
  np.testing.assert_array_equal(ids[1], full[:4] + [EOS_ID])
  no_eos = tok.encode([long_text], max_length=5, truncate=True, add_eos=False)
  np.testing.assert_array_equal(no_eos[0], full[:5])


def test_encode_rejects_single_string_and_bad_items(tok):
  with pytest.raises(TokenizerError, match="list of strings.*encode_one"):
    tok.encode("Der Hund")
  with pytest.raises(TokenizerError, match="text 1 is int"):
    tok.encode(["Hund", 3])
  with pytest.raises(TokenizerError, match="max_length"):
    tok.encode(["Hund"], max_length=0)


# ---------------------------------------------------------------------------- decode


@pytest.mark.parametrize(
    "text",
    [
        "The dog sees the tree!",
        "A boy paints the big exercise!",
        "Das Mädchen grüßt die große Übung.",
        "Die Ärztin öffnet das Öl.",
        "Größe über Äpfel",  # not in the training corpus, but every character is
    ],
)
def test_decode_round_trip(tok, text):
  assert tok.decode(tok.encode([text])) == [text]
  assert tok.decode_one(tok.encode_one(text)) == text


def test_decode_batch_round_trip(tok):
  texts = ["Der Bäcker sucht den Apfel.", "The cat opens the oil!", ""]
  assert tok.decode(tok.encode(texts, max_length=32)) == texts


def test_decode_accepts_1d_jax_and_lists(tok):
  row = tok.encode(["Der Hund mag den Baum."])[0]
  expected = "Der Hund mag den Baum."
  assert tok.decode(row) == [expected]
  assert tok.decode(jnp.asarray(row)) == [expected]
  assert tok.decode(jnp.asarray(row)[None, :]) == [expected]
  assert tok.decode([row.tolist()]) == [expected]
  assert tok.decode_one(jnp.asarray(row)) == expected


def test_decode_stops_at_first_eos_and_drops_pads(tok):
  a = tok.encode_one("Der Hund", add_eos=False)
  b = tok.encode_one("Die Katze", add_eos=False)
  ids = np.array([[PAD_ID, PAD_ID] + a + [EOS_ID] + b + [EOS_ID]])
  assert tok.decode(ids) == ["Der Hund"]
  assert tok.decode(np.array([a + [PAD_ID] + b])) == ["Der Hund Die Katze"]  # b starts with "▁Die"
  assert tok.decode(np.zeros((2, 4), np.int32)) == ["", ""]


def test_decode_rejects_bad_ids(tok):
  with pytest.raises(TokenizerError, match=f"id {VOCAB_SIZE + 5} outside"):
    tok.decode(np.array([[5, VOCAB_SIZE + 5, EOS_ID]]))
  # ids after EOS are never looked at
  assert tok.decode(np.array([[EOS_ID, VOCAB_SIZE + 5]])) == [""]
  with pytest.raises(TokenizerError, match="integers"):
    tok.decode(np.array([[1.0, 2.0]]))
  with pytest.raises(TokenizerError, match=r"\[B, L\]"):
    tok.decode(np.zeros((1, 2, 3), np.int32))


# ---------------------------------------------------------------------------- loading


def test_load_from_file_and_directories(model_dir, tmp_path, tok):
  data = (model_dir / "spiece.model").read_bytes()
  (tmp_path / "tokenizer.model").write_bytes(data)
  text = ["Die Katze grüßt die Brücke."]
  expected = tok.encode(text)
  for source in (model_dir / "spiece.model", str(model_dir / "spiece.model"), model_dir, tmp_path):
    np.testing.assert_array_equal(load_tokenizer(source).encode(text), expected)
  assert load_tokenizer(model_dir).path == str(model_dir / "spiece.model")


def test_load_directory_without_model(tmp_path):
  with pytest.raises(TokenizerError, match="spiece.model, tokenizer.model, sentencepiece.model"):
    load_tokenizer(tmp_path)


def test_load_unknown_bundled_name_lists_bundled():
  bundled = ", ".join(bundled_tokenizers()) or "none"
  with pytest.raises(TokenizerError, match=rf"no-such-tokenizer.*\(bundled: {bundled}\)"):
    load_tokenizer("no-such-tokenizer")


def test_load_missing_file(tmp_path):
  missing = tmp_path / "absent" / "spiece.model"
  with pytest.raises(TokenizerError, match="not found.*absent"):
    load_tokenizer(missing)


def test_load_corrupt_file_names_it(tmp_path):
  bad = tmp_path / "broken.model"
  bad.write_bytes(b"\x00\x01 this is not a sentencepiece model \xff")
  with pytest.raises(TokenizerError, match="broken.model.*not a valid SentencePiece model"):
    load_tokenizer(bad)


def test_t5_text_needs_t5_ids(tmp_path):
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(_corpus()), model_prefix=str(tmp_path / "plain"), vocab_size=60,
      num_threads=1, minloglevel=2,
  )  # SentencePiece defaults: unk 0, bos 1, eos 2 (Llama's ids: loads, for decoder-only models)
  plain = load_tokenizer(tmp_path / "plain.model")
  assert not plain.is_t5 and (plain.bos_id, plain.eos_id) == (1, 2)
  with pytest.raises(TokenizerError, match=r"pad/eos/unk/bos ids.*T5 needs \(0, 1, 2, -1\)"):
    plain.encode(["Der Hund"])


# ---------------------------------------------------------------------------- training


def test_training_is_deterministic(tmp_path, tok):
  # The prefix is recorded in the model, so byte equality is checked for the same prefix ...
  first = train_sentencepiece(_corpus(), tmp_path / "spiece", vocab_size=VOCAB_SIZE)
  first_bytes = (tmp_path / "spiece.model").read_bytes()
  train_sentencepiece(list(_corpus()), tmp_path / "spiece", vocab_size=VOCAB_SIZE)
  assert (tmp_path / "spiece.model").read_bytes() == first_bytes
  assert first.encode(["Ein Junge"]).tolist() == tok.encode(["Ein Junge"]).tolist()
  # ... and pieces / encodings for a different prefix (and an iterator input).
  other = train_sentencepiece(iter(_corpus()), tmp_path / "sub" / "other", vocab_size=VOCAB_SIZE)
  pieces = lambda t: [t.processor.id_to_piece(i) for i in range(t.vocab_size)]
  assert pieces(other) == pieces(tok)
  texts = ["Ein Junge malt den Apfel.", "The baker likes the bridge!"]
  np.testing.assert_array_equal(other.encode(texts), tok.encode(texts))


def test_training_user_defined_symbols(tmp_path):
  t = train_sentencepiece(_corpus(), tmp_path / "sym", vocab_size=80,
                          user_defined_symbols=("<de>", "<en>"))
  assert t.processor.piece_to_id("<de>") == 3 and t.processor.piece_to_id("<en>") == 4
  ids = t.encode_one("<en> Der Hund", add_eos=False)
  assert 4 in ids and t.decode_one(ids) == "<en> Der Hund"


def test_training_errors(tmp_path):
  with pytest.raises(TokenizerError, match="no non-empty sentences"):
    train_sentencepiece(["", "  "], tmp_path / "empty", vocab_size=20)
  with pytest.raises(TokenizerError, match="training text 1 is int"):
    train_sentencepiece(["Der Hund", 7], tmp_path / "bad", vocab_size=20)
  with pytest.raises(TokenizerError, match="single str"):
    train_sentencepiece("Der Hund", tmp_path / "str", vocab_size=20)
  with pytest.raises(TokenizerError, match="Vocabulary size too high"):
    train_sentencepiece(["Der Hund"] * 5, tmp_path / "big", vocab_size=500)
