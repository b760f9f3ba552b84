"""Time `sd.Beam` against `sd.SpeculativeBeam` on the demo pair (CPU, one process).

    PYTHONPATH=. python scripts/bench_speculative_beam.py [--sentences 8] [--repeats 3]

The demo target verifies, the demo drafter drafts (bf16, the packed kernels `sd.load`
picks); held-out German sentences (tests/data/demo_test_pairs.jsonl) at batch 1 (one at
a time) and batch 8; beam 4, alpha 0.6. Prints ms per best-beam token, the speedup, the
beam steps per target call, and whether every beam equals `sd.Beam`'s (it must).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

import specdec_jax as sd

PAIRS = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / \
    "demo_test_pairs.jsonl"


def timed(fn, repeats: int):
  """(the output, the best wall time of `repeats` runs after one warm-up) of fn()."""
  out = fn()
  np.asarray(out.beams)                          # compiled and finished
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    np.asarray(out.beams)
    best = min(best, time.perf_counter() - start)
  return out, best


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sentences", type=int, default=8)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--max-new-tokens", type=int, default=48)
  parser.add_argument("--gamma", type=int, default=3)
  args = parser.parse_args()
  target = sd.load("demo-de-en/target", dtype="bfloat16")
  drafter = sd.load("demo-de-en/drafter", dtype="bfloat16")
  tok = sd.load_tokenizer("demo-de-en")
  lines = PAIRS.read_text().splitlines()[:args.sentences]
  enc = np.asarray(tok.encode([json.loads(line)["de"] for line in lines]))
  beam = sd.Beam(num_beams=4, alpha=0.6)
  spec = sd.SpeculativeBeam(drafter, num_beams=4, alpha=0.6, gamma=args.gamma)
  print(f"target width-invariant: {target.width_invariant_decode}; {len(lines)} sentences, "
        f"T={args.max_new_tokens}, gamma={args.gamma}")
  batches = {"batch 1": [enc[i:i + 1] for i in range(len(enc))], "batch 8": [enc[:8]]}
  for name, parts in batches.items():
    tokens, t_beam, t_spec, steps, calls, same = 0, 0.0, 0.0, 0, 0, True
    for part in parts:
      ref, a = timed(lambda p=part: sd.decode(target, beam, p, args.max_new_tokens),
                     args.repeats)
      out, b = timed(lambda p=part: sd.decode(target, spec, p, args.max_new_tokens),
                     args.repeats)
      same &= bool(np.array_equal(out.beams, ref.beams))
      tokens += int(np.asarray(ref.lengths).sum())
      t_beam, t_spec = t_beam + a, t_spec + b
      steps, calls = steps + out.stats["steps"], calls + out.stats["rounds"]
    print(f"{name}: beam {1e3 * t_beam / tokens:.2f} ms/token, speculative beam "
          f"{1e3 * t_spec / tokens:.2f} ms/token, speedup {t_beam / t_spec:.2f}x, "
          f"{steps / calls:.2f} steps per target call, beams equal: {same}")


if __name__ == "__main__":
  main()
