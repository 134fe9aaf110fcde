"""Run one job on one device and turn whatever happens into a JobOutcome (failures are data)."""

from __future__ import annotations

import time
from typing import Any

from ..errors import EdgebenchError, LabError, UserError, one_line
from ..jobs import Job, JobOutcome
from ..lab.device import Device
from ..probes import probe_function
from ..probes.common import refuse_probe, runtime_of
from ..probes.knobs import resolve_affinity
from ..records import RecordContext, utc_now


def error_kind(exc: BaseException) -> str:
    """usage (exit 2), lab (exit 3), backend (exit 1: the model did not run on the backend it was required
    to, or the backend could not be opened) or measurement (exit 1)."""
    if isinstance(exc, UserError):
        return "usage"
    if isinstance(exc, LabError):
        return "lab"
    if getattr(exc, "kind", None) in ("backend", "delegate"):
        return "backend"
    return "measurement" if isinstance(exc, EdgebenchError) else "internal"


def record_context(run_id: str, job: Job) -> RecordContext:
    """The identity every record of the job shares; a repeated job's records carry which invocation of how
    many they come from (annotations: the invocations of one configuration pair as one measurement)."""
    from .repeats import repeats_of

    notes = {"invocation": job.invocation, "repeats": repeats_of(job)} if job.invocation else {}
    return RecordContext(
        run_id=run_id,
        device=job.device,
        probe=job.probe,
        model=job.model.name if job.model else None,
        runtime=job.runtime,
        base_annotations=notes,
    )


def execute_job(device: Device, job: Job, run_id: str) -> JobOutcome:
    """Run the job's probe; any exception becomes an error outcome carrying a one-line message."""
    started, t0 = utc_now(), time.monotonic()
    outcome: JobOutcome
    try:
        if job.model is not None:  # a runtime that does not run the probe: one line, nothing pushed
            refuse_probe(job.probe, runtime_of(job.model, job.runtime), job.model)
        pinned, notes = resolve_affinity(device, job)  # affinity = "big": that cluster's CPUs here
        ctx = record_context(run_id, job)
        ctx.base_annotations = {**ctx.base_annotations, **notes}
        result = probe_function(job.probe, device.spec.agent)(device, pinned, ctx)
        outcome = JobOutcome(job, "ok", result.records, result.samples, result.warnings)
    except Exception as exc:  # noqa: BLE001 - one failure never aborts the batch
        outcome = JobOutcome(job, "error", error=one_line(exc), error_kind=error_kind(exc), exception=exc)
    outcome.started, outcome.finished = started, utc_now()
    outcome.wall_s = time.monotonic() - t0
    outcome.device_s = _device_seconds(outcome.samples) if outcome.ok else 0.0
    return outcome


def _device_seconds(samples: Any) -> float:
    """Time the device spent measuring, by its own clock (sum of kept samples in ms)."""
    return sum(sum(s.values) for s in samples if s.unit == "ms") / 1000.0
