"""Measuring a device's ceilings now (matmul and bandwidth jobs through the device's session), for
`roofline` when the store has none; what they mean and how they are read back is analysis.ceilings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..analysis.ceilings import CEILING_PROBES, Ceilings, ceiling_jobs, ceilings_at
from ..descriptors import DeviceSpec
from ..errors import MeasurementError
from .oneshot import run_now


def measure_ceilings(
    spec: DeviceSpec,
    store_path: Path | None,
    dtypes: list[str],
    overrides: dict[str, dict[str, Any]] | None = None,
    on_state: Callable[[str, str], None] | None = None,
    threads: Sequence[int] | None = None,
    affinity: Sequence[int] | None = None,
) -> Ceilings:
    """Run the ceiling jobs on the device now (stored as their own run when a store is given), through the
    device's session (lease, retries); on_state hears "queued" while another run holds the device."""
    extra = {k: dict(v) for k, v in (overrides or {}).items()}
    if affinity:
        for probe in CEILING_PROBES:
            extra.setdefault(probe, {})["affinity"] = list(affinity)
    jobs = ceiling_jobs(spec.name, dtypes, extra, threads)
    shot = run_now(spec, jobs, store_path, "ceilings", on_state=on_state)
    shot.raise_first_error()
    found = ceilings_at(shot.records, spec.name, max(threads) if threads else None, affinity, [shot.run_id])
    if found is None:
        raise MeasurementError(
            "the ceiling measurement produced no matmul or bandwidth figure", device=spec.name
        )
    return found
