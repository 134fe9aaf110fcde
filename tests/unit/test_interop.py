"""pytest-benchmark interop: stats as pytest-benchmark computes them, export read by the real
`pytest-benchmark compare`, import with and without raw data, bad files refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pytest_benchmark.stats import Stats

from edgebench.analysis.gate import NOISY, default_rules, gate_runs
from edgebench.cli import main
from edgebench.errors import UserError
from edgebench.jobs import Job, JobOutcome, ModelRef
from edgebench.records import RecordContext
from edgebench.results.interop import export_run, import_file, pytest_benchmark_stats
from edgebench.results.store import Store


def test_stats_agree_with_pytest_benchmark() -> None:
    data = list(np.random.default_rng(1).lognormal(-6, 0.1, 57))
    theirs = Stats()
    for v in data:
        theirs.update(v)
    ours = pytest_benchmark_stats(data)
    for field in ("min", "max", "mean", "stddev", "median", "rounds", "ops", "total"):
        assert ours[field] == pytest.approx(getattr(theirs, field), rel=1e-12), field
    spacing = float(np.max(np.diff(np.sort(data))))
    for field in ("q1", "q3"):  # quartile conventions differ by at most one sample spacing
        assert abs(ours[field] - getattr(theirs, field)) <= spacing
    assert ours["data"] == data and ours["iterations"] == 1


def bench_run(store: Store, run_id: str, latencies: list[float], model: str = "enc") -> None:
    ctx = RecordContext(run_id, "local", "bench", model, "onnxruntime", {"threads": 2})
    records = [
        ctx.record("latency_ms", float(np.median(latencies)), "ms", stat="p50"),
        ctx.record("latency_ms", float(np.mean(latencies)), "ms", stat="mean"),
        ctx.record("load_ms", 40.0, "ms"),
        ctx.record("peak_rss_mb", 61.5, "MB", {"rss_before_load_mb": 30.0}),
    ]
    store.begin_run(run_id, "bench", {"git_commit": "abc123", "python": "3.11.7"})
    store.save_device(run_id, "local", {"kernel": "6.1"}, {"name": "local"})
    job = Job("local", "bench", ModelRef(model, Path(f"{model}.onnx")), "onnxruntime", {"threads": 2})
    store.save_job(run_id, JobOutcome(job, "ok", records, [ctx.samples("latency_ms", "ms", latencies)]))
    store.finish_run(run_id, "ok")


def compare(*files: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_benchmark",
            "compare",
            *map(str, files),
            "--columns",
            "min,median,max,rounds",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_export_is_read_by_pytest_benchmark_compare(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    with Store(tmp_path / "e.db") as st:
        bench_run(st, "r1", list(rng.lognormal(np.log(8.0), 0.02, 40)))
        bench_run(st, "r2", list(rng.lognormal(np.log(12.0), 0.02, 40)))
        docs = [export_run(st, r) for r in ("r1", "r2")]
    files = []
    for i, doc in enumerate(docs):
        files.append(tmp_path / f"000{i + 1}_run.json")
        files[-1].write_text(json.dumps(doc))
    main_bench = next(b for b in docs[0]["benchmarks"] if b["name"] == "enc[local-onnxruntime-threads=2]")
    assert main_bench["stats"]["rounds"] == 40 and len(main_bench["stats"]["data"]) == 40
    assert main_bench["stats"]["median"] == pytest.approx(8e-3, rel=0.02)  # in seconds, as pytest-benchmark
    assert main_bench["extra_info"]["peak_rss_mb"] == 61.5
    assert docs[0]["commit_info"]["id"] == "abc123" and docs[0]["machine_info"]["node"] == "local"
    res = compare(*files, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "enc[local-onnxruntime-threads=2]" in res.stdout and "bench.load_ms:enc" in res.stdout
    rows = [
        [t for t in line.split()[1:] if not t.startswith("(")]
        for line in res.stdout.splitlines()
        if line.startswith("enc[")
    ]
    medians = sorted(float(row[1]) for row in rows)  # columns min, median, max, rounds (in ms)
    assert medians == pytest.approx([8.0, 12.0], rel=0.03)


def pytest_benchmark_doc(median_s: float, data: bool, name: str = "test_decode") -> dict:
    values = list(np.random.default_rng(int(median_s * 1e6)).lognormal(np.log(median_s), 0.02, 30))
    stats = pytest_benchmark_stats(values, include_data=data)
    return {
        "machine_info": {"node": "ci-runner-3", "python_version": "3.11.7"},
        "commit_info": {"id": "deadbeef", "branch": "main"},
        "benchmarks": [
            {
                "group": None,
                "name": name,
                "fullname": f"tests/test_codec.py::{name}",
                "params": None,
                "param": None,
                "extra_info": {},
                "options": {},
                "stats": stats,
            }
        ],
        "datetime": "2026-10-03T02:00:00.123456+00:00",
        "version": "5.1.0",
    }


def test_import_with_raw_data_is_gated_statistically(tmp_path: Path) -> None:
    for name, median in (("a.json", 0.010), ("b.json", 0.013)):
        (tmp_path / name).write_text(json.dumps(pytest_benchmark_doc(median, data=True)))
    with Store(tmp_path / "e.db") as st:
        ra, n_rec, n_samples = import_file(st, tmp_path / "a.json")
        rb, _, _ = import_file(st, tmp_path / "b.json")
        assert n_samples == 1 and n_rec >= 6
        [samples] = st.samples([ra])
        assert (samples.device, samples.model, samples.probe, samples.runtime) == (
            "ci-runner-3",
            "tests/test_codec.py::test_decode",
            "bench",
            "python",
        )
        assert len(samples.values) == 30 and np.median(samples.values) == pytest.approx(10.0, rel=0.03)
        recs = st.records([ra])
        assert {r.ts for r in recs} == {"2026-10-03T02:00:00.123456Z"}
        assert st.run(ra).provenance["git_commit"] == "deadbeef"
        res = gate_runs(st, ra, rb, default_rules())
        [v] = res.verdicts
        # One pytest-benchmark file is one process: a +30% seen in its rounds is NOISY, never FAIL.
        assert v.verdict == NOISY and v.method.startswith("mann-whitney") and v.n_candidate == 30
        assert "one invocation per side" in v.reason
        back = export_run(st, ra)
    assert back["benchmarks"][0]["stats"]["median"] == pytest.approx(0.010, rel=0.03)


def test_import_without_data_keeps_stats_and_round_trips(tmp_path: Path) -> None:
    doc = pytest_benchmark_doc(0.002, data=False)
    (tmp_path / "s.json").write_text(json.dumps(doc))
    with Store(tmp_path / "e.db") as st:
        run, _, n_samples = import_file(st, tmp_path / "s.json", device="bench-host")
        assert n_samples == 0
        got = {(r.metric, r.params.get("stat")): r.value for r in st.records([run])}
        assert got[("latency_ms", "p50")] == pytest.approx(doc["benchmarks"][0]["stats"]["median"] * 1000)
        stddev_ms = doc["benchmarks"][0]["stats"]["stddev"] * 1000
        assert got[("latency_stddev_ms", None)] == pytest.approx(stddev_ms)
        back = export_run(st, run)
    [bench] = back["benchmarks"]
    for field in ("median", "mean", "min", "max", "stddev", "q1", "q3"):
        assert bench["stats"][field] == pytest.approx(doc["benchmarks"][0]["stats"][field]), field
    assert bench["stats"]["rounds"] == 30
    out = tmp_path / "0001_back.json"
    out.write_text(json.dumps(back))
    res = compare(out, cwd=tmp_path)
    assert res.returncode == 0 and "tests/test_codec.py::test_decode" in res.stdout


@pytest.mark.parametrize(
    "content, needle",
    [
        ("{not json", "not JSON"),
        ('{"benchmarks": 3}', "benchmarks: not a pytest-benchmark file"),
        (
            '{"benchmarks": [{"name": "t", "stats": {"median": "fast", "mean": 1}}]}',
            "benchmarks[0].stats.median",
        ),
        (
            '{"benchmarks": [{"name": "t", "stats": {"median": 1, "mean": 1, "data": [1, null]}}]}',
            "benchmarks[0].stats.data",
        ),
        ('{"benchmarks": [{"stats": {}}]}', "benchmarks[0].fullname"),
    ],
)
def test_bad_files_are_one_line_errors_and_store_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, needle: str
) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(pytest_benchmark_doc(0.001, data=True)))
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    db = tmp_path / "e.db"
    with Store(db) as st:
        bench_run(st, "kept", [1.0, 2.0, 3.0])
    with pytest.raises(SystemExit) as done:
        main(["import-pytest-benchmark", str(good), str(bad), "--store", str(db)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and "bad.json" in err and needle in err, err
    with Store(db) as st:
        assert [r.run_id for r in st.runs()] == ["kept"]  # the good file was not half-imported either


def test_export_cli_and_its_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "e.db"
    with Store(db) as st:
        bench_run(st, "r1", [5.0, 5.1, 4.9, 5.2])
    with pytest.raises(SystemExit) as done:
        main(["export-pytest-benchmark", "--store", str(db)])
    assert done.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmarks"] and doc["machine_info"]["edgebench"]["run_id"] == "r1"
    with pytest.raises(SystemExit) as done:
        main(["export-pytest-benchmark", "--store", str(db), "--run", "nope"])
    assert done.value.code == 2 and "unknown run 'nope'" in capsys.readouterr().err
    with Store(db) as st:
        st.begin_run("empty", "bench", {})
        with pytest.raises(UserError, match="no time measurements"):
            export_run(st, "empty")
