"""Kernels on a mesh: a sharded target keeps its kernels, each inside `shard_map`.

On the test process's 8 CPU devices (conftest.py). A target `sd.shard`-ed over the mesh and
packed for a backend runs every product on that backend's kernels, one block per device
(`dispatch.Layout`): the "model" axis splits heads and the MLP as `sharding.RULES_1D` does,
batch rows go over "data", and a row-parallel product adds its devices' partial sums in
shard order.

The factor: each product on the mesh is the backend's kernel on its blocks, bitwise (the
cpu and tpu backends, one product at a time on a 1 x 2 mesh). Then one decode per method
(`testing.examples`) on the cpu kernels on 2 x 4 gives one device's output bitwise, at the
calls' natural widths; the gpu and tpu programs on the mesh are lowered (Mosaic), not run.
"""

import dataclasses
import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import perturbed

import specdec_jax as sd
from specdec_jax import testing
from specdec_jax.kernels import backends, build, dispatch
from specdec_jax.models import packing

NEW = 4
METHOD_NAMES = [m.name for m in testing.METHODS]
GREEDY_WIDTHS = {"autoregressive": [1], "speculative": [3]}     # gamma 2: 3-token verifies
# (batch, K, N) of the products' layouts: rows over "data"; the norms whole; wo and the
# attention's out split by rows (K); q/k/v, wi and the output layer by columns, and
# attention by heads (its N)
AXES = [("data", None, None), ("data", None, "model"), ("data", "model", None)]
needs_cpu_kernels = pytest.mark.skipif(not build.available(),
                                       reason="the CPU kernels are unavailable here")


def custom_calls(text: str) -> list[str]:
  """The custom-call targets of a lowered (StableHLO) program, sorted."""
  return sorted(set(re.findall(r"custom_call @([\w.$-]+)", text))
                | set(re.findall(r'call_target_name = "([\w.$-]+)"', text)))


def prompts(vocab: int, batch: int, length: int = 6) -> np.ndarray:
  """int32 [batch, length] right-padded rows (the second one shorter), ending in EOS."""
  x = np.random.default_rng(0).integers(3, vocab, (batch, length)).astype(np.int32)
  x[:, -1] = 1
  x[1, -2:] = [1, 0]
  return x


def one_layer_bf16() -> sd.Model:
  """t5_1_1_tiny with one encoder and one decoder layer, in bfloat16 (Pallas's interpreter
  and Mosaic's lowering take their time per kernel call)."""
  config = dataclasses.replace(sd.get_config("t5_1_1_tiny"), num_encoder_layers=1,
                               num_decoder_layers=1)
  return sd.init_model(config, 1, "bfloat16")


def same_output(got, want) -> bool:
  """Tokens and lengths bitwise, and every beam where both outputs have beams."""
  pairs = [(got.tokens, want.tokens), (got.lengths, want.lengths)]
  if getattr(got, "beams", None) is not None and getattr(want, "beams", None) is not None:
    pairs.append((got.beams, want.beams))
  return all(np.array_equal(np.asarray(jax.device_get(a)), np.asarray(b)) for a, b in pairs)


def record_widths(monkeypatch) -> list[int]:
  """The width of every decode call of a model packed for kernels, from now on."""
  seen: list[int] = []
  original = sd.Model.decode_with_hidden

  def recording(model, tokens, cache, **kwargs):
    if model.decode_weights is not None:
      seen.append(int(tokens.shape[1]))
    return original(model, tokens, cache, **kwargs)

  monkeypatch.setattr(sd.Model, "decode_with_hidden", recording)
  return seen


def layouts(model: sd.Model) -> SimpleNamespace:
  """Of a packed model's products: their backends, whether all are on the mesh, their
  layouts' (batch, K, N) axes and the devices of their operands."""
  flat = jax.tree_util.tree_leaves(model.decode_weights.weights,
                                   is_leaf=lambda x: isinstance(x, dispatch.Packed))
  return SimpleNamespace(
      backends={p.backend for p in flat}, all_on_mesh=all(p.layout is not None for p in flat),
      axes=sorted({(p.layout.batch, p.layout.k, p.layout.n) for p in flat
                   if p.layout is not None}, key=str),
      operand_devices={len(p.operand.sharding.device_set) for p in flat if p.operand.size})


# ----------------------------------------------------------------------------- the factor

@pytest.mark.parametrize("backend_name", [
    pytest.param("cpu", marks=needs_cpu_kernels),
    pytest.param("tpu", marks=[pytest.mark.slow, pytest.mark.device])])
def test_products_on_the_mesh_are_the_kernels_blocks(backend_name):
  """On a 1 x 2 mesh: a column-split dot and the attention split by grouped heads (per-row
  lengths, with a bias and without) are bitwise the kernel on one device; a row-split dot
  is bitwise its blocks' partial sums added in shard order; a row computed alone is
  bitwise the row in the batch. Not gpu: jax's Mosaic GPU interpreter keeps one shared
  memory for all devices and fails when two run a kernel at once ("Barrier remains
  allocated"); on a mesh the gpu kernels are lowered only."""
  mesh = sd.make_mesh(data=1, model=2, devices=jax.devices()[:2])
  backend = backends.get(backend_name)
  rng = np.random.default_rng(5)
  m, k, n = 3, 128, 128
  dtype = jnp.bfloat16
  x = jnp.asarray(rng.standard_normal((m, 1, k)), dtype)
  w = jnp.asarray(rng.standard_normal((k, n)) / 8, dtype)
  product = dispatch.Product(("p",), "dot", (("w",),), jnp.dtype(dtype))
  dot = backend.kernel("dot")
  exact = np.asarray(jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32)))
  for split in ("n", "k"):
    axes = {"k": None, "n": None, split: "model"}
    layout = dispatch.Layout(mesh, "data", axes["k"], axes["n"], (n,))
    operand = packing._blocks(backend, product, [w], layout)
    got = np.asarray(dispatch._dot_on_mesh(dot, x, operand, n, layout), np.float32)
    if split == "n":
      want = dot(x, backend.pack(w, dtype), n)
    else:
      half = k // 2
      want = (dot(x[..., :half], backend.pack(w[:half], dtype), n)
              + dot(x[..., half:], backend.pack(w[half:], dtype), n))
    np.testing.assert_array_equal(got, np.asarray(want), err_msg=split)
    alone = np.asarray(dispatch._dot_on_mesh(dot, x[1:2], operand, n, layout))
    np.testing.assert_array_equal(alone[0], got[1], err_msg=split)
    assert np.max(np.abs(got - exact)) < 0.1, split                  # bfloat16 products
  b, t, h, hkv, s, d = 2, 3, 4, 2, 20, 16
  q = jnp.asarray(rng.standard_normal((b, t, h, d)), dtype)
  kv = [jnp.asarray(rng.standard_normal((b, hkv, s, d)), dtype) for _ in range(2)]
  lengths = jnp.asarray([[14, 13, 20], [7, 1, 9]], jnp.int32)          # per row: [B, T]
  bias = jnp.asarray(rng.standard_normal((1, h, t, s)), jnp.float32)   # relative-position-like
  attend = backend.kernel("attention")
  layout = dispatch.Layout(mesh, "data", None, "model")
  repeated = [jnp.repeat(a, h // hkv, axis=1) for a in kv]
  for extra in (bias, None):
    got = np.asarray(dispatch._attention_on_mesh(attend, q, *kv, extra, lengths, layout))
    np.testing.assert_array_equal(got, np.asarray(attend(q, *kv, extra, lengths)))
    np.testing.assert_array_equal(got, np.asarray(attend(q, *repeated, extra, lengths)))


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param("cpu/t5", marks=needs_cpu_kernels),
                                  pytest.param("cpu/lm", marks=needs_cpu_kernels), "tpu/t5"])
def test_the_mesh_keeps_its_kernels(case, request):
  """No fallback to XLA: every product packed for the backend, in blocks on the mesh, each
  device holding its own; and every product invariant in width (exact mode pads nothing):
  t5_1_1_tiny on 2 x 4 (the decoding tests' target, `cpu_t5`), llama_tiny (4 query heads
  on 2 grouped K/V heads) on 4 x 2 (each device one K/V head and its two query heads), the
  one-layer bfloat16 T5 on 1 x 2."""
  backend, kind = case.split("/")
  if case == "cpu/t5":
    target, mesh = request.getfixturevalue("cpu_t5").target, sd.make_mesh(data=2, model=4)
  else:
    if case == "tpu/t5":
      model, mesh = one_layer_bf16(), sd.make_mesh(data=1, model=2, devices=jax.devices()[:2])
    else:
      model, mesh = sd.load("config:llama_tiny", kernels="xla"), sd.make_mesh(data=4, model=2)
    target = sd.pack(sd.shard(model, mesh), kernels=backend)
  got = layouts(target)
  assert got.backends == {backend} and got.all_on_mesh
  assert got.axes == sorted(AXES, key=str)
  assert got.operand_devices == {mesh.devices.size}
  assert target.width_invariant_decode


# ----------------------------------------------------------------------------- decoding

@pytest.fixture(scope="module")
def cpu_t5():
  """t5_1_1_tiny on the cpu kernels: on one device, and sharded over 2 x 4; a drafter that
  agrees with it often and 2 heads (XLA's ops, replicated on the mesh); 4 prompts."""
  if not build.available():
    pytest.skip("the CPU kernels are unavailable here")
  mesh = sd.make_mesh(data=2, model=4)
  model = sd.load("config:t5_1_1_tiny", kernels="xla")
  drafter = perturbed(model, 0.05, seed=0)
  heads = sd.init_heads(model, 2, rng=1, init_scale=1.0)
  x = prompts(model.vocab_size, 4)
  return SimpleNamespace(
      mesh=mesh, x=x, enc=sd.sharding.shard_batch(x, mesh),
      single=sd.pack(model, kernels="cpu"), target=sd.pack(sd.shard(model, mesh), kernels="cpu"),
      drafter=sd.sharding.replicate(drafter, mesh), heads=sd.sharding.replicate(heads, mesh))


@pytest.mark.slow
def test_a_method_on_the_kernels_on_a_mesh_is_one_devices(cpu_t5, monkeypatch):
  """The kernels-on-a-mesh smoke (every method follows from the factors: the products on
  the mesh are the kernels' blocks, `test_products_on_the_mesh_are_the_kernels_blocks`,
  and every method is exact on XLA, tests/test_exact.py). Speculative decoding on the
  2 x 4 target on the cpu kernels: what its baseline decodes on the
  same kernels on one device, bitwise (the greedy methods: the autoregressive tokens,
  which they are there; the logits of a row-parallel product round differently: K is
  added in two orders), the round engine's methods in exact mode (every target call at
  its natural width)."""
  c = cpu_t5
  name = "speculative"
  method = testing.examples(c.target, c.drafter, c.heads)[name]
  widths = record_widths(monkeypatch)
  got = sd.decode(c.target, method, c.enc, max_new_tokens=NEW)
  seen = sorted(set(widths))
  want = sd.decode(c.single, method.baseline(), c.x, max_new_tokens=NEW)
  assert same_output(got, want), (np.asarray(jax.device_get(got.tokens)), want.tokens)
  assert len(got.tokens.sharding.device_set) == 8
  if not isinstance(method.baseline(), sd.Beam):     # the beam searches' stats say none
    assert got.stats["exact"], got.stats
  assert max(seen, default=0) < 16, seen          # beam search calls another entry
  assert seen == GREEDY_WIDTHS.get(name, seen)


def lowered(target: sd.Model, method, enc, platforms) -> SimpleNamespace:
  """The program of `method` on `target`, lowered for `platforms`: its custom calls, the
  cpu-only ones among them, whether it holds Python callbacks or a manual (shard_map)
  computation, and its partitions."""
  text = sd.lower(target, method, enc, max_new_tokens=NEW, platforms=platforms).as_text()
  calls = custom_calls(text)
  partitions = re.search(r"mhlo\.num_partitions = (\d+)", text)
  return SimpleNamespace(
      calls=calls, cpu_only=[c for c in calls if c in build.TARGETS or "cpu_callback" in c],
      callbacks="callback" in text,
      manual="sdy.manual_computation" in text or "shard_map" in text
             or "Sharding" in text and "SPMDFullToShardShape" in text,
      partitions=int(partitions.group(1)) if partitions else 1)


@pytest.mark.slow
def test_the_mesh_program_calls_the_kernels_inside_shard_map(cpu_t5):
  got = lowered(cpu_t5.target, sd.Autoregressive(), cpu_t5.enc, ("cpu",))
  assert {"specdec_skinny_dot", "specdec_decode_attention"} <= set(got.calls)
  assert got.manual and got.partitions == 8


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("backend,platform,call", [("tpu", "tpu", "tpu_custom_call"),
                                                   ("gpu", "cuda", "mosaic_gpu_v2")])
def test_lowered_for_an_accelerator_on_the_mesh_nothing_is_cpu_only(backend, platform, call):
  """The one-layer bfloat16 T5 on 2 x 4 packed for the gpu or tpu kernels: its
  autoregressive and speculative programs lowered for CUDA / TPU call the compiled
  kernels inside shard_map over 8 partitions, nothing interpreted (lowering compiles
  nothing)."""
  mesh = sd.make_mesh(data=2, model=4)
  tiny = one_layer_bf16()
  target = sd.pack(sd.shard(tiny, mesh), kernels=backend)
  enc = sd.sharding.shard_batch(prompts(tiny.vocab_size, 2), mesh)
  for method in (sd.Autoregressive(),
                 sd.Speculative(sd.sharding.replicate(tiny, mesh), gamma=2)):
    got = lowered(target, method, enc, (platform,))
    assert call in got.calls, method.name
    assert got.cpu_only == [] and not got.callbacks, method.name
    assert got.manual and got.partitions == 8, method.name
