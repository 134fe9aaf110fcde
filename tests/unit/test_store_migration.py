"""A schema v1 store, written by edgebench before records had annotations (tests/fixtures/store_v1), opens
with today's code, migrates in one transaction, and gives the answers the old code gave for it."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from edgebench.analysis.gate import collect_side
from edgebench.probes import registry
from edgebench.records import Record, RecordContext
from edgebench.render.report.frames import deltas
from edgebench.results.store import SCHEMA_VERSION, Store
from edgebench.testing.cli import edgebench

FIXTURE = Path(__file__).parent.parent / "fixtures" / "store_v1"
BASELINE, CANDIDATE = "20261201T081909Z-7de074", "20261201T081930Z-83adbc"


@pytest.fixture
def v1_store(tmp_path: Path) -> Path:
    path = tmp_path / "v1.db"
    shutil.copy(FIXTURE / "v1.db", path)
    return path


def schema_version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])


def test_the_fixture_is_a_v1_store() -> None:
    assert schema_version(FIXTURE / "v1.db") == 1
    with sqlite3.connect(FIXTURE / "v1.db") as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(records)")]
    assert "annotations" not in columns


def test_v1_store_migrates_and_keeps_every_record(v1_store: Path) -> None:
    expected = json.loads((FIXTURE / "exp-results.json").read_text())["records"]
    with Store(v1_store) as st:
        records = st.records()
    assert schema_version(v1_store) == SCHEMA_VERSION == 4
    assert len(records) == len(expected)
    for got, old in zip(records, expected, strict=True):
        same = ("run_id", "device", "probe", "model", "runtime", "metric", "value", "unit", "ts")
        assert {k: getattr(got, k) for k in same} == {k: old[k] for k in same}
        # Nothing lost: identity and annotations together are what v1 kept in params.
        assert {**got.params, **got.annotations} == old["params"]
        assert not set(got.params) & registry.v1_annotation_keys(got.probe)
    moved = {k for r in records for k in r.annotations}
    assert {"rss_before_load_mb", "bytes", "llc_bytes"} <= moved


def test_results_of_a_migrated_store_match_what_v1_printed(v1_store: Path, tmp_path: Path) -> None:
    res = edgebench("results", "--store", v1_store, "--all", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)["records"]
    old = json.loads((FIXTURE / "exp-results.json").read_text())["records"]
    assert [(r["metric"], r["value"], {**r["params"], **r["annotations"]}) for r in got] == [
        (r["metric"], r["value"], r["params"]) for r in old
    ]


def test_gate_on_a_migrated_store_matches_what_v1_printed(v1_store: Path, tmp_path: Path) -> None:
    res = edgebench(
        "gate", "--store", v1_store, "--baseline", BASELINE, "--candidate", CANDIDATE, "--json", cwd=tmp_path
    )
    expected = json.loads((FIXTURE / "exp-gate.json").read_text())
    assert res.returncode == expected["exit_code"] == 1, res.stderr
    got = json.loads(res.stdout)
    for key in ("verdict", "unpaired_candidate", "notes"):
        assert got[key] == expected[key], key
    # Today's gate adds a verdict (INCOMPLETE, none here) and the jobs' warnings to each pair.
    assert got["counts"] == {**expected["counts"], "INCOMPLETE": 0}
    assert [{k: v for k, v in p.items() if k != "warnings"} for p in got["pairs"]] == expected["pairs"]
    failed = [p for p in got["pairs"] if p["verdict"] == "FAIL"]
    assert failed and all(any("outliers" in w for w in p["warnings"]) for p in failed)


def _section(lines: list[str], title: str) -> list[str]:
    """The table rows of a Markdown section."""
    i = lines.index(title)
    rows = []
    for line in lines[i + 1 :]:
        if line.startswith("## "):
            break
        if line.startswith("| ") and not line.startswith("|---"):
            rows.append(line)
    return rows[1:]  # without the header


def test_report_on_a_migrated_store_matches_what_v1_printed(v1_store: Path, tmp_path: Path) -> None:
    """The report's layout changed (the answer first); its figures did not: every measured value, ceiling
    and change v1 printed is in today's report of the migrated store."""
    out = tmp_path / "report.md"
    res = edgebench("report", "--store", v1_store, "--out", out, "--format", "md", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    old = (FIXTURE / "exp-report.md").read_text().splitlines()
    new = out.read_text().splitlines()
    matrix = {
        tuple(c.strip() for c in row.split("|")[2:7]): row.split("|")[7].strip()
        for row in _section(new, "## Which model fits which chip")
    }
    for row in _section(old, "## Device × model"):
        device, model, runtime, p50, p99, memory, energy = (c.strip() for c in row.split("|")[1:8])
        assert (device, model, runtime, p50, p99) in matrix, row
        # memory is now the model's own (the peak over the process before the load), not the process peak
        now = matrix[(device, model, runtime, p50, p99)]
        assert float(now.split()[0]) < float(memory.split()[0]), (row, now)
    assert _section(new, "## Measured ceilings") == _section(old, "## Measured ceilings")
    old_changes, new_changes = (
        _section(old, "## Changes between runs"),
        _section(new, "## Changes between runs"),
    )
    assert len(new_changes) == len(old_changes)
    for a, b in zip(old_changes, new_changes, strict=True):
        if "| bandwidth_gbps |" in a:  # the delta row names identity only now: bytes moved to annotations
            assert b.split("|")[5:] == a.split("|")[5:] and "bytes=402653184" not in b
        else:
            assert a == b
    # memory_mb's cross-validation now predicts the model's own memory, not the process peak v1 printed
    cv = [line for line in old if line.startswith("- latency_")]
    assert cv and all(line in new for line in cv)


def test_a_failed_migration_leaves_the_v1_store_as_it_was(
    v1_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real = registry.v1_annotation_keys

    def breaks_halfway(probe: str) -> frozenset[str]:
        calls["n"] += 1
        if calls["n"] == 50:
            raise RuntimeError("disk went away")
        return real(probe)

    monkeypatch.setattr(registry, "v1_annotation_keys", breaks_halfway)
    with pytest.raises(RuntimeError):
        Store(v1_store)
    assert schema_version(v1_store) == 1
    with sqlite3.connect(v1_store) as db:
        assert "annotations" not in [row[1] for row in db.execute("PRAGMA table_info(records)")]
    monkeypatch.setattr(registry, "v1_annotation_keys", real)
    with Store(v1_store) as st:
        assert len(st.records()) == len(json.loads((FIXTURE / "exp-results.json").read_text())["records"])


def test_report_deltas_pair_as_the_gate_does_a_memory_only_change() -> None:
    """One pairing rule: a +50% peak memory, whose records differ in an annotation, is a delta the report
    shows and a pair the gate finds."""

    def memory(run: str, mb: float, before: float) -> Record:
        ctx = RecordContext(run, "phone", "bench", "enc", "onnxruntime", {"threads": 2})
        return ctx.record("peak_rss_mb", mb, "MB", {"rss_before_load_mb": before})

    a, b = memory("r1", 100.0, 31.0), memory("r2", 150.0, 33.5)
    frame = deltas([a, b], ["r1", "r2"])
    row = frame[frame["metric"] == "peak_rss_mb"]
    assert len(row) == 1 and row["change"].iloc[0] == pytest.approx(0.5) and row["verdict"].iloc[0] == "worse"
    assert set(collect_side([a], [])) == set(collect_side([b], []))


@pytest.mark.integration
def test_todays_records_have_the_identity_of_migrated_ones(v1_store: Path, tmp_path: Path) -> None:
    """The smoke suite that made the fixture, run again now: every record names the same identity params
    as its migrated v1 counterpart, so nightly series and gates go on across the upgrade."""
    suite = Path(__file__).parents[2] / "suites" / "smoke.toml"
    res = edgebench("run", suite, "--store", tmp_path / "now.db", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    fresh = [Record(**r) for r in json.loads(res.stdout)["records"]]
    with Store(v1_store) as st:
        migrated = st.records([BASELINE])

    def shapes(records: list[Record]) -> dict[tuple[str, str], set[frozenset[str]]]:
        out: dict[tuple[str, str], set[frozenset[str]]] = {}
        for r in records:
            out.setdefault((r.probe, r.metric), set()).add(frozenset(r.params))
        return out

    now, then = shapes(fresh), shapes(migrated)
    # Metrics added since v1 (import_ms, rss_increase_mb, best_path_tops) are new series; every v1 series
    # goes on with the same identity, but the roofline jobs' own floor_ms: the suite's roofline jobs now
    # only count, and each benched configuration's floor comes from the ceilings at its thread count
    # (edgebench.analysis.ceilings.model_floors, the report's roofline).
    then.pop(("roofline", "floor_ms"), None)
    assert set(then) <= set(now)
    assert {k: now[k] for k in then} == then
    old_keys = {r.key() for r in migrated if r.probe == "bench"}
    assert old_keys and old_keys <= {r.key() for r in fresh if r.probe == "bench"}
