"""A one-shot verb goes through the device session like a suite run does: `edgebench bench` on a real ssh
board that a running suite holds waits for the suite's lease (saying on stderr who holds it), so the jobs'
time spans in the store never overlap, and the board's lease journal shows both holders one after the other.
With `--lease-timeout` the verb gives up instead (exit 3, naming the holder)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from edgebench.descriptors import load_lab
from edgebench.execution.leases import lease_history

sys.path.insert(0, str(Path(__file__).parent))
from cli_procs import board_suite, store_rows, wait_until
from cli_procs import start as edgebench

pytestmark = pytest.mark.integration

SUITE = """
name = "held"
devices = ["board"]
models = ["builtin:convnet"]
[[probe]]
kind = "bench"
params = { threads = [1, 2], runs = 20, warmup = 1, warmup_seconds = 0.0, min_seconds = [1.0, 1.5] }
[policy]
cooldown = false
"""
BENCH = ["--runs", "10", "--warmup", "1", "--min-seconds", "0", "--threads", "1"]


def job_spans(store: Path, device: str) -> dict[str, list[tuple[str, str]]]:
    """run id -> [(started, finished)] of the device's jobs, from the store (ISO UTC strings sort as time)."""
    spans: dict[str, list[tuple[str, str]]] = {}
    sql = "SELECT run_id, started, finished FROM jobs WHERE device=? ORDER BY started"
    for run_id, started, finished in store_rows(store, sql, device):
        spans.setdefault(run_id, []).append((started, finished))
    return spans


def wait_for_ok_job(store: Path, proc: subprocess.Popen[str]) -> None:
    def stored() -> bool:
        assert proc.poll() is None, proc.communicate()[1]
        return bool(store_rows(store, "SELECT 1 FROM jobs WHERE status='ok'"))

    wait_until(stored, "the suite stored no job")


def test_bench_waits_for_the_suite_holding_the_board(ssh_board: Any, tmp_path: Path) -> None:
    lab, suite = board_suite(ssh_board, tmp_path, SUITE)
    store, locks = tmp_path / "shared.db", tmp_path / "locks"
    common = ["--lab", lab, "--store", store, "--lock-dir", locks]

    run = edgebench("run", suite, *common, "--json", cwd=tmp_path)
    wait_for_ok_job(store, run)  # the suite holds the board and has jobs left
    # Frozen while both verbs start (its lease lasts 60 s): however slowly they start on a crowded host,
    # they find the board held, not a suite that finished meanwhile.
    run.send_signal(signal.SIGSTOP)
    try:
        impatient = edgebench("bench", "builtin:mlp", "--device", "board", *common, *BENCH,
                              "--lease-timeout", "1", "--json", cwd=tmp_path)  # fmt: skip
        bench = edgebench(
            "bench", "builtin:mlp", "--device", "board", *common, *BENCH, "--json", cwd=tmp_path
        )
        out, err = impatient.communicate(timeout=60)
        time.sleep(2.0)  # the patient one started with it: let it reach the lease and say it waits
    finally:
        run.send_signal(signal.SIGCONT)
    assert impatient.returncode == 3, err
    assert "board: still leased by run" in err and "Traceback" not in err and out == ""
    run_out, run_err = run.communicate(timeout=240)
    assert run.returncode == 0, run_err
    bench_out, bench_err = bench.communicate(timeout=120)
    assert bench.returncode == 0, bench_err
    suite_run, bench_run = json.loads(run_out)["run_id"], json.loads(bench_out)["run_id"]
    assert f"edgebench: board: waiting: device leased by run {suite_run}, pid {run.pid}" in bench_err

    spans = job_spans(store, "board")
    assert len(spans[suite_run]) == 4 and len(spans[bench_run]) == 1
    every = sorted(spans[suite_run] + spans[bench_run])
    for (_, end), (start, _) in zip(every, every[1:], strict=False):
        assert end <= start, f"two jobs measured the board at once: {spans}"
    assert spans[suite_run][-1][1] <= spans[bench_run][0][0]  # the bench waited for the whole suite
    with sqlite3.connect(store) as db:
        stored = db.execute("SELECT run_id, device FROM devices").fetchall()
    assert (bench_run, "board") in stored and (suite_run, "board") in stored  # both fingerprints kept

    holds = [(e["event"], e["run_id"]) for e in lease_history(load_lab(lab).get("board"), locks)]
    assert holds == [
        ("acquired", suite_run),
        ("released", suite_run),
        ("acquired", bench_run),
        ("released", bench_run),
    ]
