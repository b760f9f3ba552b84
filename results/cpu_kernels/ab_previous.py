"""The CPU kernels of a previous commit beside today's, in ONE process, interleaved.

usage: python results/cpu_kernels/ab_previous.py [micro|e2e|products] [ROUNDS] [BATCH] [REV]

REV (default fb51b2a) is the commit before attention moved onto a kernel. Its skinny.cc
is built with g++ into a temporary directory and registered under another FFI target;
"previous" models are traced with that target, with decoder attention as XLA's ops one
query row at a time, encoder attention as XLA's ops over all rows and the encoder's
norms as XLA's reduce (REV's decode path). They carry a static config difference so that
no jit cache is shared between the two. On this 2-core host one process can run 25%
slower than another, so only the ratios inside one run mean anything.

  micro     ms per cached decode call of the demo target (k = 1..5 tokens) and drafter
            (k = 1, 2), and `Model.start` of the first BATCH test sentences
  e2e       ms per token, first 100 test sentences, 20 new tokens: generate and speculative
            decoding (aligned drafter, gamma 1-3), every batch decoded by each method and
            library in a shuffled order
  products  us per call of the demo target's 25 decode-step products on bfloat16 panels,
            M = 1..5 rows, and today's library on float32 panels
Output of the runs quoted in README ("Where decode time goes"): ab_previous.log.
"""
import ctypes, functools, json, pathlib, random, statistics, subprocess, sys, tempfile, time

import jax
import jax.numpy as jnp
import numpy as np

import specdec_jax as sd
from specdec_jax import kernels
from specdec_jax.kernels import build
from specdec_jax.models import layers
from specdec_jax.models import model as model_lib
from specdec_jax.tools.costs import _decode_loop

MODE = sys.argv[1] if len(sys.argv) > 1 else "micro"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 15
BATCH = int(sys.argv[3]) if len(sys.argv) > 3 else 1
REV = sys.argv[4] if len(sys.argv) > 4 else "fb51b2a"
REPO = pathlib.Path(__file__).resolve().parents[2]
NOW, PREVIOUS = build.DOT, "ab_previous_dot"


def build_previous() -> None:
  source = subprocess.run(["git", "-C", str(REPO), "show", f"{REV}:specdec_jax/kernels/skinny.cc"],
                          check=True, capture_output=True).stdout
  isa = build.instruction_set()
  out = pathlib.Path(tempfile.mkdtemp()) / "previous.so"
  subprocess.run(["g++", *build.FLAGS, *isa[2], "-isystem", jax.ffi.include_dir(), "-x", "c++",
                  "-", "-o", str(out)], input=source, check=True)
  lib = ctypes.cdll.LoadLibrary(str(out))
  jax.ffi.register_ffi_target(PREVIOUS, jax.ffi.pycapsule(lib.SpecdecSkinnyDot), platform="cpu")


NEW_ATTEND, NEW_PRODUCTS = layers.MultiHeadAttention.attend, model_lib.decode_products


def previous_attend(self, q, k, v, bias):
  """REV's attention: decoder attention one query row at a time, the encoder's at once."""
  if self.name in ("self_attention", "encoder_decoder_attention") and q.shape[2] > 1:
    rows = [self._weighted_values(q[:, :, t:t + 1], k, v,
                                  bias[:, :, t:t + 1] if bias.shape[2] > 1 else bias)
            for t in range(q.shape[2])]
    y = jnp.concatenate(rows, axis=2)
  else:
    y = self._weighted_values(q, k, v, bias)
  y = jnp.swapaxes(y, 1, 2)
  return self.out(y.reshape(y.shape[:2] + (self.num_heads * self.head_dim,)))


def previous_products(cfg):
  return {p: v for p, v in NEW_PRODUCTS(cfg).items()
          if not (p[0] == "encoder" and p[-1] == "sum_squares")}


def use(previous: bool) -> None:
  """Trace with REV's decode path (previous) or today's; call before tracing."""
  layers.MultiHeadAttention.attend = previous_attend if previous else NEW_ATTEND
  model_lib.decode_products = previous_products if previous else NEW_PRODUCTS
  build.DOT = PREVIOUS if previous else NOW


def load(previous: bool):
  use(previous)
  pair = [sd.load(f"demo-de-en/{name}") for name in ("target", "drafter")]
  if previous:
    pair = [m.replace(config=m.config.replace(dropout_rate=1e-12)) for m in pair]
  for m in pair:
    m.decode_weights                     # packed now, with this variant's products
  return pair


def interleave(fns: dict, rounds: int, per: dict | None = None) -> dict:
  for f in fns.values():
    f()
  times = {k: [] for k in fns}
  for r in range(rounds):
    order = list(fns)
    random.Random(r).shuffle(order)
    for k in order:
      t0 = time.perf_counter()
      fns[k]()
      times[k].append((time.perf_counter() - t0) / (per or {}).get(k, 1))
  return {k: statistics.median(v) for k, v in times.items()}


def loadavg() -> str:
  return " ".join(open("/proc/loadavg").read().split()[:3])


def sentences(n: int) -> list[str]:
  path = REPO / "runs" / "demo" / "data" / "test.jsonl"
  if not path.exists():
    path = REPO / "tests" / "data" / "demo_test_pairs.jsonl"
  return [json.loads(line)["de"] for line in path.read_text().splitlines()][:n]


def micro() -> None:
  tok = sd.load_tokenizer("demo-de-en")
  enc = jnp.asarray(tok.encode(sentences(BATCH)), jnp.int32)
  fns, per, steps = {}, {}, 16
  for previous in (True, False):
    target, drafter = load(previous)
    for name, m, ks in (("t", target, (1, 2, 3, 4, 5)), ("d", drafter, (1, 2))):
      cache = m.start(enc, 36)
      cache = m.decode(jnp.full((BATCH, 8), 5, jnp.int32), cache)[1]
      for k in ks:
        tokens = jnp.full((BATCH, k), 7, jnp.int32)
        run = _decode_loop.lower(m, cache, tokens, steps).compile()
        fns[(previous, f"{name}{k}")] = functools.partial(
            lambda run, m, c, t: run(m, c, t).block_until_ready(), run, m, cache, tokens)
        per[(previous, f"{name}{k}")] = steps
    start = jax.jit(lambda m, e: m.start(e, 36)).lower(target, enc).compile()
    fns[(previous, "start")] = functools.partial(
        lambda start, m: jax.block_until_ready(start(m, enc)), start, target)
    jax.clear_caches()
  med = interleave(fns, ROUNDS, per)
  print(f"micro: batch {BATCH}, load {loadavg()}, ms per call, median of {ROUNDS} rounds")
  names = ("t1", "t2", "t3", "t4", "t5", "d1", "d2", "start")
  for previous in (True, False):
    row = {n: med[(previous, n)] * 1e3 for n in names}
    print(f"  {'previous' if previous else 'now     '}: "
          + " ".join(f"{n} {v:.3f}" for n, v in row.items())
          + " | t_k/t1 " + " ".join(f"{row[f't{k}'] / row['t1']:.2f}" for k in (2, 3, 4, 5))
          + f" | c {row['d1'] / row['t1']:.3f}")


def e2e() -> None:
  tok = sd.load_tokenizer("demo-de-en")
  text = sentences(100)
  enc = np.asarray(tok.encode(text))
  enc = np.concatenate([enc, np.repeat(enc[-1:], (-len(enc)) % BATCH, 0)])
  batches = [jnp.asarray(enc[i:i + BATCH], jnp.int32) for i in range(0, len(enc), BATCH)]
  pairs = {previous: load(previous) for previous in (True, False)}
  gammas = (1, 2, 3)

  def call(previous, gamma, batch):
    use(previous)
    target, drafter = pairs[previous]
    out = (sd.generate(target, batch, max_new_tokens=20) if gamma == 0 else
           sd.speculative_generate(target, drafter, batch, gamma=gamma, max_new_tokens=20))
    out.tokens.block_until_ready()
    return out

  keys = [(p, g) for p in (True, False) for g in (0, *gammas)]
  for k in keys:
    call(*k, batches[0])
  total, tokens = {k: 0.0 for k in keys}, 0
  for r in range(ROUNDS):
    for i, batch in enumerate(batches):
      order = keys[:]
      random.Random(1000 * r + i).shuffle(order)
      outs = {}
      for k in order:
        t0 = time.perf_counter()
        outs[k] = call(*k, batch)
        total[k] += time.perf_counter() - t0
      reference = np.asarray(outs[(False, 0)].tokens)
      for k in keys:        # every method and library: the same tokens
        np.testing.assert_array_equal(np.asarray(outs[k].tokens), reference)
      tokens += int(np.asarray(outs[(False, 0)].lengths)[:min(BATCH, len(text) - i * BATCH)].sum())
  print(f"e2e: batch {BATCH}, load {loadavg()}, ms per token, {ROUNDS} rounds (same tokens: yes)")
  for previous in (True, False):
    g0 = total[(previous, 0)]
    print(f"  {'previous' if previous else 'now     '}: generate {g0 / tokens * 1e3:.3f} | "
          + " ".join(f"γ{g} {total[(previous, g)] / tokens * 1e3:.3f} "
                     f"({g0 / total[(previous, g)]:.2f}x)" for g in gammas))


def products() -> None:
  shapes = [(256, 768), (256, 256), (256, 256), (256, 256), (256, 2048), (1024, 256)] * 4 \
      + [(256, 8000)]                      # the demo target's decode step (fused qkv and wi)
  rng = np.random.default_rng(0)
  weights = [jnp.asarray(rng.standard_normal(s), jnp.bfloat16).astype(jnp.float32) for s in shapes]
  packs = {dt: [kernels.pack(w, dt) for w in weights] for dt in (jnp.bfloat16, jnp.float32)}
  calls = 30

  def make(m, dt, target):
    build.DOT = target

    @jax.jit
    def loop(ps):
      def body(i, x):
        acc = x
        for (k, n), wp in zip(shapes, ps):
          y = kernels.dot(jnp.tile(x, (1, k // 256)), wp, n)
          acc = acc + y[:, :256] * 1e-9
        return acc
      return jax.lax.fori_loop(0, calls, body, jnp.ones((m, 256), jnp.float32))

    run = loop.lower(packs[dt]).compile()
    return lambda: run(packs[dt]).block_until_ready()

  variants = (("previous bf16", jnp.bfloat16, PREVIOUS), ("now bf16", jnp.bfloat16, NOW),
              ("now f32", jnp.float32, NOW))
  rows = (1, 2, 3, 4, 5, 8)
  fns = {(v, m): make(m, dt, target) for v, dt, target in variants for m in rows}
  med = interleave(fns, ROUNDS, {k: calls for k in fns})
  print(f"products: 25 products of the demo target's step, load {loadavg()}, "
        f"us per call, median of {ROUNDS} rounds")
  for v, _, _ in variants:
    print(f"  {v:14s}: " + " ".join(f"M{m} {med[(v, m)] * 1e6:.0f}" for m in rows))


if __name__ == "__main__":
  print("kernels:", kernels.status().reason, "| previous:", REV, flush=True)
  build_previous()
  {"micro": micro, "e2e": e2e, "products": products}[MODE]()
