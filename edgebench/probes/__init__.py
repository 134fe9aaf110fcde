"""Probes: host-side orchestration of one kind of measurement; each returns records.

A probe is `fn(device, job, ctx) -> ProbeResult`. Modules are imported only when a probe runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ..errors import UserError
from ..execution.jobs import Job
from ..lab.device import Device
from ..records import ProbeResult, RecordContext

ProbeFn = Callable[[Device, Job, RecordContext], ProbeResult]

# probe kind -> "module:function" in this package
PROBES: dict[str, str] = {
    "bench": "bench:run_bench",
    "matmul": "matmul:run_matmul",
    "bandwidth": "bandwidth:run_bandwidth",
    "threads": "threads:run_threads",
    "roofline": "roofline:run_roofline",
    "accuracy": "accuracy:run_accuracy",
    "profile": "profile:run_profile",
    "sensitivity": "sensitivity:run_sensitivity",
    "thermal": "thermal:run_thermal",
    "power": "power:run_power",
}


# Devices with agent = "native" (no Python) measure these kinds through their runner binaries.
NATIVE_PROBES: dict[str, str] = {
    "bench": "native:run_native_bench",
    "matmul": "native:run_native_matmul",
    "bandwidth": "native:run_native_bandwidth",
    "thermal": "native_sustained:run_native_thermal",
    "power": "native_sustained:run_native_power",
}


def probe_function(kind: str, agent: str = "python") -> ProbeFn:
    table = NATIVE_PROBES if agent == "native" else PROBES
    if kind not in table:
        where = " on a native device" if agent == "native" else ""
        raise UserError(f"unknown probe '{kind}'{where} (known: {', '.join(sorted(table))})")
    module, func = table[kind].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), func)
