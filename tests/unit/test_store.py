"""The store: schema version, one transaction per job, ok jobs stored once, errors kept."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from edgebench.errors import UserError
from edgebench.jobs import Job, JobOutcome
from edgebench.records import RecordContext
from edgebench.results.store import SCHEMA_VERSION, Store


def outcome(run_id: str, ok: bool = True, threads: int = 1) -> JobOutcome:
    job = Job(device="local", probe="bench", runtime="onnxruntime", params={"threads": threads})
    ctx = RecordContext(run_id, "local", "bench", "mlp", "onnxruntime", {"threads": threads})
    if not ok:
        return JobOutcome(job, "error", error="device vanished", error_kind="lab")
    return JobOutcome(
        job,
        "ok",
        [ctx.record("latency_ms", 1.5, "ms", stat="p50")],
        [ctx.samples("latency_ms", "ms", [1.4, 1.5, 1.6])],
    )


def test_round_trip_records_and_samples(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as st:
        st.begin_run("r1", "bench", {"edgebench": "x"})
        assert st.save_job("r1", outcome("r1"))
        st.finish_run("r1", "ok")
        [rec] = st.records(["r1"])
        [smp] = st.samples(["r1"])
    assert rec.value == 1.5 and rec.params == {"threads": 1, "stat": "p50"}
    assert smp.values == (1.4, 1.5, 1.6) and smp.params == {"threads": 1}


def test_ok_job_is_never_stored_twice(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as st:
        st.begin_run("r1", "run", {})
        assert st.save_job("r1", outcome("r1", ok=False))
        assert st.save_job("r1", outcome("r1"))
        assert not st.save_job("r1", outcome("r1"))
        assert len(st.records(["r1"])) == 1
        assert st.errors(["r1"]) == []  # the later ok attempt supersedes the error
        assert st.ok_job_keys("r1") == {outcome("r1").job.key}


def test_errors_are_kept(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as st:
        st.begin_run("r1", "run", {})
        st.save_job("r1", outcome("r1", ok=False))
        [err] = st.errors(["r1"])
    assert err["error"] == "device vanished" and err["kind"] == "lab"


def test_unknown_run_is_a_user_error(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as st, pytest.raises(UserError, match="unknown run 'nope'"):
        st.run("nope")


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(UserError, match="newer than this edgebench"):
        Store(path)


def test_foreign_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE mine(x)")
    with pytest.raises(UserError, match="not an edgebench store"):
        Store(path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == [("mine",)]


def test_garbage_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(UserError, match="junk.db"):
        Store(path)


# Spin (not sleep) until the common start, so the processes really open the new file together.
OPEN_AT_ONCE = """
import sys, time
from edgebench.results.store import Store
start = float(sys.argv[2])
while time.time() < start:
    pass
with Store(sys.argv[1]) as store:
    store.begin_run(sys.argv[3], "bench", {})
"""


def test_many_controllers_opening_a_new_store_at_once_all_get_it(tmp_path: Path) -> None:
    """Without retrying a locked WAL switch, 2 of 10 such trials failed here ("database is locked")."""
    import subprocess
    import sys
    import time

    for trial in range(4):
        path = tmp_path / f"shared-{trial}.db"
        start = time.time() + 1.5  # every process is up and spinning by then
        procs = [
            subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, str(path), str(start), f"run-{i}"],
                             stderr=subprocess.PIPE, text=True)
            for i in range(12)
        ]  # fmt: skip
        errors = [p.communicate(timeout=120)[1] for p in procs if p.wait(timeout=120) != 0]
        assert errors == [], errors[0].strip().splitlines()[-1]
        with Store(path) as store:
            assert len(store.db.execute("SELECT run_id FROM runs").fetchall()) == 12


def test_a_store_created_by_another_controller_between_two_checks_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving behind a rare "not an edgebench store" with twelve controllers at once, made
    certain: another controller creates and commits the store between this one's two looks at the empty
    file (does it have a meta table; does it have any table). One snapshot must serve both."""
    path = tmp_path / "new.db"
    real_connect = sqlite3.connect
    created: list[bool] = []

    def create_meanwhile(statement: str) -> None:
        if "count(*) FROM sqlite_master" in statement and not created:
            created.append(True)
            Store(path).close()  # its own connection: commits the whole schema now

    def connect(*args, **kwargs):  # type: ignore[no-untyped-def]
        db = real_connect(*args, **kwargs)
        if not created:
            db.set_trace_callback(create_meanwhile)
        return db

    monkeypatch.setattr(sqlite3, "connect", connect)
    with Store(path) as store:
        store.begin_run("r1", "bench", {})
    assert created == [True]
    with Store(path) as store:
        assert store._schema_version() == SCHEMA_VERSION
        assert [r[0] for r in store.db.execute("SELECT run_id FROM runs")] == ["r1"]


def test_a_store_waits_on_another_process_as_long_as_it_is_told(tmp_path: Path) -> None:
    """A run's `store_timeout` is the busy timeout of its statements: past it a write fails ("database is
    locked") and the run spools it; the default is 60 s."""
    with Store(tmp_path / "s.db", busy_timeout_s=2.5) as st:
        assert st.db.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    with Store(tmp_path / "s.db") as st:
        assert st.db.execute("PRAGMA busy_timeout").fetchone()[0] == 60000


def test_a_store_locked_while_it_opens_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Locked past the open's wait, a store is named as locked by another process, not as a foreign file."""
    import edgebench.results.store as store_module

    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.5)  # the open's wait, at least the busy timeout
    path = tmp_path / "s.db"
    holder = sqlite3.connect(path, isolation_level=None)  # a rollback-journal database: WAL needs its lock
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(UserError) as err:
            Store(path, busy_timeout_s=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "another process holds the store's lock" in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)
