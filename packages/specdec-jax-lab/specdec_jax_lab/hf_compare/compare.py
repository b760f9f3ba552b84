"""Running the comparison: our methods and HF's on the same prompts, timed alternately."""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

import specdec_jax as sd
from specdec_jax.batching import pad_rows, padded_batches
from specdec_jax.io.reports import machine_info, utc_now
from specdec_jax.runs import (
  Run,
  decode_corpus,
  finite,
  stats_row,
)
from specdec_jax.timing import time_rounds
from specdec_jax_lab.errors import CompareError
from specdec_jax_lab.hf_compare.hf import (
  assisted_settings_of,
  count_target_calls,
  error_text,
  hf_default_assisted_settings,
  hf_method,
  load_models,
  load_models_from_dirs,
  set_assisted_settings,
)

SCHEMA_VERSION = 1

DEFINITIONS = {
    "ms_per_token": "median wall time of one call (all prompts decoded) / tokens generated in it "
                    "for the prompts (EOS included; HF's decoder start token, padding and the "
                    "padding rows of a last batch excluded)",
    "tokens_per_s": "1000 / ms_per_token",
    "speedup_vs_hf_greedy": "hf_greedy ms_per_token / this method's ms_per_token",
    "speedup_vs_ours_greedy": "ours_greedy (batch 1) ms_per_token / this method's ms_per_token",
    "speedup_vs_ours_greedy_same_batch": "our greedy ms_per_token at the same batch size / this "
                                         "method's",
    "target_calls": "ours: verifier calls counted per row (a row live in a call adds 1), from "
                    "stats.merge_outputs over the prompts",
    "hf_target_calls": "HF's own count: target forward passes in one call, counted with a "
                       "forward hook in one extra untimed call (batch 1: one row per pass)",
    "tokens_per_target_call": "generated tokens / target calls: ours from our statistics, HF's "
                              "from hf_target_calls",
    "identical_to_hf_greedy": "every prompt's greedy tokens equal hf_greedy's, token for token",
    "identical_per_prompt": "for each prompt, whether its tokens equal hf_greedy's",
    "mismatching_prompts": "number of prompts whose tokens differ from hf_greedy's",
}


# ----------------------------------------------------------------------------- tokens


def prompt_rows(prompts) -> list[np.ndarray]:
  """Prompts as a list of 1-D int32 arrays with trailing padding (0) removed."""
  if isinstance(prompts, np.ndarray) and prompts.ndim == 1:
    prompts = [prompts]
  rows = []
  for i, p in enumerate(prompts):
    p = np.asarray(p, np.int64).reshape(-1)
    nz = np.flatnonzero(p)
    if nz.size == 0:
      raise CompareError(f"prompt {i} is empty (all padding)")
    rows.append(p[:nz[-1] + 1].astype(np.int32))
  if not rows:
    raise CompareError("no prompts given")
  return rows


def our_row_tokens(tokens, length) -> list[int]:
  return [int(t) for t in np.asarray(tokens)[:int(length)]]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
  """Index of the first differing token (or the shorter length); None when equal."""
  if list(a) == list(b):
    return None
  for i, (x, y) in enumerate(zip(a, b, strict=False)):
    if x != y:
      return i
  return min(len(a), len(b))


def our_method(method: Run, target, padded: np.ndarray, batch: int,
               max_new_tokens: int, lengths: np.ndarray | None = None) -> Callable[[], Any]:
  """One call: `method` on all prompts `padded` [N, L] in padded batches of `batch` rows
  (`lengths` [N]: a decoder-only target's prompt lengths)."""
  batches = padded_batches(padded, batch)
  kw = ({} if lengths is None else
        {"prompt_lengths": [b.tokens[:, 0] for b in padded_batches(lengths[:, None], batch)]})
  return lambda: decode_corpus(method, target, batches, max_new_tokens=max_new_tokens, **kw)


# ----------------------------------------------------------------------------- setup


def _as_model(x, what: str):
  """`x` (a Model, a Gemma 4 assistant, or a path `sd.load` reads) in float32."""
  if isinstance(x, (sd.Model, sd.GemmaAssistant)):
    model = x
  elif isinstance(x, (str, os.PathLike)):
    model = sd.load(os.fspath(x))
  else:
    raise CompareError(f"{what}: expected a Model or a path, got {type(x).__name__}")
  floats = [leaf for leaf in jax.tree_util.tree_leaves(model.params)
            if jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating)]
  if isinstance(model, sd.GemmaAssistant):
    if any(leaf.dtype != np.float32 for leaf in floats) or (
        model.config.activation_dtype != np.float32):
      model = model.with_dtype("float32")
    return model
  dtypes = {str(leaf.dtype) for leaf in floats}
  if dtypes != {"float32"} or model.config.dtype != "float32":
    # HF runs float32: compare the same float32 weights and activations
    model = model.astype("float32")
    if model.config.dtype != "float32":
      model = model.replace(config=model.config.replace(dtype="float32"))
  return model


def _describe(x, model) -> dict[str, Any]:
  config = model.config
  return {"source": os.fspath(x) if isinstance(x, (str, os.PathLike)) else "Model object",
          "params": sum(int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(model.params)),
          "config": config.to_dict() if hasattr(config, "to_dict") else dataclasses.asdict(config)}


def _directory(x, what: str) -> str:
  """A decoder-only pair is compared on its transformers dirs: transformers loads the same
  files as `sd.load` did."""
  if not isinstance(x, (str, os.PathLike)) or not os.path.isdir(x):
    raise CompareError(f"{what}: a decoder-only pair (e.g. Gemma 4 and its assistant) is "
                       f"compared from its transformers directories; give the {what}'s "
                       f"directory, got {x!r}")
  return os.fspath(x)


#: What the report says of a Gemma 4 assistant's side by side with transformers.
ASSISTANT_NOTE = (
    "transformers' Gemma 4 assistant reads the target's keys as ours does in the first "
    "drafting round and after a round that kept every draft; after a rejection it also "
    "reads keys of the rejected drafts (docs/models/gemma4.md). Its output is the target's "
    "greedy output either way, so the tokens are compared; its drafts, hence its acceptance "
    "and tokens per target call, may differ from ours.")


def _machine(errors: dict[str, str]) -> dict[str, Any]:
  machine = machine_info()
  try:
    import torch
    import transformers
    machine.update({"torch_version": torch.__version__,
                    "transformers_version": transformers.__version__,
                    "torch_num_threads": torch.get_num_threads()})
  except ImportError as e:
    errors["hf"] = error_text(e)
  return machine


# ----------------------------------------------------------------------------- methods


def _method(fn, batch, impl, kind, label, gamma) -> dict[str, Any]:
  return {"fn": fn, "batch_size": batch, "implementation": impl, "kind": kind, "label": label,
          "gamma": gamma if kind != "greedy" else None}


def _hf_methods(hf_models, rows, max_new_tokens, eos_id, gamma, config,
                pad_id=None) -> dict[str, dict]:
  if "target" not in hf_models:
    return {}
  target = hf_models["target"]
  out = {"hf_greedy": _method(hf_method(target, rows, max_new_tokens, eos_id, pad_id=pad_id), 1,
                              "hf", "greedy", "HF greedy generate", None)}
  if "drafter" in hf_models:
    out["hf_assisted"] = _method(
        hf_method(target, rows, max_new_tokens, eos_id, hf_models["drafter"], pad_id), 1, "hf",
        "assisted", f"HF assisted (num_assistant_tokens={gamma}, constant, threshold 0)", gamma)
  if "drafter_default" in hf_models:
    d = config["hf_default_assisted"]
    out["hf_assisted_default"] = _method(
        hf_method(target, rows, max_new_tokens, eos_id, hf_models["drafter_default"], pad_id),
        1,
        "hf", "assisted", f"HF assisted, {config['hf_default_assisted_source']} ("
        f"num_assistant_tokens={d.get('num_assistant_tokens')}, "
        f"{d.get('num_assistant_tokens_schedule')}, "
        f"threshold {d.get('assistant_confidence_threshold')})", d.get("num_assistant_tokens"))
  return out


def _our_methods(target, drafter, padded, batch_sizes, max_new_tokens, gamma,
                 lengths=None) -> dict:
  out = {}
  for b in batch_sizes:
    suffix = "" if b == 1 else f"_b{b}"
    out[f"ours_greedy{suffix}"] = _method(
        our_method(Run(sd.Autoregressive()), target, padded, b, max_new_tokens, lengths), b,
        "ours", "greedy", f"ours sd.generate, batch {b}", None)
    out[f"ours_speculative{suffix}"] = _method(
        our_method(Run(sd.Speculative(drafter, gamma=gamma)), target, padded, b,
                   max_new_tokens, lengths),
        b, "ours", sd.Speculative.name, f"ours sd.speculative_generate gamma={gamma}, batch {b}",
        gamma)
  return out


def _run(methods, hf_models, repeats, progress, errors):
  """Warm up every method (a failure is recorded on it), time the live ones, then count
  HF's target calls; (timed, first-call seconds, HF target calls)."""
  from tqdm import tqdm
  total = (len(methods) * (repeats + 1)
           + sum(m["implementation"] == "hf" for m in methods.values()))
  bar = tqdm(total=total, desc="hf compare: warm-up", unit="call", disable=not progress,
             file=sys.stderr, dynamic_ncols=True)
  first, hf_calls = {}, {}
  try:
    for name, m in methods.items():
      t0 = time.perf_counter()
      try:
        m["fn"]()
        first[name] = time.perf_counter() - t0
      except Exception as e:  # noqa: BLE001
        errors[name] = m["error"] = error_text(e)
      bar.update(1)
    live = {n: m["fn"] for n, m in methods.items() if "error" not in m}
    bar.set_description("hf compare: timing")
    timed = time_rounds(live, repeats, lambda: bar.update(1))
    bar.set_description("hf compare: counting HF calls")
    for name in (n for n, m in methods.items() if m["implementation"] == "hf"):
      if name in live:
        try:
          hf_calls[name] = count_target_calls(hf_models["target"], live[name])
        except Exception as e:  # noqa: BLE001
          errors[f"{name}_call_count"] = error_text(e)
      bar.update(1)
  finally:
    bar.close()
  return timed, first, hf_calls


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompareSettings:
  """What `compare` times and how.

  Attributes:
    gamma: drafts per round for ours and `num_assistant_tokens` for HF assisted.
    max_new_tokens: tokens generated per prompt at most.
    batch_sizes: extra batch sizes for our methods (HF assisted is batch 1 only).
    repeats: timed rounds; the median is reported.
    hf_default_assisted: also time HF assisted generation with transformers' defaults (a
      decoder-only drafter: with the settings its directory's generation config holds).
    progress: show a progress bar (stderr).
  """

  gamma: int = 4
  max_new_tokens: int = 32
  batch_sizes: Sequence[int] = (8, 32)
  repeats: int = 3
  hf_default_assisted: bool = True
  progress: bool = True


def compare(target, drafter, prompts, settings: CompareSettings = CompareSettings(), *,
            config: dict[str, Any] | None = None) -> dict[str, Any]:
  """Run the comparison; returns the results dict (see the package docstring).

  Args:
    target, drafter: our `Model`s or paths for `sd.load` (cast to float32 if needed). A
      decoder-only pair (a Gemma 4 target and its assistant, or a smaller Gemma 4) is
      given as its transformers directories: transformers loads the same files
      (`AutoModelForCausalLM`, float32) and its output rows are cut after the prompt.
    prompts: encoder token arrays (a list of 1-D arrays, or [N, L] 0-padded).
    settings: what is timed and how (`CompareSettings`).
    config: descriptive entries stored under "config" (e.g. "command"; "target_source"
      and "drafter_source" name models passed as objects).
  """
  s = settings
  if int(s.gamma) < 1 or int(s.max_new_tokens) < 1 or int(s.repeats) < 1:
    raise CompareError("gamma, max_new_tokens and repeats must be >= 1")
  gamma, max_new_tokens, repeats = int(s.gamma), int(s.max_new_tokens), int(s.repeats)
  hf_default_assisted, progress = s.hf_default_assisted, s.progress
  batch_sizes = [1, *sorted({int(b) for b in s.batch_sizes if int(b) > 1})]
  target_m, drafter_m = _as_model(target, "target"), _as_model(drafter, "drafter")
  decoder_only = target_m.is_decoder_only
  if decoder_only:
    dirs = _directory(target, "target"), _directory(drafter, "drafter")
  rows = prompt_rows(prompts)
  padded = pad_rows(rows)
  lengths = np.asarray([len(r) for r in rows], np.int32) if decoder_only else None
  errors: dict[str, str] = {}
  config = {**(config or {}), "gamma": gamma, "max_new_tokens": max_new_tokens,
            "repeats": repeats, "batch_sizes": batch_sizes, "num_prompts": len(rows),
            "prompt_lengths": [len(r) for r in rows], "padded_prompt_length": int(padded.shape[1]),
            "torch_dtype": "float32", "hf_assisted": None, "hf_default_assisted": None,
            "hf_default_assisted_source": ("the drafter dir's generation config" if decoder_only
                                           else "transformers defaults"),
            "notes": [ASSISTANT_NOTE] if isinstance(drafter_m, sd.GemmaAssistant) else []}
  config["target"] = _describe(config.pop("target_source", target), target_m)
  config["drafter"] = _describe(config.pop("drafter_source", drafter), drafter_m)
  machine = _machine(errors)
  with tempfile.TemporaryDirectory(prefix="specdec_hf_") as tmp:
    hf_models = (load_models_from_dirs(*dirs, hf_default_assisted, errors) if decoder_only
                 else load_models(target_m, drafter_m, tmp, hf_default_assisted, errors))
    if "drafter" in hf_models:
      config["hf_assisted"] = set_assisted_settings(hf_models["drafter"], gamma)
    if "drafter_default" in hf_models:   # a dir's own generation config may set them
      config["hf_default_assisted"] = (assisted_settings_of(hf_models["drafter_default"])
                                       if decoder_only else hf_default_assisted_settings())
    pad_id = target_m.config.pad_id if decoder_only else None
    methods = {**_hf_methods(hf_models, rows, max_new_tokens, target_m.config.eos_id, gamma,
                             config, pad_id),
               **_our_methods(target_m, drafter_m, padded, batch_sizes, max_new_tokens, gamma,
                              lengths)}
    timed, first, hf_calls = _run(methods, hf_models, repeats, progress, errors)
    hf_models.clear()
  results = _assemble(methods, timed, first, hf_calls)
  return {"schema_version": SCHEMA_VERSION, "created": utc_now(),
          "command": config.pop("command", None), "machine": machine, "config": config,
          "definitions": DEFINITIONS, "methods": results, "errors": errors,
          "summary": _summary(results)}


# ----------------------------------------------------------------------------- rows


def _timed_row(m: dict[str, Any], name: str, t: dict[str, Any], first, hf_calls) -> dict:
  """Timing, tokens and call statistics of one timed method."""
  output = t["output"]
  tokens = output.token_rows()
  generated = sum(len(x) for x in tokens)
  wall = t["median_s"]
  row = {"generated_tokens": generated, "wall_s_median": wall, "wall_s": t["times_s"],
         "first_call_s": first.get(name), "ms_per_token": 1e3 * wall / max(generated, 1),
         "tokens_per_s": generated / wall if wall > 0 else None, "_tokens": tokens}
  if m["implementation"] == "hf":
    if name in hf_calls:   # in one call, which generated `generated` tokens
      row["hf_target_calls"] = hf_calls[name]
      row["tokens_per_target_call"] = finite(generated / max(hf_calls[name], 1))
  else:
    row.update(stats_row(output.stats))
    row["tokens_per_target_call"] = row.pop("block_efficiency")
  return row


def _compare_tokens(r: dict[str, Any], key: str, base: dict[str, Any] | None) -> None:
  """identical_to_<key> and mismatching_prompts_vs_<key> of row `r` against `base`."""
  if base is None or "_tokens" not in base:
    r[f"identical_to_{key}"] = r[f"mismatching_prompts_vs_{key}"] = None
    return
  diffs = [first_difference(a, b) for a, b in zip(r["_tokens"], base["_tokens"], strict=True)]
  bad = [i for i, d in enumerate(diffs) if d is not None]
  r[f"identical_to_{key}"] = not bad
  r[f"mismatching_prompts_vs_{key}"] = len(bad)
  if key == "hf_greedy":
    r["identical_per_prompt"] = [d is None for d in diffs]
    r["mismatches"] = [{"prompt": i, "first_differing_token": diffs[i],
                        "tokens": r["_tokens"][i], "hf_greedy": base["_tokens"][i]}
                       for i in bad[:5]]


def _speedups(r: dict[str, Any], by_name: dict[str, dict]) -> None:
  def ratio(base):
    return (base["ms_per_token"] / r["ms_per_token"]
            if base is not None and "ms_per_token" in base else None)
  r["speedup_vs_hf_greedy"] = ratio(by_name.get("hf_greedy"))
  r["speedup_vs_ours_greedy"] = ratio(by_name.get("ours_greedy"))
  same = "ours_greedy" + ("" if r["batch_size"] == 1 else f"_b{r['batch_size']}")
  r["speedup_vs_ours_greedy_same_batch"] = ratio(by_name.get(same))


def _assemble(methods, timed, first, hf_calls) -> list[dict[str, Any]]:
  out = []
  for name, m in methods.items():
    row = {"name": name, "label": m["label"], "implementation": m["implementation"],
           "kind": m["kind"], "batch_size": m["batch_size"], "gamma": m["gamma"],
           "error": m.get("error")}
    if name in timed:
      row.update(_timed_row(m, name, timed[name], first, hf_calls))
    out.append(row)
  by_name = {r["name"]: r for r in out}
  for r in (r for r in out if "ms_per_token" in r):
    _speedups(r, by_name)
    _compare_tokens(r, "hf_greedy", by_name.get("hf_greedy"))
    _compare_tokens(r, "ours_greedy", by_name.get("ours_greedy"))
  for r in out:
    r["tokens_first_prompt"] = r.pop("_tokens", [None])[0]
  return out


def _summary(rows) -> dict[str, Any]:
  ok = [r for r in rows if r.get("ms_per_token") is not None]
  return {
      "all_greedy_identical_to_hf": (all(r.get("identical_to_hf_greedy") for r in ok)
                                     if any(r["name"] == "hf_greedy" for r in ok) else None),
      "failed_methods": [r["name"] for r in rows if r.get("error")],
      "fastest_batch1": min((r for r in ok if r["batch_size"] == 1),
                            key=lambda r: r["ms_per_token"], default={"name": None})["name"],
  }
