"""The decode kernels behind one seam: backends that answer the products a decode request
asks for (`backends`: xla, cpu, gpu, tpu), and the CPU backend's C++ kernels (this
package's top level: skinny products on pre-packed weights and attention, through XLA
FFI).

A cached decode call runs M = batch x k rows through every decoder product. On CPU,
XLA runs M = 1 as a GEMV and M >= 2 through another library, so a k-token verify
call costs 1.3-1.5x a 1-token step and its rows round differently from 1-token
steps. `skinny.dot` streams each weight panel once for all M rows, with a fixed
per-element accumulation order, and `row_attention.attention` computes every query
row with the same operations: every row is bitwise independent of M (of the tokens
in the call, and of the batch). What a k-token call then costs: README, "Where decode
time goes on CPU".

    from specdec_jax import kernels
    kernels.status()                       # Status(available, reason, library)
    wp = kernels.pack(w)                   # once per model: w [K, N] f32 / bf16
    y = kernels.dot(x, wp, n=w.shape[1])   # x [..., K] -> [..., N] float32
    o = kernels.attention(q, k, v, bias, lengths)  # q [B, T, H, D], k/v [B, Hkv, S, D]

Built on first use with the system C++ compiler (see `build`), for AVX-512F or AVX2
(with FMA; same results from either); where the backend is not the CPU, the CPU has
neither, there is no compiler, the build fails, or SPECDEC_CPU_KERNELS=0,
`available()` is False and the models use XLA's ops.
These are the `cpu` backend of `backends`; `gpu` (Pallas kernels for NVIDIA Hopper,
`kernels.gpu`) and `tpu` (Pallas kernels through Mosaic TPU, `kernels.tpu`) are explicit
opt-ins until a device check has measured them (`verified`), and `xla` is none. Which
product of a decode request (the encoder and cross-attention K/V of `Model.start`, every
cached decode call) runs on which backend's kernels is decided in one place, `dispatch`
(its `Policy`); the weights are packed for one backend by an explicit step,
`sd.pack(model, kernels=...)` or `sd.load(..., kernels=...)` (`models.packing`).
Teacher-forced passes keep XLA's ops.
"""

from specdec_jax.kernels.build import ENV_VAR, Status, available, status
from specdec_jax.kernels.row_attention import attention
from specdec_jax.kernels.skinny import check_packed, dot, pack

__all__ = ["ENV_VAR", "Status", "attention", "available", "check_packed", "dot", "pack",
           "status"]
