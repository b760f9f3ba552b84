"""prepare_de_en on a small synthetic Ding-format dictionary: files, shapes, EOS, padding,
length filter, determinism, load_split round trip."""

import json
import random

import numpy as np
import pytest

from specdec_jax.io.tokenizer import EOS_ID, load_tokenizer
from specdec_jax_lab.data import de_en, prepare

WORDS = [("Hund", "dog"), ("Katze", "cat"), ("Haus", "house"), ("Baum", "tree"),
         ("Wasser", "water"), ("Brot", "bread"), ("rot", "red"), ("grün", "green"),
         ("groß", "big"), ("klein", "small"), ("alt", "old"), ("neu", "new"),
         ("schnell", "fast"), ("langsam", "slow"), ("Stadt", "town"), ("Fluss", "river"),
         ("Berg", "mountain"), ("Straße", "street"), ("Tür", "door"), ("Buch", "book"),
         ("Vogel", "bird"), ("Fisch", "fish"), ("Milch", "milk"), ("Käse", "cheese"),
         ("Apfel", "apple"), ("Garten", "garden"), ("Fenster", "window"), ("Schule", "school"),
         ("Kind", "child"), ("Mutter", "mother"), ("Vater", "father"), ("Freund", "friend"),
         ("Wald", "forest"), ("Himmel", "sky"), ("Sonne", "sun"), ("Mond", "moon"),
         ("Zug", "train"), ("Schiff", "ship"), ("Wagen", "car"), ("Pferd", "horse"),
         ("warm", "warm"), ("kalt", "cold"), ("hell", "bright"), ("dunkel", "dark"),
         ("süß", "sweet"), ("bitter", "bitter"), ("leise", "quiet"), ("laut", "loud")]
GENDERS = ("{m}", "{f}", "{n}")
SPLIT_SIZES = {"test_size": 30, "valid_size": 20}


def write_dictionary(path, lines: int = 300, seed: int = 0, long_every: int = 25):
  """~`lines` synthetic ``German :: English`` lines in Ding's format.

  Each entry translates word by word; some carry annotations ({m}, [ugs.], (note)),
  some have two ``|`` sub-entries, every `long_every`-th is a long run of words
  (too long for a small max_len), and a header comment comes first.
  """
  rng = random.Random(seed)
  out = ["# Version :: synthetic test dictionary", ""]
  for i in range(lines):
    n = 12 if long_every and i % long_every == long_every - 1 else rng.randint(2, 4)
    idx = [rng.randrange(len(WORDS)) for _ in range(n)]
    de = " ".join(WORDS[j][0] for j in idx)
    en = " ".join(WORDS[j][1] for j in idx)
    if i % 7 == 0:
      de = f"{de} {rng.choice(GENDERS)}"
    if i % 11 == 0:
      en = f"{en} [ugs.]"
    if i % 13 == 0:
      de, en = f"{de} (Notiz)", f"{en} (note)"
    if i % 5 == 0:
      k = rng.randrange(len(WORDS))
      de, en = f"{de} | {WORDS[k][0]} {de}", f"{en} | {WORDS[k][1]} {en}"
    out.append(f"{de} :: {en}")
  path.write_text("\n".join(out) + "\n", encoding="utf-8")
  return path


@pytest.fixture(scope="module")
def dictionary(tmp_path_factory):
  return write_dictionary(tmp_path_factory.mktemp("dict") / "de-en")


@pytest.fixture(scope="module")
def prepared(dictionary, tmp_path_factory):
  out = tmp_path_factory.mktemp("prepared")
  meta = prepare.prepare_de_en(out, vocab_size=120, max_len=12, path=str(dictionary),
                               **SPLIT_SIZES)
  return out, meta


def test_writes_tokenizer_splits_and_meta(prepared, dictionary):
  out, meta = prepared
  assert (out / "spiece.model").is_file()
  for split in de_en.SPLITS:
    assert (out / f"{split}.npz").is_file() and (out / f"{split}.jsonl").is_file()
  on_disk = json.loads((out / "meta.json").read_text())
  assert on_disk == meta
  assert meta["vocab_size"] == 120 and meta["max_len"] == 12
  assert meta["source"] == str(dictionary)
  assert set(meta["splits"]) == set(de_en.SPLITS)
  assert load_tokenizer(out / "spiece.model").vocab_size == 120


def test_shapes_eos_and_padding(prepared):
  out, meta = prepared
  for split in de_en.SPLITS:
    arrays = np.load(out / f"{split}.npz")
    n = meta["splits"][split]["pairs"]
    assert n > 0
    for key in ("inputs", "targets"):
      a = arrays[key]
      assert a.shape == (n, 12) and a.dtype == np.int32
      lengths = (a > 0).sum(1)
      assert lengths.min() >= 2                       # at least one piece + EOS
      rows = np.arange(n)
      assert np.all(a[rows, lengths - 1] == EOS_ID)   # EOS ends every row ...
      assert np.all((a == EOS_ID).sum(1) == 1)        # ... exactly once
      pad = np.arange(12)[None, :] >= lengths[:, None]
      assert np.all(a[pad] == 0) and np.all(a[~pad] > 0)   # 0-padded, no holes


def test_too_long_pairs_dropped(prepared, dictionary):
  out, meta = prepared
  tok = load_tokenizer(out / "spiece.model")
  pairs = de_en.filter_pairs(de_en.load_pairs(str(dictionary)), min_words_de=2)
  splits = de_en.split_pairs(pairs, seed=0, **SPLIT_SIZES)
  dropped = 0
  for split, split_pairs in splits.items():
    fits = [p for p in split_pairs
            if len(tok.encode_one(p.de)) <= 12 and len(tok.encode_one(p.en)) <= 12]
    kept = prepare.load_split(out, split)["pairs"]
    assert kept == fits
    assert meta["splits"][split]["dropped_too_long"] == len(split_pairs) - len(fits)
    dropped += len(split_pairs) - len(fits)
  assert dropped > 0      # the 12-word entries cannot fit in 12 tokens


def test_deterministic(dictionary, prepared, tmp_path):
  first, meta = prepared
  again = prepare.prepare_de_en(tmp_path, vocab_size=120, max_len=12, path=str(dictionary),
                                **SPLIT_SIZES)
  assert again == meta
  for split in de_en.SPLITS:
    a, b = np.load(first / f"{split}.npz"), np.load(tmp_path / f"{split}.npz")
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    np.testing.assert_array_equal(a["targets"], b["targets"])
    assert (first / f"{split}.jsonl").read_text() == (tmp_path / f"{split}.jsonl").read_text()


def test_load_split_round_trip(prepared):
  out, meta = prepared
  tok = load_tokenizer(out / "spiece.model")
  for split in de_en.SPLITS:
    data = prepare.load_split(out, split)
    assert set(data) == {"inputs", "targets", "pairs"}
    assert len(data["pairs"]) == len(data["inputs"]) == meta["splits"][split]["pairs"]
    assert all(isinstance(p, de_en.Pair) for p in data["pairs"])
    inputs, targets, kept = prepare.encode_split(tok, data["pairs"], 12)
    assert kept == data["pairs"]
    np.testing.assert_array_equal(inputs, data["inputs"])
    np.testing.assert_array_equal(targets, data["targets"])
    assert tok.decode(data["targets"]) == [p.en for p in data["pairs"]]
    assert tok.decode(data["inputs"]) == [p.de for p in data["pairs"]]
    # annotations were cleaned away by the parser
    assert not any(c in p.de + p.en for p in data["pairs"] for c in "{}[]()")


def test_missing_dictionary_is_a_clear_error(tmp_path):
  with pytest.raises(de_en.MissingDataError, match="not found"):
    prepare.prepare_de_en(tmp_path / "out", vocab_size=120, path=str(tmp_path / "nope"))
