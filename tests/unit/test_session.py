"""The device session's rules with fake devices and a real lease folder: the device is measured only while
the lease is ours (watched during the job, checked after it), a hung device is given up after one timeout,
the health check stays within the run's timeout, and the fleet runner stops a device's series at once."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edgebench.descriptors import builtin_local
from edgebench.errors import CommandTimeout, TransportError
from edgebench.execution import session as device_session
from edgebench.execution.fleet import run_plan
from edgebench.execution.leases import DeviceLease, lease_history, lease_key
from edgebench.execution.session import LocalSession
from edgebench.execution.suite import RunPolicy
from edgebench.jobs import Job, JobOutcome
from edgebench.records import Record, utc_now
from edgebench.results.store import Store
from edgebench.transports.base import CommandResult

POLICY = RunPolicy(retries=2, backoff_s=0.0, quarantine_after=3, cooldown=False)


class FakeTransport:
    """Answers `true` at once, or fails every call with the given error (a hung device)."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Any, *, timeout: float, env: Any = None) -> CommandResult:
        self.calls.append(tuple(argv))
        if self.fail is not None:
            raise self.fail
        return CommandResult(tuple(argv), 0, "", "", 0.0)


class FakeDevice:
    def __init__(self, transport: FakeTransport | None = None) -> None:
        self.spec = builtin_local()
        self.transport = transport or FakeTransport()
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()

    def fingerprint(self, timeout: float) -> dict[str, Any]:
        return {"kernel": "test"}


def ok_outcome(job: Job) -> JobOutcome:
    rec = Record("r", job.device, job.probe, None, None, "latency_ms", 1.0, "ms", {})
    return JobOutcome(job, "ok", [rec], started=utc_now(), finished=utc_now())


def make_session(tmp_path: Path, devices: list[FakeDevice], policy: RunPolicy = POLICY) -> LocalSession:
    def connect(spec: Any) -> FakeDevice:
        devices.append(FakeDevice(devices[-1].transport if devices else None))
        return devices[-1]

    s = LocalSession(
        builtin_local(), "run-a", policy, lock_dir=tmp_path, sleep=lambda s: None, connect=connect
    )  # type: ignore[arg-type]
    s.prepare(lambda state, detail: None)
    return s


def take_over(lease: DeviceLease) -> None:
    """What a contender does to a holder it judged gone: a new marker in place of ours (a new inode)."""
    fresh = lease.marker_path.with_name("taken")
    fresh.write_text("another holder")
    os.replace(fresh, lease.marker_path)


def test_a_lease_lost_during_a_job_stops_it_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    devices: list[FakeDevice] = []
    s = make_session(tmp_path, devices)
    ended: list[float] = []

    def job_that_outlives_its_lease(device: Any, job: Job, run_id: str) -> JobOutcome:
        take_over(s.lease)
        stopped = device.closed.wait(10)  # the lease watch closes the connection: the job ends early
        ended.append(time.monotonic())
        if stopped:
            return JobOutcome(job, "error", error="connection closed", exception=TransportError("closed"))
        return ok_outcome(job)

    monkeypatch.setattr(device_session, "execute_job", job_that_outlives_its_lease)
    start = time.monotonic()
    outcome = s.run(Job("local", "bench", params={"i": 0}), first=True)
    s.close()
    assert ended and ended[0] - start < 3 * device_session.LEASE_WATCH_S + 1.0  # stopped, not run out
    assert not outcome.ok and outcome.error_kind == "lab" and "lease on local was lost" in outcome.error
    assert outcome.stop_device and len(devices) == 1  # a lost lease is never retried on a new connection
    assert [e["event"] for e in lease_history(lease_key(builtin_local()), tmp_path)] == ["acquired", "lost"]


def test_a_job_that_finishes_after_its_lease_was_lost_is_not_ok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_session(tmp_path, [])

    def measured_then_lost(device: Any, job: Job, run_id: str) -> JobOutcome:
        take_over(s.lease)  # e.g. the controller froze past the lease and thawed just as the job ended
        return ok_outcome(job)

    monkeypatch.setattr(device_session, "execute_job", measured_then_lost)
    outcome = s.run(Job("local", "bench", params={"i": 0}), first=True)
    later = s.run(Job("local", "bench", params={"i": 1}), first=False)
    s.close()
    assert not outcome.ok and outcome.records == [] and "1 records) are not kept" in outcome.error
    assert not later.ok and "lost" in later.error and later.stop_device


@pytest.mark.parametrize("hung", [True, False], ids=["hung device", "slow job on a healthy device"])
def test_after_a_timeout_only_a_device_that_does_not_answer_is_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hung: bool
) -> None:
    fail = CommandTimeout(["true"], 5.0, device="local") if hung else None
    devices = [FakeDevice(FakeTransport(fail=fail))]
    s = make_session(tmp_path, devices)
    monkeypatch.setattr(
        device_session,
        "execute_job",
        lambda device, job, run_id: JobOutcome(
            job, "error", error="timed out", error_kind="lab", exception=CommandTimeout(["python3"], 60.0)
        ),
    )
    outcome = s.run(Job("local", "bench", params={"i": 0}), first=True)
    s.close()
    assert not outcome.ok and devices[-1].transport.calls == [("true",)]  # one quick look, fresh connection
    if hung:
        assert outcome.stop_device and "does not answer after a timeout" in outcome.stop_device
    else:
        assert outcome.stop_device is None


def test_the_health_check_stays_within_the_runs_timeout(tmp_path: Path) -> None:
    attempts: list[float] = []

    def unreachable(spec: Any) -> Any:
        attempts.append(spec.connect_timeout_s)
        time.sleep(0.3)
        raise TransportError("connection refused", device="local")

    policy = RunPolicy(retries=10, backoff_s=0.1, max_backoff_s=0.1, cooldown=False, timeout_s=1.0)
    s = LocalSession(builtin_local(), "r", policy, lock_dir=tmp_path, connect=unreachable)
    start = time.monotonic()
    with pytest.raises(TransportError):
        s.prepare(lambda state, detail: None)
    took = time.monotonic() - start
    s.close()
    assert took < 2.5 and 1 < len(attempts) < 11  # retried, but not beyond the limit
    assert 0.5 < attempts[0] <= 1.0  # connecting counts against the limit too (descriptor: 10 s)


class StopAfter:
    """A session whose n-th job says the device must not be used again."""

    def __init__(self, device: str, n: int) -> None:
        self.device, self.n, self.ran = device, n, []

    def prepare(self, on_state: Any) -> Any:
        from edgebench.execution.session import DeviceReady

        return DeviceReady(self.device, {}, {})

    def run(self, job: Job, first: bool) -> JobOutcome:
        self.ran.append(job.params["i"])
        if len(self.ran) == self.n:
            out = JobOutcome(job, "error", error="lease lost", error_kind="lab")
            out.stop_device = "board: lease lost to run B"
            return out
        return ok_outcome(job)

    def close(self) -> None:
        pass


def test_the_fleet_ends_a_device_series_when_its_session_says_so(tmp_path: Path) -> None:
    s = StopAfter("board", 2)
    jobs = [Job("board", "bench", params={"i": i}) for i in range(5)]
    with Store(tmp_path / "s.db") as store:
        store.begin_run("r", "suite", {})
        summaries, outcomes = run_plan("r", jobs, lambda name: s, store, POLICY)
        errors = store.errors(["r"])
    assert s.ran == [0, 1] and summaries["board"].state == "quarantined"
    assert summaries["board"].error == "board: lease lost to run B"
    assert len(errors) == 4 and all("lease lost" in e["error"] for e in errors)
