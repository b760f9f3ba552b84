"""The decoding methods: values, their wirings onto the round engine, and the entry points.

    base            `Method`, what every method value provides, and the field helpers
                    (`setting`, `carried`) whose metadata the CLI and the bench expose
    autoregressive, speculative, bild, blockwise
                    one module per method: its value (Autoregressive, Speculative, BiLD,
                    Blockwise) and its wiring onto the round engine (its RoundConfig:
                    acceptance rule, widths; and its proposer)
    adaptive        per-row adaptive gamma (a proposer wrapper)
    beam            T5X's beam search (Beam): a loop of its own, not a round wiring
    decode          `decode(target, method, inputs, ...)`, one jitted round loop;
                    `lower(...)`: the same program lowered for TPU, CUDA, ...
    functional      `generate`, `speculative_generate`, ...: `decode` by keyword
    t5x_compat      drop-ins for T5X's decoding functions

Below: `rounds/` (the engine) and `drafters/` (proposers); nothing there imports this.
Above: `specdec_jax.experimental` (exact speculative beam search, on `beam`).
"""

from specdec_jax.methods import t5x_compat
from specdec_jax.methods.adaptive import AdaptiveGamma
from specdec_jax.methods.autoregressive import Autoregressive
from specdec_jax.methods.base import (
  Method,
  carried,
  field_docs,
  model_fields,
  setting,
  settings_fields,
)
from specdec_jax.methods.beam import Beam, BeamOutput
from specdec_jax.methods.bild import BiLD, early_exit
from specdec_jax.methods.blockwise import Blockwise
from specdec_jax.methods.decode import METHODS, decode, lower
from specdec_jax.methods.functional import (
  bild_generate,
  blockwise_generate,
  generate,
  speculative_generate,
)
from specdec_jax.methods.speculative import Speculative

__all__ = ["METHODS", "AdaptiveGamma", "Autoregressive", "Beam", "BeamOutput", "BiLD",
           "Blockwise", "Method",
           "Speculative", "bild_generate", "blockwise_generate", "carried",
           "decode", "early_exit", "field_docs", "generate", "lower", "model_fields", "setting",
           "settings_fields", "speculative_generate", "t5x_compat"]
