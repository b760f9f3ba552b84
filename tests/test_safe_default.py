"""kernels="auto" picks accelerator kernels only where the device check measured them
(specdec_jax/kernels/verified.json); kernels="gpu" checks the device (Mosaic GPU needs
Hopper) and runs a first-use self-check (kernels/selfcheck.py).

No GPU here: the platform is faked (`jax.default_backend`, `jax.devices`), the record
replaced, and the self-check's outcome scripted; the self-check itself runs on the cpu
backend, on the gpu backend in Pallas's interpret mode (slow), and on deliberately wrong
backends (negative controls).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import pathlib
import tomllib

import jax
import jax.numpy as jnp
import pytest

import specdec_jax as sd
from specdec_jax.kernels import backends, dispatch, selfcheck, shapes, verified

REPO = pathlib.Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"


@dataclasses.dataclass(frozen=True)
class FakeDevice:
  """What `backends` reads of a `jax.Device`."""

  device_kind: str
  compute_capability: str | None
  platform: str = "gpu"
  id: int = 0


@pytest.fixture
def fake_gpu(monkeypatch):
  """Pretend JAX's default backend is a GPU of a given kind; a fresh self-check cache, and
  a self-check whose calls are counted and whose outcome the test sets."""
  calls: list[tuple[str, str]] = []
  outcome = {"why": ""}

  def install(kind: str = H100, capability: str | None = "9.0"):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "devices", lambda *a: [FakeDevice(kind, capability)])
    return outcome

  def scripted_run(backend, dtypes=selfcheck.DTYPES):
    calls.append(backend.name)
    return outcome["why"]

  monkeypatch.setattr(selfcheck, "_RESULTS", {})
  monkeypatch.setattr(selfcheck, "run", scripted_run)
  install.calls = calls
  return install


def with_record(monkeypatch, *entries):
  """The record with `(backend, device kind, verdict)` entries (and nothing else)."""
  record = verified.record()
  for backend, kind, verdict in entries:
    record = verified.add(record, backend, kind,
                          verified.entry(verdict, "2026-11-27", {"exact_vs_plain_b1": 1.04},
                                         check="scripts/gpu_check.py", jax_version="0.10.2"))
  monkeypatch.setattr(verified, "record", lambda: record)


# ----------------------------------------------------------------------------- "auto"


def test_auto_on_a_gpu_without_a_record_is_xla(fake_gpu):
  fake_gpu(H100)
  assert backends.choose("auto") == "xla"
  assert fake_gpu.calls == []                     # nothing compiled for an unmeasured GPU
  reason = dispatch.policy("auto").reason
  assert f"not recorded as measured on {H100}" in reason and "verified.json" in reason


def test_auto_on_a_gpu_with_a_pass_for_its_kind_is_gpu(fake_gpu, monkeypatch):
  fake_gpu(H100)
  with_record(monkeypatch, ("gpu", H100, "pass"), ("gpu", A100, "fail"))
  assert backends.choose("auto") == "gpu"
  assert fake_gpu.calls == ["gpu"]                # the self-check ran, once
  assert backends.choose("auto") == "gpu" and fake_gpu.calls == ["gpu"]


@pytest.mark.parametrize("kind,verdict", [(A100, "fail"), ("NVIDIA H200", None)])
def test_auto_needs_a_pass_for_this_very_device_kind(fake_gpu, monkeypatch, kind, verdict):
  fake_gpu(kind)
  with_record(monkeypatch, ("gpu", H100, "pass"), ("gpu", A100, "fail"))
  assert verified.lookup("gpu", kind) is None or verified.lookup("gpu", kind)["verdict"] == verdict
  assert backends.choose("auto") == "xla"


def test_auto_falls_back_to_xla_when_the_recorded_kernels_fail_here(fake_gpu, monkeypatch):
  fake_gpu(H100)["why"] = "dot bfloat16: rows differ between a 16-row call and a 1-row call"
  with_record(monkeypatch, ("gpu", H100, "pass"))
  with pytest.warns(UserWarning, match="rows differ"):
    assert backends.choose("auto") == "xla"


# ----------------------------------------------------------------------------- kernels="gpu"


@pytest.mark.parametrize("capability", ["8.0", "8.9", None])
def test_gpu_on_a_pre_hopper_gpu_is_an_input_error_naming_the_device(fake_gpu, capability):
  fake_gpu(A100, capability)
  with pytest.raises(sd.InputError, match=rf"{A100}.*Mosaic GPU needs .*Hopper \(sm_90\+\)"):
    backends.choose("gpu")
  with pytest.raises(sd.InputError, match="Hopper"):
    sd.load("config:t5_1_1_tiny", kernels="gpu")            # before anything is loaded
  assert fake_gpu.calls == []


def test_gpu_on_hopper_runs_the_self_check_once_per_device_kind(fake_gpu):
  fake_gpu(H100, "9.0")
  assert backends.choose("gpu") == "gpu" and backends.choose("gpu") == "gpu"
  assert fake_gpu.calls == ["gpu"]
  assert selfcheck._RESULTS == {("gpu", H100): ""}       # strings only, never arrays
  fake_gpu("NVIDIA H200", "9.0")
  backends.choose("gpu")
  assert fake_gpu.calls == ["gpu", "gpu"]


def test_gpu_whose_self_check_fails_raises_a_clear_error(fake_gpu):
  fake_gpu(H100)["why"] = "attention bfloat16: differs from XLA's attention by 3.1e-01"
  with pytest.raises(selfcheck.SelfCheckFailed,
                     match=rf"kernels='gpu' failed its self-check on {H100}: attention .* "
                           r"use kernels='xla'"):
    backends.choose("gpu")
  assert issubclass(selfcheck.SelfCheckFailed, sd.SpecdecError)
  with pytest.raises(selfcheck.SelfCheckFailed):             # cached: the same answer
    backends.choose("gpu")
  assert fake_gpu.calls == ["gpu"]


def test_the_gpu_backend_off_a_gpu_is_interpret_mode_and_not_checked(monkeypatch):
  monkeypatch.setattr(selfcheck, "check", lambda *a: pytest.fail("self-check on a CPU"))
  assert backends.choose("gpu") == "gpu"


# ----------------------------------------------------------------------------- the record


def test_the_shipped_record_has_no_gpu_entries_and_ships_as_package_data():
  record = verified.record()
  assert record["format"] == 1 and record["backends"]["gpu"] == {}
  assert not verified.passed("gpu", H100)
  patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
      "package-data"]["specdec_jax"]
  assert any(fnmatch.fnmatch("/".join(verified.FILE), p) for p in patterns)


def test_record_entries():
  record = verified.add({"backends": {"gpu": {}}}, "tpu", "TPU v5 lite",
                        verified.entry("pass", "2026-11-27", {"c": 0.02}))
  assert record["backends"]["tpu"]["TPU v5 lite"]["figures"] == {"c": 0.02}
  assert record["backends"]["gpu"] == {}
  with pytest.raises(ValueError, match="verdict"):
    verified.entry("ok", "2026-11-27", {})


def test_lowering_decides_interpret_mode():
  assert backends.interpret("cuda") is None
  with backends.lowering(("cuda",)):
    assert backends.interpret("cuda") is False and backends.interpret("tpu") is True
  with backends.lowering(("cpu",)):
    assert backends.interpret("cuda") is True
  assert backends.interpret("cuda") is None


# ----------------------------------------------------------------------------- the self-check


def _backend(dot=None, attention=None) -> backends.Backend:
  """A backend of XLA's ops with one product replaced (negative controls)."""
  kinds = frozenset(k for k, f in (("dot", dot), ("attention", attention)) if f is not None)
  return backends.Backend("fake", kinds, kinds, (jnp.dtype(jnp.float32),),
                          pack=lambda w, dtype: w.astype(dtype), dot=dot, attention=attention)


def _xla_dot(x, w, n):
  """x [M, K] @ w [K, N] by an in-order loop over K: each row alike whatever M (XLA's
  own dot is not: on a CPU a 1-row product rounds otherwise than a 16-row one)."""
  x, w = x.astype(jnp.float32), w.astype(jnp.float32)
  return jax.lax.fori_loop(0, x.shape[1], lambda j, acc: acc + x[:, j, None] * w[None, j, :],
                           jnp.zeros((x.shape[0], w.shape[1]), jnp.float32))


@pytest.mark.parametrize("name,backend,want", [
    ("right", _backend(dot=_xla_dot), ""),
    ("batch-variant", _backend(dot=lambda x, w, n: _xla_dot(x, w, n) + 1e-6 * x.shape[0]),
     "dot float32: rows differ between a 16-row call and a 1-row call"),
    ("wrong", _backend(dot=lambda x, w, n: _xla_dot(x, 1.01 * w, n)),
     "dot float32: differs from XLA's product"),
    ("raises", _backend(dot=lambda x, w, n: jnp.dot(x, w[:3])),
     "dot float32 did not run: TypeError"),
    ("attention", _backend(attention=lambda q, k, v, b, n: selfcheck._xla_attention(
        q, k, v, shapes.dense_bias(b, n, *n.shape, k.shape[2])) * (1 + 1e-3 * q.shape[1])),
     "attention float32: query row 0 differs between a 5-token and a 1-token call"),
])
def test_the_self_check_catches_wrong_kernels(name, backend, want):
  got = selfcheck.run(backend, dtypes=(jnp.float32,))
  assert (got == want) if not want else got.startswith(want), (name, got)


def test_the_xla_and_cpu_backends_pass_the_self_check():
  assert selfcheck.run(backends.get("xla")) == ""
  cpu = backends.get("cpu")
  if not cpu.status()[0]:
    pytest.skip(cpu.status()[1])
  assert selfcheck.run(cpu) == ""


@pytest.mark.device
@pytest.mark.slow
def test_the_gpu_kernels_pass_the_self_check_in_interpret_mode():
  assert selfcheck.run(backends.get("gpu"), dtypes=(jnp.bfloat16,)) == ""
