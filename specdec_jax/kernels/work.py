"""How the kernels split their work over XLA's intra-op thread pool (see pool.h).

    work.count(nbytes)    # threads for a call that streams nbytes: one per PARALLEL_BYTES

One core alone does not saturate memory bandwidth, and handing work to the pool costs
~10 us: on a 2-core AMD EPYC (AVX2), one thread per 64 KiB made the demo target's decode
step 1.4x faster than one per 4 MiB (which split none of its products), 256 KiB about as
fast as 64 KiB. The kernels cap the count at the pool's size and at their units of work.
"""

from __future__ import annotations

import os

#: Bytes streamed per thread (`SPECDEC_CPU_KERNEL_PARALLEL_BYTES`).
PARALLEL_BYTES = int(os.environ.get("SPECDEC_CPU_KERNEL_PARALLEL_BYTES", 64 << 10))
CHUNKS = 4    # chunks of work per thread: a late or slow helper leaves its share to others


def count(nbytes: int) -> int:
  """Threads for a call that streams `nbytes`: one per PARALLEL_BYTES, at least one."""
  return max(1, int(nbytes) // PARALLEL_BYTES)
