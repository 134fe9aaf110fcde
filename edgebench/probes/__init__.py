"""Probes: host-side orchestration of one kind of measurement; each returns records.

A probe is `fn(device, job, ctx) -> ProbeResult`. Modules are imported only when a probe runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ..device import Device
from ..errors import UserError
from ..jobs import Job
from ..records import ProbeResult, RecordContext

ProbeFn = Callable[[Device, Job, RecordContext], ProbeResult]

# probe kind -> "module:function" in this package
PROBES: dict[str, str] = {
    "bench": "bench:run_bench",
}


def probe_function(kind: str) -> ProbeFn:
    if kind not in PROBES:
        raise UserError(f"unknown probe '{kind}' (known: {', '.join(sorted(PROBES))})")
    module, func = PROBES[kind].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), func)
