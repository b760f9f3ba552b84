"""`specdec convert`: any supported checkpoint to our format or Hugging Face's."""

from __future__ import annotations

import os
import shutil
import sys

import specdec_jax as sd
from specdec_jax.io import checkpoints
from specdec_jax.io.tokenizer import MODEL_FILENAMES
from specdec_jax.tools.errors import CLIError, FileAccessError
from specdec_jax.tools.models import load_model
from specdec_jax.tools.report import make_dirs


def _check_destination(src: str, dst: str, force: bool) -> None:
  if os.path.abspath(src) == os.path.abspath(dst):
    raise CLIError("SRC and DST are the same directory")
  if os.path.isfile(dst) or (os.path.isdir(dst) and os.listdir(dst) and not force):
    raise CLIError(f"{dst!r} exists and is not an empty directory (pass --force to "
                   "write into it)")


def _copy_tokenizer(src: str, dst: str) -> None:
  """Carry the tokenizer along when the source directory has one."""
  if not os.path.isdir(src):
    return
  for name in MODEL_FILENAMES:
    if os.path.isfile(os.path.join(src, name)):
      try:
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
      except OSError as e:
        raise FileAccessError(f"cannot copy {os.path.join(src, name)!r} to {dst!r}: "
                              f"{e.strerror or e}") from None
      return


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
  _copy_tokenizer(args.src, path)
  print(f"wrote {args.to} checkpoint to {path} ({model.num_params():,} parameters, "
        f"dtype {args.dtype or 'as stored'})", file=sys.stderr)
  return 0


def add(subparsers) -> None:
  p = subparsers.add_parser(
      "convert", help="convert a checkpoint to this package's format or Hugging Face's",
      description="Load any supported checkpoint (T5X legacy/Orbax, HF, ours, bundled name, "
      "config:NAME) and write it in our format (specdec_config.json + params.safetensors) or as "
      "a transformers T5 dir (config.json + model.safetensors). A spiece.model beside SRC is "
      "copied along.")
  p.add_argument("src", metavar="SRC")
  p.add_argument("dst", metavar="DST")
  p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                 help="cast floating params (default: as stored)")
  p.add_argument("--to", choices=("specdec", "hf"), default="specdec")
  p.add_argument("--force", action="store_true", help="write into a non-empty DST")
  p.set_defaults(func=run)
