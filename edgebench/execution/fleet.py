"""Run a plan over a fleet: devices in parallel, jobs on one device in series, failures as data.

Each device gets a thread and a *session* (`DeviceSession`): the session takes the device's lease, reaches
the device, checks its health and runs jobs, retrying transport errors with backoff. The thread adds the
fleet rules on top: a device that fails its health check is unreachable (its jobs become error records);
one that fails `quarantine_after` jobs in a row is quarantined for the rest of the run. Only the calling
thread touches the store: one transaction per finished job, so a killed controller loses at most the jobs in
flight and `--resume` finishes them.

The local session (`LocalSession`) drives devices this host can reach; `execution.cluster` provides a
session that sends each job to the Dask worker holding the device.
"""

from __future__ import annotations

import importlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tenacity import Retrying, retry_if_exception, retry_if_result, stop_after_attempt, wait_exponential

from ..errors import (
    CommandError,
    CommandTimeout,
    EdgebenchError,
    HostKeyError,
    TransportError,
    UserError,
    one_line,
)
from ..lab.descriptors import DeviceSpec, Lab, load_lab
from ..lab.device import Device
from ..records import new_run_id, utc_now
from ..results.store import Store
from .execute import error_kind, execute_job
from .jobs import Job, JobOutcome
from .leases import DEFAULT_LEASE_S, DeviceLease, LeaseHolder
from .provenance import descriptor_summary, host_provenance
from .suite import RunPolicy, Suite, check_devices, jobs_by_device, plan

HEALTH_TIMEOUT_S = 120.0
StateFn = Callable[[str, str], None]  # (state, detail)


# ---- what a session is --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceReady:
    """A device that passed its health check: what to store about it."""

    device: str
    fingerprint: dict[str, Any]
    descriptor: dict[str, Any]
    notes: tuple[str, ...] = ()


class DeviceSession(Protocol):
    """One device for the length of a run: lease, connection, health, jobs."""

    device: str

    def prepare(self, on_state: StateFn) -> DeviceReady:
        """Take the lease, reach the device, check its health. Raises LabError when it cannot be used."""
        ...

    def run(self, job: Job, first: bool) -> JobOutcome:
        """Run one job; never raises: failures come back as error outcomes."""
        ...

    def close(self) -> None:
        """Disconnect and give the lease back."""
        ...


SessionFactory = Callable[[str], DeviceSession]


class CooldownGuard(Protocol):
    """Waits, before a job, until the device is back near its idle temperature; says what it did."""

    def wait(self) -> str | None: ...


# ---- failure classification ------------------------------------------------------------------------------
def is_transient(exc: BaseException | None) -> bool:
    """Worth another attempt: a connection or transfer failure. Never a measurement, a rejected model,
    a refused host key, a timeout (the device was reached and did not answer in time) or a command that
    ran and exited non-zero."""
    if not isinstance(exc, TransportError) or isinstance(exc, HostKeyError | CommandTimeout):
        return False
    if isinstance(exc, CommandError):
        return exc.returncode is None  # the command died with its connection
    return True


def error_outcome(job: Job, message: str, kind: str = "lab", exc: BaseException | None = None) -> JobOutcome:
    now = utc_now()
    return JobOutcome(job, "error", error=message, error_kind=kind, started=now, finished=now, exception=exc)


# ---- the local session -------------------------------------------------------------------------------------
class LocalSession:
    """A device this host reaches through its own transport (local, ssh, adb)."""

    def __init__(
        self,
        spec: DeviceSpec,
        run_id: str,
        policy: RunPolicy,
        *,
        lock_dir: Path | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        sleep: Callable[[float], None] = time.sleep,
        connect: Callable[[DeviceSpec], Device] = Device,
        lease: DeviceLease | None = None,
    ) -> None:
        self.spec = spec
        self.device = spec.name
        self.run_id = run_id
        self.policy = policy
        # A caller that tries again and again (a cluster worker) passes the same lease each time: the lease
        # remembers how long it has watched an unrefreshed holder, which is what lets it take over.
        self.lease = lease or DeviceLease(spec.name, run_id=run_id, folder=lock_dir, lease_s=lease_s)
        self.lease.run_id = run_id
        self._sleep = sleep
        self._connect_fn = connect
        self._dev: Device | None = None
        self._guard: CooldownGuard | None = None

    # -- lifecycle
    def prepare(self, on_state: StateFn) -> DeviceReady:
        def queued(holder: LeaseHolder | None, waited: float) -> None:
            on_state("queued", f"device leased by {holder.describe() if holder else 'another process'}")

        on_state("lease", "")
        self.lease.acquire(timeout=self.policy.lease_timeout_s, on_wait=queued)
        on_state("connecting", "")
        fingerprint = self._retrying_call(self._health_check)
        notes = []
        try:
            self._guard = self._cooldown_guard()
        except EdgebenchError as exc:  # no guard is no reason to give up the device
            self._guard = None
            notes.append(f"cool-down guard unavailable: {one_line(exc)}")
        if self._guard is not None:
            notes.append("cool-down guard active between jobs")
        return DeviceReady(self.device, fingerprint, descriptor_summary(self.spec), tuple(notes))

    def close(self) -> None:
        try:
            self._disconnect()
        finally:
            self.lease.release()

    # -- jobs
    def run(self, job: Job, first: bool) -> JobOutcome:
        if self.lease.lost:
            return error_outcome(job, f"{self.device}: {self.lease.lost}")
        notes = []
        if not first and self._guard is not None:
            try:
                note = self._guard.wait()
            except EdgebenchError as exc:
                note = f"cool-down guard failed: {one_line(exc)}"
            if note:
                notes.append(note)
        attempts: list[str] = []

        def attempt() -> JobOutcome:
            try:
                device = self._connected()
            except Exception as exc:  # noqa: BLE001 - a failed (re)connect is this attempt's outcome
                outcome = error_outcome(job, one_line(exc), error_kind(exc), exc)
            else:
                outcome = execute_job(device, job, self.run_id)
            if is_transient(outcome.exception):
                attempts.append(outcome.error or "")
                self._disconnect()  # the next attempt reconnects from scratch
            return outcome

        retrying = Retrying(
            stop=stop_after_attempt(1 + self.policy.retries),
            wait=wait_exponential(multiplier=self.policy.backoff_s, max=self.policy.max_backoff_s),
            retry=retry_if_result(lambda o: is_transient(o.exception)),
            retry_error_callback=_last_outcome,
            sleep=self._sleep,
        )
        outcome: JobOutcome = retrying(attempt)
        if attempts and outcome.ok:
            notes.append(f"succeeded after {len(attempts)} transport error(s); first: {attempts[0]}")
        elif len(attempts) > 1:
            outcome.error = f"{outcome.error} (after {len(attempts)} attempts)"
        outcome.warnings = notes + outcome.warnings
        return outcome

    # -- pieces
    def _connected(self) -> Device:
        if self._dev is None:
            self._dev = self._connect_fn(self.spec)
        return self._dev

    def _disconnect(self) -> None:
        dev, self._dev = self._dev, None
        if dev is not None:
            try:
                dev.close()
            except Exception:  # noqa: BLE001 - a dead connection may fail to close; it is gone either way
                pass

    def _health_check(self) -> dict[str, Any]:
        """Reach the device and ask what it is (the agent's fingerprint, or the shell's on native devices)."""
        return self._connected().fingerprint(min(self.spec.timeout_s, HEALTH_TIMEOUT_S))

    def _retrying_call(self, fn: Callable[[], Any]) -> Any:
        def before_sleep(_state: Any) -> None:
            self._disconnect()

        retrying = Retrying(
            stop=stop_after_attempt(1 + self.policy.retries),
            wait=wait_exponential(multiplier=self.policy.backoff_s, max=self.policy.max_backoff_s),
            retry=retry_if_exception(is_transient),
            before_sleep=before_sleep,
            sleep=self._sleep,
            reraise=True,
        )
        return retrying(fn)

    def _cooldown_guard(self) -> CooldownGuard | None:
        if not self.policy.cooldown or self._dev is None:
            return None
        return cooldown_guard(self._dev, self.policy)


def _last_outcome(state: Any) -> JobOutcome:
    """When retries run out, the last attempt's outcome is the job's result: failures are data."""
    return state.outcome.result()


def cooldown_guard(device: Device, policy: RunPolicy) -> CooldownGuard | None:
    """The thermal cool-down guard (`execution.cooldown`) when the device has thermal sensors and runs
    the Python agent; None otherwise, and the run goes on without one."""
    if device.spec.agent != "python":
        return None
    try:
        module = importlib.import_module(f"{__package__}.cooldown")
    except ModuleNotFoundError:
        return None
    # One look (no waiting) tells whether the device has thermal zones at all.
    first = module.wait_for_cooldown(device, module.CooldownPolicy(timeout_s=0.0))
    if first.zone is None:
        return None
    return AgentCooldownGuard(device, module, policy.cooldown_timeout_s)


class AgentCooldownGuard:
    """Waits on the device, idle, until its hottest zone is within 2 °C of idle.

    The first wait estimates each zone's idle reading from its cooling curve; later waits reuse it.
    """

    def __init__(self, device: Device, module: Any, timeout_s: float) -> None:
        self.device = device
        self.module = module
        self.timeout_s = timeout_s
        self.idle_c: dict[str, float] | None = None

    def wait(self) -> str | None:
        policy = self.module.CooldownPolicy(timeout_s=self.timeout_s)
        result = self.module.wait_for_cooldown(self.device, policy, self.idle_c)
        if result.idle_c:
            self.idle_c = dict(result.idle_c)
        if result.cooled and result.waited_s < 1.0:
            return None  # already cool: nothing worth telling
        return f"cool-down guard: {result.describe()}"


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


def prebuild_agent() -> None:
    """Pack the agent once before device threads start, so they never race to write the same file."""
    import tempfile

    from ..lab.agentpack import build_agent

    build_agent(Path(tempfile.gettempdir()) / "edgebench-agent")
