"""Runs are easy to find and compare: `edgebench runs`, run references everywhere a run id is taken,
tags, the v1 -> v2 -> v3 store chain, and `compare` of N runs paired by `Record.key()`."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from edgebench.analysis.compare import compare_runs
from edgebench.errors import UserError
from edgebench.records import Record, RecordContext
from edgebench.results.store import SCHEMA_VERSION, Store
from edgebench.testing.cli import edgebench

FIXTURE = Path(__file__).parent.parent / "fixtures" / "store_v1"
FIRST, SECOND, BENCH = "20261201T081909Z-7de074", "20261201T081930Z-83adbc", "20261201T081955Z-b55da3"


@pytest.fixture
def v1_store(tmp_path: Path) -> Path:
    path = tmp_path / "lab.db"
    shutil.copy(FIXTURE / "v1.db", path)
    return path


def test_the_v1_store_migrates_through_v2_and_v3_to_v4(v1_store: Path) -> None:
    with Store(v1_store) as st:
        assert st.tags() == {} and st.gates() == []
        st.add_tags(FIRST, ["nightly", "rc-1.2"])
    assert SCHEMA_VERSION == 4
    with sqlite3.connect(v1_store) as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "4"
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"tags", "gates", "job_models"} <= tables
        assert "annotations" in [r[1] for r in db.execute("PRAGMA table_info(records)")]  # v2 on the way
    with Store(v1_store) as st:  # opening again migrates nothing more and keeps the tags
        assert st.tags() == {FIRST: ["nightly", "rc-1.2"]}


@pytest.mark.parametrize(
    ("ref", "run"),
    [
        ("latest", BENCH),
        ("latest~1", SECOND),
        ("latest~2", FIRST),
        ("suite:smoke", SECOND),
        ("suite:smoke~1", FIRST),
        ("20261201T08193", SECOND),  # a unique prefix
        ("7de0", FIRST),  # a prefix of the random tail
        (FIRST, FIRST),
    ],
)
def test_run_references(v1_store: Path, ref: str, run: str) -> None:
    with Store(v1_store) as st:
        assert st.resolve_run(ref) == run


@pytest.mark.parametrize(
    ("ref", "needle"),
    [
        ("2026", f"is ambiguous: it matches {FIRST}, {SECOND}, {BENCH}"),
        ("nope", "unknown run 'nope' in"),
        ("suite:nightly", "no run of suite 'nightly' (suites: smoke)"),
        ("latest~3", "the store has only 3 measurement run(s)"),
        ("tag:x", "no run tagged 'x' (tags: none)"),
    ],
)
def test_bad_references_are_one_line_naming_the_candidates(v1_store: Path, ref: str, needle: str) -> None:
    with Store(v1_store) as st, pytest.raises(UserError) as err:
        st.resolve_run(ref)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_runs_lists_every_run_with_its_fields(v1_store: Path, tmp_path: Path) -> None:
    res = edgebench("runs", "--store", v1_store, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["runs"]
    assert [r["run_id"] for r in rows] == [FIRST, SECOND, BENCH]
    first = rows[0]
    assert first["kind"] == "suite" and first["suite"] == "smoke" and first["status"] == "ok"
    assert first["devices"] == ["local"] and first["commit"].startswith("b575490")
    assert first["started"] == "2026-12-01T08:19:09.200532Z" and first["duration_s"] == pytest.approx(
        20.381, abs=0.01
    )
    tagged = edgebench("runs", "--store", v1_store, "suite:smoke~1", "--add-tag", "baseline", cwd=tmp_path)
    assert tagged.returncode == 0, tagged.stderr
    only = edgebench("runs", "--store", v1_store, "--tag", "baseline", "--ids", cwd=tmp_path)
    assert only.stdout.split() == [FIRST]
    table = edgebench("runs", "--store", v1_store, cwd=tmp_path)
    assert FIRST in table.stdout and "baseline" in table.stdout and "b575490ea3" in table.stdout
    with Store(v1_store) as st:
        assert st.resolve_run("tag:baseline") == FIRST
    bad = edgebench("runs", "--store", v1_store, "latest", "--add-tag", "has space", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--tag 'has space'" in bad.stderr


def test_references_work_in_results_report_and_export(v1_store: Path, tmp_path: Path) -> None:
    res = edgebench(
        "results", "--store", v1_store, "--run", "suite:smoke~1", "--run", "latest", "--json", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    assert {r["run_id"] for r in json.loads(res.stdout)["records"]} == {FIRST, BENCH}
    table = edgebench("results", "--store", v1_store, "--run", "7de0", "--run", "b55d", cwd=tmp_path)
    header = next(line for line in table.stdout.splitlines() if "metric" in line)
    assert header.split()[1] == "run"  # records of several runs: the first column says which
    report = edgebench(
        "report", "--store", v1_store, "--run", "suite:smoke", "--out", tmp_path / "r.md", cwd=tmp_path
    )
    assert report.returncode == 0 and "1 run(s)" in report.stderr, report.stderr
    export = edgebench("export-pytest-benchmark", "--store", v1_store, "--run", "latest~1", cwd=tmp_path)
    assert export.returncode == 0 and SECOND in export.stdout
    ambiguous = edgebench("results", "--store", v1_store, "--run", "2026", cwd=tmp_path)
    assert ambiguous.returncode == 2 and ambiguous.stderr.count("\n") == 1 and "ambiguous" in ambiguous.stderr


def test_report_suite_picks_that_suites_runs(v1_store: Path, tmp_path: Path) -> None:
    suite = Path(__file__).parents[2] / "suites" / "smoke.toml"
    res = edgebench("report", "--store", v1_store, "--suite", suite, "--out", tmp_path / "r.md", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "2 run(s)" in res.stderr and BENCH not in (tmp_path / "r.md").read_text()
    nightly = Path(__file__).parents[2] / "suites" / "nightly.toml"
    none = edgebench(
        "report", "--store", v1_store, "--suite", nightly, "--out", tmp_path / "n.md", cwd=tmp_path
    )
    assert none.returncode == 2 and "no run of suite 'nightly'" in none.stderr


def _run(run_id: str, p50: float, memory: float, extra: bool = False) -> list[Record]:
    ctx = RecordContext(run_id, "phone", "bench", "enc", "onnxruntime", {"threads": 2})
    out = [ctx.record("latency_ms", p50, "ms", stat="p50"), ctx.record("peak_rss_mb", memory, "MB")]
    if extra:  # another thread count never pairs with threads=2
        other = RecordContext(run_id, "phone", "bench", "enc", "onnxruntime", {"threads": 4})
        out.append(other.record("latency_ms", p50 / 2, "ms", stat="p50"))
    return out


def test_compare_pairs_by_record_key_and_sorts_by_change() -> None:
    rows = compare_runs(
        {"a": _run("a", 10.0, 50.0), "b": _run("b", 16.0, 51.0, extra=True), "c": _run("c", 9.0, 50.0)}
    )
    assert [(r.key.metric, r.key.param_dict().get("threads")) for r in rows][0] == ("latency_ms", 2)
    first = rows[0]
    assert first.values == (10.0, 16.0, 9.0) and first.ratios == pytest.approx((1.6, 0.9))
    lonely = next(r for r in rows if r.key.param_dict().get("threads") == 4)
    assert lonely.values == (None, 8.0, None) and lonely.ratios == (None, None)
    assert (
        compare_runs({"a": _run("a", 10.0, 50.0), "b": _run("b", 16.0, 51.0)}, ["peak_rss_mb"])[0].key.metric
        == "peak_rss_mb"
    )


def test_compare_cli_columns_markdown_and_json(v1_store: Path, tmp_path: Path) -> None:
    args = ["compare", "--store", v1_store, "suite:smoke~1", "suite:smoke", "--metric", "latency_ms"]
    res = edgebench(*args, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["runs"] == [FIRST, SECOND]
    with Store(v1_store) as st:
        a = {r.key(): r.value for r in st.records([FIRST]) if r.metric == "latency_ms"}
        b = {r.key(): r.value for r in st.records([SECOND]) if r.metric == "latency_ms"}
    assert len(doc["rows"]) == len(a.keys() | b.keys())
    expected = sorted(abs(np.log(b[k] / a[k])) for k in a.keys() & b.keys())[::-1]
    got = [abs(np.log(r["ratios"][SECOND])) for r in doc["rows"] if r["ratios"][SECOND]]
    assert got == pytest.approx(expected)  # sorted by change, largest first, each ratio b / a
    md = edgebench(*args, "--markdown", "--columns", "model,stat,params", "-n", "3", cwd=tmp_path).stdout
    lines = md.splitlines()
    assert lines[0] == f"| model | stat | params | `{FIRST}` | `{SECOND}` | ratio |" and len(lines) == 5
    table = edgebench(*args, "--sort", "name", cwd=tmp_path)
    assert table.returncode == 0 and FIRST in table.stdout
    one = edgebench("compare", "--store", v1_store, "latest", BENCH, cwd=tmp_path)
    assert one.returncode == 2 and "two different runs" in one.stderr
    bad = edgebench(*args, "--columns", "colour", cwd=tmp_path)
    assert bad.returncode == 2 and "--columns 'colour'" in bad.stderr
