"""The checks of tests/test_kernels_mesh.py, run in ONE subprocess with 8 CPU devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/kernels_mesh_checks.py OUT.json

(jax reads the device count once, at start-up.) A target sharded over the mesh
(`sd.shard`), then packed for a kernel backend, runs its kernels inside `shard_map`: this
writes what the test asserts on, per (backend, model, method): the tokens against the
same backend on one device (a greedy method's against its autoregressive baseline
there, which they are bitwise: test_kernels.py, test_tpu_kernels.py), greedy methods
against the mesh's autoregressive baseline, the widths of the target's calls, and the
kernel calls in the mesh's program.

- cpu: t5_1_1_tiny (float32) on a 2 x 4 ("data", "model") mesh, every method; llama_tiny
  (4 query heads on 2 grouped K/V heads) on 4 x 2, so each device holds one K/V head and
  its two query heads.
- tpu (Pallas interpret mode, slow): a one-layer bfloat16 t5_1_1_tiny on a 1 x 2 mesh of
  two of the devices (the interpreter runs each block copy as a host callback, per
  device), autoregressive and speculative.
- cpu and tpu, one product at a time on the 1 x 2 mesh: a column-split dot and attention
  split by grouped heads bitwise the one-device kernel, a row-split dot bitwise its two
  blocks' partial sums added in order, each row as alone. Not gpu: jax's Mosaic GPU
  interpreter keeps one shared memory for all devices and fails when two run a kernel
  at once ("Barrier remains allocated"); on a mesh the gpu kernels are lowered only.
- gpu, tpu: the autoregressive and speculative programs of the one-layer bfloat16 model
  lowered for CUDA / TPU on the 2 x 4 mesh (lowering compiles nothing).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from helpers import perturbed

import specdec_jax as sd
from specdec_jax.kernels import backends, build, dispatch
from specdec_jax.models import packing

NEW = 4
_START = time.time()


def progress(what: str) -> None:
  """A line on stderr per step, with the seconds since start (a slow run shows where)."""
  print(f"{time.time() - _START:7.1f}s {what}", file=sys.stderr, flush=True)


def custom_calls(text: str) -> list[str]:
  """The custom-call targets of a lowered (StableHLO) program, sorted."""
  return sorted(set(re.findall(r"custom_call @([\w.$-]+)", text))
                | set(re.findall(r'call_target_name = "([\w.$-]+)"', text)))


def prompts(vocab: int, batch: int, length: int = 6) -> np.ndarray:
  """int32 [batch, length] right-padded rows (the second one shorter), ending in EOS."""
  x = np.random.default_rng(0).integers(3, vocab, (batch, length)).astype(np.int32)
  x[:, -1] = 1
  x[1, -2:] = [1, 0]
  return x


def methods(target: sd.Model, drafter, heads, names) -> dict:
  everything = {"Autoregressive": lambda: sd.Autoregressive(),
                "Speculative": lambda: sd.Speculative(drafter, gamma=3),
                "BiLD": lambda: sd.BiLD(drafter, fallback_threshold=1.0),
                "Blockwise": lambda: sd.Blockwise(heads, top_k=1),
                "Beam": lambda: sd.Beam(num_beams=2)}
  return {name: everything[name]() for name in names}


class Widths:
  """Records the width of every decode call of a model packed for kernels."""

  def __init__(self):
    self.seen: list[int] = []
    self._original = sd.Model.decode_with_hidden
    widths = self

    def recording(model, tokens, cache, **kwargs):
      if model.decode_weights is not None:
        widths.seen.append(int(tokens.shape[1]))
      return widths._original(model, tokens, cache, **kwargs)

    sd.Model.decode_with_hidden = recording

  def take(self) -> list[int]:
    out, self.seen = sorted(set(self.seen)), []
    return out


def layouts(model: sd.Model) -> dict:
  """Per packed product: its backend and mesh layout (axes of batch, K, N)."""
  flat = jax.tree_util.tree_leaves(model.decode_weights.weights,
                                   is_leaf=lambda x: isinstance(x, dispatch.Packed))
  return {"backends": sorted({p.backend for p in flat}),
          "all_on_mesh": all(p.layout is not None for p in flat),
          "axes": sorted({(p.layout.batch, p.layout.k, p.layout.n) for p in flat
                          if p.layout is not None}, key=str),
          "operand_devices": sorted({len(p.operand.sharding.device_set) for p in flat
                                     if p.operand.size})}


def run(model: sd.Model, mesh, backend: str, names, batch: int) -> dict:
  """Every method in `names` on `model` sharded over `mesh` and packed for `backend`,
  against the same backend on one device; greedy methods against the mesh's baseline.

  On one device only the autoregressive baseline and beam search run: a greedy method's
  run there would only prove again that it is the baseline (the one-device tests do; on
  interpreted kernels each is a costly program), and its mesh tokens equal to the
  one-device baseline's is the stricter check."""
  single = sd.pack(model, kernels=backend)
  target = sd.pack(sd.shard(model, mesh), kernels=backend)
  drafter = perturbed(model, 0.05, seed=0)            # unpacked: XLA's ops
  heads = sd.init_heads(model, 2, rng=1, init_scale=1.0)
  x = prompts(model.vocab_size, batch)
  enc = sd.sharding.shard_batch(x, mesh)
  on_mesh = methods(target, sd.sharding.replicate(drafter, mesh),
                    sd.sharding.replicate(heads, mesh), names)
  alone = methods(single, drafter, heads, names)
  widths = Widths()
  out: dict = {"layouts": layouts(target), "width_invariant": target.width_invariant_decode,
               "equal_single": {}, "equal_baseline": {}, "exact": {}, "widths": {}}
  base, refs = None, {}
  for name in names:
    progress(f"{backend} {model.config.__class__.__name__} {name}")
    got = sd.decode(target, on_mesh[name], enc, max_new_tokens=NEW)
    out["widths"][name] = widths.take()
    if name in ("Autoregressive", "Beam"):     # the greedy others: the baseline's tokens
      refs[name] = sd.decode(single, alone[name], x, max_new_tokens=NEW)
      widths.take()
    ref = refs.get(name, refs["Autoregressive"])
    tokens = np.asarray(jax.device_get(got.tokens))
    out["equal_single"][name] = (np.array_equal(tokens, np.asarray(ref.tokens))
                                 and np.array_equal(np.asarray(jax.device_get(got.lengths)),
                                                    np.asarray(ref.lengths)))
    out["exact"][name] = bool(got.stats.get("exact", False))
    if name == "Autoregressive":
      base = tokens
    elif name != "Beam":
      out["equal_baseline"][name] = bool(np.array_equal(tokens, base))
  out["output_devices"] = len(got.tokens.sharding.device_set)
  return out


def kernel_calls(target: sd.Model, enc, platforms, drafter=None) -> dict:
  """The custom calls of the programs of autoregressive decoding (and speculative, with
  `drafter`) on `target`, lowered for `platforms`."""
  out: dict = {}
  for name, method in (("Autoregressive", sd.Autoregressive()),
                       ("Speculative", drafter and sd.Speculative(drafter, gamma=2))):
    if method is None:
      continue
    text = sd.lower(target, method, enc, max_new_tokens=NEW, platforms=platforms).as_text()
    calls = custom_calls(text)
    partitions = re.search(r"mhlo\.num_partitions = (\d+)", text)
    out[name] = {"custom_calls": calls,
                 "cpu_only": [c for c in calls if c in build.TARGETS or "cpu_callback" in c],
                 "callbacks": "callback" in text,
                 "manual": "sdy.manual_computation" in text or "shard_map" in text
                           or "Sharding" in text and "SPMDFullToShardShape" in text,
                 "partitions": int(partitions.group(1)) if partitions else 1}
  return out


def products(backend_name: str, mesh) -> dict:
  """One product at a time under `dispatch`'s mesh path on `mesh` (1 x 2) against the
  backend's kernel on one device (see the module docstring)."""
  backend = backends.get(backend_name)
  rng = np.random.default_rng(5)
  m, k, n = 3, 128, 128
  dtype = jnp.bfloat16
  x = jnp.asarray(rng.standard_normal((m, 1, k)), dtype)
  w = jnp.asarray(rng.standard_normal((k, n)) / 8, dtype)
  product = dispatch.Product(("p",), "dot", (("w",),), jnp.dtype(dtype))
  dot = backend.kernel("dot")
  out = {}
  for split in ("n", "k"):
    axes = {"k": None, "n": None, split: "model"}
    layout = dispatch.Layout(mesh, "data", axes["k"], axes["n"], (n,))
    operand = packing._blocks(backend, product, [w], layout)
    got = np.asarray(dispatch._dot_on_mesh(dot, x, operand, n, layout), np.float32)
    if split == "n":
      want = dot(x, backend.pack(w, dtype), n)
    else:
      half = k // 2
      want = (dot(x[..., :half], backend.pack(w[:half], dtype), n)
              + dot(x[..., half:], backend.pack(w[half:], dtype), n))
    alone = np.asarray(dispatch._dot_on_mesh(dot, x[1:2], operand, n, layout))
    out[f"dot_{split}"] = {"equal": bool(np.array_equal(got, np.asarray(want))),
                           "row_alone": bool(np.array_equal(alone[0], got[1])),
                           "close": float(np.max(np.abs(got - np.asarray(
                               jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32))))))}
  b, t, h, hkv, s, d = 2, 3, 4, 2, 20, 16
  q = jnp.asarray(rng.standard_normal((b, t, h, d)), dtype)
  kv = [jnp.asarray(rng.standard_normal((b, hkv, s, d)), dtype) for _ in range(2)]
  lengths = jnp.asarray([[14, 13, 20], [7, 1, 9]], jnp.int32)          # per row: [B, T]
  bias = jnp.asarray(rng.standard_normal((1, h, t, s)), jnp.float32)   # relative-position-like
  attend = backend.kernel("attention")
  layout = dispatch.Layout(mesh, "data", None, "model")
  repeated = [jnp.repeat(a, h // hkv, axis=1) for a in kv]
  for name, extra in (("attention", bias), ("attention_no_bias", None)):
    got = np.asarray(dispatch._attention_on_mesh(attend, q, *kv, extra, lengths, layout))
    out[name] = {"equal": bool(np.array_equal(got, np.asarray(attend(q, *kv, extra, lengths)))),
                 "equal_repeated": bool(np.array_equal(got, np.asarray(
                     attend(q, *repeated, extra, lengths))))}
  return out


def main(path: str) -> None:
  assert jax.device_count() == 8, jax.devices()
  report: dict = {"device_count": jax.device_count(), "cpu_kernels": build.available()}
  mesh24 = sd.make_mesh(data=2, model=4)
  t5 = sd.load("config:t5_1_1_tiny", kernels="xla")
  if build.available():
    report["cpu/t5"] = run(t5, mesh24, "cpu", ("Autoregressive", "Speculative", "BiLD",
                                               "Blockwise", "Beam"), batch=4)
    target = sd.pack(sd.shard(t5, mesh24), kernels="cpu")
    report["cpu/t5"]["calls"] = kernel_calls(target, sd.sharding.shard_batch(
        prompts(t5.vocab_size, 4), mesh24), ("cpu",))
    report["cpu/t5"]["products"] = len(target.decode_weights.products)
    lm = sd.load("config:llama_tiny", kernels="xla")
    report["cpu/lm"] = run(lm, sd.make_mesh(data=4, model=2), "cpu",
                           ("Autoregressive", "Speculative"), batch=4)
  # the Pallas backends in interpret mode: small, on two devices
  mesh12 = sd.make_mesh(data=1, model=2, devices=jax.devices()[:2])
  for backend in ("cpu", "tpu") if build.available() else ("tpu",):
    progress(f"products {backend}")
    report[f"products/{backend}"] = products(backend, mesh12)
  config = dataclasses.replace(sd.get_config("t5_1_1_tiny"), num_encoder_layers=1,
                               num_decoder_layers=1)
  tiny = sd.init_model(config, 1, "bfloat16")
  report["tpu/t5"] = run(tiny, mesh12, "tpu", ("Autoregressive", "Speculative"), batch=2)
  # lowered: the one-layer model too (Mosaic's lowering takes its time per kernel call)
  enc = sd.sharding.shard_batch(prompts(tiny.vocab_size, 2), mesh24)
  for backend, platform in (("tpu", "tpu"), ("gpu", "cuda")):
    progress(f"lowered {backend}")
    target = sd.pack(sd.shard(tiny, mesh24), kernels=backend)
    report[f"lowered/{backend}"] = kernel_calls(target, enc, (platform,),
                                                sd.sharding.replicate(tiny, mesh24))
  with open(path, "w") as f:
    json.dump(report, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1])
