"""The content-addressed model store beside the result store: each job's model hash (checked against
hashlib on the file's bytes), one atomic copy per content, the planner's hash kept when the file changed,
and a schema 3 store that migrates to 4 with nothing lost."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from edgebench.jobs import Job, JobOutcome, ModelRef
from edgebench.records import RecordContext
from edgebench.results.models import models_dir
from edgebench.results.store import SCHEMA_VERSION, Store


def bench_outcome(
    run_id: str, model: Path, name: str = "net", identity: dict[str, str] | None = None
) -> JobOutcome:
    job = Job("local", "bench", ModelRef(name, model), "onnxruntime", {"threads": 1}, identity=identity or {})
    ctx = RecordContext(run_id, "local", "bench", name, "onnxruntime", {"threads": 1})
    return JobOutcome(job, "ok", [ctx.record("latency_ms", 1.0, "ms", stat="p50")])


def test_each_job_records_its_model_hash_and_one_copy_per_content(tmp_path: Path) -> None:
    model = tmp_path / "net.onnx"
    model.write_bytes(b"first build" * 1000)
    first = hashlib.sha256(model.read_bytes()).hexdigest()
    with Store(tmp_path / "s.db") as st:
        st.begin_run("r1", "bench", {})
        st.save_job("r1", bench_outcome("r1", model))
        st.begin_run("r2", "bench", {})
        st.save_job("r2", bench_outcome("r2", model, name="net-again"))  # same content, another name
        model.write_bytes(b"second build" * 1000)  # the file changes on disk after the runs
        st.begin_run("r3", "bench", {})
        st.save_job("r3", bench_outcome("r3", model))
        [j1], [j2], [j3] = st.job_models(["r1"]), st.job_models(["r2"]), st.job_models(["r3"])
    second = hashlib.sha256(model.read_bytes()).hexdigest()
    assert (j1.sha256, j2.sha256, j3.sha256) == (first, first, second)
    kept = sorted(p.name for p in models_dir(tmp_path / "s.db").iterdir())
    assert kept == sorted([f"{first}.onnx", f"{second}.onnx"])  # deduplicated; no temporary files left
    assert j1.path is not None and j1.path.read_bytes() == b"first build" * 1000  # last night's model
    assert j1.path == j2.path and (j1.model, j2.model) == ("net", "net-again")


def test_a_file_changed_since_the_job_keeps_the_measured_hash_without_a_copy(tmp_path: Path) -> None:
    model = tmp_path / "net.onnx"
    model.write_bytes(b"measured")
    measured = hashlib.sha256(b"measured").hexdigest()
    model.write_bytes(b"replaced before the job was stored")
    with Store(tmp_path / "s.db") as st:
        st.begin_run("r1", "bench", {})
        st.save_job("r1", bench_outcome("r1", model, identity={"model": f"sha256:{measured}"}))
        [row] = st.job_models(["r1"])
    assert row.sha256 == measured and row.path is None  # never a copy of what was not measured


def test_a_missing_model_file_never_costs_the_job(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as st:
        st.begin_run("r1", "bench", {})
        assert st.save_job("r1", bench_outcome("r1", tmp_path / "gone.onnx"))
        assert len(st.records(["r1"])) == 1 and st.job_models(["r1"]) == []


def as_v3(path: Path) -> None:
    """What a schema 3 store is: today's minus `job_models`."""
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE job_models")
        db.execute("UPDATE meta SET value='3' WHERE key='schema_version'")


def test_a_v3_store_opens_migrates_and_loses_nothing(tmp_path: Path) -> None:
    model = tmp_path / "net.onnx"
    model.write_bytes(b"old")
    path = tmp_path / "s.db"
    with Store(path) as st:
        st.begin_run("old", "bench", {})
        st.save_job("old", bench_outcome("old", model))
        st.add_tags("old", ["nightly"])
        before = (st.records(), st.jobs(), st.tags())
    as_v3(path)
    with Store(path) as st:
        assert st._schema_version() == SCHEMA_VERSION == 4
        assert (st.records(), st.jobs(), st.tags()) == before
        assert st.job_models(["old"]) == []  # jobs stored before schema 4 have no row
        st.begin_run("new", "bench", {})
        st.save_job("new", bench_outcome("new", model))
        assert [j.sha256 for j in st.job_models(["new"])] == [hashlib.sha256(b"old").hexdigest()]


def test_confirm_runs_are_never_latest(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as st:
        st.begin_run("20260101T000000Z-aaaaaa", "bench", {})
        st.begin_run("20260101T000001Z-bbbbbb", "confirm", {})
        assert st.resolve_run("latest") == "20260101T000000Z-aaaaaa"


def test_confirm_jobs_of_one_model_have_distinct_keys() -> None:
    job = Job(
        "local",
        "bench",
        ModelRef("net", Path("net.onnx")),
        None,
        {"threads": 1},
        identity={"model": "sha256:ab"},
    )
    keys = {
        Job(
            job.device,
            job.probe,
            job.model,
            None,
            job.params,
            identity={**job.identity, "confirm": f"{s}/{i}"},
        ).key
        for s in ("baseline", "candidate")
        for i in range(3)
    }
    assert len(keys) == 6 and job.key not in keys
    plain = Job("local", "bench", ModelRef("net", Path("net.onnx")), None, {"threads": 1})
    assert plain.key == Job("local", "bench", ModelRef("net", Path("x/net.onnx")), None, {"threads": 1}).key


def test_prune_keeps_tagged_runs_and_each_suites_latest_and_fresh_copies(tmp_path: Path) -> None:
    """Five nightly builds, each a new content: a prune keeping the latest 2 nightly runs deletes the 2
    oldest copies but the one of the run tagged as a baseline, leaves a fresh leftover alone, removes an old
    one, and a confirm on a pruned run finds no copy (said by job_models' None), its hash still recorded."""
    import os

    store = tmp_path / "s.db"
    hashes = []
    with Store(store) as st:
        for night in range(5):
            model = tmp_path / "net.onnx"
            model.write_bytes(f"build {night}".encode() * 1000)
            hashes.append(hashlib.sha256(model.read_bytes()).hexdigest())
            st.begin_run(f"n{night}", "suite", {}, suite="nightly")
            st.save_job(f"n{night}", bench_outcome(f"n{night}", model))
            st.finish_run(f"n{night}", "ok")
        st.add_tags("n1", ["baseline"])
    root = models_dir(store)
    old = 1_000_000.0  # long before the grace period: every copy so far
    for path in root.iterdir():
        os.utime(path, (old, old))
    (root / ".part-stale").write_bytes(b"x")
    os.utime(root / ".part-stale", (old, old))
    (root / ".part-now").write_bytes(b"y")  # a copy being written by a run in progress
    with Store(store) as st:
        report, kept_runs = st.prune_models(2)
        pruned = {j.run_id: j for j in st.job_models([f"n{i}" for i in range(5)])}
    assert kept_runs == ["n1", "n3", "n4"]
    assert sorted(report.deleted) == sorted([f"{hashes[0]}.onnx", f"{hashes[2]}.onnx", ".part-stale"])
    assert report.freed_bytes == len(b"build 0") * 1000 + len(b"build 2") * 1000 + 1
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [".part-now", f"{hashes[1]}.onnx", f"{hashes[3]}.onnx", f"{hashes[4]}.onnx"]
    )
    assert pruned["n0"].path is None and pruned["n0"].sha256 == hashes[0]
    assert pruned["n1"].path is not None and pruned["n1"].path.read_bytes() == b"build 1" * 1000
    # a run that finds a kept content reuses its copy and refreshes it: a prune beside it leaves it
    kept3 = root / f"{hashes[3]}.onnx"
    model = tmp_path / "net.onnx"
    model.write_bytes(b"build 3" * 1000)
    with Store(store) as st:
        st.begin_run("n5", "suite", {}, suite="nightly")
        st.save_job("n5", bench_outcome("n5", model))
        st.finish_run("n5", "ok")
    assert kept3.stat().st_mtime > old
    # through the CLI: one line saying what went, nothing else of the store touched
    from edgebench.testing.cli import edgebench

    res = edgebench("runs", "--store", store, "--prune-models", "0", "--ids", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [f"n{i}" for i in range(6)]
    # n4's copy goes; n3's content, reused by n5 a moment ago, stays within the grace; n1's by its tag
    assert "pruned 1 model copies" in res.stderr and "for 1 runs" in res.stderr, res.stderr
    assert sorted(p.name for p in root.iterdir()) == sorted([".part-now", f"{hashes[1]}.onnx", kept3.name])
    bad = edgebench("runs", "--store", store, "--prune-models", "-1", cwd=tmp_path)
    assert bad.returncode == 2 and "--prune-models" in bad.stderr
