"""The device session: the one path by which anything drives a device (a suite run, a one-shot verb, a
cluster worker).

A session owns one device for as long as its caller needs it: it takes the device's lease (with its journal
entry), reaches the device and checks its health (the fingerprint stored with the run), runs jobs with
transport retries (tenacity) and, between jobs, the cool-down guard; `close()` disconnects and gives the
lease back. The fleet runner (`execution.fleet`) and the one-shot verbs (`execution.oneshot`) add their
own rules on top; `execution.cluster` runs this same session on the Dask worker that holds the device.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tenacity import Retrying, retry_if_exception, retry_if_result, stop_after_attempt, wait_exponential

from ..errors import CommandError, CommandTimeout, EdgebenchError, HostKeyError, TransportError, one_line
from ..lab.descriptors import DeviceSpec
from ..lab.device import Device
from ..records import utc_now
from .execute import error_kind, execute_job
from .jobs import Job, JobOutcome
from .leases import DEFAULT_LEASE_S, DeviceLease, LeaseHolder
from .provenance import descriptor_summary
from .suite import RunPolicy

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


def queued_note(on_state: StateFn) -> Callable[[LeaseHolder | None, float], None]:
    """The lease's on_wait callback: say who holds the device while we wait for it."""

    def queued(holder: LeaseHolder | None, waited: float) -> None:
        on_state("queued", f"device leased by {holder.describe() if holder else 'another process'}")

    return queued


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
        self.lease = lease or DeviceLease(spec.name, run_id=run_id, folder=lock_dir, lease_s=lease_s)
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
        self.lease.acquire(timeout=self.policy.lease_timeout_s, on_wait=queued_note(on_state))
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
            # The first failure says what happened to the device; the last one what retrying ran into.
            first = f"; first: {attempts[0]}" if attempts[0] != outcome.error else ""
            outcome.error = f"{outcome.error} (after {len(attempts)} attempts{first})"
        outcome.warnings = notes + outcome.warnings
        return outcome

    # -- pieces
    def _connected(self) -> Device:
        if self._dev is None:
            self._dev = self._connect_fn(self.spec)
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


def prebuild_agent() -> None:
    """Pack the agent once before device threads start, so they never race to write the same file."""
    from ..lab.agentpack import build_agent

    build_agent(Path(tempfile.gettempdir()) / "edgebench-agent")
