#!/usr/bin/env python
"""Side-by-side timing against Hugging Face transformers on the same weights.

    # the demo pair on the first 20 test sentences
    python scripts/compare_hf.py --workdir runs/demo --drafter-variant aligned --limit 20 \
        --gamma 4 --max-new-tokens 32 --batch-sizes 8,32 --out results/hf_compare

    # any two models (our format, T5X, HF dirs, config:NAME) and random prompts
    python scripts/compare_hf.py --target PATH --drafter PATH --limit 10 --out results/hf_compare

    # a Gemma 4 target and its assistant (transformers dirs), text prompts one per line
    python scripts/compare_hf.py --target GEMMA4_DIR --drafter ASSISTANT_DIR \
        --prompts-file prompts.txt --gamma 4 --max-new-tokens 64 --batch-sizes 8 \
        --out results/hf_compare_gemma4

Writes OUT/hf_compare.json and OUT/hf_compare.md. See `specdec_jax_lab/hf_compare/` for
what each method is and how it is timed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

import numpy as np

from specdec_jax.errors import SpecdecError
from specdec_jax.flags.common import int_list


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=__doc__.split("\n\n", 1)[1])
  p.add_argument("--workdir", help="demo workdir: target/final, <variant>/final, data/")
  p.add_argument("--drafter-variant", default="aligned",
                 choices=("drafter", "aligned", "distilled"))
  p.add_argument("--target", help="target model (overrides --workdir's)")
  p.add_argument("--drafter", help="drafter model (overrides --workdir's)")
  p.add_argument("--data-dir", help="prompts from DATA_DIR/<split>.npz inputs (default: "
                 "WORKDIR/data when --workdir is given, else random prompts)")
  p.add_argument("--split", default="test")
  p.add_argument("--prompts-file", help="text prompts, one per line, tokenized with "
                 "--tokenizer (overrides --data-dir and random prompts)")
  p.add_argument("--tokenizer", help="tokenizer for --prompts-file (default: the target's "
                 "directory, e.g. a Gemma 4 dir's tokenizer.json)")
  p.add_argument("--limit", type=int, default=20, help="number of prompts")
  p.add_argument("--prompt-len", type=int, default=16, help="length of random prompts")
  p.add_argument("--gamma", type=int, default=4)
  p.add_argument("--max-new-tokens", type=int, default=32)
  p.add_argument("--batch-sizes", type=int_list, default=[8, 32],
                 help="extra batch sizes for our methods (batch 1 always runs)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--no-hf-default-assisted", action="store_true",
                 help="skip HF assisted generation with transformers' default settings")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="results/hf_compare")
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  if not (args.target or args.workdir) or not (args.drafter or args.workdir):
    p.error("give --workdir or both --target and --drafter")
  try:
    return _run(args, argv)
  except SpecdecError as e:
    print(f"compare_hf: error: {e}", file=sys.stderr)
    return 2


def _text_prompts(path: str, tokenizer_source: str, decoder_only: bool) -> list[np.ndarray]:
  """Each non-empty line of `path` as token ids: a decoder-only model's prompt (BOS first
  where the tokenizer has one, no EOS), or an encoder input (EOS last)."""
  import specdec_jax as sd
  with open(path, encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f if line.strip()]
  tokenizer = sd.load_tokenizer(tokenizer_source)
  if decoder_only:
    tokens, lengths = tokenizer.encode_prompts(lines)
    return [np.asarray(t[:n]) for t, n in zip(tokens, lengths, strict=True)]
  return [np.asarray(tokenizer.encode_one(line)) for line in lines]


def _run(args, argv) -> int:
  from specdec_jax.batching import random_prompts
  from specdec_jax.plan import config_of
  from specdec_jax_lab import hf_compare

  target = args.target or (args.workdir and os.path.join(args.workdir, "target", "final"))
  drafter = args.drafter or (args.workdir and os.path.join(args.workdir, args.drafter_variant,
                                                           "final"))
  data_dir = args.data_dir or (args.workdir and os.path.join(args.workdir, "data"))
  target_config = config_of(target)      # shapes only: `compare` loads the weights
  if args.prompts_file:
    prompts = _text_prompts(args.prompts_file, args.tokenizer or target,
                            target_config.is_decoder_only)[:args.limit]
    source = f"first {len(prompts)} lines of {args.prompts_file}"
  elif data_dir:
    from specdec_jax_lab.data import prepare
    inputs = prepare.load_split(data_dir, args.split)["inputs"]
    prompts = inputs[:args.limit]
    source = f"first {len(prompts)} inputs of {data_dir}/{args.split}.npz"
  else:
    # ids from 3 (no pad, EOS, unk/BOS); an encoder input ends in EOS, a prompt does not
    only = target_config.is_decoder_only
    prompts = random_prompts(args.limit, args.prompt_len + only, target_config.vocab_size,
                             args.seed)[:, :args.prompt_len]
    source = f"{args.limit} random prompts of length {args.prompt_len}"
  config = {"prompts": source,
            "command": "python scripts/compare_hf.py " + " ".join(
                shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))}
  results = hf_compare.compare(
      target, drafter, list(prompts),
      hf_compare.CompareSettings(
          gamma=args.gamma, max_new_tokens=args.max_new_tokens, batch_sizes=args.batch_sizes,
          repeats=args.repeats, hf_default_assisted=not args.no_hf_default_assisted,
          progress=not args.no_progress),
      config=config)
  paths = hf_compare.write_report(results, args.out)
  print(hf_compare.markdown_table(results))
  print(f"wrote {paths['json']}, {paths['md']}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
