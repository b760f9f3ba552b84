"""Several processes decoding one input file: `jax.distributed`, inputs split by rows.

    # on each of 2 hosts (or twice on one, for a test), the same command but --process-id:
    specdec decode --model DIR --input-file prompts.txt --json \\
        --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0

`--distributed` alone lets `jax.distributed.initialize()` detect the cluster (Cloud TPU
pod slices, SLURM, Open MPI); the three flags default to the environment variables
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID.

Every process reads the whole input; process 0 prints the outputs, in input order. Two
layouts, chosen by the size of --mesh (`mesh_args.mesh_from_args`):

- a mesh of each process's own devices (D * M = the local device count), or no --mesh:
  data-parallel across processes. Each decodes its own contiguous block of rows
  (`process_rows`), model-parallel within the host where the interconnect is fastest, and
  the outputs of all processes are gathered (`multihost_utils.process_allgather`). Every
  process decodes the same number of batches of the same shape (the last blocks are
  padded with repeated rows that are dropped), so the gather is one collective over
  equal shapes.
- one global mesh over every process's devices (D * M = the total device count): a model
  too large for one host's devices split across hosts. Every process runs every batch
  as one program on global arrays (the batch split over "data"), and each output is
  gathered whole (`sd.sharding.to_host`). Devices are laid out in `jax.devices()` order
  (process 0's first), so with M at most the devices of one host, "model" stays within
  a host and "data" spans the hosts.
"""

from __future__ import annotations

import argparse
import os
import jax
import numpy as np

from specdec_jax.tools.batching import Batch
from specdec_jax.tools.errors import CLIError
from specdec_jax.tools.methods import Corpus

ENV = {"coordinator": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES",
       "process_id": "JAX_PROCESS_ID"}


def add_distributed_flags(p: argparse.ArgumentParser) -> None:
  group = p.add_argument_group(
      "several processes (jax.distributed; each decodes a block of the input rows)")
  group.add_argument("--coordinator", metavar="HOST:PORT",
                     help="address of process 0's coordinator service (env "
                     "JAX_COORDINATOR_ADDRESS)")
  group.add_argument("--num-processes", type=int,
                     help="number of processes (env JAX_NUM_PROCESSES)")
  group.add_argument("--process-id", type=int,
                     help="this process's index in [0, N) (env JAX_PROCESS_ID)")
  group.add_argument("--distributed", action="store_true",
                     help="initialise jax.distributed, detecting the cluster (TPU pod slices, "
                     "SLURM, Open MPI) when the flags above are not given")


def _env_int(name: str) -> int | None:
  value = os.environ.get(ENV[name])
  if value is None:
    return None
  if not value.strip().isdigit():
    raise CLIError(f"{ENV[name]}={value!r} is not a non-negative integer")
  return int(value)


def initialize_from_args(args) -> bool:
  """`jax.distributed.initialize` from the flags (before any JAX computation); whether it
  was called. A partial set of --coordinator / --num-processes / --process-id is an
  error naming the missing ones."""
  coordinator = args.coordinator or os.environ.get(ENV["coordinator"])
  processes = args.num_processes if args.num_processes is not None else _env_int(
      "num_processes")
  process = args.process_id if args.process_id is not None else _env_int("process_id")
  given = {"--coordinator": coordinator, "--num-processes": processes,
           "--process-id": process}
  if not args.distributed and all(v is None for v in given.values()):
    return False
  if any(v is not None for v in given.values()):
    missing = [flag for flag, v in given.items() if v is None]
    if missing:
      raise CLIError(f"{', '.join(missing)} missing: --coordinator, --num-processes and "
                     "--process-id go together (or --distributed alone to detect the cluster)")
    if processes < 1 or not 0 <= process < processes:
      raise CLIError(f"--process-id {process} must be in [0, --num-processes {processes})")
  jax.distributed.initialize(coordinator, processes, process)
  return True


def process_rows(n: int, process: int, processes: int) -> tuple[int, int, int]:
  """(start, stop, block) of process `process`'s rows of n: contiguous blocks of
  `block` = ceil(n / processes) rows, the last ones shorter (possibly empty).

  >>> [process_rows(5, p, 2) for p in range(2)]
  [(0, 3, 3), (3, 5, 3)]
  """
  block = -(-n // processes)
  start = min(n, process * block)
  return start, min(n, start + block), block


def local_batches(tokens: np.ndarray, batch: int, process: int, processes: int
                  ) -> list[Batch]:
  """This process's rows of `tokens` [N, L] in batches of `batch` rows, padded so that
  every process has the same number of equal batches; padding rows are not `real`."""
  start, stop, block = process_rows(len(tokens), process, processes)
  rows = tokens[start:stop] if stop > start else tokens[:1]
  rows = np.concatenate([rows, np.repeat(rows[-1:], block - len(rows), 0)])
  real = stop - start
  out = []
  for i in range(0, block, batch):
    chunk = rows[i:i + batch]
    chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - len(chunk), 0)])
    out.append(Batch(chunk, int(np.clip(real - i, 0, batch))))
  return out


def gather_corpus(corpus: Corpus) -> Corpus:
  """Every process's `corpus` (equal shapes) gathered, in process order: one corpus of
  all rows in input order, on every process."""
  from jax.experimental import multihost_utils
  outputs = multihost_utils.process_allgather(list(corpus.outputs))
  real = np.asarray(multihost_utils.process_allgather(np.asarray(corpus.real_rows, np.int32)))
  processes, batches = real.shape
  merged = [jax.tree_util.tree_map(lambda x: np.asarray(x)[p], outputs[b])
            for p in range(processes) for b in range(batches)]
  return Corpus(tuple(merged), tuple(int(r) for r in real.reshape(-1)))


def gather_max(value: float) -> float:
  """The largest `value` over the processes (e.g. the slowest one's wall time)."""
  from jax.experimental import multihost_utils
  return float(np.max(multihost_utils.process_allgather(np.float64(value))))

