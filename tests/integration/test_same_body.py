"""ONE test body, run against the host (`local`), a real ssh board and an emulated adb phone.

Each device fixture is turned into (lab folder, device name); the body is the CLI a lab engineer runs:
`devices --check` and `bench`, with the same assertions everywhere.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

BENCH = ["--runs", "40", "--min-seconds", "0", "--warmup", "1", "--timeout", "120"]  # p90 needs 36 samples


def test_check_and_bench_give_the_same_kind_of_answer_everywhere(
    lab_device: tuple[Path, str], tmp_path: Path
) -> None:
    lab, name = lab_device
    check = edgebench("devices", "--check", "--device", name, "--lab", str(lab), "--json", cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    [row] = json.loads(check.stdout)["devices"]
    assert row["name"] == name and row["reachable"] and row["usable"] and row["status"] == "ok"
    assert row["arch"] and row["cores"] and row["kernel"] and row["python"] and row["runtimes"]["onnxruntime"]

    store = tmp_path / "s.db"
    res = edgebench(
        "bench",
        "builtin:mlp",
        "--device",
        name,
        "--lab",
        str(lab),
        *BENCH,
        "--threads",
        "1",
        "--store",
        str(store),
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    records = json.loads(res.stdout)["records"]
    got = {(r["metric"], r["params"].get("stat")): r["value"] for r in records}
    for stat in ("p50", "p90", "mean", "min", "max"):
        assert got[("latency_ms", stat)] > 0
    assert got[("latency_ms", "min")] <= got[("latency_ms", "p50")] <= got[("latency_ms", "max")]
    for metric in ("load_ms", "first_inference_ms", "peak_rss_mb"):
        assert got[(metric, None)] > 0
    assert {(r["device"], r["model"], r["runtime"]) for r in records} == {(name, "mlp", "onnxruntime")}
    assert all(r["params"]["threads"] == 1 for r in records)
    with sqlite3.connect(store) as db:
        [(stored,)] = db.execute("SELECT COUNT(*) FROM records WHERE device=?", (name,)).fetchall()
        assert stored == len(records)
        [(n,)] = db.execute("SELECT COUNT(*) FROM samples WHERE metric='latency_ms'").fetchall()
        assert n == 1
