"""The Hugging Face side: export, load, assisted-generation settings, call counting."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import traceback
from typing import Any, Callable, Sequence

import numpy as np


def error_text(e: BaseException) -> str:
  """"Type: message (at file:line in function)", at most 2000 characters."""
  text = f"{type(e).__name__}: {e}"
  tb = traceback.extract_tb(e.__traceback__)
  if tb:
    last = tb[-1]
    text += f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"
  return text[:2000]


@dataclasses.dataclass(frozen=True)
class HFDecoded:
  """Tokens HF generated for each prompt (cut at EOS); HF gives no statistics of ours."""

  rows: list[list[int]]
  stats = None

  def token_rows(self) -> list[list[int]]:
    return self.rows


def hf_row_tokens(seq, eos_id: int, skip: int = 1) -> list[int]:
  """Generated tokens of one HF output row: its first `skip` tokens dropped (T5's decoder
  start; a decoder-only model's prompt), cut after the first EOS."""
  seq = [int(t) for t in np.asarray(seq).reshape(-1)[skip:]]
  if eos_id in seq:
    seq = seq[:seq.index(eos_id) + 1]
  return seq


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


def _from_pretrained(class_name: str, path: str):
  """`transformers.<class_name>.from_pretrained(path)` in float32, eval mode."""
  import torch
  import transformers
  cls = getattr(transformers, class_name)
  with _quiet_transformers():
    try:
      hf = cls.from_pretrained(path, dtype=torch.float32)
    except TypeError:  # pragma: no cover - transformers < 4.56 spells it torch_dtype
      hf = cls.from_pretrained(path, torch_dtype=torch.float32)
  return hf.eval()


def load_hf_from_dir(path: str):
  """`T5ForConditionalGeneration.from_pretrained(path)` in float32, eval mode."""
  return _from_pretrained("T5ForConditionalGeneration", path)


def load_causal_lm_from_dir(path: str):
  """A decoder-only transformers dir (a Gemma 4 target or its assistant, or any causal LM)
  by `AutoModelForCausalLM`, float32, eval mode."""
  return _from_pretrained("AutoModelForCausalLM", path)


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


def assisted_settings_of(hf_drafter) -> dict[str, Any]:
  """The assisted-generation settings an HF drafter's own generation config holds (what
  its directory sets, where it sets them)."""
  gc = hf_drafter.generation_config
  return {k: getattr(gc, k, None) for k in ("num_assistant_tokens",
                                             "num_assistant_tokens_schedule",
                                             "assistant_confidence_threshold")}


def set_assisted_settings(hf_drafter, gamma: int) -> dict[str, Any]:
  """Make transformers' assistant draft exactly `gamma` tokens per round (our algorithm)."""
  gc = hf_drafter.generation_config
  gc.num_assistant_tokens = int(gamma)
  gc.num_assistant_tokens_schedule = "constant"
  gc.assistant_confidence_threshold = 0.0   # ConfidenceCriteria is only added when > 0
  return {"num_assistant_tokens": int(gamma), "num_assistant_tokens_schedule": "constant",
          "assistant_confidence_threshold": 0.0}


def load_models_from_dirs(target_dir: str, drafter_dir: str, default_assisted: bool,
                          errors: dict[str, str]) -> dict[str, Any]:
  """HF copies of a decoder-only pair from the transformers dirs ours were loaded from (and
  the drafter again as its dir configures it, for transformers' defaults); a failure is
  recorded in `errors`, not raised."""
  models: dict[str, Any] = {}
  if "hf" in errors:
    return models
  for name, path in (("target", target_dir), ("drafter", drafter_dir),
                     *((("drafter_default", drafter_dir),) if default_assisted else ())):
    try:
      models[name] = load_causal_lm_from_dir(path)
    except Exception as e:  # noqa: BLE001 - reported, not raised
      errors[f"hf_{name}_load"] = error_text(e)
  default = models.get("drafter_default")
  if default is not None and default.generation_config.num_assistant_tokens is None:
    # transformers' assisted generation fails on it (a fresh Gemma 4 assistant's default)
    del models["drafter_default"]
    errors["hf_drafter_default_load"] = (
        f"{drafter_dir}: its generation_config sets no num_assistant_tokens, and "
        "transformers' assisted generation needs it; HF assisted with the dir's own settings "
        "is not run")
  return models


def load_models(target_m, drafter_m, tmp: str, default_assisted: bool,
                errors: dict[str, str]) -> dict[str, Any]:
  """HF copies of target and drafter (and a fresh drafter for transformers' defaults);
  a failure is recorded in `errors`, not raised."""
  models: dict[str, Any] = {}
  if "hf" in errors:
    return models
  try:
    models["target"] = load_hf(target_m, os.path.join(tmp, "target"))
  except Exception as e:  # noqa: BLE001 - reported, not raised
    errors["hf_target_load"] = error_text(e)
  path = os.path.join(tmp, "drafter")
  for name in ("drafter", "drafter_default") if default_assisted else ("drafter",):
    try:
      models[name] = (load_hf(drafter_m, path) if name == "drafter"
                      else load_hf_from_dir(path))
    except Exception as e:  # noqa: BLE001
      errors[f"hf_{name}_load"] = error_text(e)
  return models


class CallCounter:
  """Counts forward calls of torch modules (decoder steps of HF generate)."""

  def __init__(self, **modules):
    self.counts = {name: 0 for name in modules}
    self._handles = [m.register_forward_hook(self._hook(name)) for name, m in modules.items()]

  def _hook(self, name):
    def hook(*_):
      self.counts[name] += 1
    return hook

  def remove(self):
    for h in self._handles:
      h.remove()


def hf_method(hf_target, rows: Sequence[np.ndarray], max_new_tokens: int, eos_id: int,
              assistant=None, pad_id: int | None = None) -> Callable[[], HFDecoded]:
  """One call: HF greedy (or assisted) generate on every prompt at batch 1. `pad_id` given:
  a decoder-only target (its output starts with the prompt; EOS and pad are ours, passed
  explicitly: a dir's generation config may list several EOS ids)."""
  import torch
  inputs = [torch.as_tensor(r[None].astype(np.int64)) for r in rows]
  decoder_only = pad_id is not None

  def run():
    out = []
    with torch.inference_mode(), _quiet_transformers():
      for ids in inputs:
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                  num_beams=1, max_new_tokens=max_new_tokens)
        if decoder_only:
          kw.update(eos_token_id=eos_id, pad_token_id=pad_id)
        if assistant is not None:
          kw["assistant_model"] = assistant
        seq = hf_target.generate(**kw)
        out.append(hf_row_tokens(seq[0].numpy(), eos_id,
                                 skip=ids.shape[1] if decoder_only else 1))
    return HFDecoded(out)
  return run


def count_target_calls(hf_target, fn: Callable[[], Any]) -> int:
  """HF target forward passes during one (extra, untimed) call of `fn`."""
  counter = CallCounter(target=hf_target)
  try:
    fn()
    return counter.counts["target"]
  finally:
    counter.remove()
