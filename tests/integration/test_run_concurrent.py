"""Two `edgebench run` processes started together on the same devices (the host, a second local device
and a real ssh board) queue instead of interleaving: on each device, one run's jobs all finish before
the other run's first job starts, and the lease journal shows the two holds one after the other."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgebench.execution.leases import lease_history

pytestmark = pytest.mark.integration

SUITE = """
name = "concurrent"
devices = ["local", "twin", "board"]
models = ["builtin:convnet"]
[[probe]]
kind = "bench"
params = { threads = [1, 2], runs = 5, warmup = 1, warmup_seconds = 0.0, min_seconds = 0.3 }
[policy]
cooldown = false
"""


def intervals(store: Path, device: str) -> dict[str, list[tuple[str, str]]]:
    with sqlite3.connect(store) as db:
        rows = db.execute(
            "SELECT run_id, started, finished FROM jobs WHERE device=? ORDER BY started", (device,)
        )
        out: dict[str, list[tuple[str, str]]] = {}
        for run_id, started, finished in rows:
            out.setdefault(run_id, []).append((started, finished))
    return out


def test_two_runs_on_the_same_devices_serialise(ssh_board: Any, tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    ssh_board.write_descriptor(lab, name="board")
    # A second device that is the host too: leases are per device, so the two devices run in parallel.
    (lab / "twin.toml").write_text(f'name = "twin"\ntransport = "local"\nworkdir = "{tmp_path / "twin"}"\n')
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE)
    store, locks = tmp_path / "shared.db", tmp_path / "locks"
    argv = [
        sys.executable,
        "-m",
        "edgebench",
        "run",
        str(suite),
        "--lab",
        str(lab),
        "--store",
        str(store),
        "--lock-dir",
        str(locks),
        "--json",
    ]
    procs = [
        subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert json.loads(out)["status"] == "ok"
    run_ids = {json.loads(out)["run_id"] for out, _ in results}
    assert len(run_ids) == 2

    for device in ("local", "twin", "board"):
        by_run = intervals(store, device)
        assert set(by_run) == run_ids and all(len(v) == 2 for v in by_run.values())
        first, second = sorted(by_run.values(), key=lambda spans: spans[0][0])
        assert first[-1][1] <= second[0][0], f"{device}: runs interleaved: {by_run}"  # ISO UTC sorts as time

        holds = [e for e in lease_history(device, locks) if e["run_id"] in run_ids]
        assert [e["event"] for e in holds] == ["acquired", "released", "acquired", "released"]
        assert holds[0]["run_id"] == holds[1]["run_id"] != holds[2]["run_id"] == holds[3]["run_id"]
        assert holds[1]["epoch"] <= holds[2]["epoch"]
        assert holds[2]["waited_s"] > 0.5  # the second run queued behind the first
