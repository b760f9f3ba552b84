"""Several processes decoding one input file: `jax.distributed`, inputs split by rows.

    # on each of 2 hosts (or twice on one, for a test), the same command but --process-id:
    specdec decode --model DIR --input-file prompts.txt --json \\
        --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0

`--distributed` alone lets `jax.distributed.initialize()` detect the cluster (Cloud TPU
pod slices, SLURM, Open MPI); the three flags default to the environment variables
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID.

Every process reads the whole input; process 0 prints the outputs, in input order. Two
layouts, chosen by the size of --mesh (`flags.mesh.mesh_from_flag`):

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
import dataclasses
import os
import socket
import time

import jax
import numpy as np

from specdec_jax.batching import Batch
from specdec_jax.errors import SpecdecError
from specdec_jax.flags import FlagError
from specdec_jax.runs import Corpus
from specdec_jax.runtime import liveness, supervise

ENV = {"coordinator": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES",
       "process_id": "JAX_PROCESS_ID"}


class CoordinatorError(FlagError):
  """The processes could not be joined: no coordinator answered, or not all processes came."""


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
  group.add_argument("--coordinator-timeout", type=float, default=60.0, metavar="SECONDS",
                     help="a process other than 0 gives up with an error when the coordinator's "
                     "port does not open within this time; it also bounds jax.distributed's wait "
                     "for every process to join (where JAX aborts the process)")
  group.add_argument("--heartbeat-timeout", type=float, default=30.0, metavar="SECONDS",
                     help="a process silent for this long is lost: the others stop with an "
                     "error naming it (exit 1)")


def _env_int(name: str) -> int | None:
  value = os.environ.get(ENV[name])
  if value is None:
    return None
  if not value.strip().isdigit():
    raise FlagError(f"{ENV[name]}={value!r} is not a non-negative integer")
  return int(value)


@dataclasses.dataclass(frozen=True)
class Processes:
  """How this process joins the others (`jax.distributed`): the flags, or their
  environment variables (`ENV`), unset as None.

  Attributes:
    coordinator: process 0's coordinator service, HOST:PORT.
    num_processes: the number of processes.
    process_id: this process's index in [0, num_processes).
    detect: --distributed: initialise even with none of the above (cluster detection).
    coordinator_timeout: seconds a process waits for the coordinator (and for every
      process to join).
    heartbeat_timeout: seconds of silence after which a process is lost.
  """

  coordinator: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  detect: bool = False
  coordinator_timeout: float = 60.0
  heartbeat_timeout: float = 30.0


def processes_from_args(args) -> Processes:
  """The `Processes` of --coordinator, --num-processes, --process-id (each defaulting to
  its environment variable) and --distributed."""
  return Processes(
      coordinator=args.coordinator or os.environ.get(ENV["coordinator"]),
      num_processes=(args.num_processes if args.num_processes is not None
                     else _env_int("num_processes")),
      process_id=args.process_id if args.process_id is not None else _env_int("process_id"),
      detect=bool(args.distributed),
      coordinator_timeout=args.coordinator_timeout, heartbeat_timeout=args.heartbeat_timeout)


def requested(processes: Processes) -> bool:
  """Whether `processes` asks for several processes: --distributed, or any of
  --coordinator, --num-processes, --process-id (or their environment variables)."""
  return processes.detect or any(
      v is not None for v in (processes.coordinator, processes.num_processes,
                              processes.process_id))


def initialize(processes: Processes) -> bool:
  """`jax.distributed.initialize` (before any JAX computation); whether it was called. A
  partial set of --coordinator / --num-processes / --process-id is an error naming the
  missing ones. The `specdec` command runs such a process as a supervised child
  (`supervise`), told here once the processes are joined."""
  given = {"--coordinator": processes.coordinator, "--num-processes": processes.num_processes,
           "--process-id": processes.process_id}
  if not requested(processes):
    return False
  if any(v is not None for v in given.values()):
    missing = [flag for flag, v in given.items() if v is None]
    count, index = processes.num_processes, processes.process_id
    if missing or count is None or index is None:
      raise FlagError(f"{', '.join(missing)} missing: --coordinator, --num-processes and "
                     "--process-id go together (or --distributed alone to detect the cluster)")
    if count < 1 or not 0 <= index < count:
      raise FlagError(f"--process-id {index} must be in [0, --num-processes {count})")
  for flag in ("coordinator_timeout", "heartbeat_timeout"):
    if not getattr(processes, flag) > 0:
      raise FlagError(f"--{flag.replace('_', '-')} must be positive, not "
                     f"{getattr(processes, flag)}")
  coordinator, process = processes.coordinator, processes.process_id
  if coordinator:      # jaxlib reads the port from it with no check of its own
    host_and_port(coordinator)
  if coordinator and process != 0:    # jaxlib aborts (C++) when it finds no one: ask first
    wait_for_coordinator(coordinator, processes.coordinator_timeout, process)
  try:
    jax.distributed.initialize(
        coordinator, processes.num_processes, process,
        initialization_timeout=max(1, int(processes.coordinator_timeout + 0.5)),
        heartbeat_timeout_seconds=liveness.jax_heartbeat(processes.heartbeat_timeout),
        shutdown_timeout_seconds=liveness.jax_heartbeat(processes.heartbeat_timeout))
  except Exception as e:    # jaxlib raises its own runtime errors: one line of ours instead
    if isinstance(e, SpecdecError):
      raise
    where = coordinator or "the detected coordinator"
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    raise CoordinatorError(
        f"process {process if process is not None else '?'} could not join the processes "
        f"through the coordinator at {where} within --coordinator-timeout "
        f"{processes.coordinator_timeout:g} s (is process 0 running there, with the same "
        f"--num-processes?): {first}") from None
  from jax._src import distributed as jax_distributed  # the client: no public accessor
  state = jax_distributed.global_state
  supervise.joined(jax.process_index(), jax.process_count(),
                   coordinator or getattr(state, "coordinator_address", None))
  liveness.start(state.client, jax.process_index(), jax.process_count(),
                 processes.heartbeat_timeout, coordinator)
  return True


def host_and_port(address: str) -> tuple[str, int]:
  """(host, port) of a coordinator's HOST:PORT ([::1]:PORT for IPv6); a FlagError for
  anything else."""
  host, sep, port = address.rpartition(":")
  if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
    raise FlagError(f"--coordinator {address!r} is not HOST:PORT (e.g. 10.0.0.1:1234: process "
                   "0's host and a free port on it)")
  return host.strip("[]"), int(port)


def wait_for_coordinator(address: str, timeout: float, process: int | None = None,
                         poll: float = 0.5) -> None:
  """Return once a TCP connection to `address` (HOST:PORT) opens; a CoordinatorError when
  none did within `timeout` seconds. jax.distributed's own connect ends the process from
  C++ (SIGABRT, a stack trace) when its time runs out, so this check speaks first."""
  host, port = host_and_port(address)
  deadline = time.monotonic() + timeout
  while True:
    try:
      with socket.create_connection((host, port), timeout=max(0.1, min(poll * 4, timeout))):
        return
    except OSError as e:
      if time.monotonic() + poll > deadline:
        who = "" if process is None else f"process {process}: "
        raise CoordinatorError(
            f"{who}no coordinator answered at {address} within --coordinator-timeout "
            f"{timeout:g} s ({e.strerror or e}): start process 0 there first, or check the "
            "address") from None
      time.sleep(poll)


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
  merged = [jax.tree_util.tree_map(lambda x, p=p: np.asarray(x)[p], outputs[b])
            for p in range(processes) for b in range(batches)]
  return Corpus(tuple(merged), tuple(int(r) for r in real.reshape(-1)))


def gather_max(value: float) -> float:
  """The largest `value` over the processes (e.g. the slowest one's wall time)."""
  from jax.experimental import multihost_utils
  return float(np.max(multihost_utils.process_allgather(np.float64(value))))

