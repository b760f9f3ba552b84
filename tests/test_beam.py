"""Beam search (`sd.Beam`, `sd.t5x_compat.beam_search`) against real T5X and an oracle.

Real T5X: tests/fixtures/t5x_tiny_v1_1/beam_reference.npz (its README: `t5x.decoding.
beam_search` through `EncoderDecoderModel.predict_batch_with_aux`, four settings), every
beam's tokens bitwise, scores to 1e-5. T5X's own decoding_test beam cases (toy callbacks:
forced prefixes, initial_index, min_log_prob, max_decode_step) re-expressed against our
drop-in, and the two temperature_sample cases it used to fail (traced topp/temperature,
max_decode_steps_hard_limit). An exhaustive search over a tiny vocabulary; one beam with
no penalty is greedy decoding; batch and padding invariance; errors.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURE_DIR, compiles

import specdec_jax as sd
from specdec_jax.methods import beam, t5x_compat

SETTINGS = ("beam4", "beam4_alpha0", "beam2", "beam4_len16")
EOS = 1


@pytest.fixture(scope="module")
def beam_reference():
  return dict(np.load(FIXTURE_DIR / "beam_reference.npz"))


def _settings(reference, name):
  alpha, beams, width = reference[name + "_settings"]
  return float(alpha), int(beams), int(width)


def test_beam_reproduces_t5x(t5x_model, t5x_reference, beam_reference):
  """All four settings: every beam's tokens bitwise, scores within 1e-5, in T5X's order."""
  enc = t5x_reference["encoder_input_tokens"]
  for name in SETTINGS:
    alpha, beams, width = _settings(beam_reference, name)
    out = sd.decode(t5x_model, sd.Beam(num_beams=beams, alpha=alpha), enc,
                    max_new_tokens=width)
    assert out.beams.shape == (3, beams, width), name
    np.testing.assert_array_equal(out.beams, beam_reference[name + "_tokens"], err_msg=name)
    np.testing.assert_allclose(out.scores, beam_reference[name + "_scores"], rtol=1e-5)
    np.testing.assert_array_equal(out.tokens, beam_reference[name + "_top_tokens"])
    np.testing.assert_allclose(out.scores[:, -1], beam_reference[name + "_top_scores"],
                               rtol=1e-5)
    eos = np.asarray(out.tokens) == EOS
    expected = np.where(eos.any(1), eos.argmax(1) + 1, width)
    np.testing.assert_array_equal(out.lengths, expected)


@pytest.mark.parametrize("name", [
    "beam4", pytest.param("beam2", marks=pytest.mark.slow),
    pytest.param("beam4_alpha0", marks=pytest.mark.slow)])
def test_t5x_compat_beam_search_reproduces_t5x(t5x_model, t5x_reference, beam_reference, name):
  """The drop-in over our cached model, T5X's call as predict_batch_with_aux makes it: each
  setting it passes on (num_decodes, alpha; the width is the inputs' shape). The loop's
  arithmetic at every setting is test_beam_reproduces_t5x's."""
  alpha, beams, width = _settings(beam_reference, name)
  cache = t5x_model.start(jnp.asarray(t5x_reference["encoder_input_tokens"]), capacity=width)
  seqs, scores = jax.jit(lambda c: t5x_compat.beam_search(
      jnp.zeros((3, width), jnp.int32), c, t5x_compat.tokens_to_logits_for(t5x_model),
      eos_id=EOS, num_decodes=beams, alpha=alpha))(cache)
  np.testing.assert_array_equal(seqs, beam_reference[name + "_tokens"])
  np.testing.assert_allclose(scores, beam_reference[name + "_scores"], rtol=1e-5)


# ----------------------------------------------------------------------------- T5X's cases

def _fixed_logits(rows, beams):
  """A callback giving row b the logits rows[b] at every step, whatever its tokens."""
  logits = jnp.repeat(jnp.asarray(rows, jnp.float32), beams, axis=0)

  def tokens_to_logits(state):
    return logits, state.cache
  return tokens_to_logits


TWO_ROWS = [[-1e7, -1e10, -0.1, -0.9], [-1e7, -1e10, -0.9, -0.1]]     # row 0 likes 2, row 1: 3
WIDE = [[-1e7, -1e10, -0.1, -0.9, -1e4, -1e4, -1e4, -1e4],
        [-1e7, -1e10, -0.9, -0.1, -1e4, -1e4, -1e4, -1e4]]
WIDE_EOS = [WIDE[0], [-1e7, -1.0, -0.9, -0.1, -1e4, -1e4, -1e4, -1e4]]   # row 1 may end


def _expected_scores(seqs, rows, forced):
  """Summed log-softmax of each beam's free (not forced, not pad) tokens; alpha 0."""
  out = np.zeros(seqs.shape[:2])
  for b, k in itertools.product(range(seqs.shape[0]), range(seqs.shape[1])):
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(rows[b], jnp.float32)))
    out[b, k] = sum(lp[t] for i, t in enumerate(seqs[b, k]) if i >= forced[b] and t != 0)
  return out


def test_markov_chain_tie_finds_both_paths():
  """A first-order chain (tokens A=1, B=2, start 3, end 4) where A->A and B->B pay +1 on
  odd steps and A<->B on even ones: AABBA and BBAAB tie for the best score; two beams
  find both (T5X's test_beam_search semantics, our own chain)."""
  steps, beams = 7, 2
  pay = np.full((6, 5, 5), beam.NEG_INF)
  same, swap = np.array([[1.0, -1.0], [-1.0, 1.0]]), np.array([[-1.0, 1.0], [1.0, -1.0]])
  for t, edges in zip(range(1, 5), (same, swap, same, swap), strict=True):
    pay[t, 1:3, 1:3] = edges
  pay[0, 3, 1:3] = 0.0          # start -> A or B
  pay[5, 1:3, 4] = 0.0          # A or B -> end
  pay[:, 0, :] = 0.0
  pay = jnp.asarray(pay, jnp.float32)
  start = jnp.full((5,), beam.NEG_INF, jnp.float32).at[3].set(0.0)

  def tokens_to_logits(state):
    t = state.cache["t"]                                         # [B*K] step of each row
    edges = pay[jnp.maximum(t - 1, 0), state.cur_token[:, 0]]     # [B*K, 5]
    return jnp.where((t == 0)[:, None], start, edges), {"t": t + 1}

  seqs, _ = t5x_compat.beam_search(jnp.zeros((2, steps), jnp.int32),
                                   {"t": jnp.zeros((2,), jnp.int32)}, tokens_to_logits,
                                   eos_id=4, num_decodes=beams, alpha=0.0)
  names = "_AB<>"
  found = {"".join(names[t] for t in np.asarray(seqs)[b, k]) for b in range(2) for k in
           range(beams)}
  assert found == {"<AABBA>", "<BBAAB>"}


def test_forced_prefix():
  inputs = np.array([[0, 7, 0, 0, 0], [0, 4, 5, 0, 0]], np.int32)
  seqs, scores = t5x_compat.beam_search(inputs, {}, _fixed_logits(WIDE, 2), EOS,
                                        num_decodes=2, alpha=0.0)
  expected = [[[7, 3, 2, 2, 2], [7, 2, 2, 2, 2]], [[4, 5, 2, 3, 3], [4, 5, 3, 3, 3]]]
  np.testing.assert_array_equal(seqs, expected)
  assert np.all(np.diff(np.asarray(scores)) >= 0)
  np.testing.assert_allclose(scores, _expected_scores(np.array(expected), WIDE, [1, 2]),
                             atol=1e-5)


def test_no_prefix():
  seqs, _ = t5x_compat.beam_search(np.zeros((2, 5), np.int32), {}, _fixed_logits(TWO_ROWS, 2),
                                   EOS, num_decodes=2)
  np.testing.assert_array_equal(
      seqs, [[[3, 2, 2, 2, 2], [2, 2, 2, 2, 2]], [[2, 3, 3, 3, 3], [3, 3, 3, 3, 3]]])


def _prefilled(record):
  """A callback that records what it is given, and a T5X-style flat-key cache."""
  def tokens_to_logits(state):
    record.append(state)
    return _fixed_logits(WIDE_EOS, 2)(state)
  cache = {"cached_bias": np.ones((1, 16), np.float32),
           "decoder/layers_0/self_attention/cached_key": np.ones((2, 16), np.float32),
           "decoder/layers_0/self_attention/cache_index": np.ones((2,), np.float32)}
  return tokens_to_logits, cache


@pytest.mark.slow
@pytest.mark.parametrize("max_step,expected", [
    (-1, [[[7, 3, 2, 2, 2], [7, 2, 2, 2, 2]], [[4, 5, 3, 1, 0], [4, 5, 1, 0, 0]]]),
    # row 0 never finishes (its EOS logit is below NEG_INF): two steps of live beams
    (2, [[[7, 3, 2, 0, 0], [7, 2, 2, 0, 0]], [[4, 5, 3, 1, 0], [4, 5, 1, 0, 0]]])])
def test_prefix_with_initial_index(max_step, expected):
  record = []
  tokens_to_logits, cache = _prefilled(record)
  inputs = np.array([[0, 7, 0, 0, 0], [0, 4, 5, 0, 0]], np.int32)
  with jax.disable_jit():        # to see each call's values
    seqs, scores = t5x_compat.beam_search(inputs, cache, tokens_to_logits, EOS, num_decodes=2,
                                          alpha=0.0, initial_index=np.array([1, 2]),
                                          max_decode_step=max_step)
  np.testing.assert_array_equal(seqs, expected)
  assert np.all(np.diff(np.asarray(scores)) >= 0)
  # Decoding starts from each prompt's last token, on every beam.
  np.testing.assert_array_equal(record[0].cur_token, [[7], [7], [5], [5]])
  first = record[0].cache
  assert first["cached_bias"].shape == (1, 16)                  # never expanded
  assert first["decoder/layers_0/self_attention/cached_key"].shape == (4, 16)
  assert first["decoder/layers_0/self_attention/cache_index"].shape == (4,)
  if max_step < 0:
    np.testing.assert_allclose(scores, _expected_scores(np.array(expected), WIDE_EOS, [1, 2]),
                               atol=1e-5)


def test_min_log_prob_stops_after_one_step():
  seqs, _ = t5x_compat.beam_search(np.zeros((2, 5), np.int32), {}, _fixed_logits(TWO_ROWS, 2),
                                   EOS, num_decodes=2, min_log_prob=-0.05)
  np.testing.assert_array_equal(
      seqs, [[[3, 0, 0, 0, 0], [2, 0, 0, 0, 0]], [[2, 0, 0, 0, 0], [3, 0, 0, 0, 0]]])


def test_max_decode_step():
  seqs, _ = t5x_compat.beam_search(np.zeros((2, 5), np.int32), {}, _fixed_logits(TWO_ROWS, 2),
                                   EOS, num_decodes=2, max_decode_step=2)
  np.testing.assert_array_equal(
      seqs, [[[3, 2, 0, 0, 0], [2, 2, 0, 0, 0]], [[2, 3, 0, 0, 0], [3, 3, 0, 0, 0]]])


def test_prompt_alignment():
  prompts = np.array([[0] * 7, [1, 2, 3, 4, 5, 6, 7], [0, 1] + [0] * 5, [0, 1, 2] + [0] * 4],
                     np.int32)
  right = beam.right_align(prompts)
  np.testing.assert_array_equal(right, [[0] * 7, [1, 2, 3, 4, 5, 6, 7], [0] * 6 + [1],
                                        [0] * 5 + [1, 2]])
  np.testing.assert_array_equal(beam.left_align(right), [[0] * 7, [1, 2, 3, 4, 5, 6, 7],
                                                         [1] + [0] * 6, [1, 2] + [0] * 5])


# ----------------------------------------------------------------------------- temperature_sample

def test_temperature_sample_takes_traced_topp_and_temperature():
  """T5X's dynamic decode parameters: topp, temperature and max_decode_steps traced."""
  logits = jnp.array([[-1.2, -1e7, -2.3, -0.51]], jnp.float32)    # p ~ (0.3, 0, 0.1, 0.6)

  @jax.jit
  def decode(inputs, temperature, topp, steps):
    return t5x_compat.temperature_sample(inputs, {}, lambda s: (logits, s.cache), EOS,
                                         jax.random.PRNGKey(0), temperature=temperature,
                                         topp=topp, topk=0, max_decode_steps=steps)

  seqs, scores = decode(jnp.zeros((1, 20), jnp.int32), 0.8, 0.63, 10)
  np.testing.assert_array_equal(seqs, [[[3] * 10 + [0] * 10]])   # top-p keeps token 3 only
  np.testing.assert_array_equal(scores, [[0.0]])
  seqs, _ = decode(jnp.zeros((1, 20), jnp.int32), 0.8, 0.0, 20)  # topp 0: no cut (control)
  assert set(np.asarray(seqs).ravel().tolist()) != {3}


def test_temperature_sample_hard_limit_clamps_steps():
  logits = jnp.array([[-1e7, -1e7, -1e7, 0.0]] * 2, jnp.float32)
  inputs = np.array([[0, 2, 0, 0, 0, 0, 0, 0], [0, 2, 2, 0, 0, 0, 0, 0]], np.int32)
  seqs, scores = t5x_compat.temperature_sample(
      inputs, {}, lambda s: (logits, s.cache), EOS, jax.random.PRNGKey(0), topk=4,
      max_decode_steps=10, max_decode_steps_hard_limit=4)
  np.testing.assert_array_equal(seqs, [[[2, 3, 3, 3, 3, 0, 0, 0]], [[2, 2, 3, 3, 3, 3, 0, 0]]])
  np.testing.assert_array_equal(scores, [[0.0], [0.0]])
  with pytest.raises(ValueError, match="more steps than the sequence length"):
    t5x_compat.temperature_sample(inputs, {}, lambda s: (logits, s.cache), EOS,
                                  topk=4, max_decode_steps=10)


# ----------------------------------------------------------------------------- oracle

def _markov(vocab, steps, seed):
  """Toy model: next-token logits table[step, last token] [T, V, V]; its callback."""
  table = np.random.default_rng(seed).normal(0, 2.0, (steps, vocab, vocab)).astype(np.float32)

  def tokens_to_logits(state):
    return jnp.asarray(table)[state.cur_index, state.cur_token[:, 0]], state.cache
  return table, tokens_to_logits


def _exhaustive(table, alpha, eos):
  """Every sequence of up to T tokens that ends with EOS (then 0s), scored as T5X scores
  finished beams; sorted ascending: [(score, tokens)]."""
  steps, vocab = table.shape[:2]
  lp = np.asarray(jax.nn.log_softmax(jnp.asarray(table), axis=-1), np.float64)
  found = []
  for n in range(1, steps + 1):
    for body in itertools.product([t for t in range(vocab) if t != eos], repeat=n - 1):
      seq, prev, total = list(body) + [eos], 0, 0.0
      for t, tok in enumerate(seq):
        total, prev = total + lp[t, prev, tok], tok
      found.append((total / ((5.0 + n) / 6.0) ** alpha, seq + [0] * (steps - n)))
  return sorted(found)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_exhaustive_search_agrees_with_vocabulary_wide_beams(alpha):
  """V = 3 (pad, EOS, one word), T = 2, K = V: every prefix stays live, so the beams are
  exactly the exhaustive search's top K finished sequences, tokens and scores."""
  for seed in range(6):
    table, fn = _markov(3, 2, seed)
    seqs, scores = t5x_compat.beam_search(np.zeros((1, 2), np.int32), {}, fn, EOS,
                                          num_decodes=3, alpha=alpha)
    best = _exhaustive(table, alpha, EOS)[-3:]
    np.testing.assert_array_equal(np.asarray(seqs)[0], [s for _, s in best])
    np.testing.assert_allclose(np.asarray(scores)[0], [v for v, _ in best], rtol=1e-5)


def test_wider_search_never_beats_the_oracle_and_scores_are_true():
  """V = 4, T = 4, K = V (not every prefix fits): each returned beam's score is its true
  penalized score, none beats the exhaustive best, and in these draws the best is found."""
  alpha = 0.6
  for seed in range(4):
    table, fn = _markov(4, 4, seed)
    seqs, scores = t5x_compat.beam_search(np.zeros((1, 4), np.int32), {}, fn, EOS,
                                          num_decodes=4, alpha=alpha)
    truth = {tuple(s): v for v, s in _exhaustive(table, alpha, EOS)}
    got = [(float(v), tuple(s)) for v, s in zip(np.asarray(scores)[0], np.asarray(seqs)[0],
                                                         strict=True)]
    for v, s in got:
      np.testing.assert_allclose(v, truth[s], rtol=1e-5)
    assert got[-1][1] == max(truth, key=truth.get)     # the best is found (and not beaten)


# ----------------------------------------------------------------------------- sd.Beam

def test_one_beam_is_greedy(t5x_model, t5x_reference):
  """K = 1 keeps the best non-EOS extension live: with no EOS that is greedy decoding.
  (With EOS, T5X's K = 1 also records a second-ranked EOS as a finished beam, which may
  win: not greedy in general.)"""
  enc = t5x_reference["encoder_input_tokens"]
  out = sd.decode(t5x_model, sd.Beam(num_beams=1), enc, max_new_tokens=10, eos_id=-1)
  np.testing.assert_array_equal(out.tokens, t5x_reference["greedy_tokens_noeos"])
  np.testing.assert_array_equal(out.lengths, [10, 10, 10])


@pytest.mark.slow
def test_batch_and_padding_invariance(t5x_model, t5x_reference, beam_reference):
  """A row alone, its padding cut, gives the batch's beams (the fixture's shortest row)."""
  enc = t5x_reference["encoder_input_tokens"]
  n = int((enc[2] != 0).sum())
  alone = sd.decode(t5x_model, sd.Beam(num_beams=4, alpha=0.6), enc[2:3, :n], max_new_tokens=10)
  np.testing.assert_array_equal(alone.beams[0], beam_reference["beam4_tokens"][2])
  np.testing.assert_allclose(alone.scores[0], beam_reference["beam4_scores"][2], rtol=1e-5)


@pytest.mark.slow
def test_decoder_only_one_beam_is_greedy_and_ragged():
  """A llama-style LM, ragged prompts: K = 1 (no EOS, exact mode's call width) is the
  baseline's greedy output; K = 3 beams are sorted and the best beam is out.tokens."""
  from test_lm_methods import T, pair, prompts
  target, _ = pair()
  greedy = sd.decode(target, sd.Autoregressive(), prompts(), max_new_tokens=T, eos_id=-1)
  out = sd.decode(target, sd.Beam(num_beams=1, exact=True), prompts(), max_new_tokens=T,
                  eos_id=-1)
  np.testing.assert_array_equal(out.tokens, greedy.tokens)
  np.testing.assert_array_equal(out.lengths, greedy.lengths)
  wide = sd.decode(target, sd.Beam(num_beams=3), prompts(), max_new_tokens=T)
  assert wide.beams.shape == (4, 3, T)
  assert np.all(np.diff(np.asarray(wide.scores), axis=1) >= 0)
  np.testing.assert_array_equal(wide.tokens, np.asarray(wide.beams)[:, -1])


@pytest.mark.parametrize("kwargs,match", [
    ({"num_beams": 0}, "num_beams must be an integer >= 1"),
    ({"num_beams": 2.5}, "num_beams must be an integer >= 1"),
    ({"alpha": -0.1}, "alpha .* must be >= 0"),
    ({"alpha": "big"}, "alpha must be a number"),
    ({"exact": "yes"}, "exact must be True, False or None")])
def test_bad_settings(kwargs, match):
  with pytest.raises(sd.SpecdecError, match=match):
    sd.Beam(**kwargs)


def test_beam_with_sampling_is_refused(t5x_model):
  with pytest.raises(sd.SamplingError, match="sd.Beam is deterministic"):
    sd.decode(t5x_model, sd.Beam(), np.array([[5, 6, 1]]), max_new_tokens=3,
              sampling=sd.Sampling(temperature=0.7), rng=0)


# ----------------------------------------------------------------------------- tools

def test_cli_flags_come_from_the_fields(capsys):
  """--num-beams / --alpha / --min-log-prob are sd.Beam's fields (the bench's --beam K:ALPHA:
  the lab's tests/test_bench_method_specs.py); bad values and sampling are refused before
  any model is loaded."""
  import argparse

  from specdec_jax import cli
  from specdec_jax.flags import methods as method_args
  parser = argparse.ArgumentParser()
  method_args.add_method_flags(parser)
  args = parser.parse_args(["--method", "beam", "--num-beams", "3", "--alpha", "0"])
  assert method_args.settings_from_args(args, beam.Beam) == {"num_beams": 3, "alpha": 0.0}
  for argv, message in [(["--num-beams", "0"], "--num-beams must be an integer >= 1"),
                        (["--temperature", "0.7"], "--method beam is deterministic"),
                        (["--gamma", "3"], "--gamma only applies to --method speculative")]:
    code = cli.main(["decode", "--model", "config:t5_1_1_tiny", "--method", "beam", *argv,
                     "5 6 1"])
    assert code != 0 and message in capsys.readouterr().err, argv


@pytest.mark.slow
def test_bfloat16_one_program_per_shape(t5x_model, t5x_reference, beam_reference):
  """bfloat16 params and activations: one compiled program for new prompt contents, scores
  float32 and ascending, 0 after each beam's EOS, and the beams close to float32's (the
  fixture's weights are not bf16-representable: bitwise is not expected)."""
  model = t5x_model.with_dtype("bfloat16")
  enc = np.asarray(t5x_reference["encoder_input_tokens"])
  method = sd.Beam(num_beams=4, alpha=0.6)
  out = sd.decode(model, method, enc, max_new_tokens=10)
  with compiles() as programs:
    other = sd.decode(model, method, np.where(enc > 1, (enc + 1) % 500 + 2, enc),
                      max_new_tokens=10)
  assert programs == []
  assert not np.array_equal(other.beams, out.beams)
  scores, beams = np.asarray(out.scores), np.asarray(out.beams)
  assert scores.dtype == np.float32 and np.all(np.diff(scores, axis=1) >= 0)
  ended = np.cumsum(beams == EOS, axis=2) > 0
  after = np.concatenate([np.zeros_like(ended[..., :1]), ended[..., :-1]], axis=2)
  assert np.all(beams[after] == 0)
  same = np.mean(beams == beam_reference["beam4_tokens"])
  assert same > 0.5, same
