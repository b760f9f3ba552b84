"""Side-by-side greedy timing against the REAL T5X decoder on the same weights, one process.

T5X is not on PyPI, so this needs a T5X source checkout (``git clone
https://github.com/google-research/t5x``). Only four pure-JAX files are imported
from it — ``t5x/decoding.py``, ``t5x/binary_search.py``,
``t5x/examples/t5/{layers,network}.py`` — under their own names, WITHOUT running
``t5x/__init__.py`` (which pulls in TensorFlow, seqio, ...).

The T5X side is what ``t5x.models.EncoderDecoderModel.predict_batch`` does for
greedy decoding: encode once; an empty decode cache from ``module.apply(...,
decode=True, mutable=["cache"])`` (as ``_compute_kv_cache``);
``t5x.decoding.temperature_sample(temperature=0)`` with a ``tokens_to_logits``
that applies ``Transformer.decode(..., decode=True)`` to one token (T5X recomputes
cross-attention K/V from the encoder output at every step). Our side is
``sd.generate`` (cross K/V cached). Both run ``steps`` tokens per row (EOS
disabled, eos_id=-1) on the same prompts; the greedy tokens must be identical,
or the comparison stops with an error.

Timing: both functions are compiled first (excluded), then `repeats` rounds
alternate the two (`timing.time_rounds`); we report medians and the ratio
ours / T5X per batch size (< 1 means we are faster).
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models.model import Model
from specdec_jax.tools.batching import cycled_rows
from specdec_jax.tools.errors import CompareError, T5XSourceError
from specdec_jax.tools.methods import Baseline
from specdec_jax.tools.prompts import random_prompts
from specdec_jax.tools.report import machine_info
from specdec_jax.tools.timing import time_rounds

T5X_FILES = ("t5x/binary_search.py", "t5x/decoding.py", "t5x/examples/t5/layers.py",
             "t5x/examples/t5/network.py")


def load_t5x(src: str | pathlib.Path) -> types.SimpleNamespace:
  """Import T5X's decoding and example network from a source checkout at `src`."""
  root = pathlib.Path(src)
  missing = [f for f in T5X_FILES if not (root / f).is_file()]
  if missing:
    raise T5XSourceError(f"{root} is not a T5X source checkout: missing {', '.join(missing)} "
                         "(git clone https://github.com/google-research/t5x)")
  for pkg in ("t5x", "t5x.examples", "t5x.examples.t5"):   # empty parents, no __init__ run
    if pkg not in sys.modules:
      module = types.ModuleType(pkg)
      module.__path__ = [str(root / pkg.replace(".", "/"))]
      sys.modules[pkg] = module
  loaded = {}
  for rel in T5X_FILES:
    name = rel[:-3].replace("/", ".")
    if name not in sys.modules:
      spec = importlib.util.spec_from_file_location(name, root / rel)
      module = importlib.util.module_from_spec(spec)
      sys.modules[name] = module
      spec.loader.exec_module(module)
      setattr(sys.modules[name.rsplit(".", 1)[0]], name.rsplit(".", 1)[1], module)
    loaded[name.rsplit(".", 1)[1]] = sys.modules[name]
  return types.SimpleNamespace(**loaded)


def t5x_network(t5x, model: Model):
  """T5X's `network.Transformer` with our model's architecture (float32, no dropout)."""
  c = model.config
  if c.dtype != "float32" or not c.gelu_approximate:
    raise T5XSourceError("the T5X comparison runs float32 models with tanh-approximate gelu")
  cfg = t5x.network.T5Config(
      vocab_size=c.vocab_size, dtype=jnp.float32, emb_dim=c.emb_dim, num_heads=c.num_heads,
      num_encoder_layers=c.num_encoder_layers, num_decoder_layers=c.num_decoder_layers,
      head_dim=c.head_dim, mlp_dim=c.mlp_dim, mlp_activations=tuple(c.mlp_activations),
      dropout_rate=0.0, logits_via_embedding=c.logits_via_embedding)
  return t5x.network.Transformer(cfg)


def t5x_greedy_fn(t5x, module, batch: int, prompt_len: int, steps: int):
  """jitted (params, encoder_tokens [B, Le]) -> greedy tokens [B, steps], T5X's way."""
  shape = (batch, steps)

  def run(params, encoder_tokens):
    encoded = module.apply({"params": params}, encoder_tokens, enable_dropout=False,
                           method=module.encode)
    # An empty cache, as t5x.models.EncoderDecoderModel._compute_kv_cache makes it.
    _, variables = module.apply({"params": params}, jnp.ones_like(encoder_tokens),
                                jnp.ones(shape, jnp.int32), jnp.ones(shape, jnp.int32),
                                mutable=["cache"], decode=True, enable_dropout=False)
    cache = variables["cache"]

    def tokens_to_logits(state):
      logits, new_vars = module.apply(
          {"params": params, "cache": state.cache}, encoded, encoder_tokens,
          state.cur_token, state.cur_token, enable_dropout=False, decode=True,
          max_decode_length=steps, mutable=["cache"], method=module.decode)
      return logits[:, 0], new_vars["cache"]

    tokens, _ = t5x.decoding.temperature_sample(
        jnp.zeros(shape, jnp.int32), cache, tokens_to_logits, eos_id=-1,
        decode_rng=jax.random.PRNGKey(0), num_decodes=1, temperature=0.0)
    return tokens[:, -1]    # best of the (single) decode, ascending order

  return jax.jit(run)


def _check_tree(t5x_params, ours) -> None:
  want = jax.tree_util.tree_map(lambda x: tuple(x.shape), t5x_params)
  have = jax.tree_util.tree_map(lambda x: tuple(np.shape(x)), ours)
  if want != have:
    raise T5XSourceError("our parameter tree differs from T5X's network.Transformer tree")


def run_t5x_compare(model: Model, t5x: types.SimpleNamespace, *, batch_sizes=(1, 8),
                    prompt_len: int = 32, steps: int = 32, repeats: int = 5,
                    progress: bool = True) -> dict[str, Any]:
  """Greedy ms/token of T5X (`t5x` from `load_t5x`) and `sd.generate` per batch size.

  Same weights, same prompts, one process; fails if the greedy tokens differ.
  """
  from tqdm.auto import tqdm
  module = t5x_network(t5x, model)
  prompts = random_prompts(max(batch_sizes), prompt_len, model.vocab_size)
  abstract = jax.eval_shape(lambda: module.init(
      jax.random.PRNGKey(0), jnp.ones((1, prompt_len), jnp.int32),
      jnp.ones((1, steps), jnp.int32), jnp.ones((1, steps), jnp.int32),
      enable_dropout=False))["params"]
  params = jax.tree_util.tree_map(jnp.asarray, model.params)
  _check_tree(abstract, params)
  rows = []
  bar = tqdm(total=len(batch_sizes) * (repeats * 2 + 2), desc="t5x compare", disable=not progress)
  for b in batch_sizes:
    enc = jnp.asarray(cycled_rows(prompts, b))
    t5x_fn = t5x_greedy_fn(t5x, module, b, prompt_len, steps)
    methods = {
        "t5x": lambda: np.asarray(t5x_fn(params, enc)),
        "ours": lambda: np.asarray(Baseline().decode(model, enc, max_new_tokens=steps,
                                                     eos_id=-1).tokens),
    }
    outputs = {}
    for name, fn in methods.items():    # compile + correctness
      outputs[name] = fn()
      bar.update()
    if not np.array_equal(outputs["t5x"], outputs["ours"]):
      diff = int(np.sum(outputs["t5x"] != outputs["ours"]))
      raise CompareError(f"batch {b}: greedy tokens differ from T5X's in {diff} places")
    timed = time_rounds(methods, repeats, tick=bar.update)
    tokens = b * steps
    row = {"batch": b, "tokens": tokens, "identical_tokens": True}
    for name in methods:
      row[f"{name}_times_s"] = timed[name]["times_s"]
      row[f"{name}_ms_per_token"] = timed[name]["median_s"] / tokens * 1e3
    # Ratio of medians, and the per-round ratios (adjacent calls, so drift cancels).
    row["ratio"] = row["ours_ms_per_token"] / row["t5x_ms_per_token"]
    row["round_ratios"] = [o / t for o, t in zip(row["ours_times_s"], row["t5x_times_s"])]
    rows.append(row)
  bar.close()
  return {"model": {"config": model.config.to_dict(), "num_params": model.num_params()},
          "prompt_len": prompt_len, "steps": steps, "repeats": repeats,
          "machine": machine_info(), "rows": rows}


def markdown(results: dict[str, Any]) -> str:
  lines = ["| batch | T5X ms/token | ours ms/token | ours / T5X | per-round ratios |",
           "|---:|---:|---:|---:|---|"]
  for r in results["rows"]:
    rounds = ", ".join(f"{x:.2f}" for x in r["round_ratios"])
    lines.append(f"| {r['batch']} | {r['t5x_ms_per_token']:.2f} | {r['ours_ms_per_token']:.2f} "
                 f"| {r['ratio']:.2f} | {rounds} |")
  m = results["model"]
  return (f"Greedy decoding, {m['num_params'] / 1e6:.1f}M params, float32, prompts of "
          f"{results['prompt_len']} tokens, {results['steps']} new tokens per row (EOS off), "
          f"median of {results['repeats']} alternating rounds; greedy tokens identical.\n\n"
          + "\n".join(lines) + "\n")


def plot(results: dict[str, Any], path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = results["rows"]
  x = np.arange(len(rows))
  fig, ax = plt.subplots(figsize=(5, 3.2))
  ax.bar(x - 0.2, [r["t5x_ms_per_token"] for r in rows], 0.4, label="T5X")
  ax.bar(x + 0.2, [r["ours_ms_per_token"] for r in rows], 0.4, label="specdec-jax")
  ax.set_xticks(x, [f"batch {r['batch']}" for r in rows])
  ax.set_ylabel("ms per row-token")
  ax.set_title("Greedy decode, same weights")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
