"""Side by side with Hugging Face transformers on the SAME weights, in one process.

Both models (our `Model`s, or paths `sd.load` reads) are exported with
`checkpoints.export_hf` into temporary directories and loaded with
`T5ForConditionalGeneration.from_pretrained(dir, dtype=torch.float32)` in eval mode
(torch's thread count is left at its default). On the same prompts the methods are:

* `hf_greedy`: `generate(do_sample=False, num_beams=1, max_new_tokens=N)`, batch 1;
* `hf_assisted`: the same with `assistant_model=<HF drafter>`, batch 1 (transformers'
  assisted generation runs batch 1 only). The assistant's `generation_config` gets
  `num_assistant_tokens=gamma`, `num_assistant_tokens_schedule="constant"` and
  `assistant_confidence_threshold=0` (no early stop of a draft), so that each round
  drafts exactly gamma tokens as ours does;
* `hf_assisted_default`: assisted generation with transformers' own defaults (a
  fresh assistant; the values in use are recorded under config.hf_default_assisted);
* `ours_greedy` / `ours_speculative` at batch 1: `sd.generate` and
  `sd.speculative_generate(gamma)` on each prompt alone (prompts 0-padded to one
  length, so one compiled shape; padding is masked and does not change outputs);
* `ours_greedy_bB` / `ours_speculative_bB` for each batch size B (e.g. 8, 32): the
  prompts in chunks of B rows (cycled to fill the last chunk).

Each method is called once first (warm-up, compilation; excluded), then `repeats`
rounds call every method once, the order rotated by one per round; the median round
time is reported. A "call" of a method decodes ALL prompts (batch 1: one generate per
prompt, the way a user would call it).

* ms/token = median wall time of one call / tokens it generated (summed over all rows
  decoded, EOS included; HF's decoder start token and padding are not counted).
* speedup vs HF greedy / vs our greedy = that method's ms/token over this one's.
* identical: the greedy tokens of every prompt equal `hf_greedy`'s token for token
  (HF rows are cut after the decoder start token and at their first EOS).

Any method that fails (load, warm-up) is recorded with its error text instead of
stopping the comparison.

    results = compare(target, drafter, prompts, gamma=4, max_new_tokens=32)
    write_report(results, "results/hf_compare")   # hf_compare.json, hf_compare.md
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Sequence

import jax
import numpy as np

SCHEMA_VERSION = 1
DESCRIPTION = __doc__.split("\n\n    results =")[0]

DEFINITIONS = {
    "ms_per_token": "median wall time of one call (all prompts decoded) / tokens generated in it "
                    "(all rows, EOS included, HF's decoder start token and padding excluded)",
    "tokens_per_s": "1000 / ms_per_token",
    "speedup_vs_hf_greedy": "hf_greedy ms_per_token / this method's ms_per_token",
    "speedup_vs_ours_greedy": "ours_greedy (batch 1) ms_per_token / this method's ms_per_token",
    "speedup_vs_ours_greedy_same_batch": "our greedy ms_per_token at the same batch size / this "
                                         "method's",
    "tokens_per_target_call": "generated tokens / target decoder forward passes (HF: counted with "
                              "a forward hook in one extra untimed call)",
    "identical_to_hf_greedy": "every prompt's greedy tokens equal hf_greedy's, token for token",
    "mismatching_prompts": "number of prompts whose tokens differ from hf_greedy's",
}


class CompareError(ValueError):
  """Invalid comparison settings."""


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


def pad_rows(rows: Sequence[np.ndarray], length: int | None = None) -> np.ndarray:
  """[N, length] int32, rows right-padded with 0."""
  length = max(len(r) for r in rows) if length is None else length
  out = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r[:length]
  return out


def hf_row_tokens(seq, eos_id: int) -> list[int]:
  """Generated tokens of one HF output row: decoder start dropped, cut after the first EOS."""
  seq = [int(t) for t in np.asarray(seq).reshape(-1)[1:]]
  if eos_id in seq:
    seq = seq[:seq.index(eos_id) + 1]
  return seq


def our_row_tokens(tokens, length) -> list[int]:
  return [int(t) for t in np.asarray(tokens)[:int(length)]]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
  """Index of the first differing token (or the shorter length); None when equal."""
  if list(a) == list(b):
    return None
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
      return i
  return min(len(a), len(b))


# ----------------------------------------------------------------------------- HF side


def _error_text(e: BaseException) -> str:
  text = f"{type(e).__name__}: {e}"
  tb = traceback.extract_tb(e.__traceback__)
  if tb:
    last = tb[-1]
    text += f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"
  return text[:2000]


@contextlib.contextmanager
def _quiet_transformers():
  """Silence transformers' info/warning logs and weight-loading progress bars."""
  import transformers
  log = transformers.utils.logging
  level = log.get_verbosity()
  log.set_verbosity_error()
  try:
    log.disable_progress_bar()
  except AttributeError:  # pragma: no cover - older transformers
    pass
  try:
    yield
  finally:
    log.set_verbosity(level)
    with contextlib.suppress(AttributeError):
      log.enable_progress_bar()


def load_hf(model, path: str):
  """Export our `model` to a HF T5 dir at `path`; load it float32, eval mode."""
  from specdec_jax.io import checkpoints
  checkpoints.export_hf(path, model.config, model.params)
  return load_hf_from_dir(path)


def hf_default_assisted_settings() -> dict[str, Any]:
  """transformers' defaults for assisted generation (what an untouched assistant uses)."""
  from transformers import GenerationConfig
  keys = ("num_assistant_tokens", "num_assistant_tokens_schedule",
          "assistant_confidence_threshold")
  out = {}
  try:
    defaults = GenerationConfig._get_default_generation_params()
    out = {k: defaults.get(k) for k in keys}
  except AttributeError:  # transformers 4.x: the defaults are the GenerationConfig's
    cfg = GenerationConfig()
    out = {k: getattr(cfg, k, None) for k in keys}
  try:
    import sklearn  # noqa: F401  (needed by transformers to adapt the confidence threshold)
    out["sklearn_available"] = True
  except ImportError:
    out["sklearn_available"] = False
  return out


def set_assisted_settings(hf_drafter, gamma: int) -> dict[str, Any]:
  """Make transformers' assistant draft exactly `gamma` tokens per round (our algorithm)."""
  gc = hf_drafter.generation_config
  gc.num_assistant_tokens = int(gamma)
  gc.num_assistant_tokens_schedule = "constant"
  gc.assistant_confidence_threshold = 0.0   # ConfidenceCriteria is only added when > 0
  return {"num_assistant_tokens": int(gamma), "num_assistant_tokens_schedule": "constant",
          "assistant_confidence_threshold": 0.0}


class CallCounter:
  """Counts forward calls of torch modules (decoder steps of HF generate)."""

  def __init__(self, **modules):
    self.counts = {name: 0 for name in modules}
    self._handles = []
    for name, m in modules.items():
      self._handles.append(m.register_forward_hook(self._hook(name)))

  def _hook(self, name):
    def hook(*_):
      self.counts[name] += 1
    return hook

  def remove(self):
    for h in self._handles:
      h.remove()


def hf_method(hf_target, rows: Sequence[np.ndarray], max_new_tokens: int, eos_id: int,
              assistant=None) -> Callable[[], dict[str, Any]]:
  """One call: HF greedy (or assisted) generate on every prompt at batch 1."""
  import torch
  inputs = [torch.as_tensor(r[None].astype(np.int64)) for r in rows]

  def run():
    out = []
    with torch.inference_mode(), _quiet_transformers():
      for ids in inputs:
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                  num_beams=1, max_new_tokens=max_new_tokens)
        if assistant is not None:
          kw["assistant_model"] = assistant
        seq = hf_target.generate(**kw)
        out.append(hf_row_tokens(seq[0].numpy(), eos_id))
    return {"tokens": out}
  return run


# ----------------------------------------------------------------------------- our side


def our_method(target, drafter, padded: np.ndarray, batch: int, max_new_tokens: int,
               gamma: int | None) -> Callable[[], dict[str, Any]]:
  """One call: `sd.generate` (gamma None) or `sd.speculative_generate` on all prompts in
  chunks of `batch` rows (the prompt rows cycled to fill the last chunk)."""
  import specdec_jax as sd
  n = len(padded)
  n_rows = -(-n // batch) * batch
  chunks = [padded[np.arange(i, i + batch) % n] for i in range(0, n_rows, batch)]
  chunks = [jax.numpy.asarray(c) for c in chunks]

  def run():
    tokens, stats = [], {"target_calls": 0, "drafted": 0, "accepted": 0}
    for enc in chunks:
      if gamma is None:
        out = sd.generate(target, enc, max_new_tokens=max_new_tokens)
      else:
        out = sd.speculative_generate(target, drafter, enc, gamma=gamma,
                                      max_new_tokens=max_new_tokens)
      toks, lengths = jax.device_get((out.tokens, out.lengths))
      tokens += [our_row_tokens(t, l) for t, l in zip(toks, lengths)]
      if gamma is not None:
        s = jax.device_get({k: out.stats[k] for k in ("target_calls", "drafted", "accepted")})
        for k in stats:
          stats[k] += int(s[k])
      else:
        stats["target_calls"] += int(np.sum(lengths))  # one decode step per token and row
    return {"tokens": tokens, "stats": stats}
  return run


# ----------------------------------------------------------------------------- compare


def _as_model(x, what: str):
  import specdec_jax as sd
  if isinstance(x, sd.Model):
    model = x
  elif isinstance(x, (str, os.PathLike)):
    model = sd.load(os.fspath(x))
  else:
    raise CompareError(f"{what}: expected a Model or a path, got {type(x).__name__}")
  dtypes = {str(leaf.dtype) for leaf in jax.tree_util.tree_leaves(model.params)}
  if dtypes != {"float32"} or model.config.dtype != "float32":
    # HF runs float32: compare the same float32 weights and activations
    model = model.astype("float32")
    if model.config.dtype != "float32":
      model = model.replace(config=model.config.replace(dtype="float32"))
  return model


def _describe(x, model) -> dict[str, Any]:
  return {"source": os.fspath(x) if isinstance(x, (str, os.PathLike)) else "Model object",
          "params": int(model.num_params()), "config": model.config.to_dict()}


def compare(target, drafter, prompts, *, gamma: int = 4, max_new_tokens: int = 32,
            batch_sizes: Sequence[int] = (8, 32), repeats: int = 3,
            hf_default_assisted: bool = True, progress: bool = True,
            settings: dict[str, Any] | None = None) -> dict[str, Any]:
  """Run the comparison; returns the results dict (see the module docstring).

  Args:
    target, drafter: our `Model`s or paths for `sd.load` (cast to float32 if needed).
    prompts: encoder token arrays (a list of 1-D arrays, or [N, L] 0-padded).
    gamma: drafts per round for ours and `num_assistant_tokens` for HF assisted.
    batch_sizes: extra batch sizes for our methods (HF assisted is batch 1 only).
    hf_default_assisted: also time HF assisted generation with transformers' defaults.
    settings: descriptive entries stored under "config" (e.g. "command"; "target_source"
      and "drafter_source" name models passed as objects).
  """
  from tqdm import tqdm
  from specdec_jax.tools import bench
  if int(gamma) < 1 or int(max_new_tokens) < 1 or int(repeats) < 1:
    raise CompareError("gamma, max_new_tokens and repeats must be >= 1")
  batch_sizes = sorted({int(b) for b in batch_sizes if int(b) > 1})
  target_m, drafter_m = _as_model(target, "target"), _as_model(drafter, "drafter")
  rows = prompt_rows(prompts)
  padded = pad_rows(rows)
  eos_id = target_m.config.eos_id
  errors: dict[str, str] = {}

  config = dict(settings or {})
  config.update({
      "gamma": int(gamma), "max_new_tokens": int(max_new_tokens), "repeats": int(repeats),
      "batch_sizes": [1, *batch_sizes], "num_prompts": len(rows),
      "prompt_lengths": [len(r) for r in rows], "padded_prompt_length": int(padded.shape[1]),
      "target": _describe(config.pop("target_source", target), target_m),
      "drafter": _describe(config.pop("drafter_source", drafter), drafter_m),
      "torch_dtype": "float32", "hf_assisted": None, "hf_default_assisted": None,
  })
  machine = bench.machine_info()
  try:
    import torch
    import transformers
    machine.update({"torch_version": torch.__version__,
                    "transformers_version": transformers.__version__,
                    "torch_num_threads": torch.get_num_threads()})
  except ImportError as e:
    errors["hf"] = _error_text(e)

  methods: dict[str, dict[str, Any]] = {}   # name -> {"fn", "batch_size", "impl", "gamma", ...}
  hf_models = {}
  tmp = tempfile.TemporaryDirectory(prefix="specdec_hf_")
  try:
    if "hf" not in errors:
      try:
        hf_models["target"] = load_hf(target_m, os.path.join(tmp.name, "target"))
      except Exception as e:  # noqa: BLE001 - reported, not raised
        errors["hf_target_load"] = _error_text(e)
      for name in ("drafter", "drafter_default") if hf_default_assisted else ("drafter",):
        try:
          path = os.path.join(tmp.name, "drafter")
          hf_models[name] = load_hf(drafter_m, path) if name == "drafter" else (
              load_hf_from_dir(path))
        except Exception as e:  # noqa: BLE001
          errors[f"hf_{name}_load"] = _error_text(e)
    if "drafter" in hf_models:
      config["hf_assisted"] = set_assisted_settings(hf_models["drafter"], gamma)
    if "drafter_default" in hf_models:
      config["hf_default_assisted"] = hf_default_assisted_settings()

    def add(name, fn, batch, impl, kind, label, gamma_used=int(gamma)):
      methods[name] = {"fn": fn, "batch_size": batch, "implementation": impl, "kind": kind,
                       "label": label, "gamma": gamma_used if kind != "greedy" else None}

    if "target" in hf_models:
      add("hf_greedy", hf_method(hf_models["target"], rows, max_new_tokens, eos_id), 1, "hf",
          "greedy", "HF greedy generate")
      if "drafter" in hf_models:
        add("hf_assisted", hf_method(hf_models["target"], rows, max_new_tokens, eos_id,
                                     hf_models["drafter"]), 1, "hf", "assisted",
            f"HF assisted (num_assistant_tokens={gamma}, constant, threshold 0)")
      if "drafter_default" in hf_models:
        d = config["hf_default_assisted"]
        add("hf_assisted_default", hf_method(hf_models["target"], rows, max_new_tokens, eos_id,
                                             hf_models["drafter_default"]), 1, "hf", "assisted",
            "HF assisted, transformers defaults ("
            f"num_assistant_tokens={d.get('num_assistant_tokens')}, "
            f"{d.get('num_assistant_tokens_schedule')}, "
            f"threshold {d.get('assistant_confidence_threshold')})",
            d.get("num_assistant_tokens"))
    for b in [1, *batch_sizes]:
      suffix = "" if b == 1 else f"_b{b}"
      add(f"ours_greedy{suffix}", our_method(target_m, drafter_m, padded, b, max_new_tokens,
                                             None), b, "ours", "greedy",
          f"ours sd.generate, batch {b}")
      add(f"ours_speculative{suffix}", our_method(target_m, drafter_m, padded, b,
                                                  max_new_tokens, gamma), b, "ours",
          "speculative", f"ours sd.speculative_generate gamma={gamma}, batch {b}")

    total = len(methods) * (repeats + 1) + sum(m["implementation"] == "hf" for m in methods.values())
    bar = tqdm(total=total, desc="hf compare: warm-up", unit="call", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    try:
      first = {}
      for name in list(methods):
        t0 = time.perf_counter()
        try:
          methods[name]["fn"]()
          first[name] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001
          errors[name] = _error_text(e)
          methods[name]["error"] = errors[name]
        bar.update(1)
      live = {n: m["fn"] for n, m in methods.items() if "error" not in m}
      bar.set_description("hf compare: timing")
      timed = bench.time_rounds(live, repeats, lambda: bar.update(1))
      # HF decoder forward passes, counted in one extra untimed call per HF method.
      bar.set_description("hf compare: counting HF calls")
      hf_calls = {}
      for name, m in methods.items():
        if m["implementation"] != "hf":
          continue
        if name in live:
          counter = CallCounter(target=hf_models["target"])
          try:
            live[name]()
            hf_calls[name] = counter.counts["target"]
          except Exception as e:  # noqa: BLE001
            errors[f"{name}_call_count"] = _error_text(e)
          finally:
            counter.remove()
        bar.update(1)
    finally:
      bar.close()
  finally:
    hf_models.clear()
    tmp.cleanup()

  results = _assemble(methods, timed, first, hf_calls, len(rows))
  return {"schema_version": SCHEMA_VERSION,
          "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "command": config.pop("command", None), "machine": machine, "config": config,
          "definitions": DEFINITIONS, "methods": results, "errors": errors,
          "summary": _summary(results)}


def load_hf_from_dir(path: str):
  """`T5ForConditionalGeneration.from_pretrained(path)` in float32, eval mode."""
  import torch
  import transformers
  cls = transformers.T5ForConditionalGeneration
  with _quiet_transformers():
    try:
      hf = cls.from_pretrained(path, dtype=torch.float32)
    except TypeError:  # pragma: no cover - transformers < 4.56 spells it torch_dtype
      hf = cls.from_pretrained(path, torch_dtype=torch.float32)
  return hf.eval()


def _finite(x):
  if x is None:
    return None
  x = float(x)
  return x if math.isfinite(x) else None


def _assemble(methods, timed, first, hf_calls, n_prompts) -> list[dict[str, Any]]:
  out = []
  for name, m in methods.items():
    row = {"name": name, "label": m["label"], "implementation": m["implementation"],
           "kind": m["kind"], "batch_size": m["batch_size"], "gamma": m["gamma"],
           "error": m.get("error")}
    t = timed.get(name)
    if t is not None:
      tokens = t["output"]["tokens"]
      generated = sum(len(x) for x in tokens)
      wall = t["median_s"]
      row.update({"generated_tokens": generated, "wall_s_median": wall, "wall_s": t["times_s"],
                  "first_call_s": first.get(name),
                  "ms_per_token": 1e3 * wall / max(generated, 1),
                  "tokens_per_s": generated / wall if wall > 0 else None,
                  "_tokens": tokens[:n_prompts]})
      stats = t["output"].get("stats")
      if m["implementation"] == "hf" and name in hf_calls:
        row["target_calls"] = hf_calls[name]   # in one call, which generated `generated` tokens
        row["tokens_per_target_call"] = _finite(generated / max(hf_calls[name], 1))
      elif stats is not None:
        row["target_calls"] = stats["target_calls"]
        row["tokens_per_target_call"] = _finite(generated / max(stats["target_calls"], 1))
        if m["kind"] == "speculative":
          row["acceptance_rate"] = _finite(stats["accepted"] / max(stats["drafted"], 1))
    out.append(row)

  by_name = {r["name"]: r for r in out}
  ref = by_name.get("hf_greedy")
  ours1 = by_name.get("ours_greedy")
  for r in out:
    if "ms_per_token" not in r:
      continue
    for key, base in (("speedup_vs_hf_greedy", ref), ("speedup_vs_ours_greedy", ours1)):
      r[key] = (base["ms_per_token"] / r["ms_per_token"]
                if base is not None and "ms_per_token" in base else None)
    same = by_name.get("ours_greedy" + ("" if r["batch_size"] == 1 else f"_b{r['batch_size']}"))
    r["speedup_vs_ours_greedy_same_batch"] = (
        same["ms_per_token"] / r["ms_per_token"] if same is not None and "ms_per_token" in same
        else None)
    for key, base in (("hf_greedy", ref), ("ours_greedy", ours1)):
      if base is None or "_tokens" not in base:
        r[f"identical_to_{key}"] = None
        r[f"mismatching_prompts_vs_{key}"] = None
        continue
      diffs = [first_difference(a, b) for a, b in zip(r["_tokens"], base["_tokens"])]
      bad = [i for i, d in enumerate(diffs) if d is not None]
      r[f"identical_to_{key}"] = not bad
      r[f"mismatching_prompts_vs_{key}"] = len(bad)
      if key == "hf_greedy":
        r["mismatches"] = [{"prompt": i, "first_differing_token": diffs[i],
                            "tokens": r["_tokens"][i], "hf_greedy": base["_tokens"][i]}
                           for i in bad[:5]]
  for r in out:
    r["tokens_first_prompt"] = r.get("_tokens", [None])[0]
    r.pop("_tokens", None)
  return out


def _summary(rows) -> dict[str, Any]:
  ok = [r for r in rows if r.get("ms_per_token") is not None]
  return {
      "all_greedy_identical_to_hf": (all(r.get("identical_to_hf_greedy") for r in ok)
                                     if any(r["name"] == "hf_greedy" for r in ok) else None),
      "failed_methods": [r["name"] for r in rows if r.get("error")],
      "fastest_batch1": min((r for r in ok if r["batch_size"] == 1),
                            key=lambda r: r["ms_per_token"], default={}).get("name"),
  }


# ----------------------------------------------------------------------------- report


TABLE_COLUMNS = ("method", "batch", "γ", "ms/token", "tokens/s", "speedup vs HF greedy",
                 "speedup vs our greedy (B=1)", "speedup vs our greedy (same B)",
                 "tokens/target call", "identical to HF greedy")


def markdown_table(results: dict[str, Any]) -> str:
  def f(x, d=2, suffix=""):
    return "—" if x is None else f"{x:.{d}f}{suffix}"
  lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
  n = results["config"]["num_prompts"]
  for r in results["methods"]:
    if r.get("error") or r.get("ms_per_token") is None:
      err = (r.get("error") or "not timed").replace("|", "\\|").replace("\n", " ")
      lines.append(f"| {r['label']} | {r['batch_size']} | {r['gamma'] or '—'} | failed: "
                   f"{err[:300]} |" + " — |" * (len(TABLE_COLUMNS) - 4))
      continue
    ident = r.get("identical_to_hf_greedy")
    ident = ("—" if ident is None else "yes" if ident else
             f"no ({r['mismatching_prompts_vs_hf_greedy']}/{n} prompts differ)")
    lines.append("| " + " | ".join([
        r["label"], str(r["batch_size"]), str(r["gamma"] or "—"), f(r["ms_per_token"], 3),
        f(r["tokens_per_s"], 1), f(r.get("speedup_vs_hf_greedy"), 2, "x"),
        f(r.get("speedup_vs_ours_greedy"), 2, "x"),
        f(r.get("speedup_vs_ours_greedy_same_batch"), 2, "x"),
        f(r.get("tokens_per_target_call")), ident]) + " |")
  return "\n".join(lines)


def markdown_report(results: dict[str, Any]) -> str:
  cfg, m = results["config"], results["machine"]
  lines = [
      "# specdec vs Hugging Face transformers (same weights)", "",
      f"Created {results['created']}" + (f" by `{results['command']}`"
                                         if results.get("command") else "") + ".", "",
      f"- target: {cfg['target']['source']} ({cfg['target']['params'] / 1e6:.2f}M params); "
      f"drafter: {cfg['drafter']['source']} ({cfg['drafter']['params'] / 1e6:.2f}M params)",
      f"- {cfg['num_prompts']} prompts (lengths {min(cfg['prompt_lengths'])}–"
      f"{max(cfg['prompt_lengths'])}), max_new_tokens {cfg['max_new_tokens']}, gamma "
      f"{cfg['gamma']}; median of {cfg['repeats']} alternating rounds after a warm-up call",
      f"- HF assisted settings: {cfg.get('hf_assisted')}; transformers defaults: "
      f"{cfg.get('hf_default_assisted')}",
      f"- machine: jax {m['jax_version']} ({m['backend']}), torch {m.get('torch_version')} "
      f"({m.get('torch_num_threads')} threads), transformers {m.get('transformers_version')}, "
      f"{m['cpu_count']} CPUs", "",
      markdown_table(results), "",
      "ms/token = median wall time of decoding all prompts / tokens generated (EOS included). "
      "HF assisted generation supports batch 1 only; batch > 1 rows are ours alone.",
  ]
  if results.get("errors"):
    lines += ["", "Errors:", ""]
    lines += [f"- `{k}`: {v}" for k, v in results["errors"].items()]
  return "\n".join(lines) + "\n"


def write_report(results: dict[str, Any], out_dir: str) -> dict[str, str]:
  """Write hf_compare.json and hf_compare.md into `out_dir`; their paths."""
  from specdec_jax.tools.cli import to_jsonable
  os.makedirs(out_dir, exist_ok=True)
  paths = {k: os.path.join(out_dir, f"hf_compare.{k}") for k in ("json", "md")}
  for key, text in (("json", json.dumps(to_jsonable(results), indent=1) + "\n"),
                    ("md", markdown_report(results))):
    tmp = paths[key] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, paths[key])
  return paths
