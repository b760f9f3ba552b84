"""How the GPU kernels run here: compiled by Mosaic GPU on a GPU, else interpreted.

    mode.interpret()           # True where the default backend is not a GPU
    mode.params(None)          # pallas_call's `interpret=` argument
    mode.lower_for_cuda(f, *args)   # Mosaic GPU's lowering of jit(f), on any machine
"""

from __future__ import annotations

import jax


def interpret() -> bool:
  """Whether the kernels run in Pallas's GPU interpret mode (no GPU backend here)."""
  return jax.default_backend() != "gpu"


def params(interpret_: bool | None = None):
  """`pallas_call(interpret=...)`: False (compile for Mosaic GPU) or GPU interpret
  parameters; interpret_ None: `interpret()`.

  Allocations start zeroed, as Mosaic GPU zeroes a WGMMA accumulator it allocates (the
  interpreter's default, NaN, would poison the accumulators).
  """
  if not (interpret() if interpret_ is None else interpret_):
    return False
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
  return InterpretGPUParams(uninitialized_memory="zero")


def lower_for_cuda(f, *args, **kwargs):
  """jit(f)(*args) lowered for CUDA: runs Mosaic GPU's lowering (no GPU needed) and
  raises where a kernel uses a construct it rejects. The kernels must not be in
  interpret mode for this (`interpret()` is False, or the caller forces compiling)."""
  return jax.jit(f, **kwargs).trace(*args).lower(lowering_platforms=("cuda",))
