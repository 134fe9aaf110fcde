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

from ..descriptors import DeviceSpec
from ..errors import EdgebenchError, one_line
from ..jobs import Job, JobOutcome
from ..lab.device import Device
from ..records import new_run_id
from ..results.store import Store
from .provenance import host_provenance
from .session import LocalSession, StateFn
from .spool import JobWriter, StoreTrouble, store_spooled
from .suite import RunPolicy


@dataclass
class OneShot:
    run_id: str
    outcomes: list[JobOutcome] = field(default_factory=list)

    @property
    def records(self):
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
    """Take the device's lease, record its fingerprint, run the jobs, store each one as it finishes.

    A store that refuses writes (locked, full) never loses a job: it waits in a spool file, stored by the
    next edgebench command on this store; the last job's warnings say so.
    """
    store = Store(store_path) if store_path is not None else None
    shot = OneShot(new_run_id())
    status = "failed"  # unless every job below finishes ok; an unreachable device leaves it failed
    session = LocalSession(spec, shot.run_id, _policy(jobs, access), lock_dir=access.lock_dir, device=device)
    writer = JobWriter(store, shot.run_id) if store else None
    try:
        if store and writer:
            store_spooled(store)
            store.begin_run(shot.run_id, kind, host_provenance())
        try:
            ready = session.prepare(on_state or _quiet)
            if writer:
                writer.save_device(ready.device, ready.fingerprint, ready.descriptor)
            for i, job in enumerate(jobs):
                outcome = session.run(job, first=(i == 0))
                shot.outcomes.append(outcome)
                if writer:
                    writer.save_job(outcome)
                if on_outcome:
                    on_outcome(outcome)
        finally:
            session.close()
        status = "ok" if all(o.ok for o in shot.outcomes) else "failed"
    finally:
        if store and writer:
            _finish(writer, status, shot)
            store.close()
    return shot


def _policy(jobs: Sequence[Job], access: DeviceAccess) -> RunPolicy:
    """A run's policy for these jobs: the cool-down guard only between jobs (a single job needs no look at
    the sensors); the health check bounded by the jobs' own --timeout when they all have one."""
    limits = [j.timeout_s for j in jobs if j.timeout_s is not None]
    timeout_s = max(limits) if limits and len(limits) == len(jobs) else None
    return replace(
        RunPolicy(), lease_timeout_s=access.lease_timeout_s, cooldown=len(jobs) > 1, timeout_s=timeout_s
    )


def _finish(writer: JobWriter, status: str, shot: OneShot) -> None:
    """The run's status, then the spool; what could not be stored is said in the last job's warnings."""
    try:
        writer.finish_run(status)
        note = writer.close(wait_s=0.0)  # a verb does not wait for the store: the spool keeps the job
    except StoreTrouble as exc:
        note = one_line(exc)
    if note and shot.outcomes:
        shot.outcomes[-1].warnings.append(note)


def _quiet(state: str, detail: str) -> None:
    pass
