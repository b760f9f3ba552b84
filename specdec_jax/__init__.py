"""specdec-jax: drafter/verifier decoding for T5 encoder-decoders in JAX/Flax.

    import specdec_jax as sd
    target, drafter = sd.load("path/to/target"), sd.load("path/to/drafter")
    method = sd.Speculative(drafter, gamma=5)
    out = sd.decode(target, method, encoder_tokens, max_new_tokens=64)
    out.tokens, out.lengths, out.stats

Methods are values (`sd.Autoregressive`, `sd.Speculative`, `sd.BiLD`, `sd.Blockwise`,
`sd.Beam`, `sd.SpeculativeBeam`) run by `sd.decode`; `sd.generate`, `sd.speculative_generate`,
... are the same calls by keyword.
"""

import os

import jax

from specdec_jax import sharding, theory
from specdec_jax.cache import DecoderCache
from specdec_jax.config import LMConfig, T5Config, available_configs, get_config
from specdec_jax.drafters import ModelDrafter, NGramDrafter, PromptLookupDrafter
from specdec_jax.drafters.heads import Heads, init_heads, load_heads, save_heads
from specdec_jax.errors import (
  CheckpointError,
  ConfigError,
  InputError,
  SamplingError,
  SpecdecError,
  TokenizerError,
)
from specdec_jax.kernels import backends
from specdec_jax.methods import (
  AdaptiveGamma,
  Autoregressive,
  Beam,
  BeamOutput,
  BiLD,
  Blockwise,
  Speculative,
  SpeculativeBeam,
  bild_generate,
  blockwise_generate,
  decode,
  early_exit,
  generate,
  speculative_generate,
  t5x_compat,
)
from specdec_jax.models.model import Model, init_model, logical_axes
from specdec_jax.models.packing import pack
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.rounds.stats import DecodeStats
from specdec_jax.sampling import Greedy, Sampling
from specdec_jax.sharding import make_mesh, shard

__all__ = [
    "AdaptiveGamma", "Autoregressive", "Beam", "BeamOutput", "BiLD", "Blockwise",
    "CheckpointError", "ConfigError", "DecodeOutput", "DecodeStats", "DecoderCache", "Greedy",
    "Heads", "InputError", "LMConfig",
    "Model", "ModelDrafter", "NGramDrafter", "PromptLookupDrafter", "Sampling", "SamplingError",
    "SpecdecError", "Speculative", "SpeculativeBeam", "T5Config", "TokenizerError",
    "available_configs",
    "bild_generate", "blockwise_generate", "decode", "early_exit", "generate", "get_config",
    "init_heads", "init_model", "load", "load_heads", "load_tokenizer", "logical_axes", "pack",
    "save", "save_heads", "speculative_generate", "t5x_compat", "theory",
]
__all__ += ["make_mesh", "shard", "sharding"]


COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


def load(path_or_name: str, dtype="float32", config: T5Config | None = None, *,
         mesh=None, rules=None, kernels: str = "auto") -> Model:
  """Load a model: T5X checkpoint (legacy or Orbax), HF T5 dir, our saved dir, a bundled
  name such as "demo-de-en/target" (the demo models ship in specdec-jax-demo-small, `pip
  install ./packages/specdec-jax-demo-small`), or a named config ("config:t5_1_1_tiny",
  random weights).

  dtype: the compute dtype, of the floating params AND the activations (attention and
  output logits, hence every acceptance test, stay float32 whatever it is). float32
  by default, as T5X restores and HF's `from_pretrained` loads. "bfloat16" halves
  memory and bandwidth; a `config:` model is then initialised directly in bfloat16,
  one parameter at a time on the device. None keeps what is stored (params as
  stored, activations as the config says). Params come back as device arrays.
  mesh: a `jax.sharding.Mesh` (`sd.make_mesh`): every parameter loaded straight into
  the shards `rules` (default `sd.sharding.RULES_1D`) give it, leaf by leaf, never
  whole on one host or device (`sd.sharding.load`).
  kernels: the decode kernels, packed once here (`sd.pack`): "cpu" (the C++ kernels),
  "gpu" (Pallas on Mosaic GPU; interpreted where there is no GPU: slow, for tests),
  "xla" (none), or "auto": gpu on a GPU, cpu on a CPU where the C++ kernels build,
  xla on a mesh of several devices or elsewhere (`sd.kernels.backends.choose`).
  cpu and gpu make every decode product width- and batch-invariant: exact greedy
  then runs every call at its natural width (docs/exactness.md).
  """
  from specdec_jax.io import checkpoints
  if dtype is not None and str(dtype) not in COMPUTE_DTYPES:
    raise InputError(f"dtype must be one of {', '.join(COMPUTE_DTYPES)} or None (as stored), "
                     f"got {dtype!r}")
  backends.choose(kernels)     # a bad name fails before any loading
  if not isinstance(path_or_name, (str, os.PathLike)):
    raise InputError(f"sd.load takes a path or a name (str), got {type(path_or_name).__name__}")
  if config is not None and not isinstance(config, (T5Config, LMConfig)):
    raise InputError(f"sd.load: config must be an sd.T5Config or sd.LMConfig "
                     f"(sd.get_config(...)), got {type(config).__name__}")
  if mesh is not None:
    return pack(sharding.load(path_or_name, mesh, dtype, config, rules), kernels=kernels)
  if rules is not None:
    raise InputError("sd.load: rules= places parameters on a mesh; pass mesh= too")
  if isinstance(path_or_name, str) and path_or_name.startswith("config:"):
    return pack(init_model(get_config(path_or_name[len("config:"):]), 0, dtype),
                kernels=kernels)
  cfg, params = checkpoints.load_checkpoint(path_or_name, config=config)
  # Device arrays, not numpy: a jitted call would copy numpy params host -> device
  # on every call (for the demo target, ~8 ms per sentence on CPU).
  model = Model(config=cfg, params=jax.device_put(params))
  return pack(model if dtype is None else model.with_dtype(dtype), kernels=kernels)


def save(path, model: Model, dtype=None) -> None:
  """Save `model` in our own format (config + safetensors); `sd.load(path)` reads it back.

  `path` is a new or empty directory, or one written by `sd.save` before (overwritten);
  a directory holding a checkpoint of another format (Hugging Face, T5X) is refused.
  Saving over another model's checkpoint (another config) removes the tokenizer files
  saved beside it (spiece.model, tokenizer.json, ...): they were the old model's.
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
