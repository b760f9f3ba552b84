"""A smaller model with the target's vocabulary as drafter: a T5 for a T5 target, a
decoder-only LM for an LM target (continuing the same prompt)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.cache import DecoderCache
from specdec_jax.models.model import Model
from specdec_jax.rounds.buffer import last_tokens

Array = jax.Array


@struct.dataclass
class ModelDrafter:
  """A smaller model as drafter. Its cache follows the target's convention (length n;
  a decoder-only drafter's anchored after its prompt, as the target's).

  When the previous round accepted all gamma drafts, the drafter never saw the
  last draft; `first` therefore feeds the last TWO emitted tokens at offset
  n - 1 (re-writing position n - 1 with the same token is idempotent), which
  keeps one fixed shape [B, 2] whatever happened in the previous round.
  """

  model: Model
  kind: str = struct.field(pytree_node=False, default="model")

  @property
  def vocab_size(self) -> int:
    return self.model.config.vocab_size

  def init(self, inputs: Array, capacity: int,
           lengths: Array | None = None) -> DecoderCache:
    """T5: run the encoder. Decoder-only: prefill the prompt [B, P] (`lengths` [B]) into
    `capacity` slots (capped at a learned position table, see `engine.cache_capacity`)."""
    if not self.model.is_decoder_only:
      return self.model.start(inputs, capacity)
    capacity = self.model.decode_capacity(capacity, 0)     # a learned position table's cap
    return self.model.start(inputs, capacity, lengths).anchored()

  def first(self, cache: DecoderCache, seq: Array, n: Array):
    two = last_tokens(seq, n, 2)                     # [B, 2]: seq[n-1], seq[n]
    has_prev = n > 0
    # A row with nothing emitted has only the start token: feed it at position 0
    # and read logits there (position 1 holds junk until the first draft overwrites it).
    two = jnp.where(has_prev[:, None], two, seq[:, :1])
    logits, cache = self.model.decode(two, cache.with_length(jnp.maximum(n - 1, 0)))
    logits = jnp.where(has_prev[:, None], logits[:, 1], logits[:, 0])
    return logits, cache.with_length(n + 1)

  def next(self, cache: DecoderCache, token: Array):
    logits, cache = self.model.decode(token[:, None], cache)
    return logits[:, 0], cache
