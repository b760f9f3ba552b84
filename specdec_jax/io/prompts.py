"""Prompts encoded for a model, beside its tokenizer: text (or token ids) in, the encoder
tokens of a T5 model or a decoder-only model's right-padded prompts and their lengths out.

    prompts = Prompts.encode(["5 17 42 1"], tokenizer=None, config=t5.config)  # tokens [B, L]
    prompts = Prompts.encode(texts, tokenizer, lm.config)    # tokens [B, P], lengths [B]
    budget, note = prompts.fit(64, lm.config)                # new tokens that fit the model
    lines = read_prompt_lines(["5 17 42 1"], input_file=None)   # arguments, a file or stdin
    tokens = file_prompts("prompts.txt", 32, tokenizer, 512)     # [N, 32], padded or cut

Without a tokenizer a prompt is space- or comma-separated token ids, used verbatim
(no EOS is appended); with one it is text (the tokenizer appends EOS for a T5 encoder,
never for a decoder-only model's prompt). An empty line is an empty input, never skipped
(output line i answers input line i): EOS alone for a T5 encoder; a decoder-only model
needs a token to continue, so an empty prompt that encodes to none is an error naming it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Sequence

import numpy as np

from specdec_jax.batching import pad_rows, rows_without_eos
from specdec_jax.errors import FileAccessError, PromptError
from specdec_jax.io.reports import read_text
from specdec_jax.io.tokenizer import check_tokenizer


def read_texts(path: str) -> list[str]:
  """The texts of `path`, one per non-blank line: plain text, or (a .jsonl file) per line a
  JSON string or an object with a "text" string."""
  try:
    with open(path, encoding="utf-8") as f:
      lines = [line for line in f.read().splitlines() if line.strip()]
  except OSError as e:
    raise FileAccessError(f"text file {os.fspath(path)!r}: {e.strerror or e}") from None
  except UnicodeDecodeError as e:
    raise FileAccessError(f"text file {os.fspath(path)!r} is not UTF-8 text: {e}") from None
  if not str(path).endswith(".jsonl"):
    return lines
  texts = []
  for i, line in enumerate(lines, 1):
    try:
      item = json.loads(line)
    except ValueError as e:
      raise PromptError(f"{path}: line {i} is not JSON: {e}") from None
    text = item.get("text") if isinstance(item, dict) else item
    if not isinstance(text, str):
      raise PromptError(f"{path}: line {i} is neither a JSON string nor an object with a "
                        '"text" string')
    texts.append(text)
  return texts


def parse_token_ids(prompts: Sequence[str], vocab_size: int,
                    empty: Sequence[int] | None = None) -> np.ndarray:
  """Space- or comma-separated token ids per prompt -> int32 [B, L], right-padded with 0.

  Ids are used verbatim: no EOS is appended (end a prompt with 1 for T5's EOS). `empty`:
  the ids an empty prompt stands for (T5's `[eos_id]`); None: an empty prompt is an error.
  """
  return pad_rows(_id_rows(prompts, vocab_size, empty))


def _id_rows(prompts: Sequence[str], vocab_size: int, empty: Sequence[int] | None = None,
             need: str = "") -> list[list[int]]:
  """Each prompt's token ids, checked to lie in [0, vocab_size); an empty prompt is
  `empty` (None: a PromptError naming it, `need` saying why)."""
  rows = []
  for i, prompt in enumerate(prompts, 1):
    parts = prompt.replace(",", " ").split()
    if not parts and empty is not None:
      rows.append(list(empty))
      continue
    if not parts:
      raise PromptError(f"prompt {i} is empty{need}")
    row = []
    for part in parts:
      try:
        row.append(int(part))
      except ValueError:
        raise PromptError(f"prompt {i}: {part!r} is not an integer token id (without "
                          "--tokenizer prompts are space-separated token ids, e.g. "
                          "\"5 17 42 1\")") from None
    bad = [t for t in row if not 0 <= t < vocab_size]
    if bad:
      raise PromptError(f"prompt {i}: token id {bad[0]} is outside the model vocabulary "
                        f"[0, {vocab_size})")
    rows.append(row)
  return rows


def encode_prompts(prompts: Sequence[str], tokenizer, vocab_size: int,
                   length: int | None = None, config=None) -> np.ndarray:
  """Text prompts -> int32 [B, L] (EOS-terminated, 0-padded) with `tokenizer`, or token ids.

  With `length`, every row is padded or cut to it. With the T5 model's `config`, the
  tokenizer is checked against it (`check_tokenizer`: sizes and special ids), and an empty
  id prompt is EOS alone, as the tokenizer encodes an empty text.
  """
  if tokenizer is None:
    empty = None if config is None else [config.eos_id]
    return pad_rows(parse_token_ids(prompts, vocab_size, empty), length)
  if tokenizer.vocab_size > vocab_size:
    raise PromptError(f"tokenizer {tokenizer.path!r} has {tokenizer.vocab_size} pieces but the "
                      f"model vocabulary has only {vocab_size}: they do not belong together")
  if config is not None:
    check_tokenizer(tokenizer, config)
  if length is None:
    return np.asarray(tokenizer.encode(list(prompts)), np.int32)
  return np.asarray(tokenizer.encode(list(prompts), max_length=length, truncate=True), np.int32)


def encode_lm_prompts(prompts: Sequence[str], tokenizer, config,
                      length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Decoder-only prompts -> (int32 [B, P] right-padded with `config.pad_id`, int32 [B] lengths).

  With a tokenizer (checked against the model: `check_tokenizer`), text is encoded as the
  tokenizer's convention has it (BOS first when it prepends one: Llama; none: GPT-2, T5's
  SentencePiece) and never with EOS, which would end the text to continue. Without one a
  prompt is token ids, used verbatim. `length`: every row cut (its first `length` tokens
  kept) or padded to it. The lengths are the prompts' own: pass them on as `prompt_lengths`,
  since a prompt may end in the pad id (GPT-2 pads with its EOS).
  """
  need = (": a decoder-only model needs at least one token to continue (an empty line is "
          "an empty prompt: give it text, or remove the line)")
  if tokenizer is None:
    rows = _id_rows(prompts, config.vocab_size, need=need)
  else:
    check_tokenizer(tokenizer, config)
    rows = [tokenizer.encode_one(text, add_eos=False) for text in prompts]
    for i, (text, row) in enumerate(zip(prompts, rows, strict=True), 1):
      if not row:
        raise PromptError(f"prompt {i} ({text!r}) encodes to no tokens{need}")
  if length is not None:
    rows = [r[:length] for r in rows]
  lengths = np.asarray([len(r) for r in rows], np.int32)
  width = length if length is not None else int(lengths.max(initial=1))
  tokens = np.full((len(rows), width), config.pad_id, np.int32)
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
  return tokens, lengths


def lm_token_budget(lengths: np.ndarray, config, max_new_tokens: int) -> int:
  """New tokens per row that fit a decoder-only model: `max_new_tokens`, lowered so the
  longest prompt (lengths [N]) plus them fit `config.max_positions` (its learned table, or
  the rotary positions it was trained on). PromptError naming a prompt that leaves no room."""
  limit = int(config.max_positions)
  lengths = np.asarray(lengths)
  long = np.flatnonzero(lengths >= limit)
  if long.size:
    i = int(long[0])
    raise PromptError(f"prompt {i + 1} holds {int(lengths[i])} tokens, but the model has "
                      f"{limit} positions (max_positions): a prompt may hold at most "
                      f"{limit - 1}, leaving room for one new token; shorten it")
  return min(int(max_new_tokens), limit - int(lengths.max(initial=0)))


@dataclasses.dataclass(frozen=True)
class Prompts:
  """Encoded prompts: T5 encoder tokens [N, L] (0-padded, `lengths` None), or a decoder-only
  model's right-padded prompts [N, P] and their lengths [N]; `ids`: given as token ids (no
  tokenizer), used verbatim."""

  tokens: np.ndarray
  lengths: np.ndarray | None = None
  ids: bool = False

  @classmethod
  def encode(cls, texts: Sequence[str], tokenizer, config) -> Prompts:
    """`texts` for the model of `config`: `encode_lm_prompts` for a decoder-only model,
    `encode_prompts` for a T5 (tokenizer None: token ids)."""
    if getattr(config, "is_decoder_only", False):
      return cls(*encode_lm_prompts(texts, tokenizer, config), ids=tokenizer is None)
    return cls(encode_prompts(texts, tokenizer, config.vocab_size, config=config),
               ids=tokenizer is None)

  def __len__(self) -> int:
    return len(self.tokens)

  def fit(self, max_new_tokens: int, config) -> tuple[int, str | None]:
    """(the new tokens per row that fit the model, a note for the user or None): a
    decoder-only model's budget lowered so the longest prompt and it fit its positions (a
    prompt alone past them: PromptError); T5 token ids without a final EOS are noted, since
    they are decoded verbatim."""
    if self.lengths is not None:
      budget = lm_token_budget(self.lengths, config, max_new_tokens)
      if budget >= max_new_tokens:
        return max_new_tokens, None
      return budget, (f"--max-new-tokens {max_new_tokens} lowered to {budget}: the model has "
                      f"{config.max_positions} positions and the longest prompt holds "
                      f"{int(np.max(self.lengths))} tokens")
    rows = rows_without_eos(self.tokens, config.eos_id, config.pad_id) if self.ids else []
    if not rows:
      return max_new_tokens, None
    many = len(rows) > 1
    shown = ", ".join(str(i + 1) for i in rows[:8]) + (", ..." if len(rows) > 8 else "")
    return max_new_tokens, (
        f"prompt{'s' if many else ''} {shown} {'do' if many else 'does'} not end in EOS "
        f"({config.eos_id}): token ids are used verbatim, and T5 reads EOS-terminated inputs "
        f"(the tokenizer appends it), so the output differs from the same prompt ending in "
        f"{config.eos_id}")

  def ngram_rows(self) -> list[np.ndarray]:
    """Each prompt's own tokens: a T5 row's nonzero ids, an LM's cut at its length (what
    the "ngram" drafter's bigram tables are fitted on)."""
    if self.lengths is None:
      return [r[r > 0] for r in self.tokens]
    return [r[:n] for r, n in zip(self.tokens, self.lengths, strict=True)]


def output_text(row: Sequence[int], tokenizer) -> str | list[int]:
  """A row of output tokens as text (`tokenizer` None: the ids themselves). A model's
  embedding may be padded beyond the tokenizer's vocabulary (T5: 32128 vs 32100); such ids
  have no text and show as <unk> (dropped if it has none)."""
  if tokenizer is None:
    return list(row)
  ids = np.asarray(row, np.int64)
  if tokenizer.unk_id is None:
    ids = ids[ids < tokenizer.vocab_size]
  ids = np.where(ids < tokenizer.vocab_size, ids, tokenizer.unk_id)
  return tokenizer.decode_continuations(ids[None])[0]


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

