"""The Gemma 4 assistant as a proposer: drafts from the target's own cache and final state.

`sd.load(assistant_dir)` (a transformers "gemma4_assistant" directory) returns a
`GemmaAssistant`; `sd.Speculative(assistant, gamma=4)` drafts with it for a Gemma 4
target. Bound to the target (`for_target`, which `drafters.as_proposer` calls), it holds
the target's embedding table (the same array, not a copy) and which of the target's
layers each of its layers reads. A round, for a row with n tokens emitted:

    t = seq[n]          the last emitted token (the target caches it in this round's verify)
    p = offset + n      its slot; the target's cache holds the slots before it
    h                   the target's final state at slot p - 1 (the state that predicted t):
                        the previous round's verify call computed it (`update`)
    draft i:  logits_i, h = step(embed_target(x_{i-1}), h)  at position p,  x_0 = t
              x_i ~ logits_i (the run's sampling transform; q_i kept for the exact rule)

Every step reads the target's cache as the round found it (`ctx.cache`, inside the
round: nothing is copied) and caches nothing of its own (`models.gemma_assistant`). The
first round has no target state yet: it proposes nothing and the target's own token
starts the sentence (as transformers' assisted generation does). The drafting loop is
`DraftLoop`'s, over a token-level drafter made for the round.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.cache import DecoderCache
from specdec_jax.config.gemma import GemmaAssistantConfig, GemmaConfig
from specdec_jax.drafters.loop import DraftLoop
from specdec_jax.errors import InputError
from specdec_jax.models import gemma_assistant
from specdec_jax.models.gemma import scale_embedding
from specdec_jax.models.model import Model, family
from specdec_jax.rounds.buffer import last_tokens
from specdec_jax.rounds.phases import Proposal, RoundContext, RoundOutcome
from specdec_jax.rounds.requests import check_same_vocabulary

Array = jax.Array


class AssistantState(struct.PyTreeNode):
  """hidden: [B, E_t] the target's final state that predicted each row's last token (the
  target's activation dtype); ready: bool [B] it exists (after the row's first round)."""

  hidden: Array
  ready: Array


@struct.dataclass
class GemmaAssistant:
  """A Gemma 4 assistant (`sd.load` of a "gemma4_assistant" dir): an `sd.Proposer` for a
  Gemma 4 target (module docstring).

  Attributes:
    config: its architecture (`GemmaAssistantConfig`, static).
    params: its parameters (`models.gemma_assistant`'s tree).
    embedding: the target's token embedding [V, E_t] once bound (`for_target`), else None.
    target_config: the target's `GemmaConfig` once bound (static).
    reads: the target layer whose K/V each of its layers reads once bound (static): the
      target's last cached layer of the same type (transformers' "store" layer: with
      K/V-shared layers, the last one that computes K/V).
  """

  config: GemmaAssistantConfig = struct.field(pytree_node=False)
  params: Any
  embedding: Array | None = None
  target_config: GemmaConfig | None = struct.field(pytree_node=False, default=None)
  reads: tuple[int, ...] = struct.field(pytree_node=False, default=())
  kind: str = struct.field(pytree_node=False, default="gemma4-assistant")

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def with_dtype(self, dtype) -> "GemmaAssistant":
    """Floating params AND activations in `dtype` (as `Model.with_dtype`)."""
    dtype = jnp.dtype(dtype)
    params = jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, self.params)
    decoder = self.config.decoder.replace(dtype=dtype.name)
    return dataclasses.replace(self, params=params, config=self.config.replace(decoder=decoder))

  def for_target(self, target: Any) -> "GemmaAssistant":
    """This assistant bound to `target`: a Gemma 4 model of its vocabulary and hidden size
    whose last layer of each type has the K/V heads and head size of its layers of that
    type; a clear `InputError` otherwise."""
    if not isinstance(target, Model) or not isinstance(target.config, GemmaConfig):
      what = family(target) if isinstance(target, Model) else type(target).__name__
      raise InputError(f"a Gemma 4 assistant drafts for a Gemma 4 target (sd.load of a gemma4 "
                       f"or gemma4_text dir); the target is {what}")
    tc, dec = target.config, self.config.decoder
    check_same_vocabulary(tc.vocab_size, self.vocab_size, "the Gemma 4 assistant")
    if tc.emb_dim != self.config.backbone_dim:
      raise InputError(f"the Gemma 4 assistant reads a target of hidden size "
                       f"{self.config.backbone_dim} (backbone_hidden_size), the target's is "
                       f"{tc.emb_dim}: it was trained for another model")
    reads = []
    for i, kind in enumerate(dec.layer_types):
      j = tc.last_cached_layer(kind)
      if j is None:
        raise InputError(f"the Gemma 4 assistant's layer {i} reads the target's {kind} "
                         f"layers, and the target caches none "
                         f"({list(tc.layer_types[:tc.cached_layers])})")
      if tc.layer_shape(j) != dec.layer_shape(i):
        raise InputError(f"the Gemma 4 assistant's layer {i} ({kind}) reads K/V of "
                         f"[heads, head size] {list(dec.layer_shape(i))}, the target's layer "
                         f"{j} caches {list(tc.layer_shape(j))}")
      reads.append(j)
    return dataclasses.replace(self, embedding=target.params["token_embedder"]["embedding"],
                               target_config=tc, reads=tuple(reads))

  def _check_bound(self) -> GemmaConfig:
    if self.target_config is None:
      raise InputError("this Gemma 4 assistant is not bound to a target: pass it to "
                       "sd.Speculative (or call assistant.for_target(target))")
    return self.target_config

  def init(self, inputs: Array, capacity: int, lengths: Array | None = None) -> AssistantState:
    tc = self._check_bound()
    batch = inputs.shape[0]
    return AssistantState(hidden=jnp.zeros((batch, tc.emb_dim), tc.activation_dtype),
                          ready=jnp.zeros((batch,), jnp.bool_))

  def propose(self, state: AssistantState, ctx: RoundContext, key: Array) -> Proposal:
    """Up to ctx.limit drafts for each row that has a target state (`DraftLoop`)."""
    self._check_bound()
    ctx = ctx.replace(limit=jnp.where(state.ready, ctx.limit, 0))
    proposal = DraftLoop(RoundDrafter(self, ctx.cache)).propose(state, ctx, key)
    return proposal.replace(state=state)     # the drafts' carried states end with the round

  def update(self, state: AssistantState, outcome: RoundOutcome) -> AssistantState:
    """Keep the verify call's state at position m: the one that predicted the token the
    round emitted last."""
    if outcome.verified.hidden is None:
      raise InputError("a Gemma 4 assistant needs the verify phase's hidden states "
                       "(hidden=None)")
    hidden = jnp.take_along_axis(outcome.verified.hidden, outcome.m[:, None, None], 1)[:, 0]
    live = outcome.live
    return AssistantState(
        hidden=jnp.where(live[:, None], hidden.astype(state.hidden.dtype), state.hidden),
        ready=state.ready | live)

  def step(self, cache: DecoderCache, token: Array, hidden: Array) -> tuple[Array, Array]:
    """One draft step after `token` [B] at each row's slot `cache.next_slot`: (logits
    float32 [B, V], the carried state [B, E_t] in `hidden`'s dtype)."""
    tc = self._check_bound()
    table = jnp.asarray(self.embedding, tc.activation_dtype)
    inputs = jnp.concatenate([scale_embedding(jnp.take(table, token, axis=0), tc),
                              hidden.astype(tc.activation_dtype)], axis=-1)
    kv = tuple((cache.self_key[j], cache.self_value[j]) for j in self.reads)
    logits, carried = gemma_assistant.step(self.config, self.params, inputs, kv,
                                           cache.next_slot, cache.capacity)
    return logits, carried.astype(hidden.dtype)


@struct.dataclass
class RoundDrafter:
  """The token-level drafter of one round: `assistant` over the target's `cache` as the
  round found it (length n); its state is the `AssistantState`, its hidden the carried one."""

  assistant: GemmaAssistant
  cache: DecoderCache

  @property
  def vocab_size(self) -> int:
    return self.assistant.vocab_size

  @property
  def kind(self) -> str:
    return self.assistant.kind

  def init(self, inputs: Array, capacity: int, lengths: Array | None = None) -> Any:
    raise InputError("a RoundDrafter lives inside one round (GemmaAssistant.propose)")

  def first(self, state: AssistantState, seq: Array, n: Array):
    return self.next(state, last_tokens(seq, n, 1)[:, 0])

  def next(self, state: AssistantState, token: Array):
    logits, hidden = self.assistant.step(self.cache, token, state.hidden)
    return logits, state.replace(hidden=hidden)
