"""Sweep of bad inputs (issue 31): each must end in a clear error, never a raw exception.

    python packages/specdec-jax-lab/scripts/bad_input_sweep.py \
        --out packages/specdec-jax-lab/results/bad-inputs [--surface python|cli] [-k NAME]

A table of small cases, each a name, a surface and a call:

* python: a call of the library's API. Clean when it raises a `sd.SpecdecError` subclass
  with a message.
* cli: `specdec`'s `main([...])` (its console script's target) in this process (stdout
  and stderr captured; stdin an empty or given text), or, for the few cases that need a
  real process (the interpreter's own exit code and traceback, stdin bytes), `python -m
  specdec_jax.cli` in a subprocess. Clean when the exit code is 1 or 2, stderr's last
  line starts with "specdec" and holds "error", and no "Traceback" is printed.

A case may be "handled" instead: a documented outcome that is not an error (the case says
which and why); it is then "handled" only when the call succeeds (or fails cleanly).
Anything else is unclean: another exception type (named), a traceback, exit 0, or a
timeout (each case gets `--timeout` seconds, by SIGALRM in-process or the subprocess's).

Writes OUT/bad-inputs.json (every case: name, surface, outcome, first line of the message)
and OUT/bad-inputs.md (counts per surface and outcome, the unclean cases, every case);
exits 1 if any case is unclean. Models are tiny: config:t5_1_1_tiny, the small demo
package's demo-de-en / demo-en-lm pairs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import io
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")      # a Hub id fails at once, no network wait

ROOT = pathlib.Path(__file__).resolve().parents[3]      # the repository (configs/, tests/data)
PAIRS = ROOT / "tests" / "data" / "demo_test_pairs.jsonl"
T5 = "config:t5_1_1_tiny"
T5_DRAFTER = "config:t5_1_1_tiny_drafter"


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  surface: str                      # "python" or "cli"
  call: Any                         # python: fn(fx); cli: argv list (str or fn(fx) -> str)
  handled: str | None = None        # the documented non-error outcome, if any
  stdin: bytes | None = None        # cli: stdin text (in-process: decoded with replace)
  process: bool = False             # cli: run in a subprocess


@dataclasses.dataclass
class Result:
  name: str
  surface: str
  outcome: str                      # clean, handled, unclean
  detail: str                       # first line of the message, or what was wrong
  seconds: float


class Timeout(Exception):
  pass


class Fixtures:
  """Models, tokenizers and files the cases share, made on first use."""

  def __init__(self, tmp: pathlib.Path):
    self.tmp = tmp
    self._cache: dict[str, Any] = {}

  def _get(self, key: str, make: Callable[[], Any]) -> Any:
    if key not in self._cache:
      self._cache[key] = make()
    return self._cache[key]

  @property
  def t5(self):
    import specdec_jax as sd
    return self._get("t5", lambda: sd.load(T5))

  @property
  def t5_small_vocab(self):
    import specdec_jax as sd
    return self._get("t5v", lambda: sd.init_model(sd.get_config("t5_1_1_tiny", vocab_size=256),
                                                  0))

  @property
  def lm(self):
    import specdec_jax as sd
    return self._get("lm", lambda: sd.init_model(sd.get_config("llama_tiny", max_positions=16),
                                                 0))

  @property
  def demo(self):
    import specdec_jax as sd
    return self._get("demo", lambda: sd.load("demo-de-en/target"))

  @property
  def tok(self):
    import specdec_jax as sd
    return self._get("tok", lambda: sd.load_tokenizer("demo-de-en"))

  @property
  def lm_tok(self):
    import specdec_jax as sd
    return self._get("lm_tok", lambda: sd.load_tokenizer("demo-en-lm"))

  @property
  def mesh(self):
    import specdec_jax as sd
    return self._get("mesh", lambda: sd.make_mesh())

  @property
  def enc(self):
    import numpy as np
    return np.array([[5, 17, 42, 1], [7, 8, 1, 0]], np.int32)

  @property
  def lm_prompt(self):
    import numpy as np
    return np.array([[5, 6, 7], [8, 9, 0]], np.int32)

  def path(self, name: str) -> pathlib.Path:
    return self.tmp / name

  def file(self, name: str, data: bytes | str = b"x") -> str:
    p = self.tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(p)

  def dir(self, name: str, files: dict[str, bytes | str] | None = None) -> str:
    p = self.tmp / name
    p.mkdir(parents=True, exist_ok=True)
    for k, v in (files or {}).items():
      self.file(f"{name}/{k}", v)
    return str(p)

  def saved(self, name: str) -> pathlib.Path:
    """A directory of ours holding the tiny T5 (a fresh copy per name)."""
    import specdec_jax as sd
    p = self.tmp / name
    if not p.exists():
      sd.save(p, self.t5)
    return p

  def hf(self, name: str) -> pathlib.Path:
    from specdec_jax.io import checkpoints
    p = self.tmp / name
    if not p.exists():
      checkpoints.export_hf(p, self.t5.config, self.t5.params)
    return p


# ----------------------------------------------------------------------------- python cases


def _jnp():
  import jax.numpy as jnp
  return jnp


def _python_cases() -> list[Case]:  # noqa: C901 (a table)
  import numpy as np

  import specdec_jax as sd
  cases: list[Case] = []

  def py(name: str, fn: Callable[[Fixtures], Any], handled: str | None = None) -> None:
    cases.append(Case(name, "python", fn, handled))

  # --- sd.load
  py("load: missing path", lambda f: sd.load(str(f.path("no/such/model"))))
  py("load: a file, not a dir", lambda f: sd.load(f.file("plain.txt", "hello")))
  py("load: empty dir", lambda f: sd.load(f.dir("empty")))
  py("load: dir of text files", lambda f: sd.load(f.dir("texts", {"a.txt": "x", "b.md": "y"})))
  py("load: dir of a pickle checkpoint", lambda f: sd.load(
      f.dir("pickle", {"pytorch_model.bin": b"\x80\x04junk", "config.json": "{}"})))
  py("load: config.json not JSON", lambda f: sd.load(f.dir("hfbad", {"config.json": "{nope"})))
  py("load: config.json of BERT", lambda f: sd.load(f.dir("bert", {
      "config.json": json.dumps({"model_type": "bert", "hidden_size": 8}),
      "model.safetensors": b""})))
  py("load: config.json a list", lambda f: sd.load(f.dir("hflist", {"config.json": "[1, 2]"})))
  py("load: config.json not UTF-8", lambda f: sd.load(
      f.dir("hfutf", {"config.json": b'{"model_type": "t5\xff"}'})))

  def ours_damaged(f: Fixtures, name: str, how: str):
    p = f.saved(name)
    params, conf = p / "params.safetensors", p / "specdec_config.json"
    if how == "truncate":
      params.write_bytes(params.read_bytes()[:1000])
    elif how == "empty":
      params.write_bytes(b"")
    elif how == "missing":
      params.unlink()
    elif how == "garbage":
      params.write_bytes(b"\x00" * 64)
    elif how == "config-json":
      conf.write_text("{broken")
    elif how == "config-missing":
      conf.unlink()
    elif how == "config-field":
      d = json.loads(conf.read_text())
      d["config"]["emb_dim"] = "wide"
      conf.write_text(json.dumps(d))
    elif how == "config-shape":
      d = json.loads(conf.read_text())
      d["config"]["emb_dim"] *= 2
      conf.write_text(json.dumps(d))
    elif how == "one-tensor":
      from safetensors.numpy import save_file
      save_file({"x": np.zeros((2, 2), np.float32)}, str(params))
    elif how == "bad-dtype":
      from safetensors.numpy import load_file, save_file
      tensors = load_file(str(params))
      save_file({k: v.astype(np.int8) for k, v in tensors.items()}, str(params))
    elif how in ("nan", "inf"):        # issue 38: non-finite weights are refused at load
      from safetensors.numpy import load_file, save_file
      tensors = load_file(str(params))
      name = sorted(tensors)[len(tensors) // 2]
      tensors[name] = tensors[name].copy()
      tensors[name].reshape(-1)[0] = np.nan if how == "nan" else -np.inf
      save_file(tensors, str(params))
    elif how == "0xff-block":          # a damaged block of the payload: NaN in float32
      data = bytearray(params.read_bytes())
      data[-256:] = b"\xff" * 256
      params.write_bytes(bytes(data))
    return sd.load(str(p))

  for how in ("truncate", "empty", "missing", "garbage", "config-json", "config-missing",
              "config-field", "config-shape", "one-tensor", "bad-dtype", "nan", "inf",
              "0xff-block"):
    py(f"load: our checkpoint, {how}", lambda f, how=how: ours_damaged(f, f"ours-{how}", how))

  def hf_damaged(f: Fixtures, name: str, how: str):
    p = f.hf(name)
    weights = p / "model.safetensors"
    if how == "truncate":
      weights.write_bytes(weights.read_bytes()[:500])
    elif how == "missing":
      weights.unlink()
    elif how == "shape":
      c = json.loads((p / "config.json").read_text())
      c["d_model"] = int(c["d_model"]) * 2
      (p / "config.json").write_text(json.dumps(c))
    return sd.load(str(p))

  for how in ("truncate", "missing", "shape"):
    py(f"load: HF checkpoint, {how}", lambda f, how=how: hf_damaged(f, f"hf-{how}", how))
  py("load: T5X checkpoint, empty file", lambda f: sd.load(
      f.dir("t5x/checkpoint_10", {"checkpoint": b""}).rsplit("/", 1)[0]))
  py("load: T5X checkpoint, garbage", lambda f: sd.load(
      f.dir("t5xg/checkpoint_10", {"checkpoint": b"\x01\x02garbage"}).rsplit("/", 1)[0]))
  py("load: unknown config name", lambda _: sd.load("config:t5_9_9_nope"))
  py("load: empty config name", lambda _: sd.load("config:"))
  py("load: unknown bundled name", lambda _: sd.load("demo-de-en/nope"))
  py("load: unknown bundled group", lambda _: sd.load("demo-xx-yy/target"))
  py("load: offline Hub id", lambda _: sd.load("someone/some-model"))
  py("load: dtype int8", lambda _: sd.load(T5, dtype="int8"))
  py("load: dtype float64", lambda _: sd.load(T5, dtype="float64"))
  py("load: dtype 3", lambda _: sd.load(T5, dtype=3))
  py("load: dtype np.int32 (a dtype object)", lambda _: sd.load(T5, dtype=np.int32))
  py("load: dtype jnp.bfloat16 (a dtype object)", lambda f: sd.load(str(f.saved("ours-bf16")),
                                                                  dtype=_jnp().bfloat16),
     handled="a numpy / JAX dtype object is taken as its name (documented in sd.load)")
  py("load: check_finite 'no'", lambda _: sd.load(T5, check_finite="no"))
  py("load: kernels npu", lambda _: sd.load(T5, kernels="npu"))
  py("load: kernels None", lambda _: sd.load(T5, kernels=None))
  py("load: rules without mesh", lambda _: sd.load(T5, rules=sd.sharding.RULES_1D))
  py("load: path None", lambda _: sd.load(None))
  py("load: path 123", lambda _: sd.load(123))
  py("load: config a dict", lambda f: sd.load(str(f.saved("ours-cfg")), config={"d_model": 4}))
  py("get_config: unknown name", lambda _: sd.get_config("t5_nope"))
  py("get_config: unknown override", lambda _: sd.get_config("t5_1_1_tiny", bogus_field=3))
  py("get_config: negative d_model", lambda _: sd.get_config("t5_1_1_tiny", emb_dim=-4))
  py("get_config: zero vocab", lambda _: sd.get_config("t5_1_1_tiny", vocab_size=0))
  py("init_model: a string config", lambda _: sd.init_model("t5_1_1_tiny", 0))

  # --- encoder tokens
  def gen(f: Fixtures, enc, n=4, **kw):
    return sd.generate(f.t5, enc, n, **kw)

  py("generate: 1-D tokens", lambda f: gen(f, np.array([5, 6, 1], np.int32)))
  py("generate: 3-D tokens", lambda f: gen(f, np.ones((2, 3, 4), np.int32)))
  py("generate: float tokens", lambda f: gen(f, f.enc.astype(np.float32)))
  py("generate: bool tokens", lambda f: gen(f, f.enc.astype(bool)))
  py("generate: zero rows", lambda f: gen(f, np.zeros((0, 4), np.int32)))
  py("generate: zero columns", lambda f: gen(f, np.zeros((2, 0), np.int32)))
  py("generate: negative ids", lambda f: gen(f, np.array([[5, -3, 1]], np.int32)))
  py("generate: ids past the vocabulary", lambda f: gen(f, np.array([[5, 9999, 1]], np.int32)))
  py("generate: a string as tokens", lambda f: gen(f, "5 6 1"))
  py("generate: None as tokens", lambda f: gen(f, None))
  py("generate: ragged list", lambda f: gen(f, [[5, 6, 1], [7, 1]]))
  py("generate: list of strings", lambda f: gen(f, [["a", "b"]]))
  py("generate: all-padding row", lambda f: gen(f, np.array([[5, 1], [0, 0]], np.int32)))
  py("generate: int64 ids past int32", lambda f: gen(f, np.array([[2**40, 1]], np.int64)))
  py("generate: one id past the vocabulary in row 1", lambda f: gen(
      f, np.array([[5, 17, 42, 1], [7, 512, 1, 0]], np.int32)))
  py("LM: prompt id past the vocabulary", lambda f: sd.generate(
      f.lm, np.array([[5, 6, 7], [8, 10**6, 0]], np.int32), 2))
  py("generate: prompt past max_encoder_length", lambda f: sd.generate(
      f.t5.replace(config=f.t5.config.replace(max_encoder_length=4)),
      np.array([[5] * 8 + [1]], np.int32), 4))
  # --- max_new_tokens
  for bad in (0, -1, 1.5, "4", True, None, 10**12):
    py(f"generate: max_new_tokens {bad!r}", lambda f, bad=bad: gen(f, f.enc, bad))
  py("speculative: max_new_tokens 0", lambda f: sd.speculative_generate(
      f.t5, f.t5, f.enc, gamma=2, max_new_tokens=0))
  py("generate: max_new_tokens 2**20 + 1 (one row)", lambda f: gen(f, f.enc[:1], 2**20 + 1))
  # --- gamma
  for bad in (0, -1, 1.5, True, "2", None, 65, 100000):
    py(f"speculative: gamma {bad!r}", lambda f, bad=bad: sd.speculative_generate(
        f.t5, f.t5, f.enc, gamma=bad, max_new_tokens=4))
    py(f"Speculative(gamma={bad!r})", lambda f, bad=bad: sd.Speculative(f.t5, gamma=bad))
  # --- eos
  for bad in (9999, "1", 1.5):
    py(f"generate: eos_id {bad!r}", lambda f, bad=bad: gen(f, f.enc, eos_id=bad))
  py("generate: eos_id -2", lambda f: gen(f, f.enc, eos_id=-2),
     handled="a negative eos_id disables stopping (documented in rounds.requests.resolve_eos, "
             "T5X's eos_id=-1)")
  # --- sampling
  for kw in ({"top_p": 0.0}, {"top_p": 1.5}, {"top_p": -0.1}, {"top_p": math.nan},
             {"temperature": -1.0}, {"temperature": math.nan}, {"temperature": math.inf},
             {"temperature": "hot"}, {"top_k": -1}, {"top_k": 1.5}, {"top_k": True}):
    py(f"Sampling({kw})", lambda f, kw=kw: sd.Sampling(**kw))
  py("Sampling(top_k=0)", lambda _: sd.Sampling(top_k=0),
     handled="top_k=0 disables top-k (documented in sd.Sampling)")
  py("Sampling(top_p=1)", lambda _: sd.Sampling(top_p=1.0),
     handled="top_p=1 disables nucleus sampling (documented in sd.Sampling)")
  py("generate: sampling a string", lambda f: gen(f, f.enc, sampling="greedy"))
  py("generate: sampling a dict with a typo", lambda f: gen(f, f.enc, sampling={"temp": 1.0},
                                                              rng=0))
  py("generate: sampling dict top_p 2", lambda f: gen(f, f.enc, sampling={"top_p": 2.0}, rng=0))
  py("generate: sampling without rng", lambda f: gen(f, f.enc, sampling=sd.Sampling()))
  py("speculative: sampling without rng", lambda f: sd.speculative_generate(
      f.t5, f.t5, f.enc, gamma=2, max_new_tokens=4, sampling=sd.Sampling(top_p=0.9)))
  py("bild: sampling without rng", lambda f: sd.bild_generate(
      f.t5, f.t5, f.enc, max_new_tokens=4, sampling=sd.Sampling()))
  py("generate: rng a string", lambda f: gen(f, f.enc, sampling=sd.Sampling(), rng="seed"))
  py("generate: rng a float", lambda f: gen(f, f.enc, sampling=sd.Sampling(), rng=1.5))
  py("generate: rng of shape (3,)", lambda f: gen(
      f, f.enc, sampling=sd.Sampling(), rng=np.zeros((3,), np.uint32)))
  py("generate: rng keys per row", lambda f: gen(
      f, f.enc, sampling=sd.Sampling(), rng=np.zeros((2, 2), np.uint32)))
  py("generate: exact 'yes'", lambda f: gen(f, f.enc, exact="yes"))
  # --- the model argument
  py("decode: tokenizer as target", lambda f: sd.decode(f.tok, sd.Autoregressive(), f.enc, 4))
  py("decode: str as target", lambda f: sd.generate("demo-de-en/target", f.enc, 4))
  py("decode: None as target", lambda f: sd.generate(None, f.enc, 4))
  py("decode: params dict as target", lambda f: sd.generate(f.t5.params, f.enc, 4))
  py("decode: a string as method", lambda f: sd.decode(f.t5, "speculative", f.enc, 4))
  py("decode: the method class", lambda f: sd.decode(f.t5, sd.Autoregressive, f.enc, 4))
  py("decode: None as method", lambda f: sd.decode(f.t5, None, f.enc, 4))
  py("speculative: None as drafter", lambda f: sd.speculative_generate(
      f.t5, None, f.enc, gamma=2, max_new_tokens=4))
  py("speculative: str as drafter", lambda f: sd.speculative_generate(
      f.t5, "demo-de-en/drafter", f.enc, gamma=2, max_new_tokens=4))
  py("speculative: tokenizer as drafter", lambda f: sd.speculative_generate(
      f.t5, f.tok, f.enc, gamma=2, max_new_tokens=4))
  py("speculative: drafter of another vocabulary", lambda f: sd.speculative_generate(
      f.t5, f.t5_small_vocab, f.enc, gamma=2, max_new_tokens=4))
  py("speculative: LM drafter for a T5 target", lambda f: sd.speculative_generate(
      f.t5, f.lm, f.enc, gamma=2, max_new_tokens=4))
  py("speculative: T5 drafter for an LM target", lambda f: sd.speculative_generate(
      f.lm, f.t5, f.lm_prompt, gamma=2, max_new_tokens=4))
  py("speculative: drafter_inputs of another batch", lambda f: sd.speculative_generate(
      f.t5, f.t5, f.enc, gamma=2, max_new_tokens=4, drafter_inputs=f.enc[:1]))
  py("speculative: lenience -1", lambda f: sd.speculative_generate(
      f.t5, f.t5, f.enc, gamma=2, max_new_tokens=4, lenience=-1.0))
  py("speculative: lenience nan", lambda f: sd.Speculative(f.t5, lenience=math.nan))
  py("speculative: lenience 2", lambda f: sd.Speculative(f.t5, lenience=2.0))
  py("speculative: adaptive 'yes'", lambda f: sd.Speculative(f.t5, adaptive="yes"))
  py("AdaptiveGamma(c=-1)", lambda _: sd.AdaptiveGamma(c=-1.0))
  py("AdaptiveGamma(decay=2)", lambda _: sd.AdaptiveGamma(decay=2.0))
  py("AdaptiveGamma(initial_alpha=1.5)", lambda _: sd.AdaptiveGamma(initial_alpha=1.5))
  py("Autoregressive(exact='yes')", lambda _: sd.Autoregressive(exact="yes"))
  # --- decoder-only lengths
  py("LM: prompt past the positions", lambda f: sd.generate(
      f.lm, np.full((1, 20), 5, np.int32), 2))
  py("LM: prompt + new tokens past the positions", lambda f: sd.generate(
      f.lm, np.full((1, 10), 5, np.int32), 7))
  py("LM: prompt_lengths of another batch", lambda f: sd.generate(
      f.lm, f.lm_prompt, 4, prompt_lengths=np.array([3], np.int32)))
  py("LM: prompt_lengths past the buffer", lambda f: sd.generate(
      f.lm, f.lm_prompt, 4, prompt_lengths=np.array([3, 9], np.int32)))
  py("LM: prompt_lengths 0", lambda f: sd.generate(
      f.lm, f.lm_prompt, 4, prompt_lengths=np.array([3, 0], np.int32)))
  py("LM: prompt_lengths negative", lambda f: sd.generate(
      f.lm, f.lm_prompt, 4, prompt_lengths=np.array([3, -1], np.int32)))
  py("LM: prompt_lengths floats", lambda f: sd.generate(
      f.lm, f.lm_prompt, 4, prompt_lengths=np.array([3.0, 2.0])))
  py("T5: prompt_lengths given", lambda f: gen(f, f.enc, prompt_lengths=np.array([4, 3])))
  # --- BiLD
  for kw in ({"fallback_threshold": -0.1}, {"fallback_threshold": 1.5},
             {"fallback_threshold": math.nan}, {"rollback_threshold": 0.0},
             {"rollback_threshold": -1.0}, {"max_small_steps": 0}, {"max_small_steps": -1},
             {"max_small_steps": 1.5}, {"max_small_steps": 65}, {"batch_policy": "bogus"}):
    py(f"BiLD({kw})", lambda f, kw=kw: sd.BiLD(f.t5, **kw))
    py(f"bild_generate({kw})", lambda f, kw=kw: sd.bild_generate(
        f.t5, f.t5, f.enc, max_new_tokens=4, **kw))
  py("bild: None as small", lambda f: sd.bild_generate(f.t5, None, f.enc, max_new_tokens=4))
  py("bild: tokenizer as small", lambda f: sd.bild_generate(f.t5, f.tok, f.enc,
                                                            max_new_tokens=4))
  py("bild: small of another vocabulary", lambda f: sd.bild_generate(
      f.t5, f.t5_small_vocab, f.enc, max_new_tokens=4))
  py("early_exit: layer 0", lambda f: sd.early_exit(f.t5, 0))
  py("early_exit: layer 99", lambda f: sd.early_exit(f.t5, 99))
  py("early_exit: layer 1.5", lambda f: sd.early_exit(f.t5, 1.5))
  # --- Blockwise
  py("blockwise: None as heads", lambda f: sd.blockwise_generate(f.t5, None, f.enc,
                                                                 max_new_tokens=4))
  py("blockwise: a model as heads", lambda f: sd.blockwise_generate(f.t5, f.t5, f.enc,
                                                                    max_new_tokens=4))
  py("blockwise: heads of another model", lambda f: sd.blockwise_generate(
      f.t5, sd.init_heads(f.t5_small_vocab, 3), f.enc, max_new_tokens=4))
  for kw in ({"top_k": 0}, {"top_k": -1}, {"top_k": 65}, {"num_drafts": 0},
             {"num_drafts": 65}, {"rescoring": "bogus"},
             {"rescoring": "ngram"}, {"rescoring_weight": math.nan}, {"oracle": "yes"}):
    py(f"Blockwise({kw})", lambda f, kw=kw: sd.blockwise_generate(
        f.t5, sd.init_heads(f.t5, 3), f.enc, max_new_tokens=4, **kw))
  py("init_heads: 0 heads", lambda f: sd.init_heads(f.t5, 0))
  py("init_heads: 1.5 heads", lambda f: sd.init_heads(f.t5, 1.5))
  py("load_heads: missing file", lambda f: sd.load_heads(str(f.path("no.safetensors")), f.t5))
  py("load_heads: garbage file", lambda f: sd.load_heads(f.file("h.safetensors", b"\x00" * 40),
                                                         f.t5))
  # --- Beam
  for kw in ({"num_beams": 0}, {"num_beams": -1}, {"num_beams": 1.5}, {"num_beams": True},
             {"num_beams": 129},
             {"alpha": math.nan}, {"alpha": "x"}, {"min_log_prob": "x"}, {"exact": "yes"}):
    py(f"Beam({kw})", lambda _, kw=kw: sd.Beam(**kw))
  py("Beam with sampling", lambda f: sd.decode(f.t5, sd.Beam(2), f.enc, 4,
                                               sampling=sd.Sampling(), rng=0))
  py("Beam on too-long prompt", lambda f: sd.decode(
      f.lm, sd.Beam(2), np.full((1, 20), 5, np.int32), 2))
  # --- the T5X drop-in (sd.t5x_compat): a cache smaller than the decode
  def t5x_small_cache(f: Fixtures, fn: str):
    import jax.numpy as jnp
    cache = f.t5.start(jnp.asarray(f.enc), capacity=6)
    return getattr(sd.t5x_compat, fn)(jnp.zeros((2, 10), jnp.int32), cache,
                                      sd.t5x_compat.tokens_to_logits_for(f.t5), eos_id=1)

  for fn in ("temperature_sample", "beam_search"):
    py(f"t5x_compat.{fn}: cache smaller than the decode",
       lambda f, fn=fn: t5x_small_cache(f, fn))
  # --- drafters
  py("NGramDrafter.fit: vocab 0", lambda _: sd.NGramDrafter.fit([[5, 6, 7]], vocab_size=0))
  py("NGramDrafter.fit: ids past vocab", lambda _: sd.NGramDrafter.fit([[5, 600]],
                                                                        vocab_size=512))
  py("NGramDrafter.fit: top_k 0", lambda _: sd.NGramDrafter.fit([[5, 6]], 512, top_k=0))
  py("PromptLookupDrafter(ngram=0)", lambda _: sd.PromptLookupDrafter(0))
  # --- tokenizers
  py("load_tokenizer: missing path", lambda f: sd.load_tokenizer(str(f.path("no/spiece.model"))))
  py("load_tokenizer: garbage .model", lambda f: sd.load_tokenizer(f.file("x.model", b"\x00" * 9)))
  py("load_tokenizer: empty dir", lambda f: sd.load_tokenizer(f.dir("tok-empty")))
  py("load_tokenizer: tokenizer.json not JSON", lambda f: sd.load_tokenizer(
      f.dir("tok-json", {"tokenizer.json": "{nope"})))
  py("load_tokenizer: None", lambda _: sd.load_tokenizer(None))
  py("load_tokenizer: 123", lambda _: sd.load_tokenizer(123))
  py("load_tokenizer: unknown bundled", lambda _: sd.load_tokenizer("demo-xx-yy"))
  py("load_tokenizer: a model dir without one", lambda f: sd.load_tokenizer(
      str(f.saved("ours-notok"))))
  for label, tok in (("spm", "tok"), ("hf", "lm_tok")):
    py(f"encode[{label}]: lone surrogate", lambda f, t=tok: getattr(f, t).encode(["a\udcffb"]))
    py(f"encode[{label}]: None", lambda f, t=tok: getattr(f, t).encode(None))
    py(f"encode[{label}]: list of ints", lambda f, t=tok: getattr(f, t).encode([1, 2]))
    py(f"encode[{label}]: bytes", lambda f, t=tok: getattr(f, t).encode([b"abc"]))
    py(f"encode[{label}]: a bare string", lambda f, t=tok: getattr(f, t).encode("abc"))
    py(f"encode[{label}]: max_length 0", lambda f, t=tok: getattr(f, t).encode(["a b"],
                                                                               max_length=0))
    py(f"encode[{label}]: max_length -1", lambda f, t=tok: getattr(f, t).encode(["a b"],
                                                                                max_length=-1))
    py(f"encode_one[{label}]: None", lambda f, t=tok: getattr(f, t).encode_one(None))
    py(f"decode[{label}]: id past the vocabulary",
       lambda f, t=tok: getattr(f, t).decode(np.array([[5, 99999]])))
    py(f"decode[{label}]: negative id", lambda f, t=tok: getattr(f, t).decode(np.array([[5, -4]])))
    py(f"decode[{label}]: float ids", lambda f, t=tok: getattr(f, t).decode(np.array([[5.5]])))
    py(f"decode[{label}]: strings", lambda f, t=tok: getattr(f, t).decode([["a", "b"]]))
    py(f"decode[{label}]: 3-D ids", lambda f, t=tok: getattr(f, t).decode(np.ones((2, 2, 2),
                                                                                 np.int32)))
    py(f"decode[{label}]: None", lambda f, t=tok: getattr(f, t).decode(None))
    py(f"decode_one[{label}]: id past the vocabulary",
       lambda f, t=tok: getattr(f, t).decode_one([5, 99999]))
  py("encode_prompts[spm]: T5 tokenizer for LM prompts",
     lambda f: f.tok.encode_prompts(["hello"]),
     handled="encode_prompts is any tokenizer's: ids with BOS if it has one, no EOS "
             "(documented); the model's check_tokenizer judges the pairing")
  py("encode_prompts[hf]: empty list", lambda f: f.lm_tok.encode_prompts([]),
     handled="an empty batch gives [0, P] arrays; sd.decode then refuses zero rows")
  # --- save
  py("save: path None", lambda f: sd.save(None, f.t5))
  py("save: path 123", lambda f: sd.save(123, f.t5))
  py("save: model a dict", lambda f: sd.save(str(f.path("s-dict")), {"a": 1}))
  py("save: swapped arguments", lambda f: sd.save(f.t5, str(f.path("s-swap"))))
  py("save: path is a file", lambda f: sd.save(f.file("s-file"), f.t5))
  py("save: path under a file", lambda f: sd.save(f.file("s-under") + "/m", f.t5))
  py("save: over a Hugging Face dir", lambda f: sd.save(f.hf("s-hf"), f.t5))
  py("save: over a T5X dir", lambda f: sd.save(f.dir("s-t5x", {"checkpoint": b""}), f.t5))
  py("save: dtype int8", lambda f: sd.save(str(f.path("s-int8")), f.t5, dtype="int8"))
  py("save: into /proc", lambda f: sd.save("/proc/specdec-model", f.t5))
  py("save: over another model of ours", lambda f: sd.save(f.saved("s-other"), f.lm),
     handled="documented in sd.save: a dir written by sd.save is overwritten, its "
             "tokenizer files dropped")
  # --- shard / make_mesh
  for kw in ({"data": 0}, {"data": -1}, {"data": 3}, {"data": 1.5}, {"data": "2"},
             {"model": 0}, {"devices": []}):
    py(f"make_mesh({kw})", lambda _, kw=kw: sd.make_mesh(**kw))
  py("shard: mesh a string", lambda f: sd.shard(f.t5, "data=2"))
  py("shard: mesh None", lambda f: sd.shard(f.t5, None))
  py("shard: model a string", lambda f: sd.shard("config:t5_1_1_tiny", f.mesh))
  py("shard: rules a string", lambda f: sd.shard(f.t5, f.mesh, rules="1d"))
  py("shard: rule to an unknown mesh axis", lambda f: sd.shard(
      f.t5, f.mesh, rules=[("embed", "nope_axis")]))
  py("shard: rule not a pair", lambda f: sd.shard(f.t5, f.mesh, rules=[("embed",)]))
  py("shard: strict with missing rules", lambda f: sd.shard(f.t5, f.mesh, rules=[],
                                                            strict=True))
  py("load: mesh and bad rules", lambda f: sd.load(T5, mesh=f.mesh, rules=[("embed", "zz")]))
  py("load: mesh a string", lambda _: sd.load(T5, mesh="data=1"))
  py("shard_batch: mesh None", lambda f: sd.sharding.shard_batch(f.enc, None))
  return cases


# ----------------------------------------------------------------------------- cli cases


def _cli_cases() -> list[Case]:
  cases: list[Case] = []

  def cli(name: str, *argv: Any, handled: str | None = None, stdin: bytes | None = None,
          process: bool = False) -> None:
    cases.append(Case(name, "cli", list(argv), handled, stdin, process))

  dec = ["decode", "--model", T5, "--max-new-tokens", "2", "--no-warmup"]
  # --- top level
  cli("no command")
  cli("unknown command", "decodee")
  # --- decode
  cli("decode: no --model", "decode", "5 1")
  cli("decode: missing model dir", "decode", "--model", lambda f: str(f.path("nope")), "5 1")
  cli("decode: model a file", "decode", "--model", lambda f: f.file("m.txt"), "5 1")
  cli("decode: unknown config", "decode", "--model", "config:nope", "5 1")
  cli("decode: unknown bundled", "decode", "--model", "demo-de-en/nope", "5 1")
  cli("decode: unknown flag", *dec, "--gama", "2", "5 1")
  cli("decode: --method typo", *dec, "--method", "speculativ", "5 1")
  for flag, vals in (("--gamma", ("0", "-1", "1.5", "abc")),
                     ("--max-new-tokens", ("0", "-5", "abc", "1000000000000")),
                     ("--temperature", ("-1", "nan", "abc")), ("--top-p", ("0", "1.5")),
                     ("--top-k", ("-1", "2.5")), ("--batch-size", ("0", "-2")),
                     ("--seed", ("abc",)), ("--dtype", ("int8",)),
                     ("--mesh", ("bogus", "data=0", "data=4", "data=1,model=1,x=2")),
                     ("--num-beams", ("0",)), ("--lenience", ("2", "-1")),
                     ("--fallback-threshold", ("2",)), ("--rollback-threshold", ("-1",)),
                     ("--max-small-steps", ("0",)), ("--lattice-k", ("0",)),
                     ("--num-drafts", ("0",)), ("--rescoring", ("bogus",)),
                     ("--batch-policy", ("bogus",))):
    for v in vals:
      extra = ["--drafter", T5_DRAFTER] if flag in ("--gamma", "--lenience") else []
      extra += {"--num-beams": ["--method", "beam"],
                "--fallback-threshold": ["--method", "bild", "--drafter", T5_DRAFTER],
                "--rollback-threshold": ["--method", "bild", "--drafter", T5_DRAFTER],
                "--max-small-steps": ["--method", "bild", "--drafter", T5_DRAFTER]}.get(flag, [])
      cli(f"decode: {flag} {v}", *dec, *extra, flag, v, "5 1")
  cli("decode: missing --drafter", *dec, "--drafter", lambda f: str(f.path("nodraft")), "5 1")
  cli("decode: unknown drafter name", *dec, "--drafter", "bogus-drafter", "5 1")
  cli("decode: drafter of another vocabulary", *dec, "--drafter", "demo-de-en/drafter", "5 1")
  cli("decode: bild without a drafter", *dec, "--method", "bild", "5 1")
  cli("decode: speculative without a drafter", *dec, "--method", "speculative", "5 1")
  cli("decode: blockwise without heads", *dec, "--method", "blockwise", "5 1")
  cli("decode: missing --heads", *dec, "--method", "blockwise", "--heads",
      lambda f: str(f.path("no.heads")), "5 1")
  cli("decode: autoregressive with a drafter", *dec, "--method", "autoregressive", "--drafter",
      T5_DRAFTER, "5 1")
  cli("decode: greedy with --temperature", *dec, "--sampling", "greedy", "--temperature", "0.5",
      "5 1")
  cli("decode: --compare without a drafter", *dec, "--compare", "5 1",
      handled="the target alone has nothing to compare with: no comparison is printed "
              "(tests/test_cli.py::test_compare_times_the_baseline_on_the_same_inputs)")
  cli("decode: --adaptive-gamma without a drafter", *dec, "--adaptive-gamma", "5 1")
  cli("decode: --resume without --output", *dec, "--resume", "5 1")
  cli("decode: missing --input-file", *dec, "--input-file", lambda f: str(f.path("none.txt")))
  cli("decode: --input-file a dir", *dec, "--input-file", lambda f: f.dir("indir"))
  cli("decode: --input-file not UTF-8", *dec, "--input-file",
      lambda f: f.file("latin1.txt", b"5 \xff 1\n"))
  cli("decode: --input-file empty", *dec, "--input-file", lambda f: f.file("empty.txt", b""))
  cli("decode: --input-file blank lines", *dec, "--input-file",
      lambda f: f.file("blank.txt", b"\n\n  \n"))
  cli("decode: prompts and --input-file", *dec, "--input-file",
      lambda f: f.file("ids.txt", "5 1\n"), "5 1")
  cli("decode: text without a tokenizer", *dec, "hello world")
  cli("decode: id past the vocabulary", *dec, "5 99999 1")
  cli("decode: negative id", *dec, "5 -3 1")
  cli("decode: empty prompt", *dec, "")
  cli("decode: only EOS", *dec, "1")
  cli("decode: missing --tokenizer", *dec, "--tokenizer", lambda f: str(f.path("no.model")),
      "hi")
  cli("decode: garbage --tokenizer", *dec, "--tokenizer", lambda f: f.file("g.model", b"\x00\x01"),
      "hi")
  cli("decode: LM tokenizer on the T5 pair", "decode", "--model", "demo-de-en/target",
      "--tokenizer", "demo-en-lm", "--no-warmup", "Hallo")
  cli("decode: prompt past the LM's positions", "decode", "--model", "demo-en-lm/target",
      "--tokenizer", "demo-en-lm", "--no-warmup", " ".join(["the cat sat on the mat"] * 27))
  cli("decode: T5 drafter for the LM", "decode", "--model", "demo-en-lm/target", "--drafter",
      "demo-de-en/drafter", "--tokenizer", "demo-en-lm", "--no-warmup", "the cat")
  cli("decode: --output under a file", *dec, "--output",
      lambda f: f.file("out-file") + "/o.txt", "5 1")
  cli("decode: --output a dir", *dec, "--output", lambda f: f.dir("out-dir"), "5 1")
  cli("decode: --coordinator-timeout -1", *dec, "--coordinator-timeout", "-1", "5 1",
      handled="the timeouts bound a multi-process decode's waits (documented in --help); one "
              "process has none to bound, and the value is checked where they apply")
  cli("decode: --num-processes 0", *dec, "--num-processes", "0", "5 1")
  cli("decode: --process-id past --num-processes", *dec, "--num-processes", "2",
      "--process-id", "5", "--coordinator", "127.0.0.1:1", "5 1")
  cli("decode: --coordinator not host:port", *dec, "--coordinator", "nohost", "--num-processes",
      "2", "--process-id", "0", "5 1")
  cli("decode: stdin empty", *dec, "-", stdin=b"")
  cli("decode: stdin not UTF-8", *dec, "-", stdin=b"5 \xfe 1\n", process=True)
  cli("decode: missing model (process)", "decode", "--model", "/nonexistent/specdec-model",
      "5 1", process=True)
  cli("decode: --gamma 0 (process)", *dec, "--drafter", T5_DRAFTER, "--gamma", "0", "5 1",
      process=True)
  cli("decode: unknown flag (process)", "decode", "--bogus", process=True)
  cli("no command (process)", process=True)
  # --- eval
  ev = ["eval", "--model", "demo-de-en/target", "--no-warmup"]
  cli("eval: no --data", *ev)
  cli("eval: missing --data", *ev, "--data", lambda f: str(f.path("none.jsonl")))
  cli("eval: empty .jsonl", *ev, "--data", lambda f: f.file("e.jsonl", b""))
  cli("eval: .jsonl not UTF-8", *ev, "--data", lambda f: f.file("l1.jsonl",
                                                                 b'{"de": "\xdf", "en": "x"}\n'))
  cli("eval: .jsonl not JSON", *ev, "--data", lambda f: f.file("nj.jsonl", "{nope\n"))
  cli("eval: .jsonl without de/en", *ev, "--data", lambda f: f.file("nk.jsonl",
                                                                     '{"a": "b"}\n'))
  cli("eval: .jsonl of lists", *ev, "--data", lambda f: f.file("ls.jsonl", "[1, 2]\n"))
  cli("eval: empty data dir", *ev, "--data", lambda f: f.dir("edata"))
  cli("eval: --split bogus", *ev, "--data", str(PAIRS), "--split", "bogus")
  cli("eval: --limit 0", *ev, "--data", str(PAIRS), "--limit", "0")
  cli("eval: --limit -1", *ev, "--data", str(PAIRS), "--limit", "-1")
  cli("eval: --batch-size 0", *ev, "--data", str(PAIRS), "--batch-size", "0")
  cli("eval: --max-length 0", *ev, "--data", str(PAIRS), "--max-length", "0")
  cli("eval: --max-new-tokens 0", *ev, "--data", str(PAIRS), "--max-new-tokens", "0")
  cli("eval: --metric bogus", *ev, "--data", str(PAIRS), "--metric", "bogus")
  cli("eval: perplexity of a T5 model", *ev, "--data", str(PAIRS), "--metric", "perplexity")
  cli("eval: --gamma 0", *ev, "--data", str(PAIRS), "--drafter", "demo-de-en/drafter",
      "--gamma", "0")
  cli("eval: --top-p 2", *ev, "--data", str(PAIRS), "--top-p", "2")
  cli("eval: missing --model", "eval", "--model", "/nonexistent/m", "--data", str(PAIRS))
  cli("eval: LM tokenizer on the T5 pair", *ev, "--data", str(PAIRS), "--tokenizer",
      "demo-en-lm", "--limit", "2")
  cli("eval: perplexity on a non-UTF-8 text", "eval", "--metric", "perplexity", "--model",
      "demo-en-lm/target", "--tokenizer", "demo-en-lm", "--data",
      lambda f: f.file("ppl.txt", b"the \xff cat\n"))
  cli("eval: perplexity on an empty text", "eval", "--metric", "perplexity", "--model",
      "demo-en-lm/target", "--tokenizer", "demo-en-lm", "--data",
      lambda f: f.file("ppl-empty.txt", b""))
  # --- bench
  bench = ["bench", "--target", T5, "--drafter", T5_DRAFTER, "--batch-sizes", "1", "--gammas",
           "1", "--repeats", "1", "--max-new-tokens", "2", "--prompt-len", "4", "--timing-steps",
           "1", "--modes", "greedy", "--no-progress", "--out", lambda f: str(f.path("bench-out"))]
  for flag, v in (("--gammas", "0"), ("--gammas", "a,b"), ("--gammas", ""),
                  ("--batch-sizes", "0"), ("--batch-sizes", "-1"), ("--modes", "bogus"),
                  ("--prompt-len", "0"), ("--repeats", "0"), ("--max-new-tokens", "0"),
                  ("--timing-steps", "0"), ("--bild", "bogus"), ("--bild", "2:-1"),
                  ("--beam", "x"), ("--beam", "0:0.6"), ("--heads-lattice", "x"),
                  ("--target-overrides", "bogus"), ("--target-overrides", "d_model=abc"),
                  ("--target-overrides", "nope=3"), ("--drafter-overrides", "vocab_size=7"),
                  ("--preset", "bogus"), ("--exact", "bogus"), ("--compile-workers", "0"),
                  ("--dtype", "int8"), ("--mesh", "data=0")):
    cli(f"bench: {flag} {v!r}", *bench, flag, v)
  cli("bench: missing --target", "bench", "--target", "/nonexistent/t", "--no-progress")
  cli("bench: missing --prompts-file", *bench, "--prompts-file",
      lambda f: str(f.path("none-prompts.txt")))
  cli("bench: --prompts-file not UTF-8", *bench, "--prompts-file",
      lambda f: f.file("bp.txt", b"\xff\xfe\n"))
  cli("bench: --out under a file", *bench, "--out", lambda f: f.file("bench-file") + "/b")
  cli("bench: --heads missing", *bench, "--heads", lambda f: str(f.path("none.heads")))
  # --- convert
  cli("convert: no arguments", "convert")
  cli("convert: missing SRC", "convert", lambda f: str(f.path("no-src")),
      lambda f: str(f.path("c-dst1")))
  cli("convert: unknown config", "convert", "config:nope", lambda f: str(f.path("c-dst2")))
  cli("convert: DST a file", "convert", T5, lambda f: f.file("c-file"))
  cli("convert: DST not empty", "convert", T5, lambda f: f.dir("c-full", {"x": "y"}))
  cli("convert: DST under a file", "convert", T5, lambda f: f.file("c-under") + "/d")
  cli("convert: --dtype int8", "convert", T5, lambda f: str(f.path("c-dst3")), "--dtype", "int8")
  cli("convert: --to bogus", "convert", T5, lambda f: str(f.path("c-dst4")), "--to", "bogus")
  cli("convert: damaged SRC", "convert", lambda f: f.dir("c-bad", {"config.json": "{x"}),
      lambda f: str(f.path("c-dst5")))
  cli("convert: SRC is DST", "convert", lambda f: str(f.saved("c-same")),
      lambda f: str(f.saved("c-same")), "--force")
  cli("convert: --force over T5X", "convert", T5, lambda f: f.dir("c-t5x", {"checkpoint": b""}),
      "--force")
  # --- plan
  plan = ["plan", "--target", T5]
  cli("plan: no --target", "plan")
  cli("plan: missing --target", "plan", "--target", "/nonexistent/t")
  cli("plan: unknown config", "plan", "--target", "config:nope")
  cli("plan: --target a garbage JSON", "plan", "--target", lambda f: f.file("p.json", "{x"))
  for flag, v in (("--batch", "0"), ("--batch", "-1"), ("--max-input-len", "0"),
                  ("--max-new-tokens", "-1"), ("--gamma", "0"), ("--mesh", "bogus"),
                  ("--mesh", "data=0"), ("--rules", "3d"), ("--device-memory", "bogus"),
                  ("--device-memory", "-5GiB"), ("--headroom", "1.5"), ("--headroom", "-1"),
                  ("--dtype", "int8")):
    cli(f"plan: {flag} {v}", *plan, flag, v)
  cli("plan: missing --drafter", *plan, "--drafter", "/nonexistent/d")
  # --- train
  cli("train: no --recipe", "train", "--workdir", lambda f: str(f.path("w0")))
  cli("train: missing --recipe", "train", "--recipe", lambda f: str(f.path("none.json")),
      "--workdir", lambda f: str(f.path("w1")))
  cli("train: recipe not JSON", "train", "--recipe", lambda f: f.file("r.json", "{x"),
      "--workdir", lambda f: str(f.path("w2")))
  cli("train: recipe empty", "train", "--recipe", lambda f: f.file("re.json", b""),
      "--workdir", lambda f: str(f.path("w3")))
  cli("train: recipe a list", "train", "--recipe", lambda f: f.file("rl.json", "[1]"),
      "--workdir", lambda f: str(f.path("w4")))
  cli("train: recipe not UTF-8", "train", "--recipe", lambda f: f.file("ru.json", b'{"\xff": 1}'),
      "--workdir", lambda f: str(f.path("w5")))
  cli("train: --stages bogus", "train", "--recipe", str(ROOT / "configs/demo/train.json"),
      "--workdir", lambda f: str(f.path("w6")), "--stages", "bogus")
  cli("train: --heads 0", "train", "--recipe", str(ROOT / "configs/demo/train.json"),
      "--workdir", lambda f: str(f.path("w7")), "--stages", "heads", "--heads", "0")
  cli("train: --workdir under a file", "train", "--recipe",
      str(ROOT / "configs/demo/train.json"), "--workdir", lambda f: f.file("wf") + "/w",
      "--stages", "data")
  cli("train: recipe a dir", "train", "--recipe", lambda f: f.dir("rdir"), "--workdir",
      lambda f: str(f.path("w8")))
  # --- sweeps
  sb = ["sweep-bild", "--data", str(PAIRS), "--limit", "2", "--no-progress", "--out",
        lambda f: str(f.path("sb-out"))]
  cli("sweep-bild: no --data", "sweep-bild", "--small", "a=demo-de-en/drafter")
  cli("sweep-bild: missing --data", "sweep-bild", "--data", lambda f: str(f.path("none.jsonl")),
      "--small", "a=demo-de-en/drafter")
  cli("sweep-bild: --small without =", *sb, "--small", "demo-de-en/drafter")
  cli("sweep-bild: --small missing path", *sb, "--small", lambda f: f"a={f.path('nosmall')}")
  for flag, v in (("--fallback", "2"), ("--fallback", "abc"), ("--rollback", "-1"),
                  ("--gammas", "0"), ("--top-p", "2"), ("--batch-policies", "bogus"),
                  ("--early-exit", "bogus"), ("--early-exit", "demo-de-en/target:0"),
                  ("--limit", "0"), ("--batch-size", "0"), ("--repeats", "0"),
                  ("--exact", "bogus"), ("--split", "bogus")):
    cli(f"sweep-bild: {flag} {v}", *sb, "--small", "a=demo-de-en/drafter", flag, v)
  cli("sweep-bild: --out under a file", "sweep-bild", "--data", str(PAIRS), "--small",
      "a=demo-de-en/drafter", "--out", lambda f: f.file("sb-file") + "/o")
  cli("sweep-bild: LM without --tokenizer", "sweep-bild", "--model", "demo-en-lm/target",
      "--data", lambda f: f.file("lm.txt", "the cat sat on the mat\n"), "--small",
      "a=demo-en-lm/drafter", "--no-progress", "--out", lambda f: str(f.path("sb-lm")))
  cli("sweep-bild: LM --prompt-len 0", "sweep-bild", "--model", "demo-en-lm/target",
      "--tokenizer", "demo-en-lm", "--data", lambda f: f.file("lm2.txt", "the cat sat\n"),
      "--small", "a=demo-en-lm/drafter", "--prompt-len", "0", "--no-progress", "--out",
      lambda f: str(f.path("sb-lm2")))
  cli("sweep-bild: T5 small for the LM", "sweep-bild", "--model", "demo-en-lm/target",
      "--tokenizer", "demo-en-lm", "--data", lambda f: f.file("lm3.txt", "the cat sat\n"),
      "--small", "a=demo-de-en/drafter", "--no-progress", "--out",
      lambda f: str(f.path("sb-lm3")))
  sw = ["sweep-blockwise", "--data", str(PAIRS), "--limit", "2", "--no-progress", "--out",
        lambda f: str(f.path("sw-out"))]
  cli("sweep-blockwise: missing --data", "sweep-blockwise", "--data",
      lambda f: str(f.path("none2.jsonl")))
  cli("sweep-blockwise: missing --heads", *sw, "--heads", lambda f: str(f.path("no-heads")))
  cli("sweep-blockwise: garbage --heads", *sw, "--heads",
      lambda f: f.file("gh.safetensors", b"\x00" * 16))
  cli("sweep-blockwise: missing --rescorer", *sw, "--rescorer",
      lambda f: str(f.path("no-rescorer")))
  for flag, v in (("--lattice-k", "0"), ("--num-drafts", "0"), ("--rescoring-weight", "nan"),
                  ("--limit", "-1"), ("--batch-size", "0")):
    cli(f"sweep-blockwise: {flag} {v}", *sw, flag, v)
  cli("sweep-blockwise: --data not UTF-8", "sweep-blockwise", "--data",
      lambda f: f.file("sw.jsonl", b'{"de": "\xdf", "en": "x"}\n'), "--no-progress", "--out",
      lambda f: str(f.path("sw-utf")))
  return cases


# ----------------------------------------------------------------------------- running


@contextlib.contextmanager
def alarm(seconds: int):
  def ring(signum, frame):
    raise Timeout(f"no result after {seconds} s")
  old = signal.signal(signal.SIGALRM, ring)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def first_line(text: str) -> str:
  text = text.strip()
  return text.splitlines()[0][:300] if text else ""


def run_python(case: Case, fx: Fixtures, timeout: int) -> tuple[str, str]:
  from specdec_jax.errors import SpecdecError
  try:
    with alarm(timeout):
      result = case.call(fx)
      # a lazily computed result (a jax array) must be finished inside the alarm
      tokens = getattr(result, "tokens", None)
      if tokens is not None and hasattr(tokens, "block_until_ready"):
        tokens.block_until_ready()
  except Timeout as e:
    return "unclean", f"timeout: {e}"
  except SpecdecError as e:
    msg = first_line(str(e))
    return ("clean", f"{type(e).__name__}: {msg}") if msg else ("unclean", "empty message")
  except Exception as e:  # noqa: BLE001 (what the sweep is looking for)
    return "unclean", f"{type(e).__name__}: {first_line(str(e))}"
  if case.handled:
    return "handled", case.handled
  return "unclean", f"no error: returned {type(result).__name__}"


def classify_cli(code: int | None, out: str, err: str, case: Case) -> tuple[str, str]:
  lines = err.strip().splitlines()
  last = lines[-1] if lines else ""
  if "Traceback" in err:
    return "unclean", f"traceback (exit {code}): {last[:300]}"
  if code in (1, 2) and last.startswith("specdec") and "error" in last:
    return "clean", f"exit {code}: {last[:300]}"
  if code == 0 and case.handled:
    return "handled", case.handled
  return "unclean", f"exit {code}: {last[:300] or first_line(out) or '(no output)'}"


def resolve(argv: list, fx: Fixtures) -> list[str]:
  return [str(a(fx)) if callable(a) else str(a) for a in argv]


def run_cli(case: Case, fx: Fixtures, timeout: int) -> tuple[str, str]:
  argv = resolve(case.call, fx)
  if case.process:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
      p = subprocess.run([sys.executable, "-m", "specdec_jax.cli", *argv],
                         input=case.stdin or b"", capture_output=True, timeout=timeout,
                         env=env, cwd=fx.tmp)
    except subprocess.TimeoutExpired:
      return "unclean", f"timeout: no result after {timeout} s"
    return classify_cli(p.returncode, p.stdout.decode(errors="replace"),
                        p.stderr.decode(errors="replace"), case)
  (script,) = importlib.metadata.entry_points(group="console_scripts", name="specdec")
  main = script.load()   # the command as installed: the lab imports no module of the CLI
  out, err = io.StringIO(), io.StringIO()
  stdin = io.StringIO((case.stdin or b"").decode(errors="replace"))
  old_stdin = sys.stdin
  code: int | None = None
  try:
    sys.stdin = stdin
    with alarm(timeout), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        code = main(argv)
      except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
  except Timeout as e:
    return "unclean", f"timeout: {e}"
  except Exception as e:  # noqa: BLE001
    return "unclean", f"raised {type(e).__name__}: {first_line(str(e))}"
  finally:
    sys.stdin = old_stdin
  return classify_cli(code, out.getvalue(), err.getvalue(), case)


def all_cases() -> list[Case]:
  cases = _python_cases() + _cli_cases()
  names = [c.name for c in cases]
  dupes = sorted({n for n in names if names.count(n) > 1})
  if dupes:
    raise SystemExit(f"duplicate case names: {dupes}")
  return cases


def sweep(cases: list[Case], timeout: int, progress: bool = True) -> list[Result]:
  results = []
  with tempfile.TemporaryDirectory(prefix="specdec-bad-") as tmp:
    fx = Fixtures(pathlib.Path(tmp))
    for i, case in enumerate(cases, 1):
      t0 = time.perf_counter()
      run = run_python if case.surface == "python" else run_cli
      outcome, detail = run(case, fx, timeout)
      detail = detail.replace(str(fx.tmp), "$TMP")     # the same text on every run
      r = Result(case.name, case.surface, outcome, detail, time.perf_counter() - t0)
      results.append(r)
      if progress:
        mark = {"clean": ".", "handled": "h", "unclean": "UNCLEAN"}[outcome]
        print(f"[{i}/{len(cases)}] {case.surface} {case.name}: {mark} ({r.seconds:.1f} s)"
              + (f"  {detail}" if outcome == "unclean" else ""), file=sys.stderr, flush=True)
  return results


def markdown(results: list[Result], seconds: float) -> str:
  surfaces = ("python", "cli")
  outcomes = ("clean", "handled", "unclean")
  lines = ["# Bad-input sweep", "",
           "`python packages/specdec-jax-lab/scripts/bad_input_sweep.py --out "
           "packages/specdec-jax-lab/results/bad-inputs` (issue 31): each case "
           "is a bad input; clean = a `SpecdecError` with a message (python) or exit 1/2 with "
           "one `specdec <cmd>: error: ...` line and no traceback (cli); handled = a documented "
           "non-error outcome; unclean = anything else.", "",
           f"Run time: {seconds:.0f} s.", "",
           "| surface | tried | clean | handled | unclean |", "|---|---|---|---|---|"]
  for s in (*surfaces, "all"):
    rs = [r for r in results if s == "all" or r.surface == s]
    counts = [sum(r.outcome == o for r in rs) for o in outcomes]
    lines.append(f"| {s} | {len(rs)} | " + " | ".join(map(str, counts)) + " |")
  unclean = [r for r in results if r.outcome == "unclean"]
  lines += ["", "## Unclean", ""]
  lines += [f"- {r.surface}: {r.name}: {r.detail}" for r in unclean] or ["None."]
  lines += ["", "## All cases", "", "| surface | case | outcome | message |", "|---|---|---|---|"]
  for r in results:
    detail = r.detail.replace("|", "\\|").replace("\n", " ")
    lines.append(f"| {r.surface} | {r.name.replace('|', '/')} | {r.outcome} | {detail} |")
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", type=pathlib.Path, default=None,
                      help="write bad-inputs.json and bad-inputs.md here")
  parser.add_argument("--surface", choices=("python", "cli"), help="only this surface")
  parser.add_argument("-k", dest="pattern", help="only cases whose name contains this")
  parser.add_argument("--timeout", type=int, default=120, help="seconds per case (120)")
  args = parser.parse_args(argv)
  cases = [c for c in all_cases() if (args.surface in (None, c.surface))
           and (args.pattern is None or args.pattern in c.name)]
  t0 = time.perf_counter()
  results = sweep(cases, args.timeout)
  seconds = time.perf_counter() - t0
  if args.out is not None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bad-inputs.json").write_text(json.dumps(
        [{"name": r.name, "surface": r.surface, "outcome": r.outcome, "message": r.detail}
         for r in results], indent=1, ensure_ascii=False) + "\n")
    (args.out / "bad-inputs.md").write_text(markdown(results, seconds))
  bad = [r for r in results if r.outcome == "unclean"]
  print(f"{len(results)} cases in {seconds:.0f} s: "
        f"{sum(r.outcome == 'clean' for r in results)} clean, "
        f"{sum(r.outcome == 'handled' for r in results)} handled, {len(bad)} unclean",
        file=sys.stderr)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
