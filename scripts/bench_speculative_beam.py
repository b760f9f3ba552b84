"""Time `sd.Beam` against `sd.SpeculativeBeam` on the demo pair (CPU, one process).

    PYTHONPATH=. python scripts/bench_speculative_beam.py [--sentences 8] [--repeats 3] \
        [--out results/speculative_beam]

The demo target verifies, the demo drafter drafts (bf16, the packed kernels `sd.load`
picks); held-out German sentences (tests/data/demo_test_pairs.jsonl) at batch 1 (one at
a time) and batch 8; beam 4, alpha 0.6. Prints ms per best-beam token, the speedup, the
beam steps per target call, and whether every beam equals `sd.Beam`'s (it must); with
--out, writes them to OUT/cpu_speed.json and OUT/cpu_speed.md with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

import specdec_jax as sd
from specdec_jax.runtime.report import atomic_write, machine_info, utc_now, write_json

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
  parser.add_argument("--out", help="write cpu_speed.json and cpu_speed.md here")
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
  rows = []
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
    rows.append({"batch": name, "tokens": tokens, "beam_ms_per_token": 1e3 * t_beam / tokens,
                 "speculative_beam_ms_per_token": 1e3 * t_spec / tokens,
                 "speedup": t_beam / t_spec, "steps": steps, "target_calls": calls,
                 "steps_per_target_call": steps / calls, "beams_equal": same})
    print(f"{name}: beam {1e3 * t_beam / tokens:.2f} ms/token, speculative beam "
          f"{1e3 * t_spec / tokens:.2f} ms/token, speedup {t_beam / t_spec:.2f}x, "
          f"{steps / calls:.2f} steps per target call, beams equal: {same}")
  if args.out:
    write(args, target, rows)


def write(args, target, rows) -> None:
  """OUT/cpu_speed.json and OUT/cpu_speed.md: the rows, the settings and the command."""
  load = os.getloadavg() if hasattr(os, "getloadavg") else None
  res = {"created": utc_now(), "command": "PYTHONPATH=. python scripts/bench_speculative_beam.py "
         + " ".join(sys.argv[1:]), "machine": machine_info(), "load_average": load,
         "target_width_invariant": bool(target.width_invariant_decode),
         "settings": {"pair": "demo-de-en (bfloat16)", "num_beams": 4, "alpha": 0.6,
                      "gamma": args.gamma, "sentences": args.sentences,
                      "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                      "timing": "best of repeats after one warm-up call"},
         "rows": rows}
  os.makedirs(args.out, exist_ok=True)
  write_json(os.path.join(args.out, "cpu_speed.json"), res)
  m = res["machine"]
  lines = ["# Speculative beam search vs `sd.Beam` on CPU (measured)", "",
           f"Created {res['created']} by `{res['command']}` on {m['cpu_count']} CPUs "
           f"({m['processor']}, jax {m['jax_version']}), load average at the end "
           f"{', '.join(f'{x:.1f}' for x in load) if load else 'unknown'}: a machine shared "
           "with other jobs, so the times are noisy.", "",
           f"Demo pair in bfloat16 (packed target: {res['target_width_invariant']}), beam 4, "
           f"alpha 0.6, gamma {args.gamma}, default width 2K and M = 3K chains, "
           f"{args.sentences} held-out sentences, at most {args.max_new_tokens} new tokens, "
           f"best of {args.repeats} runs after a warm-up; ms per best-beam token.", "",
           "| decode | `sd.Beam` ms/token | `sd.SpeculativeBeam` ms/token | speedup | "
           "steps per target call | beams equal |", "|---|---:|---:|---:|---:|---|"]
  for r in rows:
    lines.append(f"| {r['batch']} | {r['beam_ms_per_token']:.2f} | "
                 f"{r['speculative_beam_ms_per_token']:.2f} | {r['speedup']:.2f}x | "
                 f"{r['steps_per_target_call']:.2f} | {'yes' if r['beams_equal'] else 'NO'} |")
  atomic_write(os.path.join(args.out, "cpu_speed.md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
