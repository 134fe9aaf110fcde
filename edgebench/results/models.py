"""The local content-addressed model store beside the result store: every benched model's file, kept once.

A job's model is recorded with its content hash (table `job_models`, schema 4) and a copy of the file goes
to `<store path>.models/<sha256><suffix>`, so `gate --confirm` can push last night's model again after the
file on disk changed. Copies are written to a temporary name in the same folder and renamed into place
(atomic: a reader never sees half a file), and a content already kept is not copied again.

The hash a suite's planner put in the job's identity (`Job.identity["model"]`) is what was measured; when
the file no longer has that content at store time the hash is still recorded, without a copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import link_sealed, seal
from ..lab.hashing import HashCache, sha256_file
from ..records import params_key

SCHEMA_V4 = """
CREATE TABLE IF NOT EXISTS job_models(
    job_id INTEGER PRIMARY KEY REFERENCES jobs(id), run_id TEXT NOT NULL, model TEXT NOT NULL,
    sha256 TEXT NOT NULL, suffix TEXT NOT NULL, stored TEXT);
CREATE INDEX IF NOT EXISTS job_models_run ON job_models(run_id);
"""
_SUFFIX = re.compile(r"^\.[A-Za-z0-9_]{1,16}$")
_CHUNK = 1 << 20


def _suffix_of(path: Path) -> str:
    return path.suffix.lower() if _SUFFIX.match(path.suffix) else ""


def models_dir(store_path: Path) -> Path:
    """Where a store keeps its models: `<store path>.models/`."""
    return store_path.with_name(store_path.name + ".models")


@dataclass(frozen=True)
class KeptModel:
    """A model file as the store knows it: its content hash and, when a copy was kept, where."""

    sha256: str
    suffix: str
    path: Path | None  # None: the content could not be kept (the file changed or went away first)


@dataclass(frozen=True)
class JobModel:
    """One stored job with its model's hash and kept copy (a row of `job_models` joined with `jobs`)."""

    job_id: int
    run_id: str
    device: str
    probe: str
    model: str
    runtime: str | None
    params: dict[str, Any]
    status: str
    sha256: str
    path: Path | None  # the kept copy; None when none was kept or it has since been deleted
    # The identity params its records carry (canonical JSON, `stat` left out): what the job's params
    # became (an inputs file by name, threads 0 as the count that ran), so pairs find their job.
    identities: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PruneReport:
    """What a prune of the model store removed (file names, bytes) and the bytes it kept."""

    deleted: tuple[str, ...]
    freed_bytes: int
    kept_bytes: int


class ModelStore:
    """The folder of kept models: `keep(path)` hashes a file and keeps a copy named by its content."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hashes = HashCache()

    def path_for(self, sha256: str, suffix: str) -> Path:
        return self.root / f"{sha256}{suffix}"

    def keep(self, source: Path, expected: str | None = None, companions: Sequence[Path] = ()) -> KeptModel:
        """Hash `source` and keep a copy unless that content is kept already. `expected`: the content the
        job measured ("sha256:<hex>" or bare hex); a file that no longer has it is recorded without a copy.
        `companions`: the model's other files (an ncnn graph's weights), kept beside it under the same
        name (the hash of all of them, `HashCache.content`) with their own suffixes.
        Raises OSError when the source cannot be read at all."""
        files = [source, *companions]
        suffix = _suffix_of(source)
        want = expected.removeprefix("sha256:") if expected else None
        digests = [self.hashes.sha256(path) for path in files]
        digest = self.hashes.content(files)
        if want is not None and digest != want:
            return KeptModel(want, suffix, None)
        targets = [self.path_for(digest, _suffix_of(path)) for path in files]
        for path, own, target in zip(files, digests, targets, strict=True):
            if target.is_file() and target.stat().st_size == path.stat().st_size:
                os.utime(target)  # reused now: a prune running beside this run leaves it (ModelStore.prune)
                continue
            if self._copy(path, target) != own:  # it changed while copied: keep nothing under a wrong name
                for kept in targets:
                    kept.unlink(missing_ok=True)
                return KeptModel(want or digest, suffix, None)
        return KeptModel(digest, suffix, targets[0])

    def prune(self, keep: set[str], grace_s: float, now: float) -> PruneReport:
        """Delete the kept files whose content hash (their name up to the suffix; an ncnn graph's weights
        share their param's) is not in `keep`, except those written or reused within `grace_s` of `now` (a
        run in progress may have just kept or found them: `keep` refreshes a reused copy's time);
        leftovers of an interrupted copy (`.part-*`) past the grace go too."""
        deleted: list[tuple[str, int]] = []
        kept = 0
        if not self.root.is_dir():
            return PruneReport((), 0, 0)
        for path in sorted(self.root.iterdir()):
            if not path.is_file():
                continue
            info = path.stat()
            if path.name.split(".")[0] in keep or now - info.st_mtime < grace_s:
                kept += info.st_size
                continue
            path.unlink(missing_ok=True)
            deleted.append((path.name, info.st_size))
        return PruneReport(tuple(name for name, _ in deleted), sum(size for _, size in deleted), kept)

    def _copy(self, source: Path, target: Path) -> str:
        """Copy to a temporary file in the same folder, fsync, seal (edgebench.files), rename into place;
        the copy's sha256. A sealed source (a built-in or converted model) is linked, not copied."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".part-", dir=self.root)
        tmp = Path(name)
        try:
            os.close(fd)
            tmp.unlink()  # the name stays ours: nothing else writes ".part-" names here
            if link_sealed(source, tmp):  # sealed already, maybe another user's: no chmod
                digest = sha256_file(tmp)
            else:
                digest = _copied(source, tmp)
                seal(tmp)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return digest


def _copied(source: Path, dest: Path) -> str:
    """Copy `source` to a new file `dest`, synced; the sha256 of what was copied."""
    digest = hashlib.sha256()
    with open(source, "rb") as src, open(dest, "xb") as out:
        while block := src.read(_CHUNK):
            digest.update(block)
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


def keep_for_job(models: ModelStore, job: Any) -> KeptModel | None:
    """Hash and keep the model of a job about to be stored (outside the store's transaction: a big file
    must not hold the write lock). A file that cannot be read is recorded by the hash the planner gave
    it, else not at all: keeping the model never costs the job its results."""
    if job.model is None:
        return None
    expected = job.identity.get("model") if job.identity else None
    expected = expected if expected and expected.startswith("sha256:") else None
    try:
        main, *companions = job.model.files
        return models.keep(Path(main), expected, companions)
    except OSError:
        if expected is None:
            return None
        return KeptModel(expected.removeprefix("sha256:"), Path(job.model.path).suffix.lower(), None)


def insert_job_model(db: sqlite3.Connection, run_id: str, job_id: int, model: str, kept: KeptModel) -> None:
    """The job's `job_models` row, inside the caller's transaction (stored with the job or not at all)."""
    db.execute(
        "INSERT OR REPLACE INTO job_models(job_id, run_id, model, sha256, suffix, stored)"
        " VALUES(?,?,?,?,?,?)",
        (job_id, run_id, model, kept.sha256, kept.suffix, kept.path.name if kept.path else None),
    )


def job_models(db: sqlite3.Connection, root: Path, run_ids: Iterable[str]) -> list[JobModel]:
    """The jobs of these runs that recorded a model, oldest first, with their kept copies (None where the
    copy is missing) and the identity params of their records."""
    ids = list(run_ids)
    if not ids:
        return []
    rows = db.execute(
        "SELECT j.id, j.run_id, j.device, j.probe, m.model, j.runtime, j.params, j.status, m.sha256,"
        " m.stored FROM job_models m JOIN jobs j ON j.id = m.job_id"
        f" WHERE m.run_id IN ({','.join('?' * len(ids))}) ORDER BY j.id",
        ids,
    ).fetchall()
    identities: dict[int, set[str]] = {}
    for job_id, params in db.execute(
        "SELECT DISTINCT r.job_id, r.params FROM records r JOIN job_models m ON m.job_id = r.job_id"
        f" WHERE m.run_id IN ({','.join('?' * len(ids))})",
        ids,
    ):
        rest = {k: v for k, v in json.loads(params).items() if k != "stat"}
        identities.setdefault(job_id, set()).add(params_key(rest))
    out = []
    for job_id, run_id, device, probe, model, runtime, params, status, sha, stored in rows:
        path = root / stored if stored else None
        out.append(
            JobModel(
                job_id,
                run_id,
                device,
                probe,
                model,
                runtime,
                json.loads(params),
                status,
                sha,
                path if path is not None and path.is_file() else None,
                frozenset(identities.get(job_id, ())),
            )
        )
    return out
