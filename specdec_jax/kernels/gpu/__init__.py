"""GPU kernels for decode requests: Pallas on NVIDIA Hopper through Mosaic GPU.

    from specdec_jax.kernels import gpu
    wp = gpu.pack(w, dtype)                # once per model: w [K, N] -> [P, Kp, Np] bfloat16
    y = gpu.dot(x, wp, n=w.shape[1])       # x [..., K] -> [..., N] float32
    s = gpu.sum_squares(x, ones)           # x [..., K] -> [..., 1]; ones = gpu.pack(ones [K, 1])
    o = gpu.attention(q, k, v, bias=None, lengths=None)   # q [B, T, H, D], grouped k/v
                                           # [B, Hkv, S, D], lengths [B, T] -> [B, T, H, D]

Every output row is computed by the same instructions in the same order whatever the
number of rows M (batch x call width), the row's position and the call width: rows are
cut into tiles of `matmul.TM` (padded with zeros), each tile runs the same tensor-core
(WGMMA) sequence over K in fixed steps, and a tensor-core product computes a row from
that row and the weights alone. How a weight is walked (column tile, K step, copy
stages in flight, K split into parts added in a fixed order) is a `tiles.Tiles` from a
table keyed by the weight's shape and dtype (`tiles.dot_tiles`; the device check's sweep
writes it), never by M. Attention walks the fixed-shape cache in chunks of a fixed
number of keys (`tiles.chunk`) with the same operations for every query row.

Where no GPU is the default backend, the same kernels run in Pallas's GPU interpret mode
(`interpret()`: slow; for tests and CI), each WGMMA replaced by an in-order product (the
interpreter's WGMMA is the host BLAS's matmul, whose rows can depend on their position).
`lower_for_cuda` runs Mosaic GPU's lowering on any machine (`mode.lower_for_cuda`; the
kernels take interpret=False for it).

The dot streams its row and weight tiles through a multi-stage copy pipeline
(`plgpu.emit_pipeline`) and splits K for a small N; the norm's sum of squares is that dot
(its own table entry, [K, 1] float32); attention copies each chunk and waits for it (its
chunk size is a table entry). Lowered for CUDA and run in interpret mode only: what they cost on
a GPU is for `scripts/gpu_check.py` to measure.
"""

from specdec_jax.kernels.gpu.decode_attention import attention
from specdec_jax.kernels.gpu.matmul import dot, pack, sum_squares
from specdec_jax.kernels.gpu.mode import interpret, lower_for_cuda
from specdec_jax.kernels.gpu.tiles import Tiles

__all__ = ["Tiles", "attention", "dot", "interpret", "lower_for_cuda", "pack", "sum_squares"]
