"""sd.sharding: meshes, T5X's logical-axis rules, sharded models decoding as on one device.

The test processes have 8 CPU devices (conftest.py): the meshes are laid out in-process.
"""

import collections
import gc
import json
import pathlib
import re
from types import SimpleNamespace

import flax.linen as nn
import jax
import ml_dtypes
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from helpers import compiles, ragged_tokens
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import specdec_jax as sd
from specdec_jax import sharding, testing

HERE = pathlib.Path(__file__).resolve().parent


# ----------------------------------------------------------------------------- one device

def one_device():
  """A 1 x 1 mesh (whatever the process's device count)."""
  return sd.make_mesh(devices=jax.devices()[:1])


def test_make_mesh_axes_and_shape():
  n = jax.device_count()
  mesh = sd.make_mesh(data=n)
  assert mesh.axis_names == ("data", "model")
  assert dict(mesh.shape) == {"data": n, "model": 1}
  assert list(sd.make_mesh(model=n).devices.ravel()) == jax.devices()


@pytest.mark.parametrize("data,model", [(2, 1), (1, 3), (2, 2)])
def test_make_mesh_shape_not_matching_devices(data, model):
  n = jax.device_count()
  data *= n
  with pytest.raises(sd.ConfigError, match=rf"data \* model = {data * model} devices, but {n}"):
    sd.make_mesh(data=data, model=model)
  with pytest.raises(sd.ConfigError, match=rf"= {data * model} devices, but 1 are given"):
    sd.make_mesh(data=data, model=model, devices=jax.devices()[:1])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_make_mesh_bad_size(bad):
  with pytest.raises(sd.ConfigError, match="model must be a positive integer"):
    sd.make_mesh(model=bad)


def test_rules_unknown_logical_axis():
  mesh = one_device()
  rules = sharding.RULES_1D + (("mpl", "model"),)
  with pytest.raises(sd.ConfigError, match="unknown logical axis 'mpl'"):
    sharding.partition_spec(("embed", "mlp"), mesh, rules)
  with pytest.raises(sd.ConfigError, match="unknown logical axis 'mpl'"):
    sd.shard(sd.load("config:t5_1_1_tiny"), mesh, rules=rules)


def test_rules_unknown_mesh_axis_and_malformed():
  mesh = one_device()
  with pytest.raises(sd.ConfigError, match="the mesh has no axis 'tensor'"):
    sharding.partition_spec(("mlp",), mesh, (("mlp", "tensor"),))
  with pytest.raises(sd.ConfigError, match="pair"):
    sharding.partition_spec(("mlp",), mesh, (("mlp",),))


def test_axis_without_rule():
  rules = tuple(r for r in sharding.RULES_1D if r[0] != "vocab")
  with pytest.raises(sd.ConfigError, match="no sharding rule for logical axis 'vocab'"):
    sharding.partition_spec(("vocab", "embed"), one_device(), rules, name="embedding")


@pytest.mark.parametrize("rules", ["RULES_1D", "RULES_2D"])
def test_partition_spec_is_flax_logical_to_mesh_axes(rules):
  """Every parameter's spec is what flax (T5X's partitioner) derives from the same rules."""
  rules = getattr(sharding, rules)
  mesh = one_device()
  axes = flatten_dict(sd.logical_axes(sd.get_config("t5_1_1_tiny")), sep="/")
  for path, names in axes.items():
    ours = sharding.partition_spec(tuple(names), mesh, rules)
    assert tuple(ours) == tuple(nn.logical_to_mesh_axes(tuple(names), rules)), path


def test_default_rules_are_t5x():
  """T5X's 1-D parameter layout of the XXL notes: q/k/v and wi (None, 'model'), out and wo
  ('model', None), the embedding ('model', None); 2-D adds 'embed' over 'data'."""
  mesh = one_device()
  spec = lambda axes, rules=sharding.RULES_1D: sharding.partition_spec(axes, mesh, rules)
  assert spec(("embed", "joined_kv")) == P(None, "model")
  assert spec(("embed", "mlp")) == P(None, "model")
  assert spec(("joined_kv", "embed")) == P("model", None)
  assert spec(("mlp", "embed")) == P("model", None)
  assert spec(("vocab", "embed")) == P("model", None)
  assert spec(("heads", "relpos_buckets")) == P("model", None)
  assert spec(("embed",)) == P(None)
  assert spec(("batch", "length")) == P("data", None)
  assert spec(("embed", "mlp"), sharding.RULES_2D) == P("data", "model")
  # one mesh axis per spec: 'batch' takes "data", so 'embed' stays whole
  assert spec(("batch", "length", "embed"), sharding.RULES_2D) == P("data", None, None)


def test_shard_places_params_on_a_one_device_mesh():
  model = sd.load("config:t5_1_1_tiny")
  sharded = sd.shard(model, one_device())
  params = flatten_dict(sharded.params, sep="/")
  emb = params["token_embedder/embedding"]
  assert isinstance(emb.sharding, NamedSharding) and emb.sharding.spec == P("model", None)
  assert params["decoder/layers_0/mlp/wi_0/kernel"].sharding.spec == P(None, "model")
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(
      lambda a, b: bool((a == b).all()), model.params, sharded.params))


def test_partitioner_only_on_several_devices():
  """A Model off a mesh, or on a mesh of one device, carries no partitioner (its program
  holds no constraint: `test_activations_constrained_as_t5x`); a partitioner is static
  pytree structure, so it survives flattening and keys the jit cache."""
  from specdec_jax.models.layers import with_logical_constraint
  model = sd.load("config:t5_1_1_tiny")
  assert model.partitioner is None
  assert sd.shard(model, one_device()).partitioner is None
  assert sharding.partitioner(one_device()) is None
  where = sharding.Partitioner(one_device(), sharding.RULES_1D)
  leaves, tree = jax.tree_util.tree_flatten(model.replace(partitioner=where))
  assert jax.tree_util.tree_unflatten(tree, leaves).partitioner == where
  assert tree != jax.tree_util.tree_structure(model)
  x = np.zeros((2, 3, 4), np.float32)
  assert with_logical_constraint(x, ("batch", "length", "embed"), None) is x
  with pytest.raises(sd.ConfigError, match="unknown logical axis 'mpl'"):
    sharding.partitioner(one_device(), (("mpl", "model"),))


def test_bad_inputs():
  mesh = one_device()
  with pytest.raises(sd.InputError, match="sd.sharding.replicate"):
    sd.shard(sd.load("config:t5_1_1_tiny").params, mesh)
  with pytest.raises(sd.InputError, match=r"\[B, \.\.\.\]"):
    sharding.shard_batch(jax.numpy.int32(3), mesh)


# ----------------------------------------------------------------------------- 8 devices
# The test processes have 8 CPU devices (conftest.py); one device's runs are on device 0.
# The mesh factor: a sharded target's logits are one device's to float rounding (every mesh
# shape, float32 and bfloat16, ragged inputs); with each method exact on one device, every
# method then decodes on a mesh what it decodes on one device: one decode per method on
# 2x4 is the smoke of that product, and `generate` runs on every mesh shape.

B, L, T, GAMMA = 8, 9, 10, 3
LOGITS_SCALE = 6.0     # sharpens the random target: top-2 margins far above float noise
MESHES = ("8x1/RULES_1D", "2x4/RULES_1D", "2x4/RULES_2D", "1x8/RULES_1D")
METHOD_NAMES = [m.name for m in testing.METHODS]


def mesh_of(name: str):
  """(mesh, rules, data, model) of "DxM/RULES"."""
  shape, rules = name.split("/")
  data, model = map(int, shape.split("x"))
  return sd.make_mesh(data=data, model=model), getattr(sharding, rules), data, model


@pytest.fixture(scope="module")
def models():
  """t5_1_1_tiny (its output layer scaled), t5_1_1_tiny_drafter, 3 heads, and ragged
  EOS-terminated inputs [8, 9] of 3 to 9 tokens."""
  target = sd.load("config:t5_1_1_tiny")
  params = jax.tree_util.tree_map(lambda x: x, target.params)
  dense = params["decoder"]["logits_dense"]
  dense["kernel"] = dense["kernel"] * LOGITS_SCALE
  target = target.replace(params=params)
  return SimpleNamespace(target=target, drafter=sd.load("config:t5_1_1_tiny_drafter"),
                         heads=sd.init_heads(target, 3, rng=1),
                         enc=ragged_tokens(B, L, target.vocab_size, seed=0))


@pytest.fixture(scope="module")
def single(models):
  """One device's greedy `generate`: (tokens [B, T], lengths [B]) on the host."""
  out = sd.generate(models.target, models.enc, T)
  return np.asarray(out.tokens), np.asarray(out.lengths)


@pytest.fixture(scope="module")
def placed(models):
  """"DxM/RULES" -> the models on that mesh (placed once each): the target split by the
  rules, the drafter and heads replicated, the inputs split by rows."""
  done: dict[str, SimpleNamespace] = {}

  def place(name: str) -> SimpleNamespace:
    if name not in done:
      mesh, rules, data, model = mesh_of(name)
      done[name] = SimpleNamespace(
          mesh=mesh, data=data, model=model,
          target=sd.shard(models.target, mesh, rules=rules),
          drafter=sharding.replicate(models.drafter, mesh),
          heads=sharding.replicate(models.heads, mesh),
          enc=sharding.shard_batch(models.enc, mesh))
    return done[name]

  return place


def teacher_forced(tokens: np.ndarray) -> np.ndarray:
  """Decoder inputs [B, T] that reproduce `tokens` [B, T]: the start token, then tokens."""
  return np.concatenate([np.zeros((tokens.shape[0], 1), np.int32), tokens[:, :-1]], axis=1)


def min_margin(logits, tokens, lengths) -> float:
  """Smallest top-2 margin of `logits` [B, T, V] over the emitted positions of `tokens`."""
  top2 = np.sort(logits, axis=-1)[..., -2:]
  emitted = np.arange(tokens.shape[1])[None] < lengths[:, None]
  return float((top2[..., 1] - top2[..., 0])[emitted].min())


@pytest.mark.parametrize("mesh", [m if m == "2x4/RULES_1D" else pytest.param(
    m, marks=pytest.mark.slow) for m in MESHES])
def test_sharded_logits_are_one_devices(models, single, placed, mesh):
  """Teacher-forced logits [8, 10, V] of the target on the mesh, on ragged inputs:

  - float32: one device's within 1e-4 of their scale and a tenth of the smallest top-2
    margin of the emitted positions (greedy choices cannot differ; the partial sums of
    products split over "model" add in another order). Control: the bound rejects the
    same model with its weights rounded to bfloat16.
  - bfloat16 weights and activations: no further from float32's than one device's
    bfloat16 logits are, within 1.5x (the partial sums add in bfloat16 too)."""
  p = placed(mesh)
  dec_in = teacher_forced(single[0])
  want = np.asarray(models.target.forward(models.enc, dec_in))
  got = np.asarray(p.target.forward(p.enc, dec_in))
  margin = min_margin(want, *single)
  bound = min(1e-4 * np.abs(want).max(), margin / 10)
  assert margin > 1e-3, margin
  assert np.abs(got - want).max() < bound, (np.abs(got - want).max(), bound)
  rounded = models.target.astype("bfloat16").astype("float32")
  assert np.abs(np.asarray(rounded.forward(models.enc, dec_in)) - want).max() > bound
  bf16 = models.target.with_dtype("bfloat16")
  one = np.abs(np.asarray(bf16.forward(models.enc, dec_in)) - want).max()
  many = np.abs(np.asarray(p.target.with_dtype("bfloat16").forward(p.enc, dec_in)) - want)
  assert 0 < many.max() <= 1.5 * one, (many.max(), one)


def same_output(got, want) -> bool:
  """Tokens and lengths bitwise, and every beam where both outputs have beams."""
  pairs = [(got.tokens, want.tokens), (got.lengths, want.lengths)]
  if getattr(got, "beams", None) is not None and getattr(want, "beams", None) is not None:
    pairs.append((got.beams, want.beams))
  return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)


@pytest.mark.slow
def test_a_method_on_a_mesh_decodes_one_devices_output(models, placed):
  """The mesh's end-to-end smoke: speculative decoding (`testing.examples`) on 2x4 decodes
  bitwise what its baseline decodes on one device, its tokens split over the 8 devices; new
  prompt contents of the same shapes compile nothing. Every other method on the mesh follows
  from two factors (CONTRIBUTING: what the tests prove): sharded logits are one device's
  (`test_sharded_logits_are_one_devices`) and every method is exact on XLA
  (tests/test_exact.py)."""
  p = placed("2x4/RULES_1D")
  method = testing.examples(p.target, p.drafter, p.heads)["speculative"]
  got = sd.decode(p.target, method, p.enc, max_new_tokens=T)
  want = sd.decode(models.target, method.baseline(), models.enc, max_new_tokens=T)
  assert same_output(got, want), (np.asarray(got.tokens), np.asarray(want.tokens))
  assert len(got.tokens.sharding.device_set) == 8 and min(np.asarray(got.lengths)) >= 1
  other = sharding.shard_batch(np.roll(models.enc, 1, axis=1)[::-1].copy(), p.mesh)
  with compiles() as programs:
    sd.decode(p.target, method, other, max_new_tokens=T)
  assert programs == []


@pytest.mark.slow
def test_sampling_on_a_mesh_is_one_devices(models, placed):
  """Sampling with a fixed key, autoregressive and speculative (the acceptance rule's
  uniforms and residual draws too): one device's tokens on 2x4, and not greedy's."""
  p = placed("2x4/RULES_1D")
  kwargs = dict(max_new_tokens=T, sampling=sd.Sampling(temperature=0.7),
                rng=jax.random.PRNGKey(3))
  greedy = sd.generate(models.target, models.enc, T)
  for on_mesh, alone in ((sd.Autoregressive(), sd.Autoregressive()),
                         (sd.Speculative(p.drafter, gamma=GAMMA),
                          sd.Speculative(models.drafter, gamma=GAMMA))):
    got = sd.decode(p.target, on_mesh, p.enc, **kwargs)
    want = sd.decode(models.target, alone, models.enc, **kwargs)
    assert same_output(got, want), on_mesh.name
    assert not np.array_equal(np.asarray(got.tokens), np.asarray(greedy.tokens))


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["8x1/RULES_1D", "1x8/RULES_1D"])
def test_generate_along_each_mesh_axis(single, placed, mesh):
  """`generate` along each mesh axis alone (rows, then model; 2x4 and the rules: the
  sharded logits test): one device's tokens, split by rows over "data"; the drafter and
  heads whole on all 8 devices, the inputs split by rows; a target on several devices runs
  XLA's ops, not the CPU kernels."""
  p = placed(mesh)
  out = sd.generate(p.target, p.enc, T)
  np.testing.assert_array_equal(np.asarray(out.tokens), single[0])
  np.testing.assert_array_equal(np.asarray(out.lengths), single[1])
  assert list(out.tokens.sharding.spec) == (["data"] if p.data > 1 else [])
  assert len(out.tokens.sharding.device_set) == 8
  for x in jax.tree_util.tree_leaves((p.drafter.params, p.heads.params)):
    assert x.sharding.is_fully_replicated and len(x.sharding.device_set) == 8
  assert {tuple(s.data.shape) for s in p.enc.addressable_shards} == {(B // p.data, L)}
  assert sd.pack(p.target).decode_weights.policy.backend == "xla"


def _placement(x) -> tuple[list, list[tuple[int, ...]], int]:
  """(spec padded to ndim, the distinct per-device shard shapes, devices) of an array."""
  spec = list(x.sharding.spec) + [None] * (x.ndim - len(x.sharding.spec))
  return spec, sorted({tuple(s.data.shape) for s in x.addressable_shards}), \
      len(x.sharding.device_set)


@pytest.mark.parametrize("mesh,path,spec,shard", [
    ("8x1/RULES_1D", "decoder/layers_0/mlp/wi_0/kernel", [None, "model"], (64, 128)),
    ("2x4/RULES_1D", "decoder/layers_0/mlp/wi_0/kernel", [None, "model"], (64, 32)),
    ("1x8/RULES_1D", "decoder/layers_0/mlp/wi_0/kernel", [None, "model"], (64, 16)),
    ("1x8/RULES_1D", "decoder/layers_1/mlp/wo/kernel", ["model", None], (16, 64)),
    ("1x8/RULES_1D", "encoder/layers_0/attention/query/kernel", [None, "model"], (64, 8)),
    ("1x8/RULES_1D", "decoder/layers_0/self_attention/out/kernel", ["model", None], (8, 64)),
    ("1x8/RULES_1D", "token_embedder/embedding", ["model", None], (64, 64)),
    ("1x8/RULES_1D", "decoder/logits_dense/kernel", [None, "model"], (64, 64)),
    ("1x8/RULES_1D", "decoder/decoder_norm/scale", [None], (64,)),
    # 4 relative-position heads on an 8-wide "model" axis: not divisible, replicated
    ("1x8/RULES_1D", "decoder/relpos_bias/rel_embedding", [None, None], (4, 32)),
    ("2x4/RULES_1D", "decoder/relpos_bias/rel_embedding", ["model", None], (1, 32)),
    ("2x4/RULES_2D", "decoder/layers_0/mlp/wi_0/kernel", ["data", "model"], (32, 32)),
    ("2x4/RULES_2D", "token_embedder/embedding", ["model", "data"], (128, 32)),
    ("2x4/RULES_2D", "decoder/decoder_norm/scale", ["data"], (32,)),
])
def test_params_really_sharded(placed, mesh, path, spec, shard):
  """Every device holds a shard of this shape."""
  flat = flatten_dict(placed(mesh).target.params, sep="/")
  assert _placement(flat[path]) == (spec, [shard], 8)


@pytest.mark.parametrize("mesh", MESHES)
def test_every_param_follows_its_spec(placed, mesh):
  """Per-device shard shape = full shape / mesh axis size, for every parameter."""
  p = placed(mesh)
  sizes = {"data": p.data, "model": p.model}
  for path, x in flatten_dict(p.target.params, sep="/").items():
    spec, shards, _ = _placement(x)
    want = tuple(n // (sizes[a] if a else 1) for n, a in zip(x.shape, spec, strict=True))
    assert shards == [want], (path, spec, shards)


def test_mesh_errors(models):
  with pytest.raises(sd.ConfigError, match=r"relpos_bias/rel_embedding.*size 4") as e:
    sd.shard(models.target, sd.make_mesh(model=8), strict=True)
  assert "'model' of size 8" in str(e.value)
  with pytest.raises(sd.InputError,
                     match="batch 6 is not divisible by mesh axis 'data' of size 4"):
    sharding.shard_batch(models.enc[:6], sd.make_mesh(data=4, model=2))
  with pytest.raises(sd.ConfigError, match="6 devices, but 8"):
    sd.make_mesh(data=3, model=2)


# ----------------------------------------------------------------------------- the program

def constraints(lowered_text: str) -> dict[str, int]:
  """"SHAPE SPEC" -> count of the sharding constraints in a lowered (StableHLO, Shardy)
  program, e.g. "8x16x128 data,-,model" for a [8, 16, 128] array split over "data" in
  dimension 0 and over "model" in dimension 2."""
  found = re.findall(r"sdy\.sharding_constraint %\S+ <@\w+, \[(.*?)\]> : tensor<([\dx]+)x\w+>",
                     lowered_text)
  out: collections.Counter = collections.Counter()
  for spec, shape in found:
    dims = re.findall(r"\{([^}]*)\}", spec)
    out[f"{shape} " + ",".join(d.strip('" ') or "-" for d in dims)] += 1
  return dict(out)


def _count(found: dict, shape: str, spec: str) -> int:
  """Constraints of `spec` on arrays whose shape matches the regex `shape`."""
  return sum(n for key, n in found.items()
             if re.fullmatch(shape, key.split()[0]) and key.split()[1] == spec)


def cache_layout(target, method, enc, models: dict) -> dict:
  """Of the decode program of `method` on `target` (`sd.lower`, compiled for the CPU):
  per model name -> (config, data, model) of its cache, whether its heads are split and
  how often the compiled program holds a self-attention buffer [B, H, C, Dh] and a
  cross-attention K/V [B, H, L, Dh] in its per-device shape and whole; the activation
  constraints of the lowered program and the float arrays the compiled one all-gathers."""
  lowered = sd.lower(target, method, enc, max_new_tokens=T, platforms=("cpu",))
  text = lowered.compile().as_text()
  capacity = method.round_config(target, T, sd.Greedy(), 1).capacity
  shapes = collections.Counter(re.findall(r"f32\[[\d,]+\]", text))
  out = {"constraints": constraints(lowered.as_text()),
         "all_gathers": dict(collections.Counter(re.findall(
             r"= (f32\[[\d,]+\])\S* all-gather(?:-start)?\(", text)))}
  for name, (config, data, model) in models.items():
    h, dh = config.num_heads, config.head_dim
    heads = h // model if h % model == 0 else h
    out[name] = {"heads_split": heads < h}
    for buffer, length in (("self", capacity), ("cross", L)):
      out[name][buffer] = {"per_device": shapes[f"f32[{B // data},{heads},{length},{dh}]"],
                           "whole": shapes[f"f32[{B},{h},{length},{dh}]"]}
  return out


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["8x1/RULES_1D", "2x4/RULES_1D", "2x4/RULES_2D"])
def test_caches_sharded_by_batch_and_heads(placed, mesh):
  """In the compiled decode program the target's self-attention buffers [B, H, C, Dh] and
  cross-attention K/V [B, H, L, Dh] are per device [B/data, H/model, ., Dh], never whole;
  the replicated drafter's are split by batch only. RULES_2D is where the engine's
  constraint on the loop state matters: propagation from the parameters alone leaves the
  caches whole in batch."""
  p = placed(mesh)
  caches = {"target": (p.target.config, p.data, p.model),
            "drafter": (p.drafter.config, p.data, 1)}
  for method, used in ((sd.Autoregressive(), {"target": caches["target"]}),
                       (sd.Speculative(p.drafter, gamma=GAMMA), caches)):
    layout = cache_layout(p.target, method, p.enc, used)
    for name in used:
      assert layout[name]["heads_split"] == (name == "target" and p.model > 1)
      for buffer in ("self", "cross"):
        counts = layout[name][buffer]
        assert counts["per_device"] > 0 and counts["whole"] == 0, (method.name, name, buffer)


@pytest.mark.slow
def test_cache_write_gathers_the_new_keys_and_values(placed):
  """What docs/scale.md states of the compiled 2x4 program: writing a call's k new keys
  and values into the batch- and heads-split buffers (a scatter at each row's own
  positions) all-gathers them whole [B, H, k, Dh] first, once per decoder layer for
  keys and once for values; the buffers themselves stay split."""
  p = placed("2x4/RULES_1D")
  config = p.target.config
  layout = cache_layout(p.target, sd.Autoregressive(), p.enc, {"target": (config, 2, 4)})
  whole = {k: n for k, n in layout["all_gathers"].items()
           if re.fullmatch(rf"f32\[{B},{config.num_heads},\d+,{config.head_dim}\]", k)}
  assert sum(whole.values()) == 2 * config.num_decoder_layers, layout["all_gathers"]
  assert layout["target"]["self"]["whole"] == 0


@pytest.mark.slow
def test_heads_the_mesh_does_not_divide_are_left_to_xla(placed):
  """t5_1_1_tiny's 4 heads on 1x8: the rules cannot split whole heads, so the constraints
  leave the heads dimension open (never pinned whole, never split by "model"), and XLA
  splits the caches over parts of "model" as it splits the projections' heads x head_dim
  columns: no device holds a whole [B, H, ., Dh] buffer. The decode equals one device's
  (`test_generate_on_every_mesh_shape`)."""
  p = placed("1x8/RULES_1D")
  layout = cache_layout(p.target, sd.Autoregressive(), p.enc,
                        {"target": (p.target.config, 1, 8)})
  assert not layout["target"]["heads_split"]
  for buffer in ("self", "cross"):
    assert layout["target"][buffer]["whole"] == 0, buffer
  heads = [k for k in layout["constraints"] if k.startswith("8x4x")]
  assert heads and all(k.split()[1].startswith("data,?,") for k in heads), heads


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["2x4/RULES_1D", "2x4/RULES_2D"])
def test_activations_constrained_as_t5x(models, placed, mesh):
  """The lowered decode program (autoregressive) constrains activations by logical names
  as T5X's layers do: queries/keys/values ('batch', 'heads', 'length', 'kv') -> data,
  model; the MLP's hidden layer ('batch', 'length', 'mlp') -> data, -, model; the embedded
  tokens ('batch', 'length', 'embed') -> data, -, - (under RULES_2D 'embed' yields "data"
  to 'batch'). On one device the program holds no constraint at all."""
  p = placed(mesh)
  config = p.target.config
  lower = lambda target, enc: sd.lower(target, sd.Autoregressive(), enc, max_new_tokens=T,
                                       platforms=("cpu",)).as_text()
  found = constraints(lower(p.target, p.enc))
  layers = config.num_encoder_layers + config.num_decoder_layers
  b, h, dh = B, config.num_heads, config.head_dim
  assert _count(found, rf"{b}x\d+x{config.mlp_dim}", "data,-,model") >= layers, found
  assert _count(found, rf"{b}x{h}x\d+x{dh}", "data,model,-,-") >= 3 * layers, found
  assert _count(found, rf"{b}x\d+x{config.emb_dim}", "data,-,-") >= 2, found
  assert constraints(lower(models.target, models.enc)) == {}


@pytest.mark.slow
def test_decoder_only_on_a_mesh():
  """llama_tiny (4 query heads, 2 key/value heads; output layer scaled) on 2x4: greedy
  `generate` of ragged prompts equals one device's; its layers carry T5's constraints, and
  the 2 key/value heads, not divisible by "model" = 4, are left to XLA (open)."""
  target = sd.load("config:llama_tiny")
  params = jax.tree_util.tree_map(lambda x: x, target.params)
  params["decoder"]["logits_dense"]["kernel"] = (params["decoder"]["logits_dense"]["kernel"]
                                                 * LOGITS_SCALE)
  target = target.replace(params=params)
  prompts = np.random.default_rng(1).integers(3, target.vocab_size, (B, 5)).astype(np.int32)
  prompts[2, 3:] = 0     # one shorter prompt (right-padded)
  mesh = sd.make_mesh(data=2, model=4)
  t, e = sd.shard(target, mesh), sharding.shard_batch(prompts, mesh)
  assert same_output(sd.generate(t, e, T), sd.generate(target, prompts, T))
  c = target.config
  found = constraints(sd.lower(t, sd.Autoregressive(), e, max_new_tokens=T,
                               platforms=("cpu",)).as_text())
  assert _count(found, rf"8x\d+x{c.mlp_dim}", "data,-,model") >= 2, found
  assert _count(found, rf"8x{c.num_heads}x\d+x{c.head_dim}", "data,model,-,-") >= 2, found
  assert _count(found, rf"8x{c.num_kv_heads}x\d+x{c.head_dim}", "data,?,-,-") >= 4, found
  assert _count(found, rf"8x\d+x{c.emb_dim}", "data,-,-") >= 1, found


# ----------------------------------------------------------------------------- sd.load(mesh=)

FIXTURE = HERE / "fixtures" / "t5x_tiny_v1_1"
SOURCES = ("legacy", "orbax", "own", "hf", "hf_trap", "config")
# `config:` (a random init compiled into the mesh's shards: a program per mesh) on 2x4 only
LOADS = ([f"{m}/{src}/float32" for m in ("8x1", "2x4", "1x8") for src in SOURCES
          if src != "config" or m == "2x4"] + [f"2x4/{src}/bfloat16" for src in SOURCES])
#: the loads whose reads pass through `leaves.read_block` (Orbax has its own reader)
BLOCK_READS = ("legacy", "own", "hf", "hf_trap")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
  """The fixture in every format: T5X legacy and Orbax, ours (bfloat16), Hugging Face
  (untied output layer), and HF's tie trap (untied but scaled: a scaled transpose)."""
  from specdec_jax.io import checkpoints
  tmp = tmp_path_factory.mktemp("sources")
  model = sd.load(str(FIXTURE / "legacy"))
  sd.save(tmp / "own", model, dtype="bfloat16")
  checkpoints.export_hf(tmp / "hf", model.config, model.params)
  trap = checkpoints.export_hf(tmp / "hf_trap", model.config, model.params)
  hf_config = json.loads((tmp / "hf_trap" / "config.json").read_text())
  (tmp / "hf_trap" / "config.json").write_text(json.dumps(hf_config | {
      "tie_word_embeddings": True}))
  return {"legacy": str(FIXTURE / "legacy"), "orbax": str(FIXTURE / "orbax"),
          "own": str(tmp / "own"), "hf": str(tmp / "hf"), "hf_trap": trap,
          "config": "config:t5_1_1_tiny"}


class BlockReads:
  """Spies on the two block readers while it is entered: `leaves.read_block`, through which
  every sliced read of our loaders passes (`calls`: key -> bytes of each call), and
  Orbax's `_read_shard` (orbax-checkpoint 0.12), which reads each distinct device block of
  an array (`orbax`: bytes of each call)."""

  def __init__(self, monkeypatch):
    from orbax.checkpoint._src.serialization import serialization as orbax_reader

    from specdec_jax.io.checkpoints import leaves
    self.calls: dict[str, list[int]] = collections.defaultdict(list)
    self.orbax: list[int] = []
    read_block, read_shard = leaves.read_block, orbax_reader._read_shard

    def spy(leaf, index, key=""):
      block = read_block(leaf, index, key)
      self.calls[key].append(int(block.nbytes))
      return block

    async def orbax_spy(*args, **kwargs):
      block = await read_shard(*args, **kwargs)
      self.orbax.append(int(block.nbytes))
      return block

    monkeypatch.setattr(leaves, "read_block", spy)
    monkeypatch.setattr(orbax_reader, "_read_shard", orbax_spy)


def _at(index) -> tuple:
  return tuple((s.start, s.stop) for s in index)


def _blocks(x) -> dict:
  """The distinct device blocks of an array: their index -> shard."""
  return {_at(s.index): s for s in x.addressable_shards}


def assert_loaded_into_shards(got: sd.Model, want: sd.Model, mesh) -> dict:
  """`got` (loaded onto `mesh`) is `want` leaf for leaf (values and dtype), every leaf
  placed with the sharding its logical axes map to; its leaves, flat."""
  assert got.config == want.config
  flat, ref = flatten_dict(got.params, sep="/"), flatten_dict(want.params, sep="/")
  assert sorted(flat) == sorted(ref)
  rules = sharding.config_shardings(got.config, mesh)
  for key, x in flat.items():
    assert x.dtype == ref[key].dtype and np.array_equal(np.asarray(x), np.asarray(ref[key])), key
    assert x.sharding.is_equivalent_to(rules[key], x.ndim), key
  return flat


def assert_each_block_read_once(flat: dict, calls: dict, nbytes: dict) -> int:
  """Every leaf read as its distinct device blocks, each once (the bytes read sum to the
  leaf's as stored, `nbytes`), so a leaf split over k devices is read in k calls of 1/k
  of it, never whole; the count of leaves split over several blocks."""
  assert sorted(calls) == sorted(flat)
  for key, x in flat.items():
    blocks, read = len(_blocks(x)), calls[key]
    assert len(read) == blocks and sum(read) == nbytes[key], (key, read, blocks)
    assert max(read) == nbytes[key] // blocks, (key, read)
  return sum(len(_blocks(x)) > 1 for x in flat.values())


@pytest.mark.slow
@pytest.mark.parametrize("load", LOADS)
def test_load_into_shards_equals_single_device(sources, monkeypatch, load):
  """T5X legacy and Orbax, ours, Hugging Face (and its tie trap), `config:`: the tree of
  `sd.load(..., mesh=)` is `sd.load(...)`'s leaf for leaf, every leaf placed by the rules;
  each distinct device block of every leaf read once, never a split leaf whole (through
  our block reader, or Orbax's)."""
  from specdec_jax.io import checkpoints
  shape, name, dtype = load.split("/")
  data, width = map(int, shape.split("x"))
  mesh = sd.make_mesh(data=data, model=width)
  want = sd.load(sources[name], dtype=dtype)
  reads = BlockReads(monkeypatch)
  flat = assert_loaded_into_shards(sd.load(sources[name], dtype=dtype, mesh=mesh), want, mesh)
  assert [str(a) for a in flat["decoder/layers_0/mlp/wi_0/kernel"].sharding.spec] == [
      "None", "model"]
  if name in BLOCK_READS:
    _, stored = checkpoints.load_checkpoint(sources[name])
    nbytes = {k: int(v.nbytes) for k, v in checkpoints.flatten(stored).items()}
    split = assert_each_block_read_once(flat, reads.calls, nbytes)
    assert len(reads.calls) == 52                    # every parameter of t5_1_1_tiny
    placed = [_placement(x)[0] for x in flat.values()]
    sizes = {"data": data, "model": width}
    assert split == sum(any(a and sizes[a] > 1 for a in spec) for spec in placed)
    assert split >= (38 if width > 1 else 0)        # all but the norms (and relpos on 8)
    if width == 8:
      wi = reads.calls["decoder/layers_0/mlp/wi_0/kernel"]
      assert wi == [nbytes["decoder/layers_0/mlp/wi_0/kernel"] // 8] * 8
  if name == "orbax":
    blocks = [int(s.data.nbytes) for x in flat.values() for s in _blocks(x).values()]
    assert sorted(reads.orbax) == sorted(blocks)
    assert (len(blocks) > 52) == (shape != "8x1")  # split leaves: several blocks each


MEMORY_CONFIG = "t5_1_1_base"     # 495 MB in bfloat16; largest leaf (embedding) 49 MB


def _status(field: str) -> int:
  """/proc/self/status `field` (VmRSS, VmHWM) in bytes."""
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    if line.startswith(field + ":"):
      return int(line.split()[1]) * 1024
  raise KeyError(field)


@pytest.mark.slow
def test_load_peak_host_memory(tmp_path):
  """Loading a t5_1_1_base-shaped bfloat16 checkpoint (495 MB) into shards on 2x4 holds at
  most 3 x its largest leaf (49 MB) beyond the placed model (the CPU devices' buffers,
  twice the model: replicated over "data", are host memory too): the process's high-water
  mark of resident memory, reset before, minus what it held before and the placed model.
  Only the checks' few small programs compile meanwhile (a second load would reuse the
  first's freed device buffers and hide what it allocates)."""
  from specdec_jax.io import checkpoints
  config = sd.get_config(MEMORY_CONFIG)
  shapes = checkpoints.expected_shapes(config)
  flat = {k: np.full(shape, 1.0 + i / 64, ml_dtypes.bfloat16)
          for i, (k, shape) in enumerate(shapes.items())}
  path = checkpoints.save_checkpoint(tmp_path / "base", config, flat)
  sizes = [x.nbytes for x in flat.values()]
  assert sum(sizes) == 495_155_712 and max(sizes) == 49_348_608
  del flat
  mesh = sd.make_mesh(data=2, model=4)
  gc.collect()
  pathlib.Path("/proc/self/clear_refs").write_text("5")     # VmHWM := VmRSS
  before = _status("VmRSS")
  model = sd.load(path, dtype="bfloat16", mesh=mesh)
  jax.block_until_ready(model.params)
  peak = _status("VmHWM")
  on_devices = sum(s.data.nbytes for x in jax.tree_util.tree_leaves(model.params)
                   for s in x.addressable_shards)
  assert on_devices >= 2 * sum(sizes)
  extra = peak - before - on_devices
  assert extra < 3 * max(sizes), (extra, max(sizes))     # measured: 0.5 to 1.1


def hf_lm_dirs(root: pathlib.Path) -> pathlib.Path:
  """Tiny GPT-2 (tied) and Llama (untied, grouped KV heads) dirs saved by transformers."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=95,
      eos_token_id=95)).save_pretrained(root / "gpt2")
  transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)).save_pretrained(root / "llama")
  return root


@pytest.fixture(scope="module")
def lm_dirs(tmp_path_factory):
  return hf_lm_dirs(tmp_path_factory.mktemp("hf_lm"))


@pytest.mark.slow
@pytest.mark.parametrize("load", ["2x4/gpt2", "1x8/gpt2", "2x4/llama", "1x8/llama"])
def test_load_hf_lm_into_shards(lm_dirs, monkeypatch, load):
  """Hugging Face GPT-2 (tied, fused c_attn) and Llama (untied, grouped KV heads) dirs
  saved by transformers: `sd.load(..., mesh=)` is `sd.load(...)`'s leaf for leaf, every
  leaf placed by the rules and read as its distinct device blocks, each once, never whole
  when split."""
  shape, kind = load.split("/")
  data, width = map(int, shape.split("x"))
  mesh = sd.make_mesh(data=data, model=width)
  want = sd.load(str(lm_dirs / kind))
  assert want.config.tie_embeddings == (kind == "gpt2")
  reads = BlockReads(monkeypatch)
  flat = assert_loaded_into_shards(sd.load(str(lm_dirs / kind), mesh=mesh), want, mesh)
  nbytes = {k: int(x.nbytes) for k, x in flatten_dict(want.params, sep="/").items()}
  assert assert_each_block_read_once(flat, reads.calls, nbytes) >= 10


def test_load_on_one_device_mesh_in_process():
  model = sd.load(str(FIXTURE / "legacy"), dtype="bfloat16")
  sharded = sd.load(str(FIXTURE / "legacy"), dtype="bfloat16", mesh=one_device())
  assert sharded.config == model.config
  for (path, a), b in zip(flatten_dict(model.params, sep="/").items(),
                          jax.tree_util.tree_leaves(sharded.params), strict=True):
    assert a.dtype == b.dtype and bool((a == b).all()), path
    assert isinstance(b.sharding, NamedSharding)


def test_load_mesh_errors():
  with pytest.raises(sd.InputError, match="pass mesh= too"):
    sd.load("config:t5_1_1_tiny", rules=sharding.RULES_2D)
  with pytest.raises(sd.InputError, match="jax.sharding.Mesh"):
    sd.load("config:t5_1_1_tiny", mesh=(2, 4))
  with pytest.raises(sd.ConfigError, match="unknown logical axis 'mpl'"):
    sd.load(str(FIXTURE / "legacy"), mesh=one_device(), rules=(("mpl", "model"),))


def test_leaves_equal_compares_every_block():
  from specdec_jax.io.checkpoints import leaves
  a = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
  b = a.copy()
  b[-1, -1] += 1                       # in the last block of rows only
  assert leaves.equal(leaves.of_array(a), leaves.of_array(a.copy()), block_bytes=24)
  assert not leaves.equal(leaves.of_array(a), leaves.of_array(b), block_bytes=24)
  assert not leaves.equal(leaves.of_array(a), leaves.of_array(a[:, :2]))


def test_leaf_blocks_transposed_scaled_and_checked():
  from specdec_jax.io.checkpoints import leaves
  weight = np.arange(12, dtype=np.float32).reshape(3, 4)      # HF [out, in]
  kernel = leaves.transposed(leaves.of_array(weight), scale=0.5)
  index = leaves.normalize((slice(1, 3), slice(None)), kernel.shape)
  assert index == (slice(1, 3), slice(0, 3))
  np.testing.assert_array_equal(leaves.read_block(kernel, index), weight.T[1:3] * 0.5)
  short = leaves.Leaf((4, 3), np.dtype("float32"), lambda index: np.zeros((1, 3)))
  with pytest.raises(sd.CheckpointError, match=r"block \[0:4, 0:3\] gave shape \(1, 3\)"):
    leaves.read_whole(short, "decoder/x")


@pytest.mark.slow
def test_load_lm_into_shards(tmp_path):
  """Decoder-only models: `config:` and our format load into shards (Hugging Face dirs:
  `test_load_hf_lm_into_shards`)."""
  model = sd.load("config:gpt2_tiny")
  sd.save(tmp_path / "own", model)
  for source in ("config:gpt2_tiny", str(tmp_path / "own")):
    sharded = sd.load(source, mesh=one_device())
    assert sharded.config == model.config
    for a, b in zip(jax.tree_util.tree_leaves(model.params),
                    jax.tree_util.tree_leaves(sharded.params), strict=True):
      assert a.dtype == b.dtype and bool((a == b).all())
