"""How the TPU kernels run here: compiled by Mosaic TPU on a TPU, else interpreted.

    mode.interpret()              # True where the default backend is not a TPU
    mode.params(None)             # pallas_call's `interpret=` argument
    mode.lower_for_tpu(f, *args)  # Mosaic TPU's lowering of jit(f), on any machine
"""

from __future__ import annotations

import jax
from jax.experimental.pallas import tpu as pltpu


def interpret() -> bool:
  """Whether the kernels run in Pallas's TPU interpret mode (no TPU backend here)."""
  return jax.default_backend() != "tpu"


def params(interpret_: bool | None = None):
  """`pallas_call(interpret=...)`: False (compile for Mosaic TPU) or TPU interpret
  parameters; interpret_ None: `interpret()`.

  Scratch starts as NaN (the interpreter's default), so a kernel that read its
  accumulator before writing it would show: every kernel writes it first.
  """
  if not (interpret() if interpret_ is None else interpret_):
    return False
  return pltpu.InterpretParams()


def lower_for_tpu(f, *args, **kwargs):
  """jit(f)(*args) lowered for TPU: runs Pallas's Mosaic TPU lowering (no TPU needed),
  which raises where a kernel uses a block shape, layout or operation it rejects. The
  kernels must not be in interpret mode for this (pass interpret=False)."""
  return jax.jit(f, **kwargs).trace(*args).lower(lowering_platforms=("tpu",))
