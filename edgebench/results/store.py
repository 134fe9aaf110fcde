"""The result store: SQLite (WAL), append-only results, one transaction per finished job.

Schema versions (each older store migrates through an explicit `_update_to_N`, in one transaction; a
store written by a newer edgebench is refused):
  1 — runs, devices, jobs, records, samples.
  2 — records and samples gain `annotations`: what is known about a measurement but does not identify it
      (sample counts, effective values, sizes, paths). Version 1 kept those in `params`; the migration
      moves each probe's annotation keys (`edgebench.probes.registry.annotation_keys`) out of them, so
      v1 and v2 records pair by the same `Record.key()`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random

from ..errors import UserError
from ..execution.jobs import JobOutcome
from ..records import Record, Samples, utc_now

SCHEMA_VERSION = 2

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs(
    run_id TEXT PRIMARY KEY, created TEXT NOT NULL, kind TEXT NOT NULL, suite TEXT,
    provenance TEXT NOT NULL, status TEXT NOT NULL, finished TEXT);
CREATE TABLE IF NOT EXISTS devices(
    run_id TEXT NOT NULL, device TEXT NOT NULL, fingerprint TEXT NOT NULL, descriptor TEXT NOT NULL,
    ts TEXT NOT NULL, PRIMARY KEY(run_id, device));
CREATE TABLE IF NOT EXISTS jobs(
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, job_key TEXT NOT NULL, device TEXT NOT NULL,
    probe TEXT NOT NULL, model TEXT, runtime TEXT, params TEXT NOT NULL, status TEXT NOT NULL,
    error TEXT, error_kind TEXT, warnings TEXT, started TEXT, finished TEXT, wall_s REAL, device_s REAL);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_ok_once ON jobs(run_id, job_key) WHERE status = 'ok';
CREATE TABLE IF NOT EXISTS records(
    id INTEGER PRIMARY KEY, job_id INTEGER REFERENCES jobs(id), run_id TEXT NOT NULL, device TEXT NOT NULL,
    probe TEXT NOT NULL, model TEXT, runtime TEXT, metric TEXT NOT NULL, value REAL, unit TEXT NOT NULL,
    params TEXT NOT NULL, ts TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS records_run ON records(run_id);
CREATE TABLE IF NOT EXISTS samples(
    id INTEGER PRIMARY KEY, job_id INTEGER REFERENCES jobs(id), run_id TEXT NOT NULL, device TEXT NOT NULL,
    probe TEXT NOT NULL, model TEXT, runtime TEXT, metric TEXT NOT NULL, unit TEXT NOT NULL,
    params TEXT NOT NULL, vals TEXT NOT NULL, ts TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS samples_run ON samples(run_id);
"""


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    created: str
    kind: str
    suite: str | None
    provenance: dict[str, Any]
    status: str
    finished: str | None


class Store:
    """An open store. Not shared between threads: open one per thread or process."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if self.path.exists() and self.path.is_dir():
            raise UserError(f"{self.path}: store path is a directory")
        try:
            self.db = sqlite3.connect(str(self.path), timeout=60.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise UserError(f"{self.path}: cannot open store: {exc}") from None
        try:
            # Two controllers opening a new store at once: switching it to WAL can fail with "locked"
            # without waiting on busy_timeout, so the whole preparation is tried again for a while.
            for attempt in Retrying(
                retry=retry_if_exception(_is_locked), stop=stop_after_delay(60),
                wait=wait_random(0.05, 0.5), reraise=True,
            ):  # fmt: skip
                with attempt:
                    self._prepare()
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise UserError(f"{self.path}: not an edgebench store ({exc})") from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- schema ---------------------------------------------------------------------------------
    def _prepare(self) -> None:
        self.db.execute("PRAGMA busy_timeout = 60000")
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = NORMAL")
        self._migrate()

    def _migrate(self) -> None:
        has_meta = self.db.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        version = 0
        if has_meta:
            row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else 0
        elif self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise UserError(f"{self.path}: a SQLite file that is not an edgebench store")
        if version > SCHEMA_VERSION:
            raise UserError(
                f"{self.path}: store schema version {version} is newer than this edgebench "
                f"supports ({SCHEMA_VERSION}); upgrade edgebench"
            )
        if version < 1:
            self._update_to_1()
        if version < 2:
            self._update_to_2()

    def _update_to_1(self) -> None:
        with self._tx():
            for stmt in _SCHEMA_V1.split(";"):
                if stmt.strip():
                    self.db.execute(stmt)
            self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', '1')")

    def _update_to_2(self) -> None:
        from ..probes.registry import v1_annotation_keys

        with self._tx():
            if self._schema_version() >= 2:
                return  # another controller migrated it while this one waited for the lock
            for table in ("records", "samples"):
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN annotations TEXT NOT NULL DEFAULT '{{}}'")
                rows = self.db.execute(f"SELECT id, probe, params FROM {table}").fetchall()
                updates = []
                for row_id, probe, params_text in rows:
                    params = json.loads(params_text)
                    moved = {k: params.pop(k) for k in sorted(v1_annotation_keys(probe)) if k in params}
                    if moved:
                        updates.append((_dumps(params), _dumps(moved), row_id))
                self.db.executemany(f"UPDATE {table} SET params=?, annotations=? WHERE id=?", updates)
            self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', '2')")

    def _schema_version(self) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _tx(self) -> _Tx:
        return _Tx(self.db)

    # ---- writing --------------------------------------------------------------------------------
    def begin_run(self, run_id: str, kind: str, provenance: dict[str, Any], suite: str | None = None) -> None:
        """Create the run (or, on resume, keep the existing one and mark it running again)."""
        with self._tx():
            exists = self.db.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if exists:
                self.db.execute("UPDATE runs SET status='running', finished=NULL WHERE run_id=?", (run_id,))
            else:
                self.db.execute(
                    "INSERT INTO runs(run_id, created, kind, suite, provenance, status) VALUES(?,?,?,?,?,?)",
                    (run_id, utc_now(), kind, suite, _dumps(provenance), "running"),
                )

    def append_provenance(self, run_id: str, key: str, entry: dict[str, Any]) -> None:
        """Add an entry to the list `key` of the run's provenance (one per resume), in one transaction."""
        with self._tx():
            row = self.db.execute("SELECT provenance FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                raise UserError(f"unknown run '{run_id}' in {self.path}")
            provenance = json.loads(row[0])
            provenance[key] = [*provenance.get(key, []), entry]
            self.db.execute("UPDATE runs SET provenance=? WHERE run_id=?", (_dumps(provenance), run_id))

    def finish_run(self, run_id: str, status: str) -> None:
        with self._tx():
            self.db.execute(
                "UPDATE runs SET status=?, finished=? WHERE run_id=?", (status, utc_now(), run_id)
            )

    def save_device(
        self, run_id: str, device: str, fingerprint: dict[str, Any], descriptor: dict[str, Any]
    ) -> None:
        with self._tx():
            self.db.execute(
                "INSERT OR IGNORE INTO devices(run_id, device, fingerprint, descriptor, ts)"
                " VALUES(?,?,?,?,?)",
                (run_id, device, _dumps(fingerprint), _dumps(descriptor), utc_now()),
            )

    def save_job(self, run_id: str, outcome: JobOutcome) -> bool:
        """Store one job with its records and samples in one transaction.

        Returns False (and stores nothing) when the job already has an ok result in this run.
        """
        job = outcome.job
        with self._tx():
            if (
                outcome.ok
                and self.db.execute(
                    "SELECT 1 FROM jobs WHERE run_id=? AND job_key=? AND status='ok'", (run_id, job.key)
                ).fetchone()
            ):
                return False
            cur = self.db.execute(
                "INSERT INTO jobs(run_id, job_key, device, probe, model, runtime, params, status, error, "
                "error_kind, warnings, started, finished, wall_s, device_s)"
                " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    job.key,
                    job.device,
                    job.probe,
                    job.model.name if job.model else None,
                    job.runtime,
                    _dumps(job.params),
                    outcome.status,
                    outcome.error,
                    outcome.error_kind,
                    _dumps(outcome.warnings),
                    outcome.started,
                    outcome.finished,
                    outcome.wall_s,
                    outcome.device_s,
                ),
            )
            job_id = cur.lastrowid
            self.db.executemany(
                "INSERT INTO records(job_id, run_id, device, probe, model, runtime, metric, value, unit,"
                " params, ts, annotations)"
                " VALUES(?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        job_id,
                        run_id,
                        r.device,
                        r.probe,
                        r.model,
                        r.runtime,
                        r.metric,
                        r.value,
                        r.unit,
                        _dumps(r.params),
                        r.ts,
                        _dumps(r.annotations),
                    )
                    for r in outcome.records
                ],
            )
            self.db.executemany(
                "INSERT INTO samples(job_id, run_id, device, probe, model, runtime, metric, unit, params,"
                " vals, ts, annotations)"
                " VALUES(?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        job_id,
                        run_id,
                        s.device,
                        s.probe,
                        s.model,
                        s.runtime,
                        s.metric,
                        s.unit,
                        _dumps(s.params),
                        json.dumps(list(s.values)),
                        s.ts,
                        _dumps(s.annotations),
                    )
                    for s in outcome.samples
                ],
            )
        return True

    def import_records(
        self,
        run_id: str,
        records: Sequence[Record],
        samples: Sequence[Samples] = (),
        kind: str = "import",
        provenance: dict[str, Any] | None = None,
    ) -> None:
        """Append records made elsewhere (e.g. imported pytest-benchmark JSON) as one job."""
        from ..execution.jobs import Job

        self.begin_run(run_id, kind, provenance or {})
        first = records[0] if records else None
        job = Job(
            device=first.device if first else "-",
            probe=first.probe if first else kind,
            params={"import": kind},
        )
        self.save_job(
            run_id, JobOutcome(job, "ok", list(records), list(samples), started=utc_now(), finished=utc_now())
        )
        self.finish_run(run_id, "ok")

    # ---- reading --------------------------------------------------------------------------------
    def runs(self) -> list[RunInfo]:
        rows = self.db.execute(
            "SELECT run_id, created, kind, suite, provenance, status, finished FROM runs"
            " ORDER BY created, run_id"
        )
        return [RunInfo(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6]) for r in rows]

    def run(self, run_id: str) -> RunInfo:
        for info in self.runs():
            if info.run_id == run_id:
                return info
        raise UserError(f"unknown run '{run_id}' in {self.path}")

    def latest_run(self) -> RunInfo:
        runs = self.runs()
        if not runs:
            raise UserError(f"{self.path}: the store has no runs yet")
        return runs[-1]

    def ok_job_keys(self, run_id: str) -> set[str]:
        rows = self.db.execute("SELECT job_key FROM jobs WHERE run_id=? AND status='ok'", (run_id,))
        return {r[0] for r in rows}

    def records(self, run_ids: Iterable[str] | None = None, **where: Any) -> list[Record]:
        sql, args = _select(
            "SELECT run_id, device, probe, model, runtime, metric, value, unit, params, ts, annotations"
            " FROM records",
            run_ids,
            where,
        )
        return [
            Record(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], json.loads(r[8]), r[9], json.loads(r[10]))
            for r in self.db.execute(sql + " ORDER BY id", args)
        ]

    def samples(self, run_ids: Iterable[str] | None = None, **where: Any) -> list[Samples]:
        sql, args = _select(
            "SELECT run_id, device, probe, model, runtime, metric, unit, vals, params, ts, annotations"
            " FROM samples",
            run_ids,
            where,
        )
        return [
            Samples(
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                r[5],
                r[6],
                tuple(json.loads(r[7])),
                json.loads(r[8]),
                r[9],
                json.loads(r[10]),
            )  # fmt: skip
            for r in self.db.execute(sql + " ORDER BY id", args)
        ]

    def errors(self, run_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Failed jobs that no later attempt in the same run turned ok."""
        sql, args = _select(
            "SELECT run_id, job_key, device, probe, model, runtime, params, error, error_kind, finished"
            " FROM jobs",
            run_ids,
            {"status": "error"},
        )
        ok = {(r[0], r[1]) for r in self.db.execute("SELECT run_id, job_key FROM jobs WHERE status='ok'")}
        return [
            {
                "run_id": r[0],
                "job": r[1],
                "device": r[2],
                "probe": r[3],
                "model": r[4],
                "runtime": r[5],
                "params": json.loads(r[6]),
                "error": r[7],
                "kind": r[8],
                "ts": r[9],
            }
            for r in self.db.execute(sql + " ORDER BY id", args)
            if (r[0], r[1]) not in ok
        ]

    def jobs(self, run_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        sql, args = _select(
            "SELECT run_id, job_key, device, probe, model, runtime, params, status, error, "
            "wall_s, device_s, started, finished FROM jobs",
            run_ids,
            {},
        )
        cols = (
            "run_id",
            "job",
            "device",
            "probe",
            "model",
            "runtime",
            "params",
            "status",
            "error",
            "wall_s",
            "device_s",
            "started",
            "finished",
        )
        out = []
        for r in self.db.execute(sql + " ORDER BY id", args):
            d = dict(zip(cols, r, strict=True))
            d["params"] = json.loads(d["params"])
            out.append(d)
        return out

    def device_info(self, run_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        sql, args = _select("SELECT run_id, device, fingerprint, descriptor FROM devices", run_ids, {})
        return [
            {"run_id": r[0], "device": r[1], "fingerprint": json.loads(r[2]), "descriptor": json.loads(r[3])}
            for r in self.db.execute(sql, args)
        ]

    def records_frame(self, run_ids: Iterable[str] | None = None, **where: Any):  # type: ignore[no-untyped-def]
        """Records as a pandas DataFrame (one column per record field; params stay a dict)."""
        import pandas as pd

        from ..records import RECORD_FIELDS

        return pd.DataFrame(
            [r.to_dict() for r in self.records(run_ids, **where)], columns=list(RECORD_FIELDS)
        )


def _is_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any error, so a job is stored whole or not at all."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


def _select(base: str, run_ids: Iterable[str] | None, where: dict[str, Any]) -> tuple[str, list[Any]]:
    clauses, args = [], []
    if run_ids is not None:
        ids = list(run_ids)
        clauses.append(f"run_id IN ({','.join('?' * len(ids))})" if ids else "0")
        args += ids
    for col, value in where.items():
        if value is None:
            continue
        clauses.append(f"{col} = ?")
        args.append(value)
    return (base + (" WHERE " + " AND ".join(clauses) if clauses else "")), args


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
