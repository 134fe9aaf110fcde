"""Resume across checkouts, with provenance, never beside a live controller, and honest about changed
models, through the real CLI on the host:

- a second `run --resume` while the run's controller is alive is refused (exit 2) and measures nothing;
- after the controller is killed (-9), the same suite resumed from another checkout (another folder, same
  relative models) skips the done jobs and completes exactly the missing ones;
- each resume is recorded in the run's provenance (where, which controller, how many jobs were done);
- a model rebuilt under the same name is re-measured on the next resume, and flagged.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cli_procs import start as cli
from test_run_fleet import assert_complete_once, matmul_model

pytestmark = pytest.mark.integration

SUITE = """
name = "moving"
devices = ["local"]
models = ["models/small.onnx", {name = "wide", path = "models/wide.onnx"}]
[[probe]]
kind = "bench"
params = { threads = [1, 2], runs = 20, warmup = 1, warmup_seconds = 0.0, min_seconds = 1.5 }
[policy]
cooldown = false
"""


def ok_keys(store: Path) -> list[str]:
    try:
        with sqlite3.connect(store, timeout=5) as db:
            return [k for (k,) in db.execute("SELECT job_key FROM jobs WHERE status='ok'")]
    except sqlite3.OperationalError:
        return []


def test_resume_from_another_checkout_with_provenance_and_changed_models(tmp_path: Path) -> None:
    one = tmp_path / "checkout-one"
    (one / "models").mkdir(parents=True)
    matmul_model(one / "models" / "small.onnx", 64, 1)
    matmul_model(one / "models" / "wide.onnx", 256, 2)
    (one / "suite.toml").write_text(SUITE)
    store = tmp_path / "lab.db"
    env = {"EDGEBENCH_LOCK_DIR": str(tmp_path / "locks")}

    first = cli("run", one / "suite.toml", "--store", store, "--json", cwd=one, env=env)
    deadline = time.monotonic() + 120
    while len(ok_keys(store)) < 1:
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1]
        time.sleep(0.1)
    with sqlite3.connect(store) as db:
        [(run_id,)] = db.execute("SELECT run_id FROM runs").fetchall()

    # Frozen, not dead: the controller stays alive for the early resume but stores nothing more while it
    # runs, so a slow start of that resume (a crowded host) cannot find the run already finished.
    first.send_signal(signal.SIGSTOP)
    early = cli("run", one / "suite.toml", "--store", store, "--resume", run_id, cwd=one, env=env)
    _, err = early.communicate(timeout=120)
    assert early.returncode == 2, err
    assert f"run {run_id} is still running (controller pid {first.pid} on" in err.strip().splitlines()[-1]
    os.kill(first.pid, signal.SIGKILL)
    first.communicate()
    done = set(ok_keys(store))
    assert 1 <= len(done) < 4

    two = tmp_path / "elsewhere" / "checkout-two"
    shutil.copytree(one, two)
    resumed = cli("run", two / "suite.toml", "--store", store, "--resume", run_id, "--json", cwd=two, env=env)
    out, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err
    [summary] = json.loads(out)["summary"]
    assert summary["skipped"] == len(done) and summary["ok"] == 4 - len(done)
    assert_complete_once(store, run_id, 4)

    matmul_model(two / "models" / "wide.onnx", 256, 3)  # a new build of `wide`, same name
    again = cli("run", two / "suite.toml", "--store", store, "--resume", run_id, "--json", cwd=two, env=env)
    out, err = again.communicate(timeout=240)
    assert again.returncode == 0, err
    [summary] = json.loads(out)["summary"]
    assert (summary["skipped"], summary["ok"]) == (2, 2)  # only wide's two jobs measured again
    assert f"model 'wide' changed since run {run_id} measured it: re-measured" in err
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT model, warnings FROM jobs WHERE run_id=? ORDER BY id", (run_id,)).fetchall()
        provenance = json.loads(db.execute("SELECT provenance FROM runs").fetchone()[0])
    flagged = [m for m, w in rows if "changed since run" in w]
    assert flagged == ["wide", "wide"]

    r1, r2 = provenance["resumes"]
    assert provenance["controller"]["pid"] == first.pid
    assert r1["controller"]["pid"] == resumed.pid and r2["controller"]["pid"] == again.pid
    assert r1["suite_path"] == str((two / "suite.toml").resolve()) and r1["done_jobs"] == len(done)
    assert r2["done_jobs"] == 4 and r2["remeasured_for_changed_models"] == 2
    assert r2["models"]["wide"] != r1["models"]["wide"] and r2["models"]["small"] == r1["models"]["small"]
    assert "--resume" in r1["argv"] and r1["at"]
