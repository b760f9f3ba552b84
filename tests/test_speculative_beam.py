"""Exact speculative beam search (`experimental.SpeculativeBeam`): `sd.Beam`'s output with any
drafter.

Fast tier, on a table model whose logits depend on the whole prefix (a wrong cache row or
length changes them): a numpy beam search written from T5X's rules over every prefix's
logits (the oracle), `sd.Beam` bitwise, with a perfect, a near and a random drafter, T5X's
stopping settings (min_log_prob, max_decode_step, no EOS), and the negative control (a
replay that skips the "every new beam was scored" check fails). Slow tier, on real tiny
models: ragged batches with EOS mid-row, an odd vocabulary with near-tied logits and a
single beam, the T5X fixture, the packed (width-invariant) path, a tree wider than the
call, the CLI. Exactness in exact mode on a float32 T5 and a bfloat16 LM, ragged, is
tests/test_exact.py's (every method of the registry).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from helpers import FIXTURE_DIR, compiles, ragged_tokens, tiny_target

import specdec_jax as sd
from specdec_jax import testing
from specdec_jax.cache import CrossKV, DecoderCache
from specdec_jax.experimental import SpeculativeBeam, speculative_beam
from specdec_jax.methods import beam

EOS = 1
V = 5            # pad 0, EOS 1, three words
M = 7            # the prefix term's period


# ----------------------------------------------------------------------------- table model

def _tables(seed: int, scale: float = 2.0):
  """Random tables; EOS a little less likely than the words, so that beams run a while."""
  rng = np.random.default_rng(seed)
  t = {name: jnp.asarray(rng.normal(0, scale, shape), jnp.float32) for name, shape in
       (("next", (V, V)), ("pos", (12, V)), ("mix", (M, V)), ("inp", (V, V)))}
  t["next"] = t["next"].at[:, EOS].add(-1.5)
  return t


def _logits(t, last, position, total, ctx):
  """The table model's next-token logits: last token, position, prefix sum, input."""
  return (t["next"][last] + t["pos"][jnp.minimum(position, t["pos"].shape[0] - 1)]
          + t["mix"][total % M] + ctx)


def _context(t, inputs):
  enc = jnp.asarray(inputs)
  return jnp.sum(jnp.where((enc != 0)[..., None], t["inp"][enc], 0.0), axis=1)     # [B, V]


@struct.dataclass
class PrefixTable:
  """A target decoding like a T5 model over a `DecoderCache`: its buffer holds the tokens
  themselves, and the logits at slot p read the SUM of the tokens at slots <= p."""

  t: dict
  is_decoder_only = False
  width_invariant_decode = True

  @property
  def config(self):
    return testing.TableConfig(vocab_size=V)

  def start(self, inputs, capacity, lengths=None):
    batch = inputs.shape[0]
    buf = jnp.zeros((batch, 1, capacity, 1), jnp.float32)
    ctx = _context(self.t, inputs)
    return DecoderCache(self_key=(buf,), self_value=(buf,), length=jnp.zeros((batch,), jnp.int32),
                        cross=CrossKV(key=(ctx,), value=(ctx,), mask=inputs != 0))

  def first_tokens(self, inputs, lengths=None):
    return jnp.zeros((inputs.shape[0],), jnp.int32)

  def decode(self, tokens, cache):
    width, capacity = tokens.shape[1], cache.capacity
    slots = cache.length[:, None] + jnp.arange(width)[None]                # [B, W]
    buf = cache.self_key[0][:, 0, :, 0]
    buf = buf.at[jnp.arange(tokens.shape[0])[:, None], slots].set(tokens, mode="drop")
    total = jnp.sum(jnp.where(jnp.arange(capacity)[None, None] <= slots[..., None],
                              buf[:, None], 0.0), axis=-1).astype(jnp.int32)   # [B, W]
    logits = _logits(self.t, tokens, slots, total, cache.cross.key[0][:, None])
    new = buf[:, None, :, None]
    return logits, cache.replace(self_key=(new,), self_value=(new,),
                                 length=cache.length + width)


@struct.dataclass
class PrefixDrafter:
  """A token-level drafter with the table model's own formula (tables t): given the
  target's tables it is a perfect drafter."""

  t: dict
  kind: str = struct.field(pytree_node=False, default="table")

  @property
  def vocab_size(self):
    return V

  def init(self, inputs, capacity, lengths=None):
    batch = inputs.shape[0]
    zero = jnp.zeros((batch,), jnp.int32)
    return (zero, zero, _context(self.t, inputs))       # (position, sum, input)

  def first(self, state, seq, n):
    total = jnp.sum(jnp.where(jnp.arange(seq.shape[1])[None] <= n[:, None], seq, 0), axis=1)
    last = jnp.take_along_axis(seq, n[:, None], axis=1)[:, 0]
    return _logits(self.t, last, n, total, state[2]), (n, total, state[2])

  def next(self, state, token):
    position, total = state[0] + 1, state[1] + token
    return _logits(self.t, token, position, total, state[2]), (position, total, state[2])


def oracle(t, inputs, num_beams, steps, alpha, eos=EOS, min_log_prob=beam.NEG_INF,
           max_decode_step=-1):
  """T5X's beam search in numpy over the table model's logits of every prefix (computed
  from the formula, no cache). Its float32 arithmetic is T5X's, op for op; log-probs and
  penalties come from jax (the same functions `beam.step` calls)."""
  enc = np.asarray(inputs)
  batch, k, neg = enc.shape[0], num_beams, np.float32(beam.NEG_INF)
  ctx = np.asarray(_context(t, enc))
  tab = {name: np.asarray(x) for name, x in t.items()}
  penalty = lambda n: np.float32(beam.brevity_penalty(alpha, jnp.asarray(n, jnp.int32)))
  bound = penalty(steps + 1)
  live_lp = np.tile(np.array([0.0] + [beam.NEG_INF] * (k - 1), np.float32), (batch, 1))
  live = np.zeros((batch, k, steps + 1), np.int64)
  fin_scores = np.full((batch, k), neg, np.float32)
  fin = np.zeros_like(live)
  flags = np.zeros((batch, k), bool)

  def top(values, n):               # lax.top_k: largest first, ties to the lower index
    return np.argsort(-values, kind="stable")[:n]

  index = 0
  while True:
    best = live_lp[:, -1] / bound
    worst = np.where(flags, fin_scores.min(axis=1, keepdims=True), neg)
    settled = np.all(worst > best[:, None])
    hopeless = np.all(best < np.float32(min_log_prob) / bound) and index > 0
    if (index >= steps or settled or hopeless
        or (max_decode_step > 0 and index >= max_decode_step)):
      break
    # Every live prefix's logits from the formula (numpy float32 adds: XLA's, op for op).
    prefix = live[:, :, :index + 1]
    logits = (tab["next"][prefix[..., -1]] + tab["pos"][min(index, len(tab["pos"]) - 1)]
              + tab["mix"][prefix.sum(-1) % M] + ctx[:, None])
    log_probs = np.asarray(jax.nn.log_softmax(jnp.asarray(logits))) + live_lp[..., None]
    for b in range(batch):
      lp = log_probs[b].reshape(-1)                                         # [K * V]
      cand = top(lp, 2 * k)
      ids, parents, cand_lp = cand % V, cand // V, lp[cand]
      seqs = live[b, parents].copy()
      seqs[:, index + 1] = ids
      ended = ids == eos
      alive_lp = (cand_lp + ended * neg).astype(np.float32)
      keep = top(alive_lp, k)[::-1]
      scores = (cand_lp / penalty(index + 1) + (~ended) * neg).astype(np.float32)
      pool = np.concatenate([fin_scores[b], scores])
      pick = top(pool, k)[::-1]
      fin_seqs = np.concatenate([fin[b], seqs])[pick]
      fin_flags = np.concatenate([flags[b], ended])[pick]
      live_lp[b], live[b] = alive_lp[keep], seqs[keep]
      fin_scores[b], fin[b], flags[b] = pool[pick], fin_seqs, fin_flags
    index += 1
  done = flags.any(axis=1)
  seqs = np.where(done[:, None, None], fin, live)[:, :, 1:]
  return seqs, np.where(done[:, None], fin_scores, live_lp)


def _config(num_beams, steps, alpha, eos=EOS, **kwargs):
  return beam.SearchConfig(num_beams=num_beams, alpha=alpha, eos_id=eos,
                           max_decode_len=steps + 1, **kwargs)


ENC = np.array([[2, 3, 4, 1], [4, 1, 0, 0], [3, 3, 1, 0]], np.int32)


def _drafters(t, seed):
  near = {name: x + 0.3 * jnp.asarray(np.random.default_rng(seed + 50).normal(size=x.shape),
                                      jnp.float32) for name, x in t.items()}
  random = np.random.default_rng(seed + 99).normal(size=(V, V)).astype(np.float32)
  return {"perfect": PrefixDrafter(t), "near": PrefixDrafter(near),
          "random": testing.table_drafter(random)}


def test_small_search_matches_the_oracle():
  """The fast tier's check (one compiled program): K = 2, a perfect drafter, the oracle's
  beams and scores, more than one step per target call."""
  t = _tables(0)
  expected, scores = oracle(t, ENC, 2, 4, 0.6)
  out = speculative_beam.run(PrefixTable(t), PrefixDrafter(t), ENC, config=_config(2, 4, 0.6),
                             gamma=2)
  np.testing.assert_array_equal(out.beams, expected)
  np.testing.assert_allclose(out.scores, scores, rtol=1e-6)
  assert out.stats["steps"] > out.stats["rounds"], out.stats


@pytest.mark.parametrize("n", [3, 7])
def test_two_stage_top_nodes_is_the_flat_top_k_ties_included(n):
  """The tree's two-stage top-k (each node's best n, then the best n of those) picks and
  orders (node, token) pairs as `lax.top_k` over the flat [B, K*V] lattice: on a lattice
  of few distinct values (many ties, -inf among them) its values, nodes and tokens are
  the flat one's, so the drafted tree is the one-stage search's. No model, no decode."""
  scores = np.random.default_rng(n).integers(0, 4, size=(3, 4, 9)).astype(np.float32)
  scores[:, :, 1] = -np.inf                                      # EOS excluded, as drafted
  values, flat = jax.lax.top_k(jnp.asarray(scores).reshape(3, -1), n)
  got = speculative_beam._top_nodes(jnp.asarray(scores), n)
  np.testing.assert_array_equal(got[0], values)
  np.testing.assert_array_equal(got[1], flat // 9)
  np.testing.assert_array_equal(got[2], flat % 9)


@pytest.mark.slow
@pytest.mark.parametrize("num_beams,alpha,gamma", [(2, 0.6, 3), (3, 2.0, 4)])
def test_table_model_matches_the_oracle_and_beam(num_beams, alpha, gamma):
  """Every drafter: beams and lengths bitwise `beam.run`'s and the oracle's, scores equal;
  a perfect drafter commits more than one step per target call; new tables and drafters
  of the same shapes compile nothing new."""
  steps, taken, calls = 7, 0, 0
  config = _config(num_beams, steps, alpha)
  with compiles() as programs:
    for seed in range(3):
      if seed == 1:              # seed 0 compiled every program; the others compile none
        first = len(programs)
      t = _tables(seed)
      target = PrefixTable(t)
      expected, scores = oracle(t, ENC, num_beams, steps, alpha)
      ref = beam.run(target, ENC, config=config)
      np.testing.assert_array_equal(ref.beams, expected)
      assert np.any(expected == EOS) and int(ref.counters.rounds) >= 4
      for name, drafter in _drafters(t, seed).items():
        out = speculative_beam.run(target, drafter, ENC, config=config, gamma=gamma)
        np.testing.assert_array_equal(out.beams, expected, err_msg=f"{seed} {name}")
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        np.testing.assert_array_equal(out.lengths, ref.lengths)
        np.testing.assert_allclose(out.scores, scores, rtol=1e-6)
        np.testing.assert_array_equal(out.scores, ref.scores)
        stats = out.stats
        assert stats["steps"] == int(ref.counters.rounds)          # T5X's loop iterations
        assert stats["rounds"] <= stats["steps"]
        if name == "perfect":
          taken, calls = taken + stats["steps"], calls + stats["rounds"]
  assert taken > calls, (taken, calls)      # the perfect drafter: > 1 step per call
  assert programs[first:] == []


@pytest.mark.slow
def test_stopping_settings_and_no_eos():
  """min_log_prob (rows turn hopeless at different steps: T5X stops them all together,
  so a row hopeless alone goes on), max_decode_step, and no EOS at all: T5X's stops.
  (A replay that stops each row on its own flags fails here.)"""
  t = _tables(2)
  target, steps = PrefixTable(t), 8
  enc = np.concatenate([ENC, [[4, 4, 2, 1]]])
  drafters = _drafters(t, 2)
  for kwargs, eos in [({"min_log_prob": -1.5}, EOS), ({"min_log_prob": -5.0}, EOS),
                      ({"max_decode_step": 3}, EOS), ({}, -1)]:
    config = _config(3, steps, 0.6, eos=eos, **kwargs)
    expected, _ = oracle(t, enc, 3, steps, 0.6, eos=eos, **kwargs)
    ref = beam.run(target, enc, config=config)
    np.testing.assert_array_equal(ref.beams, expected)
    for name in ("perfect", "near"):        # one program: the drafter type of the tables
      out = speculative_beam.run(target, drafters[name], enc, config=config, gamma=3)
      np.testing.assert_array_equal(out.beams, ref.beams, err_msg=str(kwargs))
      np.testing.assert_array_equal(out.lengths, ref.lengths, err_msg=str(kwargs))
      assert out.stats["steps"] == int(ref.counters.rounds), kwargs


@pytest.mark.slow
def test_any_number_of_chains():
  """M = K chains (one per beam) and M = 3K, a first level of K and 2K nodes: the same
  beams; the perfect drafter's tree covers more levels with more chains."""
  t = _tables(2)
  target, config = PrefixTable(t), _config(3, 7, 0.6)
  ref = beam.run(target, ENC, config=config)
  per_call = {}
  drafters = _drafters(t, 2)
  for chains, width in ((3, 3), (9, 6), (9, 3)):
    for name in ("perfect", "near"):        # one program per (chains, width)
      drafter = drafters[name]
      out = speculative_beam.run(target, drafter, ENC, config=config, gamma=3, chains=chains,
                                 width=width)
      np.testing.assert_array_equal(out.beams, ref.beams, err_msg=f"{chains} {name}")
      np.testing.assert_array_equal(out.scores, ref.scores)
      if name == "perfect":
        per_call[chains, width] = out.stats["steps_per_target_call"]
  assert per_call[9, 6] > per_call[3, 3] >= 1.0, per_call


@pytest.mark.slow
def test_negative_control_a_replay_without_the_scored_check_fails():
  """Skipping the "every new beam was scored" check (each beam reads its parent chain's
  next logits) changes the beams: the equality tests above would catch it."""
  differs = 0
  for seed in range(3):
    t = _tables(seed)
    target, config = PrefixTable(t), _config(3, 7, 0.6)
    ref = beam.run(target, ENC, config=config)
    for drafter in _drafters(t, seed).values():
      good = speculative_beam.run(target, drafter, ENC, config=config, gamma=3)
      np.testing.assert_array_equal(good.beams, ref.beams)
      wrong = speculative_beam.run(target, drafter, ENC, config=config, gamma=3,
                                   check_scored=False)
      differs += not np.array_equal(wrong.beams, ref.beams)
  assert differs >= 6, differs


@pytest.mark.parametrize("kwargs,match", [
    ({"num_beams": 0}, "num_beams must be an integer >= 1"),
    ({"gamma": 0}, "gamma must be an integer >= 1"),
    ({"alpha": -0.1}, "alpha .* must be >= 0"),
    ({"min_log_prob": "low"}, "min_log_prob must be a number"),
    ({"exact": "yes"}, "exact must be True, False or None"),
    ({"gamma": 16, "exact": True}, "exact mode verifies at most 15"),
    ({"num_beams": 4, "chains": 3}, "chains must be >= num_beams"),
    ({"num_beams": 4, "width": 2}, "width must be >= num_beams")])
def test_bad_settings(kwargs, match):
  with pytest.raises(sd.InputError, match=match):
    SpeculativeBeam(None, **kwargs)


def test_a_sampled_request_names_the_type_where_users_find_it():
  """`experimental.SpeculativeBeam`, not an `sd.SpeculativeBeam` that does not exist."""
  target = sd.init_model(sd.get_config("t5_1_1_tiny"), 0)
  with pytest.raises(sd.SamplingError, match=r"^experimental\.SpeculativeBeam is determ"):
    sd.decode(target, SpeculativeBeam(target), np.array([[5, 6, 1]]), max_new_tokens=3,
              sampling=sd.Sampling(temperature=0.7), rng=0)


@pytest.mark.slow
def test_refusals():
  model = sd.load("config:t5_1_1_tiny")
  enc = np.array([[5, 6, 1]])
  with pytest.raises(sd.SamplingError, match="is deterministic"):
    sd.decode(model, SpeculativeBeam(model), enc, max_new_tokens=3,
              sampling=sd.Sampling(temperature=0.7), rng=0)
  with pytest.raises(sd.InputError, match="needs a drafter"):
    sd.decode(model, SpeculativeBeam(None), enc, max_new_tokens=3)
  with pytest.raises(sd.InputError, match="early exit"):
    sd.decode(model, SpeculativeBeam(sd.early_exit(model, 1)), enc, max_new_tokens=3)
  assert SpeculativeBeam(model, gamma=2) == SpeculativeBeam(None, gamma=2)
  unpacked = sd.init_model(sd.get_config("t5_1_1_tiny"), 1)
  with pytest.raises(sd.InputError, match="one chain per beam"):
    sd.decode(unpacked, SpeculativeBeam(unpacked, num_beams=2, chains=4, exact=True), enc,
              max_new_tokens=3)


# ----------------------------------------------------------------------------- real models

def _assert_same(out, ref, what):
  np.testing.assert_array_equal(out.beams, ref.beams, err_msg=what)
  np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=what)
  np.testing.assert_array_equal(out.lengths, ref.lengths, err_msg=what)
  np.testing.assert_allclose(out.scores, ref.scores, rtol=1e-6, err_msg=what)


def _odd_vocabulary_model(seed=1, vocab=37, scale=0.4):
  """A t5_1_1_tiny with 37 tokens and flat logits: near-tied beams, EOS now and then."""
  config = dataclasses.replace(sd.get_config("t5_1_1_tiny"), vocab_size=vocab)
  model = sd.init_model(config, seed)
  params = jax.tree_util.tree_map(lambda x: x, model.params)
  params["decoder"]["logits_dense"]["kernel"] = params["decoder"]["logits_dense"]["kernel"] * scale
  return model.replace(params=params)


@pytest.mark.slow
def test_odd_vocabulary_near_ties_and_a_single_beam():
  """V = 37, flat logits (near ties), K = 1 (a first level of 2 nodes), gamma 5, batch 4.
  (Odd K > 1: the table model's K = 3 against the oracle.)"""
  target = _odd_vocabulary_model()
  enc, steps = ragged_tokens(4, 8, 37, seed=2), 10
  ref = sd.decode(target, sd.Beam(num_beams=1, alpha=0.6, exact=True), enc,
                  max_new_tokens=steps)
  for name, drafter in [("self", target), ("other", _odd_vocabulary_model(seed=4))]:
    out = sd.decode(target, SpeculativeBeam(drafter, num_beams=1, gamma=5, exact=True),
                    enc, max_new_tokens=steps)
    _assert_same(out, ref, name)


@pytest.mark.slow
def test_packed_target_needs_no_padding():
  """A width-invariant (packed, cpu kernels) target: the default (exact=None) verify call
  of gamma + 1 tokens gives `sd.Beam()`'s beams bitwise."""
  target = sd.pack(tiny_target(6.0, 3.0))
  assert target.width_invariant_decode
  enc, steps = ragged_tokens(3, 10, 512, seed=3), 10
  ref = sd.decode(target, sd.Beam(num_beams=4), enc, max_new_tokens=steps)
  out = sd.decode(target, SpeculativeBeam(target, num_beams=4, gamma=3), enc,
                  max_new_tokens=steps)
  _assert_same(out, ref, "packed")
  assert out.stats["steps_per_target_call"] > 1.0


@pytest.mark.slow
def test_reproduces_t5x(t5x_model, t5x_reference):
  """The real-T5X fixture (tests/test_beam.py reads it alike): every beam bitwise T5X's,
  scores within 1e-5, with the target as drafter and a random one."""
  reference = dict(np.load(FIXTURE_DIR / "beam_reference.npz"))
  enc = t5x_reference["encoder_input_tokens"]
  for name in ("beam4", "beam2"):
    alpha, beams, width = reference[name + "_settings"]
    for drafter in (t5x_model, sd.init_model(t5x_model.config, 3)):
      out = sd.decode(t5x_model, SpeculativeBeam(drafter, num_beams=int(beams),
                                                    alpha=float(alpha), exact=True),
                      enc, max_new_tokens=int(width))
      np.testing.assert_array_equal(out.beams, reference[name + "_tokens"], err_msg=name)
      np.testing.assert_allclose(out.scores, reference[name + "_scores"], rtol=1e-5)
      np.testing.assert_array_equal(out.tokens, reference[name + "_top_tokens"])


@pytest.mark.slow
def test_token_level_drafters():
  """An n-gram drafter (fit on the answer) and prompt lookup draft for beams too."""
  t = _tables(3)
  target, config = PrefixTable(t), _config(3, 6, 0.6)
  ref = beam.run(target, ENC, config=config)
  ngram = sd.NGramDrafter.fit([list(r) for r in np.asarray(ref.tokens)], V)
  for drafter in (ngram, sd.PromptLookupDrafter(V)):
    out = speculative_beam.run(target, drafter, ENC, config=config, gamma=2)
    np.testing.assert_array_equal(out.beams, ref.beams, err_msg=type(drafter).__name__)
    np.testing.assert_array_equal(out.lengths, ref.lengths)


@pytest.mark.slow
def test_a_tree_wider_than_the_call_is_drafted_and_replayed():
  """K=4 beams, gamma=2: the tree's first level (2K=8 nodes) is wider than the call
  (gamma+1=3 tokens); the two widths are separate settings (a bug once drew the tree at the
  call's width, less than K, and failed to reshape)."""
  target = sd.load("config:t5_1_1_tiny")
  enc = np.array([[5, 6, 7, 1], [9, 8, 1, 0]], np.int32)
  ref = sd.decode(target, sd.Beam(num_beams=4), enc, max_new_tokens=5)
  out = sd.decode(target, SpeculativeBeam(target, num_beams=4, gamma=2), enc,
                  max_new_tokens=5)
  np.testing.assert_array_equal(np.asarray(out.beams), np.asarray(ref.beams))
  assert out.stats["drafted"] == (8 + 4 * 1) * out.stats["target_calls"]
  # Deeper levels wider than K and than the first (`run`'s deep_width): leaves the chains
  # reach through their parents' drafter states; the same beams.
  config = beam.SearchConfig(num_beams=4, alpha=0.6, eos_id=1, max_decode_len=6)
  deep = speculative_beam.run(target, target, enc, config=config, gamma=2, chains=20,
                              deep_width=12)
  np.testing.assert_array_equal(np.asarray(deep.beams), np.asarray(ref.beams))
  assert deep.stats["drafted"] == (8 + 12 * 1) * deep.stats["target_calls"]


@pytest.mark.slow
def test_cli_method_beam_with_a_drafter_is_speculative_beam_search(capsys):
  """`specdec decode --method beam --drafter X` runs experimental.SpeculativeBeam (its value
  says so: `with_drafter_for`) and prints the same beams' best tokens as `--method beam`.
  `--json` over two batches (--batch-size 1) carries the method's own statistics: steps
  are `--method beam`'s calls over the corpus, steps per target call total steps over
  total rounds, drafted nodes per round the tree's (2K + K (gamma - 1)), acceptance by
  depth one per drafted depth (the statistics once dropped the per-call ones)."""
  import json

  from specdec_jax.cli import main
  argv = ["decode", "--model", "config:t5_1_1_tiny", "--method", "beam", "--num-beams", "2",
          "--max-new-tokens", "8", "--batch-size", "1", "--no-warmup", "--json", "5 6 7 1",
          "9 8 1"]
  assert main(argv) == 0
  plain = json.loads(capsys.readouterr().out)
  assert main([*argv, "--drafter", "config:t5_1_1_tiny", "--gamma", "2"]) == 0
  drafted = json.loads(capsys.readouterr().out)
  assert plain["settings"]["method"] == "beam"
  assert drafted["settings"]["method"] == "speculative-beam"
  assert drafted["outputs"] == plain["outputs"]
  plain, stats = plain["stats"], drafted["stats"]
  assert stats["steps"] == plain["rounds"] and stats["rounds"] < stats["steps"]
  assert stats["steps_per_target_call"] == stats["steps"] / stats["rounds"]
  assert stats["drafted_nodes_per_round"] == 2 * 2 + 2 * (2 - 1)
  assert stats["acceptance_by_depth"] == [n / stats["target_calls"]
                                          for n in stats["per_position_accepted"]]
  assert len(stats["acceptance_by_depth"]) == 2
