"""Tests for specdec_jax.drafters.lattice: the backoff n-gram LM and the k-best lattice DP."""

import functools
import itertools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.drafters import lattice as L
from specdec_jax.errors import InputError, SpecdecError

# The lattice's rescoring is blockwise decoding's: the full suite's, not the fast tier's
# (CONTRIBUTING's tiers).
pytestmark = pytest.mark.slow

# The hand-worked corpus: V = 5, D = 1/2, epsilon = 1 (add-one unigrams).
CORPUS = [[1, 2, 1], [1, 3], [2, 3]]


def dense_reference(sequences, vocab, order, discount, epsilon):
  """The same estimator written densely and independently: P [V, V] or [V, V, V] (float64)."""
  unigram = np.zeros(vocab)
  counts = {2: np.zeros((vocab,) * 2), 3: np.zeros((vocab,) * 3)}
  for seq in sequences:
    unigram += np.bincount(np.asarray(seq, int), minlength=vocab)
    hist = [0] * (order - 1) + list(seq)
    for t in range(order - 1, len(hist)):
      counts[2][hist[t - 1], hist[t]] += 1
      if order == 3:
        counts[3][hist[t - 2], hist[t - 1], hist[t]] += 1
  p_uni = (unigram + epsilon) / (unigram.sum() + epsilon * vocab)
  p2 = _dense_backoff(counts[2], np.broadcast_to(p_uni, (vocab, vocab)), discount)
  if order == 2:
    return p2
  return _dense_backoff(counts[3], np.broadcast_to(p2, (vocab,) * 3), discount)


def _dense_backoff(counts, lower, discount):
  vocab = counts.shape[-1]
  with np.errstate(divide="ignore", invalid="ignore"):
    total = counts.sum(-1, keepdims=True)
    seen = counts > 0
    distinct = seen.sum(-1, keepdims=True)
    d = np.where(distinct == vocab, 0.0, discount)
    alpha = d * distinct / total / (1.0 - (lower * seen).sum(-1, keepdims=True))
    p = np.where(seen, (counts - d) / total, alpha * lower)
  return np.where(total > 0, p, lower)


def dense_from_lm(lm, order):
  return np.exp(np.asarray(_dense_log_probs(lm, order), np.float64))


@functools.partial(jax.jit, static_argnums=1)   # one compile, not one per eager operation
def _dense_log_probs(lm, order):
  r = jnp.arange(lm.vocab_size)
  if order == 2:
    return lm.log_prob(r[:, None], r[None])
  return lm.log_prob(r[:, None, None], r[None, :, None], r[None, None])


def random_corpus(seed, vocab, n_seq=12, length=25):
  rng = np.random.default_rng(seed)
  weights = rng.dirichlet(np.full(vocab, 0.5))     # skewed: repeated n-grams, unseen ones
  return [rng.choice(vocab, size=rng.integers(0, length), p=weights) for _ in range(n_seq)]


@pytest.fixture(scope="module")
def lms():
  corpus = random_corpus(0, 12)
  return {order: L.NGramLM.fit(corpus, 12, order=order, discount=0.6) for order in (2, 3)}


@pytest.fixture(scope="module")
def dense_lms(lms):
  return {order: dense_from_lm(lm, order) for order, lm in lms.items()}


# --------------------------------------------------------------------------------------
# The LM
# --------------------------------------------------------------------------------------


def test_bigram_by_hand():
  # Unigram counts (real tokens only): c(1) = 3, c(2) = 2, c(3) = 2, N = 7.
  # Add-one: P_uni = (c + 1) / (7 + 5) = [1, 4, 3, 3, 1] / 12.
  # Bigrams (start token 0 first): (0,1) x2, (1,2), (2,1), (1,3), (0,2), (2,3).
  lm = L.NGramLM.fit(CORPUS, 5, order=2, discount=0.5, epsilon=1.0)
  p = dense_from_lm(lm, 2)
  np.testing.assert_allclose(np.exp(lm.unigram), np.array([1, 4, 3, 3, 1]) / 12, rtol=1e-6)
  # Context 0: c(0) = 3, seen 1 (x2), 2 (x1): P(1|0) = 1.5/3 = 1/2, P(2|0) = 0.5/3 = 1/6.
  # Left over 1 - 2/3 = 1/3 (= D n(0) / c(0)); unseen P_uni mass 1 - 7/12 = 5/12
  # -> alpha(0) = (1/3) / (5/12) = 4/5: P(0|0) = P(4|0) = 4/5 * 1/12 = 1/15, P(3|0) = 1/5.
  np.testing.assert_allclose(p[0], [1 / 15, 1 / 2, 1 / 6, 1 / 5, 1 / 15], rtol=1e-6)
  # Context 1: c(1) = 2, seen 2, 3 once each: 0.5/2 = 1/4 each; left over 1/2, unseen mass
  # 1 - 6/12 = 1/2 -> alpha(1) = 1: P(0|1) = P(4|1) = 1/12, P(1|1) = 4/12.
  np.testing.assert_allclose(p[1], [1 / 12, 1 / 3, 1 / 4, 1 / 4, 1 / 12], rtol=1e-6)
  # Context 2: c(2) = 2, seen 1, 3: 1/4 each; left over 1/2, unseen mass 1 - 7/12 = 5/12
  # -> alpha(2) = 6/5: P(0|2) = P(4|2) = 6/5 * 1/12 = 1/10, P(2|2) = 6/5 * 3/12 = 3/10.
  np.testing.assert_allclose(p[2], [1 / 10, 1 / 4, 3 / 10, 1 / 4, 1 / 10], rtol=1e-6)
  np.testing.assert_allclose(np.exp(lm.bigram_log_alpha[:3]), [4 / 5, 1, 6 / 5], rtol=1e-6)
  # Contexts 3 and 4 never precede a token: unseen -> P_uni.
  np.testing.assert_allclose(p[3], np.array([1, 4, 3, 3, 1]) / 12, rtol=1e-6)
  np.testing.assert_allclose(p[4], p[3], rtol=1e-6)


@pytest.mark.slow
def test_trigram_by_hand():
  # Each sequence preceded by 0 0; trigrams ending at real tokens: (0,0,1) x2, (0,1,2),
  # (1,2,1), (0,1,3), (0,0,2), (0,2,3). The bigram part is test_bigram_by_hand's.
  lm = L.NGramLM.fit(CORPUS, 5, order=3, discount=0.5, epsilon=1.0)
  p = dense_from_lm(lm, 3)
  # Context (1, 2): c = 1, seen 1 once: P(1|1,2) = 0.5/1 = 1/2; left over 1/2. Lower-order
  # mass of the seen word: P(1|2) = 1/4 -> alpha(1,2) = (1/2) / (3/4) = 2/3, so
  # P(w|1,2) = 2/3 P(w|2) = 2/3 [1/10, -, 3/10, 1/4, 1/10] = [1/15, -, 1/5, 1/6, 1/15].
  np.testing.assert_allclose(p[1, 2], [1 / 15, 1 / 2, 1 / 5, 1 / 6, 1 / 15], rtol=1e-6)
  # Context (0, 0): c = 3, seen 1 (x2), 2 (x1): 1/2 and 1/6 as in context 0 of the bigram,
  # left over 1/3; lower mass P(1|0) + P(2|0) = 2/3 -> alpha = (1/3) / (1/3) = 1.
  np.testing.assert_allclose(p[0, 0], [1 / 15, 1 / 2, 1 / 6, 1 / 5, 1 / 15], rtol=1e-6)
  # Context (2, 1) never precedes a token: unseen -> the bigram P(.|1).
  np.testing.assert_allclose(p[2, 1], [1 / 12, 1 / 3, 1 / 4, 1 / 4, 1 / 12], rtol=1e-6)
  # A bigram query on the trigram LM is its bigram part.
  np.testing.assert_allclose(np.exp(lm.log_prob(2, 2)), 3 / 10, rtol=1e-6)


@pytest.mark.parametrize("order", [2, 3])
@pytest.mark.parametrize("vocab,seed", [(12, 1), (4, 2)])   # V = 4: contexts that see every token
def test_sparse_lm_equals_dense_reference_and_normalises(order, vocab, seed):
  corpus = random_corpus(seed, vocab, n_seq=20, length=40)
  lm = L.NGramLM.fit(corpus, vocab, order=order, discount=0.7, epsilon=0.05)
  got = dense_from_lm(lm, order)
  np.testing.assert_allclose(got, dense_reference(corpus, vocab, order, 0.7, 0.05), rtol=2e-6)
  np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)    # every context, seen or unseen
  assert (got > 0).all()
  if vocab == 4:                                             # some context saw all 4 tokens
    pairs = {(a, b) for seq in corpus for a, b in zip([0] + list(seq), seq, strict=False)}
    assert any(all((v, w) in pairs for w in range(vocab)) for v in range(vocab))


def test_full_context_keeps_its_counts():
  # After 1 come 0, 1, 2 (V = 3): nothing unseen to back off to, so no discount.
  lm = L.NGramLM.fit([[1, 0], [1, 1, 2], [1, 2]], 3, discount=0.5)
  # Context 1 counts: (1,0), (1,1), (1,2) x2 -> 1/4, 1/4, 1/2.
  np.testing.assert_allclose(dense_from_lm(lm, 2)[1], [0.25, 0.25, 0.5], rtol=1e-6)


def test_log_prob_broadcasts_and_checks_arity(lms):
  lm = lms[2]
  out = lm.log_prob(jnp.array([[1], [2]]), jnp.array([3, 4, 5]))
  assert out.shape == (2, 3) and out.dtype == jnp.float32
  np.testing.assert_allclose(out[1, 2], lm.log_prob(2, 5))
  with pytest.raises(InputError, match="1 to 2 token arrays"):
    lm.log_prob(1, 2, 3)


@pytest.mark.slow
def test_large_vocabulary_is_sparse():
  rng = np.random.default_rng(3)
  lm = L.NGramLM.fit([rng.integers(0, 32128, 500)], 32128, order=3)
  for table, width in [(lm.bigrams, 2), (lm.trigrams, 3), (lm.contexts, 2)]:
    assert table.keys.shape[1] == width and table.keys.shape[0] <= 4 * 500 + table.window
  assert np.isfinite(np.asarray(lm.log_prob(32127, 32127, jnp.arange(32128)))).all()


@pytest.mark.slow
@pytest.mark.parametrize("width", [1, 2, 3])
def test_sparse_table_finds_present_rows_only(width):
  rng = np.random.default_rng(width)
  rows = np.unique(rng.integers(0, 50, (3000, width)), axis=0)
  present, absent = rows[::2], rows[1::2]
  table = L.SparseTable.build(present, np.arange(len(present), dtype=np.float32))
  lookup = jax.jit(lambda table, rows: table.lookup(rows))
  found, value = lookup(table, jnp.asarray(present, jnp.int32))
  assert np.all(found) and np.array_equal(value, np.arange(len(present)))
  found, value = lookup(table, jnp.asarray(absent, jnp.int32))
  assert not np.any(found) and not np.any(value)
  assert table.window <= 16                                  # displacement stays small


# --------------------------------------------------------------------------------------
# The lattice DP against brute force
# --------------------------------------------------------------------------------------


def random_lattice(seed, batch, width, k, vocab=12, integer=False):
  rng = np.random.default_rng(seed)
  if integer:                                       # exact ties in float32
    head = -rng.integers(0, 3, (batch, width, k)).astype(np.float32)
  else:
    head = np.log(rng.dirichlet(np.ones(vocab), (batch, width)))[..., :k].astype(np.float32)
  tokens = np.stack([[rng.permutation(vocab)[:k] for _ in range(width)] for _ in range(batch)])
  prev, prev2 = rng.integers(0, vocab, batch), rng.integers(0, vocab, batch)
  return head, tokens.astype(np.int32), prev.astype(np.int32), prev2.astype(np.int32)


def brute_force(head, tokens, prev, prev2, dense_lm, order, weight):
  """All k^G paths of each row, best first, ties by arc tuple (itertools.product order)."""
  batch, width, k = head.shape
  arcs = np.array(list(itertools.product(range(k), repeat=width)))        # [k^G, G] lex
  cols = np.arange(width)
  out = []
  for b in range(batch):
    score = head[b, cols, arcs].astype(np.float64).sum(-1)
    if dense_lm is not None:
      toks = tokens[b, cols, arcs]
      hist = np.concatenate([np.full((len(arcs), 1), prev2[b]), np.full((len(arcs), 1), prev[b]),
                             toks], axis=1)
      for j in range(width):
        ctx = (hist[:, j + 1],) if order == 2 else (hist[:, j], hist[:, j + 1])
        score = score + weight * np.log(dense_lm[ctx + (hist[:, j + 2],)])
    order_ = np.argsort(-score, kind="stable")
    out.append((arcs[order_], score[order_]))
  return out


# One compile per shape (eager calls compile each operation apart: slower from a cold cache)
best_arcs = jax.jit(L.best_arcs, static_argnames="num_paths")
best_paths = jax.jit(L.best_paths, static_argnames="num_paths")
# (batch, G, k, p): one column with p > k^G; p = 1 (the Viterbi path); p < k^G; p = k^G
CASES = [(1, 1, 3, 5), (2, 3, 4, 1), (2, 3, 4, 7), (3, 4, 3, 16), (1, 5, 2, 32), (1, 3, 6, 16)]


@pytest.mark.parametrize("batch,width,k,p", CASES)
@pytest.mark.parametrize("order", [None, 2, 3])
def test_best_paths_match_brute_force(lms, dense_lms, batch, width, k, p, order):
  lm, dense = (None, None) if order is None else (lms[order], dense_lms[order])
  real = min(p, k ** width)
  for weight in (0.0, 0.5, 2.0):
    seed = zlib.crc32(repr((batch, width, k, p, order, weight)).encode())
    head, tokens, prev, prev2 = random_lattice(seed, batch, width, k)
    arcs, scores = best_arcs(head, tokens, prev, p, lm, weight, prev2=prev2)
    assert arcs.shape == (batch, p, width) and arcs.dtype == jnp.int32
    assert scores.shape == (batch, p) and scores.dtype == jnp.float32
    for b, (want_arcs, want_scores) in enumerate(brute_force(head, tokens, prev, prev2, dense,
                                                             order, weight)):
      np.testing.assert_allclose(scores[b, :real], want_scores[:real], atol=1e-5)
      gaps = np.abs(np.diff(want_scores))                    # compare paths where unambiguous
      clear = np.ones(len(want_scores), bool)
      clear[:-1] &= gaps > 1e-5
      clear[1:] &= gaps > 1e-5
      got = np.asarray(arcs[b, :real])
      np.testing.assert_array_equal(got[clear[:real]], want_arcs[:real][clear[:real]])
      assert len({tuple(a) for a in got}) == real               # never a duplicate
      if real < p:                                            # p > k^G: -inf copies of row 0
        assert np.all(np.isneginf(scores[b, real:]))
        np.testing.assert_array_equal(arcs[b, real:],
                                      np.broadcast_to(arcs[b, 0], (p - real, width)))


@pytest.mark.slow
def test_best_paths_are_the_tokens_of_best_arcs(lms):
  head, tokens, prev, _ = random_lattice(5, 2, 3, 4)
  arcs, scores = best_arcs(head, tokens, prev, 5, lms[2], 0.5)
  paths, scores2 = best_paths(head, tokens, prev, 5, lms[2], 0.5)
  assert paths.shape == (2, 5, 3) and paths.dtype == jnp.int32
  np.testing.assert_array_equal(paths, np.take_along_axis(
      tokens[:, None], np.asarray(arcs)[..., None], -1)[..., 0])
  np.testing.assert_array_equal(scores, scores2)


@pytest.mark.slow
@pytest.mark.parametrize("lm_order", [None, 2, 3])
def test_exact_ties_follow_the_documented_rule(lms, lm_order):
  # Integer head log-probs tie exactly; weight 0 keeps the LM's terms exactly zero.
  head, tokens, prev, prev2 = random_lattice(7, 2, 3, 3, integer=True)
  lm = None if lm_order is None else lms[lm_order]
  arcs, scores = best_arcs(head, tokens, prev, 27, lm, 0.0, prev2=prev2)
  for b, (want_arcs, want_scores) in enumerate(brute_force(head, tokens, prev, prev2, None,
                                                           2, 0.0)):
    np.testing.assert_array_equal(scores[b], want_scores)
    np.testing.assert_array_equal(arcs[b], want_arcs)     # score desc, then arcs lex asc


def test_neg_inf_head_log_probs_give_no_duplicates():
  head, tokens, prev, _ = random_lattice(8, 1, 3, 3)
  head[0, 1, 1:] = -np.inf                                   # column 2: one finite arc
  arcs, scores = best_arcs(head, tokens, prev, 27)
  assert len({tuple(a) for a in np.asarray(arcs[0])}) == 27
  assert np.all(np.diff(np.asarray(scores[0])) <= 0) and np.isfinite(scores).all()


@pytest.mark.slow
def test_docstring_example():
  # log P(7|7) = -5, every other bigram -1: a hand-built (unnormalised) LM, V = 8.
  lm = L.NGramLM(unigram=jnp.full(8, -1.0), bigram_log_alpha=jnp.zeros(8),
                 bigrams=L.SparseTable.build(np.array([[7, 7]]), np.array([-5.0])), vocab_size=8)
  head = jnp.array([[[-0.1, -2.0], [-0.2, -0.9]]])
  tokens = jnp.array([[[7, 3], [7, 5]]])
  paths, scores = best_paths(head, tokens, jnp.array([0]), 3)
  np.testing.assert_array_equal(paths[0], [[7, 7], [7, 5], [3, 7]])
  np.testing.assert_allclose(scores[0], [-0.3, -1.0, -2.2], rtol=1e-6)
  paths, scores = best_paths(head, tokens, jnp.array([0]), 2, lm, 1.0)
  np.testing.assert_array_equal(paths[0], [[7, 5], [3, 7]])
  np.testing.assert_allclose(scores[0], [-3.0, -4.2], rtol=1e-6)


def test_top_k_lattice():
  x = jax.nn.log_softmax(jax.random.normal(jax.random.PRNGKey(0), (2, 3, 10)))
  head, tokens = L.top_k_lattice(x, 4)
  want = np.argsort(-np.asarray(x), axis=-1, kind="stable")[..., :4]
  np.testing.assert_array_equal(tokens, want)
  np.testing.assert_allclose(head, np.take_along_axis(np.asarray(x), want, -1))
  assert tokens.dtype == jnp.int32


# --------------------------------------------------------------------------------------
# On device: jit, while_loop, scan; no recompilation for new values
# --------------------------------------------------------------------------------------


def test_inside_while_loop_without_recompiling(lms):
  steps, p, traces = 4, 3, []

  @jax.jit
  def run(lm, weight, heads, tokens, prev):
    traces.append(1)

    def body(carry):
      t, prev, total, out = carry
      paths, scores = L.best_paths(heads[t], tokens[t], prev, p, lm, weight)
      return t + 1, paths[:, 0, -1], total + scores[:, 0], out.at[t].set(paths)

    out = jnp.zeros((steps, heads.shape[1], p, heads.shape[2]), jnp.int32)
    init = (0, prev, jnp.zeros(prev.shape), out)
    return jax.lax.while_loop(lambda c: c[0] < steps, body, init)

  for seed, weight, shift in [(0, 0.5, 0.0), (1, 2.0, -0.3)]:
    lattices = [random_lattice(seed * 10 + t, 2, 3, 4) for t in range(steps)]
    heads = np.stack([x[0] for x in lattices])
    tokens = np.stack([x[1] for x in lattices])
    lm = lms[2].replace(unigram=lms[2].unigram + shift)    # new values, same shapes
    _, _, total, out = run(lm, weight, heads, tokens, lattices[0][2])
    prev, want_total = lattices[0][2], 0.0
    for t in range(steps):                        # the same loop, a call at a time
      paths, scores = best_paths(heads[t], tokens[t], prev, p, lm, weight)
      np.testing.assert_array_equal(out[t], paths)
      prev, want_total = paths[:, 0, -1], want_total + scores[:, 0]
    np.testing.assert_allclose(total, want_total, rtol=1e-5)
  assert len(traces) == 1


@pytest.mark.slow
def test_inside_scan_with_a_trigram(lms):
  traces = []

  @jax.jit
  def run(lm, weight, heads, tokens, prev2, prev):
    traces.append(1)

    def step(carry, lattice):
      prev2, prev = carry
      paths, scores = L.best_paths(*lattice, prev, 2, lm, weight, prev2=prev2)
      return (paths[:, 0, -2], paths[:, 0, -1]), (paths, scores)

    return jax.lax.scan(step, (prev2, prev), (heads, tokens))[1]

  for seed, weight in [(0, 1.0), (1, 0.25)]:
    lattices = [random_lattice(seed * 10 + t, 2, 3, 3) for t in range(3)]
    heads, tokens = np.stack([x[0] for x in lattices]), np.stack([x[1] for x in lattices])
    paths, scores = run(lms[3], weight, heads, tokens, lattices[0][3], lattices[0][2])
    prev2, prev = lattices[0][3], lattices[0][2]
    for t in range(3):
      want_paths, want_scores = best_paths(heads[t], tokens[t], prev, 2, lms[3], weight,
                                           prev2=prev2)
      np.testing.assert_array_equal(paths[t], want_paths)
      np.testing.assert_allclose(scores[t], want_scores, rtol=1e-5)
      prev2, prev = want_paths[:, 0, -2], want_paths[:, 0, -1]
  assert len(traces) == 1


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_errors(lms):
  head, tokens, prev, prev2 = random_lattice(0, 1, 2, 3)
  for bad in (0, -1, 1.5, True):
    with pytest.raises(InputError, match="num_paths"):
      L.best_paths(head, tokens, prev, bad)
  with pytest.raises(InputError, match="k must be in"):
    L.top_k_lattice(jnp.zeros((1, 2, 5)), 6)
  with pytest.raises(InputError, match="exceeds the LM's vocabulary"):
    small = L.NGramLM.fit([[1, 0]], 2)
    L.best_paths(head, tokens, prev, 1, small)
  with pytest.raises(InputError, match="trigram LM needs prev2"):
    L.best_paths(head, tokens, prev, 1, lms[3])
  with pytest.raises(InputError, match=r"\[B, G, k\]"):
    L.best_paths(head, tokens[..., :2], prev, 1)
  for order in (1, 4):
    with pytest.raises(InputError, match="order must be 2"):
      L.NGramLM.fit([[1, 2]], 5, order=order)
  for bad in ([1, 5], [-1, 2]):
    with pytest.raises(InputError, match="outside the vocabulary"):
      L.NGramLM.fit([[1, 2], bad], 5)
  with pytest.raises(InputError, match="discount"):
    L.NGramLM.fit([[1, 2]], 5, discount=1.0)
  with pytest.raises(InputError, match="no tokens"):
    L.NGramLM.fit([[], []], 5)
  with pytest.raises(SpecdecError):
    L.NGramLM.fit([[0.5, 1.0]], 5)
