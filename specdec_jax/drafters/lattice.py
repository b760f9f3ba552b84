"""Top-k "sausage" lattices of blockwise parallel drafts, rescored on device.

Blockwise parallel decoding (Stern et al.; Kim et al., "Exploring and Improving
Blockwise Parallel Drafts") has G heads, head j predicting the token j positions
ahead. Keeping the top-k tokens of each head gives a lattice of G columns x k
arcs: any choice of one arc per column is a draft, k^G in all. Kim et al. rescore
every path with a backoff n-gram LM and verify the best one (p = 1, "n-gram
rescoring") or the p best in one batched call ("parallel BPD"). They ran the
k-best search on the host with OpenFST; here it is a dynamic program over the
lattice on device: fixed shapes, traceable inside a jitted `lax.while_loop`.

    log_probs [B, G, V] --top_k_lattice--> head_log_probs, tokens [B, G, k]
                        --best_paths(prev, num_paths=p, lm, weight)--> paths [B, p, G]

Path score = sum_j head_log_probs[j, a_j] + weight * sum_j log P_lm(t_j | history),
where the history of column 1 is `prev` (the last emitted token) and, for a
trigram, `prev2` before it.

Worked example (G = 2, k = 2, no LM; one row; arcs as (token: log-prob))::

    column 1   (7: -0.1)  (3: -2.0)
    column 2   (7: -0.2)  (5: -0.9)
    p = 3      [7, 7] -0.3    [7, 5] -1.0    [3, 7] -2.2
    with a bigram LM that finds "7 7" unlikely (log P(7|7) = -5, others -1), weight 1:
    p = 1      [7, 5]: -1.0 + (-1 - 1) = -3.0   beats [7, 7]: -0.3 + (-1 - 5) = -6.3
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax.errors import InputError

Array = jax.Array
_FLOOR = -1e30  # head log-probs are clamped here so that every real path scores finite


# --------------------------------------------------------------------------------------
# Sparse lookup: a linear-probing hash table of integer key rows, read one window at a time.
# --------------------------------------------------------------------------------------


def _hash(rows, xp):
  """rows [..., m] of ids >= 0 -> uint32 [...]: FNV-1a over the m ids, then a murmur mix.

  `xp` is numpy (building, on the host) or jax.numpy (looking up): the same uint32 bits.
  """
  rows = rows.astype(xp.uint32)
  h = xp.full(rows.shape[:-1], 0x811C9DC5, xp.uint32)
  for i in range(rows.shape[-1]):
    h = (h ^ rows[..., i]) * xp.uint32(0x01000193)
  h = (h ^ (h >> 16)) * xp.uint32(0x85EBCA6B)
  h = (h ^ (h >> 13)) * xp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


@struct.dataclass
class SparseTable:
  """Distinct int32 key rows [N, m] -> float32 values, found in O(1) on device.

  Linear probing in S = 2^s >= 2N home slots, built without wrap-around: entries sorted
  by home slot h sit at pos_i = max(h_i, pos_{i-1} + 1). A row is then within
  `window` = 1 + (largest displacement) slots of its home, so a lookup is ONE gather
  of a [window, m] block: no loop, no search, and no packing of keys into one integer
  (no overflow, no vocabulary limit). Storage: about 2-4 N rows.

  Worked example (N = 4 rows, S = 8 slots; homes from the hash)::

      homes (sorted)   3  3  4  7
      positions        3  4  5  7      (the second 3 moves on to 4, so 4 moves on to 5)
      displacements    0  1  1  0  ->  window 2;  keys has S + window - 1 = 9 rows
      lookup(q): home h = hash(q) mod 8; compare q with rows h, h + 1; found iff one equals q

  Attributes:
    keys: [S + window - 1, m] int32; free slots are -1 (never a query: ids are >= 0).
    values: [S + window - 1] float32.
    window: static.
  """

  keys: Array
  values: Array
  window: int = struct.field(pytree_node=False)

  @classmethod
  def build(cls, keys: np.ndarray, values: np.ndarray) -> SparseTable:
    """On the host: keys [N, m] (distinct rows, ids >= 0), values [N]."""
    slots = 1 << max(1, int(2 * len(keys) - 1).bit_length())
    home = (_hash(keys, np) & np.uint32(slots - 1)).astype(np.int64)
    order = np.argsort(home, kind="stable")
    home = home[order]
    rank = np.arange(len(home))
    pos = np.maximum.accumulate(home - rank) + rank
    window = int((pos - home).max()) + 1 if len(home) else 1
    table = np.full((slots + window - 1, keys.shape[1]), -1, np.int32)
    table[pos] = keys[order]
    vals = np.zeros(slots + window - 1, np.float32)
    vals[pos] = values[order]
    return cls(jnp.asarray(table), jnp.asarray(vals), window=window)

  def lookup(self, query: Array) -> tuple[Array, Array]:
    """query [..., m] int32 -> (found bool [...], value float32 [...], 0 where not found)."""
    slots = self.keys.shape[0] - self.window + 1
    home = (_hash(query, jnp) & jnp.uint32(slots - 1)).astype(jnp.int32)
    rows = home[..., None] + jnp.arange(self.window)                   # [..., window]
    match = jnp.all(self.keys[rows] == query[..., None, :], axis=-1)
    found = jnp.any(match, axis=-1)
    value = self.values[home + jnp.argmax(match, axis=-1)]
    return found, jnp.where(found, value, 0.0)


# --------------------------------------------------------------------------------------
# The n-gram LM.
# --------------------------------------------------------------------------------------


@struct.dataclass
class NGramLM:
  """A backoff bigram or trigram LM as device arrays; build it with `NGramLM.fit`.

  Katz-style backoff with absolute discounting D, normalised per context::

      P(w | v)    = (c(v, w) - D) / c(v)           if c(v, w) > 0
                  = alpha(v) * P_uni(w)            otherwise   (unseen v: alpha = 1)
      P(w | u, v) = (c(u, v, w) - D) / c(u, v)     if c(u, v, w) > 0
                  = alpha(u, v) * P(w | v)         otherwise   (unseen u v: alpha = 1)
      P_uni(w)    = (c(w) + epsilon) / (N + epsilon * V)

  alpha makes each conditional sum to 1: alpha(v) = (D * n(v) / c(v)) / (1 - sum over
  seen w of P_uni(w)), n(v) = distinct w seen after v. A context followed by EVERY
  token has nothing to back off to; it keeps its counts undiscounted (D = 0 there).

  Storage (no [V, V] table): the observed n-grams in `SparseTable`s (hash tables read
  with one gather per lookup), per-context alpha dense for bigram contexts (V floats)
  and sparse for trigram contexts. Trigram limits: none beyond memory, about
  2-4 x (distinct bigrams + trigrams + trigram contexts) key rows.

  Attributes:
    unigram: [V] float32 log P_uni.
    bigram_log_alpha: [V] float32 log alpha(v) (0 for contexts never seen).
    bigrams: (v, w) -> log P(w | v) for the observed bigrams.
    trigrams: (u, v, w) -> log P(w | u, v) for the observed trigrams (None: order 2).
    contexts: (u, v) -> log alpha(u, v) for the observed trigram contexts (None: order 2).
    vocab_size, order: static.
  """

  unigram: Array
  bigram_log_alpha: Array
  bigrams: SparseTable
  vocab_size: int = struct.field(pytree_node=False)
  order: int = struct.field(pytree_node=False, default=2)
  trigrams: SparseTable | None = None
  contexts: SparseTable | None = None

  @classmethod
  def fit(cls, sequences, vocab_size: int, order: int = 2, discount: float = 0.75,
          epsilon: float = 0.01) -> NGramLM:
    """Estimate on the host from token sequences (each preceded by order - 1 start tokens 0).

    Counted: the unigrams of the real tokens, and every n-gram ending at a real token,
    so `[5, 6]` gives bigrams (0, 5), (5, 6) and trigrams (0, 0, 5), (0, 5, 6).
    """
    grams, unigram_counts = _count(sequences, vocab_size, order, discount, epsilon)
    p_uni = (unigram_counts + epsilon) / (unigram_counts.sum() + epsilon * vocab_size)
    keys2, counts2 = grams[2]
    p2, alpha2, contexts2 = _discounted(keys2, counts2, p_uni[keys2[:, 1]], discount, vocab_size)
    log_alpha2 = np.zeros(vocab_size)                          # unseen context: alpha = 1
    log_alpha2[contexts2[:, 0]] = np.log(alpha2)
    trigrams = contexts = None
    if order == 3:
      keys3, counts3 = grams[3]
      lower = _host_bigram(keys2, p2, log_alpha2, p_uni, keys3[:, 1], keys3[:, 2])
      p3, alpha3, contexts3 = _discounted(keys3, counts3, lower, discount, vocab_size)
      trigrams = SparseTable.build(keys3, np.log(p3))
      contexts = SparseTable.build(contexts3, np.log(alpha3))
    return cls(jnp.asarray(np.log(p_uni), jnp.float32), jnp.asarray(log_alpha2, jnp.float32),
               SparseTable.build(keys2, np.log(p2)), vocab_size, order, trigrams, contexts)

  def log_prob(self, *tokens: Array) -> Array:
    """log P(next | context), vectorised: `log_prob(prev, next)`, `log_prob(prev2, prev, next)`.

    All arguments int32 [...] (broadcastable); returns float32 [...]. A bigram query on
    a trigram LM uses its bigram part; `log_prob(next)` is the unigram. Ids must lie in
    [0, V) (outside, results are meaningless: no run-time check on device).
    """
    if not 1 <= len(tokens) <= self.order:
      raise InputError(f"an order-{self.order} LM takes 1 to {self.order} token arrays "
                       f"(context..., next), got {len(tokens)}")
    tokens = tuple(jnp.broadcast_arrays(*(jnp.asarray(t, jnp.int32) for t in tokens)))
    if len(tokens) == 1:
      return self.unigram[tokens[0]]
    if len(tokens) == 2:
      return self._bigram(*tokens)
    return self._trigram(*tokens)

  def _bigram(self, prev: Array, nxt: Array) -> Array:
    found, log_p = self.bigrams.lookup(jnp.stack([prev, nxt], -1))
    return jnp.where(found, log_p, self.bigram_log_alpha[prev] + self.unigram[nxt])

  def _trigram(self, prev2: Array, prev: Array, nxt: Array) -> Array:
    if self.trigrams is None or self.contexts is None:
      raise InputError(f"an order-{self.order} LM without trigram tables (trigrams, contexts) "
                       "takes at most 2 token arrays")
    found, log_p = self.trigrams.lookup(jnp.stack([prev2, prev, nxt], -1))
    _, log_alpha = self.contexts.lookup(jnp.stack([prev2, prev], -1))    # 0 if unseen
    return jnp.where(found, log_p, log_alpha + self._bigram(prev, nxt))


def _count(sequences, vocab_size, order, discount, epsilon):
  """Validate and count: -> ({n: (keys [M, n] int64 sorted, counts [M])}, unigram counts [V])."""
  if order not in (2, 3):
    raise InputError(f"order must be 2 (bigram) or 3 (trigram), got {order!r}")
  if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
    raise InputError(f"vocab_size must be a positive integer, got {vocab_size!r}")
  if not 0.0 < discount < 1.0:
    raise InputError(f"discount must be in (0, 1), got {discount!r}")
  if not epsilon > 0.0:
    raise InputError(f"epsilon must be > 0 (every token needs a finite log-prob), got {epsilon!r}")
  windows = {n: [] for n in range(2, order + 1)}
  unigram = np.zeros(vocab_size, np.int64)
  for number, seq in enumerate(sequences):
    seq = np.asarray(seq).reshape(-1)
    if seq.size and not np.issubdtype(seq.dtype, np.integer):
      raise InputError(f"sequence {number} is not integer token ids (dtype {seq.dtype})")
    seq = seq.astype(np.int64)
    if seq.size and (seq.min() < 0 or seq.max() >= vocab_size):
      bad = seq[(seq < 0) | (seq >= vocab_size)][0]
      raise InputError(f"sequence {number} has token id {bad} outside the vocabulary "
                       f"[0, {vocab_size})")
    unigram += np.bincount(seq, minlength=vocab_size)
    padded = np.concatenate([np.zeros(order - 1, np.int64), seq])
    for n in windows:                  # the n-grams ending at each real token
      starts = np.arange(order - n, order - n + seq.size)
      windows[n].append(np.stack([padded[starts + i] for i in range(n)], -1))
  if unigram.sum() == 0:
    raise InputError("no tokens to fit the LM on")
  grams = {n: np.unique(np.concatenate(w), axis=0, return_counts=True) for n, w in windows.items()}
  return grams, unigram


def _discounted(keys, counts, lower, discount, vocab_size):
  """One order's estimate: -> (P of each seen row [M], alpha per context [C], contexts [C, n-1]).

  `lower` [M] is the lower-order probability of each row's last token in its context.
  """
  contexts, ids = np.unique(keys[:, :-1], axis=0, return_inverse=True)
  ids = ids.reshape(-1)
  total = np.bincount(ids, weights=counts)
  distinct = np.bincount(ids)
  d = np.where(distinct == vocab_size, 0.0, discount)          # a full context keeps its counts
  prob = (counts - d[ids]) / total[ids]
  unseen_lower = 1.0 - np.bincount(ids, weights=lower)         # lower mass left for unseen w
  alpha = np.where(d > 0, d * distinct / total / np.maximum(unseen_lower, 1e-300), 1.0)
  return prob, alpha, contexts


def _host_bigram(keys2, p2, log_alpha2, p_uni, prev, nxt) -> np.ndarray:
  """The fitted bigram P(nxt | prev) on the host (float64), for the trigram's backoff."""
  vocab = p_uni.shape[0]
  packed = keys2[:, 0] * vocab + keys2[:, 1]
  query = prev * vocab + nxt
  index = np.minimum(np.searchsorted(packed, query), packed.size - 1)
  found = packed[index] == query
  return np.where(found, p2[index], np.exp(log_alpha2[prev]) * p_uni[nxt])


# --------------------------------------------------------------------------------------
# The lattice and its k-best dynamic program.
# --------------------------------------------------------------------------------------


def top_k_lattice(log_probs: Array, k: int) -> tuple[Array, Array]:
  """log_probs [B, G, V] -> (head_log_probs [B, G, k] float32, tokens [B, G, k] int32).

  Each column's k most probable tokens, best first (arc 0 = the head's argmax; equal
  values: lower token id first).
  """
  vocab = log_probs.shape[-1]
  if not 1 <= k <= vocab:
    raise InputError(f"k must be in [1, V = {vocab}], got {k!r}")
  values, tokens = sampling_lib.top_k(log_probs.astype(jnp.float32), k)
  return values, tokens.astype(jnp.int32)


def _transitions(tokens, prev, prev2, lm, weight):
  """weight * LM log-probs of each arc given each history -> (first [B, k], trans list).

  first[b, a] scores arc a of column 1. trans[j] [B, C, k, k] scores the move from arc
  a_j to arc a_{j+1}; C = 1 for a bigram (axis 1 unused), or C = k for a trigram from
  j >= 1 (axis 1 = the arc a_{j-1} before). All lookups are one batched call.
  """
  batch, g, k = tokens.shape
  if lm is None:
    return jnp.zeros((batch, k)), [jnp.zeros((batch, 1, k, k))] * (g - 1)
  start = jnp.broadcast_to(prev[:, None, None], (batch, 1, k))
  before = jnp.concatenate([start, tokens[:, :-1]], axis=1)           # [B, G, k]
  if lm.order == 2:
    lp = weight * lm.log_prob(before[..., :, None], tokens[:, :, None, :])   # [B, G, k, k]
    return lp[:, 0, 0], [lp[:, j + 1][:, None] for j in range(g - 1)]
  start2 = jnp.broadcast_to(prev2[:, None, None], (batch, 1, k))
  before2 = jnp.concatenate([start2, before[:, :-1]], axis=1)          # [B, G, k]
  lp = weight * lm.log_prob(before2[..., :, None, None], before[..., None, :, None],
                            tokens[:, :, None, None, :])              # [B, G, k, k, k]
  trans = [lp[:, j + 1] if j else lp[:, 1, :1] for j in range(g - 1)]
  return lp[:, 0, 0, 0], trans


def _k_best(head, first, trans, p):
  """The DP, last column to first. -> (scores [B, p], arcs [B, p, G] int32).

  beta[b, c, a, r]: the r-th best score of a suffix starting at arc a of column j
  (context c), its head log-probs and the transitions inside it. Candidates for a
  state are (a_{j+1}, r) in that order: top_k keeps the lower index on equal scores.
  """
  batch, g, k = head.shape
  beta = jnp.full((batch, 1, k, p), -jnp.inf).at[..., 0].set(head[:, -1][:, None])
  pointers = []
  for j in range(g - 2, -1, -1):
    cand = head[:, j][:, None, :, None, None] + trans[j][..., None] + beta[:, None]
    beta, ptr = jax.lax.top_k(cand.reshape(cand.shape[:3] + (k * p,)), p)   # [B, C, k, p]
    pointers.insert(0, ptr)
  scores, index = jax.lax.top_k((first[..., None] + beta[:, 0]).reshape(batch, k * p), p)
  arc, rank, arcs = index // p, index % p, [index // p]
  for j, ptr in enumerate(pointers):                                  # follow them forwards
    context = arcs[-2] if j and ptr.shape[1] > 1 else jnp.zeros_like(arc)
    flat = ptr.reshape(batch, -1)
    index = jnp.take_along_axis(flat, (context * k + arc) * p + rank, axis=1)
    arc, rank = index // p, index % p
    arcs.append(arc)
  return scores, jnp.stack(arcs, axis=-1).astype(jnp.int32)


def best_arcs(head_log_probs: Array, tokens: Array, prev: Array, num_paths: int,
              lm: NGramLM | None = None, weight: float | Array = 1.0,
              prev2: Array | None = None) -> tuple[Array, Array]:
  """`best_paths`, returning arc indices [B, p, G] (positions in each column) for tokens."""
  _check(head_log_probs, tokens, prev, num_paths, lm, prev2)
  batch, g, k = tokens.shape
  real = min(num_paths, k ** g)           # exact Python ints: k^G may be huge
  head = jnp.maximum(head_log_probs.astype(jnp.float32), _FLOOR)
  prev = jnp.asarray(prev, jnp.int32)
  prev2 = None if prev2 is None else jnp.asarray(prev2, jnp.int32)
  first, trans = _transitions(tokens.astype(jnp.int32), prev, prev2, lm, weight)
  scores, arcs = _k_best(head, first, trans, real)
  if real < num_paths:                        # p > k^G: pad with -inf copies of the best path
    pad = num_paths - real
    scores = jnp.concatenate([scores, jnp.full((batch, pad), -jnp.inf)], axis=1)
    arcs = jnp.concatenate([arcs, jnp.repeat(arcs[:, :1], pad, axis=1)], axis=1)
  return arcs, scores


def best_paths(head_log_probs: Array, tokens: Array, prev: Array, num_paths: int,
               lm: NGramLM | None = None, weight: float | Array = 1.0,
               prev2: Array | None = None) -> tuple[Array, Array]:
  """The num_paths = p best paths through a top-k lattice, best first.

  Args:
    head_log_probs: [B, G, k] the heads' log-probs of each arc.
    tokens: [B, G, k] int32 the token of each arc.
    prev: [B] int32 the last emitted token (the history of column 1).
    num_paths: static p >= 1. p = 1 is Viterbi; p > 1 keeps the p best partial paths
      per state with back-pointers (list Viterbi). States: the last n - 1 arcs for an
      order-n LM; work O(G k^n p) plus G k^n LM lookups.
    lm: a bigram or trigram `NGramLM`, or None (columns independent: the p best
      combinations of the heads' arcs).
    weight: the LM's weight (the paper's alpha); may be traced (no recompilation).
    prev2: [B] int32 the token before `prev`; required by a trigram LM, else ignored.

  Returns:
    paths [B, p, G] int32 token ids and scores [B, p] float32 (see the module docstring).

  Distinct: the p rows are distinct arc sequences (distinct drafts whenever each
  column's tokens are distinct, as `top_k_lattice` makes them). Ties: exactly equal
  scores are ordered by arc indices, lexicographically smaller first (compare a_1,
  then a_2, ...: the path with the higher-ranked arc at the first place they differ).
  If p > k^G only k^G paths exist: rows k^G.. have score -inf and repeat row 0.
  Head log-probs below -1e30 (-inf included) count as -1e30.
  """
  arcs, scores = best_arcs(head_log_probs, tokens, prev, num_paths, lm, weight, prev2)
  return jnp.take_along_axis(tokens.astype(jnp.int32)[:, None], arcs[..., None], -1)[..., 0], scores


def _check(head_log_probs, tokens, prev, num_paths, lm, prev2) -> None:
  if isinstance(num_paths, bool) or not isinstance(num_paths, (int, np.integer)) or num_paths < 1:
    raise InputError(f"num_paths must be an integer >= 1, got {num_paths!r}")
  if tokens.ndim != 3 or head_log_probs.shape != tokens.shape:
    raise InputError(f"head_log_probs and tokens must both be [B, G, k], got "
                     f"{head_log_probs.shape} and {tokens.shape}")
  batch, g, k = tokens.shape
  if g < 1 or k < 1:
    raise InputError(f"the lattice needs G >= 1 columns and k >= 1 arcs, got {tokens.shape}")
  if jnp.shape(prev) != (batch,):
    raise InputError(f"prev must be [B] = [{batch}], got {jnp.shape(prev)}")
  if lm is None:
    return
  if k > lm.vocab_size:
    raise InputError(f"k = {k} arcs per column exceeds the LM's vocabulary V = {lm.vocab_size}")
  if lm.order == 3 and (prev2 is None or jnp.shape(prev2) != (batch,)):
    raise InputError(f"a trigram LM needs prev2 [B] = [{batch}], got "
                     f"{None if prev2 is None else jnp.shape(prev2)}")
