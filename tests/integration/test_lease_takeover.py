"""A frozen lease holder stops measuring after a takeover: controller A runs a suite on a real ssh board and
is frozen (SIGSTOP) mid-run; controller B takes the board's lease once A's marker has gone unrefreshed for
the lease (3 s here) and measures; A is thawed while B runs. After the thaw A stores no ok job for the board
(the job it had in flight comes back as a "lease lost" error, the rest are not run), no ok job of A
overlaps one of B's, and the board's lease journal shows the takeover."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edgebench.descriptors import load_lab
from edgebench.execution.leases import lease_history
from edgebench.records import utc_now

sys.path.insert(0, str(Path(__file__).parent))
from cli_procs import board_suite, popen, store_rows, wait_until

pytestmark = pytest.mark.integration

LEASE_S = 3.0
SUITE = """
name = "takeover"
devices = ["board"]
models = ["builtin:convnet"]
[[probe]]
kind = "bench"
params = { threads = [1, 2], runs = 20, warmup = 1, warmup_seconds = 0.0, min_seconds = [1.0, 1.2, 1.4, 1.6] }
[policy]
cooldown = false
retries = 0
"""
# A controller with a short lease (every contender must agree on it): the run's API, as `edgebench run` calls it.
CONTROLLER = """
import json, sys
from pathlib import Path
from edgebench.execution.fleet import run_suite
from edgebench.execution.suite import load_suite
from edgebench.descriptors import load_lab
suite, lab, store, locks, lease_s = sys.argv[1:6]
result = run_suite(load_suite(suite), store_path=Path(store), lab=load_lab(lab), lock_dir=Path(locks),
                   lease_s=float(lease_s))
print(json.dumps({"run_id": result.run_id, "status": result.status,
                  "devices": {d: [s.state, s.error, s.ok, s.failed] for d, s in result.devices.items()}}))
"""


def ok_jobs(store: Path, run_id: str | None = None) -> list[tuple[str, str, str]]:
    """(run id, started, finished) of the board's ok jobs, in the order they started."""
    rows = store_rows(store, "SELECT run_id, started, finished FROM jobs WHERE status='ok' ORDER BY started")
    return [r for r in rows if run_id is None or r[0] == run_id]


def test_a_thawed_lease_holder_stores_no_ok_job_after_the_takeover(ssh_board: Any, tmp_path: Path) -> None:
    lab, suite = board_suite(ssh_board, tmp_path, SUITE)
    store, locks = tmp_path / "s.db", tmp_path / "locks"
    argv = [sys.executable, "-c", CONTROLLER, suite, lab, store, locks, str(LEASE_S)]

    def start() -> subprocess.Popen[str]:
        return popen(argv, tmp_path)

    a = start()
    b: subprocess.Popen[str] | None = None
    try:
        wait_until(lambda: len(ok_jobs(store)) >= 1, "run A stored no job")
        os.kill(a.pid, signal.SIGSTOP)  # a hung controller: alive, not refreshing its lease
        [(run_a, _, _)] = ok_jobs(store)[:1]
        b = start()
        wait_until(lambda: any(r != run_a for r, _, _ in ok_jobs(store)), "run B never measured the board")
        thawed = utc_now()
        os.kill(a.pid, signal.SIGCONT)
        out_a, err_a = a.communicate(timeout=120)
        out_b, err_b = b.communicate(timeout=240)
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.communicate()
    assert b.returncode == 0 and a.returncode == 0, (err_a, err_b)
    doc_a, doc_b = json.loads(out_a), json.loads(out_b)
    assert doc_b["status"] == "ok" and doc_b["devices"]["board"][:1] == ["ok"]
    state, error, ok, failed = doc_a["devices"]["board"]
    assert doc_a["status"] == "failed" and state == "quarantined" and "lease on board was lost" in error
    assert f"taken over by run {doc_b['run_id']}" in error

    a_ok, b_jobs = ok_jobs(store, run_a), ok_jobs(store, doc_b["run_id"])
    assert len(b_jobs) == 8 and len(a_ok) == ok and ok + failed == 8
    assert all(finished < thawed for _, _, finished in a_ok), "A stored an ok job after it was thawed"
    spans = sorted((s, f) for _, s, f in a_ok + b_jobs)
    for (_, end), (begin, _) in zip(spans, spans[1:], strict=False):
        assert end <= begin, f"A and B measured the board at once: {spans}"
    with sqlite3.connect(store) as db:
        errors = [
            e for (e,) in db.execute("SELECT error FROM jobs WHERE run_id=? AND status='error'", (run_a,))
        ]
    assert len(errors) == failed and all("lease on board was lost" in e for e in errors)

    events = [(e["event"], e["run_id"]) for e in lease_history(load_lab(lab).get("board"), locks)]
    assert events[:2] == [("acquired", run_a), ("acquired", doc_b["run_id"])]  # taken over, not released
    assert sorted(events[2:]) == sorted([("lost", run_a), ("released", doc_b["run_id"])])


LONG_SUITE = """
name = "frozen"
devices = ["board"]
models = ["builtin:convnet"]
[[probe]]
kind = "bench"
params = { runs = 100, min_seconds = 60, max_seconds = 90 }
[policy]
cooldown = false
"""


def test_a_frozen_controllers_agent_stops_measuring_on_the_board(
    fresh_ssh_board: Any, tmp_path: Path
) -> None:
    """The controller's heartbeat (one line a keepalive interval on the call's stdin) stops when it freezes:
    after interval x count the board reaps the agent, before the lease could pass to another controller."""
    import psutil

    lab, suite = board_suite(
        fresh_ssh_board, tmp_path, LONG_SUITE, keepalive_interval=0.5, keepalive_count_max=4
    )
    argv = [sys.executable, "-c", CONTROLLER, suite, lab, tmp_path / "s.db", tmp_path / "locks", str(LEASE_S)]

    def agents() -> list[int]:
        found = []
        for pid in fresh_ssh_board.session_pids():
            try:
                if '"kind":"bench"' in " ".join(psutil.Process(pid).cmdline()):
                    found.append(pid)
            except psutil.NoSuchProcess:
                pass
        return found

    a = popen(argv, tmp_path)
    try:
        wait_until(lambda: bool(agents()), "the agent never started on the board")
        os.kill(a.pid, signal.SIGSTOP)
        time.sleep(LEASE_S + 12)  # the lease has expired: the device is no longer this controller's
        assert agents() == [], "the frozen controller's agent is still measuring the board"
    finally:
        os.kill(a.pid, signal.SIGCONT)
        a.kill()
        a.communicate()
