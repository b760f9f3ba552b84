"""Model-free drafters: n-gram tables fitted by hand counts, prompt lookup's copying, and the
drafting loop's stops (BiLD's fallback, EOS, the sync batch policy) on a table drafter."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import testing
from specdec_jax.drafters import DraftLoop, Unsure
from specdec_jax.rounds.phases import RoundContext

pytestmark = pytest.mark.unit


def test_ngram_fit_is_the_hand_count():
  # Pairs after the implicit start 0: (0,2) (2,3) (3,2) (2,3) (3,4).
  drafter = sd.NGramDrafter.fit([[2, 3, 2, 3, 4]], vocab_size=6, top_k=2, lam=0.9,
                                smoothing=0.01)
  unigram = np.array([0.01, 0.01, 2.01, 2.01, 1.01, 0.01])
  unigram /= unigram.sum()
  np.testing.assert_allclose(drafter.unigram, unigram, rtol=1e-6)
  q = np.exp(np.asarray(jax.jit(type(drafter).logits_after)(drafter, jnp.array([2, 3, 5]))))
  bigram = np.zeros((3, 6))
  bigram[0, 3] = 1.0                           # 2 -> 3 twice
  bigram[1, [2, 4]] = 0.5                      # 3 -> 2 once, 3 -> 4 once
  want = 0.9 * bigram + 0.1 * unigram
  want[2] = unigram                            # 5 was never followed: the unigram alone
  np.testing.assert_allclose(q, want, rtol=1e-5)
  top1 = sd.NGramDrafter.fit([[2, 3, 2, 3, 4]], vocab_size=6, top_k=1)
  assert float(jnp.sum(top1.bigram_probs[3])) == 0.5      # the mass beyond top-k is dropped


def test_prompt_lookup_copies_the_longest_matching_suffix():
  drafter = sd.PromptLookupDrafter(vocab_size=10, max_ngram=2)
  first, next_ = jax.jit(drafter.first), jax.jit(drafter.next)
  enc = jnp.array([[3, 9, 4, 3, 5, 6, 0, 0]])
  state = drafter.init(enc, 8)
  seq = jnp.array([[0, 4, 3, 0, 0]])              # emitted 4 3
  logits, state = first(state, seq, jnp.array([2]))
  assert int(jnp.argmax(logits[0])) == 5          # "4 3" -> 5 (the 1-gram "3" gives 9)
  logits, state = next_(state, jnp.array([5]))
  assert int(jnp.argmax(logits[0])) == 6          # the copy goes on while drafts follow it
  logits, state = next_(state, jnp.array([6]))
  np.testing.assert_array_equal(logits[0], 0.0)   # next is padding: no proposal (uniform)
  logits, _ = first(drafter.init(enc, 8), jnp.array([[0, 8, 0, 0, 0]]), jnp.array([1]))
  np.testing.assert_array_equal(logits[0], 0.0)   # no match at all


def test_prompt_lookup_reads_a_prompt_within_its_length():
  drafter = sd.PromptLookupDrafter(vocab_size=10, max_ngram=1)
  prompt = jnp.array([[4, 7, 4, 2]])               # length 3: the 2 is padding
  state = drafter.init(prompt, 8, lengths=jnp.array([3]))
  logits, _ = jax.jit(drafter.first)(state, jnp.array([[4, 0]]), jnp.array([0]))  # prompt's last
  assert int(jnp.argmax(logits[0])) == 7          # 4 -> 7 (the later 4 is followed by pad)


V = 8
# A table drafter: confident after 2 (-> 4), 5 (-> 6), 6 (-> 5), 7 (-> EOS); unsure after 4.
TABLE = np.zeros((V, V), np.float32)
for a, b in [(2, 4), (5, 6), (6, 5), (7, 1)]:
  TABLE[a, b] = 8.0


@jax.jit
def propose(loop, seq, n):
  ctx = RoundContext(seq=seq, n=n, limit=jnp.full(n.shape, 3, jnp.int32), cache=None,
                     max_proposals=3, sampling=sd.Greedy(), eos_id=1, max_new_tokens=10)
  return loop.propose(loop.init(seq, 10), ctx, jax.random.key(0))


def test_draft_loop_stops_on_unsure_and_on_eos():
  seq = jnp.array([[2, 0, 0], [5, 0, 0], [7, 0, 0]])
  loop = DraftLoop(testing.table_drafter(TABLE), stop=Unsure(0.5), final_at_eos=True)
  p = propose(loop, seq, jnp.zeros(3, jnp.int32))
  np.testing.assert_array_equal(p.tokens, [[4, 0, 0], [6, 5, 6], [1, 0, 0]])
  np.testing.assert_array_equal(p.count, [1, 3, 1])
  np.testing.assert_array_equal(p.fallback, [True, False, False])    # row 0: unsure after 4
  np.testing.assert_array_equal(p.final, [False, False, True])       # row 2 ended the sentence
  # The sync policy: the first row to fall back stops every row after that step.
  sync = DraftLoop(testing.table_drafter(TABLE), stop=Unsure(0.5), final_at_eos=True,
                   stop_together=True)
  np.testing.assert_array_equal(propose(sync, seq, jnp.zeros(3, jnp.int32)).count, [1, 2, 1])
