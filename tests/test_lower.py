"""sd.lower: the program sd.decode runs, lowered for TPU and CUDA on this CPU.

Every method (one configured value of each, `specdec_jax.testing.examples`: a method added
to `testing.METHODS` joins these checks by its entry there), on a tiny T5 and a tiny
decoder-only LM, lowers for ("tpu",) and ("cuda",) with XLA's ops and
carries no CPU-only custom call (the cpu backend's C++ FFI targets, Python callbacks of
interpret mode); with the gpu backend's Pallas kernels it lowers for CUDA through Mosaic
GPU (slow: Mosaic GPU's lowering). sd.lower builds exactly decode's call (the same jitted
function, the same arguments) and its output has decode's structure and shapes. On the
test process's 8 CPU devices every method on a target sharded over 2 x 4 lowers with 8
partitions and the mesh's sharding annotations. Lowering compiles nothing.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
import pytest
from helpers import METHOD_NAMES

import specdec_jax as sd
from specdec_jax import testing
from specdec_jax.kernels import backends, build, dispatch
from specdec_jax.rounds import engine

B, T = 4, 3


def custom_calls(text: str) -> list[str]:
  """The custom-call targets of a lowered (StableHLO) program, sorted."""
  return sorted(set(re.findall(r"custom_call @([\w.$-]+)", text))
                | set(re.findall(r'call_target_name = "([\w.$-]+)"', text)))


def tokens(vocab: int, length: int) -> np.ndarray:
  """int32 [B, length] right-padded rows (one shorter), ending in EOS (1) for T5."""
  x = np.random.default_rng(0).integers(3, vocab, (B, length)).astype(np.int32)
  x[:, -1] = 1
  x[1, -2:] = [1, 0]
  return x


def cpu_only(text: str) -> list[str]:
  """The custom calls of a lowered program that only a CPU runs: the cpu backend's C++
  kernels (XLA FFI) and Python callbacks (Pallas's interpret mode)."""
  return [c for c in custom_calls(text) if c in build.TARGETS or "cpu_callback" in c]


@pytest.fixture(scope="module")
def models():
  """{"t5" / "t5gemma2": (target, encoder tokens), "lm" / "gemma4": (target, prompts)}, on
  XLA's ops."""
  t5 = sd.load("config:t5_1_1_tiny", kernels="xla")
  lm = sd.load("config:llama_tiny", kernels="xla")
  gemma = sd.load("config:gemma4_tiny", kernels="xla")   # sliding windows, on XLA's ops only
  t5gemma2 = sd.load("config:t5gemma2_tiny", kernels="xla")
  return {"t5": (t5, tokens(t5.vocab_size, 6)), "lm": (lm, tokens(lm.vocab_size, 5)),
          "gemma4": (gemma, tokens(gemma.vocab_size, 5)),
          "t5gemma2": (t5gemma2, tokens(t5gemma2.vocab_size, 6))}


def on_kernels(models, kind: str, kernels: str) -> sd.Model:
  """The bfloat16 `kind` model packed for `kernels`; T5 with one layer each side (every
  kind of product is there; Mosaic's lowering takes its time per kernel call)."""
  model, _ = models[kind]
  if kind == "t5":
    config = dataclasses.replace(model.config, num_encoder_layers=1, num_decoder_layers=1)
    model = sd.init_model(config, 0)
  return sd.pack(model.with_dtype("bfloat16"), kernels=kernels)


def method(name: str, target: sd.Model):
  """The registry's value of method `name` on `target`, the target its own drafter."""
  return testing.examples(target, target, sd.init_heads(target, 2))[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", METHOD_NAMES)
@pytest.mark.parametrize("kind", ["t5", "lm", "gemma4", "t5gemma2"])
def test_every_method_lowers_for_tpu_and_cuda(models, kind, name):
  """One lowering for both platforms: JAX runs each platform's lowering rules in it."""
  target, enc = models[kind]
  lowered = sd.lower(target, method(name, target), enc, max_new_tokens=T,
                     platforms=("tpu", "cuda"))
  assert isinstance(lowered, jax.stages.Lowered)
  text = lowered.as_text()
  assert "stablehlo.while" in text                       # the decode loop, on device
  assert cpu_only(text) == [] and "cpu_callback" not in text
  assert not any(target in text for target in build.TARGETS)


class Spy:
  """Records the `engine.Program`s run (by decode) and lowered (by sd.lower)."""

  def __init__(self, monkeypatch):
    self.run: list[engine.Program] = []
    self.lowered: list[engine.Program] = []
    call, lower = engine.Program.__call__, engine.Program.lower
    monkeypatch.setattr(engine.Program, "__call__",
                        lambda p: (self.run.append(p), call(p))[1])
    monkeypatch.setattr(engine.Program, "lower",
                        lambda p, platforms: (self.lowered.append(p), lower(p, platforms))[1])


def _values(tree):
  """Leaves as numpy (PRNG keys as their data) and the tree's structure."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  data = [np.asarray(jax.random.key_data(x)) if jax.dtypes.issubdtype(
      getattr(x, "dtype", None), jax.dtypes.prng_key) else np.asarray(x) for x in leaves]
  return data, treedef


@pytest.mark.parametrize("kind,name", [
    pytest.param("t5", "autoregressive", marks=pytest.mark.slow),
    pytest.param("t5", "speculative", marks=pytest.mark.slow),
    pytest.param("t5", "beam", marks=pytest.mark.slow),
    pytest.param("lm", "autoregressive", marks=pytest.mark.slow)])
def test_lower_builds_exactly_the_call_decode_makes(models, monkeypatch, kind, name):
  target, enc = models[kind]
  m = method(name, target)
  spy = Spy(monkeypatch)
  out = sd.decode(target, m, enc, max_new_tokens=T)
  lowered = sd.lower(target, m, enc, max_new_tokens=T, platforms=("tpu",))
  (ran,), (low,) = spy.run, spy.lowered
  assert low.fn is ran.fn                                 # one jitted function
  assert low.kwargs.keys() == ran.kwargs.keys()
  for key in ran.kwargs:
    got, want = _values(low.kwargs[key]), _values(ran.kwargs[key])
    assert got[1] == want[1], key
    assert all(np.array_equal(a, b) for a, b in zip(got[0], want[0], strict=True)), key
  got, want = _values(low.args), _values(ran.args)
  assert got[1] == want[1]
  assert all(np.array_equal(a, b) for a, b in zip(got[0], want[0], strict=True))
  # the lowered program's output is decode's: the same arrays of the same shapes (decode
  # then names the run and its statistics on the host: static fields, not the program's)
  shapes = [(s.shape, s.dtype) for s in jax.tree_util.tree_leaves(lowered.out_info)]
  assert shapes == [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(out)]


def test_lower_checks_its_request_as_decode_does(models):
  target, enc = models["t5"]
  with pytest.raises(sd.InputError, match="platforms must be"):
    sd.lower(target, sd.Autoregressive(), enc, max_new_tokens=T, platforms="tpu")
  with pytest.raises(sd.InputError, match="platforms must be"):
    sd.lower(target, sd.Autoregressive(), enc, max_new_tokens=T, platforms=())
  with pytest.raises(sd.InputError, match="method must be one of"):
    sd.lower(target, "greedy", enc, max_new_tokens=T)
  with pytest.raises(sd.InputError, match="max_new_tokens"):
    sd.lower(target, sd.Autoregressive(), enc, max_new_tokens=0)
  with pytest.raises(sd.SamplingError, match="sd.Beam is deterministic"):
    sd.lower(target, sd.Beam(2), enc, max_new_tokens=T, sampling=sd.Sampling(temperature=0.5))
  # sampling needs no key: the key is an argument of the program
  sd.lower(target, sd.Speculative(target, gamma=2), enc, max_new_tokens=T,
           sampling=sd.Sampling(temperature=0.7))


def test_kernels_that_do_not_lower_for_the_platform_are_refused(models):
  t5, enc = models["t5"]
  gpu = sd.pack(t5, kernels="gpu")
  for platforms in (("tpu",), ("cuda", "cpu")):
    with pytest.raises(sd.InputError, match=r"packed for the gpu kernels, which lower for "
                                            r"\('cuda',\) or \('cpu',\)"):
      sd.lower(gpu, sd.Autoregressive(), enc, max_new_tokens=T, platforms=platforms)
  with pytest.raises(sd.InputError, match="gpu kernels"):          # a drafter's too
    sd.lower(t5, sd.Speculative(gpu, gamma=2), enc, max_new_tokens=T, platforms=("tpu",))


def test_a_program_on_xla_lowers_for_several_platforms_at_once(models):
  t5, enc = models["t5"]
  text = sd.lower(t5, sd.Autoregressive(), enc, max_new_tokens=T,
                  platforms=("tpu", "cuda", "cpu")).as_text()
  assert "stablehlo.while" in text and cpu_only(text) == []


def test_the_cpu_kernels_lower_for_the_cpu_only(models):
  """The positive control of `cpu_only`: the C++ kernels' FFI targets are found."""
  if not build.available():
    pytest.skip(build.status().reason)
  t5, enc = models["t5"]
  cpu = sd.pack(t5, kernels="cpu")
  text = sd.lower(cpu, sd.Autoregressive(), enc, max_new_tokens=T, platforms=("cpu",)).as_text()
  assert set(cpu_only(text)) == set(build.TARGETS)
  with pytest.raises(sd.InputError, match=r"cpu kernels, which lower for \('cpu',\), not "
                                          r"\('tpu',\)"):
    sd.lower(cpu, sd.Autoregressive(), enc, max_new_tokens=T, platforms=("tpu",))


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["t5", "lm"])
def test_every_method_on_the_gpu_kernels_lowers_for_cuda_through_mosaic_gpu(models, kind):
  """The program decode runs on a GPU: every product on the Pallas kernels, compiled
  (Mosaic GPU's custom call), none interpreted (no Python callback). The LM: even after
  decode ran the same model here in interpret mode (a jit cache key keeps the two apart),
  and decode still runs here after the lowering."""
  _, enc = models[kind]
  target = on_kernels(models, kind, "gpu")
  assert target.decode_weights.policy.backend == "gpu"
  names = METHOD_NAMES if kind == "t5" else ("autoregressive",)
  if kind == "lm":
    before = sd.decode(target, sd.Autoregressive(), enc[:1], max_new_tokens=1)
  for name in names:
    text = sd.lower(target, method(name, target), enc[:1], max_new_tokens=T,
                    platforms=("cuda",)).as_text()
    assert "mosaic_gpu_v2" in custom_calls(text), name
    assert cpu_only(text) == [] and "cpu_callback" not in text, name
  if kind == "lm":
    after = sd.decode(target, sd.Autoregressive(), enc[:1], max_new_tokens=1)
    np.testing.assert_array_equal(np.asarray(after.tokens), np.asarray(before.tokens))


@pytest.mark.device
@pytest.mark.slow
def test_every_method_on_the_tpu_kernels_lowers_for_tpu_through_mosaic_tpu(models):
  """The program decode runs on a TPU: every product on the Pallas TPU kernels, compiled
  (Mosaic TPU's custom call), none interpreted, for every method."""
  _, enc = models["t5"]
  target = on_kernels(models, "t5", "tpu")
  assert target.decode_weights.policy.backend == "tpu"
  for name in METHOD_NAMES:
    text = sd.lower(target, method(name, target), enc[:1], max_new_tokens=T,
                    platforms=("tpu",)).as_text()
    assert "tpu_custom_call" in custom_calls(text), name
    assert cpu_only(text) == [] and "cpu_callback" not in text, name
  with pytest.raises(sd.InputError, match="tpu kernels"):     # not for CUDA
    sd.lower(target, sd.Autoregressive(), enc[:1], max_new_tokens=T, platforms=("cuda",))


def dispatch_trace(monkeypatch) -> list:
  """[(product, its packed operand or None, drafting)] of every product (dot, sum of
  squares, attention) a program traced from now on asks `kernels.dispatch` for (None: it
  runs on XLA's ops); drafting: asked inside `Model.output_logits`, the output layer that
  prediction heads draft through (a proposal's logits, never a verified token's). The jit
  caches are cleared: a program traced before would not ask again."""
  asked, drafting = [], []
  found, output_logits = dispatch._packed, sd.Model.output_logits

  def recording(module, product):
    operand = found(module, product)
    asked.append((product, operand, bool(drafting)))
    return operand

  def drafts(self, hidden):
    drafting.append(True)
    try:
      return output_logits(self, hidden)
    finally:
      drafting.pop()

  monkeypatch.setattr(dispatch, "_packed", recording)
  monkeypatch.setattr(sd.Model, "output_logits", drafts)
  jax.clear_caches()
  return asked


@pytest.mark.slow
@pytest.mark.parametrize("name", METHOD_NAMES)
def test_every_product_of_every_method_is_dispatched_to_the_backend(models, monkeypatch, name):
  """The dispatch trace, for every method of the registry: its decode on a T5 packed for
  the tpu backend (its own drafter), traced and lowered for TPU, asks for every kind of
  product and finds each one packed: nothing of the target's calls runs on XLA's ops, so
  the backend's row invariance covers the whole decode (CONTRIBUTING: what the tests
  prove). Not its calls: blockwise's heads draft through `Model.output_logits`, which
  reads the output layer's unpacked weights (on XLA: the drafts, not the verification)."""
  target, (_, enc) = on_kernels(models, "t5", "tpu"), models["t5"]
  value = method(name, target)
  asked = dispatch_trace(monkeypatch)
  text = sd.lower(target, value, enc[:1], max_new_tokens=T, platforms=("tpu",)).as_text()
  assert {product.kind for product, _, _ in asked} == set(backends.KINDS), name
  assert [p.name for p, operand, drafting in asked if operand is None and not drafting] == [], name
  # and no product went around the dispatch: no XLA dot, but the heads' own
  heads = [v for v in vars(value).values() if isinstance(v, sd.Heads)]
  assert heads or "stablehlo.dot_general" not in text, name


def test_the_dispatch_trace_finds_a_product_kept_on_xla(models, monkeypatch):
  """Negative control of the trace: a target packed with one product kept on XLA."""
  model = on_kernels(models, "t5", "xla")
  wo = "decoder/layers_0/mlp/wo/kernel"
  target = sd.pack(model, dispatch.policy("tpu", xla={wo}))
  asked = dispatch_trace(monkeypatch)
  sd.lower(target, sd.Autoregressive(), models["t5"][1][:1], max_new_tokens=T,
           platforms=("tpu",))
  assert {product.name for product, operand, _ in asked if operand is None} == {wo}


@pytest.mark.slow
@pytest.mark.parametrize("kind,platforms", [("t5", ("tpu",)), ("lm", ("cuda",))])
def test_every_method_on_a_sharded_target_lowers_on_a_mesh(models, kind, platforms):
  """Every method (`testing.examples`) on a target sharded over 2 x 4 (the drafter and heads
  replicated, the batch split): a program of 8 partitions carrying the mesh's sharding
  constraints and "model" shardings, nothing CPU-only. The T5 for TPU, the LM for CUDA:
  the platform changes no partitioning (every platform lowers every method on one
  device above)."""
  model, x = models[kind]
  mesh = sd.make_mesh(data=2, model=4)
  target = sd.shard(model, mesh)
  every = testing.examples(target, sd.sharding.replicate(model, mesh),
                           sd.sharding.replicate(sd.init_heads(model, 2), mesh))
  enc = sd.sharding.shard_batch(x, mesh)
  for name, method in every.items():
    text = sd.lower(target, method, enc, max_new_tokens=T, platforms=platforms).as_text()
    partitions = re.search(r"mhlo\.num_partitions = (\d+)", text)
    assert partitions and int(partitions.group(1)) == 8, name
    assert "sdy.sharding_constraint" in text and '{"model"}' in text, name
    assert cpu_only(text) == [] and "callback" not in text, name
