"""Alternating-round timings, one process: kernels on/off toggled via SPECDEC_CPU_KERNELS.

usage: python results/cpu_kernels/bench_kernels.py [ROUNDS=7] [all|verify|e2e]
"verify": k-token decode calls vs 1-token calls of the demo target (batch 1); "e2e":
generate and speculative decoding (gamma 2, 4) on the 64 held-out sentences, batch 1 and 8,
kernels on (exact, unpadded), kernels off (exact, padded to 16) and kernels off with
exact=False ("plain"). Output of the run quoted in README: quiet_run.log.
"""
import json, os, pathlib, random, statistics, sys, time
import numpy as np, jax, jax.numpy as jnp
import specdec_jax as sd
from specdec_jax import kernels
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7
PART = sys.argv[2] if len(sys.argv) > 2 else "all"
def mode(on): os.environ[kernels.ENV_VAR] = "1" if on else "0"
def load(): return open("/proc/loadavg").read().split()[:3]
tok = sd.load_tokenizer("demo-de-en")
de = [json.loads(l)["de"] for l in open(pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "demo_test_pairs.jsonl")]
ENC = np.asarray(tok.encode(de))   # one padded length for all 64: one compile per batch size
target = sd.load("demo-de-en/target"); drafter = sd.load("demo-de-en/drafter")
print("kernels:", kernels.status().available, "load", load(), flush=True)

if PART in ("all", "verify"):
  enc = jnp.asarray(tok.encode(de[:1]), jnp.int32)
  rng = np.random.default_rng(0)
  caches = {}
  for on in (True, False):
    mode(on)
    c = target.start(enc, capacity=80)
    caches[on] = target.decode(jnp.asarray(rng.integers(2, 8000, (1, 16)), jnp.int32), c)[1]
  toks = {k: jnp.asarray(rng.integers(2, 8000, (1, k)), jnp.int32) for k in range(1, 6)}
  def time_call(on, k, n=40):
    mode(on)
    f = lambda: target.decode(toks[k], caches[on])[0].block_until_ready()
    f(); ts = []
    for _ in range(n):
      t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
  for on in (True, False):
    for k in toks: time_call(on, k, 3)       # compile
  res = {(on, k): [] for on in (True, False) for k in toks}
  for r in range(ROUNDS):
    order = [(on, k) for on in (True, False) for k in toks]; random.Random(r).shuffle(order)
    for on, k in order: res[(on, k)].append(time_call(on, k))
  print("load", load(), flush=True)
  for on in (True, False):
    t1 = statistics.median(res[(on, 1)])
    # ratio per round then median (same-round pairs)
    ratios = {k: statistics.median([a / b for a, b in zip(res[(on, k)], res[(on, 1)])]) for k in toks}
    print(f"verify kernels={'on ' if on else 'off'} 1-token {t1*1e3:.3f} ms;",
          " ".join(f"k={k}: {ratios[k]:.2f}x" for k in toks if k > 1), flush=True)
  print("1-token on/off ratio (median of per-round ratios):",
        f"{statistics.median([a / b for a, b in zip(res[(True, 1)], res[(False, 1)])]):.3f}", flush=True)

if PART in ("all", "e2e"):
  MAXNEW = 64
  def run(on, method, bs, exact=None):
    if on == "plain":
      on, exact = False, False
    mode(on)
    toks_total = 0; t0 = time.perf_counter(); outs = []
    for i in range(0, 64, bs):
      enc = jnp.asarray(ENC[i:i+bs], jnp.int32)
      if method == "generate":
        o = sd.generate(target, enc, max_new_tokens=MAXNEW, exact=exact)
      else:
        o = sd.speculative_generate(target, drafter, enc, gamma=method, max_new_tokens=MAXNEW, exact=exact)
      o.tokens.block_until_ready()
      toks_total += int(np.sum(np.asarray(o.lengths))); outs.append(np.asarray(o.tokens))
    return (time.perf_counter() - t0) / toks_total, outs, o.stats["exact"]
  configs = [(on, m, bs) for bs in (1, 8) for on in (True, False) for m in ("generate", 2, 4)]
  configs += [("plain", m, bs) for bs in (1, 8) for m in ("generate", 2, 4)]
  base = {}
  for c in configs:
    _, outs, ex = run(*c)     # compile + correctness
    key = (c[0], c[2])
    if c[1] == "generate": base[key] = outs
    else:
      same = all(np.array_equal(a, b) for a, b in zip(outs, base[key]))
      print(f"check kernels={c[0]} batch {c[2]} gamma {c[1]}: exact={ex} identical to generate: {same}", flush=True)
  res = {c: [] for c in configs}
  for r in range(ROUNDS):
    order = list(configs); random.Random(100 + r).shuffle(order)
    for c in order: res[c].append(run(*c)[0])
    print("round", r, "load", load(), flush=True)
  for bs in (1, 8):
    for on in (True, False, "plain"):
      g = statistics.median(res[(on, "generate", bs)])
      line = f"e2e batch {bs} kernels={on} exact={'False' if on == 'plain' else 'default'}: generate {g*1e3:.3f} ms/token"
      for m in (2, 4):
        s = statistics.median(res[(on, m, bs)])
        line += f"; spec gamma {m} {s*1e3:.3f} ms/token ({g/s:.2f}x vs generate)"
      print(line, flush=True)
    for m in ("generate", 2, 4):
      rr = statistics.median([a / b for a, b in zip(res[(True, m, bs)], res[(False, m, bs)])])
      rp = statistics.median([a / b for a, b in zip(res[(True, m, bs)], res[("plain", m, bs)])])
      print(f"  batch {bs} {m}: kernels-on / off-padded time ratio {rr:.3f}; kernels-on / off-plain {rp:.3f}", flush=True)
