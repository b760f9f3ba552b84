"""specdec-jax: drafter/verifier decoding for T5 encoder-decoders in JAX/Flax.

    import specdec_jax as sd
    target, drafter = sd.load("path/to/target"), sd.load("path/to/drafter")
    method = sd.Speculative(drafter, gamma=5)
    out = sd.decode(target, method, encoder_tokens, max_new_tokens=64)
    out.tokens, out.lengths, out.stats

Methods are values (`sd.Autoregressive`, `sd.Speculative`, `sd.BiLD`, `sd.Blockwise`) run by
`sd.decode`; `sd.generate`, `sd.speculative_generate`, ... are the same calls by keyword.
"""

import jax

from specdec_jax import theory
from specdec_jax.cache import DecoderCache
from specdec_jax.config import T5Config, available_configs, get_config
from specdec_jax.decoding import t5x_compat
from specdec_jax.decoding.adaptive import AdaptiveGamma
from specdec_jax.decoding.autoregressive import generate
from specdec_jax.decoding.bild import bild_generate, early_exit
from specdec_jax.decoding.blockwise import blockwise_generate
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.decoding.methods import Autoregressive, BiLD, Blockwise, Speculative, decode
from specdec_jax.decoding.speculative import speculative_generate
from specdec_jax.decoding.stats import DecodeStats
from specdec_jax.drafters import ModelDrafter, NGramDrafter, PromptLookupDrafter
from specdec_jax.drafters.heads import Heads, init_heads, load_heads, save_heads
from specdec_jax.errors import (CheckpointError, ConfigError, InputError, SamplingError,
                                SpecdecError, TokenizerError)
from specdec_jax.models.lm_config import LMConfig
from specdec_jax.models.model import Model, init_model, logical_axes
from specdec_jax.models.packing import pack
from specdec_jax.sampling import Greedy, Sampling
from specdec_jax import sharding
from specdec_jax.sharding import make_mesh, shard

__all__ = [
    "AdaptiveGamma", "Autoregressive", "BiLD", "Blockwise", "CheckpointError", "ConfigError",
    "DecodeOutput", "DecodeStats", "DecoderCache", "Greedy", "Heads", "InputError", "LMConfig",
    "Model", "ModelDrafter", "NGramDrafter", "PromptLookupDrafter", "Sampling", "SamplingError",
    "SpecdecError", "Speculative", "T5Config", "TokenizerError", "available_configs",
    "bild_generate", "blockwise_generate", "decode", "early_exit", "generate", "get_config",
    "init_heads", "init_model", "load", "load_heads", "load_tokenizer", "logical_axes", "pack",
    "save", "save_heads", "speculative_generate", "t5x_compat", "theory",
]
__all__ += ["make_mesh", "shard", "sharding"]


COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


def load(path_or_name: str, dtype="float32", config: T5Config | None = None, *,
         mesh=None, rules=None) -> Model:
  """Load a model: T5X checkpoint (legacy or Orbax), HF T5 dir, our saved dir, a bundled
  name such as "demo-de-en/target", or a named config ("config:t5_1_1_tiny", random weights).

  dtype: the compute dtype, of the floating params AND the activations (attention and
  output logits, hence every acceptance test, stay float32 whatever it is). float32
  by default, as T5X restores and HF's `from_pretrained` loads. "bfloat16" halves
  memory and bandwidth; a `config:` model is then initialised directly in bfloat16,
  one parameter at a time on the device. None keeps what is stored (params as
  stored, activations as the config says). Params come back as device arrays.
  mesh: a `jax.sharding.Mesh` (`sd.make_mesh`): every parameter loaded straight into
  the shards `rules` (default `sd.sharding.RULES_1D`) give it, leaf by leaf, never
  whole on one host or device (`sd.sharding.load`).
  """
  from specdec_jax.io import checkpoints
  if dtype is not None and str(dtype) not in COMPUTE_DTYPES:
    raise InputError(f"dtype must be one of {', '.join(COMPUTE_DTYPES)} or None (as stored), "
                     f"got {dtype!r}")
  if mesh is not None:
    return sharding.load(path_or_name, mesh, dtype, config, rules)
  if rules is not None:
    raise InputError("sd.load: rules= places parameters on a mesh; pass mesh= too")
  if isinstance(path_or_name, str) and path_or_name.startswith("config:"):
    return init_model(get_config(path_or_name[len("config:"):]), 0, dtype)
  cfg, params = checkpoints.load_checkpoint(path_or_name, config=config)
  # Device arrays, not numpy: a jitted call would copy numpy params host -> device
  # on every call (for the demo target, ~8 ms per sentence on CPU).
  model = Model(config=cfg, params=jax.device_put(params))
  return model if dtype is None else model.with_dtype(dtype)


def save(path, model: Model, dtype=None) -> None:
  """Save `model` in our own format (config + safetensors); `sd.load(path)` reads it back.

  `path` is a new or empty directory, or one written by `sd.save` before (overwritten);
  a directory holding a checkpoint of another format (Hugging Face, T5X) is refused.
  """
  import os
  from specdec_jax.io import checkpoints
  if isinstance(path, Model) and isinstance(model, (str, os.PathLike)):
    raise InputError(f"sd.save takes (path, model), got (model, {model!r}): call "
                     f"sd.save({model!r}, model)")
  if not isinstance(model, Model):
    raise InputError(f"sd.save(path, model): model must be an sd.Model, got "
                     f"{type(model).__name__}")
  if not isinstance(path, (str, os.PathLike)):
    raise InputError(f"sd.save(path, model): path must be a directory path, got "
                     f"{type(path).__name__}")
  checkpoints.save_checkpoint(path, model.config, model.params, dtype=dtype)


def load_tokenizer(path_or_name):
  """SentencePiece tokenizer with T5 conventions (pad 0, EOS 1, unk 2)."""
  from specdec_jax.io.tokenizer import load_tokenizer as _load
  return _load(path_or_name)
