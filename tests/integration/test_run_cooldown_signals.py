"""Between jobs on a device with thermal sensors the run waits for the cool-down guard (a sandbox sysfs
tree on a local device); a run stopped with SIGTERM (cron, CI) is marked interrupted, keeps what it
stored, `--resume` finishes it, and `results` exports the whole run."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def run_argv(suite: Path, lab: Path, store: Path, *extra: str) -> list[str]:
    return [
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
        str(suite.parent / "locks"),
        "--json",
        *extra,
    ]


def test_the_cool_down_guard_runs_between_jobs_on_a_device_with_thermal_zones(tmp_path: Path) -> None:
    root = tmp_path / "sysroot"
    zone = root / "sys" / "class" / "thermal" / "thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text("45000\n")  # a steady 45 °C: the guard estimates idle, then finds it cool
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "sensed.toml").write_text(
        f'name = "sensed"\ntransport = "local"\nworkdir = "{tmp_path / "w"}"\n'
        f'[sensors]\nsysfs_root = "{root}"\n'
    )
    suite = tmp_path / "suite.toml"
    suite.write_text("""
devices = ["sensed", "local"]
models = ["builtin:convnet"]
[[probe]]
kind = "bench"
params = { threads = [1, 2], runs = 10, warmup_seconds = 0.0, min_seconds = 0.0 }
""")
    store = tmp_path / "s.db"
    res = subprocess.run(run_argv(suite, lab, store), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT device, warnings FROM jobs ORDER BY id").fetchall()
    notes = {d: [json.loads(w) for dev, w in rows if dev == d] for d in ("sensed", "local")}
    first, second = notes["sensed"]
    assert not any("cool-down" in w for w in first)  # nothing to wait for before the first job
    [guard] = [w for w in second if w.startswith("cool-down guard:")]
    assert "cpu-thermal" in guard and "45.0 °C" in guard
    assert not any("cool-down" in w for job in notes["local"] for w in job)  # this host has no thermal zones


def test_sigterm_marks_the_run_interrupted_and_resume_finishes_it(tmp_path: Path) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text("""
devices = ["local"]
models = ["builtin:convnet"]
[[probe]]
kind = "bench"
params = { threads = 1, runs = 20, warmup_seconds = 0.0, min_seconds = 0.3, seed = [1, 2, 3, 4, 5, 6] }
[policy]
cooldown = false
""")
    store, lab = tmp_path / "s.db", tmp_path / "lab"
    proc = subprocess.Popen(
        run_argv(suite, lab, store), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None and time.monotonic() < deadline
        try:
            with sqlite3.connect(store) as db:
                if db.execute("SELECT COUNT(*) FROM jobs WHERE status='ok'").fetchone()[0] >= 2:
                    break
        except sqlite3.OperationalError:
            pass  # the store is still being created
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("edgebench: error: run ") and "interrupted" in last and "--resume" in last, err
    assert "Traceback" not in err
    with sqlite3.connect(store) as db:
        run_id, status = db.execute("SELECT run_id, status FROM runs").fetchone()
        kept = db.execute("SELECT COUNT(*) FROM jobs WHERE status='ok'").fetchone()[0]
    assert status == "interrupted" and 2 <= kept < 6

    res = subprocess.run(
        run_argv(suite, lab, store, "--resume", run_id), capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "ok"
    assert doc["summary"][0]["skipped"] == kept and doc["summary"][0]["ok"] == 6 - kept

    # The finished run exports whole: JSON, CSV and Parquet hold the same records.
    def results(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "edgebench", "results", "--store", str(store), "--run", run_id, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    exported = json.loads(results("--json").stdout)
    assert len(exported["records"]) == len(doc["records"]) and exported["errors"] == []
    assert len(results("--csv").stdout.strip().splitlines()) == len(doc["records"]) + 1  # + header
    assert results("--parquet", str(tmp_path / "run.parquet")).returncode == 0
    import pandas as pd

    frame = pd.read_parquet(tmp_path / "run.parquet")
    assert len(frame) == len(doc["records"]) and set(frame["run_id"]) == {run_id}
