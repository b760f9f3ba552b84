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
from specdec_jax.errors import FileAccessError
from specdec_jax.flags import FlagError
from specdec_jax.io import checkpoints
from specdec_jax.io.checkpoints import native, resolve
from specdec_jax.io.reports import make_dirs
from specdec_jax.io.tokenizer import TOKENIZER_FILES
from specdec_jax.loading import load_model


def _check_destination(src: str, dst: str, force: bool) -> None:
  if os.path.abspath(src) == os.path.abspath(dst):
    raise FlagError("SRC and DST are the same directory")
  if os.path.exists(dst) and not os.path.isdir(dst):
    raise FlagError(f"{dst!r} is a file: DST must be a directory (new, empty, or with "
                   "--force one holding a checkpoint to replace)")
  if os.path.isdir(dst) and os.listdir(dst) and not force:
    raise FlagError(f"{dst!r} exists and is not an empty directory (pass --force to "
                   "replace the checkpoint in it)")
  if force and os.path.isdir(dst):
    fmt = resolve.format_of(dst)
    if fmt in (resolve.T5X_LEGACY, resolve.T5X_ORBAX) or resolve.step_dirs(dst):
      raise FlagError(f"{dst!r} holds a T5X checkpoint: --force replaces our format's or Hugging "
                     "Face's files only; choose another DST")


def _replaced_files(dst: str) -> list[str]:
  """The files in DST that the converted checkpoint replaces: any checkpoint of our format
  or Hugging Face's, and the tokenizer that came with it. Left there, `sd.load` would read
  the old checkpoint (ours wins over HF's) or pair the new one with the old tokenizer."""
  ours = (resolve.SPECDEC_CONFIG, native.PARAMS_NAME)
  hf_files = ("config.json", "generation_config.json")
  return sorted(n for n in os.listdir(dst)
                if os.path.isfile(os.path.join(dst, n))
                and (n in ours or n in hf_files or n in TOKENIZER_FILES
                     or resolve.HF_WEIGHTS_RE.fullmatch(n)))


def _clear(dst: str) -> list[str]:
  """Remove `_replaced_files(dst)`; their names."""
  names = _replaced_files(dst) if os.path.isdir(dst) else []
  for name in names:
    try:
      os.remove(os.path.join(dst, name))
    except OSError as e:
      raise FileAccessError(f"--force: cannot remove {os.path.join(dst, name)!r}: "
                            f"{e.strerror or e}") from None
  return names


def _tokenizer_dirs(src: str) -> list[str]:
  """Where SRC's tokenizer may be: SRC itself; for a bundled name ("demo-en-lm/target"),
  also its group's directory, which holds the pair's tokenizer."""
  if os.path.isdir(src):
    return [src]
  if os.path.exists(src) or src.startswith("config:") or src not in resolve.bundled_names():
    return []
  root = resolve.default_assets_dir(src)
  if root is None:
    return []
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
  removed = _clear(args.dst) if args.force else []
  if removed:
    print(f"--force: removed {', '.join(removed)} from {args.dst} (the checkpoint and "
          "tokenizer replaced)", file=sys.stderr)
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
  p.add_argument("--force", action="store_true",
                 help="write into a non-empty DST, first removing the checkpoint there (our "
                 "format's or Hugging Face's files and their tokenizer; other files are kept, "
                 "a T5X checkpoint is refused)")
  p.set_defaults(func=run)
