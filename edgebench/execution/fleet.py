"""Run a plan over a fleet: devices in parallel, jobs on one device in series, failures as data.

Each device gets a thread and a *session* (`DeviceSession`): the session takes the device's lease, reaches
the device, checks its health and runs jobs, retrying transport errors with backoff. The thread adds the
fleet rules on top: a device that fails its health check is unreachable (its jobs become error records);
one that fails `quarantine_after` jobs in a row is quarantined for the rest of the run. Only the calling
thread touches the store: one transaction per finished job, so a killed controller loses at most the jobs in
flight and `--resume` finishes them.

Sessions live in `execution.session` (`LocalSession`: devices this host can reach); `execution.cluster`
provides a session that sends each job to the Dask worker holding the device.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import EdgebenchError, UserError, one_line
from ..lab.descriptors import Lab, load_lab
from ..records import new_run_id
from ..results.store import Store
from .jobs import Job, JobOutcome
from .provenance import host_provenance
from .session import (
    DeviceReady,
    DeviceSession,
    LocalSession,
    SessionFactory,
    error_outcome,
    prebuild_agent,
)
from .suite import RunPolicy, Suite, check_devices, jobs_by_device, plan


# ---- the fleet ---------------------------------------------------------------------------------------------
@dataclass
class DeviceSummary:
    """How one device did in this run."""

    device: str
    jobs: int = 0
    ok: int = 0
    failed: int = 0
    skipped: int = 0  # already ok in the resumed run
    state: str = "pending"  # pending, ok, failed, unreachable, quarantined
    error: str | None = None
    wall_s: float = 0.0


@dataclass
class RunResult:
    """What a run did; `exit_code` follows DESIGN.md (0 ok, 1 a job failed, 3 a device unreachable)."""

    run_id: str
    suite: str
    status: str
    devices: dict[str, DeviceSummary]
    outcomes: list[JobOutcome] = field(default_factory=list)
    resumed: bool = False

    @property
    def exit_code(self) -> int:
        if any(d.state == "unreachable" for d in self.devices.values()):
            return 3
        if any(d.failed or d.state != "ok" for d in self.devices.values()):
            return 1
        return 0


class RunObserver(Protocol):
    """Progress for people (the CLI draws it); called only from the thread that called the run."""

    def planned(self, device: str, total: int, skipped: int) -> None: ...

    def state(self, device: str, state: str, detail: str) -> None: ...

    def job_done(self, outcome: JobOutcome) -> None: ...


class NullObserver:
    def planned(self, device: str, total: int, skipped: int) -> None:
        pass

    def state(self, device: str, state: str, detail: str) -> None:
        pass

    def job_done(self, outcome: JobOutcome) -> None:
        pass


@dataclass(frozen=True)
class _State:
    device: str
    state: str
    detail: str = ""


@dataclass(frozen=True)
class _Ready:
    ready: DeviceReady


@dataclass(frozen=True)
class _Outcome:
    outcome: JobOutcome


@dataclass(frozen=True)
class _Finished:
    summary: DeviceSummary


def run_plan(
    run_id: str,
    jobs: Sequence[Job],
    sessions: SessionFactory,
    store: Store,
    policy: RunPolicy,
    observer: RunObserver | None = None,
    stop: threading.Event | None = None,
    done_keys: set[str] | frozenset[str] = frozenset(),
) -> tuple[dict[str, DeviceSummary], list[JobOutcome]]:
    """Run the jobs (minus done_keys) device-parallel; store each outcome as it arrives."""
    observer = observer or NullObserver()
    stop = stop or threading.Event()
    events: queue.Queue[Any] = queue.Queue()
    summaries: dict[str, DeviceSummary] = {}
    threads = []
    for device, device_jobs in jobs_by_device(list(jobs)).items():
        todo = [j for j in device_jobs if j.key not in done_keys]
        summary = DeviceSummary(device, jobs=len(device_jobs), skipped=len(device_jobs) - len(todo))
        summaries[device] = summary
        observer.planned(device, len(device_jobs), summary.skipped)
        if not todo:
            summary.state = "ok"
            continue
        # Daemon threads: an interrupted controller exits without waiting for a job in flight.
        t = threading.Thread(
            target=_device_worker,
            name=f"edgebench-{device}",
            daemon=True,
            args=(device, todo, sessions, policy, events, stop, summary.skipped, len(device_jobs)),
        )
        threads.append(t)
        t.start()
    outcomes: list[JobOutcome] = []
    running = len(threads)
    while running:
        event = events.get()
        if isinstance(event, _State):
            observer.state(event.device, event.state, event.detail)
        elif isinstance(event, _Ready):
            r = event.ready
            store.save_device(run_id, r.device, r.fingerprint, r.descriptor)
        elif isinstance(event, _Outcome):
            outcome = event.outcome
            store.save_job(run_id, outcome)
            outcomes.append(outcome)
            observer.job_done(outcome)
        elif isinstance(event, _Finished):
            summaries[event.summary.device] = event.summary
            observer.state(event.summary.device, event.summary.state, event.summary.error or "")
            running -= 1
    for t in threads:
        t.join(timeout=5)
    return summaries, outcomes


def _device_worker(
    device: str,
    jobs: list[Job],
    sessions: SessionFactory,
    policy: RunPolicy,
    events: queue.Queue[Any],
    stop: threading.Event,
    skipped: int,
    total: int,
) -> None:
    """One device's series: prepare, jobs in order, quarantine, close. Everything goes out as events."""
    summary = DeviceSummary(device, jobs=total, skipped=skipped)
    t0 = time.monotonic()

    def emit_state(state: str, detail: str) -> None:
        events.put(_State(device, state, detail))

    reported = 0

    def report(outcome: JobOutcome) -> None:
        nonlocal reported
        events.put(_Outcome(outcome))
        reported += 1
        if outcome.ok:
            summary.ok += 1
        else:
            summary.failed += 1

    def finish_all(rest: list[Job], message: str, kind: str = "lab") -> None:
        for job in rest:
            report(error_outcome(job, message, kind))

    session: DeviceSession | None = None
    try:
        try:
            session = sessions(device)
            ready = session.prepare(emit_state)
        except Exception as exc:  # noqa: BLE001 - an unusable device is data: its jobs fail, others go on
            summary.state, summary.error = "unreachable", f"{device} unreachable: {one_line(exc)}"
            kind = "usage" if isinstance(exc, UserError) else "lab"
            finish_all(jobs, summary.error, kind)
            return
        events.put(_Ready(ready))
        if ready.notes:
            emit_state("ready", "; ".join(ready.notes))
        consecutive: list[str] = []
        for i, job in enumerate(jobs):
            if stop.is_set():
                return
            emit_state("running", _job_label(job))
            outcome = session.run(job, first=(i == 0))
            report(outcome)
            if outcome.ok:
                consecutive.clear()
                continue
            # Only device-level failures count: a model the runtime rejects says nothing about the device.
            if outcome.error_kind == "lab":
                consecutive.append(outcome.error or "")
            else:
                consecutive.clear()
            if len(consecutive) >= policy.quarantine_after:
                summary.state = "quarantined"
                summary.error = (
                    f"{device} quarantined after {len(consecutive)} failed jobs in a row "
                    f"(last: {consecutive[-1]})"
                )
                finish_all(jobs[i + 1 :], summary.error)
                return
        summary.state = "failed" if summary.failed else "ok"
    except Exception as exc:  # noqa: BLE001 - a bug here must not hang the run: report it as the device's
        summary.state, summary.error = "failed", f"internal error on {device}: {type(exc).__name__}: {exc}"
        finish_all(jobs[reported:], summary.error, "internal")
    finally:
        if session is not None:
            try:
                session.close()
            except Exception:  # noqa: BLE001 - closing a broken device must not lose the summary
                pass
        summary.wall_s = time.monotonic() - t0
        events.put(_Finished(summary))


def _job_label(job: Job) -> str:
    params = ", ".join(f"{k}={v}" for k, v in job.params.items())
    model = job.model.name if job.model else "-"
    runtime = f" {job.runtime}" if job.runtime else ""
    return f"{job.probe} {model}{runtime}" + (f" ({params})" if params else "")


# ---- a suite run -------------------------------------------------------------------------------------------
class RunInterrupted(EdgebenchError):
    """The run was stopped (Ctrl-C, SIGTERM); what finished is stored and `--resume` completes it."""

    exit_code = 130


def run_suite(
    suite: Suite,
    *,
    store_path: Path,
    lab: Lab | None = None,
    resume: str | None = None,
    cluster: str | None = None,
    timeout_s: float | None = None,
    lock_dir: Path | None = None,
    observer: RunObserver | None = None,
    argv: list[str] | None = None,
    stop: threading.Event | None = None,
) -> RunResult:
    """Plan the suite, run it (locally or on a Dask cluster) and store every job as it finishes."""
    stop = stop or threading.Event()
    jobs = plan(suite, timeout_s)
    if cluster is None:
        lab = lab if lab is not None else load_lab(None)  # the host alone
        check_devices(suite, lab)
    prebuild_agent()
    store = Store(store_path)
    try:
        done_keys: set[str] = set()
        if resume:
            info = store.run(resume)  # unknown run: UserError, exit 2
            if info.suite not in (None, suite.name):
                raise UserError(f"run {resume} was made by suite '{info.suite}', not '{suite.name}'")
            done_keys = store.ok_job_keys(resume)
        run_id = resume or new_run_id()
        provenance = host_provenance(argv)
        provenance["suite_path"] = str(suite.path)
        if cluster:
            provenance["cluster"] = cluster
        with _sessions(suite, run_id, lab, cluster, lock_dir) as factory:
            store.begin_run(run_id, "suite", provenance, suite=suite.name)
            try:
                summaries, outcomes = run_plan(
                    run_id, jobs, factory, store, suite.policy, observer, stop, done_keys
                )
            except KeyboardInterrupt:
                stop.set()
                store.finish_run(run_id, "interrupted")
                raise RunInterrupted(
                    f"run {run_id} interrupted; its finished jobs are stored: finish it "
                    f"with `edgebench run {suite.path} --resume {run_id}`"
                ) from None
            except BaseException:
                stop.set()
                store.finish_run(run_id, "interrupted")
                raise
        ok = all(s.failed == 0 and s.state != "unreachable" for s in summaries.values())
        status = "ok" if ok else "failed"
        store.finish_run(run_id, status)
        return RunResult(run_id, suite.name, status, summaries, outcomes, resumed=bool(resume))
    finally:
        store.close()


class _sessions:
    """The session factory for the run's executor, with whatever it needs open (a Dask client)."""

    def __init__(
        self, suite: Suite, run_id: str, lab: Lab | None, cluster: str | None, lock_dir: Path | None
    ) -> None:
        self.suite, self.run_id, self.lab, self.cluster, self.lock_dir = suite, run_id, lab, cluster, lock_dir
        self._executor: Any = None

    def __enter__(self) -> SessionFactory:
        if self.cluster:
            from .cluster import ClusterExecutor

            self._executor = ClusterExecutor(self.cluster, self.run_id, self.suite.policy)
            return self._executor.session
        lab = self.lab
        assert lab is not None
        policy, lock_dir = self.suite.policy, self.lock_dir
        return lambda name: LocalSession(lab.get(name), self.run_id, policy, lock_dir=lock_dir)

    def __exit__(self, *exc: object) -> None:
        if self._executor is not None:
            self._executor.close()
