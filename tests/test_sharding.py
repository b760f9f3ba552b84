"""sd.sharding: meshes, T5X's logical-axis rules, sharded models decoding as on one device.

The mesh checks need 8 devices, which jax fixes at start-up: they run in ONE subprocess
(tests/mesh_checks.py, 8 forced CPU devices) that reports JSON; the tests below assert
on its report. The rule and error checks run in-process on the suite's one device.
"""

import json
import pathlib
import re
import sys

import flax.linen as nn
import jax
import ml_dtypes
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from loopback import run_child

import specdec_jax as sd
from specdec_jax import sharding

HERE = pathlib.Path(__file__).resolve().parent
METHODS = ("generate", "speculative", "sample", "sample_again", "speculative_sample", "bild",
           "blockwise", "beam", "speculative_beam")
# on 2x4 only, against one device's `generate`: greedy with the n-gram and prompt-lookup
# drafters and with adaptive gamma
MESH_ONLY = ("ngram", "prompt_lookup", "adaptive")


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
  holds no constraint: the 8-device report checks the lowered text); a partitioner is
  static pytree structure, so it survives flattening and keys the jit cache."""
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

MEMORY_CONFIG = "t5_1_1_base"     # 495 MB in bfloat16; largest leaf (embedding) 49 MB


def memory_checkpoint(path: pathlib.Path) -> str:
  """Our format, `MEMORY_CONFIG`'s shapes in bfloat16 (constant leaves: only sizes matter)."""
  from specdec_jax.io import checkpoints
  config = sd.get_config(MEMORY_CONFIG)
  flat = {k: np.full(shape, 1.0 + i / 64, ml_dtypes.bfloat16)
          for i, (k, shape) in enumerate(checkpoints.expected_shapes(config).items())}
  return checkpoints.save_checkpoint(path, config, flat)


def hf_lm_dirs(root: pathlib.Path) -> str:
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
  return str(root)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  out = tmp_path_factory.mktemp("mesh") / "report.json"
  checkpoint = memory_checkpoint(tmp_path_factory.mktemp("memory") / "base")
  lm_dirs = hf_lm_dirs(tmp_path_factory.mktemp("hf_lm"))
  run_child([sys.executable, str(HERE / "mesh_checks.py"), str(out), checkpoint, lm_dirs],
            devices=8)
  return json.loads(out.read_text())


MESHES = ("8x1/RULES_1D", "2x4/RULES_1D", "2x4/RULES_2D", "1x8/RULES_1D")


@pytest.mark.slow
def test_mesh_fixture(report):
  assert report["device_count"] == 8
  assert set(report["meshes"]) == set(MESHES)
  # greedy tokens are comparable across reduction orders only where margins are large
  assert report["margin"] > 1e-3, report["margin"]
  assert report["single_speculative_is_generate"]


def _shards(report, mesh, path):
  return report["meshes"][mesh]["params"][path]


@pytest.mark.slow
@pytest.mark.parametrize("mesh,path,spec,shard", [
    ("8x1/RULES_1D", "decoder/layers_0/mlp/wi_0/kernel", [None, "model"], [64, 128]),
    ("2x4/RULES_1D", "decoder/layers_0/mlp/wi_0/kernel", [None, "model"], [64, 32]),
    ("1x8/RULES_1D", "decoder/layers_0/mlp/wi_0/kernel", [None, "model"], [64, 16]),
    ("1x8/RULES_1D", "decoder/layers_1/mlp/wo/kernel", ["model", None], [16, 64]),
    ("1x8/RULES_1D", "encoder/layers_0/attention/query/kernel", [None, "model"], [64, 8]),
    ("1x8/RULES_1D", "decoder/layers_0/self_attention/out/kernel", ["model", None], [8, 64]),
    ("1x8/RULES_1D", "token_embedder/embedding", ["model", None], [64, 64]),
    ("1x8/RULES_1D", "decoder/logits_dense/kernel", [None, "model"], [64, 64]),
    ("1x8/RULES_1D", "decoder/decoder_norm/scale", [None], [64]),
    # 4 relative-position heads on an 8-wide "model" axis: not divisible, replicated
    ("1x8/RULES_1D", "decoder/relpos_bias/rel_embedding", [None, None], [4, 32]),
    ("2x4/RULES_1D", "decoder/relpos_bias/rel_embedding", ["model", None], [1, 32]),
    ("2x4/RULES_2D", "decoder/layers_0/mlp/wi_0/kernel", ["data", "model"], [32, 32]),
    ("2x4/RULES_2D", "token_embedder/embedding", ["model", "data"], [128, 32]),
    ("2x4/RULES_2D", "decoder/decoder_norm/scale", ["data"], [32]),
])
def test_params_really_sharded(report, mesh, path, spec, shard):
  placed = _shards(report, mesh, path)
  assert placed["spec"] == spec
  assert placed["shard_shapes"] == [shard]      # every device holds a shard of this shape
  assert placed["devices"] == 8


@pytest.mark.slow
def test_every_param_follows_its_spec(report):
  """Per-device shard shape = full shape / mesh axis size, for every parameter and mesh."""
  for mesh, entry in report["meshes"].items():
    sizes = dict(zip(("data", "model"), map(int, mesh.split("/")[0].split("x")), strict=True))
    for path, placed in entry["params"].items():
      want = [n // (sizes[a] if a else 1)
              for n, a in zip(placed["shape"], placed["spec"], strict=True)]
      assert placed["shard_shapes"] == [want], (mesh, path)


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_drafter_replicated_inputs_by_batch(report, mesh):
  entry = report["meshes"][mesh]
  assert entry["drafter_devices"] == [8] and entry["drafter_replicated"]
  data = int(mesh.split("x")[0])
  assert entry["enc_shard_shapes"] == [[8 // data, 7]]
  assert not entry["packed"]                 # several devices: XLA's ops, not the kernels
  assert entry["output_devices"] == 8


@pytest.mark.slow
@pytest.mark.parametrize("mesh,methods", [
    ("8x1/RULES_1D", ("generate", "speculative", "sample", "sample_again")),
    ("2x4/RULES_1D", METHODS + MESH_ONLY),
    ("2x4/RULES_2D", ("generate", "speculative")),
    ("1x8/RULES_1D", ("generate", "speculative", "sample", "sample_again")),
])
def test_mesh_equals_single_device(report, mesh, methods):
  """Greedy (generate, speculative with a model, n-gram or prompt-lookup drafter and with
  adaptive gamma, BiLD at threshold 1, blockwise), beam search (its best beam),
  speculative beam search with the target as drafter (every beam, bitwise) and
  sampling with a fixed rng: the tokens of the single-device run (its `generate`'s for the
  n-gram, prompt-lookup, adaptive, BiLD and blockwise runs), and greedy methods equal
  `generate` on the mesh."""
  entry = report["meshes"][mesh]
  assert sorted(entry["equal_single"]) == sorted(methods)
  assert all(entry["equal_single"].values()), entry["equal_single"]
  for m in set(methods) & {"speculative", "bild", "blockwise", *MESH_ONLY}:
    assert entry["equal_generate"][m], m
  if "sample" in methods:
    assert entry["sample_repeat"]
    assert not entry["equal_generate"]["sample"]   # the sampling run is not greedy's
  assert all(min(n) >= 1 for n in entry["lengths"].values())


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_mesh_logits_within_float_tolerance(report, mesh):
  """Teacher-forced logits on the mesh: one device's to float32 rounding (the partial sums
  of products split over "model" add in another order), far below the top-2 margins."""
  diff = report["meshes"][mesh]["logits_max_abs_diff"]
  assert diff < 1e-4 * max(1.0, report["logits_scale"]), (diff, report["logits_scale"])
  assert diff < report["margin"] / 10


@pytest.mark.slow
def test_mesh_errors(report):
  errors = report["errors"]
  kind, message = errors["strict"]
  assert kind == "ConfigError"
  assert "relpos_bias/rel_embedding" in message and "size 4" in message
  assert "'model' of size 8" in message
  assert errors["batch"] == ["InputError", errors["batch"][1]]
  assert "batch 6 is not divisible by mesh axis 'data' of size 4" in errors["batch"][1]
  assert errors["mesh"][0] == "ConfigError" and "6 devices, but 8" in errors["mesh"][1]


# ----------------------------------------------------------------------------- sd.load(mesh=)

FIXTURE = HERE / "fixtures" / "t5x_tiny_v1_1"
SOURCES = ("legacy", "orbax", "own", "hf", "hf_trap", "config")
# `config:` (a random init compiled into the mesh's shards: a program per mesh) on 2x4 only
LOADS = ([f"{m}/{src}/float32" for m in ("8x1", "2x4", "1x8") for src in SOURCES
          if src != "config" or m == "2x4"] + [f"2x4/{src}/bfloat16" for src in SOURCES])


@pytest.mark.slow
def test_load_checks_cover_every_format_and_mesh(report):
  assert sorted(report["load"]) == sorted(LOADS)


@pytest.mark.slow
@pytest.mark.parametrize("load", LOADS)
def test_load_into_shards_equals_single_device(report, load):
  """T5X legacy and Orbax, ours, Hugging Face (and its tie trap), `config:`: the tree of
  `sd.load(..., mesh=)` is `sd.load(...)`'s leaf for leaf (values and dtype), every leaf
  placed with the sharding its logical axes map to."""
  entry = report["load"][load]
  assert entry["config_equal"] and entry["equal"] and entry["shardings"], entry
  assert entry["spec"]["decoder/layers_0/mlp/wi_0/kernel"] == [None, "model"]


@pytest.mark.slow
@pytest.mark.parametrize("load", [k for k in LOADS if k.split("/")[1] in
                                  ("legacy", "own", "hf", "hf_trap")])
def test_load_reads_only_each_devices_block(report, load):
  """The spy on the one block reader: every leaf read as its distinct device blocks, each
  once (the bytes read sum to the leaf's), so a leaf split over k devices is read in k
  calls of 1/k of it, never whole."""
  reads = report["load"][load]["reads"]
  assert len(reads) == 52                       # every parameter of t5_1_1_tiny
  split = 0
  for key, r in reads.items():
    assert len(r["calls"]) == r["blocks"], (key, r)
    assert sum(r["calls"]) == r["nbytes"], (key, r)
    assert max(r["calls"]) == r["nbytes"] // r["blocks"], (key, r)
    split += r["blocks"] > 1
  mesh = load.split("/")[0]
  sizes = dict(zip(("data", "model"), map(int, mesh.split("x")), strict=True))
  placed = report["meshes"][f"{mesh}/RULES_1D"]["params"]
  assert split == sum(any(a and sizes[a] > 1 for a in p["spec"]) for p in placed.values())
  assert split >= (38 if sizes["model"] > 1 else 0)  # all but the norms (and relpos on 8)
  if sizes["model"] == 8:
    wi = reads["decoder/layers_0/mlp/wi_0/kernel"]
    assert wi["calls"] == [wi["nbytes"] // 8] * 8


@pytest.mark.slow
@pytest.mark.parametrize("load", [k for k in LOADS if "/orbax/" in k])
def test_orbax_restores_only_each_devices_block(report, load):
  """Orbax's reader (a spy on it) reads every distinct device block of every leaf once:
  the bytes of its calls are exactly the blocks' (in the requested dtype)."""
  entry = report["load"][load]
  assert entry["orbax_calls"] == entry["blocks"], entry
  if not load.startswith("8x1"):
    assert len(entry["blocks"]) > 52            # split leaves: several blocks each


@pytest.mark.slow
def test_load_peak_host_memory(report):
  """Loading a t5_1_1_base-shaped bfloat16 checkpoint (495 MB) into shards on 2x4 holds at
  most 3 x its largest leaf (49 MB) beyond the placed model (the CPU devices' buffers,
  twice the model: replicated over "data", are host memory too)."""
  memory = report["memory"]
  sharded = memory["sharded"]
  assert memory["params_bytes"] == 495_155_712 and memory["largest_leaf"] == 49_348_608
  assert sharded["device_bytes"] >= 2 * memory["params_bytes"]
  extra = sharded["peak"] - sharded["before"] - sharded["device_bytes"]
  assert extra < 3 * memory["largest_leaf"], (extra, memory)     # measured: 0.5 to 1.1


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["8x1/RULES_1D", "2x4/RULES_1D", "2x4/RULES_2D"])
def test_caches_sharded_by_batch_and_heads(report, mesh):
  """In the compiled decode program the target's self-attention buffers [B, H, C, Dh] and
  cross-attention K/V [B, H, L, Dh] are per device [B/data, H/model, ., Dh], never whole;
  the replicated drafter's are split by batch only. RULES_2D is where the engine's
  constraint on the loop state matters: propagation from the parameters alone leaves the
  caches whole in batch."""
  cache = report["meshes"][mesh]["cache"]
  assert set(cache) == {"generate", "speculative"}
  programs = {"constraints", "all_gathers"}
  assert set(cache["speculative"]) == programs | {"target", "drafter"}
  for method, models in cache.items():
    for name in set(models) - programs:
      assert models[name]["heads_split"] == (name == "target" and not mesh.startswith("8x1"))
      for buffer in ("self", "cross"):
        counts = models[name][buffer]
        assert counts["per_device"] > 0 and counts["whole"] == 0, (method, name, buffer)


@pytest.mark.slow
def test_cache_write_gathers_the_new_keys_and_values(report):
  """What docs/scale.md states of the compiled 2x4 program: writing a call's k new keys
  and values into the batch- and heads-split buffers (a scatter at each row's own
  positions) all-gathers them whole [B, H, k, Dh] first, once per decoder layer for
  keys and once for values; the buffers themselves stay split."""
  config = sd.get_config("t5_1_1_tiny")
  cache = report["meshes"]["2x4/RULES_1D"]["cache"]["generate"]
  whole = {k: n for k, n in cache["all_gathers"].items()
           if re.fullmatch(rf"f32\[8,{config.num_heads},\d+,{config.head_dim}\]", k)}
  assert sum(whole.values()) == 2 * config.num_decoder_layers, cache["all_gathers"]
  assert cache["target"]["self"]["whole"] == 0


@pytest.mark.slow
def test_heads_the_mesh_does_not_divide_are_left_to_xla(report):
  """t5_1_1_tiny's 4 heads on 1x8: the rules cannot split whole heads, so the constraints
  leave the heads dimension open (never pinned whole, never split by "model"), and XLA
  splits the caches over parts of "model" as it splits the projections' heads x head_dim
  columns: no device holds a whole [B, H, ., Dh] buffer. The decode equals one device's
  (`test_mesh_equals_single_device`)."""
  cache = report["meshes"]["1x8/RULES_1D"]["cache"]["generate"]
  assert not cache["target"]["heads_split"]
  for buffer in ("self", "cross"):
    assert cache["target"][buffer]["whole"] == 0, buffer
  heads = [k for k in cache["constraints"] if k.startswith("8x4x")]
  assert heads and all(k.split()[1].startswith("data,?,") for k in heads), heads


def _count(found: dict, shape: str, spec: str) -> int:
  """Constraints of `spec` on arrays whose shape matches the regex `shape`."""
  return sum(n for key, n in found.items()
             if re.fullmatch(shape, key.split()[0]) and key.split()[1] == spec)


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["2x4/RULES_1D", "2x4/RULES_2D"])
def test_activations_constrained_as_t5x(report, mesh):
  """The lowered decode program (`generate`) constrains activations by logical names as
  T5X's layers do: queries/keys/values ('batch', 'heads', 'length', 'kv') -> data, model;
  the MLP's hidden layer ('batch', 'length', 'mlp') -> data, -, model; the embedded tokens
  ('batch', 'length', 'embed') -> data, -, - (under RULES_2D 'embed' yields "data" to
  'batch'). On one device the program holds no constraint at all."""
  config = sd.get_config("t5_1_1_tiny")
  found = report["meshes"][mesh]["cache"]["generate"]["constraints"]
  layers = config.num_encoder_layers + config.num_decoder_layers
  b, h, dh = 8, config.num_heads, config.head_dim
  assert _count(found, rf"{b}x\d+x{config.mlp_dim}", "data,-,model") >= layers, found
  assert _count(found, rf"{b}x{h}x\d+x{dh}", "data,model,-,-") >= 3 * layers, found
  assert _count(found, rf"{b}x\d+x{config.emb_dim}", "data,-,-") >= 2, found
  assert report["single_constraints"] == {}


@pytest.mark.slow
def test_decoder_only_on_a_mesh(report):
  """llama_tiny (4 query heads, 2 key/value heads) on 2x4: greedy `generate` equals one
  device's; its layers carry T5's constraints, and the 2 key/value heads, not divisible
  by "model" = 4, are left to XLA (open)."""
  lm = report["lm"]
  assert lm["generate"], lm
  c, found = lm["config"], lm["constraints"]
  assert _count(found, rf"8x\d+x{c['mlp']}", "data,-,model") >= 2, found
  assert _count(found, rf"8x{c['heads']}x\d+x{c['head_dim']}", "data,model,-,-") >= 2, found
  assert _count(found, rf"8x{c['kv_heads']}x\d+x{c['head_dim']}", "data,?,-,-") >= 4, found
  assert _count(found, rf"8x\d+x{c['emb']}", "data,-,-") >= 1, found


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_output_tokens_split_by_batch(report, mesh):
  data = int(mesh.split("x")[0])
  assert report["meshes"][mesh]["tokens_spec"] == (["data"] if data > 1 else [])


@pytest.mark.slow
def test_no_recompilation_when_only_prompt_contents_change(report):
  events = report["recompiles"]
  assert events["generate_longer"], events           # the listener sees compilations
  for method in ("generate", "speculative", "bild", "blockwise"):
    assert events[method] == [], (method, events[method])


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
@pytest.mark.parametrize("load", ["2x4/gpt2", "1x8/gpt2", "2x4/llama", "1x8/llama"])
def test_load_hf_lm_into_shards(report, load):
  """Hugging Face GPT-2 (tied, fused c_attn) and Llama (untied, grouped KV heads) dirs
  saved by transformers: `sd.load(..., mesh=)` is `sd.load(...)`'s leaf for leaf, every
  leaf placed by the rules and read as its distinct device blocks, each once, never whole
  when split."""
  entry = report["lm_load"][load]
  assert entry["config_equal"] and entry["equal"] and entry["shardings"], entry
  assert entry["tied"] == load.endswith("gpt2")
  assert entry["split"] >= 10, entry["split"]
  for key, r in entry["reads"].items():
    assert len(r["calls"]) == r["blocks"], (key, r)
    assert sum(r["calls"]) == r["nbytes"], (key, r)
    assert max(r["calls"]) == r["nbytes"] // r["blocks"], (key, r)


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
