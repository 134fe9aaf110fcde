"""Two `edgebench run` processes started together on the same devices (the host, a second descriptor of
the host and a real ssh board) queue instead of interleaving: on each device, one run's jobs all finish
before the other run's first job starts, and the lease journal shows the holds one after the other. The
host's two descriptors, like the board's, are one device: they share one lease, so no two of their jobs
ever overlap."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgebench.descriptors import load_lab
from edgebench.execution.leases import lease_history

pytestmark = pytest.mark.integration

SUITE = """
name = "concurrent"
devices = ["local", "twin", "board", "board2"]
models = ["builtin:convnet"]
[[probe]]
kind = "bench"
params = { threads = [1, 2], runs = 5, warmup = 1, warmup_seconds = 0.0, min_seconds = 0.3 }
[policy]
cooldown = false
"""


def intervals(store: Path, *devices: str) -> dict[str, list[tuple[str, str]]]:
    with sqlite3.connect(store) as db:
        marks = ",".join("?" * len(devices))
        rows = db.execute(
            f"SELECT run_id, started, finished FROM jobs WHERE device IN ({marks}) ORDER BY started", devices
        )
        out: dict[str, list[tuple[str, str]]] = {}
        for run_id, started, finished in rows:
            out.setdefault(run_id, []).append((started, finished))
    return out


def test_two_runs_on_the_same_devices_serialise(ssh_board: Any, tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    ssh_board.write_descriptor(lab, name="board")
    ssh_board.write_descriptor(lab, name="board2")  # an alias: the same board (host and port)
    # A second descriptor of the host: the same hardware, so it shares the host's lease.
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

    specs = load_lab(lab)
    for devices in (("local", "twin"), ("board", "board2")):
        by_run = intervals(store, *devices)
        assert set(by_run) == run_ids and all(len(v) == 2 * len(devices) for v in by_run.values())
        spans = sorted(span for v in by_run.values() for span in v)
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert end <= start, f"{devices}: two jobs measured one device at once: {by_run}"  # ISO UTC

        holds = [e for e in lease_history(specs.get(devices[0]), locks) if e["run_id"] in run_ids]
        assert [e["event"] for e in holds] == ["acquired", "released"] * (2 * len(devices))
        assert {e["device"] for e in holds} == set(devices)
        for acquired, released in zip(holds[::2], holds[1::2], strict=True):
            assert (acquired["run_id"], acquired["device"]) == (released["run_id"], released["device"])
        assert any(e["waited_s"] > 0.5 for e in holds[::2])  # somebody queued
