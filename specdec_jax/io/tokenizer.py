"""Tokenizers: SentencePiece models (T5's or Llama's special ids), and Hugging Face
``tokenizer.json``.

A :class:`Tokenizer` wraps a loaded ``sentencepiece.SentencePieceProcessor`` and reads its
special ids from the model itself. Two conventions occur:

- T5's (pad 0, EOS 1, unk 2, no BOS), the only one a T5 model can use: 0 doubles as the
  decoder start token and as padding, 1 ends a sequence. :meth:`Tokenizer.encode` (T5's
  encoder and target text, EOS-terminated) refuses any other::

      tok = load_tokenizer("path/to/spiece.model")      # or a directory
      ids = tok.encode(["Guten Morgen.", "Danke!"])     # int32 [2, L], EOS-terminated, 0-padded
      tok.decode(ids)                                   # ['Guten Morgen.', 'Danke!']

- Llama's (unk 0, BOS 1, EOS 2, no pad piece; its ``tokenizer.model``), or any model with an
  EOS piece, for decoder-only models: BOS is prepended when the model has one, prompts are
  right-padded with the pad piece, else with EOS (as ``transformers`` pads Llama).

``train_sentencepiece`` trains a new model from an in-memory iterable of
sentences with T5's conventions, reproducibly (one thread, no shuffling).

Hugging Face (:class:`HFTokenizer`, through the ``tokenizers`` library): a directory
holding ``tokenizer.json`` and, when present, ``tokenizer_config.json``,
``special_tokens_map.json`` and ``config.json``, which name the BOS/EOS/pad tokens and
whether BOS is prepended (GPT-2: no BOS, EOS ``<|endoftext|>``; Llama: BOS ``<s>``
prepended, EOS ``</s>``).

All kinds encode decoder-only prompts the same way, never appending EOS (an EOS would
end the text the model is asked to continue)::

    tok = load_tokenizer("gpt2")         # a dir with tokenizer.json (hf download --local-dir)
    prompt, lengths = tok.encode_prompts(["Once upon", "The"])   # int32 [B, P], [B]
    check_tokenizer(tok, model)                           # vocabulary and EOS/BOS agree
    tok.decode_continuations(new_tokens)                  # texts, each cut at its first EOS
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm

from specdec_jax import package_data
from specdec_jax.errors import TokenizerError

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2

# File names looked for, in this order, when `load_tokenizer` is given a directory. T5's
# `spiece.model` comes before `tokenizer.json` (T5 directories hold both); a Llama directory's
# `tokenizer.model` (non-T5 ids) after it.
MODEL_FILENAMES = ("spiece.model", "tokenizer.model", "sentencepiece.model")
HF_FILENAME = "tokenizer.json"
# Every file of a tokenizer kept beside a checkpoint: a SentencePiece model, a Hugging Face
# tokenizer.json and the files naming its special tokens (`convert` copies them along;
# `sd.save` and `convert --force` remove them with the model they belonged to).
TOKENIZER_FILES = (*MODEL_FILENAMES, HF_FILENAME, "tokenizer_config.json",
                   "special_tokens_map.json")
# How far a model's embedding may extend past its tokenizer's vocabulary (padded to a
# multiple of 64 or 128 for the hardware, as T5's 32100 -> 32128), in `check_tokenizer`.
MAX_EMBEDDING_PADDING = 1024
_BUNDLED_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """A SentencePiece model with the special ids it was trained with.

  T5's (pad 0, EOS 1, unk 2, no BOS: ``is_t5``) or another with an EOS piece, Llama's
  (unk 0, BOS 1, EOS 2) for decoder-only models. The ids are the model's own
  (``processor.bos_id()``, ...); a model without an EOS piece is refused.

  Attributes:
    processor: the loaded ``sentencepiece.SentencePieceProcessor``.
    path: where the model came from (file path, or ``<bundled:name>``); informational.
  """

  processor: spm.SentencePieceProcessor = dataclasses.field(repr=False, compare=False)
  path: str

  def __post_init__(self):
    if self.processor.eos_id() < 0:
      raise TokenizerError(
          f"tokenizer {self.path!r} has no EOS piece (pad/eos/unk/bos ids "
          f"{_special_ids(self.processor)}): generation could not stop. Supported: T5's "
          f"({PAD_ID}, {EOS_ID}, {UNK_ID}, -1) or Llama's (-1, 2, 0, 1)")

  @property
  def vocab_size(self) -> int:
    """Number of pieces in the SentencePiece model (a T5 network may pad its embedding beyond
    this)."""
    return int(self.processor.get_piece_size())

  @property
  def is_t5(self) -> bool:
    """T5's special ids: pad 0, EOS 1, unk 2, no BOS."""
    return _special_ids(self.processor) == (PAD_ID, EOS_ID, UNK_ID, -1)

  @property
  def pad_id(self) -> int:
    """The pad piece's id; the EOS id when the model has none (Llama's)."""
    pad = int(self.processor.pad_id())
    return self.eos_id if pad < 0 else pad

  @property
  def eos_id(self) -> int:
    return int(self.processor.eos_id())

  @property
  def unk_id(self) -> int:
    return int(self.processor.unk_id())

  @property
  def bos_id(self) -> int | None:
    """The BOS piece's id (Llama's 1); None when the model has none (T5's)."""
    bos = int(self.processor.bos_id())
    return None if bos < 0 else bos

  @property
  def add_bos(self) -> bool:
    """BOS is prepended to every encoded text when the model has a BOS piece."""
    return self.bos_id is not None

  def encode_one(self, text: str, add_eos: bool = True) -> list[int]:
    """Token ids of one string (no padding): BOS first when the model has one, EOS
    appended if ``add_eos``."""
    ids = list(self.processor.encode(_check_text(text), out_type=int))
    return ([self.bos_id] if self.add_bos else []) + ids + ([self.eos_id] if add_eos else [])

  def encode(
      self,
      texts: Sequence[str],
      max_length: int | None = None,
      add_eos: bool = True,
      truncate: bool = False,
  ) -> np.ndarray:
    """Tokenizes a batch of strings into a right-padded id matrix: T5's encoder and
    target text, so only a model with T5's special ids encodes here (decoder-only
    prompts: :meth:`encode_prompts`).

    Args:
      texts: a list (or other sequence) of B strings. A bare ``str`` is rejected,
        since iterating it would silently tokenize single characters; wrap it in
        a list or use :meth:`encode_one`.
      max_length: pad every row to exactly this length. A longer row is an error
        unless ``truncate``. ``None`` pads to the longest row.
      add_eos: append EOS (id 1) to every row.
      truncate: cut rows longer than ``max_length``, keeping EOS as the last
        token when ``add_eos``.

    Returns:
      int32 array [B, L]; pads are 0. ``L == max_length`` when given.

    Raises:
      TokenizerError: bad texts or lengths, or the model's ids are not T5's.
    """
    self.require_t5()
    rows = [self.encode_one(t, add_eos=add_eos) for t in _check_texts(texts)]
    if max_length is None:
      length = max((len(r) for r in rows), default=0)
    else:
      length = _check_max_length(max_length, add_eos)
      rows = [_fit_row(r, i, length, add_eos, truncate) for i, r in enumerate(rows)]
    return _pad_rows(rows, length)

  def require_t5(self) -> None:
    """TokenizerError unless the model has T5's special ids (what a T5 model reads)."""
    if not self.is_t5:
      raise TokenizerError(
          f"tokenizer {self.path!r} has pad/eos/unk/bos ids {_special_ids(self.processor)}; "
          f"T5 needs ({PAD_ID}, {EOS_ID}, {UNK_ID}, -1) (train with pad_id=0, eos_id=1, "
          "unk_id=2, bos_id=-1). Other ids (Llama's) are for decoder-only models")

  def encode_prompts(self, texts: Sequence[str], max_length: int | None = None,
                     truncate: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Decoder-only prompts: (int32 [B, P] right-padded with ``pad_id``, int32 [B] lengths);
    BOS first when the model has one, no EOS."""
    rows = [self.encode_one(t, add_eos=False) for t in _check_texts(texts)]
    if any(not r for r in rows):
      raise TokenizerError("encode_prompts: an empty prompt (no tokens and no BOS); a "
                           "decoder-only model needs at least one token to continue")
    return _prompt_matrix(rows, max_length, truncate, self.pad_id)

  def decode_continuations(self, tokens: Any) -> list[str]:
    """Texts of generated tokens [B, L] (or [L]), each cut at its first EOS."""
    return self.decode(tokens)

  def decode_one(self, tokens: Any) -> str:
    """Text of one id sequence [L]: stops at the first EOS, drops pads."""
    arr = _as_id_array(tokens)
    if arr.ndim != 1:
      raise TokenizerError(f"decode_one expects a 1-D id sequence [L], got shape {arr.shape}")
    return self._decode_row(arr, 0)

  def decode(self, tokens: Any) -> list[str]:
    """Texts of an id matrix [B, L] (or a single row [L], giving a list of one).

    Accepts numpy or jax integer arrays, or nested lists of ints. Each row is
    cut at its first EOS; pads are dropped, and so is BOS (a control piece); the
    remaining ids are decoded. Ids outside ``[0, vocab_size)`` raise :class:`TokenizerError`.
    """
    arr = _as_id_array(tokens)
    if arr.ndim == 1:
      arr = arr[None, :]
    if arr.ndim != 2:
      raise TokenizerError(f"decode expects ids of shape [B, L] or [L], got shape {arr.shape}")
    return [self._decode_row(row, i) for i, row in enumerate(arr)]

  def _decode_row(self, row: np.ndarray, index: int) -> str:
    eos = np.flatnonzero(row == self.eos_id)
    if eos.size:
      row = row[: eos[0]]
    row = row[row != self.pad_id]
    bad = row[(row < 0) | (row >= self.vocab_size)]
    if bad.size:
      raise TokenizerError(
          f"row {index} holds id {int(bad[0])} outside the tokenizer vocabulary "
          f"[0, {self.vocab_size}) "
          f"(a model whose embedding is padded beyond the SentencePiece vocab produced it?)"
      )
    return self.processor.decode([int(t) for t in row])


def load_tokenizer(path_or_name: str | os.PathLike) -> "Tokenizer | HFTokenizer":
  """Loads a SentencePiece model (T5's or Llama's ids) or a Hugging Face ``tokenizer.json``.

  Args:
    path_or_name: one of
      * a ``.model`` file path (T5's ``spiece.model``, Llama's ``tokenizer.model``);
      * a ``tokenizer.json`` file, or a directory holding ``spiece.model``, else
        ``tokenizer.json`` (an :class:`HFTokenizer`, with the special tokens of the
        directory's ``tokenizer_config.json``, ``special_tokens_map.json`` and
        ``config.json``), else ``tokenizer.model`` or ``sentencepiece.model``;
      * the name of a bundled tokenizer ("demo-de-en"), resolving to
        ``assets/<name>/spiece.model`` (or ``tokenizer.json``) of the installed
        distribution that ships the group (``specdec-jax-demo-small``, ...).

  Raises:
    TokenizerError: the file is missing, unreadable, not a SentencePiece model,
      or one without an EOS piece; or the bundled name is unknown (the message lists
      the bundled names).
  """
  if not isinstance(path_or_name, (str, os.PathLike)):
    raise TokenizerError(f"load_tokenizer takes a path or a bundled name (str), got "
                         f"{type(path_or_name).__name__}")
  path = pathlib.Path(path_or_name)
  if path.is_dir():
    if not (path / MODEL_FILENAMES[0]).is_file() and (path / HF_FILENAME).is_file():
      return load_hf_tokenizer(path)
    return _load_file(_model_in_dir(path))
  if path.is_file():
    return load_hf_tokenizer(path) if path.suffix == ".json" else _load_file(path)
  if (isinstance(path_or_name, str) and _BUNDLED_NAME_RE.match(path_or_name)
      and not path.suffix == ".model"):
    return _load_bundled(path_or_name)
  raise TokenizerError(f"tokenizer file or directory not found: {str(path)!r}")


def bundled_tokenizers() -> list[str]:
  """Names of the tokenizers shipped in ``assets/<name>/`` of the installed asset
  distributions (a ``spiece.model`` or a ``tokenizer.json``), sorted."""
  return sorted(d.name for root in package_data.installed_assets() if root.is_dir()
                for d in root.iterdir() if d.is_dir()
                and ((d / "spiece.model").is_file() or (d / HF_FILENAME).is_file()))


def train_sentencepiece(
    texts: Iterable[str],
    model_prefix: str | os.PathLike,
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    seed_sentencepiece_size: int = 1_000_000,
    input_sentence_size: int = 0,
    user_defined_symbols: Sequence[str] = (),
    verbose: bool = False,
) -> Tokenizer:
  """Trains a SentencePiece model with T5 ids from in-memory sentences.

  Writes ``<model_prefix>.model`` and ``<model_prefix>.vocab`` (creating the
  parent directory) and returns the loaded :class:`Tokenizer`. Training is
  reproducible: one thread, SentencePiece's input shuffling off, so the same
  texts and arguments give a byte-identical ``.model`` (the prefix itself is
  recorded in the model, so compare files written to the same prefix).

  Args:
    texts: sentences, one per item (consumed once).
    model_prefix: output path without extension.
    vocab_size: total pieces including ``<pad>``, ``</s>``, ``<unk>`` and
      ``user_defined_symbols``. SentencePiece refuses sizes the corpus cannot fill.
    model_type: "unigram" (as T5), "bpe", "char" or "word".
    character_coverage: fraction of characters covered by the vocabulary;
      1.0 keeps every character (e.g. umlauts, ß).
    seed_sentencepiece_size: unigram seed-vocabulary size.
    input_sentence_size: use only the first N sentences (0 = all); no sampling.
    user_defined_symbols: pieces always kept whole (ids right after ``<unk>``).
    verbose: show SentencePiece's training log on stderr.

  Raises:
    TokenizerError: no sentences, or SentencePiece rejected the settings.
  """
  prefix = pathlib.Path(model_prefix)
  if isinstance(texts, str):
    raise TokenizerError("train_sentencepiece expects an iterable of sentences, not a single str")
  sentences = _SentenceStream(texts)
  prefix.parent.mkdir(parents=True, exist_ok=True)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences,
        model_prefix=str(prefix),
        vocab_size=int(vocab_size),
        model_type=model_type,
        character_coverage=float(character_coverage),
        seed_sentencepiece_size=int(seed_sentencepiece_size),
        input_sentence_size=int(input_sentence_size),
        shuffle_input_sentence=False,
        num_threads=1,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        pad_piece="<pad>",
        eos_piece="</s>",
        unk_piece="<unk>",
        user_defined_symbols=list(user_defined_symbols),
        minloglevel=0 if verbose else 2,
    )
  except RuntimeError as e:
    sentences.raise_if_failed()
    raise TokenizerError(f"SentencePiece training for {str(prefix)!r} failed: {e}") from e
  sentences.raise_if_failed()
  return _load_file(prefix.with_name(prefix.name + ".model"))


# ---------------------------------------------------------------------------- Hugging Face


@dataclasses.dataclass(frozen=True)
class HFTokenizer:
  """A Hugging Face ``tokenizers.Tokenizer`` with its model's BOS/EOS/pad conventions.

  Text is encoded without the file's post-processor (``add_special_tokens=False``);
  BOS is prepended when ``add_bos``, as ``transformers`` does for the same files.

  Attributes:
    processor: the loaded ``tokenizers.Tokenizer``.
    path: where it came from; informational.
    eos_id: ends a sequence (GPT-2's ``<|endoftext|>``, Llama's ``</s>``).
    pad_id: pads right-padded prompts; the EOS id when the files name no pad token.
    bos_id: None when the tokenizer has none.
    add_bos: prepend ``bos_id`` to every encoded text.
  """

  processor: Any = dataclasses.field(repr=False, compare=False)
  path: str
  eos_id: int
  pad_id: int
  bos_id: int | None = None
  add_bos: bool = False
  unk_id: int | None = None

  def __post_init__(self):
    if self.add_bos and self.bos_id is None:
      raise TokenizerError(f"tokenizer {self.path!r} adds BOS but names no BOS token")
    for name in ("eos_id", "pad_id", "bos_id", "unk_id"):
      value = getattr(self, name)
      if value is not None and not 0 <= value < self.vocab_size:
        raise TokenizerError(f"tokenizer {self.path!r}: {name} {value} is outside its "
                             f"vocabulary [0, {self.vocab_size})")

  @property
  def vocab_size(self) -> int:
    """Number of ids, added tokens included."""
    return int(self.processor.get_vocab_size(with_added_tokens=True))

  def encode_one(self, text: str, add_eos: bool = False) -> list[int]:
    """Token ids of one string: BOS first if ``add_bos``; EOS last only if ``add_eos``."""
    ids = self.processor.encode(_check_text(text), add_special_tokens=False).ids
    return ([self.bos_id] if self.add_bos else []) + list(ids) + ([self.eos_id] if add_eos else [])

  def encode(self, texts: Sequence[str], max_length: int | None = None, add_eos: bool = False,
             truncate: bool = False) -> np.ndarray:
    """int32 [B, L], right-padded with ``pad_id``; see :meth:`Tokenizer.encode`."""
    rows = [self.encode_one(t, add_eos) for t in _check_texts(texts)]
    return _prompt_matrix(rows, max_length, truncate, self.pad_id)[0]

  def encode_prompts(self, texts: Sequence[str], max_length: int | None = None,
                     truncate: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Decoder-only prompts: (int32 [B, P] right-padded with ``pad_id``, int32 [B] lengths).

    No EOS is appended. Pass the lengths to ``model.start``: with ``pad_id == eos_id``
    (GPT-2) the pads alone cannot tell where a row ends. ``truncate`` keeps the first
    ``max_length`` tokens of a longer row; without it a longer row is an error.
    """
    rows = [self.encode_one(t) for t in _check_texts(texts)]
    if any(not r for r in rows):
      raise TokenizerError("encode_prompts: an empty prompt (no tokens and no BOS); a "
                           "decoder-only model needs at least one token to continue")
    return _prompt_matrix(rows, max_length, truncate, self.pad_id)

  def decode_one(self, tokens: Any, skip_special_tokens: bool = True) -> str:
    """Text of one id sequence [L], cut at its first EOS."""
    arr = _as_id_array(tokens)
    if arr.ndim != 1:
      raise TokenizerError(f"decode_one expects a 1-D id sequence [L], got shape {arr.shape}")
    return self._decode_row(arr, 0, skip_special_tokens)

  def decode(self, tokens: Any, skip_special_tokens: bool = True) -> list[str]:
    """Texts of ids [B, L] (or [L]), each row cut at its first EOS; ids outside the
    vocabulary raise :class:`TokenizerError`."""
    arr = _as_id_array(tokens)
    if arr.ndim == 1:
      arr = arr[None, :]
    if arr.ndim != 2:
      raise TokenizerError(f"decode expects ids of shape [B, L] or [L], got shape {arr.shape}")
    return [self._decode_row(row, i, skip_special_tokens) for i, row in enumerate(arr)]

  def decode_continuations(self, tokens: Any) -> list[str]:
    """Texts of generated tokens [B, L] (or [L]), each cut at its first EOS."""
    return self.decode(tokens)

  def _decode_row(self, row: np.ndarray, index: int, skip_special_tokens: bool) -> str:
    eos = np.flatnonzero(row == self.eos_id)
    if eos.size:
      row = row[: eos[0]]
    bad = row[(row < 0) | (row >= self.vocab_size)]
    if bad.size:
      raise TokenizerError(f"row {index} holds id {int(bad[0])} outside the tokenizer "
                           f"vocabulary [0, {self.vocab_size})")
    return self.processor.decode([int(t) for t in row], skip_special_tokens=skip_special_tokens)


def load_hf_tokenizer(path: str | os.PathLike) -> HFTokenizer:
  """Loads ``tokenizer.json`` (a file, or a directory holding it) with its conventions.

  Special tokens, first found: ``tokenizer_config.json`` (``bos_token``, ``eos_token``,
  ``pad_token``, ``unk_token``), ``special_tokens_map.json``, then the ids of
  ``config.json`` (``bos_token_id``, ...). Without an EOS token, ``<|endoftext|>`` or
  ``</s>`` when the vocabulary has one. BOS is prepended when the file's post-processor
  puts it first (Llama's template) and not otherwise (GPT-2): what ``transformers`` 5 does
  with the same files, whatever ``add_bos_token`` says.

  Raises:
    TokenizerError: missing or malformed files, no EOS token, a named token not in the
      vocabulary; or the ``tokenizers`` library is not installed.
  """
  try:
    import tokenizers
  except ImportError as e:
    raise TokenizerError("a Hugging Face tokenizer.json needs the `tokenizers` library: "
                         "pip install 'specdec-jax[lm]' (or pip install tokenizers)") from e
  path = pathlib.Path(path)
  file = path / HF_FILENAME if path.is_dir() else path
  try:
    processor = tokenizers.Tokenizer.from_file(str(file))
  except Exception as e:  # the library raises its own Exception subclass for bad JSON
    if not file.is_file():
      raise TokenizerError(f"tokenizer file not found: {str(file)!r}") from e
    raise TokenizerError(f"{str(file)!r} is not a valid Hugging Face tokenizer.json: {e}") from e
  meta = _special_tokens(file.parent)

  def token_id(name: str) -> int | None:
    token = meta.get(name)
    if token is None:
      return meta.get(name + "_id")
    found = processor.token_to_id(token)
    if found is None:
      raise TokenizerError(f"{str(file)!r}: {name} {token!r} is not in the vocabulary")
    return found

  eos = token_id("eos_token")
  for fallback in ("<|endoftext|>", "</s>"):
    eos = processor.token_to_id(fallback) if eos is None else eos
  if eos is None:
    raise TokenizerError(f"{str(file)!r}: no EOS token (set eos_token in tokenizer_config.json)")
  bos = token_id("bos_token")
  probe = processor.encode("a", add_special_tokens=True).ids
  add_bos = bos is not None and len(probe) > 0 and probe[0] == bos
  pad = token_id("pad_token")
  return HFTokenizer(processor=processor, path=str(file), eos_id=int(eos),
                     pad_id=int(eos if pad is None else pad),
                     bos_id=None if bos is None else int(bos), add_bos=bool(add_bos),
                     unk_id=token_id("unk_token"))


def _special_tokens(directory: pathlib.Path) -> dict:
  """{"bos_token": str, "bos_token_id": int, ...} from the files
  beside tokenizer.json; earlier files win (tokenizer_config over special_tokens_map over
  config)."""
  out: dict = {}
  names = ("bos_token", "eos_token", "pad_token", "unk_token")
  for fname in ("tokenizer_config.json", "special_tokens_map.json", "config.json"):
    f = directory / fname
    if not f.is_file():
      continue
    try:
      data = json.loads(f.read_text())
    except (OSError, ValueError) as e:
      raise TokenizerError(f"cannot read {str(f)!r}: {e}") from e
    if not isinstance(data, dict):
      raise TokenizerError(f"{str(f)!r} is not a JSON object")
    for name in names:
      value = data.get(name)
      if isinstance(value, dict):      # {"content": "<s>", "lstrip": false, ...}
        value = value.get("content")
      if isinstance(value, str):
        out.setdefault(name, value)
      ident = data.get(name + "_id")
      if isinstance(ident, list):      # config.json may list several EOS ids: the first ends
        ident = ident[0] if ident else None
      if isinstance(ident, int) and not isinstance(ident, bool):
        out.setdefault(name + "_id", ident)
  return out


def check_tokenizer(tok: "Tokenizer | HFTokenizer", model: Any,
                    max_padding: int = MAX_EMBEDDING_PADDING) -> None:
  """Refuses a tokenizer whose ids do not mean the model's tokens.

  The model's vocabulary (``model.vocab_size`` or ``model.config.vocab_size``) must hold
  every tokenizer id and exceed the tokenizer's by less than ``max_padding`` (an embedding
  padded for the hardware); a decoder-only model's EOS (and BOS, when both name one) must
  be the tokenizer's; a T5 model's SentencePiece model must have T5's special ids, and a
  Hugging Face tokenizer its pad and EOS ids.

  Raises:
    TokenizerError: naming both sizes or both ids.
  """
  config = getattr(model, "config", model)
  v_model, v_tok = int(config.vocab_size), int(tok.vocab_size)
  if v_tok > v_model or v_model - v_tok >= max_padding:
    raise TokenizerError(
        f"tokenizer {tok.path!r} has {v_tok} ids but the model's vocabulary is {v_model}: "
        "they do not belong together (a model may pad its embedding past the tokenizer's "
        f"vocabulary by less than {max_padding}, never the other way)")
  if getattr(config, "is_decoder_only", False):
    for name in ("eos_id", "bos_id"):
      ours, theirs = getattr(tok, name), getattr(config, name, None)
      if ours is not None and theirs is not None and ours != theirs:
        raise TokenizerError(f"tokenizer {tok.path!r} has {name} {ours}, the model {theirs}: "
                             "generation would not stop (or start) where the model expects")
  elif isinstance(tok, Tokenizer):
    tok.require_t5()
  else:   # a Hugging Face tokenizer on a T5 model: T5's pad and EOS ids, or it is another's
    for name in ("eos_id", "pad_id"):
      ours, theirs = getattr(tok, name), getattr(config, name, None)
      if theirs is not None and ours != theirs:
        raise TokenizerError(f"tokenizer {tok.path!r} has {name} {ours}, the T5 model "
                             f"{theirs}: it is not this model's tokenizer (a decoder-only "
                             "LM's?)")


# ---------------------------------------------------------------------------- helpers


class _SentenceStream:
  """Iterator over training sentences that checks them and keeps the first problem.

  SentencePiece calls the iterator from C++ and turns a Python exception into an
  opaque RuntimeError, so problems are recorded here, iteration stops, and
  `raise_if_failed` re-raises them as a TokenizerError after training.
  """

  def __init__(self, texts: Iterable[str]):
    self._it = iter(texts)
    self._index = 0
    self._non_empty = 0
    self.error: TokenizerError | None = None

  def __iter__(self):
    return self

  def __next__(self) -> str:
    if self.error is not None:
      raise StopIteration
    try:
      text = next(self._it)
    except StopIteration:
      if self._non_empty == 0:
        self.error = TokenizerError("train_sentencepiece got no non-empty sentences")
      raise
    if not isinstance(text, str):
      self.error = TokenizerError(
          f"training text {self._index} is {type(text).__name__}, expected str")
      raise StopIteration
    self._index += 1
    self._non_empty += bool(text.strip())
    return text

  def raise_if_failed(self) -> None:
    if self.error is not None:
      raise self.error


def _special_ids(processor: spm.SentencePieceProcessor) -> tuple[int, int, int, int]:
  """(pad, eos, unk, bos) ids of a SentencePiece model; -1 for a piece it does not have."""
  return (int(processor.pad_id()), int(processor.eos_id()), int(processor.unk_id()),
          int(processor.bos_id()))


def _from_bytes(data: bytes, origin: str) -> Tokenizer:
  processor = spm.SentencePieceProcessor()
  try:
    processor.LoadFromSerializedProto(data)
  except (RuntimeError, OSError, ValueError) as e:
    raise TokenizerError(f"{origin!r} is not a valid SentencePiece model: {e}") from e
  if processor.get_piece_size() == 0:
    raise TokenizerError(f"{origin!r} is not a valid SentencePiece model (no pieces)")
  return Tokenizer(processor=processor, path=origin)


def _load_file(path: pathlib.Path) -> Tokenizer:
  try:
    data = path.read_bytes()
  except OSError as e:
    raise TokenizerError(f"cannot read tokenizer file {str(path)!r}: {e.strerror or e}") from e
  return _from_bytes(data, str(path))


def _model_in_dir(directory: pathlib.Path) -> pathlib.Path:
  for name in MODEL_FILENAMES:
    if (directory / name).is_file():
      return directory / name
  raise TokenizerError(f"directory {str(directory)!r} holds none of "
                       f"{', '.join(MODEL_FILENAMES)}, {HF_FILENAME}")


def _load_bundled(name: str) -> "Tokenizer | HFTokenizer":
  root = package_data.assets(name)
  group = None if root is None else root / name
  if group is not None and (group / "spiece.model").is_file():
    return _from_bytes((group / "spiece.model").read_bytes(), f"<bundled:{name}>")
  if group is not None and (group / HF_FILENAME).is_file():
    return load_hf_tokenizer(pathlib.Path(str(group)))
  available = ", ".join(bundled_tokenizers()) or "none"
  raise TokenizerError(
      f"no tokenizer file or directory {name!r}, and no bundled tokenizer of that name "
      f"(bundled: {available})"
  )


def _check_texts(texts: Sequence[str]) -> Sequence[str]:
  if isinstance(texts, (str, bytes)):
    raise TokenizerError(
        "encode expects a list of strings, got a single "
        f"{type(texts).__name__}; wrap it in a list (encode([text])) or use encode_one"
    )
  if not isinstance(texts, Iterable):
    raise TokenizerError(f"encode expects a list of strings, got {type(texts).__name__}")
  texts = list(texts)
  for i, t in enumerate(texts):
    if not isinstance(t, str):
      raise TokenizerError(f"encode: text {i} is {type(t).__name__}, expected str")
  return texts


def _check_text(text: Any) -> str:
  """`text` if it is a str that UTF-8 can encode. A lone surrogate (what Python makes of
  bytes that are not UTF-8 in a command line or a file read with errors="surrogateescape")
  is not text: the tokenizers' native code would fail on it with an opaque error."""
  if not isinstance(text, str):
    raise TokenizerError(f"encode_one expects a str, got {type(text).__name__}")
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    raise TokenizerError(
        f"text {text[:40]!r} holds {text[e.start]!r} at position {e.start}, a lone surrogate "
        "that is not Unicode text (bytes that were not UTF-8?): re-encode the input as "
        "UTF-8") from None
  return text


def _check_max_length(max_length: int, add_eos: bool) -> int:
  least = 1 if add_eos else 0
  if int(max_length) != max_length or max_length < least:
    raise TokenizerError(f"max_length must be an integer >= {least}, got {max_length!r}")
  return int(max_length)


def _fit_row(row: list[int], index: int, length: int, add_eos: bool, truncate: bool) -> list[int]:
  """Returns `row` if it fits in `length`, its truncation (EOS kept last) if allowed, else
  raises."""
  if len(row) <= length:
    return row
  if not truncate:
    eos_note = " (including EOS)" if add_eos else ""
    raise TokenizerError(
        f"row {index} has {len(row)} tokens{eos_note}, longer than max_length={length}; "
        "pass truncate=True to cut it"
    )
  return row[: length - 1] + [EOS_ID] if add_eos else row[:length]


def _prompt_matrix(rows: list[list[int]], max_length: int | None, truncate: bool,
                   pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """(int32 [B, P] right-padded with `pad_id`, int32 [B] lengths) of rows without EOS."""
  if max_length is None:
    length = max((len(r) for r in rows), default=0)
  else:
    length = _check_max_length(max_length, False)
    rows = [_fit_row(r, i, length, False, truncate) for i, r in enumerate(rows)]
  out = np.full((len(rows), length), pad_id, dtype=np.int32)
  for i, r in enumerate(rows):
    out[i, : len(r)] = r
  return out, np.asarray([len(r) for r in rows], np.int32)


def _pad_rows(rows: list[list[int]], length: int) -> np.ndarray:
  """[B, length] int32 matrix of `rows`, right-padded with PAD_ID."""
  out = np.full((len(rows), length), PAD_ID, dtype=np.int32)
  for i, r in enumerate(rows):
    out[i, : len(r)] = r
  return out


def _as_id_array(tokens: Any) -> np.ndarray:
  try:
    arr = np.asarray(tokens)
  except (ValueError, TypeError) as e:
    raise TokenizerError(f"cannot read token ids as an array: {e}") from e
  if arr.size == 0 and arr.dtype.kind not in "iu":
    arr = arr.astype(np.int32)
  if arr.dtype.kind not in "iu":
    raise TokenizerError(f"token ids must be integers, got dtype {arr.dtype}")
  return arr.astype(np.int64)
