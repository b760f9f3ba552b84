"""The Gemma 4 assistant as a drafter: a tiny random Gemma 4 target and assistants made and
saved by transformers (a sliding window shorter than prompt + output, grouped heads, full
layers of their own head size; one assistant with centroid-masked logits), loaded with
`sd.load`. Its draft steps equal transformers' assistant forward on the target's cache;
its first round's drafts equal transformers' assisted generation's; greedy speculative
output is the target's bitwise on ragged prompts, and transformers' assisted
output; sampling is exact with the assistant's masked distribution as q (the
distribution test, with its negative control); the refusals of a wrong target."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from helpers import randomized_torch
from test_distribution import P_FAIL, P_PASS, AcceptAll, counts_of, gof_pvalue, sequence_index

import specdec_jax as sd
from specdec_jax import costs, loading
from specdec_jax.io.checkpoints import hf_gemma_assistant
from specdec_jax.rounds import engine, phases

# Every test here builds its models with transformers (a target and two assistants): the
# full suite's, not the fast tier's (CONTRIBUTING's tiers).
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, EOS, T, GAMMA, WINDOW = 96, 2, 10, 3, 3
TARGET_DIM = 32
# Right-padded ragged prompts (pad 0): lengths 7, 4, 9.
PROMPTS = np.array([[5, 17, 33, 8, 91, 40, 12, 0, 0],
                    [64, 7, 7, 21, 0, 0, 0, 0, 0],
                    [3, 50, 11, 88, 9, 70, 26, 45, 14]], np.int32)


def _text_config(layers, hidden, vocab=VOCAB, **extra):
  types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
  settings = dict(
      vocab_size=vocab, hidden_size=hidden, intermediate_size=48, num_hidden_layers=layers,
      num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
      num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=WINDOW,
      layer_types=types, final_logit_softcapping=4.0, hidden_size_per_layer_input=0,
      vocab_size_per_layer_input=0, max_position_embeddings=64, pad_token_id=0,
      eos_token_id=EOS, bos_token_id=1,
      rope_parameters={
          "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
          "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                             "rope_theta": 1000.0}})
  return transformers.Gemma4TextConfig(**{**settings, **extra})


def _assistant(vocab, centroids, seed, scale=1.0, target_dim=TARGET_DIM):
  extra = (dict(use_ordered_embeddings=True, num_centroids=centroids,
                centroid_intermediate_top_k=2) if centroids else {})
  config = transformers.Gemma4AssistantConfig(
      text_config=_text_config(2, 24, vocab).to_dict(), backbone_hidden_size=target_dim,
      **extra)
  model = randomized_torch(transformers.Gemma4AssistantForCausalLM(config), seed, scale)
  model.generation_config.num_assistant_tokens = GAMMA
  return model


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  """(HF target, our target, {centroids: (HF assistant, ours)}): the target a 3-layer
  `Gemma4ForCausalLM`, the assistants 2 layers (sliding, full), one with 8 centroids."""
  hf_target = randomized_torch(transformers.Gemma4ForCausalLM(_text_config(3, TARGET_DIM)), 0)
  target_dir = tmp_path_factory.mktemp("gemma4_target")
  hf_target.save_pretrained(target_dir)
  assistants = {}
  for centroids in (None, 8):
    hf_assistant = _assistant(VOCAB, centroids, 1)
    where = tmp_path_factory.mktemp(f"gemma4_assistant_{centroids}")
    hf_assistant.save_pretrained(where)
    assistants[centroids] = hf_assistant, sd.load(str(where))
  return hf_target, sd.load(str(target_dir), kernels="xla"), assistants


@pytest.mark.slow
def test_the_assistant_loads(pair):
  _, target, assistants = pair
  plain, masked = assistants[None][1], assistants[8][1]
  assert isinstance(plain, sd.GemmaAssistant) and isinstance(plain, sd.Proposer)
  assert plain.config.num_centroids is None and masked.config.num_centroids == 8
  assert masked.config.centroid_top_k == 2 and masked.config.backbone_dim == TARGET_DIM
  assert plain.config.decoder.layer_types == ("sliding", "full")
  assert plain.config.decoder.final_logit_softcap is None
  order = np.asarray(masked.params["token_ordering"])
  assert sorted(order.tolist()) == list(range(VOCAB))
  bound = plain.for_target(target)
  assert bound.reads == (1, 2)    # the target's last sliding layer, its last full layer


def _hf_first_drafts(hf_target, hf_assistant, prompt):
  """transformers' assisted generation of `prompt` [1, L]: its output tokens, and the
  logits [GAMMA, V] of its first drafting round (the assistant's first GAMMA calls, made
  right after the prefill: they read the target's committed cache)."""
  calls = []
  forward = hf_assistant.forward

  def recording(*args, **kwargs):
    out = forward(*args, **kwargs)
    calls.append(out.logits[0, -1].numpy().copy())
    return out

  hf_assistant.forward = recording
  try:
    with torch.no_grad():
      out = hf_target.generate(torch.tensor(prompt, dtype=torch.long),
                               assistant_model=hf_assistant, max_new_tokens=T,
                               do_sample=False, pad_token_id=0, eos_token_id=EOS)
  finally:
    hf_assistant.forward = forward
  return out[0, prompt.shape[1]:].numpy(), np.stack(calls[:GAMMA])


def _our_first_drafts(target, assistant, prompt):
  """Our round 2 on `prompt` [1, L] (round 1 has no target state and drafts nothing): the
  proposal's tokens [GAMMA] and the logits of each step [GAMMA, V]."""
  method = sd.Speculative(assistant, gamma=GAMMA)
  proposer = method.proposer(target, sd.Greedy())
  config = method.round_config(target, T, sd.Greedy(), EOS)
  state = engine.init_state(target, proposer, jnp.asarray(prompt), config,
                            jax.random.PRNGKey(0), prompt_lengths=jnp.asarray([prompt.shape[1]]))
  state = engine.round_step(target, proposer, state, config)
  assert int(state.n[0]) == 1 and bool(state.proposer.ready[0])
  ctx = engine.context(state, config)
  proposal = proposer.propose(state.proposer, ctx, jax.random.PRNGKey(1))
  token, hidden, logits = ctx.seq[:, 1], state.proposer.hidden, []
  for _ in range(GAMMA):
    step, hidden = proposer.step(ctx.cache, token, hidden)
    logits.append(np.asarray(step[0]))
    token = jnp.argmax(step, axis=-1)
  return np.asarray(proposal.tokens[0]), np.stack(logits)


@pytest.mark.slow
@pytest.mark.parametrize("centroids", [None, 8])
def test_drafts_equal_transformers_assistant(pair, centroids):
  """The first drafting round (the one where transformers reads exactly the target's
  committed cache: see docs/models/gemma4.md) gives transformers' logits and drafts; the
  output is transformers' assisted output, the target's greedy one."""
  hf_target, target, assistants = pair
  hf_assistant, assistant = assistants[centroids]
  prompt = PROMPTS[2:]                                # 9 tokens: past the window of 3
  hf_tokens, hf_logits = _hf_first_drafts(hf_target, hf_assistant, prompt)
  tokens, logits = _our_first_drafts(target, assistant, prompt)
  kept = np.isfinite(logits)
  if centroids:   # 2 of 8 centroids kept: 24 of 96 tokens; transformers fills the rest lower
    assert np.all(kept.sum(-1) == 2 * VOCAB // centroids)
    assert np.all(hf_logits[~kept] < hf_logits[kept].reshape(GAMMA, -1).min(-1).max())
  else:
    assert kept.all()
  np.testing.assert_allclose(logits[kept], hf_logits[kept], rtol=1e-3, atol=2e-4)
  np.testing.assert_array_equal(tokens, hf_logits.argmax(-1))
  out = sd.decode(target, sd.Speculative(assistant, gamma=GAMMA), prompt, T, eos_id=EOS)
  np.testing.assert_array_equal(np.asarray(out.tokens[0, :int(out.lengths[0])]), hf_tokens)


@pytest.mark.slow
def test_on_a_kv_sharing_target_it_reads_the_last_cached_layers(pair, tmp_path):
  """A target whose last two layers share K/V (with per-layer inputs): the assistant reads
  the last cached layer of each type (transformers' "store" layers, its `shared_kv_states`),
  not the last layer: its first round's logits and drafts are transformers'. (Its greedy
  output is the target's whatever it drafts: only the drafts tell which K/V it read.)"""
  s, f = "sliding_attention", "full_attention"
  config = _text_config(5, TARGET_DIM, layer_types=[s, s, f, s, f], num_kv_shared_layers=2,
                        hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB)
  hf_target = randomized_torch(transformers.Gemma4ForCausalLM(config), 4)
  hf_target.save_pretrained(tmp_path)
  target = sd.load(str(tmp_path), kernels="xla")
  hf_assistant, assistant = pair[2][None]
  assert assistant.for_target(target).reads == (1, 2)
  prompt = PROMPTS[2:]
  _, hf_logits = _hf_first_drafts(hf_target, hf_assistant, prompt)
  tokens, logits = _our_first_drafts(target, assistant, prompt)
  np.testing.assert_allclose(logits, hf_logits, rtol=1e-3, atol=2e-4)
  np.testing.assert_array_equal(tokens, hf_logits.argmax(-1))


def test_greedy_is_the_targets_bitwise_on_ragged_prompts(pair):
  """Ragged prompts at batch 3 (windows shorter than prompt + output) give the target's
  greedy tokens bitwise (whose rows are each row alone: tests/test_gemma4.py, against
  transformers row by row); the statistics count what the assistant did (the first round
  drafts nothing: no target state yet)."""
  _, target, assistants = pair
  method = sd.Speculative(assistants[8][1], gamma=GAMMA)
  base = sd.decode(target, sd.Autoregressive(), PROMPTS, T, eos_id=EOS)
  out = sd.decode(target, method, PROMPTS, T, eos_id=EOS)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(base.tokens))
  np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(base.lengths))
  stats = out.stats
  assert stats["method"] == "speculative" and 0.0 <= stats["alpha"] <= 1.0
  assert stats["tokens_per_target_call"] == pytest.approx(stats["tokens"] / stats["target_calls"])
  assert 0 < stats["drafted"] == stats["drafter_calls"] <= GAMMA * (stats["target_calls"] - 3)
  assert stats["accepted"] <= stats["drafted"]


@pytest.mark.slow
@pytest.mark.parametrize("centroids", [None, 8])
def test_drafting_with_the_assistant_lowers_for_tpu_and_cuda(pair, centroids):
  """The round that reads the target's cache in place, with and without centroid-masked
  logits, lowers for TPU and CUDA in one lowering (on XLA's ops: its sliding windows)."""
  _, target, assistants = pair
  method = sd.Speculative(assistants[centroids][1], gamma=GAMMA)
  text = sd.lower(target, method, PROMPTS, max_new_tokens=T, eos_id=EOS,
                  platforms=("tpu", "cuda")).as_text()
  assert "stablehlo.while" in text


@pytest.mark.slow
def test_on_a_mesh_drafting_with_the_assistant_is_one_devices(pair):
  """The target split over "model" (its K/V cache with it), the assistant replicated, the
  prompts split over "data": the assistant reads the sharded cache in place, and the tokens
  and statistics are one device's."""
  _, target, assistants = pair
  mesh = sd.make_mesh(data=2, model=2, devices=jax.devices()[:4])
  prompts = np.concatenate([PROMPTS, PROMPTS[1:2]])              # 4 rows: 2 per data shard
  assistant = assistants[8][1]
  method = sd.Speculative(sd.sharding.replicate(assistant, mesh), gamma=GAMMA)
  sharded = sd.shard(target, mesh)
  assert any(not x.sharding.is_fully_replicated for x in jax.tree_util.tree_leaves(sharded.params))
  out = sd.decode(sharded, method, sd.sharding.shard_batch(prompts, mesh), T, eos_id=EOS)
  one = sd.decode(target, sd.Speculative(assistant, gamma=GAMMA), prompts, T, eos_id=EOS)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(one.tokens))
  for key in ("tokens", "target_calls", "drafted", "accepted"):
    assert out.stats[key] == one.stats[key], key


def test_a_target_it_cannot_read_is_refused(pair):
  _, target, assistants = pair
  assistant = assistants[None][1]
  cases = [(target.replace(config=target.config.replace(vocab_size=64)), "vocab_size 96"),
           (target.replace(config=target.config.replace(emb_dim=48)), "hidden size 32"),
           (target.replace(config=target.config.replace(global_head_dim=32)),
            r"layer 1 \(full\) reads K/V of \[heads, head size\] \[1, 16\]"),
           (target.replace(config=target.config.replace(
               layer_types=("full",) * 3)), "sliding layers, and the target caches none"),
           (sd.Model(config=sd.get_config("t5_1_1_tiny"), params={}),
            "drafts for a Gemma 4 target.*T5 encoder-decoder")]
  for wrong, message in cases:
    with pytest.raises(sd.InputError, match=message):
      assistant.for_target(wrong)
  with pytest.raises(sd.InputError, match="hidden size 32"):     # reached from sd.decode
    sd.decode(cases[1][0], sd.Speculative(assistant, gamma=2), PROMPTS, T)
  with pytest.raises(sd.InputError, match="not bound to a target"):
    assistant.init(PROMPTS, 16)
  with pytest.raises(sd.InputError, match="GemmaAssistant is a proposer.*sd.Speculative"):
    sd.decode(target, sd.BiLD(assistant), PROMPTS, T)


@pytest.mark.parametrize("key, value, message", [
    ("num_kv_shared_layers", 1, "every layer of a Gemma 4 assistant reads the target's K/V"),
    ("use_double_wide_mlp", True, "use_double_wide_mlp"),
])
def test_unimplemented_assistants_are_refused(key, value, message):
  d = {"model_type": "gemma4_assistant", "backbone_hidden_size": 32,
       "text_config": {"model_type": "gemma4_text", "num_hidden_layers": 2,
                       "num_kv_shared_layers": 2, key: value}}
  with pytest.raises(sd.CheckpointError, match=message):
    hf_gemma_assistant.config_from_hf_dict(d)


# ----------------------------------------------------------------------------- sampling
# The distribution test of tests/test_distribution.py on a Gemma 4 target of 8 tokens and
# an assistant whose centroids keep 4 of them per draft (its q is 0 on the others).

V8, L8, PROMPT8, N8, ROWS8 = 8, 3, np.array([[3, 5, 2, 7, 6]], np.int32), 20_000, 10_000
T1 = sd.Sampling(temperature=1.0)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  hf_target = randomized_torch(transformers.Gemma4ForCausalLM(_text_config(2, TARGET_DIM, V8)),
                               2, scale=3.0)
  target_dir = tmp_path_factory.mktemp("gemma4_target8")
  hf_target.save_pretrained(target_dir)
  config = transformers.Gemma4AssistantConfig(
      text_config=_text_config(2, 24, V8).to_dict(), backbone_hidden_size=TARGET_DIM,
      use_ordered_embeddings=True, num_centroids=4, centroid_intermediate_top_k=2)
  hf_assistant = randomized_torch(transformers.Gemma4AssistantForCausalLM(config), 3, scale=2.0)
  assistant_dir = tmp_path_factory.mktemp("gemma4_assistant8")
  hf_assistant.save_pretrained(assistant_dir)
  return sd.load(str(target_dir), kernels="xla"), sd.load(str(assistant_dir))


def _exact_probs(target) -> np.ndarray:
  """[V8^L8] the target's probability of every continuation (one teacher-forced pass)."""
  seqs = np.array(np.meshgrid(*[np.arange(V8)] * L8, indexing="ij")).reshape(L8, -1).T
  assert np.array_equal(sequence_index(seqs), np.arange(len(seqs)))
  tokens = np.concatenate([np.repeat(PROMPT8, len(seqs), 0), seqs[:, :-1]], axis=1)
  logits = target.forward(jnp.asarray(tokens, jnp.int32))[:, PROMPT8.shape[1] - 1:]
  p = np.asarray(jax.nn.softmax(logits, axis=-1), np.float64)
  probs = np.take_along_axis(p, seqs[..., None], axis=-1)[..., 0].prod(axis=1)
  return probs / probs.sum()


def _samples(target, assistant, seed, accept=None):
  method = sd.Speculative(assistant, gamma=3, accept=accept)
  prompts = np.repeat(PROMPT8, ROWS8, axis=0)
  tokens, stats = [], []
  for key in jax.random.split(jax.random.PRNGKey(seed), N8 // ROWS8):
    out = sd.decode(target, method, prompts, L8, sampling=T1, rng=key, eos_id=-1)
    tokens.append(np.asarray(out.tokens))
    stats.append(out.stats)
  return np.concatenate(tokens), stats


@struct.dataclass
class UnmaskedQ(sd.GemmaAssistant):
  """WRONG: drafts from the masked distribution but reports q as uniform over the whole
  vocabulary (as if no centroid masked a token)."""

  def propose(self, state, ctx, key):
    proposal = super().propose(state, ctx, key)
    return proposal.replace(q=jnp.full_like(proposal.q, 1.0 / self.vocab_size))


@pytest.mark.slow
def test_sampling_with_the_assistant_keeps_the_targets_distribution(small):
  """The distribution test passes with the assistant's masked distribution as q; it
  fails with every draft accepted, and with a q that is not the one drafted from."""
  target, assistant = small
  probs = _exact_probs(target)
  tokens, stats = _samples(target, assistant, seed=201)
  p_value, _, _ = gof_pvalue(counts_of(tokens), probs)
  assert p_value > P_PASS, p_value
  assert all(0.05 < s["alpha"] < 0.95 for s in stats)     # both branches of the rule run
  wrong, _ = _samples(target, assistant, seed=201, accept=AcceptAll())
  assert gof_pvalue(counts_of(wrong), probs)[0] < P_FAIL
  unmasked = UnmaskedQ(**{f.name: getattr(assistant, f.name)
                          for f in dataclasses.fields(assistant)})
  wrong, _ = _samples(target, unmasked, seed=201)
  assert gof_pvalue(counts_of(wrong), probs)[0] < P_FAIL


@pytest.mark.slow
def test_update_keeps_the_state_that_predicted_the_last_token(pair):
  """After a round that kept m drafts, the next round drafts from the verify call's state
  at position m (the one that predicted the token emitted last); a finished row's is kept."""
  _, target, assistants = pair
  assistant = assistants[None][1].for_target(target)
  state = assistant.init(PROMPTS[:2], 16)
  hidden = jax.random.normal(jax.random.PRNGKey(0), (2, GAMMA + 1, TARGET_DIM))
  verified = phases.Verified(logits=None, hidden=hidden, cache=None, ran=True)
  outcome = sd.RoundOutcome(live=jnp.asarray([True, False]), m=jnp.asarray([2, 1]),
                            acceptance=None, verified=verified)
  after = assistant.update(state, outcome)
  np.testing.assert_array_equal(np.asarray(after.hidden[0]), np.asarray(hidden[0, 2]))
  np.testing.assert_array_equal(np.asarray(after.hidden[1]), np.zeros(TARGET_DIM))
  np.testing.assert_array_equal(np.asarray(after.ready), [True, False])


@pytest.mark.slow
def test_the_round_reads_the_targets_cache_where_it_is(pair):
  """No second copy of the target's cache: the proposer's state between rounds holds none
  of it, and the drafting loop takes the K/V it reads as loop constants (read-only
  operands), never as loop carries (which XLA would copy while the cache is live)."""
  _, target, assistants = pair
  method = sd.Speculative(assistants[8][1], gamma=GAMMA)
  proposer = method.proposer(target, sd.Greedy())
  config = method.round_config(target, T, sd.Greedy(), EOS)
  state = engine.init_state(target, proposer, jnp.asarray(PROMPTS), config,
                            jax.random.PRNGKey(0), prompt_lengths=jnp.asarray([7, 4, 9]))
  cache = {x.shape for x in state.cache.self_key + state.cache.self_value}
  assert not cache & {x.shape for x in jax.tree_util.tree_leaves(state.proposer)}
  jaxpr = jax.make_jaxpr(lambda s: proposer.propose(s.proposer, engine.context(s, config),
                                                    jax.random.PRNGKey(1)))(state)
  (loop,) = [e for e in jaxpr.eqns if e.primitive.name == "while"]
  consts = loop.params["cond_nconsts"] + loop.params["body_nconsts"]
  shapes = [v.aval.shape for v in loop.invars]
  read = {state.cache.self_key[j].shape for j in proposer.reads}
  assert read <= set(shapes[:consts]) and not cache & set(shapes[consts:])


@pytest.mark.slow
def test_the_tools_take_an_assistant_dir(pair, tmp_path):
  """`specdec decode --drafter DIR` resolves an assistant's directory to the assistant
  bound to its target, and the statistics' cost timers time its draft step."""
  _, target, assistants = pair
  hf_assistant = assistants[None][0]
  hf_assistant.save_pretrained(tmp_path)
  drafter = loading.resolve_drafter(str(tmp_path), target, load=loading.drafter_loader(None))
  assert isinstance(drafter, sd.GemmaAssistant) and drafter.reads == (1, 2)
  timers = costs.cost_timers(target, {"drafter": drafter}, [GAMMA], inputs=PROMPTS,
                             capacity=24, steps=2)
  assert isinstance(timers[("drafter", "drafter")].compile(), costs.AssistantStepTimer)
