"""Prompts in, encoder tokens (or decoder-only prompts) out: from arguments, files or stdin
(random ids: `batching.random_prompts`).

    lines = read_prompt_lines(["5 17 42 1"], input_file=None)
    tokens = encode_prompts(lines, tokenizer=None, vocab_size=512)   # int32 [B, L], 0-padded
    tokens = file_prompts("prompts.txt", 32, tokenizer, 512)         # [N, 32], padded or cut
    tokens, lengths = encode_lm_prompts(lines, tokenizer, lm.config)  # [B, P], [B]; no EOS

Without a tokenizer a prompt is space- or comma-separated token ids, used verbatim
(no EOS is appended); with one it is text (the tokenizer appends EOS for a T5 encoder,
never for a decoder-only model's prompt). An empty line is an empty input, never skipped
(output line i answers input line i): EOS alone for a T5 encoder; a decoder-only model
needs a token to continue, so an empty prompt that encodes to none is an error naming it.
"""

from __future__ import annotations

import sys
from typing import Sequence

import numpy as np

from specdec_jax.errors import PromptError
from specdec_jax.io.prompts import encode_lm_prompts, encode_prompts
from specdec_jax.runtime.report import read_text


def read_prompt_lines(prompts: Sequence[str], input_file: str | None, stdin=None) -> list[str]:
  """Prompts from arguments, `--input-file FILE` ("-" = stdin), or stdin.

  Stdin is read when the only argument is "-", or when there are no prompt arguments
  and stdin is not a terminal. File and stdin input is one prompt per line, blank lines
  included (an empty input each: output line i answers input line i).
  """
  stdin = sys.stdin if stdin is None else stdin
  prompts = list(prompts)
  if input_file is not None and prompts:
    raise PromptError("give prompts either as arguments or with --input-file, not both")
  if input_file is not None:
    text = stdin.read() if input_file == "-" else read_text(input_file, "prompt file")
  elif prompts == ["-"] or (not prompts and stdin is not None and not isatty(stdin)):
    text = stdin.read()
  else:
    if "-" in prompts:
      raise PromptError('"-" (read stdin) must be the only prompt argument')
    if not prompts:
      raise PromptError("no prompts: give them as arguments, with --input-file, or on stdin")
    return prompts
  lines = text.splitlines()
  if not lines:
    where = "stdin" if input_file in (None, "-") else repr(input_file)
    raise PromptError(f"no prompts: {where} is empty")
  return lines


def isatty(stream, unknown: bool = True) -> bool:
  """Whether `stream` is a terminal; `unknown` for a closed or unusual stream (reading
  prompts: True, so as not to block on it)."""
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError, OSError):
    return unknown


def file_prompts(path: str, length: int, tokenizer, vocab_size: int,
                 config=None) -> np.ndarray:
  """Non-blank lines of `path` -> [N, length] (text via `tokenizer`, else token ids),
  padded or cut: a benchmark's prompts, whose outputs answer no line.

  With a decoder-only model's `config`, the lines are its prompts (`encode_lm_prompts`: no
  EOS, right-padded with its pad id; a prompt ending in the pad id loses that token)."""
  lines = [line for line in read_prompt_lines([], path) if line.strip()]
  if not lines:
    raise PromptError(f"no prompts: {path!r} holds no non-blank lines")
  if config is not None and getattr(config, "is_decoder_only", False):
    return encode_lm_prompts(lines, tokenizer, config, length)[0]
  return encode_prompts(lines, tokenizer, vocab_size, length, config)

