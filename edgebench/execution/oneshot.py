"""Run a few jobs on one device now (bench, probe, profile ...): one run in the store, jobs in series.

The jobs go through the same device session as a suite run (`execution.session.LocalSession`): the
device's lease is taken first (a device a suite holds makes the verb wait, saying who holds it), transport
errors are retried, the cool-down guard runs between jobs when there is more than one, and the device's
fingerprint is stored with the run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import EdgebenchError, one_line
from ..lab.descriptors import DeviceSpec
from ..lab.device import Device
from ..records import new_run_id
from ..results.store import Store
from .jobs import Job, JobOutcome
from .provenance import host_provenance
from .session import LocalSession, StateFn
from .suite import RunPolicy


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
            if o.ok:
                continue
            if isinstance(o.exception, EdgebenchError) and one_line(o.exception) == o.error:
                raise o.exception
            # The outcome's message says more (retries, a lost lease): keep it, with the error's exit code.
            error = EdgebenchError(o.error or "job failed")
            error.exit_code = getattr(o.exception, "exit_code", EdgebenchError.exit_code)
            raise error


@dataclass(frozen=True)
class DeviceAccess:
    """How a one-shot verb shares the device with other processes: the lease folder and how long it waits."""

    lock_dir: Path | None = None  # None: EDGEBENCH_LOCK_DIR or the user cache (execution.leases)
    lease_timeout_s: float | None = None  # None: wait for as long as another run holds the device


def run_now(
    spec: DeviceSpec,
    jobs: Sequence[Job],
    store_path: Path | None,
    kind: str,
    on_outcome: Callable[[JobOutcome], None] | None = None,
    device: Device | None = None,
    *,
    access: DeviceAccess = DeviceAccess(),
    on_state: StateFn | None = None,
) -> OneShot:
    """Take the device's lease, record its fingerprint, run the jobs, store each one as it finishes."""
    store = Store(store_path) if store_path is not None else None
    shot = OneShot(new_run_id())
    status = "failed"  # unless every job below finishes ok; an unreachable device leaves it failed
    # The guard waits before every job but the first: a single job needs no look at the sensors.
    policy = replace(RunPolicy(), lease_timeout_s=access.lease_timeout_s, cooldown=len(jobs) > 1)
    session = LocalSession(spec, shot.run_id, policy, lock_dir=access.lock_dir, device=device)
    try:
        if store:
            store.begin_run(shot.run_id, kind, host_provenance())
        try:
            ready = session.prepare(on_state or _quiet)
            if store:
                store.save_device(shot.run_id, ready.device, ready.fingerprint, ready.descriptor)
            for i, job in enumerate(jobs):
                outcome = session.run(job, first=(i == 0))
                shot.outcomes.append(outcome)
                if store:
                    store.save_job(shot.run_id, outcome)
                if on_outcome:
                    on_outcome(outcome)
        finally:
            session.close()
        status = "ok" if all(o.ok for o in shot.outcomes) else "failed"
    finally:
        if store:
            store.finish_run(shot.run_id, status)
            store.close()
    return shot


def _quiet(state: str, detail: str) -> None:
    pass
