"""Store trouble never loses a finished job: a store that refuses writes (SQLite "database is locked" past
its busy timeout, "database or disk is full") makes the writer spool them to a side file, store them in
order once the store takes writes again, and say so; a spool that cannot be stored by the end of the run is
a clear error naming the file, and a later command stores it.

The refusals are simulated here at the sqlite layer (the exceptions sqlite3 raises for SQLITE_BUSY and
SQLITE_FULL); tests/integration/test_store_trouble.py makes them for real (a second process holding the
lock, a size-limited tmpfs)."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest

from edgebench.execution.spool import (
    JobWriter,
    StoreTrouble,
    outcome_from_json,
    outcome_to_json,
    spool_paths,
    store_spooled,
)
from edgebench.jobs import Job, JobOutcome, ModelRef
from edgebench.records import Record, Samples, utc_now
from edgebench.results.store import Store


class RefusingStore(Store):
    """A real store whose writes fail with `refusal` while it is set (what sqlite3 raises)."""

    refusal: str | None = None

    def _check(self) -> None:
        if self.refusal:
            raise sqlite3.OperationalError(self.refusal)

    def save_job(self, run_id: str, outcome: JobOutcome) -> bool:
        self._check()
        return super().save_job(run_id, outcome)

    def save_device(self, *args: Any) -> None:
        self._check()
        super().save_device(*args)

    def finish_run(self, run_id: str, status: str) -> None:
        self._check()
        super().finish_run(run_id, status)


@pytest.fixture(autouse=True)
def _own_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()


def outcome(i: int, model: Path | None = None) -> JobOutcome:
    job = Job(
        "board",
        "bench",
        ModelRef("m", model) if model else None,
        "onnxruntime",
        {"i": i, "shapes": {"x": [1, 3]}},
        timeout_s=30.0,
        identity={"model": "sha256:ab"} if model else {},
    )
    rec = Record(
        "r", "board", "bench", "m", "onnxruntime", "latency_ms", 1.5 + i, "ms", {"i": i, "stat": "p50"}
    )
    samples = Samples("r", "board", "bench", "m", "onnxruntime", "latency_ms", "ms", (1.0, 2.0), {"i": i})
    return JobOutcome(job, "ok", [rec], [samples], ["w"], started=utc_now(), finished=utc_now(), wall_s=1.0)


def new_store(tmp_path: Path) -> RefusingStore:
    store = RefusingStore(tmp_path / "s.db")
    store.begin_run("r", "suite", {})
    return store


def test_a_locked_store_spools_then_stores_everything_in_order(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    writer = JobWriter(store, "r")
    writer.save_job(outcome(0))
    store.refusal = "database is locked"
    for i in (1, 2, 3):
        writer.save_job(outcome(i))
    writer.save_device("board", {"kernel": "k"}, {"name": "board"})
    spool = spool_paths(store.path, "r")[0]
    assert writer.spool == spool and spool.is_file() and len(spool.read_text().splitlines()) == 1 + 4
    assert len(store.jobs(["r"])) == 1
    store.refusal = None
    writer.finish_run("ok")  # the backlog first, then this
    note = writer.close(wait_s=0)
    assert note and "database is locked" in note and "5 write(s) waited" in note and "all stored now" in note
    assert not spool.exists() and writer.pending == []
    assert [j["params"]["i"] for j in store.jobs(["r"])] == [0, 1, 2, 3]
    assert store.run("r").status == "ok" and store.device_info(["r"])[0]["fingerprint"] == {"kernel": "k"}
    assert [s.values for s in store.samples(["r"])] == [(1.0, 2.0)] * 4


def test_a_full_disk_keeps_the_jobs_in_the_temp_folder_and_a_later_command_stores_them(
    tmp_path: Path,
) -> None:
    store = new_store(tmp_path)
    store.path.with_name("s.db.spool").write_text("")  # the folder beside the store cannot be made either
    store.refusal = "database or disk is full"
    writer = JobWriter(store, "r")
    writer.save_job(outcome(0))
    writer.save_job(outcome(1))
    writer.finish_run("ok")
    with pytest.raises(StoreTrouble) as refused:
        writer.close(wait_s=0)
    spool = spool_paths(store.path, "r")[1]
    message = str(refused.value)
    assert f"2 finished job(s) of run r are kept in {spool}" in message and "disk is full" in message
    assert spool.parent == tmp_path / "tmp" / "edgebench-spool" and spool.is_file()
    assert [o.job.params["i"] for o in writer.unsaved_outcomes] == [0, 1]
    store.close()

    with Store(tmp_path / "s.db") as later:  # space freed: the next command stores what waited
        [note] = store_spooled(later)
        assert note == f"stored 2 finished job(s) of run r kept in {spool}"
        assert [j["params"]["i"] for j in later.jobs(["r"])] == [0, 1] and later.run("r").status == "ok"
        assert store_spooled(later) == [] and not spool.exists()


def test_spooled_jobs_keep_their_identity_and_data(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    before = outcome(7, model)
    after = outcome_from_json(outcome_to_json(before))
    assert after.job.key == before.job.key and after.job.model == before.job.model
    assert after.records == before.records and after.samples == before.samples
    assert (after.status, after.warnings, after.started, after.wall_s) == ("ok", ["w"], before.started, 1.0)


def test_other_database_errors_are_not_spooled(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    writer = JobWriter(store, "r")

    def broken(*args: Any) -> bool:
        raise sqlite3.IntegrityError("a bug, not trouble")

    store.save_job = broken  # type: ignore[method-assign]
    with pytest.raises(sqlite3.IntegrityError):
        writer.save_job(outcome(0))
    assert writer.pending == []
