"""specdec-jax: drafter/verifier decoding for T5 encoder-decoders and decoder-only LMs in
JAX/Flax.

    import specdec_jax as sd
    target, drafter = sd.load("path/to/target"), sd.load("path/to/drafter")
    method = sd.Speculative(drafter, gamma=5)
    out = sd.decode(target, method, inputs, max_new_tokens=64)
    out.tokens, out.lengths, out.stats

Methods are values (`sd.Autoregressive`, `sd.Speculative`, `sd.BiLD`, `sd.Blockwise`,
`sd.Beam`; experimental ones in `specdec_jax.experimental`) run by `sd.decode`;
`sd.generate`, `sd.speculative_generate`, ... are the same calls by keyword. `dir(sd)`
lists the public names (`__all__`); the public modules are listed in docs/api/index.md.
"""

import os as _os
from typing import Any as _Any

import jax as _jax

from specdec_jax import sharding, theory
from specdec_jax.batching import pad_to_bucket
from specdec_jax.cache import DecoderCache
from specdec_jax.compilation import use_persistent_cache as use_compilation_cache
from specdec_jax.config import GemmaConfig, LMConfig, T5Config, available_configs, get_config
from specdec_jax.config.gemma import GemmaAssistantConfig as _GemmaAssistantConfig
from specdec_jax.drafters import (
  Drafter,
  GemmaAssistant,
  ModelDrafter,
  NGramDrafter,
  PromptLookupDrafter,
)
from specdec_jax.drafters.heads import Heads, init_heads, load_heads, save_heads
from specdec_jax.errors import (
  CheckpointError,
  ConfigError,
  InputError,
  InputWarning,
  SamplingError,
  SpecdecError,
  TokenizerError,
)
from specdec_jax.kernels import backends as _backends
from specdec_jax.methods import (
  AdaptiveGamma,
  Autoregressive,
  Beam,
  BeamOutput,
  BiLD,
  Blockwise,
  Speculative,
  bild_generate,
  blockwise_generate,
  decode,
  early_exit,
  generate,
  lower,
  speculative_generate,
  t5x_compat,
)
from specdec_jax.models.model import Model, init_model, logical_axes
from specdec_jax.models.packing import pack
from specdec_jax.rounds.buffer import DecodeOutput
from specdec_jax.rounds.phases import (
  Acceptance,
  AcceptRule,
  Proposal,
  Proposer,
  RoundContext,
  RoundOutcome,
)
from specdec_jax.rounds.stats import DecodeStats
from specdec_jax.sampling import Greedy, Sampling
from specdec_jax.sharding import make_mesh, shard

__all__ = [
    "AdaptiveGamma", "Autoregressive", "Beam", "BeamOutput", "BiLD", "Blockwise",
    "CheckpointError", "ConfigError", "DecodeOutput", "DecodeStats", "DecoderCache",
    "GemmaAssistant", "GemmaConfig", "Greedy", "Heads", "InputError", "LMConfig",
    "Model", "ModelDrafter", "NGramDrafter", "PromptLookupDrafter", "Sampling", "SamplingError",
    "SpecdecError", "Speculative", "T5Config", "TokenizerError",
    "available_configs",
    "bild_generate", "blockwise_generate", "decode", "early_exit", "generate", "get_config",
    "init_heads", "init_model", "load", "load_heads", "load_tokenizer", "logical_axes", "lower",
    "pack",
    "save", "save_heads", "speculative_generate", "t5x_compat", "theory",
]
__all__ += ["InputWarning"]
__all__ += ["make_mesh", "shard", "sharding"]
# Compiling once from a script: prompt widths in buckets, the persistent compilation cache.
__all__ += ["pad_to_bucket", "use_compilation_cache"]

# The extension points (docs/extending/): protocols to implement and what they hand around.
__all__ += ["AcceptRule", "Acceptance", "Drafter", "Proposal", "Proposer", "RoundContext",
            "RoundOutcome"]


COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
def __dir__() -> list[str]:
  """The public names only (`__all__`): not the modules imported on the way (PEP 562)."""
  return sorted(__all__)


def load(path_or_name: str, dtype="float32", config: T5Config | None = None, *,
         mesh=None, rules=None, kernels: str = "auto", check_finite: bool = True) -> _Any:
  """Load a model: T5X checkpoint (legacy or Orbax), HF T5 dir, our saved dir, a bundled
  name such as "demo-de-en/target" (the demo models ship in specdec-jax-demo-small, `pip
  install ./packages/specdec-jax-demo-small`), or a named config ("config:t5_1_1_tiny",
  random weights). A `Model`, except for a transformers Gemma 4 assistant dir
  ("gemma4_assistant"): an `sd.GemmaAssistant`, the drafter `sd.Speculative(assistant,
  gamma=...)` takes for its Gemma 4 target (its products run on XLA's ops whatever
  `kernels` says: exactness rests on the target's; not on a mesh yet).

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
  "gpu" (Pallas on Mosaic GPU, Hopper; interpreted where there is no GPU: slow, for
  tests), "tpu" (Pallas on Mosaic TPU; likewise), "xla" (none), or "auto": cpu on a CPU
  where the C++ kernels build, gpu only on a GPU kind a device check recorded as
  measured (`kernels/verified.json`; none yet), xla on a mesh of several devices or
  elsewhere (`sd.kernels.backends.choose`); named with `mesh`, a backend's kernels run
  inside `shard_map`, each device on its own block (docs/accelerators.md). cpu, gpu and
  tpu make every decode product width- and batch-invariant: exact greedy then runs every
  call at its natural width (docs/exactness.md).
  check_finite: refuse (`CheckpointError`, naming the parameter) a checkpoint whose
  floating parameters hold NaN or inf, as a corrupt file or a diverged run does; about
  one pass over the weights in memory (~0.1 s per 300 MB on one CPU core). False skips
  it, for huge checkpoints already known good. `config:` models are not checked.
  """
  from specdec_jax.io import checkpoints
  from specdec_jax.io.checkpoints import finite
  dtype = _compute_dtype(dtype)
  if not isinstance(check_finite, bool):
    raise InputError(f"sd.load: check_finite must be True or False, got {check_finite!r}")
  _backends.choose(kernels)     # a bad name fails before any loading
  if not isinstance(path_or_name, (str, _os.PathLike)):
    raise InputError(f"sd.load takes a path or a name (str), got {type(path_or_name).__name__}")
  if config is not None and not isinstance(config, (T5Config, LMConfig)):
    raise InputError(f"sd.load: config must be an sd.T5Config or sd.LMConfig "
                     f"(sd.get_config(...)), got {type(config).__name__}")
  is_config = isinstance(path_or_name, str) and path_or_name.startswith("config:")
  if mesh is not None:
    model = sharding.load(path_or_name, mesh, dtype, config, rules)
    if check_finite and not is_config:    # on the shards: nothing is gathered
      finite.check_finite(model.params, _os.fspath(path_or_name))
    return pack(model, kernels=kernels)
  if rules is not None:
    raise InputError("sd.load: rules= places parameters on a mesh; pass mesh= too")
  if is_config:
    return pack(init_model(get_config(path_or_name[len("config:"):]), 0, dtype),
                kernels=kernels)
  cfg, params = checkpoints.load_checkpoint(path_or_name, config=config)
  if check_finite:    # as stored, on the host, before any copy to a device
    finite.check_finite(params, _os.fspath(path_or_name))
  if isinstance(cfg, _GemmaAssistantConfig):
    assistant = GemmaAssistant(config=cfg, params=_jax.device_put(params))
    return assistant if dtype is None else assistant.with_dtype(dtype)
  # Device arrays, not numpy: a jitted call would copy numpy params host -> device
  # on every call (for the demo target, ~8 ms per sentence on CPU).
  model = Model(config=cfg, params=_jax.device_put(params))
  return pack(model if dtype is None else model.with_dtype(dtype), kernels=kernels)


def _compute_dtype(dtype) -> str | None:
  """`dtype` (a name, or a numpy / JAX dtype such as jnp.bfloat16) as its name, one of
  COMPUTE_DTYPES; None stays None (as stored)."""
  if dtype is None:
    return None
  try:
    name = _jax.numpy.dtype(dtype).name if not isinstance(dtype, bool) else None
  except (TypeError, ValueError):
    name = None
  if name not in COMPUTE_DTYPES:
    raise InputError(f"dtype must be one of {', '.join(COMPUTE_DTYPES)} (a name or a dtype "
                     f"such as jnp.bfloat16) or None (as stored), got {dtype!r}")
  return name


def save(path, model: Model, dtype=None) -> None:
  """Save `model` in our own format (config + safetensors); `sd.load(path)` reads it back.

  `path` is a new or empty directory, or one written by `sd.save` before (overwritten);
  a directory holding a checkpoint of another format (Hugging Face, T5X) is refused.
  Saving over another model's checkpoint (another config) removes the tokenizer files
  saved beside it (spiece.model, tokenizer.json, ...): they were the old model's.
  """
  from specdec_jax.io import checkpoints
  if isinstance(path, Model) and isinstance(model, (str, _os.PathLike)):
    raise InputError(f"sd.save takes (path, model), got (model, {model!r}): call "
                     f"sd.save({model!r}, model)")
  if not isinstance(model, Model):
    raise InputError(f"sd.save(path, model): model must be an sd.Model, got "
                     f"{type(model).__name__}")
  if not isinstance(path, (str, _os.PathLike)):
    raise InputError(f"sd.save(path, model): path must be a directory path, got "
                     f"{type(path).__name__}")
  checkpoints.save_checkpoint(path, model.config, model.params, dtype=dtype)


def load_tokenizer(path_or_name):
  """SentencePiece tokenizer with T5 conventions (pad 0, EOS 1, unk 2)."""
  from specdec_jax.io.tokenizer import load_tokenizer as _load
  return _load(path_or_name)
