"""`edgebench run` over a real fleet: the host, a real sshd board and an emulated adb phone.

The board's sshd is killed mid-run: the other devices finish, the board's jobs become error records,
the run exits non-zero without a traceback, and `--resume` completes exactly the missing jobs. Then
the controller itself is killed with SIGKILL mid-run, and `--resume` again finishes exactly the rest.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 240


def matmul_model(path: Path, n: int, seed: int) -> Path:
    """A small model that still does some work (an n x n MatMul and a Relu)."""
    import numpy as np

    w = helper.make_tensor(
        "w",
        TensorProto.FLOAT,
        [n, n],
        np.random.default_rng(seed).standard_normal((n, n)).astype("float32").ravel(),
    )
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(
        nodes,
        f"mm{n}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def write_suite(folder: Path, devices: list[str], *, runs: int = 30) -> Path:
    (folder / "models").mkdir(parents=True, exist_ok=True)
    matmul_model(folder / "models" / "small.onnx", 64, 1)
    matmul_model(folder / "models" / "wide.onnx", 256, 2)
    path = folder / "fleet.toml"
    path.write_text(f"""
name = "fleet"
devices = {json.dumps(devices)}
models = ["models/small.onnx", {{name = "wide", path = "models/wide.onnx"}}]
[[probe]]
kind = "bench"
params = {{ threads = [1, 2], runs = {runs}, warmup = 1, warmup_seconds = 0.0, min_seconds = 0.0 }}
[policy]
retries = 1
backoff = 0.2
quarantine_after = 2
cooldown = false
""")
    return path


def edgebench(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "edgebench", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    return proc.returncode, json.loads(out) if out.strip() else {}, err


def ok_jobs(store: Path, run_id: str | None = None) -> list[tuple[str, str, str]]:
    """(job key, device, started) of every ok job in the store (or in one run); none while it is made."""
    if not store.exists():
        return []
    try:
        with sqlite3.connect(store, timeout=30) as db:
            sql = "SELECT job_key, device, started FROM jobs WHERE status='ok'"
            if run_id:
                return db.execute(sql + " AND run_id=?", (run_id,)).fetchall()
            return db.execute(sql).fetchall()
    except sqlite3.OperationalError:  # the controller is still creating the schema
        return []


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"run ended early: {proc.communicate()[1]}"
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def only_run_id(store: Path) -> str:
    with sqlite3.connect(store) as db:
        [(run_id,)] = db.execute("SELECT run_id FROM runs").fetchall()
    return run_id


def assert_complete_once(store: Path, run_id: str, expected_jobs: int) -> None:
    """Every job of the run ok exactly once, and each measurement stored once."""
    with sqlite3.connect(store) as db:
        rows = db.execute(
            "SELECT job_key, COUNT(*) FROM jobs WHERE run_id=? AND status='ok' GROUP BY job_key", (run_id,)
        ).fetchall()
        assert len(rows) == expected_jobs and all(n == 1 for _, n in rows), rows
        dupes = db.execute(
            "SELECT r.device, r.model, r.params, r.metric, COUNT(*) FROM records r "
            "JOIN jobs j ON r.job_id = j.id WHERE r.run_id=? AND j.status='ok' "
            "GROUP BY r.device, r.model, r.params, r.metric HAVING COUNT(*) > 1",
            (run_id,),
        ).fetchall()
        assert dupes == []
        orphans = db.execute(
            "SELECT COUNT(*) FROM records WHERE run_id=? AND job_id NOT IN "
            "(SELECT id FROM jobs WHERE status='ok')",
            (run_id,),
        ).fetchone()[0]
        assert orphans == 0
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        status = db.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()[0]
        assert status == "ok"


@pytest.fixture
def fleet(fresh_ssh_board: Any, adb_phone_factory: Any, tmp_path: Path) -> tuple[Path, Any, list[str]]:
    """One lab folder holding the board and the phone (local is always there)."""
    lab = tmp_path / "lab"
    fresh_ssh_board.write_descriptor(lab)
    adb_phone_factory(name="phone", lab_dir=lab)
    return lab, fresh_ssh_board, ["local", fresh_ssh_board.name, "phone"]


def test_a_dead_board_fails_only_its_jobs_and_resume_finishes_them(
    fleet: tuple[Path, Any, list[str]], tmp_path: Path
) -> None:
    lab, board, devices = fleet
    suite = write_suite(tmp_path, devices)
    store, locks = tmp_path / "fleet.db", tmp_path / "locks"
    common = ["--lab", str(lab), "--store", str(store), "--lock-dir", str(locks), "--json"]
    jobs_per_device = 4  # 2 models x 2 thread counts

    proc = edgebench("run", str(suite), *common, cwd=tmp_path)
    wait_until(lambda: any(d == board.name for _, d, _ in ok_jobs(store)), proc)
    board.kill()  # the board loses power mid-run
    rc, doc, err = finish(proc)

    assert rc == 1, err
    assert "Traceback" not in err and doc["status"] == "failed"
    summary = {s["device"]: s for s in doc["summary"]}
    for name in ("local", "phone"):
        assert (summary[name]["ok"], summary[name]["failed"]) == (jobs_per_device, 0), summary[name]
    board_ok = summary[board.name]["ok"]
    assert 1 <= board_ok < jobs_per_device and summary[board.name]["failed"] == jobs_per_device - board_ok
    assert {e["device"] for e in doc["errors"]} == {board.name}
    assert all(e["error"] and e["kind"] == "lab" for e in doc["errors"])
    assert {r["device"] for r in doc["records"]} == set(devices)
    run_id = doc["run_id"]
    before = {key for key, _, _ in ok_jobs(store, run_id)}
    assert len(before) == 2 * jobs_per_device + board_ok

    board.restart()
    resumed_at = _utc_now()
    rc, doc, err = finish(edgebench("run", str(suite), *common, "--resume", run_id, cwd=tmp_path))
    assert rc == 0, err
    assert doc["run_id"] == run_id and doc["status"] == "ok" and doc["errors"] == []
    summary = {s["device"]: s for s in doc["summary"]}
    assert summary[board.name]["skipped"] == board_ok and summary["local"]["skipped"] == jobs_per_device
    rerun = {key for key, _, started in ok_jobs(store, run_id) if started >= resumed_at}
    assert len(rerun) == jobs_per_device - board_ok and not rerun & before  # exactly the missing jobs
    assert_complete_once(store, run_id, 3 * jobs_per_device)
    assert {(r["device"], r["model"]) for r in doc["records"]} == {
        (d, m) for d in devices for m in ("small", "wide")
    }


def test_a_killed_controller_loses_only_jobs_in_flight(
    fleet: tuple[Path, Any, list[str]], tmp_path: Path
) -> None:
    lab, board, devices = fleet
    suite = write_suite(tmp_path, devices, runs=200)
    store, locks = tmp_path / "kill9.db", tmp_path / "locks"
    common = ["--lab", str(lab), "--store", str(store), "--lock-dir", str(locks), "--json"]

    proc = edgebench("run", str(suite), *common, cwd=tmp_path)
    wait_until(lambda: len(ok_jobs(store)) >= 3, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    run_id = only_run_id(store)
    with sqlite3.connect(store) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT status FROM runs").fetchone()[0] == "running"  # it never got to finish
    before = {key for key, _, _ in ok_jobs(store, run_id)}
    assert 3 <= len(before) < 12

    # The killed controller's leases are recovered (its pid is gone): the resume does not wait for them.
    resumed_at = _utc_now()
    rc, doc, err = finish(edgebench("run", str(suite), *common, "--resume", run_id, cwd=tmp_path))
    assert rc == 0, err
    assert doc["status"] == "ok" and doc["errors"] == []
    rerun = {key for key, _, started in ok_jobs(store, run_id) if started >= resumed_at}
    assert rerun == {key for key, _, _ in ok_jobs(store, run_id)} - before
    assert_complete_once(store, run_id, 12)
    assert sum(s["skipped"] for s in doc["summary"]) == len(before)


def _utc_now() -> str:
    from edgebench.records import utc_now

    return utc_now()
