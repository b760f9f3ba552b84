"""`decode`: the one entry point that runs any method value (see `base`); `lower`: the
same program lowered for other platforms (TPU, CUDA) without running it."""

from __future__ import annotations

import dataclasses

import jax

from specdec_jax import sampling as sampling_lib
from specdec_jax.errors import InputError, SamplingError
from specdec_jax.kernels import backends
from specdec_jax.kernels.dispatch import DecodeWeights
from specdec_jax.methods.autoregressive import Autoregressive
from specdec_jax.methods.base import Method
from specdec_jax.methods.beam import Beam
from specdec_jax.methods.bild import BiLD
from specdec_jax.methods.blockwise import Blockwise
from specdec_jax.methods.speculative import Speculative
from specdec_jax.models.model import Model
from specdec_jax.rounds import requests
from specdec_jax.rounds.buffer import DecodeOutput

#: The package's stable method types (`decode` runs any `Method`; its error for another value
#: names these). `specdec_jax.experimental.METHODS`: the experimental ones.
METHODS = (Autoregressive, Speculative, BiLD, Blockwise, Beam)


def decode(target: Model, method: Method, inputs, max_new_tokens: int = 64,
           sampling: sampling_lib.SamplingSettings | None = None, rng=None,
           eos_id: int | None = None, prompt_lengths=None) -> DecodeOutput:
  """Decode `inputs` int [B, Le] (0-padded) with `method`; the target verifies.

  A decoder-only target continues prompts: `inputs` are right-padded prompts
  [B, P], row b's first P_b tokens real (docs/decoder-only.md); P + max_new_tokens must fit
  its `max_positions` (learned or rotary). A T5 target's ids are used verbatim: end each
  row with EOS as the tokenizer's `encode` does, or its output differs (no EOS is added).

  Args:
    target: the model whose output (or distribution) the method reproduces.
    method: `sd.Autoregressive()`, `sd.Speculative(drafter, ...)`, `sd.BiLD(small, ...)`,
      `sd.Blockwise(heads, ...)`, `sd.Beam(num_beams, alpha)` (its own loop: `beam`), or
      an experimental method (`specdec_jax.experimental`).
    max_new_tokens: T, tokens per row at most.
    sampling: `sd.Greedy()` (default) or `sd.Sampling(temperature, top_k, top_p)`, applied
      alike to the target's and the proposer's distributions.
    rng: a PRNG key or an int seed (sampling).
    eos_id: a row stops after it (None: the target's EOS; negative: never).
    prompt_lengths: int [B] a decoder-only target's prompt lengths P_b (None: one past
      each row's last token that is not the pad id).
  Returns:
    DecodeOutput(tokens int [B, T] (0 after EOS), lengths int [B], counters; `.stats`).

  Example::

      >>> import specdec_jax as sd, numpy as np
      >>> target = sd.load("config:t5_1_1_tiny")
      >>> out = sd.decode(target, sd.Speculative(target, gamma=2), np.array([[5, 6, 1]]),
      ...                 max_new_tokens=3, sampling=sd.Sampling(temperature=0.7), rng=0)
      >>> out.tokens.shape, out.lengths.shape
      ((1, 3), (1,))
  """
  request = _request(target, method, inputs, max_new_tokens, sampling, rng, eos_id,
                     prompt_lengths)            # checked first: `method` may be no method
  out = method.run(*request)
  # the value names its run and says which statistics it reports (`Method`)
  info = (("method", method.name),) + tuple(kv for kv in out.info if kv[0] != "method")
  return dataclasses.replace(out, info=info, statistics=method.statistics)


def lower(target: Model, method: Method, inputs, *, max_new_tokens: int,
          platforms=("tpu",), sampling: sampling_lib.SamplingSettings | None = None,
          eos_id: int | None = None, prompt_lengths=None) -> jax.stages.Lowered:
  """The program `decode(target, method, inputs, ...)` runs, lowered for
  `platforms` and compiled for none: the same checks, the same jitted function with the
  same arguments (`Method.program`), traced with each packed model's kernels as they run
  there (`backends.lowering`). On a CPU machine it checks, or compiles ahead of time,
  the program for a TPU or a GPU: `sd.lower(...).as_text()` is its StableHLO.

  Args:
    target: as `decode`; so are method, inputs, max_new_tokens, sampling, eos_id
      and prompt_lengths (no rng: the key is an argument of the program, any gives it).
    platforms: the lowering platforms, e.g. ("tpu",), ("cuda",), ("cpu",), or several
      (one program that runs on each; XLA's ops only); "gpu" means "cuda" (NVIDIA).
  Returns:
    `jax.stages.Lowered` (`.as_text()`, `.compile()` on a machine of that platform).
  Raises:
    InputError: a model packed for kernels that do not compile for `platforms` (the cpu
      backend's C++ kernels for anything but ("cpu",); gpu: ("cuda",) or ("cpu",)).

  Only the decode loop is lowered: `sd.Blockwise(oracle=True)`'s oracle pass is a
  second program `decode` runs after it.

  Example::

      >>> import specdec_jax as sd, numpy as np
      >>> target = sd.load("config:t5_1_1_tiny", kernels="xla")
      >>> lowered = sd.lower(target, sd.Speculative(target, gamma=2), np.array([[5, 6, 1]]),
      ...                    max_new_tokens=3, platforms=("tpu",))
      >>> "stablehlo.while" in lowered.as_text()
      True
  """
  platforms = lowering_platforms(platforms)
  request = _request(target, method, inputs, max_new_tokens, sampling, 0, eos_id,
                     prompt_lengths)       # the key is an argument: any gives this program
  _check_kernels(target, method, platforms)
  return method.program(*request).lower(platforms)


#: JAX's lowering platforms, and the names users type for them.
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
PLATFORM_ALIASES = {"gpu": "cuda", "nvidia": "cuda", "amd": "rocm"}


def lowering_platforms(platforms) -> tuple[str, ...]:
  """`platforms` as JAX's lowering names ("gpu" -> "cuda", any case); InputError naming
  the known ones for another name or a bare string."""
  if isinstance(platforms, str) or not platforms or not all(
      isinstance(p, str) for p in platforms):
    raise InputError(f"platforms must be a non-empty tuple of platform names such as "
                     f"('tpu',) or ('cuda',), got {platforms!r}")
  out = []
  for name in platforms:
    key = name.strip().lower()
    key = PLATFORM_ALIASES.get(key, key)
    if key not in PLATFORMS:
      raise InputError(f"unknown platform {name!r}: lower for one of {', '.join(PLATFORMS)} "
                       "(\"gpu\" means cuda, NVIDIA's; rocm is AMD's); no such device is "
                       "needed here")
    out.append(key)
  return tuple(dict.fromkeys(out))


def _request(target, method, inputs, max_new_tokens, sampling, rng, eos_id,
             prompt_lengths) -> tuple:
  """The checked arguments of `Method.run` / `Method.program` for a `decode` call."""
  if not isinstance(method, Method):
    names = [m.__name__ for m in METHODS]
    raise InputError(f"method must be one of sd.{', sd.'.join(names)}, "
                     f"got {type(method).__name__}")
  requests.check_target(target)
  if target.is_decoder_only:
    inputs, prompt_lengths = requests.check_prompt(inputs, target.config,
                                                         max_new_tokens, prompt_lengths)
  elif prompt_lengths is not None:
    raise InputError("prompt_lengths is for decoder-only targets; a T5 encoder input is "
                     "masked by its pad tokens")
  else:
    inputs = requests.check_request(inputs, target.config, max_new_tokens)
  sampling = sampling_lib.as_sampling(sampling)
  if method.greedy_only and not sampling.is_greedy:
    raise SamplingError(f"{_spelled(type(method))} is deterministic: drop sampling (it takes "
                        f"no temperature, top-k or top-p), got {sampling!r}")
  return (target, inputs, max_new_tokens, sampling, rng,
          requests.resolve_eos(eos_id, target.config), prompt_lengths)


def _spelled(method_type: type) -> str:
  """How a user writes the method type: sd.Beam, experimental.SpeculativeBeam (a module
  name: this layer imports no experimental module)."""
  home = "experimental" if method_type.__module__.startswith("specdec_jax.experimental") \
      else "sd"
  return f"{home}.{method_type.__name__}"


def _check_kernels(target: Model, method: Method, platforms: tuple[str, ...]) -> None:
  """Raise unless every model of the request (the target's and the method's) is packed for
  kernels that lower for `platforms` (`backends.Backend.lowers_for`)."""
  found = jax.tree_util.tree_leaves((target, method),
                                    is_leaf=lambda x: isinstance(x, DecodeWeights))
  for name in sorted({w.policy.backend for w in found
                      if isinstance(w, DecodeWeights) and w.policy is not None}):
    backend = backends.get(name)
    if not backend.lowers_for(platforms):
      targets = ", ".join(repr((p,)) for p in backend.compiles_for)
      also = " or ('cpu',) (interpreted)" if backend.interprets else ""
      raise InputError(f"a model is packed for the {name} kernels, which lower for "
                       f"{targets}{also}, not {platforms}: pack it with kernels='xla' "
                       f"(sd.pack(model, kernels='xla'))")
