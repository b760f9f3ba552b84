"""Model-free stand-ins for tests and research code: the round engine without a network.

T5X and vLLM test their samplers on hand-built logits; these pieces do the same for every
phase of a round (`rounds.phases`), so an acceptance rule, a proposer or the engine itself
can be checked in milliseconds, against a reference written in a few lines of numpy:

    TableModel(next_logits [V, V])      a verifier whose logits are lookup tables (pure jnp):
                                        the last token's row, plus optional per-position and
                                        per-input terms; `engine.run` decodes it as a Model
    table_drafter(next_logits [V, V])   a token-level drafter with the same kind of table
    ScriptedProposer(script [B, L])     proposes the row's script from its position on
    proposal(tokens, count, q)          a hand-built `Proposal` for calling a rule directly
    logits_from_probs(p)                hand-built logits whose softmax is p
    reference_greedy(model, enc, T)     the table model's greedy output, by a host loop
    examples(target, drafter, heads)    one configured value of every method (`METHODS`)
    METHODS                             every method type: the stable ones, then the
                                        experimental ones

Example: speculative greedy equals the target's greedy output, here on a table::

    >>> import numpy as np, jax
    >>> from specdec_jax import testing
    >>> from specdec_jax.methods import speculative
    >>> from specdec_jax.rounds import engine
    >>> rng = np.random.default_rng(0)
    >>> target = testing.TableModel(rng.normal(size=(6, 6)).astype(np.float32))
    >>> drafter = testing.table_drafter(rng.normal(size=(6, 6)).astype(np.float32))
    >>> enc = np.array([[3, 1], [4, 1]], np.int32)
    >>> out = engine.run(target, speculative.proposer(drafter, target, 2), enc, None,
    ...                  jax.random.key(0), config=speculative.round_config(2, 5))
    >>> tokens, lengths = testing.reference_greedy(target, enc, 5)
    >>> bool((np.asarray(out.tokens) == tokens).all())
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import experimental, methods
from specdec_jax.drafters.heads import init_heads
from specdec_jax.drafters.ngram import NGramDrafter
from specdec_jax.experimental import SpeculativeBeam
from specdec_jax.methods.autoregressive import Autoregressive
from specdec_jax.methods.base import Method
from specdec_jax.methods.beam import Beam
from specdec_jax.methods.bild import BiLD
from specdec_jax.methods.blockwise import Blockwise
from specdec_jax.methods.speculative import Speculative
from specdec_jax.rounds.phases import Proposal, RoundContext, RoundOutcome

Array = jax.Array
#: Every method type: `sd.methods.METHODS` (the stable ones), then
#: `specdec_jax.experimental.METHODS`. A test of "every method" covers these.
METHODS = methods.METHODS + experimental.METHODS


@dataclasses.dataclass(frozen=True)
class TableConfig:
  """The few config fields the round engine and the input checks read of a target."""

  vocab_size: int
  eos_id: int = 1
  pad_id: int = 0
  decoder_start_id: int = 0


class TableCache(struct.PyTreeNode):
  """A table model's "cache": only its length counts (the model has no other state).

  Attributes:
    length: int32 [B] positions written (the engine rolls it back with `with_length`).
    context: float32 [B, V] the row's input term of the logits (zeros without one).
  """

  length: Array
  context: Array

  def with_length(self, length: Array) -> "TableCache":
    return self.replace(length=jnp.asarray(length, jnp.int32))


@struct.dataclass
class TableModel:
  """A verifier whose logits are table lookups; it decodes like a T5 target.

  The logits of the token after `a` at decoder position t (t = 0 after the start token) of
  a row with input tokens e_1..e_L are

      next_logits[a] + position_logits[min(t, P - 1)] + sum_{e_j != 0} input_logits[e_j]

  (`position_logits` [P, V] or per row [B, P, V], and `input_logits` [V, V], optional). The
  position term makes a wrong cache length visible in the output (a rollback to the
  wrong place reads another row of the table); the input term makes rows differ.

  Attributes:
    next_logits: float32 [V, V]: row a holds the logits after token a.
    position_logits: float32 [P, V] or [B, P, V], or None.
    input_logits: float32 [V, V], or None.
    eos_id: the model's stop token (its `config.eos_id`).
  """

  next_logits: Array
  position_logits: Array | None = None
  input_logits: Array | None = None
  eos_id: int = struct.field(pytree_node=False, default=1)

  # What the engine asks of a target: a T5-style model whose logits at a position do not
  # depend on how many tokens its call carries (no padding to the exact-mode width).
  is_decoder_only = False
  width_invariant_decode = True

  @property
  def config(self) -> TableConfig:
    return TableConfig(vocab_size=self.next_logits.shape[-1], eos_id=self.eos_id)

  @property
  def vocab_size(self) -> int:
    return self.next_logits.shape[-1]

  def start(self, inputs: Array, capacity: int, lengths: Array | None = None
            ) -> TableCache:
    """The cache of a new request: length 0 and the input term [B, V]."""
    batch = inputs.shape[0]
    context = jnp.zeros((batch, self.vocab_size), jnp.float32)
    if self.input_logits is not None:
      real = (inputs != 0)[..., None]
      context = jnp.sum(jnp.where(real, self.input_logits[inputs], 0.0), axis=1)
    return TableCache(length=jnp.zeros((batch,), jnp.int32), context=context)

  def begin(self, inputs: Array, new_positions: int, lengths: Array | None = None
            ) -> tuple[Array, TableCache, int]:
    """A decode's start (`Model.begin`): the start token for every row, the new cache, its
    capacity (a table cache has no slots: `new_positions` as asked)."""
    first = jnp.full((inputs.shape[0],), self.config.decoder_start_id, jnp.int32)
    return first, self.start(inputs, new_positions, lengths), new_positions

  def logits(self, tokens: Array, cache: TableCache) -> Array:
    """tokens [B, W] at positions length .. length + W - 1 -> logits [B, W, V]."""
    out = self.next_logits[tokens] + cache.context[:, None]
    if self.position_logits is not None:
      table = self.position_logits
      positions = jnp.minimum(cache.length[:, None] + jnp.arange(tokens.shape[1]),
                              table.shape[-2] - 1)
      if table.ndim == 2:
        out = out + table[positions]
      else:
        out = out + jnp.take_along_axis(table, positions[..., None], axis=1)
    return out.astype(jnp.float32)

  def decode_with_hidden(self, tokens: Array, cache: TableCache):
    """`Model.decode_with_hidden`: (logits [B, W, V], hidden [B, W, V], the cache W longer)."""
    logits = self.logits(tokens, cache)
    return logits, logits, cache.with_length(cache.length + tokens.shape[1])


def table_drafter(next_logits) -> NGramDrafter:
  """A token-level drafter whose logits after token a are `next_logits[a]` ([V, V]): an
  `NGramDrafter` whose bigram table holds every follower (q = softmax of the row)."""
  probs = jax.nn.softmax(jnp.asarray(next_logits, jnp.float32), axis=-1)
  vocab = probs.shape[-1]
  return NGramDrafter(unigram=jnp.full((vocab,), 1.0 / vocab, jnp.float32),
                      bigram_ids=jnp.tile(jnp.arange(vocab, dtype=jnp.int32), (vocab, 1)),
                      bigram_probs=probs, lam=1.0)


@struct.dataclass
class ScriptedProposer:
  """A proposer whose drafts are given: a row at n emitted tokens proposes
  `script[b, n], script[b, n + 1], ...` (up to the round's limit and the script's end).

  Its distributions are `q[b, n + i]` when given ([B, L, V], e.g. the distributions the
  script was drawn from), else one-hot at the drafts (a deterministic proposer); they are
  passed on only when the run samples. Each draft counts one proposer call.

  Attributes:
    script: int32 [B, L] each row's intended continuation.
    q: float32 [B, L, V] or None.
    vocab_size: V.
  """

  script: Array
  q: Array | None = None
  vocab_size: int = struct.field(pytree_node=False, default=0)
  kind: str = struct.field(pytree_node=False, default="scripted")

  def init(self, inputs: Array, capacity: int, lengths: Array | None = None) -> Array:
    return jnp.zeros((), jnp.int32)

  def update(self, state: Any, outcome: RoundOutcome) -> Any:
    return state

  def propose(self, state: Any, ctx: RoundContext, key: Array) -> Proposal:
    g, length = ctx.max_proposals, self.script.shape[1]
    index = ctx.n[:, None] + jnp.arange(g)[None]                           # [B, G]
    valid = (jnp.arange(g)[None] < ctx.limit[:, None]) & (index < length)
    index = jnp.minimum(index, length - 1)
    tokens = jnp.where(valid, jnp.take_along_axis(self.script, index, axis=1), 0)
    count = jnp.sum(valid, axis=1).astype(jnp.int32)
    q = None
    if not ctx.sampling.is_greedy:
      q = (jax.nn.one_hot(tokens, self.vocab_size, dtype=jnp.float32) if self.q is None
           else jnp.take_along_axis(self.q, index[..., None], axis=1))
    no = jnp.zeros_like(count, jnp.bool_)
    return Proposal(tokens=tokens.astype(jnp.int32), count=count, q=q, calls=count,
                    fallback=no, final=no, state=state)


def proposal(tokens, count=None, q=None) -> Proposal:
  """A hand-built `Proposal` of `tokens` [B, G] (`count` [B]: default all G), with the
  proposer's distributions `q` [B, G, V] (None: greedy rules need none)."""
  tokens = jnp.asarray(tokens, jnp.int32)
  batch, g = tokens.shape
  count = jnp.full((batch,), g, jnp.int32) if count is None else jnp.asarray(count, jnp.int32)
  no = jnp.zeros((batch,), jnp.bool_)
  return Proposal(tokens=tokens, count=count, q=None if q is None else jnp.asarray(q),
                  calls=count, fallback=no, final=no, state=None)


def logits_from_probs(p) -> Array:
  """Logits [..., V] whose softmax is the distribution p [..., V] (-inf where p is 0)."""
  p = jnp.asarray(p, jnp.float32)
  return jnp.log(p / jnp.sum(p, axis=-1, keepdims=True))


def reference_greedy(model: TableModel, inputs, max_new_tokens: int,
                     eos_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """The table model's greedy output by a plain host loop, one token at a time:
  (tokens int32 [B, T] with 0 after EOS, lengths [B] EOS included). eos_id: the model's
  by default; negative: never stop."""
  eos = model.eos_id if eos_id is None else eos_id
  inputs = np.asarray(inputs)
  context = np.asarray(model.start(jnp.asarray(inputs), 0).context)
  table = np.asarray(model.next_logits)
  position = None if model.position_logits is None else np.asarray(model.position_logits)
  tokens = np.zeros((inputs.shape[0], max_new_tokens), np.int32)
  lengths = np.zeros(inputs.shape[0], np.int32)
  for b in range(inputs.shape[0]):
    last = model.config.decoder_start_id
    for t in range(max_new_tokens):
      logits = table[last] + context[b]
      if position is not None:
        rows = position if position.ndim == 2 else position[b]
        logits = logits + rows[min(t, rows.shape[0] - 1)]
      last = int(np.argmax(logits))
      tokens[b, t], lengths[b] = last, t + 1
      if last == eos:
        break
  return tokens, lengths


#: How `examples` configures each method type: small settings under which the method's
#: greedy output is its `baseline()`'s bitwise (BiLD at fallback_threshold 1.0: the large
#: model decides every token; the beam methods at 2 beams, in exact mode: on a target whose
#: decode is not width-invariant their calls then keep one shape, as their baseline's).
_EXAMPLES = {
    Autoregressive: lambda drafter, heads: Autoregressive(),
    Speculative: lambda drafter, heads: Speculative(drafter, gamma=2),
    BiLD: lambda drafter, heads: BiLD(drafter, fallback_threshold=1.0),
    Blockwise: lambda drafter, heads: Blockwise(heads, top_k=1),
    Beam: lambda drafter, heads: Beam(num_beams=2, exact=True),
    SpeculativeBeam: lambda drafter, heads: SpeculativeBeam(drafter, num_beams=2, gamma=2,
                                                            exact=True),
}


def examples(target, drafter, heads=None) -> dict[str, Method]:
  """One configured value of every method type in `METHODS` (stable and experimental),
  keyed by its `name`: what a test of "every method" parametrizes over, so a new method
  joins the lowering, mesh, kernel and exactness checks by its one entry here.

  Each is configured so that its greedy output is its `baseline()`'s bitwise on `target`.

  Args:
    target: the verifier (prediction heads are made for it when `heads` is None).
    drafter: the drafter (and BiLD's small model): a model of the target's kind and
      vocabulary, or a token-level drafter.
    heads: `sd.init_heads(target, 3, rng=0)` when None.
  Raises:
    KeyError: a method type of `METHODS` with no entry here (a test of the registry says
      which).
  """
  if heads is None:
    heads = init_heads(target, 3, rng=0)
  values = [_EXAMPLES[m](drafter, heads) for m in METHODS]
  return {v.name: v for v in values}
