"""TPU kernels for decode requests: Pallas through Mosaic TPU.

    from specdec_jax.kernels import tpu
    wp = tpu.pack(w, dtype)                # once per model: w [K, N] -> [Kp, Np] float32/bfloat16
    y = tpu.dot(x, wp, n=w.shape[1])       # x [..., K] -> [..., N] float32
    s = tpu.sum_squares(x, ones)           # x [..., K] -> [..., 1]; ones = tpu.pack(ones [K, 1])
    o = tpu.attention(q, k, v, bias=None, lengths=None)  # q [B, T, H, D], k/v [B, Hkv, S, D],
                                                         # lengths [B, T] -> [B, T, H, D]

Every output row is computed by the same operations in the same order whatever the
number of rows M (batch x call width), the row's position and the call width: rows are
cut into tiles of `matmul.TM`, K and N into tiles fixed by the weight's shape
(`matmul.tiles`), and each output tile accumulates its K steps in order, one MXU product
a step (an MXU computes a row from that row and the weights alone). There is no
M-dependent split of K. Attention walks the fixed-shape cache in chunks of
`decode_attention.C` keys with the same operations for every query row, up to the
longest row's length in a tile of query rows, and masks each row's keys past its own.

Where no TPU is the default backend, the same kernels (grid, blocks, K order) run in
Pallas's TPU interpret mode (`interpret()`: slow; for tests and CI), each MXU product
replaced by an in-order product (`matmul.product`). `lower_for_tpu` runs Pallas's Mosaic
TPU lowering on any machine, which checks block shapes (last two dims divisible by 8 and
128) and operations; the kernels take interpret=False for it. Never run on a TPU yet:
neither their speed nor their agreement there is measured.
"""

from specdec_jax.kernels.tpu.decode_attention import attention
from specdec_jax.kernels.tpu.matmul import dot, pack, sum_squares
from specdec_jax.kernels.tpu.mode import interpret, lower_for_tpu

__all__ = ["attention", "dot", "interpret", "lower_for_tpu", "pack", "sum_squares"]
