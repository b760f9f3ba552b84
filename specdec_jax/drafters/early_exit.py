"""The target's own first decoder layers as drafter (BiLD's early-exit variant, NeurIPS §4.4).

The small model is the large model read after `exit_layer` decoder layers, through
the shared final norm and output layer. It drafts in the TARGET's cache: its calls
write only the first `exit_layer` layers' buffers; the verify call then runs all
layers over the drafts and fills the skipped layers' buffers for those positions
with their real values in that same call (and rewrites the first layers' with the
same values). Nothing is recomputed, no second cache or encoder pass is needed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.cache import DecoderCache
from specdec_jax.errors import InputError
from specdec_jax.models.model import Model
from specdec_jax.rounds.buffer import last_tokens

Array = jax.Array


@struct.dataclass
class EarlyExitDrafter:
  """Draft with `model`'s first `exit_layer` decoder layers (token-level drafter)."""

  model: Model
  exit_layer: int = struct.field(pytree_node=False, default=1)
  kind: str = struct.field(pytree_node=False, default="early-exit")
  shares_target_cache = True

  def __post_init__(self):
    layers = self.model.config.num_decoder_layers
    if not isinstance(self.exit_layer, int) or not 1 <= self.exit_layer < layers:
      raise InputError(f"exit_layer must be an integer in [1, {layers - 1}] for a model with "
                       f"{layers} decoder layers, got {self.exit_layer!r}")

  @property
  def vocab_size(self) -> int:
    return self.model.config.vocab_size

  def init(self, inputs: Array, capacity: int, lengths: Array | None = None) -> Array:
    return jnp.zeros((), jnp.int32)     # no state of its own: it drafts in the target's cache

  def first(self, cache: DecoderCache, seq: Array, n: Array):
    logits, cache = self.model.decode(last_tokens(seq, n, 1), cache.with_length(n),
                                      exit_layer=self.exit_layer)
    return logits[:, 0], cache

  def next(self, cache: DecoderCache, token: Array):
    logits, cache = self.model.decode(token[:, None], cache, exit_layer=self.exit_layer)
    return logits[:, 0], cache
