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
disabled, eos_id=-1) on the same prompts.

dtype: float32 or bfloat16, the compute dtype of both sides (our `config.dtype`:
floating params AND activations; T5X's `T5Config.dtype`, its activation dtype).
T5X casts every parameter to its layer's dtype on use (``jnp.asarray(kernel,
self.dtype)``), so it is handed our parameters as they are: the same stored
numbers on both sides. Both keep attention logits (T5X:
``float32_attention_logits``) and output logits in float32. In float32 the greedy
tokens must be identical, or the comparison stops with an error; in bfloat16 the
two implementations round differently (accumulation orders, where the casts sit),
so a near-tie can flip a token, and every later token of that row then follows a
different prefix: we report the agreement (`token_agreement`) instead.

Beam search (`beam=(K, alpha)`): T5X's side is ``t5x.decoding.beam_search`` as
``predict_batch_with_aux`` calls it (the encoder output and its tokens expanded to B*K
rows by ``flat_batch_beam_expand``, the empty cache of B rows expanded by the search
itself), ours `sd.Beam`; every beam's tokens are compared (EOS off: no beam finishes,
both return their live beams after `steps`). With a drafter, ours is exact speculative
beam search (`experimental.SpeculativeBeam(drafter, gamma=...)`, the same beams as
`sd.Beam` on a width-invariant target such as the packed one `sd.load` gives on CPU) and
each row also records its beam steps per target call.

Timing: both functions are compiled first (excluded), then `repeats` rounds
alternate the two (`timing.time_rounds`); we report medians and the ratio
ours / T5X per batch size (< 1 means we are faster).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import sys
import types
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import specdec_jax as sd
from specdec_jax import experimental
from specdec_jax.batching import cycled_rows, random_prompts
from specdec_jax.config import T5Config
from specdec_jax.io.reports import machine_info
from specdec_jax.loading import DTYPES
from specdec_jax.models.model import Model
from specdec_jax.runs import Run
from specdec_jax.timing import time_rounds
from specdec_jax_lab.errors import CompareError, T5XSourceError

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
      if spec is None or spec.loader is None:
        raise T5XSourceError(f"{root / rel}: not a Python module file")
      module = importlib.util.module_from_spec(spec)
      sys.modules[name] = module
      spec.loader.exec_module(module)
      setattr(sys.modules[name.rsplit(".", 1)[0]], name.rsplit(".", 1)[1], module)
    loaded[name.rsplit(".", 1)[1]] = sys.modules[name]
  return types.SimpleNamespace(**loaded)


def _check_dtype(dtype: str) -> None:
  """The comparison runs in the tools' compute dtypes (float32: tokens must match exactly)."""
  if dtype not in DTYPES:
    raise CompareError(f"the T5X comparison runs in {' or '.join(DTYPES)}, not {dtype}")


def t5x_network(t5x, model: Model):
  """T5X's `network.Transformer` with our model's architecture and compute dtype
  (float32 or bfloat16, `model.config.dtype`), no dropout."""
  c = model.config
  if not isinstance(c, T5Config):
    raise CompareError("the T5X comparison is for T5 encoder-decoders, not decoder-only LMs")
  _check_dtype(c.dtype)
  if not c.gelu_approximate:
    raise CompareError("the T5X comparison needs tanh-approximate gelu (T5X's only gelu)")
  cfg = t5x.network.T5Config(
      vocab_size=c.vocab_size, dtype=jnp.dtype(c.dtype), emb_dim=c.emb_dim,
      num_heads=c.num_heads, num_encoder_layers=c.num_encoder_layers,
      num_decoder_layers=c.num_decoder_layers, head_dim=c.head_dim, mlp_dim=c.mlp_dim,
      mlp_activations=tuple(c.mlp_activations), dropout_rate=0.0,
      logits_via_embedding=c.logits_via_embedding,
      # Ours accumulates q.k in float32 whatever the dtype; a no-op in float32.
      float32_attention_logits=True)
  return t5x.network.Transformer(cfg)


def _t5x_decoding(module, params, inputs, shape, steps, expand=lambda x: x):
  """(T5X's empty decoder cache for `shape` [B, T], as
  t5x.models.EncoderDecoderModel._compute_kv_cache makes it, and its `tokens_to_logits`
  over the encoded input; `expand` repeats the encoder side per beam)."""
  encoded = module.apply({"params": params}, inputs, enable_dropout=False,
                         method=module.encode)
  _, variables = module.apply({"params": params}, jnp.ones_like(inputs),
                              jnp.ones(shape, jnp.int32), jnp.ones(shape, jnp.int32),
                              mutable=["cache"], decode=True, enable_dropout=False)

  def tokens_to_logits(state):
    logits, new_vars = module.apply(
        {"params": params, "cache": state.cache}, expand(encoded), expand(inputs),
        state.cur_token, state.cur_token, enable_dropout=False, decode=True,
        max_decode_length=steps, mutable=["cache"], method=module.decode)
    return logits[:, 0], new_vars["cache"]

  return variables["cache"], tokens_to_logits


def t5x_greedy_fn(t5x, module, batch: int, prompt_len: int, steps: int):
  """jitted (params, inputs [B, Le]) -> greedy tokens [B, steps], T5X's way."""
  shape = (batch, steps)

  def run(params, inputs):
    cache, tokens_to_logits = _t5x_decoding(module, params, inputs, shape, steps)
    tokens, _ = t5x.decoding.temperature_sample(
        jnp.zeros(shape, jnp.int32), cache, tokens_to_logits, eos_id=-1,
        decode_rng=jax.random.PRNGKey(0), num_decodes=1, temperature=0.0)
    return tokens[:, -1]    # best of the (single) decode, ascending order

  return jax.jit(run)


def t5x_beam_fn(t5x, module, batch: int, steps: int, num_beams: int, alpha: float):
  """jitted (params, inputs [B, Le]) -> every beam [B, K, steps], T5X's way
  (`EncoderDecoderModel.predict_batch_with_aux` with `decode_fn=beam_search`)."""
  shape = (batch, steps)
  expand = lambda x: t5x.decoding.flat_batch_beam_expand(x, num_beams)

  def run(params, inputs):
    cache, tokens_to_logits = _t5x_decoding(module, params, inputs, shape, steps,
                                            expand)
    beams, _ = t5x.decoding.beam_search(
        jnp.zeros(shape, jnp.int32), cache, tokens_to_logits, eos_id=-1,
        num_decodes=num_beams, alpha=alpha)
    return beams

  return jax.jit(run)


def _check_tree(t5x_params, ours) -> None:
  want = jax.tree_util.tree_map(lambda x: tuple(x.shape), t5x_params)
  have = jax.tree_util.tree_map(lambda x: tuple(np.shape(x)), ours)
  if want != have:
    raise T5XSourceError("our parameter tree differs from T5X's network.Transformer tree")


def token_agreement(a, b) -> dict[str, Any]:
  """How far two greedy outputs a, b [B, T] (int) agree.

  Returns {"fraction": identical tokens / (B*T), "identical_rows": rows equal
  throughout, "rows": B, "first_divergence": per row, the first position where they
  differ, or None where the row is identical}.
  """
  a, b = np.asarray(a), np.asarray(b)
  if a.shape != b.shape or a.ndim != 2:
    raise CompareError(f"token arrays must both be [B, T], got {a.shape} and {b.shape}")
  same = a == b                                           # [B, T]
  first = [None if row.all() else int(np.argmin(row)) for row in same]
  return {"fraction": float(same.mean()) if same.size else 1.0,
          "identical_rows": int(same.all(axis=1).sum()), "rows": int(a.shape[0]),
          "first_divergence": first}


def check_agreement(dtype: str, batch: int, agreement: dict[str, Any]) -> None:
  """In float32 the two sides must produce identical tokens (CompareError if not)."""
  if dtype == "float32" and agreement["identical_rows"] != agreement["rows"]:
    diff = sum(d is not None for d in agreement["first_divergence"])
    raise CompareError(f"batch {batch}: float32 greedy tokens differ from T5X's in {diff} "
                       f"of {agreement['rows']} rows (first divergences "
                       f"{agreement['first_divergence']})")


def _compare_model(model: Model, dtype: str | None) -> Model:
  """`model` computing in `dtype` (None: its own config.dtype), one of the tools' DTYPES."""
  want = model.config.dtype if dtype is None else jnp.dtype(dtype).name
  _check_dtype(want)
  leaves = {x.dtype for x in jax.tree_util.tree_leaves(model.params)
            if jnp.issubdtype(x.dtype, jnp.floating)}
  if want == model.config.dtype and leaves <= {jnp.dtype(want)}:
    return model
  return model.with_dtype(want)      # params AND activations, as sd.load(dtype=...)


def _t5x_params(module, model: Model, prompt_len: int, steps: int):
  """Our params as device arrays, checked against the shapes T5X's init would make."""
  abstract = jax.eval_shape(lambda: module.init(
      jax.random.PRNGKey(0), jnp.ones((1, prompt_len), jnp.int32),
      jnp.ones((1, steps), jnp.int32), jnp.ones((1, steps), jnp.int32),
      enable_dropout=False))["params"]
  params = jax.tree_util.tree_map(jnp.asarray, model.params)
  _check_tree(abstract, params)
  return params


def _timed_row(methods, outputs, batch: int, steps: int, repeats: int, dtype: str,
               tick) -> dict[str, Any]:
  """One batch size's row: agreement, times, ms/token and the ours / T5X ratios."""
  agreement = token_agreement(outputs["t5x"], outputs["ours"])
  check_agreement(dtype, batch, agreement)
  timed = time_rounds(methods, repeats, tick=tick)
  tokens = batch * steps
  row = {"batch": batch, "tokens": tokens,
         "identical_tokens": agreement["identical_rows"] == agreement["rows"],
         "agreement": agreement}
  for name in methods:
    row[f"{name}_times_s"] = timed[name]["times_s"]
    row[f"{name}_ms_per_token"] = timed[name]["median_s"] / tokens * 1e3
  # Ratio of medians, and the per-round ratios (adjacent calls, so drift cancels).
  row["ratio"] = row["ours_ms_per_token"] / row["t5x_ms_per_token"]
  row["round_ratios"] = [o / t for o, t in zip(row["ours_times_s"], row["t5x_times_s"],
                                               strict=True)]
  return row


@dataclasses.dataclass(frozen=True)
class T5XTiming:
  """What `run_t5x_compare` times and how.

  Attributes:
    batch_sizes: rows per decode call, each timed on its own.
    prompt_len: the random prompts' length (encoder tokens).
    steps: tokens decoded per row (EOS off).
    repeats: timed rounds alternating T5X and ours; the median is reported.
    progress: show a progress bar.
  """

  batch_sizes: Sequence[int] = (1, 8)
  prompt_len: int = 32
  steps: int = 32
  repeats: int = 5
  progress: bool = True


def run_t5x_compare(model: Model, t5x: types.SimpleNamespace,
                    timing: T5XTiming = T5XTiming(), *, dtype: str | None = None,
                    beam: tuple[int, float] | None = None, drafter: Model | None = None,
                    gamma: int = 3) -> dict[str, Any]:
  """Greedy ms/token of T5X (`t5x` from `load_t5x`) and `sd.generate` per batch size;
  with `beam` = (K, alpha), T5X's `beam_search` and `sd.Beam` instead (every beam's
  tokens compared, flattened to [B, K * steps]); with a `drafter` too,
  `experimental.SpeculativeBeam(drafter, gamma=gamma)` instead of `sd.Beam`.

  Same weights, same prompts, one process, both in `dtype` (float32 or bfloat16;
  None: `model.config.dtype`). float32 fails if the greedy tokens differ; bfloat16
  reports their agreement per batch size (`token_agreement`). `timing`: the batch sizes,
  lengths and rounds (`T5XTiming`).
  """
  from tqdm.auto import tqdm
  batch_sizes, prompt_len, steps, repeats = (timing.batch_sizes, timing.prompt_len,
                                             timing.steps, timing.repeats)
  if drafter is not None and beam is None:
    raise CompareError("a drafter is compared with T5X's beam search only: give beam=(K, "
                       "alpha)")
  model = _compare_model(model, dtype)
  dtype = model.config.dtype
  if drafter is not None:
    drafter = _compare_model(drafter, dtype)
  module = t5x_network(t5x, model)
  params = _t5x_params(module, model, prompt_len, steps)
  prompts = random_prompts(max(batch_sizes), prompt_len, model.vocab_size)
  rows, last = [], {}          # last: ours' latest output per batch size (its stats)
  bar = tqdm(total=len(batch_sizes) * (repeats * 2 + 2), desc="t5x compare",
             disable=not timing.progress)
  for b in batch_sizes:
    enc = jnp.asarray(cycled_rows(prompts, b))
    ours: Callable[..., Any]    # two lambdas with other defaults: one type for both
    if beam is None:
      t5x_fn = t5x_greedy_fn(t5x, module, b, prompt_len, steps)
      ours = lambda enc=enc: Run(sd.Autoregressive()).decode(model, enc, max_new_tokens=steps,
                                               eos_id=-1).tokens
    else:
      t5x_fn = t5x_beam_fn(t5x, module, b, steps, *beam)
      method = Run(sd.Beam(num_beams=beam[0], alpha=beam[1]) if drafter is None else
                   experimental.SpeculativeBeam(drafter, num_beams=beam[0], alpha=beam[1],
                                                gamma=gamma))

      def ours(enc=enc, method=method, b=b):
        last[b] = method.decode(model, enc, max_new_tokens=steps, eos_id=-1)
        return last[b].beams
    flat = lambda x, b=b: np.asarray(x).reshape(b, -1)
    # bound now: each iteration's closures are called within it, by name below
    methods: dict[str, Callable[..., Any]] = {
        "t5x": lambda enc=enc, flat=flat, fn=t5x_fn: flat(fn(params, enc)),
        "ours": lambda flat=flat, ours=ours: flat(ours())}
    outputs = {}
    for name, fn in methods.items():    # compile + the tokens compared
      outputs[name] = fn()
      bar.update()
    rows.append(_timed_row(methods, outputs, b, steps, repeats, dtype, bar.update))
    if drafter is not None:
      rows[-1]["steps_per_target_call"] = last[b].stats["steps_per_target_call"]
  bar.close()
  speculative = None if drafter is None else {"gamma": gamma,
                                              "drafter_params": drafter.num_params()}
  return {"model": {"config": model.config.to_dict(), "num_params": model.num_params()},
          "dtype": dtype, "prompt_len": prompt_len, "steps": steps, "repeats": repeats,
          sd.Beam.name: None if beam is None else {
              "num_beams": beam[0], "alpha": beam[1], sd.Speculative.name: speculative},
          "machine": machine_info(), "rows": rows}


def _divergences(agreement: dict[str, Any]) -> str:
  """First divergence per row, "–" for identical rows (e.g. "–, 17, –")."""
  return ", ".join("–" if d is None else str(d) for d in agreement["first_divergence"])


def summary(results: dict[str, Any]) -> str:
  """The line above the table: setup, dtype, and what the tokens did."""
  m, dtype = results["model"], results.get("dtype", "float32")
  beam = results.get(sd.Beam.name)
  spec = (beam or {}).get(sd.Speculative.name)
  what = "Greedy decoding" if beam is None else (
      f"Beam search ({beam['num_beams']} beams, alpha {beam['alpha']}; every beam compared)")
  if all(r["identical_tokens"] for r in results["rows"]):
    tokens = ("greedy" if beam is None else sd.Beam.name) + " tokens identical"
  else:
    tokens = ("greedy tokens compared, not required identical (the two round differently "
              "in bfloat16; a row follows a different prefix after its first divergence)")
  return (f"{what}, {m['num_params'] / 1e6:.1f}M params, {dtype} params and "
          f"activations, prompts of {results['prompt_len']} tokens, {results['steps']} new "
          f"tokens per row (EOS off), median of {results['repeats']} alternating rounds; "
          f"{tokens}." + ("" if spec is None else
                          " Ours: exact speculative beam search "
                          f"(experimental.SpeculativeBeam), gamma {spec['gamma']}, a "
                          f"drafter of {spec['drafter_params'] / 1e6:.1f}M params."))


def markdown(results: dict[str, Any]) -> str:
  lines = ["| batch | T5X ms/token | ours ms/token | ours / T5X | tokens agreeing "
           "| identical rows | first divergence per row | per-round ratios |",
           "|---:|---:|---:|---:|---:|---:|---|---|"]
  for r in results["rows"]:
    a = r["agreement"]
    rounds = ", ".join(f"{x:.2f}" for x in r["round_ratios"])
    lines.append(f"| {r['batch']} | {r['t5x_ms_per_token']:.2f} | {r['ours_ms_per_token']:.2f} "
                 f"| {r['ratio']:.2f} | {100 * a['fraction']:.1f}% "
                 f"| {a['identical_rows']}/{a['rows']} | {_divergences(a)} | {rounds} |")
  if any("steps_per_target_call" in r for r in results["rows"]):
    lines += ["", "Beam steps per target call (ours): " + ", ".join(
        f"batch {r['batch']}: {r['steps_per_target_call']:.2f}" for r in results["rows"])]
  return summary(results) + "\n\n" + "\n".join(lines) + "\n"


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
  what = "Greedy decode" if results.get(sd.Beam.name) is None else "Beam search"
  ax.set_title(f"{what}, same weights, {results.get('dtype', 'float32')}")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
