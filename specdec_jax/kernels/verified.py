"""The device check's record: on which device kinds each accelerator backend's kernels were
measured, read by `backends.choose` ("auto" picks them only there).

The record ships as package data, `specdec_jax/kernels/verified.json`:

    {"format": 1, "about": "...",
     "backends": {"gpu": {"NVIDIA H100 80GB HBM3": {"verdict": "pass", "date": "2026-11-27",
                                                     "jax": "0.10.2", "check": "...",
                                                     "figures": {...}}},
                  "tpu": {}}}

A device kind is `jax.Device.device_kind`. A "pass" means the device check
(scripts/gpu_check.py) found every product's rows bitwise invariant in M, position and
call width, the products agreeing with XLA, and exact greedy on the kernels not slower
than the padded XLA baseline; "figures" are its numbers. Anything else, or no entry, keeps
"auto" on XLA's ops there. `entry(...)` builds one for the check to add with `add`.

    verified.passed("gpu", "NVIDIA H100 80GB HBM3")     # False: no GPU entry yet
"""

from __future__ import annotations

import functools
import json
from typing import Any

from specdec_jax import package_data

FILE = ("kernels", "verified.json")
VERDICTS = ("pass", "fail")


@functools.cache
def record() -> dict[str, Any]:
  """The shipped record (read once per process)."""
  path = package_data.package_root().joinpath(*FILE)
  return json.loads(path.read_text(encoding="utf-8"))


def lookup(backend: str, device_kind: str) -> dict[str, Any] | None:
  """The record's entry for `backend` ("gpu", "tpu") on `device_kind`, or None."""
  return record().get("backends", {}).get(backend, {}).get(device_kind)


def passed(backend: str, device_kind: str) -> bool:
  """Whether the device check recorded `backend`'s kernels as measured on `device_kind`."""
  found = lookup(backend, device_kind)
  return found is not None and found.get("verdict") == "pass"


def entry(verdict: str, date: str, figures: dict[str, Any], check: str = "",
          jax_version: str = "") -> dict[str, Any]:
  """One device kind's entry: `verdict` "pass" or "fail", `date` "YYYY-MM-DD", the check's
  `figures` (JSON values), the command that made them and the jax version."""
  if verdict not in VERDICTS:
    raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
  return {"verdict": verdict, "date": date, "jax": jax_version, "check": check,
          "figures": figures}


def add(base: dict[str, Any], backend: str, device_kind: str,
        new: dict[str, Any]) -> dict[str, Any]:
  """`base` (a record) with `new` as `backend`'s entry for `device_kind` (a new dict;
  the device check writes it back to verified.json)."""
  backends = {name: dict(kinds) for name, kinds in base.get("backends", {}).items()}
  backends.setdefault(backend, {})[device_kind] = new
  return {**base, "backends": backends}
