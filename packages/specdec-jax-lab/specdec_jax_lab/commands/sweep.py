"""`specdec sweep-bild` and `specdec sweep-blockwise`: quality and speed of many settings.

    specdec sweep-bild --data runs/demo/data --small aligned=demo-de-en/drafter \\
        --small unaligned=runs/demo/drafter/final --early-exit demo-de-en/early-exit:1 \\
        --fallback 0.5,0.7,0.9 --rollback 2,3,5 --out results/bild
    specdec sweep-blockwise --data runs/demo/data --lattice-k 16 --num-drafts 4 \\
        --out results/blockwise
    specdec sweep-bild --data tests/data/demo_test_pairs.jsonl --small aligned=demo-de-en/drafter

--data is a prepared data dir or a .jsonl file of {"de", "en"} pairs (tokenised with the
bundled demo tokenizer); with a .jsonl file sweep-blockwise fits its n-gram rescorer on
the file's own English side (in-sample, recorded as `ngram_data` in the results).

With a decoder-only --model (GPT-2, Llama), --data is a text file (one text per line) or
a .jsonl file of texts (`prompts.read_texts`), --tokenizer their tokenizer: each text's
first --prompt-len tokens are the prompt (no EOS, BOS as the tokenizer has it), its next
--max-new-tokens tokens the reference continuation that BLEU / chrF score against; texts
too short for both are skipped. The n-gram rescorer is fitted on the texts themselves
(in-sample), the drafting models must be decoder-only too.

    specdec sweep-bild --model demo-en-lm/target --tokenizer demo-en-lm --data texts.txt \
        --small base=demo-en-lm/drafter --prompt-len 4 --max-new-tokens 8

Every point is timed beside the target alone in alternating rounds (`specdec_jax_lab.sweep`);
both write JSON, Markdown and a BLEU-vs-speedup PNG, with a progress bar, and
--resume keeps the points an earlier run of the same settings measured.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from specdec_jax.io.streams import emit
from specdec_jax_lab.sweep.settings import EXACT, BildSweep, BlockwiseSweep, SweepSettings
from specdec_jax_lab.sweep.sweeps import run_sweep


def float_list(text: str) -> list[float]:
  """argparse type: "0.5,0.7,inf" -> floats."""
  try:
    return [float(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected numbers like 0.5,0.7, got {text!r}") from None


def _common_from_args(args) -> dict[str, Any]:
  return dict(model=args.model, data=args.data, out=args.out, split=args.split,
              limit=args.limit, batch_size=args.batch_size, repeats=args.repeats,
              seed=args.seed, dtype=args.dtype, resume=args.resume, exact=args.exact,
              progress=not args.no_progress, tokenizer=args.tokenizer,
              prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens,
              argv=tuple(getattr(args, "argv", ())))


def bild_from_args(args) -> BildSweep:
  """The typed settings of `sweep-bild`'s flags, checked before any model is loaded: where
  the command line's namespace stops."""
  return BildSweep(**_common_from_args(args), small=tuple(args.small),
                   early_exit=args.early_exit, fallback=tuple(args.fallback),
                   rollback=tuple(args.rollback), gammas=tuple(args.gammas), top_p=args.top_p,
                   batch_policies=tuple(args.batch_policies))


def blockwise_from_args(args) -> BlockwiseSweep:
  """The typed settings of `sweep-blockwise`'s flags (see `bild_from_args`)."""
  return BlockwiseSweep(**_common_from_args(args), heads=args.heads, lattice_k=args.lattice_k,
                        num_drafts=args.num_drafts, rescorer=args.rescorer,
                        rescoring_weight=args.rescoring_weight)


def sweep(s: SweepSettings) -> int:
  """`specdec sweep-bild` / `sweep-blockwise` on typed settings: measure every point, write
  the reports (JSON, Markdown, PNG) and print the Markdown."""
  paths = run_sweep(s)
  emit(open(paths["md"], encoding="utf-8").read())
  print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}", file=sys.stderr)
  return 0


def _common(p: argparse.ArgumentParser, default_out: str) -> None:
  p.add_argument("--model", default="demo-de-en/target", help="the target (large) model")
  p.add_argument("--data", required=True, metavar="DIR_OR_JSONL",
                 help="prepared data dir, or a .jsonl file of {\"de\", \"en\"} pairs (e.g. "
                 "tests/data/demo_test_pairs.jsonl)")
  p.add_argument("--split", default="test", help="the data split decoded (default test)")
  p.add_argument("--limit", type=int, default=100, help="first N pairs (default 100)")
  p.add_argument("--batch-size", type=int, default=1, help="rows per decode call (default 1)")
  p.add_argument("--repeats", type=int, default=3, help="timed rounds (median)")
  p.add_argument("--seed", type=int, default=0, help="PRNG seed of sampling (default 0)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                 help="the models' compute dtype (default float32)")
  p.add_argument("--out", default=default_out, metavar="DIR",
                 help=f"where the JSON, Markdown and PNG go (default {default_out})")
  p.add_argument("--resume", action="store_true",
                 help="keep the points of DIR's earlier run with the same settings")
  p.add_argument("--exact", choices=sorted(EXACT), default="auto",
                 help="greedy target calls at the exact width (on), at their natural width "
                 "(off: faster on CPU), or the library default (auto: exact for greedy); "
                 "speedups are over the target alone at its natural width, the exact "
                 "baseline's cost is a column of its own")
  p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
  p.add_argument("--tokenizer", metavar="PATH_OR_NAME",
                 help="a decoder-only --model: the tokenizer of --data's texts")
  p.add_argument("--prompt-len", type=int, default=32,
                 help="a decoder-only --model: prompt tokens per text (default 32)")
  p.add_argument("--max-new-tokens", type=int,
                 help="a decoder-only --model: continuation tokens generated and scored "
                 "(default 32)")


def add(subparsers) -> None:
  p = subparsers.add_parser("sweep-bild", help="BiLD threshold grid: BLEU vs speedup",
                            description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  _common(p, "sweep_bild")
  p.add_argument("--small", action="append", default=[], metavar="NAME=PATH",
                 help="a small model (repeatable), e.g. aligned=demo-de-en/drafter")
  p.add_argument("--early-exit", metavar="MODEL:K",
                 help="the early-exit variant: MODEL read after K decoder layers")
  p.add_argument("--fallback", type=float_list, default=[0.5, 0.7, 0.9], metavar="0.5,0.7,0.9",
                 help="fallback thresholds (1.0: the large model alone, exact)")
  p.add_argument("--rollback", type=float_list, default=[2.0, 3.0, 5.0], metavar="2,3,5",
                 help="rollback thresholds (inf: never roll back)")
  p.add_argument("--gammas", type=lambda t: [int(x) for x in t.split(",")], default=[2, 4],
                 help="speculative decoding's gammas for each small model (default 2,4)")
  p.add_argument("--top-p", type=float, help="nucleus sampling for every point (paper: 0.8)")
  p.add_argument("--batch-policies", type=lambda t: [x.strip() for x in t.split(",")],
                 default=["wait"], metavar="wait,sync",
                 help="BiLD's batched semantics to compare (see sd.bild_generate; default wait)")
  p.set_defaults(func=lambda a: sweep(bild_from_args(a)))

  q = subparsers.add_parser("sweep-blockwise", help="blockwise drafts: Kim et al.'s Table 4",
                            description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  _common(q, "sweep_blockwise")
  q.add_argument("--heads", help="heads file or dir (default: saved with --model)")
  q.add_argument("--lattice-k", type=int, default=16,
                 help="candidates per head in the lattice (default 16)")
  q.add_argument("--num-drafts", type=int, default=4,
                 help="lattice paths verified together by the parallel rows (default 4)")
  q.add_argument("--rescorer", default="demo-de-en/drafter", help="neural rescorer model")
  q.add_argument("--rescoring-weight", type=float, default=1.0,
                 help="the rescorer's log-prob weight against the heads' (default 1.0)")
  q.set_defaults(func=lambda a: sweep(blockwise_from_args(a)))

