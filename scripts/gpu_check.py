#!/usr/bin/env python
"""One device check of the gpu kernel backend: invariance, the cost of exactness, c, bandwidth.

    python scripts/gpu_check.py --out results/gpu_check              # one H100/H200, <= 5 min
    python scripts/gpu_check.py --layers 2 --batches 1,8 --out ...   # shallower, quicker
    python scripts/gpu_check.py --tiny --out /tmp/check              # CPU, interpret mode

Writes OUT/gpu_check.json and OUT/gpu_check.md (one table per section):
0. sweep: per weight shape of the decode products, the candidate tilings of the dot
   (`specdec_jax.kernels.gpu.tiles.candidates`) timed, their rows checked bitwise, the
   fastest invariant one chosen: OUT/gpu_tiles.json (with --record, the package's
   specdec_jax/kernels/gpu_tiles.json), used by the sections after it.
1. invariance: row i of each kernel (decode matmul, sum of squares, attention) at M rows
   (batch x width: 1, 2, 5, 16, 64, 512) against the same row in the largest call, bitwise;
   XLA's dot of the same shape alongside (the control: it is not invariant on GPUs).
2. exactness cost: greedy ms/token at each batch size of the plain baseline (XLA,
   exact=False), the exact baseline on XLA (every call padded to EXACT_WIDTH), and the
   exact baseline on the gpu kernels (natural width); speculative gamma 4 exact on each.
3. c and bandwidth: the T5-small drafter step / T5-XXL target step at batch 1 (c), the
   target step against the bound of its decoder weights at the device's peak bandwidth;
   again with XLA:GPU command buffers for loops and conditionals (COMMAND_BUFFER_FLAGS,
   in a fresh process: section steps_command_buffers, not in --tiny).
4. tokens: every method on the gpu kernels (speculative gamma 2/4, BiLD at threshold 1,
   the baseline at exact=False) bitwise the gpu baseline's, at each batch size.
5. census: near-ties on natural text (the demo pair's held-out sentences, its trained
   target): decode steps whose top-2 logit gap is under 1 bfloat16 ulp of the top logit,
   and the rows where the plain baseline's tokens differ from the exact one's.
6. the record: a verdict for this device kind (`specdec_jax.kernels.verified`): "pass"
   when every kernel's rows are invariant, every method's tokens equal, and the exact
   baseline on the kernels is not slower than the padded XLA baseline at any batch;
   written to OUT/verified_entry.json, and with --record into the package's
   specdec_jax/kernels/verified.json (which `kernels="auto"` reads; never from interpret
   mode).
--tiny (a CPU run, the kernels in interpret mode, slow) keeps the drafter on XLA's ops
and checks speculative gamma 4 only: fewer interpreted programs to compile; it sweeps
one tiny shape's 2 candidates, takes the census on XLA's ops (2 sentences) and times
each program's compiling call alone (--repeats 0: interpret mode measures nothing, and
an interpreted call takes seconds).
Random bfloat16 weights at T5-XXL / T5-small shapes, depth cut by --layers (T5-XXL's
24 layers take longer to initialise and compile than the 5 minutes allow).
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import specdec_jax as sd
from specdec_jax.costs import StepTimer, started_cache
from specdec_jax.flags.common import int_list
from specdec_jax.kernels import gpu, verified
from specdec_jax.kernels import shapes as kernel_shapes
from specdec_jax.kernels.gpu import tiles

REPO = pathlib.Path(__file__).resolve().parent.parent
#: Natural text for the near-tie census: the demo pair's held-out German sentences.
DEMO_PAIRS = REPO / "tests" / "data" / "demo_test_pairs.jsonl"
#: Weight shapes swept (bfloat16 products of the T5-XXL target and T5-small drafter decode
#: steps; float32 [K, 1]: their norms' sums of squares); --tiny: one tiny shape.
SWEEP_SHAPES = (((4096, 4096), (4096, 10240), (10240, 4096), (4096, 32128), (512, 384),
                 (384, 512), (512, 1024), (1024, 512), (512, 32128)), ((4096, 1), (512, 1)))
TINY_SWEEP_SHAPES = (((70, 130),), ())

#: Peak HBM bandwidth, bytes/s, by device kind (datasheets: H100 SXM 3.35 TB/s, PCIe
#: 2.0 TB/s, H200 4.8 TB/s).
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100 PCIe": 2.0e12, "H100": 3.35e12}


def peak_bandwidth(kind: str) -> float | None:
  for name, bw in PEAK_BANDWIDTH.items():
    if name.lower() in kind.lower():
      return bw
  return None


def _rows_equal(run, x, ms) -> dict[str, bool]:
  """{M: rows of an M-row call (scattered positions, reversed) == those rows of the
  largest call}, bitwise."""
  full = np.asarray(run(x))
  rng = np.random.default_rng(0)
  out = {}
  for m in ms:
    rows = rng.permutation(x.shape[0])[:m][::-1].copy()
    out[str(m)] = bool(np.array_equal(np.asarray(run(x[rows])), full[rows]))
  return out


def _dot_timed(run, args: tuple, repeats: int) -> float:
  """Median microseconds of `run(*args)` (jitted) over `repeats` calls after a compiling
  one (the weights an argument, not a constant folded into the program; `_timed`)."""
  seconds, _ = _timed(lambda: run(*args), repeats)
  return 1e6 * seconds


def sweep(args) -> dict:
  """Section 0, the tile sweep: per weight shape, each candidate tiling (`tiles.candidates`,
  the first --sweep-max) timed at M = --sweep-rows rows, its rows checked bitwise (1 and 5
  rows of a 64-row call, scattered), XLA's dot timed alongside; the fastest invariant
  candidate is chosen. Shapes past --sweep-seconds keep the default rule. The chosen table
  is written to OUT/gpu_tiles.json (with --record, into the package) and used by the
  sections after this one."""
  bf16, f32 = SWEEP_SHAPES if not args.tiny else TINY_SWEEP_SHAPES
  rng = np.random.default_rng(0)
  started, shapes = time.perf_counter(), {}
  for dtype, group in ((jnp.bfloat16, bf16), (jnp.float32, f32)):
    for k, n in group:
      key = tiles.key(k, n, dtype)
      if time.perf_counter() - started > args.sweep_seconds:
        shapes[key] = {"skipped": "past --sweep-seconds: the default rule"}
        continue
      w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), dtype)
      x = jnp.asarray(rng.standard_normal((64, k)), dtype)
      rows = np.random.default_rng(k + n).permutation(64)[:5][::-1].copy()
      timed = []
      for t in tiles.candidates(k, n, dtype)[:args.sweep_max]:
        wp = gpu.pack(w, dtype, tiles=t)
        # op by op: every M <= 64 pads to one 64-row tile, so one kernel compiles for all
        full = np.asarray(gpu.dot(x, wp, n, tiles=t))
        invariant = all(np.array_equal(np.asarray(gpu.dot(x[rows[:m]], wp, n, tiles=t)),
                                       full[rows[:m]]) for m in (1, 5))
        run = jax.jit(functools.partial(gpu.dot, n=n, tiles=t))
        us = _dot_timed(run, (x[:args.sweep_rows], wp), args.repeats)
        timed.append({"tiles": t.as_json(), "us": us, "invariant": invariant})
      xla = jax.jit(lambda a, w: jnp.dot(a, w, preferred_element_type=jnp.float32))
      fine = [c for c in timed if c["invariant"]]
      shapes[key] = {"candidates": timed, "xla_us": _dot_timed(xla, (x[:args.sweep_rows], w),
                                                               args.repeats),
                     "chosen": min(fine, key=lambda c: c["us"]) if fine else None}
  table = tiles.with_entries(tiles.table(), dot={
      key: {**r["chosen"]["tiles"], "us": round(r["chosen"]["us"], 2)}
      for key, r in shapes.items() if r.get("chosen")})
  attention = _sweep_chunks(args, table)
  c = attention["chosen"]
  if c:
    table = tiles.with_entries(table, attention={attention["key"]: {
        "chunk": c["chunk"], "us": round(c["us"], 2)}})
  return {"rows": args.sweep_rows, "shapes": shapes, "attention": attention, "table": table}


def _sweep_chunks(args, table: dict) -> dict:
  """The attention's keys per chunk (`tiles.CHUNKS`) at a decode step's shape (T5-XXL:
  64 heads of 64, a 128-key cache; --tiny: 2 heads of 24, 70 keys), batch 8, 1 query:
  each timed, its rows checked (1 and 3 batch rows of the call, bitwise); the fastest
  invariant one is chosen."""
  b, h, s, d = (4, 2, 70, 24) if args.tiny else (8, 64, 128, 64)
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.standard_normal((b, 1, h, d)), jnp.bfloat16)
  k, v = (jnp.asarray(rng.standard_normal((b, h, s, d)), jnp.bfloat16) for _ in range(2))
  lengths = jnp.asarray(rng.integers(1, s + 1, (b, 1)), jnp.int32)   # a decode step's
  key = f"{-(-d // 64) * 64}:bfloat16"
  timed = []
  for c in tiles.CHUNKS:
    with tiles.using(tiles.with_entries(table, attention={key: {"chunk": c}})):
      run = jax.jit(lambda q, k, v, n: gpu.attention(q, k, v, None, n))
      seconds, full = _timed(lambda run=run: run(q, k, v, lengths), args.repeats)
      full = np.asarray(full)
      invariant = all(np.array_equal(np.asarray(run(q[r], k[r], v[r], lengths[r])), full[r])
                      for r in (np.array([b - 1]), np.array([2, 0, 1])))
    timed.append({"chunk": c, "us": 1e6 * seconds, "invariant": invariant})
  fine = [t for t in timed if t["invariant"]]
  return {"key": key, "shape": [b, h, s, d], "candidates": timed,
          "chosen": min(fine, key=lambda t: t["us"]) if fine else None}


def census(args) -> dict:
  """Section 5, near-ties: greedy decodes of natural text (the demo pair's held-out German
  sentences, its trained target in bfloat16), the exact baseline on the gpu kernels
  (--tiny: XLA's, padded) and the plain one on XLA's ops; counts the decode steps whose
  float32 top-2 logit gap is under 1 bfloat16 ulp of the top logit (teacher-forced on the
  exact baseline's tokens): where a rounding difference can flip the argmax. "0 rows
  differ" means something only where there were such steps."""
  sentences = [json.loads(line)["de"] for line in DEMO_PAIRS.read_text().splitlines()]
  sentences = sentences[:2 if args.tiny else args.census_prompts]
  model = sd.load("demo-de-en/target", dtype="bfloat16")
  tok = sd.load_tokenizer("demo-de-en")
  enc = np.asarray(tok.encode(sentences))
  new = 4 if args.tiny else args.new_tokens
  exact_on = sd.pack(model, kernels="xla" if args.tiny else "gpu")
  exact = sd.generate(exact_on, enc, new, exact=True)
  plain = sd.generate(sd.pack(model, kernels="xla"), enc, new, exact=False)
  tokens, lengths = np.asarray(exact.tokens), np.asarray(exact.lengths)
  decoder_in = np.concatenate([np.zeros((len(enc), 1), np.int32), tokens[:, :-1]], axis=1)
  logits = np.asarray(model.forward(enc, decoder_in), np.float32)      # [B, L, V]
  top2 = np.sort(logits, axis=-1)[..., -2:]
  ulp = np.exp2(np.floor(np.log2(np.abs(top2[..., 1]) + 1e-30)) - 7)   # bfloat16: 8 bits
  valid = np.arange(new)[None] < lengths[:, None]
  near = (top2[..., 1] - top2[..., 0] < ulp) & valid
  differ = np.asarray(plain.tokens) != tokens
  return {"prompts": len(sentences), "new_tokens": new, "steps": int(valid.sum()),
          "near_ties": int(near.sum()), "near_tie_rows": int(near.any(axis=1).sum()),
          "rows_differ": int(differ.any(axis=1).sum()), "tokens_differ": int(differ.sum()),
          "exact_on": "xla (padded)" if args.tiny else "gpu kernels",
          "source": str(DEMO_PAIRS.relative_to(REPO))}


def invariance(args) -> dict:
  """Section 1: each kernel's rows across M, and XLA's dot's."""
  k, n = (70, 130) if args.tiny else (4096, 10240)
  ms = (1, 2, 5, 16) if args.tiny else (1, 2, 5, 16, 64, 512)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((max(ms) * 2 if args.tiny else 512, k)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), jnp.bfloat16)
  wp = gpu.pack(w)
  ones = gpu.pack(jnp.ones((k, 1), jnp.float32), jnp.float32)
  dot = jax.jit(lambda a: gpu.dot(a, wp, n))
  xla = jax.jit(lambda a: jnp.dot(a, w, preferred_element_type=jnp.float32))
  norm = jax.jit(lambda a: gpu.sum_squares(a.astype(jnp.float32), ones))
  b, h, s, d = (2, 2, 70, 24) if args.tiny else (8, 64, 96, 64)
  widths = (1, 2, 5, 16)
  q = jnp.asarray(rng.standard_normal((b, 16, h, d)), jnp.bfloat16)
  kv = jnp.asarray(rng.standard_normal((2, b, h, s, d)), jnp.bfloat16)
  # a causal decode's per-row lengths (one key more per query row); one row of length 1
  last = np.maximum(rng.integers(1, s + 1, b), 16)
  lengths = jnp.asarray((last[:, None] - np.arange(16)[::-1]).clip(1), jnp.int32)   # [B, 16]
  lengths = lengths.at[0, 0].set(1)
  attend = jax.jit(lambda a, n: gpu.attention(a, kv[0], kv[1], None, n))
  full = np.asarray(attend(q, lengths))
  attention = {str(t): bool(np.array_equal(np.asarray(attend(q[:, 16 - t:], lengths[:, 16 - t:])),
                                           full[:, 16 - t:])) for t in widths}
  masked = gpu.attention(q, kv[0], kv[1], kernel_shapes.dense_bias(None, lengths, b, 16, s))
  return {"shape_dot": [k, n], "ms": list(ms), "dot": _rows_equal(dot, x, ms),
          "sum_squares": _rows_equal(norm, x, ms), "xla_dot": _rows_equal(xla, x, ms),
          "attention_shape": [b, h, s, d], "attention_widths": attention,
          "attention_lengths": {"as_mask": bool(np.array_equal(np.asarray(masked), full))}}


def _models(args):
  """(target, drafter) unpacked, random bfloat16 weights."""
  if args.tiny:
    tcfg = sd.get_config("t5_1_1_tiny", num_encoder_layers=1, num_decoder_layers=1)
    dcfg = sd.get_config("t5_1_1_tiny_drafter")
  else:
    tcfg = sd.get_config("t5_1_1_xxl", num_encoder_layers=args.layers,
                         num_decoder_layers=args.layers)
    dcfg = sd.get_config("t5_1_1_small")
  return sd.init_model(tcfg, 0, "bfloat16"), sd.init_model(dcfg, 1, "bfloat16")


def _prompts(args, batch: int, vocab: int) -> np.ndarray:
  rng = np.random.default_rng(batch)
  tokens = rng.integers(2, vocab, (batch, args.prompt_len)).astype(np.int32)
  tokens[:, -1] = 1
  return tokens


def _timed(run, repeats: int):
  """(median seconds, last output) of `run` over `repeats` calls after one compiling call;
  repeats 0: the compiling call's own seconds."""
  t = time.perf_counter()
  out = jax.block_until_ready(run())
  times = [time.perf_counter() - t] if repeats < 1 else []
  for _ in range(repeats):
    t = time.perf_counter()
    out = jax.block_until_ready(run())
    times.append(time.perf_counter() - t)
  return float(np.median(times)), out


def decoding(args, target, drafter) -> dict:
  """Sections 2 and 4: ms/token per batch and mode; tokens of every method on gpu."""
  on = {"xla": sd.pack(target, kernels="xla"), "gpu": sd.pack(target, kernels="gpu")}
  # --tiny (interpret mode, CPU): the drafter on XLA's ops, fewer programs to compile
  draft = sd.pack(drafter, kernels="xla" if args.tiny else "gpu")
  new = args.new_tokens
  rows, tokens = {}, {}
  for batch in args.batches:
    enc = _prompts(args, batch, target.vocab_size)
    per_token = lambda s, batch=batch: 1e3 * s / (new * batch)
    runs = {
        "plain baseline (xla, exact=False)":
            lambda enc=enc: sd.generate(on["xla"], enc, new, exact=False),
        "exact baseline (xla, padded)":
            lambda enc=enc: sd.generate(on["xla"], enc, new, exact=True),
        "exact baseline (gpu kernels)":
            lambda enc=enc: sd.generate(on["gpu"], enc, new, exact=True),
        "speculative g4 plain (xla)": lambda enc=enc: sd.speculative_generate(
            on["xla"], draft, enc, gamma=4, max_new_tokens=new, exact=False),
        "speculative g4 exact (gpu kernels)": lambda enc=enc: sd.speculative_generate(
            on["gpu"], draft, enc, gamma=4, max_new_tokens=new, exact=True),
    }
    row, outs = {}, {}
    for name, run in runs.items():
      seconds, out = _timed(run, args.repeats)
      row[name] = per_token(seconds)
      outs[name] = np.asarray(out.tokens)
    base = outs["exact baseline (gpu kernels)"]
    checks = {"speculative g4 exact (gpu kernels)": outs["speculative g4 exact (gpu kernels)"]}
    if not args.tiny:
      checks["plain baseline (gpu kernels, exact=False)"] = np.asarray(
          sd.generate(on["gpu"], enc, new, exact=False).tokens)
      checks["speculative g2 exact (gpu kernels)"] = np.asarray(sd.speculative_generate(
          on["gpu"], draft, enc, gamma=2, max_new_tokens=new).tokens)
      checks["bild threshold 1 (gpu kernels)"] = np.asarray(sd.bild_generate(
          on["gpu"], draft, enc, fallback_threshold=1.0, max_new_tokens=new).tokens)
    tokens[str(batch)] = {name: bool(np.array_equal(t, base)) for name, t in checks.items()}
    tokens[str(batch)]["exact baseline (xla, padded) == gpu baseline"] = bool(
        np.array_equal(outs["exact baseline (xla, padded)"], base))
    rows[str(batch)] = row
  return {"ms_per_token": rows, "tokens_equal_gpu_baseline": tokens, "new_tokens": new,
          "prompt_len": args.prompt_len}


#: XLA:GPU command buffers (CUDA graphs) for loops and conditionals too: the draft loop's
#: `lax.while_loop` and its per-step `lax.cond` run on the device without reading their
#: predicates back to the host each iteration. Set before JAX starts (`steps_command_buffers`).
COMMAND_BUFFER_FLAGS = "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"


def steps_command_buffers(args, out: pathlib.Path) -> dict:
  """Section 3b: the `steps` section again in a fresh process with COMMAND_BUFFER_FLAGS
  in XLA_FLAGS (XLA reads them once, at start): whether CUDA graphs of the loops cut the
  launch-bound drafter step, c."""
  import os
  import subprocess
  sub = out / "command_buffers"
  # the parent holds its preallocated 75% of the device: the child allocates as it goes
  env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {COMMAND_BUFFER_FLAGS}",
         "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  argv = [sys.executable, __file__, "--out", str(sub), "--sections", "steps",
          "--layers", str(args.layers), "--repeats", str(args.repeats),
          "--steps", str(args.steps), "--new-tokens", str(args.new_tokens)]
  if args.tiny:
    argv.append("--tiny")
  done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"the command-buffer run failed:\n{done.stderr[-3000:]}")
  steps_ = json.loads((sub / "gpu_check.json").read_text())["steps"]
  return {"xla_flags": COMMAND_BUFFER_FLAGS, "steps": steps_}


def _decoder_bytes(model) -> int:
  """Bytes a 1-token decode step reads: decoder weights (not the cross-attention K/V
  projections, applied once at `start`) and the output layer."""
  flat = jax.tree_util.tree_flatten_with_path(model.params["decoder"])[0]
  names = lambda path: [str(getattr(k, "key", k)) for k in path]
  skip = lambda path: ("encoder_decoder_attention" in names(path)
                       and bool({"key", "value"} & set(names(path))))
  return int(sum(x.size * x.dtype.itemsize for path, x in flat if not skip(path)))


def steps(args, target, drafter) -> dict:
  """Section 3: 1-token step ms of target and drafter at batch 1 (c), bandwidth bound."""
  enc = _prompts(args, 1, target.vocab_size)
  capacity = args.new_tokens + 17
  out = {}
  for backend in ("xla", "gpu"):
    t = sd.pack(target, kernels=backend)
    d = sd.pack(drafter, kernels="xla" if args.tiny else backend)   # --tiny: as `decoding`
    repeats = max(args.repeats, 1)      # a timed loop after the compiling one
    ts = StepTimer(t, started_cache(t, enc, capacity), 1, args.steps).time(repeats)
    ds = StepTimer(d, started_cache(d, enc, capacity), 1, args.steps).time(repeats)
    out[backend] = {"target_step_ms": 1e3 * ts, "drafter_step_ms": 1e3 * ds, "c": ds / ts}
  nbytes = _decoder_bytes(target)
  kind = jax.devices()[0].device_kind
  bw = peak_bandwidth(kind)
  out["target_step_bytes"] = nbytes
  out["peak_bandwidth_Bps"] = bw
  if bw:
    out["bound_ms"] = 1e3 * nbytes / bw
    for backend in ("xla", "gpu"):
      out[backend]["fraction_of_peak"] = out["bound_ms"] / out[backend]["target_step_ms"]
  return out


def markdown(result: dict) -> str:
  lines = [f"# GPU check: {result['device']} (jax {result['jax']})", "",
           f"Shapes: {result['shapes']}; random bfloat16 weights.", ""]
  sw = result.get("sweep")
  if isinstance(sw, dict) and "shapes" in sw:
    lines += [f"## Tile sweep (M = {sw['rows']} rows; us, median)", "",
              "| weight | candidates | invariant | fastest tiles (tn, tk, stages, K parts) "
              "| us | default us | XLA us |", "|---|--:|--:|---|--:|--:|--:|"]
    for key, r in sw["shapes"].items():
      if "skipped" in r:
        lines.append(f"| {key} | {r['skipped']} | | | | | |")
        continue
      c, first = r["chosen"], r["candidates"][0]
      best = (f"{c['tiles']['tn']}, {c['tiles']['tk']}, {c['tiles']['stages']}, "
              f"{c['tiles']['k_splits']} | {c['us']:.1f}") if c else "**none invariant** |"
      lines.append(f"| {key} | {len(r['candidates'])} | "
                   f"{sum(x['invariant'] for x in r['candidates'])} | {best} | "
                   f"{first['us']:.1f} | {r['xla_us']:.1f} |")
    att = sw.get("attention", {})
    if att.get("candidates"):
      lines += ["", f"Attention {att['key']} {att['shape']} (B, H, S, D): " + ", ".join(
          f"chunk {c['chunk']}: {c['us']:.1f} us{'' if c['invariant'] else ' (NOT invariant)'}"
          for c in att["candidates"])]
    lines.append("")
  inv = result.get("invariance")
  if isinstance(inv, dict) and "dot" in inv:
    lines += ["## Rows bitwise equal across M (vs the largest call)", "",
              "| M | " + " | ".join(str(m) for m in inv["ms"]) + " |",
              "|---|" + "--:|" * len(inv["ms"])]
    for name in ("dot", "sum_squares", "xla_dot"):
      lines.append(f"| {name} | " + " | ".join("yes" if inv[name][str(m)] else "**no**"
                                              for m in inv["ms"]) + " |")
    lines += ["", "Attention, query rows of a 16-token call vs T-token calls: " + ", ".join(
        f"T={t}: {'yes' if ok else 'no'}" for t, ok in inv["attention_widths"].items()),
              "", "Attention with per-row lengths bitwise the call with the keys past them "
              "masked in a bias: " + ("yes" if all(inv.get("attention_lengths", {}).values())
                                      else "**no**"), ""]
  dec = result.get("decoding")
  if isinstance(dec, dict) and "ms_per_token" in dec:
    batches = list(dec["ms_per_token"])
    names = list(dec["ms_per_token"][batches[0]])
    lines += ["## ms/token (greedy)", "", "| | " + " | ".join(f"batch {b}" for b in batches) + " |",
              "|---|" + "--:|" * len(batches)]
    for name in names:
      lines.append(f"| {name} | " + " | ".join(f"{dec['ms_per_token'][b][name]:.3f}"
                                              for b in batches) + " |")
    plain = "plain baseline (xla, exact=False)"
    for name in ("exact baseline (xla, padded)", "exact baseline (gpu kernels)"):
      lines.append(f"| {name} / plain | " + " | ".join(
          f"{dec['ms_per_token'][b][name] / dec['ms_per_token'][b][plain]:.2f}x"
          for b in batches) + " |")
    lines += ["", "## Tokens bitwise the gpu baseline's", ""]
    for b, checks in dec["tokens_equal_gpu_baseline"].items():
      lines.append(f"- batch {b}: " + ", ".join(f"{k}: {'yes' if v else '**no**'}"
                                               for k, v in checks.items()))
    lines.append("")
  st = result.get("steps")
  if isinstance(st, dict) and "gpu" in st:
    lines += ["## Steps at batch 1", "", "| backend | target ms | drafter ms | c | of peak BW |",
              "|---|--:|--:|--:|--:|"]
    for backend in ("xla", "gpu"):
      r = st[backend]
      frac = f"{100 * r['fraction_of_peak']:.0f}%" if "fraction_of_peak" in r else "n/a"
      lines.append(f"| {backend} | {r['target_step_ms']:.3f} | {r['drafter_step_ms']:.3f} | "
                   f"{r['c']:.3f} | {frac} |")
    cb = result.get("steps_command_buffers")
    if isinstance(cb, dict) and "steps" in cb:
      for backend in ("xla", "gpu"):
        r = cb["steps"][backend]
        lines.append(f"| {backend}, command buffers | {r['target_step_ms']:.3f} | "
                     f"{r['drafter_step_ms']:.3f} | {r['c']:.3f} | |")
    bound = f"{st['bound_ms']:.3f} ms" if st.get("bound_ms") else "unknown (device kind)"
    lines += ["", f"Target step reads {st['target_step_bytes'] / 1e9:.2f} GB: bound {bound}.", ""]
  ce = result.get("census")
  if isinstance(ce, dict) and "steps" in ce:
    lines += ["## Near-tie census (natural text)", "",
              f"{ce['prompts']} demo sentences ({ce['source']}), {ce['new_tokens']} new tokens, "
              f"exact baseline on {ce['exact_on']} vs the plain one on XLA: "
              f"{ce['near_ties']} of {ce['steps']} steps had a top-2 logit gap under 1 "
              f"bfloat16 ulp of the top logit (in {ce['near_tie_rows']} rows); "
              f"{ce['rows_differ']} rows ({ce['tokens_differ']} tokens) differ.", ""]
  for section, value in result.items():
    if isinstance(value, dict) and "error" in value:
      lines += [f"## {section}: FAILED", "", "```", value["error"].strip()[-2000:], "```", ""]
  record = result.get("record")
  if record:
    why = "; ".join(record["figures"]["reasons"]) or "every check passed"
    lines += ["", f"## Record: {record['verdict']} for {record['device_kind']} ({why})"]
  return "\n".join(lines)


def verdict(result: dict) -> tuple[str, list[str]]:
  """("pass" or "fail", the reasons it fails) of a check's result (module doc, item 5)."""
  why = []
  inv = result.get("invariance", {})
  if "error" in inv or not inv:
    why.append("invariance not checked")
  else:
    for kind in ("dot", "sum_squares", "attention_widths", "attention_lengths"):
      if not all(inv.get(kind, {}).values()):
        why.append(f"{kind} rows differ with M")
  dec = result.get("decoding", {})
  if "error" in dec or not dec:
    why.append("decoding not checked")
  else:
    for batch, checks in dec["tokens_equal_gpu_baseline"].items():
      if not all(v for k, v in checks.items() if "(gpu kernels" in k):
        why.append(f"tokens differ at batch {batch}")
    for batch, row in dec["ms_per_token"].items():
      if row["exact baseline (gpu kernels)"] > row["exact baseline (xla, padded)"]:
        why.append(f"the kernels' exact baseline is slower than XLA's padded one at batch "
                   f"{batch}")
  sweep_ = result.get("sweep", {})
  for key, r in {**sweep_.get("shapes", {}), "attention": sweep_.get("attention", {})}.items():
    if r.get("candidates") and not r.get("chosen"):
      why.append(f"no tiling of {key} kept its rows invariant")
  if result.get("interpret_mode"):
    why.append("interpret mode: nothing measured on a GPU")
  return ("fail" if why else "pass"), why


def record_entry(result: dict, command: str) -> dict:
  """The record's entry of this check (`verified.entry`), its reasons among the figures."""
  status, why = verdict(result)
  figures = {"reasons": why, "decoding_ms_per_token": result.get("decoding", {}).get(
      "ms_per_token"), "steps": result.get("steps"), "total_seconds": result.get(
      "total_seconds")}
  return verified.entry(status, time.strftime("%Y-%m-%d"), json.loads(json.dumps(
      figures, default=str)), check=command, jax_version=jax.__version__)


def _sections(args, sections, result: dict, out: pathlib.Path) -> bool:
  """Run `sections` in order into `result`; whether one failed (it is recorded, the
  others still run). The sections after the sweep run with the tiles it chose
  (`tiles.using`: this run only; --record writes them into the package)."""
  failed = False
  target = drafter = None
  table = tiles.table()
  for name in sections:
    t = time.perf_counter()
    try:
      with tiles.using(table):
        if name == "sweep":
          result[name] = sweep(args)
          table = result[name]["table"]
          (out / "gpu_tiles.json").write_text(json.dumps(table, indent=1) + "\n")
        elif name == "census":
          result[name] = census(args)
        elif name == "steps_command_buffers":
          result[name] = steps_command_buffers(args, out)
        elif name == "invariance":
          result[name] = invariance(args)
        elif name in ("decoding", "steps"):
          if target is None:
            target, drafter = _models(args)
          result[name] = {"decoding": decoding, "steps": steps}[name](args, target, drafter)
        else:
          raise ValueError(f"unknown section {name!r} (sweep, invariance, decoding, steps, "
                           f"steps_command_buffers, census)")
    except Exception:                       # one failed section: record it, run the others
      failed = True
      result[name] = {"error": traceback.format_exc()}
    result.setdefault("seconds", {})[name] = time.perf_counter() - t
    print(f"gpu_check: {name} done in {time.perf_counter() - t:.1f} s", file=sys.stderr)
  return failed


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=__doc__.split("\n\n", 1)[1])
  p.add_argument("--out", required=True, help="directory for gpu_check.json and .md")
  p.add_argument("--layers", type=int, default=4,
                 help="encoder and decoder layers of the T5-XXL-shaped target (default 4)")
  p.add_argument("--batches", type=int_list, default=None, metavar="1,8,32")
  p.add_argument("--new-tokens", type=int, default=32)
  p.add_argument("--prompt-len", type=int, default=32)
  p.add_argument("--repeats", type=int, default=3,
                 help="timed calls after each compiling one (0: time the compiling call; "
                 "--tiny: 0; the steps section times at least 1)")
  p.add_argument("--steps", type=int, default=16, help="decode steps per timed step loop")
  p.add_argument("--tiny", action="store_true",
                 help="tiny shapes and models (a CPU run of the whole check, interpret mode)")
  p.add_argument("--sections", default=None,
                 help="comma-separated (default: sweep,invariance,decoding,steps,"
                 "steps_command_buffers,census; --tiny: without steps_command_buffers)")
  p.add_argument("--sweep-max", type=int, default=8,
                 help="candidate tilings timed per weight shape (default 8)")
  p.add_argument("--sweep-rows", type=int, default=8, help="rows M of the timed products")
  p.add_argument("--sweep-seconds", type=float, default=80.0,
                 help="shapes past this many seconds of sweeping keep the default rule")
  p.add_argument("--census-prompts", type=int, default=32,
                 help="demo sentences decoded for the near-tie census (default 32)")
  p.add_argument("--record", action="store_true",
                 help="write this device kind's verdict into specdec_jax/kernels/"
                 "verified.json (what kernels='auto' reads) and the sweep's tiles into "
                 "specdec_jax/kernels/gpu_tiles.json; refused in interpret mode")
  args = p.parse_args(argv)
  if args.sections is None:
    args.sections = "sweep,invariance,decoding,steps," + (
        "" if args.tiny else "steps_command_buffers,") + "census"
  if args.batches is None:
    args.batches = [2] if args.tiny else [1, 8, 32]
  if args.tiny:
    args.new_tokens, args.prompt_len, args.repeats, args.steps = 3, 6, 0, 2
    args.sweep_max, args.sweep_rows = 2, 2
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  device = jax.devices()[0]
  result = {"device": f"{device.platform}: {device.device_kind}", "jax": jax.__version__,
            "interpret_mode": gpu.interpret(),
            "shapes": "tiny" if args.tiny else f"T5-XXL x {args.layers} layers / T5-small",
            "args": {k: v for k, v in vars(args).items()}}
  started = time.perf_counter()
  sections = args.sections.split(",")
  failed = _sections(args, sections, result, out)
  result["total_seconds"] = time.perf_counter() - started
  command = "python scripts/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])
  entry = record_entry(result, command)
  result["record"] = {"device_kind": device.device_kind, **entry}
  (out / "verified_entry.json").write_text(json.dumps(result["record"], indent=1))
  if args.record:
    if result["interpret_mode"]:
      print("gpu_check: --record refused: interpret mode measures nothing", file=sys.stderr)
      failed = True
    else:
      path = pathlib.Path(verified.__file__).with_name("verified.json")
      new = verified.add(verified.record(), "gpu", device.device_kind, entry)
      path.write_text(json.dumps(new, indent=1) + "\n")
      print(f"gpu_check: recorded {entry['verdict']} for {device.device_kind} in {path}",
            file=sys.stderr)
      if "table" in result.get("sweep", {}):
        path = pathlib.Path(verified.__file__).with_name(tiles.FILE[-1])
        path.write_text(json.dumps(result["sweep"]["table"], indent=1) + "\n")
        print(f"gpu_check: recorded the swept tiles in {path}", file=sys.stderr)
  (out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
  (out / "gpu_check.md").write_text(markdown(result))
  print(markdown(result))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
