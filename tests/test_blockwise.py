"""Blockwise parallel drafts: heads, greedy equivalence for every variant, parallel
verification, oracle, exact sampling with head drafts, save/load, errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import compiles, ragged_tokens, workload_fixtures

import specdec_jax as sd
from specdec_jax.drafters import lattice
from specdec_jax.drafters.heads import head_logits, heads_loss
from specdec_jax.methods import blockwise
from specdec_jax.rounds import engine
from specdec_jax.rounds.acceptance import prefix_length
from specdec_jax.rounds.phases import Acceptance, Proposal

MAX_NEW = 11


model, enc, baseline = workload_fixtures(MAX_NEW, target="model", enc="enc")


def train_heads(model, prompts, num_heads=4, steps=50, seed=0):
  """Heads fitted (frozen base, optax adam) to the model's own greedy outputs.

  The training inputs include `prompts`: on a random tiny model heads fitted to 64
  inputs do not generalise to others (block efficiency ~1.0 there), and these tests
  are about the mechanics of accepted drafts, not about generalisation. Fifty steps leave
  the heads good (about 2 tokens per target call) but not perfect, so that rescoring and
  parallel drafts change which drafts are accepted (after 150 every variant accepted the
  same).
  """
  inputs = np.concatenate([prompts, ragged_tokens(64 - len(prompts), 12, 512, seed=100 + seed)])
  targets = np.asarray(sd.generate(model, inputs, 16, eos_id=-1).tokens)
  heads = sd.init_heads(model, num_heads, rng=seed)
  opt = optax.adam(3e-3)

  @jax.jit
  def step(params, state):
    loss = lambda p: heads_loss(model, heads.replace(params=p), inputs, targets)[0]
    value, grads = jax.value_and_grad(loss)(params)
    updates, state = opt.update(grads, state)
    return optax.apply_updates(params, updates), state, value

  params, state = heads.params, opt.init(heads.params)
  first = None
  for _ in range(steps):
    params, state, value = step(params, state)
    first = float(value) if first is None else first
  assert float(value) < 0.5 * first          # the loss really fell
  return heads.replace(params=params)


@pytest.fixture(scope="module")
def trained(model, enc):
  return train_heads(model, enc)


@pytest.fixture(scope="module")
def random_heads(model):
  return sd.init_heads(model, 4, rng=3, init_scale=1.0)


@pytest.fixture(scope="module")
def bigram(baseline):
  return lattice.NGramLM.fit(np.asarray(baseline.tokens), 512)


#: A top-4 lattice and parallel drafts each run inside a rescored variant.
VARIANTS = {
    "plain": dict(),
    "ngram": dict(top_k=4, rescoring="ngram", rescoring_weight=0.5),
    "neural": dict(top_k=4, rescoring="neural", rescoring_weight=1.0),
    "parallel-ngram": dict(top_k=3, num_drafts=4, rescoring="ngram"),
}


def _rescorer(kind, bigram):
  if kind.endswith("ngram"):
    return bigram
  if kind == "neural":
    return sd.init_model(sd.get_config("t5_1_1_tiny_drafter"), 2)
  return None


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(VARIANTS))
def test_greedy_equals_baseline(model, enc, baseline, trained, bigram, kind):
  """Each variant with trained heads: drafts are accepted, so the output is the
  baseline's through accepted drafts, not only through rejections (random heads:
  tests/test_exact.py, every method of the registry)."""
  heads = trained
  out = sd.blockwise_generate(model, heads, enc, max_new_tokens=MAX_NEW,
                              rescorer=_rescorer(kind, bigram), **VARIANTS[kind])
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  np.testing.assert_array_equal(out.lengths, baseline.lengths)
  s = out.stats
  assert s["method"] == "blockwise" and not s["lossy"]
  assert 0 <= int(s["accepted"]) <= int(s["drafted"])
  assert float(s["tokens_per_target_call"]) > 1.3


@pytest.mark.slow
def test_trained_heads_beat_random_and_the_oracle_bounds_them(model, enc, random_heads,
                                                               trained):
  plain = sd.blockwise_generate(model, trained, enc, MAX_NEW, oracle=True)
  rand = sd.blockwise_generate(model, random_heads, enc, MAX_NEW)
  assert (float(plain.stats["tokens_per_target_call"])
          > float(rand.stats["tokens_per_target_call"]) + 0.3)
  # The top-1 oracle IS plain BPD; a wider lattice can only help the oracle.
  np.testing.assert_allclose(float(plain.stats["oracle_tokens_per_target_call"]),
                             float(plain.stats["tokens_per_target_call"]), rtol=1e-6)
  wide = sd.blockwise_generate(model, trained, enc, MAX_NEW, top_k=8, oracle=True)
  assert (float(wide.stats["oracle_tokens_per_target_call"])
          >= float(plain.stats["tokens_per_target_call"]))
  # Parallel verification of several lattice paths accepts at least as much.
  parallel = sd.blockwise_generate(model, trained, enc, MAX_NEW, top_k=4, num_drafts=8)
  assert (float(parallel.stats["tokens_per_target_call"])
          >= float(plain.stats["tokens_per_target_call"]))


@pytest.mark.slow
def test_parallel_verify_scores_each_draft_as_if_verified_alone(model, enc):
  """The tree call's logits for draft i equal a plain verify call of draft i alone."""
  config = blockwise.round_config(sd.init_heads(model, 4), MAX_NEW, num_drafts=3, top_k=3)
  state = engine.init_state(model, sd.drafters.NoProposals(512), jnp.asarray(enc), config,
                            jax.random.PRNGKey(0))
  state = state.replace(n=jnp.array([2, 3, 1, 4, 2, 3]),
                        seq=state.seq.at[:, 1:6].set(jnp.asarray(enc[:, :5])))
  state = state.replace(cache=model.decode(state.seq[:, :5], state.cache)[1])
  drafts = jnp.asarray(np.random.RandomState(0).randint(2, 512, (6, 3, 3)), jnp.int32)
  count = jnp.full((6,), 3, jnp.int32)
  no = jnp.zeros((6,), jnp.bool_)
  proposal = Proposal(tokens=drafts.reshape(6, 9), count=count, q=None, calls=0 * count,
                      fallback=no, final=no, state=None)
  parallel = blockwise.ParallelVerify(3, 3)(model, state, proposal)
  chosen = np.asarray(parallel.proposal.tokens)
  for i in range(3):
    alone = engine.verify(model, state, proposal.replace(tokens=drafts[:, i]))
    rows = np.all(chosen == np.asarray(drafts[:, i]), axis=1)
    np.testing.assert_allclose(np.asarray(parallel.logits)[rows], np.asarray(alone.logits)[rows],
                               atol=1e-4)
    full = blockwise.ParallelVerify(3, 3)
    offsets, visible, views = full.layout()
    logits, _, _ = model.decode_with_hidden(
        jnp.concatenate([state.seq[jnp.arange(6), state.n][:, None], proposal.tokens], 1),
        state.cache.with_length(state.n), positions=state.n[:, None] + offsets,
        visible=jnp.asarray(visible)[None])
    np.testing.assert_allclose(np.asarray(logits[:, views[i]]), np.asarray(alone.logits),
                               atol=1e-4)


@dataclasses.dataclass(frozen=True)
class KeepEven:
  """A research rule: keep proposals while they are even; then the target's argmax."""

  lossy = True

  def __call__(self, logits, proposal, sampling, key):
    g = proposal.tokens.shape[1]
    valid = jnp.arange(g)[None] < proposal.count[:, None]
    m = prefix_length((proposal.tokens % 2 == 0) & valid)
    best = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return Acceptance(m=m, next_token=jnp.take_along_axis(best, m[:, None], 1)[:, 0],
                      beta=jnp.zeros(proposal.tokens.shape), scored=valid)


@pytest.mark.slow
def test_parallel_verify_picks_the_draft_with_the_configured_rule(model, enc, trained):
  """The winning draft is the one the run's acceptance rule keeps most of, not the one
  matching the verifier's argmax longest."""
  config = blockwise.round_config(sd.init_heads(model, 4), MAX_NEW, num_drafts=3, top_k=3,
                                  accept=KeepEven())
  assert config.verify.accept == KeepEven()
  state = engine.init_state(model, sd.drafters.NoProposals(512), jnp.asarray(enc), config,
                            jax.random.PRNGKey(0))
  state = state.replace(n=jnp.array([2, 3, 1, 4, 2, 3]),
                        seq=state.seq.at[:, 1:6].set(jnp.asarray(enc[:, :5])))
  state = state.replace(cache=model.decode(state.seq[:, :5], state.cache)[1])
  drafts = np.random.RandomState(5).randint(2, 512, (6, 3, 3)).astype(np.int32)
  count = jnp.full((6,), 3, jnp.int32)
  no = jnp.zeros((6,), jnp.bool_)
  proposal = Proposal(tokens=jnp.asarray(drafts.reshape(6, 9)), count=count, q=None,
                      calls=0 * count, fallback=no, final=no, state=None)
  even = np.cumprod(drafts % 2 == 0, axis=2).sum(axis=2)                  # [B, p]
  expected = drafts[np.arange(6), even.argmax(axis=1)]
  assert (even.argmax(axis=1) > 0).any()    # the argmax rule would pick draft 0 here
  chosen = config.verify(model, state, proposal, config.call_width).proposal.tokens
  np.testing.assert_array_equal(np.asarray(chosen), expected)
  default = blockwise.ParallelVerify(3, 3)(model, state, proposal).proposal.tokens
  assert (np.asarray(default) != expected).any()
  # end to end: the rule that chose the draft commits it
  out = sd.decode(model, sd.Blockwise(trained, top_k=3, num_drafts=3, accept=KeepEven()),
                  enc, MAX_NEW)
  assert int(out.stats["accepted"]) > 0 and int(out.stats["target_calls"]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3])
def test_oracle_walk_matches_a_host_reference(model, enc, baseline, trained, k):
  """Oracle target calls from an independent numpy walk over teacher-forced head logits."""
  tokens, lengths = np.asarray(baseline.tokens), np.asarray(baseline.lengths)
  got = np.asarray(blockwise.oracle_calls(model, trained, jnp.asarray(enc),
                                          baseline.tokens, baseline.lengths, k))
  dec_in = np.concatenate([np.zeros_like(tokens[:, :1]), tokens[:, :-1]], axis=1)
  states = model.hidden_states(jnp.asarray(enc), jnp.asarray(dec_in))
  logits = np.asarray(head_logits(model, trained, states))              # [B, T, G, V]
  for b in range(len(tokens)):
    emitted, calls = 1, 1          # the first call has no heads' state: one token
    while emitted < lengths[b]:
      run = 0
      while run < logits.shape[2] and emitted + run < lengths[b]:
        # draft `run` after token tokens[emitted-1] comes from state emitted-1, head run+2
        if tokens[b, emitted + run] not in np.argsort(-logits[b, emitted - 1, run])[:k]:
          break
        run += 1
      emitted, calls = emitted + run + 1, calls + 1
    assert got[b] == calls, (b, got[b], calls)


@pytest.mark.slow
def test_no_recompilation_for_new_prompt_contents(model, trained):
  sd.blockwise_generate(model, trained, ragged_tokens(2, 9, 512, seed=0), 6)
  with compiles() as programs:
    for seed in (1, 2):
      sd.blockwise_generate(model, trained, ragged_tokens(2, 9, 512, seed=seed), 6)
  assert programs == []


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="an XLA:CPU lowering property")
def test_lattice_top_k_is_not_a_full_sort_in_the_decode_loop(model, trained, bigram):
  """The head lattice's top-k runs XLA's TopK kernel, not a sort of every vocabulary row.

  With the lattice's top-k on its 3-D [B, G, V] operand, XLA:CPU lowered the one inside the
  n-gram-rescored decode loop to a full stable sort (8 ms per round on the demo target);
  `sampling.top_k` gives it a 2-D operand. A sort here means that regression is back.
  """
  from specdec_jax.drafters.head_drafter import HeadDrafter
  enc = ragged_tokens(2, 9, 512, seed=0)
  config = blockwise.round_config(trained, 6, None, 1, 4, 1, "ngram", False, None, False)
  proposer = HeadDrafter(model, trained, lm=bigram, top_k=4, rescoring="ngram")
  hlo = engine.run.lower(model, proposer, enc, None, jax.random.PRNGKey(0),
                         config=config).compile().as_text()
  assert " sort(" not in hlo and "TopK" in hlo


@pytest.mark.slow
def test_save_load_and_wrong_model(model, trained, tmp_path):
  path = sd.save_heads(tmp_path / "model_dir", trained)
  assert path.name == "heads.safetensors"
  again = sd.load_heads(tmp_path / "model_dir", model)
  for j in range(2, 5):
    np.testing.assert_array_equal(again.params[f"head_{j}"]["wi"],
                                  trained.params[f"head_{j}"]["wi"])
  other = sd.init_model(sd.get_config("t5_1_1_tiny"), 7)
  with pytest.raises(sd.InputError, match="heads trained for another model"):
    sd.load_heads(path, other)
  with pytest.raises(sd.InputError, match="heads trained for another model"):
    sd.blockwise_generate(other, trained, ragged_tokens(1, 5, 512), 4)
  (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
  with pytest.raises(sd.CheckpointError, match="not a readable safetensors file"):
    sd.load_heads(tmp_path / "bad.safetensors", model)


@pytest.mark.slow
def test_bad_settings_give_clear_errors(model, trained, bigram):
  enc = ragged_tokens(1, 5, 512)
  for kwargs, message in [
      (dict(num_drafts=0), "num_drafts must be an integer >= 1"),
      (dict(top_k=600), "top_k=600 is above the limit of 64"),   # vocab: test_research_path
      (dict(top_k=2, num_drafts=9), "num_drafts=9 exceeds the 2\\^3 paths"),
      (dict(rescoring="ngram"), "needs a rescorer"),
      (dict(rescoring="beam", rescorer=bigram), "rescoring must be one of"),
      (dict(top_k=2, num_drafts=2, sampling=sd.Sampling()), "sampling with head drafts"),
  ]:
    with pytest.raises(sd.SpecdecError, match=message):
      sd.blockwise_generate(model, trained, enc, 4, **kwargs)
  with pytest.raises(sd.InputError, match="num_heads must be an integer >= 2"):
    sd.init_heads(model, 1)


# ----------------------------------------------------------------------------- exact sampling


def _head_samples(heads, method, length, seed, accept=None, n=None):
  """Head-draft speculative samples of the distribution harness's input (V = 8)."""
  import test_distribution as td
  target, _ = td.models()
  enc = jnp.asarray(np.repeat(td.ENCODER_INPUT, td.ROWS_PER_CALL, axis=0))
  tokens, stats = [], []
  for key in jax.random.split(jax.random.PRNGKey(seed), (n or td.N_SAMPLES) // td.ROWS_PER_CALL):
    out = sd.blockwise_generate(target, heads, enc, length, sampling=method, rng=key,
                                eos_id=-1, accept=accept)
    tokens.append(np.asarray(out.tokens))
    stats.append(jax.tree_util.tree_map(np.asarray, out.stats))
  return np.concatenate(tokens), stats


@pytest.mark.slow
def test_sampling_with_head_drafts_keeps_the_target_distribution():
  """Beyond the paper: q from the heads, the exact rule; same enumeration test as
  test_distribution.py, with the same negative control. (Top-k filtering under the exact
  rule: test_distribution.py's topk3 case.)"""
  import test_distribution as td
  method = td.T1
  target, _ = td.models()
  heads = sd.init_heads(target, 3, rng=5, init_scale=1.0)      # 2 drafts per round
  length = 3
  probs = td.exact_probs(method, length)
  tokens, stats = _head_samples(heads, method, length, seed=31)
  acc = float(np.mean([s["acceptance_rate"] for s in stats]))
  p_value, bins, chi2 = td.gof_pvalue(td.counts_of(tokens), probs)
  td._record("head drafts T1", f"N={len(tokens)}, bins={bins}, chi2={chi2:.1f}, "
             f"p={p_value:.3g}, acceptance={acc:.3f}")
  assert 0.15 < acc < 0.85                      # both branches of the rule ran often
  assert p_value > td.P_PASS
  # The negative control: every draft accepted.
  wrong, _ = _head_samples(heads, method, length, seed=31, accept=td.AcceptAll())
  p_wrong = td.gof_pvalue(td.counts_of(wrong), probs)[0]
  td._record("head drafts, accept-all control", f"p={p_wrong:.3g}")
  assert p_wrong < td.P_FAIL
