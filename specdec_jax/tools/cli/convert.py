"""`specdec convert`: any supported checkpoint to our format or Hugging Face's.

``--to hf`` writes a transformers directory: T5 (`T5ForConditionalGeneration`) for a T5
model, GPT-2 or Llama (`AutoModelForCausalLM`) for a decoder-only one. The tokenizer files
found beside the source (or in a bundled name's group) are copied along.
"""

from __future__ import annotations

import os
import shutil
import sys

import specdec_jax as sd
from specdec_jax.io import checkpoints
from specdec_jax.io.checkpoints import resolve
from specdec_jax.io.tokenizer import HF_FILENAME, MODEL_FILENAMES
from specdec_jax.tools.errors import CLIError, FileAccessError
from specdec_jax.tools.models import load_model
from specdec_jax.tools.report import make_dirs


def _check_destination(src: str, dst: str, force: bool) -> None:
  if os.path.abspath(src) == os.path.abspath(dst):
    raise CLIError("SRC and DST are the same directory")
  if os.path.isfile(dst) or (os.path.isdir(dst) and os.listdir(dst) and not force):
    raise CLIError(f"{dst!r} exists and is not an empty directory (pass --force to "
                   "write into it)")


# A SentencePiece model (T5's spiece.model, Llama's tokenizer.model) and a Hugging Face
# tokenizer.json with the files naming its special tokens; config.json is never copied
# (the converted checkpoint writes its own).
TOKENIZER_FILES = (*MODEL_FILENAMES, HF_FILENAME, "tokenizer_config.json",
                   "special_tokens_map.json")


def _tokenizer_dirs(src: str) -> list[str]:
  """Where SRC's tokenizer may be: SRC itself; for a bundled name ("demo-en-lm/target"),
  also its group's directory, which holds the pair's tokenizer."""
  if os.path.isdir(src):
    return [src]
  if os.path.exists(src) or src.startswith("config:") or src not in resolve.bundled_names():
    return []
  root = resolve.default_assets_dir(src)
  return [str(root / src), str(root / src.split("/")[0])]


def _copy_tokenizer(src: str, dst: str) -> list[str]:
  """Copy the tokenizer files of the first of `_tokenizer_dirs(src)` that has any; their
  names."""
  for directory in _tokenizer_dirs(src):
    names = [n for n in TOKENIZER_FILES if os.path.isfile(os.path.join(directory, n))]
    for name in names:
      try:
        shutil.copyfile(os.path.join(directory, name), os.path.join(dst, name))
      except OSError as e:
        raise FileAccessError(f"cannot copy {os.path.join(directory, name)!r} to {dst!r}: "
                              f"{e.strerror or e}") from None
    if names:
      return names
  return []


def run(args) -> int:
  _check_destination(args.src, args.dst, args.force)
  model = load_model(args.src, dtype=None, what="source")   # convert keeps the stored dtype
  make_dirs(args.dst)
  if args.to == "hf":
    if args.dtype is not None:
      model = model.astype(args.dtype)
    path = checkpoints.export_hf(args.dst, model.config, model.params)
  else:
    sd.save(args.dst, model, dtype=args.dtype)
    path = args.dst
  copied = _copy_tokenizer(args.src, path)
  print(f"wrote {args.to} checkpoint to {path} ({model.num_params():,} parameters, "
        f"dtype {args.dtype or 'as stored'}"
        f"{'; tokenizer: ' + ', '.join(copied) if copied else ''})", file=sys.stderr)
  return 0


def add(subparsers) -> None:
  p = subparsers.add_parser(
      "convert", help="convert a checkpoint to this package's format or Hugging Face's",
      description="Load any supported checkpoint (T5X legacy/Orbax, HF T5/GPT-2/Llama, ours, "
      "bundled name, config:NAME) and write it in our format (specdec_config.json + "
      "params.safetensors) or, with --to hf, as a transformers dir (config.json + "
      "model.safetensors): T5 for a T5 model, GPT-2 or Llama for a decoder-only one. The "
      "tokenizer beside SRC (spiece.model, tokenizer.model, tokenizer.json with "
      "tokenizer_config.json / special_tokens_map.json; a bundled name's group's) is copied "
      "along.")
  p.add_argument("src", metavar="SRC")
  p.add_argument("dst", metavar="DST")
  p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                 help="cast floating params (default: as stored)")
  p.add_argument("--to", choices=("specdec", "hf"), default="specdec",
                 help="specdec: our format (default); hf: a transformers directory")
  p.add_argument("--force", action="store_true", help="write into a non-empty DST")
  p.set_defaults(func=run)
