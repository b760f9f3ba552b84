"""Several processes fail loudly: a lost process stops the other within a bounded time with
an error naming it, and a coordinator nobody serves is reported within --coordinator-timeout.

The fast tier tests the pieces in this process (the watchdog on a fake key-value store, the
coordinator probe on a closed and an open port); the slow tier runs `specdec decode` as
two processes on loopback and kills one (SIGKILL)."""

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from loopback import device_env, free_port

from specdec_jax.tools.cli import distributed, liveness


class FakeClient:
  """jax.distributed's key-value calls on a dict; `down` makes every call fail."""

  def __init__(self):
    self.kv, self.down, self.lock = {}, False, threading.Lock()

  def key_value_set(self, key, value, allow_overwrite=False):
    if self.down:
      raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
    with self.lock:
      self.kv[key] = value

  def key_value_dir_get(self, prefix):
    if self.down:
      raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
    with self.lock:
      return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]


@pytest.fixture
def deaths(monkeypatch):
  """The watchdog's fatal messages, recorded instead of ending the test process."""
  died = []

  def die(message):
    died.append(message)
    while True:        # never returns, as os._exit: this daemon thread just waits
      time.sleep(3600)
  monkeypatch.setattr(liveness, "_die", die)
  return died


def _wait(condition, seconds=10.0):
  end = time.monotonic() + seconds
  while not condition() and time.monotonic() < end:
    time.sleep(0.02)


def test_watchdog_names_a_silent_peer_and_spares_a_beating_one(deaths):
  client = FakeClient()

  def peer():      # process 1 beats for 0.6 s, then goes silent (killed)
    for beat in range(30):
      client.key_value_set(f"{liveness.PREFIX}1", str(beat), allow_overwrite=True)
      time.sleep(0.02)
  threading.Thread(target=peer, daemon=True).start()
  t0 = time.monotonic()
  liveness.start(client, 0, 2, timeout=0.3, coordinator="127.0.0.1:1", period=0.02)
  _wait(lambda: deaths)
  assert deaths == ["process 1 of 2 stopped answering (no heartbeat for 0.3 s: killed, "
                    "crashed or hung); stopping process 0"]
  assert 0.8 <= time.monotonic() - t0 < 5      # not while it was beating (0.58 s)


def test_watchdog_reports_the_lost_coordinator(deaths):
  client = FakeClient()
  liveness.start(client, 1, 2, timeout=30, coordinator="10.0.0.1:1234", period=0.02)
  client.key_value_set(f"{liveness.PREFIX}0", "1")
  time.sleep(0.1)
  assert deaths == []
  client.down = True
  _wait(lambda: deaths)
  assert deaths[0].startswith("lost process 0 (the coordinator at 10.0.0.1:1234): "
                              "UNAVAILABLE: Failed to send RPC")
  assert deaths[0].endswith("stopping process 1 of 2")


def test_watchdog_is_quiet_once_exiting(deaths):
  client = FakeClient()
  stopping = liveness.start(client, 0, 2, timeout=0.1, coordinator=None, period=0.02)
  stopping.set()                  # what atexit does: a peer waiting in shutdown is no loss
  time.sleep(0.4)
  assert deaths == []


def test_an_unserved_coordinator_is_reported_within_the_timeout():
  port = free_port()              # bound and released: nobody listens there
  t0 = time.monotonic()
  with pytest.raises(distributed.CoordinatorError,
                     match=rf"process 1: no coordinator answered at 127.0.0.1:{port} within "
                     r"--coordinator-timeout 1 s \(Connection refused\)"):
    distributed.wait_for_coordinator(f"127.0.0.1:{port}", 1.0, process=1, poll=0.1)
  assert 0.8 < time.monotonic() - t0 < 5
  with socket.socket() as server:    # a listening coordinator: returns at once
    server.bind(("127.0.0.1", 0))
    server.listen()
    distributed.wait_for_coordinator(f"127.0.0.1:{server.getsockname()[1]}", 1.0)
  with pytest.raises(distributed.CLIError, match="is not HOST:PORT"):
    distributed.wait_for_coordinator("localhost", 1.0)


# ----------------------------------------------------------------------------- processes

LINES = 3000          # far more than decodes before the kill


def _start(tmp, port, heartbeat=5):
  prompts = tmp / "prompts.txt"
  prompts.write_text("\n".join(f"{i % 50 + 2} {i % 7 + 3} 9 1" for i in range(LINES)) + "\n")
  procs = []
  for i in range(2):
    command = [sys.executable, "-m", "specdec_jax.tools.cli", "decode", "--model",
               "config:t5_1_1_tiny", "--input-file", str(prompts), "--batch-size", "2",
               "--max-new-tokens", "8", "--output", str(tmp / "out.txt"),
               "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
               "--process-id", str(i), "--heartbeat-timeout", str(heartbeat)]
    procs.append(subprocess.Popen(command, env=device_env(1), stdout=subprocess.DEVNULL,
                                  stderr=open(tmp / f"err{i}.txt", "w")))
  return procs


def _kill_mid_file(tmp, victim):
  """Start two processes, SIGKILL `victim` once the first round is written; (the
  survivor's exit code, seconds from the kill to its exit, its stderr)."""
  procs = _start(tmp, free_port())
  try:
    out = tmp / "out.txt"
    _wait(lambda: out.exists() and out.stat().st_size > 0, seconds=400)
    assert out.exists() and out.stat().st_size > 0, (tmp / "err0.txt").read_text()[-3000:]
    survivor = procs[1 - victim]
    assert survivor.poll() is None
    procs[victim].send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    code = survivor.wait(timeout=120)
    return code, time.monotonic() - t0, (tmp / f"err{1 - victim}.txt").read_text()
  finally:
    for p in procs:
      p.kill()


@pytest.mark.slow
def test_losing_process_1_stops_process_0_with_one_line(tmp_path):
  code, seconds, err = _kill_mid_file(tmp_path, victim=1)
  last = err.strip().splitlines()[-1]
  assert code == 1, err[-3000:]
  assert last == ("specdec decode: error: process 1 of 2 stopped answering (no heartbeat "
                  "for 5 s: killed, crashed or hung); stopping process 0")
  assert seconds < 5 + 25, seconds    # the heartbeat timeout, and slack for a loaded machine
  print(f"\nprocess 0 stopped {seconds:.1f} s after process 1 was killed")


@pytest.mark.slow
def test_losing_process_0_aborts_process_1_promptly(tmp_path):
  """Process 0 hosts the coordination service: when it dies, JAX's C++ error polling in
  process 1 fails at once and aborts the process (SIGABRT) before Python can speak. What
  is promised: a non-zero exit within a bounded time, and JAX's line naming the leader."""
  code, seconds, err = _kill_mid_file(tmp_path, victim=0)
  assert code != 0
  assert ("specdec decode: error: lost process 0" in err
          or "Either the leader task was preempted/died" in err), err[-3000:]
  assert seconds < 5 + 25, seconds
  print(f"\nprocess 1 ended (code {code}) {seconds:.1f} s after process 0 was killed")


@pytest.mark.slow
def test_unserved_coordinator_fails_with_one_line(tmp_path):
  port = free_port()
  t0 = time.monotonic()
  run = subprocess.run([sys.executable, "-m", "specdec_jax.tools.cli", "decode", "--model",
                        "config:t5_1_1_tiny", "5 1", "--coordinator", f"127.0.0.1:{port}",
                        "--num-processes", "2", "--process-id", "1",
                        "--coordinator-timeout", "3"],
                       env=device_env(1), capture_output=True, text=True, timeout=300,
                       check=False)
  seconds = time.monotonic() - t0
  assert run.returncode not in (0, -signal.SIGABRT), run.stderr[-3000:]
  assert run.stderr.strip().splitlines()[-1] == (
      f"specdec decode: error: process 1: no coordinator answered at 127.0.0.1:{port} "
      "within --coordinator-timeout 3 s (Connection refused): start process 0 there first, "
      "or check the address")
  assert seconds < 3 + 60, seconds      # the timeout and Python's start-up, not JAX's 300 s


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q"]))
