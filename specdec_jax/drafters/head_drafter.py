"""The proposer of blockwise parallel decoding: drafts from prediction heads, no drafter model.

State: the verifier's final decoder state s at the position that predicted the last
emitted token (the previous round's verify call yields it: no extra call). Heads
2..h read s and propose the G = h - 1 tokens after the last emitted one:

    plain       x_j = argmax of head j+1                       (Stern et al.'s BPD)
    top-k       the best path through the top-k lattice (one column per head), scored
                by head log-probs + weight * n-gram log-probs (`lattice.best_paths`),
                or the p best paths (parallel BPD: verified together, longest wins)
    neural      left to right, z_j[S_j] += weight * r_j[S_j] with r_j the log-probs of a
                small autoregressive rescorer given the draft so far; x_j = argmax z_j
    sampling    x_j ~ q_j, q_j = head j+1's distribution after the sampling transform
                (the exact speculative rule then keeps the target's distribution)

The first round has no state yet: it proposes nothing, and the target's own token
starts the sentence.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import lattice
from specdec_jax.drafters.heads import Heads, head_logits
from specdec_jax.errors import InputError
from specdec_jax.models.model import Model
from specdec_jax.rounds.buffer import last_tokens
from specdec_jax.rounds.phases import Proposal, RoundContext, RoundOutcome

Array = jax.Array
RESCORING = (None, "ngram", "neural")


class HeadState(struct.PyTreeNode):
  """hidden: [B, E] state that predicted the last emitted token; ready: bool [B] it exists;
  rescorer: the neural rescorer's state (its cache), or None."""

  hidden: Array
  ready: Array
  rescorer: Any = None


@struct.dataclass
class HeadDrafter:
  """Proposer for `blockwise_generate` (see module doc).

  Attributes:
    model: the verifier (its output layer serves every head).
    heads: its prediction heads 2..h.
    lm: the n-gram LM for rescoring="ngram"; rescorer: a token-level drafter for "neural".
    top_k, num_drafts, rescoring, weight: the lattice settings (static).
  """

  model: Model
  heads: Heads
  lm: Any = None
  rescorer: Any = None
  top_k: int = struct.field(pytree_node=False, default=1)
  num_drafts: int = struct.field(pytree_node=False, default=1)
  rescoring: str | None = struct.field(pytree_node=False, default=None)
  weight: float = struct.field(pytree_node=False, default=1.0)
  kind: str = struct.field(pytree_node=False, default="heads")

  @property
  def vocab_size(self) -> int:
    return self.model.config.vocab_size

  def init(self, inputs: Array, capacity: int,
           lengths: Array | None = None) -> HeadState:
    batch = inputs.shape[0]
    hidden = jnp.zeros((batch, self.model.config.emb_dim), self.model.config.activation_dtype)
    rescorer = None
    if self.rescorer is not None:
      rescorer = (self.rescorer.init(inputs, capacity) if lengths is None
                  else self.rescorer.init(inputs, capacity, lengths=lengths))
    return HeadState(hidden=hidden, ready=jnp.zeros((batch,), jnp.bool_), rescorer=rescorer)

  def update(self, state: HeadState, outcome: RoundOutcome) -> HeadState:
    """Keep the state at the position that predicted the token just emitted (position m)."""
    if outcome.verified.hidden is None:
      raise InputError("a HeadDrafter needs the verify phase's hidden states (hidden=None)")
    hidden = jnp.take_along_axis(outcome.verified.hidden, outcome.m[:, None, None], 1)[:, 0]
    live = outcome.live[:, None]
    return state.replace(hidden=jnp.where(live, hidden.astype(state.hidden.dtype), state.hidden),
                         ready=state.ready | outcome.live)

  def propose(self, state: HeadState, ctx: RoundContext, key: Array) -> Proposal:
    logits = head_logits(self.model, self.heads, state.hidden)                # [B, G, V]
    batch, g = logits.shape[:2]
    count = jnp.where(state.ready, jnp.minimum(ctx.limit, g), 0).astype(jnp.int32)
    calls = jnp.zeros((batch,), jnp.int32)
    q, rescorer = None, state.rescorer
    if not ctx.sampling.is_greedy:
      q = sampling_lib.probs(logits, ctx.sampling)
      tokens = jax.random.categorical(key, jnp.log(q), axis=-1).astype(jnp.int32)
    elif self.rescoring == "neural":
      tokens, rescorer = self._neural(state.rescorer, ctx, logits)
      calls = jnp.where(count > 0, g, 0)
    elif self.top_k == 1 and self.num_drafts == 1:
      tokens = sampling_lib.argmax(logits)
    else:
      head_lp, cand = lattice.top_k_lattice(jax.nn.log_softmax(logits, -1), self.top_k)
      two = last_tokens(ctx.seq, ctx.n, 2)
      paths, _ = lattice.best_paths(head_lp, cand, two[:, 1], self.num_drafts,
                                    self.lm if self.rescoring == "ngram" else None,
                                    self.weight, two[:, 0])
      tokens = paths.reshape(batch, self.num_drafts * g)
    no = jnp.zeros((batch,), jnp.bool_)
    return Proposal(tokens=tokens, count=count, q=q, calls=calls, fallback=no, final=no,
                    state=state.replace(rescorer=rescorer))

  def _neural(self, rescorer_state: Any, ctx: RoundContext, logits: Array):
    """Local rescoring (Kim et al. Algorithm 2): greedy, left to right over the top-k sets."""
    head_lp, cand = lattice.top_k_lattice(jax.nn.log_softmax(logits, -1), self.top_k)
    r_logits, r_state = self.rescorer.first(rescorer_state, ctx.seq, ctx.n)
    chosen = []
    for j in range(cand.shape[1]):             # G is small and static
      r = jnp.take_along_axis(jax.nn.log_softmax(r_logits, -1), cand[:, j], axis=1)   # [B, k]
      best = jnp.argmax(head_lp[:, j] + self.weight * r, axis=-1)
      x = jnp.take_along_axis(cand[:, j], best[:, None], axis=1)[:, 0]
      chosen.append(x)
      if j + 1 < cand.shape[1]:
        r_logits, r_state = self.rescorer.next(r_state, x)
    return jnp.stack(chosen, axis=1).astype(jnp.int32), r_state
