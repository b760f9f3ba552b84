"""Model configs: frozen dataclasses read from declarative JSON.

    base     ModelConfig, what both share (dict round trip, checks, the names the engine reads)
    t5       T5Config (T5X's network config keys)
    lm       LMConfig (decoder-only, GPT-2 / Llama families)
    gemma    GemmaConfig (decoder-only, Gemma 4: sliding and full layers)
    t5gemma2 T5Gemma2Config (encoder-decoder, T5Gemma 2: Gemma 3 layers, merged attention)
    named    get_config / available_configs: the named configs shipped as package data
"""

from specdec_jax.config.base import ModelConfig
from specdec_jax.config.gemma import GemmaConfig
from specdec_jax.config.lm import LMConfig
from specdec_jax.config.named import available_configs, get_config
from specdec_jax.config.t5 import T5Config, mlp_kernel_names
from specdec_jax.config.t5gemma2 import T5Gemma2Config

__all__ = ["GemmaConfig", "LMConfig", "ModelConfig", "T5Config", "T5Gemma2Config",
           "available_configs", "get_config", "mlp_kernel_names"]
