"""Finished jobs are never lost to store trouble: retry, spool to a side file, then store, and say so.

A store write can fail for reasons that say nothing about the measurement: another process holds the SQLite
lock past the busy timeout, the disk is full, the file turned read-only. `JobWriter` then keeps the write
(a job with its records and samples, a device fingerprint, the run's final status) in a spool file of JSON
lines beside the store (`<store>.spool/<run>.jsonl`), or in the temp folder when that cannot be written
either (a full disk), and the run goes on. The spooled writes go to the store, in order, as soon as it
takes writes again: at the next write, every few seconds while the run waits for jobs, at the end of the
run, or when a later edgebench command opens the store (`store_spooled`). Each spooled entry is removed
from the file once stored; what stays is reported with the file's path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import EdgebenchError
from ..jobs import Job, JobOutcome, ModelRef
from ..records import Record, Samples
from ..results.store import Store

RETRY_EVERY_S = 5.0  # while the store is in trouble, try the spool again this often
FINAL_WAIT_S = 180.0  # at the end of a run, wait this long for a locked store before leaving the spool
SPOOL_VERSION = 1


class StoreTrouble(EdgebenchError):
    """Finished jobs could not be stored; they are kept in a spool file (named in the message)."""


def is_store_trouble(exc: BaseException) -> bool:
    """A write the store refused for its own reasons (locked, full, read-only, I/O), not a bug in the data."""
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError | sqlite3.InterfaceError):
        return False
    return isinstance(exc, sqlite3.DatabaseError | OSError)


def spool_paths(store_path: Path, run_id: str) -> list[Path]:
    """Where a run's spool goes: beside the store, else (that folder unwritable or full) the temp folder."""
    tag = hashlib.sha256(str(store_path.resolve()).encode()).hexdigest()[:12]
    return [
        store_path.with_name(store_path.name + ".spool") / f"{run_id}.jsonl",
        Path(tempfile.gettempdir()) / "edgebench-spool" / f"{store_path.stem}-{tag}-{run_id}.jsonl",
    ]


class JobWriter:
    """The run's writes to its store, spooled whenever the store cannot take them. One thread only."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.pending: list[dict[str, Any]] = []  # spooled entries not yet in the store, oldest first
        self.spool: Path | None = None  # the file that holds them
        self.trouble: str | None = None  # the store's last refusal
        self.spooled = 0  # entries that ever went through the spool in this run
        self.unsaved_outcomes: list[JobOutcome] = []  # spooled jobs still missing from the store
        self._clock = clock
        self._sleep = sleep
        self._next_try = 0.0

    # ---- the writes --------------------------------------------------------------------------------
    def save_device(self, device: str, fingerprint: dict[str, Any], descriptor: dict[str, Any]) -> None:
        entry = {"kind": "device", "device": device, "fingerprint": fingerprint, "descriptor": descriptor}
        self._write(entry)

    def save_job(self, outcome: JobOutcome) -> None:
        entry = {"kind": "job", **outcome_to_json(outcome)}
        if not self._write(entry):
            self.unsaved_outcomes.append(outcome)

    def finish_run(self, status: str) -> None:
        self._write({"kind": "finish", "status": status})

    def _write(self, entry: dict[str, Any]) -> bool:
        """Store the entry now, or spool it (behind any earlier spooled ones). True when it is stored."""
        if self.pending:
            self.retry()  # in order: the backlog first (tried at most every RETRY_EVERY_S)
        if not self.pending:
            try:
                apply_entry(self.store, self.run_id, entry)
                return True
            except Exception as exc:
                if not is_store_trouble(exc):
                    raise
                self.trouble = f"{type(exc).__name__}: {exc}"
        self._spool(entry)
        return False

    # ---- the spool -----------------------------------------------------------------------------------
    def retry(self, force: bool = False) -> bool:
        """Try to store the spooled entries (at most every RETRY_EVERY_S unless forced); True once none
        is left."""
        if not self.pending:
            return True
        if not force and self._clock() < self._next_try:
            return False
        while self.pending:
            try:
                apply_entry(self.store, self.run_id, self.pending[0])
            except Exception as exc:
                if not is_store_trouble(exc):
                    raise
                self.trouble = f"{type(exc).__name__}: {exc}"
                self._next_try = self._clock() + RETRY_EVERY_S
                self._rewrite()
                return False
            stored = self.pending.pop(0)
            if stored["kind"] == "job":
                key = stored["job"]["key"]
                self.unsaved_outcomes = [o for o in self.unsaved_outcomes if o.job.key != key]
        self._rewrite()
        return True

    def close(self, wait_s: float = FINAL_WAIT_S) -> str | None:
        """At the end of the run: keep trying for up to wait_s while the store is only locked (a full or
        broken disk does not mend by waiting); then a note of what happened (spooled and now stored), or
        raise StoreTrouble naming the spool that still holds finished jobs."""
        deadline = self._clock() + wait_s
        while not self.retry(force=True) and self._clock() < deadline and _is_busy(self.trouble):
            self._sleep(min(RETRY_EVERY_S, max(0.0, deadline - self._clock())))
        if self.pending:
            jobs = sum(1 for e in self.pending if e["kind"] == "job")
            where = str(self.spool) if self.spool else "memory only (no spool file could be written)"
            raise StoreTrouble(
                f"{self.store.path}: the store refused writes ({self.trouble}); {jobs} finished job(s) of "
                f"run {self.run_id} are kept in {where} and will be stored by the next edgebench command "
                f"that opens this store (e.g. `edgebench run SUITE --resume {self.run_id}`)"
            )
        if self.spooled:
            return (
                f"the store refused writes for a while ({self.trouble}); {self.spooled} write(s) waited in "
                f"{self.spool or 'memory'} and are all stored now"
            )
        return None

    def _spool(self, entry: dict[str, Any]) -> None:
        self.pending.append(entry)
        self.spooled += 1
        self._next_try = self._clock() + RETRY_EVERY_S
        self._rewrite()

    def _rewrite(self) -> None:
        """The spool file holds exactly the pending entries (removed once all are stored)."""
        if not self.pending:
            if self.spool is not None:
                _unlink(self.spool)
            self.spool = None
            return
        header = {
            "kind": "header",
            "version": SPOOL_VERSION,
            "store": str(self.store.path.resolve()),
            "run_id": self.run_id,
        }
        text = "".join(json.dumps(e, default=str) + "\n" for e in [header, *self.pending])
        # The file in use first (a spool does not move while it works), then beside the store, then /tmp.
        candidates = [self.spool] if self.spool else []
        candidates += [p for p in spool_paths(self.store.path, self.run_id) if p not in candidates]
        for path in candidates:
            if _write_atomic(path, text):
                if self.spool is not None and self.spool != path:
                    _unlink(self.spool)
                self.spool = path
                return
        self.spool = None  # nowhere to write: the entries live in memory until the store takes them


def store_spooled(store: Store) -> list[str]:
    """Store what earlier runs left in spool files for this store; one note per spool dealt with."""
    notes = []
    resolved = str(store.path.resolve())
    for folder in sorted({p.parent for p in spool_paths(store.path, "-")}):
        for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
            entries = _read_spool(path)
            if not entries or entries[0].get("store") != resolved:
                continue
            run_id = entries[0]["run_id"]
            writer = JobWriter(store, run_id)
            writer.spool, writer.pending = path, entries[1:]
            done = writer.retry(force=True)
            jobs = sum(1 for e in entries[1:] if e["kind"] == "job")
            if done:
                notes.append(f"stored {jobs} finished job(s) of run {run_id} kept in {path}")
            else:
                notes.append(f"{path}: the store still refuses writes ({writer.trouble}); kept for later")
    return notes


# ---- entries ------------------------------------------------------------------------------------------
def apply_entry(store: Store, run_id: str, entry: dict[str, Any]) -> None:
    kind = entry["kind"]
    if kind == "job":
        store.save_job(run_id, outcome_from_json(entry))
    elif kind == "device":
        store.save_device(run_id, entry["device"], entry["fingerprint"], entry["descriptor"])
    elif kind == "finish":
        store.finish_run(run_id, entry["status"])
    else:
        raise ValueError(f"unknown spool entry {kind!r}")


def outcome_to_json(outcome: JobOutcome) -> dict[str, Any]:
    """A finished job as plain JSON (what the store keeps of it), so it survives the process."""
    job = outcome.job
    return {
        "job": {
            "device": job.device,
            "probe": job.probe,
            "model": {"name": job.model.name, "path": str(job.model.path)} if job.model else None,
            "runtime": job.runtime,
            "params": job.params,
            "timeout_s": job.timeout_s,
            "identity": job.identity,
            "invocation": job.invocation,
            "key": job.key,
        },
        "status": outcome.status,
        "records": [dataclasses.asdict(r) for r in outcome.records],
        "samples": [dataclasses.asdict(s) for s in outcome.samples],
        "warnings": list(outcome.warnings),
        "error": outcome.error,
        "error_kind": outcome.error_kind,
        "started": outcome.started,
        "finished": outcome.finished,
        "wall_s": outcome.wall_s,
        "device_s": outcome.device_s,
    }


def outcome_from_json(data: dict[str, Any]) -> JobOutcome:
    j = data["job"]
    model = ModelRef(j["model"]["name"], Path(j["model"]["path"])) if j["model"] else None
    job = Job(
        device=j["device"],
        probe=j["probe"],
        model=model,
        runtime=j["runtime"],
        params=j["params"],
        timeout_s=j["timeout_s"],
        identity=j.get("identity") or {},
        invocation=int(j.get("invocation") or 0),
    )
    return JobOutcome(
        job,
        data["status"],
        records=[Record(**r) for r in data["records"]],
        samples=[Samples(**{**s, "values": tuple(s["values"])}) for s in data["samples"]],
        warnings=list(data["warnings"]),
        error=data["error"],
        error_kind=data["error_kind"],
        started=data["started"],
        finished=data["finished"],
        wall_s=data["wall_s"],
        device_s=data["device_s"],
    )


def _is_busy(trouble: str | None) -> bool:
    """Another connection holds the lock (SQLITE_BUSY / SQLITE_LOCKED): it goes away by itself."""
    return trouble is not None and ("locked" in trouble or "busy" in trouble)


def _read_spool(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            break  # a line cut by a crash: everything before it is whole
    if not entries or entries[0].get("kind") != "header" or entries[0].get("version") != SPOOL_VERSION:
        return []
    return entries


def _write_atomic(path: Path, text: str) -> bool:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return True
    except OSError:
        _unlink(tmp)
        return False


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
