"""German→English pairs from the Ding dictionary as packaged by Debian (``trans-de-en``).

``apt-get install trans-de-en`` installs ``/usr/share/trans/de-en`` (GPL-2+,
TU Chemnitz "Ding" dictionary by Frank Richter): about 206k lines
``German :: English``. Each side holds sub-entries separated by ``|`` (the
k-th German sub-entry translates the k-th English one); each sub-entry holds
synonyms separated by ``;``. Annotations are written ``{f}``, ``{pl}``,
``[ugs.]``, ``[Am.]``, ``<alternative spelling>``, ``(explanatory note)`` and
``/ABBR/``. Besides single words and phrases, many entries are whole example
sentences (``Er kam zu spät. :: He came too late.``).

Parsing rule (:func:`parse_line`):

* comment (``#``), blank, or malformed lines (not exactly one `` :: ``) give nothing;
* if both sides have the same number of ``|`` sub-entries they are paired
  position by position, otherwise only the first sub-entries are paired;
* within a sub-entry, the first German synonym that is non-empty after
  cleaning is paired with the first such English synonym (synonyms are not
  aligned one to one in the dictionary, so only the first ones are used);
* cleaning removes every ``{...}``, ``[...]``, ``<...>`` and ``(...)`` group
  (parenthesised text in Ding is an optional word or an explanatory note,
  e.g. ``(zoologische Familie)``) and ``/ABBR/`` markers -- before synonyms
  are split, since notes such as ``(Druck; Vakuum)`` contain ``;`` -- then
  removes the space left before punctuation and collapses whitespace. Pairs
  where either side ends up empty, or still holds an unbalanced bracket, are
  dropped.

Umlauts, ß and typographic apostrophes are kept as they are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import re
from collections.abc import Iterable, Sequence

from specdec_jax_lab.errors import DataError, MissingDataError

DEFAULT_PATH = "/usr/share/trans/de-en"
SPLITS = ("train", "validation", "test")

_SIDE_SEP = " :: "
_ANNOTATION_RE = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>|\([^()]*\)")
_ABBREVIATION_RE = re.compile(r"(?<!\S)/[^\s/](?:[^/]*[^\s/])?/(?=[\s;]|$)")
_SPACE_BEFORE_PUNCT_RE = re.compile(r"\s+([.,!?;:…])")
_BRACKET_CHARS = frozenset("{}[]<>()")
_SENTENCE_END = (".", "!", "?", "…", ".\"", "!\"", "?\"", ".“", "!“", "?“", ".”", "!”", "?”")
# Dictionary placeholders that end in a full stop without ending a sentence.
_PLACEHOLDERS = frozenset({
    "etw.", "jdm.", "jdn.", "jds.", "sth.", "sb.", "ugs.", "usw.", "etc.", "z.B.", "u.a.",
})


@dataclasses.dataclass(frozen=True, order=True)
class Pair:
  """One German source text and its English translation."""

  de: str
  en: str


# ---------------------------------------------------------------------------- parsing


def strip_annotations(text: str) -> str:
  """Replaces Ding annotations ({..} [..] <..> (..), nested ones too, and /ABBR/) by spaces."""
  if _BRACKET_CHARS.intersection(text):
    count = 1
    while count:  # innermost groups first, so nested notes go too
      text, count = _ANNOTATION_RE.subn(" ", text)
  if "/" in text:
    text = _ABBREVIATION_RE.sub(" ", text)
  return text


def normalize_spaces(text: str) -> str:
  """Collapses whitespace runs, strips, and removes spaces before punctuation."""
  return _SPACE_BEFORE_PUNCT_RE.sub(r"\1", " ".join(text.split()))


def clean_text(text: str) -> str:
  """One synonym without annotations and with normalised spaces."""
  return normalize_spaces(strip_annotations(text))


def _first_synonym(sub_entry: str) -> str:
  """The first ``;``-separated synonym of a sub-entry that is non-empty after cleaning ('' if none).

  Annotations are removed before splitting, so a ``;`` inside ``(Druck; Vakuum)``
  does not separate synonyms.
  """
  for synonym in strip_annotations(sub_entry).split(";"):
    cleaned = normalize_spaces(synonym)
    if cleaned:
      return cleaned
  return ""


def _is_clean(text: str) -> bool:
  return bool(text) and not (_BRACKET_CHARS & set(text))


def parse_line(line: str) -> list[tuple[str, str]]:
  """The clean ``(german, english)`` pairs of one dictionary line (see module docstring).

  >>> parse_line("Aalbestand {m} | Aalbestände {pl} :: eel stock | eel stocks")
  [('Aalbestand', 'eel stock'), ('Aalbestände', 'eel stocks')]
  """
  line = line.strip()
  if not line or line.startswith("#") or line.count(_SIDE_SEP) != 1:
    return []
  de_side, en_side = line.split(_SIDE_SEP)
  de_subs, en_subs = de_side.split("|"), en_side.split("|")
  if len(de_subs) != len(en_subs):
    de_subs, en_subs = de_subs[:1], en_subs[:1]
  pairs = []
  for de_sub, en_sub in zip(de_subs, en_subs, strict=True):
    de, en = _first_synonym(de_sub), _first_synonym(en_sub)
    if _is_clean(de) and _is_clean(en):
      pairs.append((de, en))
  return pairs


def parse_lines(lines: Iterable[str]) -> list[Pair]:
  """All pairs of `lines`, in order, exact duplicates removed (first occurrence kept)."""
  seen: set[Pair] = set()
  out = []
  for line in lines:
    for de, en in parse_line(line):
      pair = Pair(de, en)
      if pair not in seen:
        seen.add(pair)
        out.append(pair)
  return out


# ---------------------------------------------------------------------------- loading & filtering


def word_count(text: str) -> int:
  """Number of whitespace-separated words."""
  return len(text.split())


def is_sentence(pair: Pair) -> bool:
  """Whether a pair looks like a whole sentence on both sides.

  Both sides start with an upper-case letter (or digit/quote) and end in
  ``. ! ? …`` (optionally followed by a closing quote); the German side has at
  least two words and does not end in a dictionary placeholder such as
  ``etw.`` / ``jdm.`` (``Ich sage es jdm.`` style entries are phrases).
  """
  return (_looks_like_sentence(pair.de) and _looks_like_sentence(pair.en)
          and word_count(pair.de) >= 2)


def _looks_like_sentence(text: str) -> bool:
  if not text or not text.endswith(_SENTENCE_END):
    return False
  first = text[0]
  if not (first.isupper() or first.isdigit() or first in "\"'„“‘«»¡¿"):
    return False
  return text.split()[-1] not in _PLACEHOLDERS


def filter_pairs(
    pairs: Iterable[Pair],
    *,
    min_words_de: int = 1,
    max_words_de: int | None = None,
    min_words_en: int = 1,
    max_words_en: int | None = None,
    max_chars: int | None = None,
    sentences_only: bool = False,
) -> list[Pair]:
  """Pairs within word-count / length bounds (inclusive), optionally only whole sentences.

  Use ``min_words_de=3`` for multi-word phrases, ``sentences_only=True`` for
  sentence-level pairs (see :func:`is_sentence`). Order is preserved.
  """
  def keep(p: Pair) -> bool:
    nde, nen = word_count(p.de), word_count(p.en)
    return (
        nde >= min_words_de
        and nen >= min_words_en
        and (max_words_de is None or nde <= max_words_de)
        and (max_words_en is None or nen <= max_words_en)
        and (max_chars is None or max(len(p.de), len(p.en)) <= max_chars)
        and (not sentences_only or is_sentence(p))
    )

  return [p for p in pairs if keep(p)]


def load_pairs(
    path: str | os.PathLike = DEFAULT_PATH,
    min_words: int = 1,
    max_chars: int | None = 200,
) -> list[Pair]:
  """Parses the whole dictionary file into de-duplicated pairs, in file order.

  Args:
    path: the Ding ``de-en`` file (default: Debian's ``/usr/share/trans/de-en``).
    min_words: keep pairs with at least this many words on each side.
    max_chars: keep pairs with at most this many characters on each side (None: no limit).

  Raises:
    MissingDataError: (a DataError and FileNotFoundError) the file does not exist.
    DataError: the file cannot be read as UTF-8 text, or gives no pairs.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise MissingDataError(
        f"German-English dictionary not found at {str(path)!r}; install it with "
        "`apt-get install trans-de-en` (Debian/Ubuntu) or pass the path of a Ding 'de-en' file"
    )
  try:
    with path.open(encoding="utf-8") as f:
      pairs = parse_lines(f)
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f"cannot read dictionary file {str(path)!r}: {e}") from e
  if not pairs:
    raise DataError(f"dictionary file {str(path)!r} holds no 'German :: English' lines")
  return filter_pairs(pairs, min_words_de=min_words, min_words_en=min_words, max_chars=max_chars)


# ---------------------------------------------------------------------------- splitting


def _split_key(de: str, seed: int) -> bytes:
  """Stable pseudo-random sort key of a German text (independent of PYTHONHASHSEED)."""
  return hashlib.sha256(f"{seed}\x00{de}".encode("utf-8")).digest()


def split_pairs(
    pairs: Sequence[Pair],
    valid_size: int = 1000,
    test_size: int = 2000,
    seed: int = 0,
) -> dict[str, list[Pair]]:
  """Deterministic train/validation/test split, disjoint by German source text.

  German texts are ordered by a SHA-256 hash of ``(seed, de)``; all pairs that
  share a German text stay together. Whole groups go to ``test`` until it holds
  at least ``test_size`` pairs, then to ``validation`` until at least
  ``valid_size``; the rest is ``train``. The result does not depend on the
  input order or on Python's hash randomisation; within a split, pairs are in
  hash order (then by English text), i.e. shuffled reproducibly.

  Raises:
    DataError: negative sizes, or too few pairs to leave a non-empty train split.
  """
  if valid_size < 0 or test_size < 0:
    raise DataError(f"split sizes must be >= 0, got valid_size={valid_size}, test_size={test_size}")
  if len(pairs) <= valid_size + test_size:
    raise DataError(
        f"{len(pairs)} pairs are too few for valid_size={valid_size} + test_size={test_size} "
        "plus a non-empty train split"
    )
  groups: dict[str, list[Pair]] = {}
  for p in pairs:
    groups.setdefault(p.de, []).append(p)
  keys = {de: _split_key(de, seed) for de in groups}
  order = sorted(groups, key=keys.__getitem__)  # SHA-256 collisions: not a practical concern
  splits: dict[str, list[Pair]] = {name: [] for name in SPLITS}
  targets = (("test", test_size), ("validation", valid_size))
  stage = 0
  for de in order:
    while stage < len(targets) and len(splits[targets[stage][0]]) >= targets[stage][1]:
      stage += 1
    name = targets[stage][0] if stage < len(targets) else "train"
    splits[name].extend(sorted(groups[de], key=lambda p: p.en))
  if not splits["train"]:
    raise DataError(
        f"no pairs left for train after test ({test_size}) and validation ({valid_size})")
  return splits
