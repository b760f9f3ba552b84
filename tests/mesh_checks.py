"""The mesh checks of tests/test_sharding.py, run in ONE subprocess with 8 CPU devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/mesh_checks.py OUT.json \
        [MEMORY_CHECKPOINT [LM_DIRS]]

(jax reads the device count once, at start-up, so the forced 8 devices need their own
process.) Writes a JSON report: per mesh, each parameter's spec and per-device shard
shapes, and per method whether its tokens equal the single-device run's and the mesh's
`generate`; `sd.load(..., mesh=)` of every checkpoint format against a single-device load,
with the bytes of every block read; the caches' per-device shapes in the compiled decode
program and the activation constraints in the lowered one; compilations when only the
prompt's contents change; a decoder-only LM on 2x4; and, first of all (a fresh
process), the host memory of loading MEMORY_CHECKPOINT into shards; and the Hugging Face
GPT-2 and Llama dirs under LM_DIRS loaded into shards. The assertions live
in the test; this script only measures.
"""

import collections
import gc
import json
import pathlib
import re
import sys
import tempfile

import jax
import numpy as np
from flax.traverse_util import flatten_dict

import specdec_jax as sd
from specdec_jax import experimental
from specdec_jax.io import checkpoints
from specdec_jax.io.checkpoints import leaves
from specdec_jax.rounds import engine

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "t5x_tiny_v1_1"
LOAD_MESHES = ((8, 1), (2, 4), (1, 8))

# Mesh "DxM/RULES" -> the methods run on it: all of them on 2x4 (data and model
# parallel), greedy and sampling on the others (every placement is a program of its own to
# compile: CI time; a drafting method on 1x8 would only repeat its 2x4 run's proof).
GREEDY = ("generate", "speculative")
SAMPLE = ("sample", "sample_again")
SINGLE = GREEDY + SAMPLE + ("speculative_sample", "bild", "blockwise", "beam",
                            "speculative_beam")
# Greedy drafters and adaptive gamma: on 2x4 only, compared with the single device's
# `generate` (exact mode: each is bitwise `generate` on one device already).
MESH_ONLY = ("ngram", "prompt_lookup", "adaptive")
# Run on one device too: the greedy BiLD and blockwise runs there would only prove again
# that they are `generate` (exact mode; the one-device tests prove it): on the mesh they
# are compared with one device's `generate`, as MESH_ONLY.
ONE_DEVICE = tuple(m for m in SINGLE if m not in ("bild", "blockwise"))
MESHES = {
    "8x1/RULES_1D": GREEDY + SAMPLE,
    "2x4/RULES_1D": SINGLE + MESH_ONLY,
    "2x4/RULES_2D": GREEDY,
    "1x8/RULES_1D": GREEDY + SAMPLE,
}
B, L, T, GAMMA = 8, 7, 10, 3
LOGITS_SCALE = 6.0     # sharpens the random target: top-2 margins far above float noise


def fixture():
  """t5_1_1_tiny target (its output layer scaled), t5_1_1_tiny_drafter, heads, tokens."""
  target = sd.load("config:t5_1_1_tiny")
  params = jax.tree_util.tree_map(lambda x: x, target.params)
  dense = params["decoder"]["logits_dense"]
  dense["kernel"] = dense["kernel"] * LOGITS_SCALE
  target = target.replace(params=params)
  drafter = sd.load("config:t5_1_1_tiny_drafter")
  heads = sd.init_heads(target, num_heads=3, rng=1)
  enc = np.random.default_rng(0).integers(2, target.vocab_size, (B, L)).astype(np.int32)
  enc[1, 4:] = 0     # one padded row
  return target, drafter, heads, enc


def runs(target, drafter, heads, enc, methods=SINGLE, ngram=None):
  """Each method's tokens and lengths (host arrays) for one placement; `methods`: a subset.
  ngram: the `NGramDrafter` of "ngram"."""
  samp = sd.Sampling(temperature=0.7)
  rng = jax.random.PRNGKey(3)
  calls = {
      "generate": lambda: sd.generate(target, enc, T),
      "speculative": lambda: sd.speculative_generate(target, drafter, enc, gamma=GAMMA,
                                             max_new_tokens=T),
      "sample": lambda: sd.generate(target, enc, T, sampling=samp, rng=rng),
      "sample_again": lambda: sd.generate(target, enc, T, sampling=samp, rng=rng),
      "speculative_sample": lambda: sd.speculative_generate(target, drafter, enc, gamma=GAMMA,
                                                    max_new_tokens=T, sampling=samp, rng=rng),
      # fallback_threshold 1: every round is verified (BiLD's exact setting)
      "bild": lambda: sd.bild_generate(target, drafter, enc, fallback_threshold=1.0,
                                       max_new_tokens=T),
      "blockwise": lambda: sd.blockwise_generate(target, heads, enc, max_new_tokens=T),
      # 3 beams per row: 24 flat rows, a row's beams on its "data" shard
      "beam": lambda: sd.decode(target, sd.Beam(num_beams=3), enc, max_new_tokens=T),
      # the target drafting itself (several steps a call): EVERY beam compared, [B, K*T]
      "speculative_beam": lambda: all_beams(sd.decode(
          target, experimental.SpeculativeBeam(target, num_beams=3, gamma=GAMMA), enc,
          max_new_tokens=T)),
      "ngram": lambda: sd.speculative_generate(target, ngram, enc, gamma=GAMMA,
                                               max_new_tokens=T),
      "prompt_lookup": lambda: sd.speculative_generate(
          target, sd.PromptLookupDrafter(target.vocab_size), enc, gamma=GAMMA,
          max_new_tokens=T),
      "adaptive": lambda: sd.speculative_generate(target, drafter, enc, gamma=GAMMA,
                                                  max_new_tokens=T, adaptive=True),
  }
  out = {k: calls[k]() for k in methods}
  return {k: (np.asarray(v.tokens), np.asarray(v.lengths)) for k, v in out.items()}


def all_beams(out):
  """A beam search's output with every beam as its tokens [B, K * T]."""
  return out.replace(tokens=out.beams.reshape(out.beams.shape[0], -1))


def same(a, b) -> bool:
  return a[0].shape == b[0].shape and bool(np.array_equal(a[0], b[0])
                                           and np.array_equal(a[1], b[1]))


def teacher_forced(tokens):
  """Decoder inputs [B, T] that reproduce `tokens` [B, T]: the start token, then tokens."""
  return np.concatenate([np.zeros((B, 1), np.int32), tokens[:, :-1]], axis=1)


def min_margin(logits, tokens, lengths) -> float:
  """Smallest top-2 margin of `logits` [B, T, V] over the emitted positions of `tokens`."""
  top2 = np.sort(logits, axis=-1)[..., -2:]
  margin = top2[..., 1] - top2[..., 0]
  emitted = np.arange(tokens.shape[1])[None] < lengths[:, None]
  return float(margin[emitted].min())


def error(call) -> list[str] | None:
  """[type name, message] of what `call()` raises, or None."""
  try:
    call()
  except Exception as e:     # the test checks the type
    return [type(e).__name__, str(e)]
  return None


def placement(model, param_paths):
  flat = flatten_dict(model.params, sep="/")
  return {p: {"spec": [a for a in flat[p].sharding.spec] + [None] * (flat[p].ndim - len(
      flat[p].sharding.spec)),
              "shape": list(flat[p].shape),
              "shard_shapes": sorted({tuple(s.data.shape) for s in flat[p].addressable_shards}),
              "devices": len(flat[p].sharding.device_set)} for p in param_paths}


# ----------------------------------------------------------------------------- loading

def _status(field: str) -> int:
  """/proc/self/status `field` (VmRSS, VmHWM) in bytes."""
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    if line.startswith(field + ":"):
      return int(line.split()[1]) * 1024
  raise KeyError(field)


def _peak_of(load) -> dict:
  """Host RSS before, at its peak during, and after `load()` (the peak reset first)."""
  gc.collect()
  pathlib.Path("/proc/self/clear_refs").write_text("5")     # VmHWM := VmRSS
  before = _status("VmRSS")
  model = load()
  jax.block_until_ready(model.params)
  out = {"before": before, "peak": _status("VmHWM"), "after": _status("VmRSS")}
  device = sum(s.data.nbytes for x in jax.tree_util.tree_leaves(model.params)
               for s in x.addressable_shards)
  del model
  return out | {"device_bytes": device}


def memory(path: str) -> dict:
  """Host memory of loading the bfloat16 checkpoint at `path` into shards on a 2x4 mesh.
  The CPU devices' buffers are host memory too: "peak - before - device_bytes" is what
  loading held beyond the placed model."""
  mesh = sd.make_mesh(data=2, model=4)
  config = checkpoints.native.read_config(path)
  sizes = [int(np.prod(s)) * 2 for s in checkpoints.expected_shapes(config).values()]
  sharded = _peak_of(lambda: sd.load(path, dtype="bfloat16", mesh=mesh))
  return {"largest_leaf": max(sizes), "params_bytes": sum(sizes), "sharded": sharded}


def load_sources(tmp: pathlib.Path) -> dict[str, str]:
  """The fixture in every format: T5X legacy and Orbax, ours (bfloat16), Hugging Face
  (untied output layer), and HF's tie trap (untied but scaled: a scaled transpose)."""
  model = sd.load(str(FIXTURE / "legacy"))
  sd.save(tmp / "own", model, dtype="bfloat16")
  checkpoints.export_hf(tmp / "hf", model.config, model.params)
  trap = checkpoints.export_hf(tmp / "hf_trap", model.config, model.params)
  hf_config = json.loads((tmp / "hf_trap" / "config.json").read_text())
  (tmp / "hf_trap" / "config.json").write_text(json.dumps(hf_config | {
      "tie_word_embeddings": True}))
  return {"legacy": str(FIXTURE / "legacy"), "orbax": str(FIXTURE / "orbax"),
          "own": str(tmp / "own"), "hf": str(tmp / "hf"), "hf_trap": trap,
          "config": "config:t5_1_1_tiny"}


def load_checks(tmp: pathlib.Path) -> dict:
  """Per "DxM" mesh and source: `sd.load(src, mesh=)` against `sd.load(src)` leaf for leaf,
  each leaf's sharding against the rules', and the bytes of every block read (a spy on
  `leaves.read_block`, through which every sliced read passes)."""
  sources = load_sources(tmp)
  reads: dict[str, list[int]] = collections.defaultdict(list)
  original = leaves.read_block

  def spy(leaf, index, key=""):
    block = original(leaf, index, key)
    reads[key].append(int(block.nbytes))
    return block

  leaves.read_block = spy
  # Orbax reads each distinct device block of an array in `_read_shard` (orbax-checkpoint
  # 0.12): the same count of bytes per call, through Orbax's own reader.
  from orbax.checkpoint._src.serialization import serialization as orbax_reader
  orbax_read_shard = orbax_reader._read_shard
  orbax_reads: list[int] = []

  async def orbax_spy(*args, **kwargs):
    block = await orbax_read_shard(*args, **kwargs)
    orbax_reads.append(int(block.nbytes))
    return block

  orbax_reader._read_shard = orbax_spy
  single = {(name, dtype): sd.load(src, dtype=dtype) for name, src in sources.items()
            for dtype in ("float32", "bfloat16")}
  reads.clear()
  out = {}
  for data, width in LOAD_MESHES:
    mesh = sd.make_mesh(data=data, model=width)
    for (name, dtype), want in single.items():
      # bfloat16, and `config:` (its init compiled for each mesh): on 2x4 only
      if (dtype == "bfloat16" or name == "config") and (data, width) != (2, 4):
        continue
      reads.clear()
      orbax_reads.clear()
      got = sd.load(sources[name], dtype=dtype, mesh=mesh)
      rules = sd.sharding.config_shardings(got.config, mesh)
      flat, ref = flatten_dict(got.params, sep="/"), flatten_dict(want.params, sep="/")
      out[f"{data}x{width}/{name}/{dtype}"] = {
          "config_equal": got.config == want.config,
          "equal": sorted(flat) == sorted(ref) and all(
              flat[k].dtype == ref[k].dtype and np.array_equal(np.asarray(flat[k]),
                                                               np.asarray(ref[k]))
              for k in ref),
          "shardings": all(flat[k].sharding.is_equivalent_to(rules[k], flat[k].ndim)
                           for k in flat),
          "reads": {k: {"nbytes": _stored_nbytes(sources[name], k),
                        "blocks": len({_at(s.index) for s in flat[k].addressable_shards}),
                        "calls": list(reads[k])} for k in reads},
          # bytes of every distinct device block of every leaf, and what Orbax read
          "blocks": sorted(int(s.data.nbytes) for x in flat.values() for s in
                           {_at(s.index): s for s in x.addressable_shards}.values()),
          "orbax_calls": sorted(orbax_reads),
          "spec": {k: [a for a in flat[k].sharding.spec] for k in
                   ("decoder/layers_0/mlp/wi_0/kernel", "token_embedder/embedding")},
      }
  leaves.read_block = original
  orbax_reader._read_shard = orbax_read_shard
  return out


def _at(index) -> tuple:
  return tuple((s.start, s.stop) for s in index)


_STORED: dict = {}


def _stored_nbytes(src: str, key: str) -> int:
  """Bytes of parameter `key` as stored in `src` (its dtype there)."""
  if src not in _STORED:
    _, flat = checkpoints.load_checkpoint(src)
    _STORED[src] = {k: int(v.nbytes) for k, v in checkpoints.flatten(flat).items()}
  return _STORED[src][key]


def lm_load_checks(lm_dirs: str) -> dict:
  """Hugging Face decoder-only dirs (`lm_dirs`/gpt2, /llama, saved by transformers): per
  "DxM/kind", `sd.load(dir, mesh=)` against `sd.load(dir)` leaf for leaf, the shardings
  against the rules', and the bytes of every block read (the spy on `leaves.read_block`)."""
  reads: dict[str, list[int]] = collections.defaultdict(list)
  original = leaves.read_block

  def spy(leaf, index, key=""):
    block = original(leaf, index, key)
    reads[key].append(int(block.nbytes))
    return block

  out = {}
  for kind in ("gpt2", "llama"):
    src = str(pathlib.Path(lm_dirs) / kind)
    want = sd.load(src)
    ref = flatten_dict(want.params, sep="/")
    for data, width in ((2, 4), (1, 8)):
      mesh = sd.make_mesh(data=data, model=width)
      reads.clear()
      leaves.read_block = spy
      try:
        got = sd.load(src, mesh=mesh)
      finally:
        leaves.read_block = original
      rules = sd.sharding.config_shardings(got.config, mesh)
      flat = flatten_dict(got.params, sep="/")
      blocks = {k: len({_at(s.index) for s in flat[k].addressable_shards}) for k in flat}
      out[f"{data}x{width}/{kind}"] = {
          "config_equal": got.config == want.config,
          "tied": want.config.tie_embeddings,
          "equal": sorted(flat) == sorted(ref) and all(
              flat[k].dtype == ref[k].dtype and np.array_equal(np.asarray(flat[k]),
                                                               np.asarray(ref[k]))
              for k in ref),
          "shardings": all(flat[k].sharding.is_equivalent_to(rules[k], flat[k].ndim)
                           for k in flat),
          "split": sum(b > 1 for b in blocks.values()),
          "reads": {k: {"nbytes": int(ref[k].nbytes), "blocks": blocks[k],
                        "calls": list(reads[k])} for k in flat},
      }
  return out


# ----------------------------------------------------------------------------- the program

def compile_events(call) -> list[str]:
  """The jax compilation events (tracing, lowering, compiling) that `call()` causes."""
  events: list[str] = []
  recording = [True]

  def listener(event, duration, **kwargs):
    if recording[0] and event.startswith("/jax/core/compile"):
      events.append(event)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    jax.block_until_ready(call())
  finally:
    recording[0] = False
  return events


def decode_program(call):
  """The arguments `call()` runs `engine._run` (the whole jitted decode) with."""
  captured = {}
  original = engine._run

  def spy(*args, **kwargs):
    captured["args"] = (args, kwargs)
    return original(*args, **kwargs)

  engine._run = spy
  try:
    call()
  finally:
    engine._run = original
  return captured["args"]


def constraints(lowered_text: str) -> dict[str, int]:
  """"SHAPE SPEC" -> count of the sharding constraints in a lowered (StableHLO, Shardy)
  program, e.g. "8x16x128 data,-,model" for a [8, 16, 128] array split over "data" in
  dimension 0 and over "model" in dimension 2."""
  found = re.findall(r"sdy\.sharding_constraint %\S+ <@\w+, \[(.*?)\]> : tensor<([\dx]+)x\w+>",
                     lowered_text)
  out = collections.Counter()
  for spec, shape in found:
    dims = re.findall(r"\{([^}]*)\}", spec)
    out[f"{shape} " + ",".join(d.strip('" ') or "-" for d in dims)] += 1
  return dict(out)


def cache_layout(call, configs: dict) -> dict:
  """Per model ("target", "drafter": (config, data, model) of its cache, heads split over
  "model" where it divides them): how often the compiled decode program (`engine._run`
  as `call()` runs it) holds a self-attention buffer [B, H, C, Dh] and a cross-attention
  K/V [B, H, L, Dh] of its per-device shape and whole; the activation constraints of
  the lowered program (`constraints`) and the arrays the compiled one all-gathers."""
  args, kwargs = decode_program(call)
  lowered = engine._run.lower(*args, **kwargs)
  text = lowered.compile().as_text()
  capacity = kwargs["config"].capacity
  shapes = collections.Counter(re.findall(r"f32\[[\d,]+\]", text))
  out = {"constraints": constraints(lowered.as_text()),
         # "f32[...]" -> count: the float arrays the compiled program all-gathers
         "all_gathers": dict(collections.Counter(re.findall(
             r"= (f32\[[\d,]+\])\S* all-gather(?:-start)?\(", text)))}
  for name, (config, data, model) in configs.items():
    h, dh = config.num_heads, config.head_dim
    heads = h // model if h % model == 0 else h
    out[name] = {"heads_split": heads < h}
    for buffer, length in (("self", capacity), ("cross", L)):
      out[name][buffer] = {"per_device": shapes[f"f32[{B // data},{heads},{length},{dh}]"],
                           "whole": shapes[f"f32[{B},{h},{length},{dh}]"]}
  return out


# ----------------------------------------------------------------------------- decoder-only

LM_PROMPT = 5


def lm_checks(mesh) -> dict:
  """A decoder-only target (llama_tiny: 4 query heads, 2 key/value heads; output layer
  scaled) on `mesh`: greedy `generate` against one device's, and the activation
  constraints of its lowered decode (the layers are T5's: one program, CI time)."""
  target = sd.load("config:llama_tiny")
  params = jax.tree_util.tree_map(lambda x: x, target.params)
  params["decoder"]["logits_dense"]["kernel"] = (params["decoder"]["logits_dense"]["kernel"]
                                                 * LOGITS_SCALE)
  target = target.replace(params=params)
  prompts = np.random.default_rng(1).integers(3, target.vocab_size, (B, LM_PROMPT)).astype(
      np.int32)
  prompts[2, 3:] = 0     # one shorter prompt (right-padded)
  single = sd.generate(target, prompts, T)
  t, e = sd.shard(target, mesh), sd.sharding.shard_batch(prompts, mesh)
  out = []
  args, kwargs = decode_program(lambda: out.append(sd.generate(t, e, T)))
  got = out[0]
  return {"config": {"heads": target.config.num_heads, "kv_heads": target.config.num_kv_heads,
                     "mlp": target.config.mlp_dim, "emb": target.config.emb_dim,
                     "head_dim": target.config.head_dim},
          "generate": same((np.asarray(got.tokens), np.asarray(got.lengths)),
                           (np.asarray(single.tokens), np.asarray(single.lengths))),
          "constraints": constraints(engine._run.lower(*args, **kwargs).as_text())}


def main(path, memory_checkpoint=None, lm_dirs=None):
  assert jax.device_count() == 8, jax.devices()
  report = {"memory": memory(memory_checkpoint) if memory_checkpoint else None,
            "lm_load": lm_load_checks(lm_dirs) if lm_dirs else None}
  with tempfile.TemporaryDirectory() as tmp:
    report["load"] = load_checks(pathlib.Path(tmp))
  target, drafter, heads, enc = fixture()
  single = runs(target, drafter, heads, enc, ONE_DEVICE)
  # the n-gram tables fitted to the target's own output: most drafts are accepted
  ngram = sd.NGramDrafter.fit(single["generate"][0], target.vocab_size)
  args, kwargs = decode_program(lambda: sd.generate(target, enc, T))
  report["single_constraints"] = constraints(engine._run.lower(*args, **kwargs).as_text())
  dec_in = teacher_forced(single["generate"][0])
  single_logits = np.asarray(target.forward(enc, dec_in))
  report |= {
      "device_count": jax.device_count(),
      "margin": min_margin(single_logits, *single["generate"]),
      "single_speculative_is_generate": same(single["speculative"], single["generate"]),
      "single_uses_kernels": sd.pack(target).decode_weights.policy.backend == "cpu",
      "logits_scale": float(np.abs(single_logits).max()),
      "meshes": {},
  }
  paths = sorted(flatten_dict(target.params, sep="/"))
  for name, methods in MESHES.items():
    shape, rules_name = name.split("/")
    data, model = map(int, shape.split("x"))
    mesh = sd.make_mesh(data=data, model=model)
    t = sd.shard(target, mesh, rules=getattr(sd.sharding, rules_name))
    d = sd.sharding.replicate(drafter, mesh)
    h = sd.sharding.replicate(heads, mesh)
    e = sd.sharding.shard_batch(enc, mesh)
    on_mesh = runs(t, d, h, e, methods, sd.sharding.replicate(ngram, mesh))
    out = sd.generate(t, e, T)      # its program is compiled already: for the output's placement
    logits_diff = float(np.abs(np.asarray(t.forward(e, dec_in)) - single_logits).max())
    report["meshes"][name] = {
        "params": placement(t, paths),
        "drafter_devices": sorted({len(x.sharding.device_set) for x in
                                   jax.tree_util.tree_leaves(d.params)}),
        "drafter_replicated": all(x.sharding.is_fully_replicated for x in
                                  jax.tree_util.tree_leaves((d.params, h.params))),
        "enc_shard_shapes": sorted({tuple(s.data.shape) for s in e.addressable_shards}),
        "logits_max_abs_diff": logits_diff,
        "packed": sd.pack(t).decode_weights.policy.backend != "xla",
        "output_devices": len(out.tokens.sharding.device_set),
        # MESH_ONLY methods, BiLD and blockwise: against one device's `generate`
        "equal_single": {k: same(v, single[k if k in single else "generate"])
                         for k, v in on_mesh.items()},
        "equal_generate": {k: same(v, on_mesh["generate"]) for k, v in on_mesh.items()},
        "sample_repeat": same(on_mesh["sample"], on_mesh["sample_again"])
                         if "sample" in on_mesh else None,
        "lengths": {k: v[1].tolist() for k, v in on_mesh.items()},
        "tokens_spec": [a for a in out.tokens.sharding.spec],
    }
    caches = {"target": (t.config, data, model), "drafter": (d.config, data, 1)}
    report["meshes"][name]["cache"] = {
        "generate": cache_layout(lambda t=t, e=e: sd.generate(t, e, T),
                                 {"target": caches["target"]})}
    if model < 8:     # t5_1_1_tiny's 4 heads do not split 8 ways: 1x8 keeps them whole
      report["meshes"][name]["cache"]["speculative"] = cache_layout(
          lambda t=t, d=d, e=e: sd.speculative_generate(t, d, e, gamma=GAMMA, max_new_tokens=T),
          caches)
    if name == "2x4/RULES_1D":
      report["lm"] = lm_checks(mesh)
    if name == "2x4/RULES_1D":     # new prompt contents, same shapes: no new program
      other = sd.sharding.shard_batch(np.roll(enc, 1, axis=1)[::-1].copy(), mesh)
      report["recompiles"] = {
          "generate": compile_events(lambda t=t, other=other: sd.generate(t, other, T)),
          # a new shape is a new program: the listener does see compilations
          "generate_longer": compile_events(
              lambda t=t, other=other: sd.generate(t, other, T + 1)),
          "speculative": compile_events(lambda t=t, d=d, other=other: sd.speculative_generate(
              t, d, other, gamma=GAMMA, max_new_tokens=T)),
          "bild": compile_events(lambda t=t, d=d, other=other: sd.bild_generate(
              t, d, other, fallback_threshold=1.0, max_new_tokens=T)),
          "blockwise": compile_events(lambda t=t, h=h, other=other: sd.blockwise_generate(
              t, h, other, max_new_tokens=T))}
  report["errors"] = {
      "strict": error(lambda: sd.shard(target, sd.make_mesh(model=8), strict=True)),
      "batch": error(lambda: sd.sharding.shard_batch(enc[:6], sd.make_mesh(data=4, model=2))),
      "mesh": error(lambda: sd.make_mesh(data=3, model=2)),
  }
  with open(path, "w") as f:
    json.dump(report, f, indent=1, default=list)


if __name__ == "__main__":
  main(*sys.argv[1:])
