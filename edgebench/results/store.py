"""The result store: SQLite (WAL), append-only results, one transaction per finished job.

Schema versions (each older store migrates through an explicit `_update_to_N`, in one transaction; a
store written by a newer edgebench is refused):
  1 — runs, devices, jobs, records, samples.
  2 — records and samples gain `annotations`: what is known about a measurement but does not identify it
      (sample counts, effective values, sizes, paths). Version 1 kept those in `params`; the migration
      moves each probe's annotation keys (`edgebench.probes.registry.annotation_keys`) out of them, so
      v1 and v2 records pair by the same `Record.key()`.
  3 — `tags` (labels on runs: `run --tag nightly`, `runs --add-tag release-1.2`) and `gates` (one row per
      stored `gate` run: baseline, candidate, overall verdict, exit code and the whole result), so gate
      verdicts are history too. Nothing older changes: the migration only adds the two tables.
  4 — `job_models`: each stored job's model by content hash (sha256) and the name of its copy in the local
      model store `<store path>.models/` (`results.models`), so `gate --confirm` can measure a run's model
      again after the file changed. The migration only adds the table: jobs stored before it have no row.

Run references (`resolve_run`): every verb that takes a run id also takes `latest`, `latest~N` (the N-th
measurement run before the latest; `gate` and `fit` runs measure nothing and are skipped), `suite:NAME` and
`suite:NAME~N` (that suite's runs), `tag:NAME[~N]` (runs with that tag) and a unique prefix of a run id or
of its random tail (`7de0` for `20261201T081909Z-7de074`).
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random

from ..errors import UserError
from ..jobs import JobOutcome
from ..records import Record, Samples, utc_now
from .models import (
    SCHEMA_V4,
    JobModel,
    ModelStore,
    PruneReport,
    insert_job_model,
    job_models,
    keep_for_job,
    models_dir,
)

SCHEMA_VERSION = 4
# Runs that judge other runs (`latest` skips them): gates and fits measure nothing; a `confirm` run holds a
# gate's re-measurements, never the next baseline.
ANALYSIS_KINDS = ("gate", "fit", "confirm")

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

_SCHEMA_V3 = """
CREATE TABLE IF NOT EXISTS tags(run_id TEXT NOT NULL, tag TEXT NOT NULL, PRIMARY KEY(run_id, tag));
CREATE TABLE IF NOT EXISTS gates(
    run_id TEXT PRIMARY KEY, baseline TEXT NOT NULL, candidate TEXT NOT NULL, verdict TEXT NOT NULL,
    exit_code INTEGER NOT NULL, result TEXT NOT NULL, ts TEXT NOT NULL);
"""
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+@/-]{0,63}$")


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    created: str
    kind: str
    suite: str | None
    provenance: dict[str, Any]
    status: str
    finished: str | None


PRUNE_GRACE_S = 3600.0  # a kept model copy this fresh is left by a prune: a run in progress may need it
BUSY_TIMEOUT_S = 60.0  # a run's default `store_timeout`


# Record params that version 1 stores kept in `params` though they describe a measurement rather than
# identify it: how it was taken (every probe), and per probe the sample counts, sizes the agent chose, paths
# and ceilings used. The v1 -> v2 migration moves them to `annotations`, where the probes now write them.
# Frozen as of version 1: a migration reads the old schema, whatever the probes write today.
V1_POLICY_PARAMS = frozenset({"max_seconds", "min_seconds", "runs", "seed", "warmup", "warmup_seconds"})
V1_ANNOTATIONS: dict[str, frozenset[str]] = {
    "bench": frozenset({"aggregated_by", "n", "path", "rss_before_load_mb", "sample"}),
    "matmul": frozenset({"emulated", "nominal_tops", "path", "trial_s"}),
    "bandwidth": frozenset({"bytes", "llc_bytes", "nominal_gbps", "path"}),
    "threads": frozenset({"rss_before_load_mb"}),
    "roofline": frozenset(
        {
            "bandwidth_gbps",
            "bandwidth_run",
            "branch_choice",
            "by_dtype",
            "compute_ms",
            "floor_bytes",
            "floor_flops",
            "input_bytes",
            "matmul_run",
            "measured_ms",
            "measured_run",
            "memory_ms",
            "output_bytes",
            "peak_tops",
            "stored_weight_bytes",
        }
    ),
    "thermal": frozenset({"duration_s", "margin_c", "origin_monotonic_s", "period_s", "texts"}),
    "power": frozenset(
        {
            "active_s",
            "inferences",
            "origin_monotonic_s",
            "period_s",
            "sample_rate_hz",
            "samples_active",
            "samples_idle",
            "sign",
            "sign_calibration",
            "texts",
        }
    ),
    "profile": frozenset({"calls", "correction", "ops"}),
}


def v1_annotation_keys(probe: str) -> frozenset[str]:
    """Params of a version 1 record of this probe that belong in its annotations."""
    return V1_POLICY_PARAMS | V1_ANNOTATIONS.get(probe, frozenset())


class Store:
    """An open store. Not shared between threads: open one per thread or process."""

    def __init__(self, path: Path | str, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        """`busy_timeout_s`: how long a statement waits on a lock another process holds before it fails
        with "database is locked" (a run's policy `store_timeout`; the run then spools what it finished)."""
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.models = ModelStore(models_dir(self.path))
        if self.path.exists() and self.path.is_dir():
            raise UserError(f"{self.path}: store path is a directory")
        try:
            self.db = sqlite3.connect(str(self.path), timeout=busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise UserError(f"{self.path}: cannot open store: {exc}") from None
        try:
            # Two controllers opening a new store at once: switching it to WAL can fail with "locked"
            # without waiting on busy_timeout, so the whole preparation is tried again for a while (at
            # least the default: nothing is finished yet that a short store_timeout would spool).
            open_wait = max(busy_timeout_s, BUSY_TIMEOUT_S)
            for attempt in Retrying(
                retry=retry_if_exception(_is_locked), stop=stop_after_delay(open_wait),
                wait=wait_random(0.05, 0.5), reraise=True,
            ):  # fmt: skip
                with attempt:
                    self._prepare()
        except sqlite3.DatabaseError as exc:
            self.db.close()
            if _is_locked(exc):
                raise UserError(f"{self.path}: another process holds the store's lock ({exc})") from None
            raise UserError(f"{self.path}: not an edgebench store ({exc})") from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- schema ---------------------------------------------------------------------------------
    def _prepare(self) -> None:
        self.db.execute(f"PRAGMA busy_timeout = {max(1, round(self.busy_timeout_s * 1000))}")
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = NORMAL")
        self._migrate()

    def _migrate(self) -> None:
        # Both questions in one read snapshot: asked apart, a store another controller was creating
        # meanwhile looked foreign (no meta table at the first, its tables there at the second).
        with _Tx(self.db, "BEGIN DEFERRED"):
            version = self._stored_version()
        if version > SCHEMA_VERSION:
            raise UserError(
                f"{self.path}: store schema version {version} is newer than this edgebench "
                f"supports ({SCHEMA_VERSION}); upgrade edgebench"
            )
        if version < 1:
            self._update_to_1()
        if version < 2:
            self._update_to_2()
        if version < 3:
            self._update_to_3()
        if version < 4:
            self._update_to_4()

    def _stored_version(self) -> int:
        """The schema version the file holds: 0 for an empty file; a foreign SQLite file is refused."""
        has_meta = self.db.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        if has_meta:
            return self._schema_version()
        if self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise UserError(f"{self.path}: a SQLite file that is not an edgebench store")
        return 0

    def _update_to_1(self) -> None:
        with self._tx():
            if self._stored_version() >= 1:
                return  # another controller created it while this one waited for the lock
            for stmt in _SCHEMA_V1.split(";"):
                if stmt.strip():
                    self.db.execute(stmt)
            self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', '1')")

    def _update_to_2(self) -> None:
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

    def _update_to_3(self) -> None:
        with self._tx():
            if self._schema_version() >= 3:
                return
            for stmt in _SCHEMA_V3.split(";"):
                if stmt.strip():
                    self.db.execute(stmt)
            self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', '3')")

    def _update_to_4(self) -> None:
        with self._tx():
            if self._schema_version() >= 4:
                return
            for stmt in SCHEMA_V4.split(";"):
                if stmt.strip():
                    self.db.execute(stmt)
            self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', '4')")

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
        kept = keep_for_job(self.models, job)
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
            if kept is not None and job.model is not None and job_id is not None:
                insert_job_model(self.db, run_id, job_id, job.model.name, kept)
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
        from ..jobs import Job

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

    def add_tags(self, run_id: str, tags: Iterable[str]) -> None:
        """Label a run (`run --tag nightly`); a tag is a word of letters, digits and `._=+@/-`."""
        wanted = list(dict.fromkeys(tags))
        for tag in wanted:
            check_tag(tag)
        self.run(run_id)
        with self._tx():
            self.db.executemany(
                "INSERT OR IGNORE INTO tags(run_id, tag) VALUES(?, ?)", [(run_id, t) for t in wanted]
            )

    def save_gate(
        self, run_id: str, result: dict[str, Any], records: Sequence[Record], provenance: dict[str, Any]
    ) -> None:
        """Store a gate's verdicts as a run of kind `gate`: one row in `gates` (the whole result) and its
        per-pair records (probe `gate`), so `runs`, `history` and reports see gates like any run;
        `provenance` is the host that judged (execution.provenance.host_provenance)."""
        self.begin_run(run_id, "gate", provenance)
        if records:
            self.import_records(run_id, records, kind="gate")
        with self._tx():
            self.db.execute(
                "INSERT OR REPLACE INTO gates(run_id, baseline, candidate, verdict, exit_code, result, ts)"
                " VALUES(?,?,?,?,?,?,?)",
                (
                    run_id,
                    result["baseline"],
                    result["candidate"],
                    result["verdict"],
                    int(result["exit_code"]),
                    json.dumps(result, sort_keys=True, default=str, allow_nan=False),
                    utc_now(),
                ),
            )
        self.finish_run(run_id, "ok")

    # ---- reading --------------------------------------------------------------------------------
    def tags(self) -> dict[str, list[str]]:
        """Every run's tags, by run id (runs without tags are absent)."""
        out: dict[str, list[str]] = {}
        for run_id, tag in self.db.execute("SELECT run_id, tag FROM tags ORDER BY rowid"):
            out.setdefault(run_id, []).append(tag)
        return out

    def gates(self, run_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Stored gate results (oldest first): run_id, baseline, candidate, verdict, exit_code, result."""
        sql, args = _select(
            "SELECT run_id, baseline, candidate, verdict, exit_code, result, ts FROM gates", run_ids, {}
        )
        cols = ("run_id", "baseline", "candidate", "verdict", "exit_code", "result", "ts")
        out = []
        for row in self.db.execute(sql + " ORDER BY ts, run_id", args):
            d = dict(zip(cols, row, strict=True))
            d["result"] = json.loads(d["result"])
            out.append(d)
        return out

    def resolve_run(self, ref: str, what: str = "run") -> str:
        """The run id a reference names (see the module docstring); unknown or ambiguous references are
        a one-line UserError naming the candidates."""
        return resolve_run_ref(ref, self.runs(), self.tags(), f"{what} '{ref}' in {self.path}")

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
        """The latest measurement run (what `latest` names), else the latest run of any kind."""
        runs = self.runs()
        if not runs:
            raise UserError(f"{self.path}: the store has no runs yet")
        measured = [r for r in runs if r.kind not in ANALYSIS_KINDS]
        return (measured or runs)[-1]

    def run_devices(self) -> dict[str, list[str]]:
        """The devices each run touched (fingerprinted or named by a job), by run id."""
        out: dict[str, list[str]] = {}
        rows = self.db.execute(
            "SELECT run_id, device FROM devices UNION SELECT run_id, device FROM jobs ORDER BY 1, 2"
        )
        for run_id, device in rows:
            if device and device != "-":
                out.setdefault(run_id, []).append(device)
        return out

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
            "wall_s, device_s, started, finished, warnings FROM jobs",
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
            "warnings",
        )
        out = []
        for r in self.db.execute(sql + " ORDER BY id", args):
            d = dict(zip(cols, r, strict=True))
            d["params"] = json.loads(d["params"])
            d["warnings"] = json.loads(d["warnings"] or "[]")
            out.append(d)
        return out

    def prune_models(self, keep_latest: int, grace_s: float = PRUNE_GRACE_S) -> tuple[PruneReport, list[str]]:
        """Delete the kept model copies no longer needed: kept are those of every tagged run and of the
        latest `keep_latest` runs of each suite (runs outside a suite count as one suite), what `gate
        --confirm` measures again; a copy written or reused within `grace_s` stays (a run in progress).
        The hashes stay recorded: a confirm on a pruned run says its copy is gone. Returns the report and
        the runs whose copies were kept."""
        if keep_latest < 0:
            raise UserError(f"--prune-models {keep_latest}: keep at least 0 runs per suite")
        tagged = set(self.tags())
        by_suite: dict[str | None, list[str]] = {}
        for run in self.runs():  # oldest first
            by_suite.setdefault(run.suite, []).append(run.run_id)
        latest = {rid for ids in by_suite.values() for rid in (ids[-keep_latest:] if keep_latest else [])}
        keep_runs = sorted(tagged | latest)
        digests = {j.sha256 for j in self.job_models(keep_runs)}
        return self.models.prune(digests, grace_s, time.time()), keep_runs

    def job_models(self, run_ids: Iterable[str]) -> list[JobModel]:
        """The runs' jobs that recorded a model: its content hash and kept copy (`results.models`)."""
        return job_models(self.db, self.models.root, run_ids)

    def device_info(self, run_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        sql, args = _select("SELECT run_id, device, fingerprint, descriptor FROM devices", run_ids, {})
        return [
            {"run_id": r[0], "device": r[1], "fingerprint": json.loads(r[2]), "descriptor": json.loads(r[3])}
            for r in self.db.execute(sql, args)
        ]

    def records_frame(self, run_ids: Iterable[str] | None = None, **where: Any):
        """Records as a pandas DataFrame (one column per record field; params stay a dict)."""
        import pandas as pd

        from ..records import RECORD_FIELDS

        return pd.DataFrame(
            [r.to_dict() for r in self.records(run_ids, **where)], columns=list(RECORD_FIELDS)
        )


def check_tag(tag: str) -> None:
    if not _TAG.match(tag):
        raise UserError(f"--tag {tag!r}: a tag is letters, digits and ._=+@/- (at most 64, no spaces)")


_NTH = re.compile(r"^(?P<base>.+?)~(?P<n>[0-9]+)$")


def resolve_run_ref(ref: str, runs: Sequence[RunInfo], tags: dict[str, list[str]], where: str) -> str:
    """Pure: a run reference against the store's runs (oldest first) and tags. `where` names the
    reference in errors ("run 'latest~3' in lab.db")."""
    ids = [r.run_id for r in runs]
    text = ref.strip()
    if text in ids:
        return text
    m = _NTH.match(text)
    base, back = (m.group("base"), int(m.group("n"))) if m else (text, 0)
    series: list[str] | None = None
    if base == "latest":
        series, label = [r.run_id for r in runs if r.kind not in ANALYSIS_KINDS], "measurement run(s)"
    elif base.startswith("suite:"):
        name = base[len("suite:") :]
        series, label = [r.run_id for r in runs if r.suite == name], f"run(s) of suite {name}"
        if not series:
            known = sorted({r.suite for r in runs if r.suite})
            raise UserError(f"{where}: no run of suite '{name}' (suites: {', '.join(known) or 'none'})")
    elif base.startswith("tag:"):
        name = base[len("tag:") :]
        series, label = [r for r in ids if name in tags.get(r, [])], f"run(s) tagged {name}"
        if not series:
            known = sorted({t for ts in tags.values() for t in ts})
            raise UserError(f"{where}: no run tagged '{name}' (tags: {', '.join(known) or 'none'})")
    if series is not None:
        if back >= len(series):
            raise UserError(f"{where}: the store has only {len(series)} {label}")
        return series[-1 - back]
    if m:
        raise UserError(f"{where}: ~N follows latest, suite:NAME or tag:NAME")
    matches = [r for r in ids if r.startswith(text) or r.partition("-")[2].startswith(text)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(matches[-5:]) + (f" and {len(matches) - 5} more" if len(matches) > 5 else "")
        raise UserError(f"{where} is ambiguous: it matches {shown}")
    recent = ", ".join(ids[-3:]) or "none"
    raise UserError(
        f"unknown {where} (latest runs: {recent}; also latest, latest~N, suite:NAME, tag:NAME or a prefix)"
    )


def _is_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any error, so a job is stored whole or not at all
    (BEGIN DEFERRED for reads that must see one snapshot)."""

    def __init__(self, db: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> None:
        self.db = db
        self.begin = begin

    def __enter__(self) -> None:
        self.db.execute(self.begin)

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
