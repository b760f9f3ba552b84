"""Datasets for the demos: German→English pairs from Debian's ``trans-de-en`` dictionary."""

from specdec_jax_lab.data.de_en import (
  DEFAULT_PATH,
  SPLITS,
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
  word_count,
)

__all__ = [
    "DEFAULT_PATH",
    "SPLITS",
    "DataError",
    "MissingDataError",
    "Pair",
    "clean_text",
    "filter_pairs",
    "is_sentence",
    "load_pairs",
    "parse_line",
    "parse_lines",
    "split_pairs",
    "word_count",
]
