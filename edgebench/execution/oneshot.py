"""Run a few jobs on one device now (bench, probe, profile ...): one run in the store, jobs in series."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EdgebenchError, LabError, UserError
from ..lab.descriptors import DeviceSpec
from ..lab.device import Device
from ..records import new_run_id
from ..results.store import Store
from .execute import execute_job
from .jobs import Job, JobOutcome
from .provenance import descriptor_summary, host_provenance


@dataclass
class OneShot:
    run_id: str
    outcomes: list[JobOutcome] = field(default_factory=list)

    @property
    def records(self):  # type: ignore[no-untyped-def]
        return [r for o in self.outcomes for r in o.records]

    def raise_first_error(self) -> None:
        """For single-job commands: the CLI exits with the failed job's own error and code."""
        for o in self.outcomes:
            if not o.ok:
                if isinstance(o.exception, EdgebenchError):
                    raise o.exception
                raise EdgebenchError(o.error or "job failed")


def run_now(
    spec: DeviceSpec,
    jobs: Sequence[Job],
    store_path: Path | None,
    kind: str,
    on_outcome: Callable[[JobOutcome], None] | None = None,
    device: Device | None = None,
) -> OneShot:
    """Open the device, record its fingerprint, run the jobs, store each one as it finishes."""
    store = Store(store_path) if store_path is not None else None
    shot = OneShot(new_run_id())
    status = "failed"  # unless every job below finishes ok; an unreachable device leaves it failed
    try:
        if store:
            store.begin_run(shot.run_id, kind, host_provenance())
        own_device = device is None
        device = device or Device(spec)
        try:
            _fingerprint(device, store, shot.run_id)
            for job in jobs:
                outcome = execute_job(device, job, shot.run_id)
                shot.outcomes.append(outcome)
                if store:
                    store.save_job(shot.run_id, outcome)
                if on_outcome:
                    on_outcome(outcome)
        finally:
            if own_device:
                device.close()
        status = "ok" if all(o.ok for o in shot.outcomes) else "failed"
    finally:
        if store:
            store.finish_run(shot.run_id, status)
            store.close()
    return shot


def _fingerprint(device: Device, store: Store | None, run_id: str) -> None:
    try:
        fp = device.fingerprint()
    except (UserError, LabError):
        raise
    except EdgebenchError as exc:  # the device answers but its agent cannot say what it is: keep going
        fp = {"error": str(exc)}
    if store:
        store.save_device(run_id, device.name, fp, descriptor_summary(device.spec))
