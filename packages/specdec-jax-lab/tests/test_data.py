"""Tests for specdec_jax_lab.data.de_en (parser on literal lines; real file if installed)."""

import pathlib
import random

import pytest

from specdec_jax_lab.data import (
  DEFAULT_PATH,
  DataError,
  MissingDataError,
  Pair,
  clean_text,
  filter_pairs,
  is_sentence,
  load_pairs,
  parse_line,
  parse_lines,
  split_pairs,
)

HAVE_REAL_FILE = pathlib.Path(DEFAULT_PATH).is_file()
needs_real_file = pytest.mark.skipif(
    not HAVE_REAL_FILE, reason=f"{DEFAULT_PATH} absent (apt-get install trans-de-en)"
)


# ---------------------------------------------------------------------------- parse_line


@pytest.mark.parametrize(
    "line",
    [
        "# Version :: devel 2023-01-30",
        "#Aal {m} :: eel",
        "",
        "   \n",
        "Aal {m} - eel",  # no ' :: '
        "Aal {m}::eel",  # separator needs spaces
        "a :: b :: c",  # more than one separator
    ],
)
def test_comment_blank_and_malformed_lines_give_nothing(line):
  assert parse_line(line) == []


def test_equal_sub_entry_counts_are_aligned():
  line = "Aalspieß {m} | Aalspieße {pl} :: eel spear | eel spears\n"
  assert parse_line(line) == [("Aalspieß", "eel spear"), ("Aalspieße", "eel spears")]


def test_unequal_sub_entry_counts_align_first_only():
  line = ("Aachener {adj} | der Aachener Dom | Aachener Printen [cook.] :: Aachen "
          "| the Aachen Cathedral")
  assert parse_line(line) == [("Aachener", "Aachen")]


def test_first_synonym_of_each_side():
  line = ("Abholort {m}; Abholstelle {f} | Abholorte {pl} :: collection location; "
          "pickup location | collection locations")
  assert parse_line(line) == [("Abholort", "collection location"),
                              ("Abholorte", "collection locations")]


def test_first_non_empty_synonym_is_used():
  assert parse_line("{f}; Kaffee {m} :: [coll.]; coffee") == [("Kaffee", "coffee")]


@pytest.mark.parametrize(
    "line, expected",
    [
        ("Abhörgerät {n}; Wanze {f} [ugs.] :: listening device [Am.]; bug",
         ("Abhörgerät", "listening device")),
        ("Echte Aale {pl} (Anguillidae) (zoologische Familie) [zool.] :: "
         "freshwater eels (zoological family)",
         ("Echte Aale", "freshwater eels")),
        ("Aalreuse {f} :: eel trap <eeltrap> [archaic]", ("Aalreuse", "eel trap")),
        ("(abendliche) Abiturfeier {f} [Dt.] :: graduation party",
         ("Abiturfeier", "graduation party")),
        ("Gerät {n} (mit (innerem) Zähler) :: device (with (internal) counter)",
         ("Gerät", "device")),
        ("Abbau {m} (Druck; Vakuum) :: decay (pressure; vacuum)", ("Abbau", "decay")),
        ("Mehrwertsteuer {f} /MwSt./ :: value added tax /VAT/; sales tax",
         ("Mehrwertsteuer", "value added tax")),
        ("Kleiner Scherz (am Rande)! :: Just kidding /jk/", ("Kleiner Scherz!", "Just kidding")),
        ("  Größe   {f}\t [math.] ::   size  ", ("Größe", "size")),
    ],
)
def test_annotations_removed(line, expected):
  assert parse_line(line) == [expected]


def test_umlauts_and_eszett_preserved():
  line = "Süßwasseraale {pl}; Flussaale {pl} | Äußerung {f} :: freshwater eels | utterance"
  assert parse_line(line) == [("Süßwasseraale", "freshwater eels"), ("Äußerung", "utterance")]
  assert clean_text(" Öl ÄÖÜ äöü ß ") == "Öl ÄÖÜ äöü ß"


def test_sentence_entries():
  assert parse_line("Er kam zu spät. :: He came too late.") == [
      ("Er kam zu spät.", "He came too late.")]
  assert parse_line("Geiz ist geil. :: Cheap is beautiful.; Cheap is cool.") == [
      ("Geiz ist geil.", "Cheap is beautiful.")
  ]
  line = ("Abänderung {f} | Ich habe ein paar Änderungen vorgenommen. :: modification "
          "| I’ve made one or two modifications.")
  assert parse_line(line)[1] == ("Ich habe ein paar Änderungen vorgenommen.",
                                 "I’ve made one or two modifications.")


def test_empty_sides_dropped():
  line = "Abbrecher {m} | Abbrecher {pl} | Schulabbrecher {m} :: dropout <drop-out> | dropouts | "
  assert parse_line(line) == [("Abbrecher", "dropout"), ("Abbrecher", "dropouts")]
  assert parse_line("{f} [ugs.] :: something") == []
  assert parse_line("etwas :: (only a note)") == []


def test_unbalanced_brackets_dropped():
  assert parse_line("geburtenstarke Jahrgänge (der Nachkriegszeit :: baby boom") == []


def test_parse_lines_deduplicates_keeping_first():
  lines = ["Aal {m} :: eel", "# comment", "Aal {m} [cook.] :: eel", "Aal {m} :: Eel", "Hund :: dog"]
  assert parse_lines(lines) == [Pair("Aal", "eel"), Pair("Aal", "Eel"), Pair("Hund", "dog")]


# ---------------------------------------------------------------------------- filtering


def test_is_sentence():
  assert is_sentence(Pair("Er kam zu spät.", "He came too late."))
  assert is_sentence(Pair("Siehst du ihn jemals?", "Do you ever see him?"))
  assert not is_sentence(Pair("Aal", "eel"))
  assert not is_sentence(Pair("Hallo!", "Hello!"))  # one German word
  assert not is_sentence(Pair("sich abgeben mit jdm./etw.", "to have to do with sb./sth."))
  assert not is_sentence(Pair("Ich sage es jdm.", "I tell sb."))
  assert not is_sentence(Pair("Er kam zu spät.", "too late"))


def test_filter_pairs():
  pairs = [
      Pair("Aal", "eel"),
      Pair("blauer Aal", "eel au bleu"),
      Pair("Aal in Aspik serviert", "jellied eel"),
      Pair("Er kam zu spät.", "He came too late."),
  ]
  assert filter_pairs(pairs) == pairs
  assert filter_pairs(pairs, min_words_de=3) == pairs[2:]
  assert filter_pairs(pairs, min_words_en=3, max_words_en=3) == [pairs[1]]
  assert filter_pairs(pairs, max_words_de=2) == pairs[:2]
  assert filter_pairs(pairs, max_chars=11) == pairs[:2]
  assert filter_pairs(pairs, sentences_only=True) == [pairs[3]]


# ---------------------------------------------------------------------------- loading


def test_load_pairs_from_small_file(tmp_path):
  path = tmp_path / "de-en"
  path.write_text(
      "# Version :: test\n"
      "Aal {m} | Aale {pl} :: eel | eels\n"
      "Aal {m} :: eel\n"
      "Er kam zu spät. :: He came too late.\n"
      "sehr langer Eintrag mit vielen Wörtern :: a very long entry with many words\n",
      encoding="utf-8",
  )
  assert load_pairs(path) == [
      Pair("Aal", "eel"),
      Pair("Aale", "eels"),
      Pair("Er kam zu spät.", "He came too late."),
      Pair("sehr langer Eintrag mit vielen Wörtern", "a very long entry with many words"),
  ]
  assert load_pairs(path, min_words=2, max_chars=20) == [
      Pair("Er kam zu spät.", "He came too late.")]


def test_missing_file_error(tmp_path):
  missing = tmp_path / "no-such-dir" / "de-en"
  with pytest.raises(MissingDataError, match="apt-get install trans-de-en") as info:
    load_pairs(missing)
  assert isinstance(info.value, DataError) and isinstance(info.value, FileNotFoundError)
  assert str(missing) in str(info.value)


def test_file_without_pairs_error(tmp_path):
  path = tmp_path / "de-en"
  path.write_text("# only a comment\n", encoding="utf-8")
  with pytest.raises(DataError, match="no 'German :: English' lines"):
    load_pairs(path)


# ---------------------------------------------------------------------------- splitting


def _synthetic_pairs(n: int = 600) -> list[Pair]:
  """n pairs over n // 2 German texts (each German text has two translations)."""
  return [Pair(f"Satz Nummer {i // 2}", f"sentence number {i // 2} variant {i % 2}")
          for i in range(n)]


def test_split_is_deterministic_and_order_independent():
  pairs = _synthetic_pairs()
  first = split_pairs(pairs, valid_size=50, test_size=100, seed=0)
  assert first == split_pairs(list(pairs), valid_size=50, test_size=100, seed=0)
  shuffled = list(pairs)
  random.Random(3).shuffle(shuffled)
  assert split_pairs(shuffled, valid_size=50, test_size=100, seed=0) == first
  assert split_pairs(pairs, valid_size=50, test_size=100, seed=1) != first


def test_split_sizes_and_disjointness():
  pairs = _synthetic_pairs()
  splits = split_pairs(pairs, valid_size=50, test_size=100)
  assert set(splits) == {"train", "validation", "test"}
  assert len(splits["test"]) >= 100 and len(splits["validation"]) >= 50
  assert sum(len(v) for v in splits.values()) == len(pairs)
  assert sorted(p for v in splits.values() for p in v) == sorted(pairs)
  sources = {name: {p.de for p in v} for name, v in splits.items()}
  assert not sources["train"] & sources["validation"]
  assert not sources["train"] & sources["test"]
  assert not sources["validation"] & sources["test"]


def test_split_errors():
  with pytest.raises(DataError, match="too few"):
    split_pairs(_synthetic_pairs(20), valid_size=10, test_size=10)
  with pytest.raises(DataError, match=">= 0"):
    split_pairs(_synthetic_pairs(20), valid_size=-1, test_size=1)


# ---------------------------------------------------------------------------- the real file


@pytest.fixture(scope="module")
def real_pairs():
  return load_pairs()


@needs_real_file
@pytest.mark.slow
def test_real_file_pairs_and_split(real_pairs):
  assert len(real_pairs) > 300_000
  assert len(set(real_pairs)) == len(real_pairs)
  splits = split_pairs(real_pairs)
  assert len(splits["test"]) >= 1000 and len(splits["validation"]) >= 1000
  test_sources = {p.de for p in splits["test"]}
  assert not test_sources & {p.de for p in splits["train"]}
  assert not test_sources & {p.de for p in splits["validation"]}


@pytest.mark.slow
@needs_real_file
def test_real_file_sentences(real_pairs):
  sentences = filter_pairs(real_pairs, sentences_only=True)
  assert len(sentences) > 10_000
  # from the line "je; jemals {adv} | ... | Siehst du ihn jemals? | ... :: ever | ... |
  # Do you ever see him? | ..."
  assert Pair("Siehst du ihn jemals?", "Do you ever see him?") in sentences
  assert all(is_sentence(p) for p in sentences)
  splits = split_pairs(sentences)
  assert len(splits["test"]) >= 1000
