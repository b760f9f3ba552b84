"""Child Python processes for the multi-process tests: N forced CPU devices each, and
`jax.distributed` on loopback (127.0.0.1).

    outs = run_processes(lambda i, port: [..., "--process-id", str(i)], processes=2, devices=4)

The children inherit the environment, so they share the tests' compilation cache
(conftest.py puts it in JAX_COMPILATION_CACHE_DIR), and import this checkout first.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
from typing import Callable, Sequence

REPO = pathlib.Path(__file__).resolve().parent.parent


def free_port() -> int:
  """A TCP port free on 127.0.0.1 (for the coordinator of `jax.distributed`)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def device_env(devices: int) -> dict[str, str]:
  """This process's environment with `devices` forced CPU devices and the repo importable."""
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
  return dict(os.environ, XLA_FLAGS=flags.strip(),
              PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def run_processes(command: Callable[[int, int], Sequence[str]], processes: int, devices: int,
                  timeout: int = 600) -> list[str]:
  """Start `command(i, port)` for i in [0, processes) at once, `devices` CPU devices each,
  one coordinator port for all; their stdouts, in process order (the test fails if any
  exits non-zero). Every process is killed on the way out, so none is left waiting in a
  collective for a peer that failed."""
  port = free_port()
  procs = [subprocess.Popen(list(command(i, port)), env=device_env(devices),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(processes)]
  try:
    results = [p.communicate(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (_, err) in zip(procs, results, strict=True):
    assert p.returncode == 0, err[-4000:]
  return [out for out, _ in results]
