"""tools.plan and `specdec plan` on one device: bytes against real arrays, capacities
against the engine's, the largest batch, configs read without weights, the command."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import specdec_jax as sd
from specdec_jax import cli
from specdec_jax import methods as core
from specdec_jax import plan as plan_lib
from specdec_jax.cache import cache_bytes as real_cache_bytes
from specdec_jax.errors import ConfigError

TINY, DRAFTER = sd.get_config("t5_1_1_tiny"), sd.get_config("t5_1_1_tiny_drafter")
ONE = plan_lib.abstract_mesh(1, 1)


def run(capsys, *argv):
  code = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return code, out, err


def test_parse_memory():
  assert plan_lib.parse_memory("16GiB") == ("16GiB", 16 << 30)
  assert plan_lib.parse_memory("80GB") == ("80GB", 80 * 10**9)
  assert plan_lib.parse_memory("1e9")[1] == 10**9
  assert plan_lib.parse_memory("TPU-v5e") == ("tpu-v5e", 16 << 30)
  assert plan_lib.parse_memory("h100-80g")[1] == 80 << 30
  for bad in ("16XB", "lots", "0GiB"):
    with pytest.raises(ConfigError, match="device memory"):
      plan_lib.parse_memory(bad)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_param_bytes_are_the_real_arrays(dtype):
  model = sd.init_model(TINY, 0, dtype)
  real = sum(x.nbytes for x in jax.tree_util.tree_leaves(model.params))
  assert plan_lib.param_bytes(TINY, dtype, ONE) == real
  assert plan_lib.param_bytes(TINY, dtype, ONE) == TINY.num_params() * np.dtype(
      model.params["decoder"]["logits_dense"]["kernel"].dtype).itemsize


def test_cache_bytes_are_a_real_cache():
  model = sd.load("config:t5_1_1_tiny")
  enc = np.full((3, 7), 5, np.int32)
  cache = model.start(enc, 20)
  planned = plan_lib.cache_bytes(TINY, 3, 20, 7, "float32", ONE)
  assert sum(planned.values()) == real_cache_bytes(cache)
  assert planned["self_kv"] == 2 * TINY.num_decoder_layers * 3 * TINY.num_heads * 20 * \
      TINY.head_dim * 4


def test_capacity_is_the_engines():
  target = sd.load("config:t5_1_1_tiny")
  for gamma in (1, 4):
    for exact in (False, True):
      config = core.Speculative(None, gamma=gamma, exact=exact).round_config(
          target, 30, sd.Greedy(), 1)
      assert plan_lib.capacity(30, gamma, exact) == config.capacity
  base = core.Autoregressive(exact=False).round_config(target, 30, sd.Greedy(), 1)
  assert plan_lib.capacity(30, 0) == base.capacity


@pytest.mark.slow
def test_xxl_from_shapes_alone():
  """T5-XXL in bfloat16 (22.6 GB) planned without making a weight; 8-way "model" split."""
  xxl = sd.get_config("t5_1_1_xxl")
  one = plan_lib.param_bytes(xxl, "bfloat16", ONE)
  assert one == xxl.num_params() * 2
  eight = plan_lib.param_bytes(xxl, "bfloat16", plan_lib.abstract_mesh(1, 8))
  assert one / 8 <= eight < one / 7.5
  plan = plan_lib.memory_plan(xxl, sd.get_config("t5_1_1_small"), 8,
                              plan_lib.PlanSettings(max_input_len=512, max_new_tokens=64,
                                                    gamma=5, dtype="bfloat16",
                                                    mesh={"model": 8}))
  assert plan.capacity == 70 and plan.total_bytes == (plan.params_bytes + plan.cache_bytes
                                                      + plan.transient_bytes)
  # the drafter is replicated: its bytes do not shrink with the mesh
  single = plan_lib.memory_plan(xxl, sd.get_config("t5_1_1_small"), 8,
                                plan_lib.PlanSettings(max_input_len=512, max_new_tokens=64,
                                                      dtype="bfloat16"))
  assert plan.drafter_params == single.drafter_params


def test_largest_batch():
  shape = plan_lib.PlanSettings(max_input_len=64, max_new_tokens=32, gamma=4,
                                mesh={"data": 2, "model": 1})
  budget = 8 << 20
  best = plan_lib.largest_batch(budget, TINY, DRAFTER, shape)
  assert best > 0 and best % 2 == 0
  assert plan_lib.memory_plan(TINY, DRAFTER, best, shape).total_bytes <= budget
  assert plan_lib.memory_plan(TINY, DRAFTER, best + 2, shape).total_bytes > budget
  assert plan_lib.largest_batch(budget, TINY, DRAFTER, shape, headroom=0.5) < best
  params = plan_lib.memory_plan(TINY, DRAFTER, 2, shape).params_bytes
  assert plan_lib.largest_batch(params, TINY, DRAFTER, shape) == 0   # the parameters fill it


def test_bad_plans():
  with pytest.raises(ConfigError, match="batch 3 is not divisible by the mesh's 'data' axis"):
    plan_lib.memory_plan(TINY, None, 3, plan_lib.PlanSettings(max_input_len=8,
                                                              max_new_tokens=8,
                                                              mesh={"data": 2}))
  with pytest.raises(ConfigError, match="gamma"):
    plan_lib.memory_plan(TINY, DRAFTER, 1, plan_lib.PlanSettings(max_input_len=8,
                                                                 max_new_tokens=8, gamma=0))
  with pytest.raises(ConfigError, match="'model' must be a positive integer"):
    plan_lib.abstract_mesh(1, 0)


@pytest.mark.slow
def test_config_of(tmp_path):
  assert plan_lib.config_of("config:t5_1_1_tiny") == TINY
  assert plan_lib.config_of("t5_1_1_tiny") == TINY
  sd.save(tmp_path / "m", sd.init_model(DRAFTER, 0))
  assert plan_lib.config_of(str(tmp_path / "m")).emb_dim == DRAFTER.emb_dim
  assert plan_lib.config_of("demo-de-en/target").vocab_size > 0
  with pytest.raises(ConfigError):
    plan_lib.config_of("config:no_such_config")
  with pytest.raises(sd.SpecdecError, match="no such file"):
    plan_lib.config_of(str(tmp_path / "missing"))


def test_plan_command(capsys):
  common = ["plan", "--target", "config:t5_1_1_tiny", "--drafter", "config:t5_1_1_tiny_drafter",
            "--batch", 4, "--max-input-len", 16, "--max-new-tokens", 8, "--gamma", 3]
  code, out, err = run(capsys, *common, "--mesh", "data=2,model=2", "--device-memory", "1MiB",
                       "--json")
  assert code == 0, err
  row = json.loads(out)["rows"][0]
  shape = plan_lib.PlanSettings(max_input_len=16, max_new_tokens=8, gamma=3,
                                mesh={"data": 2, "model": 2})
  direct = plan_lib.memory_plan(TINY, DRAFTER, 4, shape)
  assert row["plan"]["total_bytes"] == direct.total_bytes and row["mesh"] == "data=2,model=2"
  assert row["fits"] == (direct.total_bytes <= 1 << 20)
  assert row["largest_batch"] == plan_lib.largest_batch(1 << 20, TINY, DRAFTER, shape)
  code, out, err = run(capsys, *common, "--device-memory", "tpu-v5e")
  assert code == 0 and "target parameters" in out and "tpu-v5e" in out and "fits" in out
  code, out, err = run(capsys, *common, "--mesh", "model=1", "--mesh", "model=4",
                       "--device-memory", "tpu-v4,16GiB")
  assert code == 0
  assert "| largest batch, tpu-v4 | largest batch, 16GiB |" in out
  table = [line for line in out.splitlines() if line.startswith("| data=")]
  assert len(table) == 2 and table[1].startswith("| data=1,model=4 |")
  best = plan_lib.largest_batch(16 << 30, TINY, DRAFTER,
                                dataclasses.replace(shape, mesh={"data": 1, "model": 4}))
  assert table[1].endswith(f" | {best} |")
  for argv, message in [(["--mesh", "rows=2"], "unknown axis 'rows'"),
                        (["--device-memory", "16XB"], "device memory '16XB'"),
                        (["--batch", 0], "--batch must be"),
                        (["--mesh", "data=3"], "batch 4 is not divisible")]:
    code, out, err = run(capsys, *common, *argv)
    assert code == 1 and err.startswith("specdec plan: error: ") and message in err, err


# ----------------------------------------------------------------------------- Gemma 4

GEMMA, G31, G31_ASSISTANT = (sd.get_config("gemma4_tiny"), sd.get_config("gemma4_31b"),
                             sd.get_config("gemma4_31b_assistant"))


@pytest.mark.slow
def test_decoder_only_params_and_cache_are_the_real_arrays():
  """A Gemma 4 model (sliding and full layers of their own K/V shapes; a small target's
  per-layer inputs and K/V-shared layers, which cache nothing): the planned parameter bytes
  are its arrays', the planned cache (the prompt first) a real prefill's."""
  config = GEMMA.replace(num_layers=5, layer_types=("sliding", "sliding", "full", "sliding",
                                                    "full"),
                         num_kv_shared_layers=2, per_layer_dim=4, double_wide_mlp=True)
  model = sd.init_model(config, 0)
  assert plan_lib.param_bytes(config, "float32", ONE) == sum(
      x.nbytes for x in jax.tree_util.tree_leaves(model.params))
  prompt = np.full((3, 7), 5, np.int32)
  slots = plan_lib.cache_slots(config, 20, 7)
  assert slots == model.decode_capacity(20, 7) == 27
  planned = plan_lib.cache_bytes(config, 3, slots, 7, "float32", ONE)
  assert planned["cross_kv"] == 0
  assert sum(planned.values()) == real_cache_bytes(model.start(prompt, slots))


@pytest.mark.slow
def test_gemma4_31b_and_its_assistant_from_the_published_shapes():
  """The named configs reproduce the published parameter counts (30.7B; 0.47B for the
  assistant), and the plan splits the target by its own heads per layer type."""
  assert G31.num_params() == pytest.approx(30.7e9, rel=2e-3)
  assert plan_lib.param_bytes(G31_ASSISTANT, "bfloat16", ONE) == pytest.approx(0.47e9 * 2,
                                                                               rel=2e-3)
  assert G31_ASSISTANT.backbone_dim == G31.emb_dim and G31_ASSISTANT.num_centroids is None
  shape = plan_lib.PlanSettings(max_input_len=1024, max_new_tokens=256, gamma=4,
                                dtype="bfloat16", mesh={"model": 8})
  plan = plan_lib.memory_plan(G31, G31_ASSISTANT, 8, shape)
  assert plan.slots == 1024 + 256 + 4 + 1 and plan.target_split == "split"
  assert plan.target_params_whole == G31.num_params() * 2
  # sliding layers: 16 K/V heads of 256, split 8 ways; full layers: 4 heads of 512, whole
  per_slot = 2 * 8 * plan.slots * 2
  assert plan.target_cache["self_kv"] == per_slot * (50 * 16 * 256 // 8 + 10 * 4 * 512)
  assert plan.drafter_cache == {"state": 8 * 5376 * 2 + 8}    # the assistant caches nothing
  assert plan.drafter_params == plan_lib.param_bytes(G31_ASSISTANT, "bfloat16", ONE)
  best = plan_lib.largest_batch(80 << 30, G31, G31_ASSISTANT, shape)
  assert plan_lib.memory_plan(G31, G31_ASSISTANT, best, shape).total_bytes <= 80 << 30
  assert plan_lib.memory_plan(G31, G31_ASSISTANT, best + 1, shape).total_bytes > 80 << 30
  with pytest.raises(ConfigError, match="a Gemma 4 assistant is a drafter"):
    plan_lib.memory_plan(G31_ASSISTANT, None, 1, shape)
  with pytest.raises(ConfigError, match="the target is an encoder-decoder"):
    plan_lib.memory_plan(TINY, G31_ASSISTANT, 1, shape)


@pytest.mark.slow
def test_speedup_projection_is_theorem_8_at_the_weight_ratio():
  projection = plan_lib.speedup_projection(G31, G31_ASSISTANT, 4)
  c = plan_lib.draft_macs_per_step(G31_ASSISTANT) / G31.decode_macs_per_token()
  assert projection["kind"] == "projection" and projection["c"] == c and 0 < c < 0.05
  # the assistant's step: projections, 4 query-only layers, logits over the vocabulary
  dec = G31_ASSISTANT.decoder
  layers = 3 * (2 * 1024 * 32 * 256) + 2 * 1024 * 32 * 512 + 4 * 3 * 1024 * dec.mlp_dim
  assert plan_lib.draft_macs_per_step(G31_ASSISTANT) == (3 * 5376 * 1024 + layers
                                                         + 1024 * dec.vocab_size)
  rows = projection["rows"]
  assert [r["alpha"] for r in rows] == list(sd.theory.PROJECTION_ALPHAS)
  for r in rows:
    assert r["speedup"] == pytest.approx(sd.theory.walltime_improvement(r["alpha"], 4, c))
    assert r["best_speedup"] >= r["speedup"]
  assert [r["speedup"] for r in rows] == sorted(r["speedup"] for r in rows)
  centroids = G31_ASSISTANT.replace(num_centroids=2048, centroid_top_k=32)
  assert (plan_lib.draft_macs_per_step(G31_ASSISTANT) - plan_lib.draft_macs_per_step(centroids)
          == 1024 * (dec.vocab_size - 2048 - 32 * 128))


@pytest.mark.slow
def test_plan_command_for_gemma4_31b_and_its_assistant(capsys):
  common = ["plan", "--target", "config:gemma4_31b", "--drafter", "config:gemma4_31b_assistant",
            "--dtype", "bfloat16", "--batch", 8, "--max-input-len", 1024, "--max-new-tokens",
            256, "--gamma", 4, "--mesh", "model=8", "--device-memory", "h100-80g"]
  code, out, err = run(capsys, *common, "--json")
  assert code == 0, err
  result = json.loads(out)
  assert result["projection"]["kind"] == "projection"
  assert result["projection"]["rows"][0]["speedup"] == pytest.approx(
      plan_lib.speedup_projection(G31, G31_ASSISTANT, 4)["rows"][0]["speedup"])
  assert result["rows"][0]["plan"]["slots"] == 1285
  code, out, err = run(capsys, *common)
  assert code == 0, err
  assert "at 1285 slots)" in out and "cross K/V" not in out
  assert "PROJECTED speedup over the baseline (not measured)" in out
  code, out, err = run(capsys, "plan", "--target", "config:gemma4_31b", "--dtype", "bfloat16")
  assert code == 0 and "PROJECTED" not in out
  code, out, err = run(capsys, "plan", "--target", "config:gemma4_31b_assistant")
  assert code == 1 and "--target is a Gemma 4 assistant: give it as --drafter" in err, err


# ----------------------------------------------------------------------------- T5Gemma 2

T5G_TINY, T5G_4B, T5G_270M = (sd.get_config("t5gemma2_tiny"), sd.get_config("t5gemma2_4b_4b"),
                              sd.get_config("t5gemma2_270m_270m"))


def _stack_params(config, stack: str) -> int:
  """Parameters of one stack ("encoder" / "decoder"), the shared embedding left out."""
  return sum(int(np.prod(shape)) for path, shape, _ in plan_lib.abstract_params(config)
             if path.startswith(stack + "/"))


@pytest.mark.slow
def test_t5gemma2_named_configs_from_the_published_shapes():
  """The totals published for T5Gemma 2 (~370M, ~7B without the vision tower; Google
  Developers Blog, 2025-12-18) within half a unit of their last digit, and each stack, the
  embedding left out, Gemma 3's published non-embedding count: 4B 3,209M (Gemma 3 Technical
  Report, Table 1) and 270M's 100M (its model card), to the nearest million."""
  assert abs(T5G_270M.num_params() - 370e6) <= 5e6
  assert abs(T5G_4B.num_params() - 7e9) <= 0.5e9
  for config, published in ((T5G_4B, 3_209e6), (T5G_270M, 100e6)):
    for stack in ("encoder", "decoder"):
      assert abs(_stack_params(config, stack) - published) <= 0.5e6, (stack, published)
  assert T5G_4B.decoder_layer_types.count("full") == 5   # five sliding, then one full
  assert plan_lib.param_bytes(T5G_4B, "bfloat16", ONE) == T5G_4B.num_params() * 2
  assert T5G_270M.vocab_size == T5G_4B.vocab_size          # one tokenizer: a sibling drafts


@pytest.mark.slow
def test_t5gemma2_plan_sizes_grouped_heads_and_the_merged_cache():
  """4B-4B drafted by 270M-270M: the target's cache per decoder layer is its 4 grouped K/V
  heads over Le + C slots (the cross K/V at [0, Le), then its own), split over "model" where
  it divides them; the drafter's 1 head, whole (replicated)."""
  b, le, new, gamma = 8, 2048, 256, 4
  shape = plan_lib.PlanSettings(max_input_len=le, max_new_tokens=new, gamma=gamma,
                                dtype="bfloat16", mesh={"model": 4})
  plan = plan_lib.memory_plan(T5G_4B, T5G_270M, b, shape)
  c = new + gamma + 1
  assert plan.slots == plan.capacity == c and plan.target_split == "split"
  per_head_slot = 2 * 34 * b * 256 * 2      # K and V, 34 layers, head size 256, bfloat16
  assert plan.target_cache["self_kv"] == per_head_slot * (4 // 4) * c
  assert plan.target_cache["cross_kv"] == per_head_slot * (4 // 4) * le
  assert plan.target_cache["other"] == b * le + 8 * b       # mask; lengths and offsets
  assert plan.drafter_cache["self_kv"] == 2 * 18 * b * 1 * c * 256 * 2
  assert plan.drafter_params == T5G_270M.num_params() * 2
  wide = plan_lib.memory_plan(T5G_4B, T5G_270M, b, dataclasses.replace(shape, mesh={"model": 8}))
  assert wide.target_cache["self_kv"] == per_head_slot * 4 * c   # 8 does not divide 4 heads
  best = plan_lib.largest_batch(80 << 30, T5G_4B, T5G_270M, shape)
  assert plan_lib.memory_plan(T5G_4B, T5G_270M, best, shape).total_bytes <= 80 << 30
  assert plan_lib.memory_plan(T5G_4B, T5G_270M, best + 1, shape).total_bytes > 80 << 30
  projection = plan_lib.speedup_projection(T5G_4B, T5G_270M, gamma)
  assert projection["kind"] == "projection"
  assert projection["c"] == T5G_270M.decode_macs_per_token() / T5G_4B.decode_macs_per_token()


@pytest.mark.slow
def test_plan_equals_the_bytes_of_a_sharded_t5gemma2_and_its_caches():
  """A tiny T5Gemma 2 target on data=4, model=2, split by the rules, and a smaller sibling
  replicated: their parameters and their caches placed in the plan's layout (the target's
  2 K/V heads split over "model"), measured on device 0, equal the plan's bytes."""
  drafter_config = sd.get_config("t5gemma2_tiny", num_encoder_layers=1, num_decoder_layers=1,
                                 encoder_layer_types=["full"], decoder_layer_types=["sliding"])
  b, le, new, gamma = 8, 6, 10, 3
  on = sd.make_mesh(data=4, model=2)
  plan = plan_lib.memory_plan(T5G_TINY, drafter_config, b, plan_lib.PlanSettings(
      max_input_len=le, max_new_tokens=new, gamma=gamma, mesh={"data": 4, "model": 2}))
  target = sd.shard(sd.init_model(T5G_TINY, 0), on)
  drafter = sd.sharding.replicate(sd.init_model(drafter_config, 1), on)
  tokens = sd.sharding.shard_batch(np.full((b, le), 5, np.int32), on)

  def placed(model, config, split_heads):
    layout = plan_lib.cache_layout(config, b, plan_lib.abstract_mesh(4, 2), split_heads)
    out = jax.tree_util.tree_map(lambda spec: NamedSharding(on, spec), layout,
                                 is_leaf=lambda x: isinstance(x, PartitionSpec))
    return jax.jit(lambda m, t: m.start(t, plan.slots), out_shardings=out)(model, tokens)

  def device_bytes(tree):
    return sum(x.addressable_shards[0].data.nbytes for x in jax.tree_util.tree_leaves(tree))

  target_cache = placed(target, T5G_TINY, True)
  assert target_cache.self_key[0].shape == (b, 2, le + plan.slots, 16)
  assert device_bytes(target.params) == plan.target_params < plan.target_params_whole
  assert device_bytes(target_cache) == sum(plan.target_cache.values())
  assert device_bytes(drafter.params) == plan.drafter_params
  assert device_bytes(placed(drafter, drafter_config, False)) == sum(plan.drafter_cache.values())


@pytest.mark.slow
def test_plan_command_for_t5gemma2(capsys):
  common = ["plan", "--target", "config:t5gemma2_4b_4b", "--drafter", "config:t5gemma2_270m_270m",
            "--dtype", "bfloat16", "--batch", 8, "--max-input-len", 2048, "--max-new-tokens", 256,
            "--gamma", 4, "--mesh", "model=4", "--device-memory", "h100-80g"]
  code, out, err = run(capsys, *common, "--json")
  assert code == 0, err
  result = json.loads(out)
  shape = plan_lib.PlanSettings(max_input_len=2048, max_new_tokens=256, gamma=4,
                                dtype="bfloat16", mesh={"model": 4})
  assert result["rows"][0]["plan"]["total_bytes"] == plan_lib.memory_plan(
      T5G_4B, T5G_270M, 8, shape).total_bytes
  assert result["rows"][0]["largest_batch"] == plan_lib.largest_batch(80 << 30, T5G_4B,
                                                                      T5G_270M, shape)
  code, out, err = run(capsys, *common)
  assert code == 0, err
  assert "at 261 slots, cross K/V" in out
  assert "PROJECTED speedup over the baseline (not measured)" in out
