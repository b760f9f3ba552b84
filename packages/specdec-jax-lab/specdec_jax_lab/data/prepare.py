"""Turn the De→En dictionary into a tokenised, split dataset for training and evaluation.

    prepare_de_en(out_dir, vocab_size=8000)  ->  out_dir/
        spiece.model                 SentencePiece (pad 0, EOS 1, unk 2) trained on train De + En
        {train,validation,test}.npz  inputs / targets int32 [N, L] (EOS appended, 0-padded)
        {train,validation,test}.jsonl  the text pairs, one {"de", "en"} per line
        meta.json                    counts, lengths, filters

Everything is deterministic given the arguments (the split is hash-based, see `split_pairs`).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from specdec_jax.io.tokenizer import HFTokenizer, Tokenizer, load_tokenizer, train_sentencepiece
from specdec_jax_lab.data import de_en
from specdec_jax_lab.errors import DataError


def encode_split(tok: Tokenizer, pairs: list[de_en.Pair], max_len: int
                 ) -> tuple[np.ndarray, np.ndarray, list[de_en.Pair]]:
  """Tokenise pairs, dropping those longer than `max_len` tokens (EOS included) on either side."""
  kept = []
  ins, outs = [], []
  for p in pairs:
    a, b = tok.encode_one(p.de), tok.encode_one(p.en)
    if len(a) <= max_len and len(b) <= max_len:
      kept.append(p)
      ins.append(a)
      outs.append(b)
  pad = lambda rows: np.array([r + [0] * (max_len - len(r)) for r in rows], np.int32).reshape(
      len(rows), max_len)
  return pad(ins), pad(outs), kept


def load_split(data_dir: str | pathlib.Path, split: str) -> dict:
  """{'inputs', 'targets'} arrays and the text 'pairs' of one split (DataError naming the
  file when one is missing or unreadable)."""
  data_dir = pathlib.Path(data_dir)
  path = data_dir / f"{split}.npz"
  try:
    with np.load(path) as arrays:
      inputs, targets = arrays["inputs"], arrays["targets"]
    path = data_dir / f"{split}.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
  except OSError as e:
    raise DataError(f"cannot read {str(path)!r}: {e.strerror or e}") from None
  except UnicodeDecodeError as e:
    raise DataError(f"{str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
  except (KeyError, ValueError) as e:
    raise DataError(f"{str(path)!r} is not a prepared split: {e}") from None
  pairs = [de_en.Pair(**json.loads(line)) for line in lines]
  return {"inputs": inputs, "targets": targets, "pairs": pairs}


#: The tokenizer of a `.jsonl` split given without one: the bundled demo pair's.
DEFAULT_TOKENIZER = "demo-de-en"


def read_pairs_jsonl(path: str | pathlib.Path) -> list[de_en.Pair]:
  """The {"de", "en"} text pairs of a `.jsonl` file, one object per line (DataError naming
  the line when one is malformed)."""
  path = pathlib.Path(path)
  try:
    lines = path.read_text(encoding="utf-8").splitlines()
  except OSError as e:
    raise DataError(f"cannot read {str(path)!r}: {e.strerror or e}") from None
  except UnicodeDecodeError as e:
    raise DataError(f"{str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start}): save "
                    "it as UTF-8") from None
  pairs = []
  for i, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      pairs.append(de_en.Pair(de=str(record["de"]), en=str(record["en"])))
    except (ValueError, KeyError, TypeError) as e:
      raise DataError(f"{str(path)!r} line {i}: expected an object with \"de\" and \"en\" "
                      f"strings ({type(e).__name__}: {e})") from None
  if not pairs:
    raise DataError(f"{str(path)!r} holds no pairs")
  return pairs


def load_jsonl_split(path: str | pathlib.Path,
                     tok: Tokenizer | HFTokenizer | None = None) -> dict:
  """A split from a `.jsonl` file of text pairs, tokenised with `tok` (default: the bundled
  demo tokenizer): {'inputs', 'targets'} int32 [N, L] (EOS appended, 0-padded) and
  'pairs', as `load_split` returns for a prepared directory.

  >>> split = load_jsonl_split("tests/data/demo_test_pairs.jsonl")
  >>> split["inputs"].shape[0] == len(split["pairs"]) == 64
  True
  """
  pairs = read_pairs_jsonl(path)
  tok = load_tokenizer(DEFAULT_TOKENIZER) if tok is None else tok
  return {"inputs": tok.encode([p.de for p in pairs]),
          "targets": tok.encode([p.en for p in pairs]), "pairs": pairs}


def prepare_de_en(out_dir: str | pathlib.Path, vocab_size: int = 8000, max_len: int = 32,
                  min_words_de: int = 2, path: str = de_en.DEFAULT_PATH,
                  test_size: int = 2000, valid_size: int = 1000, seed: int = 0) -> dict:
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  pairs = de_en.filter_pairs(de_en.load_pairs(path), min_words_de=min_words_de)
  splits = de_en.split_pairs(pairs, valid_size=valid_size, test_size=test_size, seed=seed)
  texts = [t for p in splits["train"] for t in (p.de, p.en)]
  tok = train_sentencepiece(texts, out / "spiece", vocab_size=vocab_size)   # spiece.model, loaded
  meta: dict[str, Any]
  meta = {"source": path, "licence": "GPL-2.0-or-later (Debian trans-de-en, TU Chemnitz Ding)",
          "vocab_size": vocab_size, "max_len": max_len, "min_words_de": min_words_de,
          "seed": seed, "pairs_after_filter": len(pairs), "splits": {}}
  for name, split_pairs in splits.items():
    inputs, targets, kept = encode_split(tok, split_pairs, max_len)
    np.savez(out / f"{name}.npz", inputs=inputs, targets=targets)
    (out / f"{name}.jsonl").write_text(
        "".join(json.dumps({"de": p.de, "en": p.en}, ensure_ascii=False) + "\n" for p in kept))
    meta["splits"][name] = {"pairs": len(kept), "dropped_too_long": len(split_pairs) - len(kept),
                            "mean_input_tokens": float((inputs > 0).sum(1).mean()),
                            "mean_target_tokens": float((targets > 0).sum(1).mean())}
  (out / "meta.json").write_text(json.dumps(meta, indent=1))
  return meta
