"""The mesh checks of tests/test_lower.py, run in ONE subprocess with 8 CPU devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/lower_mesh_checks.py OUT.json

(jax reads the device count once, at start-up.) Lowers every method on a target sharded
over a 2 x 4 ("data", "model") mesh (`sd.shard`; the drafters and heads replicated, the
batch split) for TPU and for CUDA with `sd.lower`, a T5 and a decoder-only LM, and writes
per (model, method, platform) what the test asserts on: the custom calls, the program's
partitions and its sharding annotations. Lowering compiles nothing.
"""

from __future__ import annotations

import json
import re
import sys

import jax
import numpy as np

import specdec_jax as sd
from specdec_jax import experimental

PLATFORMS = (("tpu",), ("cuda",))
B, T = 4, 3


def custom_calls(text: str) -> list[str]:
  """The custom-call targets of a lowered (StableHLO) program, sorted."""
  return sorted(set(re.findall(r"custom_call @([\w.$-]+)", text))
                | set(re.findall(r'call_target_name = "([\w.$-]+)"', text)))


def methods(target: sd.Model, drafter, heads) -> dict:
  """Each method of the package on `target` (its drafter model and heads as given)."""
  return {"Autoregressive": sd.Autoregressive(),
          "Speculative": sd.Speculative(drafter, gamma=2),
          "BiLD": sd.BiLD(sd.early_exit(target, 1)),
          "Blockwise": sd.Blockwise(heads),
          "Beam": sd.Beam(num_beams=2),
          "SpeculativeBeam": experimental.SpeculativeBeam(drafter, num_beams=2, gamma=2)}


def tokens(vocab: int, length: int) -> np.ndarray:
  """int32 [B, length] right-padded rows (one shorter), ending in EOS (1) for T5."""
  x = np.random.default_rng(0).integers(3, vocab, (B, length)).astype(np.int32)
  x[:, -1] = 1
  x[1, -2:] = [1, 0]
  return x


def main(path: str) -> None:
  assert jax.device_count() == 8, jax.devices()
  mesh = sd.make_mesh(data=2, model=4)
  report = {}
  for name, config in (("t5", "t5_1_1_tiny"), ("lm", "llama_tiny")):
    model = sd.load(f"config:{config}", kernels="xla")
    target = sd.shard(model, mesh)
    drafter = sd.sharding.replicate(model, mesh)
    heads = sd.sharding.replicate(sd.init_heads(model, 2), mesh)
    enc = sd.sharding.shard_batch(tokens(model.vocab_size, 6), mesh)
    for method_name, method in methods(target, drafter, heads).items():
      for platforms in PLATFORMS:
        text = sd.lower(target, method, enc, max_new_tokens=T, platforms=platforms).as_text()
        partitions = re.search(r"mhlo\.num_partitions = (\d+)", text)
        report[f"{name}/{method_name}/{platforms[0]}"] = {
            "custom_calls": custom_calls(text),
            "partitions": int(partitions.group(1)) if partitions else 1,
            "sharding_constraints": len(re.findall(r"sdy\.sharding_constraint", text)),
            "model_axis_shardings": len(re.findall(r'\{"model"\}', text)),
            "cpu_callbacks": "cpu_callback" in text}
  with open(path, "w") as f:
    json.dump(report, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1])
