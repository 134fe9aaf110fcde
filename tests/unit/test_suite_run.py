"""The executor's rules with fake sessions and devices: failures are data, retries only for transport
errors, quarantine, unreachable devices, devices in parallel and jobs in series, one store row per job."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from edgebench.descriptors import builtin_local
from edgebench.errors import (
    CommandError,
    CommandTimeout,
    HostKeyError,
    LabError,
    MeasurementError,
    TransportError,
)
from edgebench.execution import session as device_session
from edgebench.execution.execute import error_kind
from edgebench.execution.fleet import RunResult, run_plan
from edgebench.execution.session import DeviceReady, LocalSession, is_transient
from edgebench.execution.suite import RunPolicy
from edgebench.jobs import Job, JobOutcome
from edgebench.records import Record, utc_now
from edgebench.results.store import Store

POLICY = RunPolicy(retries=2, backoff_s=0.0, quarantine_after=2, cooldown=False)


def jobs_for(device: str, n: int) -> list[Job]:
    return [Job(device=device, probe="bench", params={"i": i}) for i in range(n)]


def ok_outcome(job: Job) -> JobOutcome:
    rec = Record("r", job.device, job.probe, None, None, "latency_ms", 1.0, "ms", {"i": job.params["i"]})
    return JobOutcome(job, "ok", [rec], started=utc_now(), finished=utc_now())


def failed(job: Job, exc: Exception) -> JobOutcome:
    return JobOutcome(job, "error", error=str(exc), error_kind=error_kind(exc), exception=exc)


class FakeSession:
    """Answers each job from a script: an exception -> an error outcome, else ok."""

    def __init__(
        self,
        device: str,
        script: dict[int, Exception] | None = None,
        *,
        unreachable: Exception | None = None,
        delay: float = 0.0,
    ) -> None:
        self.device = device
        self.script = script or {}
        self.unreachable = unreachable
        self.delay = delay
        self.ran: list[int] = []
        self.intervals: list[tuple[float, float]] = []
        self.closed = False

    def prepare(self, on_state: Any) -> DeviceReady:
        if self.unreachable:
            raise self.unreachable
        return DeviceReady(self.device, {"cores": 2}, {"name": self.device})

    def run(self, job: Job, first: bool) -> JobOutcome:
        t0 = time.monotonic()
        time.sleep(self.delay)
        self.ran.append(job.params["i"])
        self.intervals.append((t0, time.monotonic()))
        exc = self.script.get(job.params["i"])
        return failed(job, exc) if exc else ok_outcome(job)

    def close(self) -> None:
        self.closed = True


def run(
    tmp_path: Path, sessions: dict[str, FakeSession], jobs: list[Job], done: set[str] | None = None
) -> tuple[RunResult, Store]:
    store = Store(tmp_path / "s.db")
    store.begin_run("r", "suite", {})
    summaries, outcomes = run_plan("r", jobs, sessions.__getitem__, store, POLICY, done_keys=done or set())
    return RunResult("r", "t", "x", summaries, outcomes), store


def test_failures_are_data_and_the_other_jobs_go_on(tmp_path: Path) -> None:
    a = FakeSession("a", {1: MeasurementError("runtime rejected the model")})
    b = FakeSession("b")
    result, store = run(tmp_path, {"a": a, "b": b}, jobs_for("a", 3) + jobs_for("b", 2))
    assert a.ran == [0, 1, 2] and b.ran == [0, 1] and a.closed and b.closed
    assert result.exit_code == 1
    assert (result.devices["a"].ok, result.devices["a"].failed, result.devices["a"].state) == (2, 1, "failed")
    [err] = store.errors(["r"])
    assert err["device"] == "a" and err["params"] == {"i": 1} and "rejected" in err["error"]
    assert err["kind"] == "measurement"
    assert len(store.records(["r"])) == 4
    assert store.device_info(["r"])[0]["fingerprint"] == {"cores": 2}


def test_an_unreachable_device_fails_its_jobs_and_exits_3(tmp_path: Path) -> None:
    down = FakeSession("down", unreachable=TransportError("connection refused", device="down"))
    up = FakeSession("up")
    result, store = run(tmp_path, {"down": down, "up": up}, jobs_for("down", 3) + jobs_for("up", 2))
    assert result.exit_code == 3 and result.devices["down"].state == "unreachable"
    assert result.devices["up"].state == "ok" and up.ran == [0, 1]
    errors = store.errors(["r"])
    assert len(errors) == 3 and all("down unreachable" in e["error"] and e["kind"] == "lab" for e in errors)


def test_consecutive_device_failures_quarantine_the_device(tmp_path: Path) -> None:
    lost = TransportError("connection reset", device="a")
    a = FakeSession("a", {1: lost, 2: lost, 3: lost})
    result, store = run(tmp_path, {"a": a}, jobs_for("a", 6))
    assert a.ran == [0, 1, 2]  # quarantined after 2 lab failures in a row: jobs 3..5 never reach the device
    summary = result.devices["a"]
    assert summary.state == "quarantined" and (summary.ok, summary.failed) == (1, 5)
    assert "quarantined after 2 failed jobs in a row" in summary.error
    assert len(store.errors(["r"])) == 5 and result.exit_code == 1


def test_measurement_failures_do_not_quarantine_a_device(tmp_path: Path) -> None:
    bad = MeasurementError("wrong numerics")
    a = FakeSession("a", {0: bad, 1: bad, 2: bad})
    result, _ = run(tmp_path, {"a": a}, jobs_for("a", 4))
    assert a.ran == [0, 1, 2, 3] and result.devices["a"].state == "failed"


def test_devices_run_in_parallel_and_each_device_in_series(tmp_path: Path) -> None:
    sessions = {d: FakeSession(d, delay=0.25) for d in ("a", "b", "c")}
    start = time.monotonic()
    result, _ = run(tmp_path, sessions, [j for d in sessions for j in jobs_for(d, 3)])
    wall = time.monotonic() - start
    assert result.exit_code == 0
    assert wall < 3 * 3 * 0.25 * 0.7, wall  # serial would take 2.25 s
    for s in sessions.values():
        assert s.ran == [0, 1, 2]
        for (_, end), (begin, _) in zip(s.intervals, s.intervals[1:], strict=False):
            assert begin >= end  # one device never runs two jobs at once


def test_resume_skips_jobs_already_ok(tmp_path: Path) -> None:
    jobs = jobs_for("a", 4)
    a = FakeSession("a")
    result, _ = run(tmp_path, {"a": a}, jobs, done={jobs[0].key, jobs[2].key})
    assert a.ran == [1, 3] and result.devices["a"].skipped == 2 and result.devices["a"].ok == 2


# ---- LocalSession: retries for transport errors only ------------------------------------------------------
class Script:
    """execute_job stand-in: raises the scripted errors in order, then succeeds."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, device: Any, job: Job, run_id: str) -> JobOutcome:
        self.calls += 1
        if self.errors:
            return failed(job, self.errors.pop(0))
        return ok_outcome(job)


class FakeDevice:
    def __init__(self) -> None:
        self.closed = False
        self.spec = builtin_local()

    def close(self) -> None:
        self.closed = True

    def fingerprint(self, timeout: float) -> dict[str, Any]:
        return {"kernel": "test"}


def session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errors: list[Exception], connects: list[FakeDevice]
) -> tuple[LocalSession, Script]:
    script = Script(errors)
    monkeypatch.setattr(device_session, "execute_job", script)

    def connect(spec: Any) -> FakeDevice:
        connects.append(FakeDevice())
        return connects[-1]

    s = LocalSession(
        builtin_local(), "r", POLICY, lock_dir=tmp_path / "locks", sleep=lambda s: None, connect=connect
    )  # type: ignore[arg-type]
    s.prepare(lambda state, detail: None)
    return s, script


def test_transport_errors_are_retried_on_a_fresh_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connects: list[FakeDevice] = []
    s, script = session(tmp_path, monkeypatch, [TransportError("reset"), TransportError("reset")], connects)
    try:
        outcome = s.run(Job("local", "bench", params={"i": 0}), first=True)
    finally:
        s.close()
    assert outcome.ok and script.calls == 3
    assert len(connects) == 3 and connects[0].closed and connects[1].closed  # each retry reconnects
    assert any("succeeded after 2 transport error(s)" in w for w in outcome.warnings)


@pytest.mark.parametrize(
    "exc",
    [
        MeasurementError("numbers are off"),
        CommandTimeout(["python3"], 5.0),
        CommandError(["python3"], 1, "", "boom"),
        HostKeyError("changed host key"),
        LabError("interpreter not found"),
    ],
)
def test_other_failures_are_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    s, script = session(tmp_path, monkeypatch, [exc], [])
    try:
        outcome = s.run(Job("local", "bench", params={"i": 0}), first=True)
    finally:
        s.close()
    assert not outcome.ok and script.calls == 1 and not is_transient(exc)


def test_retries_give_up_with_the_last_error_as_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s, script = session(tmp_path, monkeypatch, [TransportError(f"reset {i}") for i in range(5)], [])
    try:
        outcome = s.run(Job("local", "bench", params={"i": 0}), first=True)
    finally:
        s.close()
    assert not outcome.ok and script.calls == 3 and outcome.error_kind == "lab"
    assert outcome.error == "reset 2 (after 3 attempts; first: reset 0)"


def test_a_died_command_counts_as_a_transport_error() -> None:
    assert is_transient(CommandError(["python3"], None, "", "connection lost"))


def test_health_check_retries_then_reports_unreachable(tmp_path: Path) -> None:
    attempts = []

    def connect(spec: Any) -> Any:
        attempts.append(1)
        raise TransportError("connection refused", device="local")

    s = LocalSession(
        builtin_local(), "r", POLICY, lock_dir=tmp_path / "locks", sleep=lambda s: None, connect=connect
    )
    with pytest.raises(TransportError, match="connection refused"):
        s.prepare(lambda state, detail: None)
    s.close()
    assert len(attempts) == 3
    assert not s.lease.held  # the lease went back


def test_a_lost_lease_stops_the_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s, script = session(tmp_path, monkeypatch, [], [])
    monkeypatch.setattr(type(s.lease), "lost", property(lambda self: "taken over"))
    outcome = s.run(Job("local", "bench", params={"i": 0}), first=True)
    monkeypatch.undo()
    s.close()
    assert not outcome.ok and "taken over" in outcome.error and script.calls == 0


def test_run_plan_never_hangs_when_a_session_breaks(tmp_path: Path) -> None:
    class Broken(FakeSession):
        def run(self, job: Job, first: bool) -> JobOutcome:
            raise RuntimeError("bug")

    done = threading.Event()
    result: list[RunResult] = []

    def go() -> None:
        result.append(run(tmp_path, {"a": Broken("a")}, jobs_for("a", 2))[0])
        done.set()

    threading.Thread(target=go, daemon=True).start()
    assert done.wait(10)
    summary = result[0].devices["a"]
    assert summary.state == "failed" and "internal error" in summary.error and summary.failed == 2
    assert result[0].exit_code == 1
    assert all(o.error_kind == "internal" for o in result[0].outcomes)


# ---- cool-down guard between jobs ----------------------------------------------------------------------
class FakeCooldown:
    """Stands in for edgebench.probes.cooldown: records calls, answers with real CooldownResults."""

    from edgebench.probes.cooldown import CooldownPolicy, CooldownResult

    def __init__(self, zone: str | None, waited_s: float = 0.0) -> None:
        self.zone = zone
        self.waited_s = waited_s
        self.calls: list[tuple[float, dict[str, float] | None]] = []

    def wait_for_cooldown(self, device: Any, policy: Any = None, idle_c: Any = None) -> Any:
        self.calls.append((policy.timeout_s, dict(idle_c) if idle_c else None))
        if self.zone is None:
            return self.CooldownResult(True, 0.0, None, None, {}, "no thermal zones")
        return self.CooldownResult(True, self.waited_s, self.zone, 41.0, {self.zone: 40.0}, "estimated")


def test_the_guard_is_used_only_on_devices_with_thermal_zones(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    device = FakeDevice()
    none, hot = FakeCooldown(None), FakeCooldown("cpu-thermal")
    monkeypatch.setitem(sys.modules, "edgebench.probes.cooldown", none)
    assert device_session.cooldown_guard(device, POLICY) is None and none.calls == [(0.0, None)]
    monkeypatch.setitem(sys.modules, "edgebench.probes.cooldown", hot)
    guard = device_session.cooldown_guard(device, POLICY)
    assert isinstance(guard, device_session.AgentCooldownGuard)
    native = FakeDevice()
    native.spec = replace(builtin_local(), agent="native")
    assert device_session.cooldown_guard(native, POLICY) is None  # sensors live in the Python agent


def test_the_guard_waits_between_jobs_and_reuses_idle_readings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCooldown("cpu-thermal", waited_s=12.5)
    monkeypatch.setattr(
        device_session,
        "cooldown_guard",
        lambda device, policy: device_session.AgentCooldownGuard(device, fake, 300.0),
    )
    connects: list[FakeDevice] = []
    script = Script([])
    monkeypatch.setattr(device_session, "execute_job", script)
    s = LocalSession(
        builtin_local(),
        "r",
        replace(POLICY, cooldown=True),
        lock_dir=tmp_path / "locks",
        connect=lambda spec: connects.append(FakeDevice()) or connects[-1],
    )  # type: ignore[arg-type]
    ready = s.prepare(lambda state, detail: None)
    try:
        outcomes = [s.run(Job("local", "bench", params={"i": i}), first=(i == 0)) for i in range(3)]
    finally:
        s.close()
    assert "cool-down guard active between jobs" in ready.notes
    assert fake.calls == [(300.0, None), (300.0, {"cpu-thermal": 40.0})]  # not before the first job
    assert not any("cool-down" in w for w in outcomes[0].warnings)
    for o in outcomes[1:]:
        assert any(w.startswith("cool-down guard: cool after 12.5 s") for w in o.warnings), o.warnings
