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

import os
import queue
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import psutil

from ..descriptors import Lab, load_lab
from ..errors import EdgebenchError, UserError, one_line
from ..jobs import Job, JobOutcome
from ..records import new_run_id, utc_now
from ..results.store import RunInfo, Store
from .leases import DEFAULT_LEASE_S
from .provenance import host_provenance
from .session import (
    DeviceReady,
    DeviceSession,
    LocalSession,
    SessionFactory,
    error_outcome,
    prebuild_agent,
)
from .spool import FINAL_WAIT_S, RETRY_EVERY_S, JobWriter, StoreTrouble, is_store_trouble, store_spooled
from .suite import RunPolicy, Suite, check_devices, jobs_by_device, model_digests, plan


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
    notes: list[str] = field(default_factory=list)  # for people: spooled writes, models changed on resume
    store_error: str | None = None  # finished jobs the store still refused at the end (kept in a spool)
    unstored: list[JobOutcome] = field(default_factory=list)  # those jobs, for --json

    @property
    def exit_code(self) -> int:
        if any(d.state == "unreachable" for d in self.devices.values()):
            return 3
        if self.store_error or any(d.failed or d.state != "ok" for d in self.devices.values()):
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
    store: Store | JobWriter,
    policy: RunPolicy,
    observer: RunObserver | None = None,
    stop: threading.Event | None = None,
    done_keys: set[str] | frozenset[str] = frozenset(),
    job_notes: dict[str, list[str]] | None = None,
) -> tuple[dict[str, DeviceSummary], list[JobOutcome]]:
    """Run the jobs (minus done_keys) device-parallel; store each outcome as it arrives (spooled while
    the store refuses writes); job_notes adds warnings to the outcomes of the jobs they key."""
    writer = store if isinstance(store, JobWriter) else JobWriter(store, run_id)
    job_notes = job_notes or {}
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
        try:
            event = events.get(timeout=RETRY_EVERY_S)
        except queue.Empty:
            writer.retry()  # a quiet moment: try the spooled jobs again
            continue
        if isinstance(event, _State):
            observer.state(event.device, event.state, event.detail)
        elif isinstance(event, _Ready):
            r = event.ready
            writer.save_device(r.device, r.fingerprint, r.descriptor)
        elif isinstance(event, _Outcome):
            outcome = event.outcome
            outcome.warnings = job_notes.get(outcome.job.key, []) + outcome.warnings
            writer.save_job(outcome)
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
            if outcome.stop_device:  # the lease went elsewhere, or the device hung: not one more job
                summary.state, summary.error = "quarantined", outcome.stop_device
                finish_all(jobs[i + 1 :], f"{outcome.stop_device}: job not run")
                return
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
    lease_s: float = DEFAULT_LEASE_S,
    observer: RunObserver | None = None,
    argv: list[str] | None = None,
    stop: threading.Event | None = None,
) -> RunResult:
    """Plan the suite, run it (locally or on a Dask cluster) and store every job as it finishes.

    Store trouble never loses a finished job (`execution.spool`): what the store refuses waits in a spool
    file and is stored when it can be; `RunResult.store_error` says when some is still waiting at the end.
    """
    stop = stop or threading.Event()
    jobs = plan(suite, timeout_s)
    if cluster is None:
        lab = lab if lab is not None else load_lab(None)  # the host alone
        check_devices(suite, lab)
    policy = replace(suite.policy, timeout_s=timeout_s or suite.timeout_s)
    prebuild_agent()
    store = Store(store_path, busy_timeout_s=policy.store_timeout_s)
    try:
        notes = store_spooled(store)  # what earlier runs could not store, first
        models = model_digests(suite)
        done_keys: set[str] = set()
        job_notes: dict[str, list[str]] = {}
        if resume:
            info = store.run(resume)  # unknown run: UserError, exit 2
            check_resumable(info, suite)
            done_keys = store.ok_job_keys(resume)
            changed = changed_models(info.provenance, models)
            job_notes = changed_model_notes(jobs, done_keys, changed, resume)
            notes += [f"model '{n}' changed since run {resume} measured it: re-measured" for n in changed]
        run_id = resume or new_run_id()
        provenance = {
            **host_provenance(argv),
            "suite_path": str(suite.path),
            "controller": controller_identity(),
            "models": models,
        }
        if cluster:
            provenance["cluster"] = cluster
        with _sessions(suite, run_id, lab, cluster, lock_dir, policy, lease_s) as factory:
            _begin(store, run_id, suite, provenance, resume, done_keys, job_notes)
            writer = JobWriter(store, run_id)
            try:
                summaries, outcomes = run_plan(
                    run_id, jobs, factory, writer, policy, observer, stop, done_keys, job_notes
                )
            except KeyboardInterrupt:
                stop.set()
                kept = _interrupted(writer)
                raise RunInterrupted(
                    f"run {run_id} interrupted; its finished jobs are {kept}: finish it "
                    f"with `edgebench run {suite.path} --resume {run_id}`"
                ) from None
            except BaseException:
                stop.set()
                _interrupted(writer)
                raise
        ok = all(s.failed == 0 and s.state != "unreachable" for s in summaries.values())
        status = "ok" if ok else "failed"
        result = RunResult(run_id, suite.name, status, summaries, outcomes, resumed=bool(resume), notes=notes)
        try:
            note = _end(writer, status)
        except StoreTrouble as exc:
            result.store_error = one_line(exc)
            result.unstored = list(writer.unsaved_outcomes)
        else:
            if note:
                result.notes.append(note)
        return result
    finally:
        store.close()


def _begin(
    store: Store,
    run_id: str,
    suite: Suite,
    provenance: dict[str, Any],
    resume: str | None,
    done_keys: set[str],
    job_notes: dict[str, list[str]],
) -> None:
    """Create the run (or mark the resumed one running, with a provenance entry for this resume)."""
    try:
        store.begin_run(run_id, "suite", provenance, suite=suite.name)
        if resume:
            entry = {k: provenance[k] for k in ("edgebench", "git_commit", "host", "argv", "suite_path")}
            entry.update(
                at=utc_now(),
                controller=provenance["controller"],
                models=provenance["models"],
                done_jobs=len(done_keys),
                remeasured_for_changed_models=len(job_notes),
            )
            store.append_provenance(run_id, "resumes", entry)
    except Exception as exc:
        if not is_store_trouble(exc):
            raise
        raise StoreTrouble(
            f"{store.path}: cannot start run {run_id}: the store refuses writes ({exc})"
        ) from None


def _end(writer: JobWriter, status: str, wait_s: float = FINAL_WAIT_S) -> str | None:
    """The run's final status, then whatever waited in the spool; a note when the spool was used."""
    writer.finish_run(status)
    return writer.close(wait_s)


def _interrupted(writer: JobWriter) -> str:
    """Mark the run interrupted without waiting for a store in trouble; where its finished jobs are."""
    try:
        _end(writer, "interrupted", wait_s=0.0)
    except StoreTrouble:
        return f"kept in {writer.spool or 'no spool file (the store and the temp folder refuse writes)'}"
    return "stored"


# ---- resume: provenance, a live controller, changed models ----------------------------------------------
def controller_identity() -> dict[str, Any]:
    """This controller process, so a later resume can tell whether it is still alive."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def controller_alive(controller: dict[str, Any]) -> bool:
    """True when the recorded controller is a live process on this host (same pid and start time)."""
    if controller.get("host") != socket.gethostname():
        return False  # another host's process cannot be seen from here
    try:
        proc = psutil.Process(int(controller["pid"]))
        alive = proc.status() != psutil.STATUS_ZOMBIE
        return alive and abs(proc.create_time() - float(controller["started"])) < 1.0
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def check_resumable(info: RunInfo, suite: Suite) -> None:
    """Refuse to resume a run of another suite, or one whose controller is still running it."""
    if info.suite not in (None, suite.name):
        raise UserError(f"run {info.run_id} was made by suite '{info.suite}', not '{suite.name}'")
    resumes = info.provenance.get("resumes") or []
    controller = (resumes[-1] if resumes else info.provenance).get("controller") or {}
    if info.status == "running" and controller_alive(controller):
        who = f"controller pid {controller['pid']} on {controller['host']}"
        raise UserError(
            f"run {info.run_id} is still running ({who}): let it finish, or stop it, before resuming"
        )


def changed_models(provenance: dict[str, Any], now: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Suite models whose content differs from what the run last measured: name -> (then, now)."""
    resumes = provenance.get("resumes") or []
    then = (resumes[-1] if resumes else provenance).get("models") or {}
    return {
        name: (then[name], digest) for name, digest in now.items() if then.get(name) not in (None, digest)
    }


def changed_model_notes(
    jobs: Sequence[Job], done_keys: set[str], changed: dict[str, tuple[str, str]], run_id: str
) -> dict[str, list[str]]:
    """A warning for each job to run again because its model's file changed under the same name."""
    out = {}
    for job in jobs:
        if job.model is None or job.model.name not in changed or job.key in done_keys:
            continue
        then, now = changed[job.model.name]
        out[job.key] = [
            f"model '{job.model.name}' changed since run {run_id} measured it ({then[:19]} -> {now[:19]}): "
            "re-measured; this run's earlier records of it are of the old file"
        ]
    return out


class _sessions:
    """The session factory for the run's executor, with whatever it needs open (a Dask client)."""

    def __init__(
        self,
        suite: Suite,
        run_id: str,
        lab: Lab | None,
        cluster: str | None,
        lock_dir: Path | None,
        policy: RunPolicy,
        lease_s: float,
    ) -> None:
        self.suite, self.run_id, self.lab, self.cluster, self.lock_dir = suite, run_id, lab, cluster, lock_dir
        self.policy, self.lease_s = policy, lease_s
        self._executor: Any = None

    def __enter__(self) -> SessionFactory:
        if self.cluster:
            from .cluster import ClusterExecutor

            self._executor = ClusterExecutor(self.cluster, self.run_id, self.policy)
            return self._executor.session
        lab = self.lab
        assert lab is not None
        policy, lock_dir, lease_s = self.policy, self.lock_dir, self.lease_s
        return lambda name: LocalSession(
            lab.get(name), self.run_id, policy, lock_dir=lock_dir, lease_s=lease_s
        )

    def __exit__(self, *exc: object) -> None:
        if self._executor is not None:
            self._executor.close()
