"""The device session: the one path by which anything drives a device (a suite run, a one-shot verb, a
cluster worker).

A session owns one device for as long as its caller needs it: it takes the device's lease (with its journal
entry), reaches the device and checks its health (the fingerprint stored with the run), runs jobs with
transport retries (tenacity) and, between jobs, the cool-down guard; `close()` disconnects and gives the
lease back. The fleet runner (`execution.fleet`) and the one-shot verbs (`execution.oneshot`) add their
own rules on top; `execution.cluster` runs this same session on the Dask worker that holds the device.

The device is measured only while the session holds its lease: the lease is watched during each job, a job
in flight when the lease is lost is stopped (its connection closed) and never comes back ok, and the
outcome tells the caller to stop using the device. A job that times out is followed by a short liveness
check; a device that does not answer it is given up at once (one timeout, not one per remaining job).
"""

from __future__ import annotations

import importlib
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from tenacity import (
    Retrying,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from ..descriptors import DeviceSpec
from ..errors import CommandError, CommandTimeout, EdgebenchError, HostKeyError, TransportError, one_line
from ..jobs import Job, JobOutcome
from ..lab.device import Device
from ..records import utc_now
from .execute import error_kind, execute_job
from .leases import DEFAULT_LEASE_S, DeviceLease, LeaseHolder, lease_key
from .provenance import descriptor_summary
from .suite import RunPolicy

HEALTH_TIMEOUT_S = 120.0
LIVENESS_TIMEOUT_S = 5.0  # after a timeout: a device that cannot run `true` this fast is hung
LEASE_WATCH_S = 0.5  # how often a running job looks at its lease
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


def queued_note(device: str, on_state: StateFn) -> Callable[[LeaseHolder | None, float], None]:
    """The lease's on_wait callback: say who holds the device while we wait for it."""

    def queued(holder: LeaseHolder | None, waited: float) -> None:
        on_state("queued", f"device leased by {holder.describe(device) if holder else 'another process'}")

    return queued


class LeaseWatch:
    """While a job runs, look at the lease every `poll_s`; once it is lost, call `on_lost` (once): the job is
    stopped then, not after it finished measuring someone else's device."""

    def __init__(
        self, lease: DeviceLease, on_lost: Callable[[], None], poll_s: float = LEASE_WATCH_S
    ) -> None:
        self.lease = lease
        self.on_lost = on_lost
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name=f"edgebench-lease-{lease.device}", daemon=True
        )

    def __enter__(self) -> LeaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.lease.lost:
                try:
                    self.on_lost()
                except Exception:  # noqa: BLE001 - stopping a job that is going anyway must not crash the watch
                    pass
                return


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
        device: Device | None = None,
    ) -> None:
        self.spec = spec
        self.device = spec.name
        self.run_id = run_id
        self.policy = policy
        # A caller that tries again and again (a cluster worker) passes the same lease each time: the lease
        # remembers how long it has watched an unrefreshed holder, which is what lets it take over.
        self.lease = lease or DeviceLease(
            spec.name, key=lease_key(spec), run_id=run_id, folder=lock_dir, lease_s=lease_s
        )
        self.lease.run_id = run_id
        self._sleep = sleep
        self._connect_fn = connect
        # A device the caller opened and keeps (its push cache outlives the session): used, never closed.
        self._borrowed = device
        self._dev: Device | None = device
        self._guard: CooldownGuard | None = None

    # -- lifecycle
    def prepare(self, on_state: StateFn) -> DeviceReady:
        on_state("lease", "")
        self.lease.acquire(timeout=self.policy.lease_timeout_s, on_wait=queued_note(self.device, on_state))
        on_state("connecting", "")
        fingerprint = self._health_check()
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
        """Run one job (retrying transport errors); never raises. The outcome's `stop_device` says when the
        device must not be used again: its lease was lost, or it stopped answering after a timeout."""
        if self.lease.lost:
            return self._lost_outcome(job)
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
            if self.lease.lost:
                return self._lost_outcome(job)
            try:
                device = self._connected()
            except Exception as exc:  # noqa: BLE001 - a failed (re)connect is this attempt's outcome
                outcome = error_outcome(job, one_line(exc), error_kind(exc), exc)
            else:
                with LeaseWatch(self.lease, self._abort):
                    outcome = execute_job(device, job, self.run_id)
            if self.lease.lost:  # whatever the job measured, it was no longer our device to measure
                return self._lost_outcome(job, outcome)
            if is_transient(outcome.exception):
                attempts.append(outcome.error or "")
                self._disconnect()  # the next attempt reconnects from scratch
            return outcome

        retrying = Retrying(
            stop=stop_after_attempt(1 + self.policy.retries),
            wait=wait_exponential(multiplier=self.policy.backoff_s, max=self.policy.max_backoff_s),
            retry=retry_if_result(lambda o: is_transient(o.exception) and not o.stop_device),
            retry_error_callback=_last_outcome,
            sleep=self._sleep,
        )
        outcome: JobOutcome = retrying(attempt)
        if isinstance(outcome.exception, CommandTimeout) and not outcome.stop_device:
            hung = self._unresponsive()
            if hung:
                outcome.stop_device = f"{self.device} does not answer after a timeout ({hung})"
        if attempts and outcome.ok:
            notes.append(f"succeeded after {len(attempts)} transport error(s); first: {attempts[0]}")
        elif len(attempts) > 1:
            # The first failure says what happened to the device; the last one what retrying ran into.
            first = f"; first: {attempts[0]}" if attempts[0] != outcome.error else ""
            outcome.error = f"{outcome.error} (after {len(attempts)} attempts{first})"
        outcome.warnings = notes + outcome.warnings
        return outcome

    # -- pieces
    def _lost_outcome(self, job: Job, outcome: JobOutcome | None = None) -> JobOutcome:
        """The job as an error: the lease went to another holder before (or while) it ran."""
        why = f"{self.device}: {self.lease.lost}"
        if outcome is not None and outcome.ok:
            why += f"; the job's results ({len(outcome.records)} records) are not kept"
        lost = error_outcome(job, why, "lab")
        if outcome is not None:
            lost.started, lost.finished, lost.wall_s = outcome.started, outcome.finished, outcome.wall_s
        lost.stop_device = why
        return lost

    def _abort(self) -> None:
        """From the lease watch: end the job in flight by closing its connection (the transport ends the
        command on the device)."""
        dev = self._dev
        if dev is not None and self._borrowed is None:
            dev.close()

    def _unresponsive(self) -> str | None:
        """After a timeout, can the device still run `true` at once, on a fresh connection? Why not, or None.

        A slow job times out on a healthy device; a hung one fails this too, and is given up now."""
        self._disconnect()  # the timed-out connection may be wedged with the device
        limit = min(LIVENESS_TIMEOUT_S, self._call_limit())
        try:
            self._connected(limit).transport.run(["true"], timeout=limit)
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the answer
            self._disconnect()
            return one_line(exc)
        return None

    def _call_limit(self) -> float:
        """The bound on one remote call: the run's timeout, else the descriptor's."""
        return self.policy.timeout_s or self.spec.timeout_s

    def _connected(self, limit: float | None = None) -> Device:
        if self._dev is None:
            spec = self.spec
            if limit is not None and limit < spec.connect_timeout_s:
                spec = replace(spec, connect_timeout_s=limit)  # reaching the device counts against the limit
            self._dev = self._connect_fn(spec)
        return self._dev

    def _disconnect(self) -> None:
        if self._borrowed is not None:
            return  # the caller's device: it closes it
        dev, self._dev = self._dev, None
        if dev is not None:
            try:
                dev.close()
            except Exception:  # noqa: BLE001 - a dead connection may fail to close; it is gone either way
                pass

    def _health_check(self) -> dict[str, Any]:
        """Reach the device and ask what it is (the agent's fingerprint, or the shell's on native devices),
        retrying transport errors, all of it within one limit: the call limit (the run's --timeout, else the
        descriptor's), at most HEALTH_TIMEOUT_S."""
        limit = min(self._call_limit(), HEALTH_TIMEOUT_S)
        deadline = time.monotonic() + limit

        def attempt() -> dict[str, Any]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(["health check"], limit, device=self.device)
            return self._connected(remaining).fingerprint(remaining)

        def before_sleep(_state: Any) -> None:
            self._disconnect()

        retrying = Retrying(
            stop=stop_after_attempt(1 + self.policy.retries) | stop_after_delay(limit),
            wait=wait_exponential(multiplier=self.policy.backoff_s, max=self.policy.max_backoff_s),
            retry=retry_if_exception(is_transient),
            before_sleep=before_sleep,
            sleep=self._sleep,
            reraise=True,
        )
        return retrying(attempt)

    def _cooldown_guard(self) -> CooldownGuard | None:
        if not self.policy.cooldown or self._dev is None:
            return None
        return cooldown_guard(self._dev, self.policy)


def _last_outcome(state: Any) -> JobOutcome:
    """When retries run out, the last attempt's outcome is the job's result: failures are data."""
    return state.outcome.result()


def cooldown_guard(device: Device, policy: RunPolicy) -> CooldownGuard | None:
    """The thermal cool-down guard (`probes.cooldown`) when the device has thermal sensors and runs
    the Python agent; None otherwise, and the run goes on without one."""
    if device.spec.agent != "python":
        return None
    try:
        module = importlib.import_module("..probes.cooldown", __package__)
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


def prebuild_agent() -> None:
    """Pack the agent once before device threads start, so they never race to write the same file."""
    from ..lab.agentpack import build_agent

    build_agent(Path(tempfile.gettempdir()) / "edgebench-agent")
