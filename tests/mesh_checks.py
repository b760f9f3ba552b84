"""The mesh checks of tests/test_sharding.py, run in ONE subprocess with 8 CPU devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/mesh_checks.py OUT.json

(jax reads the device count once, at start-up, so the forced 8 devices need their own
process.) Writes a JSON report: per mesh, each parameter's spec and per-device shard
shapes, and per method whether its tokens equal the single-device run's and the mesh's
`generate`. The assertions live in the test; this script only measures.
"""

import json
import sys

import jax
import numpy as np
from flax.traverse_util import flatten_dict

import specdec_jax as sd

# Mesh "DxM/RULES" -> the methods run on it: each method on some model-parallel mesh, all
# of them on 2x4 (every placement is a program of its own to compile: CI time).
GREEDY = ("generate", "speculative")
SAMPLE = ("sample", "sample_again")
MESHES = {
    "8x1/RULES_1D": GREEDY + SAMPLE,
    "2x4/RULES_1D": None,
    "2x4/RULES_2D": GREEDY,
    "1x8/RULES_1D": GREEDY + SAMPLE + ("bild", "blockwise"),
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


def runs(target, drafter, heads, enc, methods=None):
  """Each method's tokens and lengths (host arrays) for one placement; `methods`: a subset."""
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
  }
  out = {k: calls[k]() for k in (methods or calls)}
  return {k: (np.asarray(v.tokens), np.asarray(v.lengths)) for k, v in out.items()}


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


def main(path):
  assert jax.device_count() == 8, jax.devices()
  target, drafter, heads, enc = fixture()
  single = runs(target, drafter, heads, enc)
  dec_in = teacher_forced(single["generate"][0])
  single_logits = np.asarray(target.forward(enc, dec_in))
  report = {
      "device_count": jax.device_count(),
      "margin": min_margin(single_logits, *single["generate"]),
      "single_speculative_is_generate": same(single["speculative"], single["generate"]),
      "single_uses_kernels": sd.pack(target).decode_weights is not None,
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
    on_mesh = runs(t, d, h, e, methods)
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
        "packed": sd.pack(t).decode_weights is not None,
        "output_devices": len(out.tokens.sharding.device_set),
        "equal_single": {k: same(v, single[k]) for k, v in on_mesh.items()},
        "equal_generate": {k: same(v, on_mesh["generate"]) for k, v in on_mesh.items()},
        "sample_repeat": same(on_mesh["sample"], on_mesh["sample_again"])
                         if "sample" in on_mesh else None,
        "lengths": {k: v[1].tolist() for k, v in on_mesh.items()},
    }
  report["errors"] = {
      "strict": error(lambda: sd.shard(target, sd.make_mesh(model=8), strict=True)),
      "batch": error(lambda: sd.sharding.shard_batch(enc[:6], sd.make_mesh(data=4, model=2))),
      "mesh": error(lambda: sd.make_mesh(data=3, model=2)),
  }
  with open(path, "w") as f:
    json.dump(report, f, indent=1, default=list)


if __name__ == "__main__":
  main(sys.argv[1])
