"""A hung board costs one timeout: a real ssh board frozen (SIGSTOP on sshd and its sessions) mid-run times
out the job in flight; the session then finds the board does not answer a trivial command on a fresh
connection and gives it up at once, instead of timing out each of the next `quarantine_after` jobs. And
`--timeout` covers the board's health check: a bench on a board whose agent never answers ends within about
the timeout, not the 120 s the health check used to allow."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cli_procs import board_suite, start, store_rows

pytestmark = pytest.mark.integration

TIMEOUT_S = 20.0
SUITE = f"""
name = "hung"
devices = ["board"]
models = ["builtin:convnet"]
timeout = {TIMEOUT_S}
[[probe]]
kind = "bench"
params = {{ threads = [1, 2], runs = 20, warmup = 1, warmup_seconds = 0.0, min_seconds = [2.0, 2.5, 3.0] }}
[policy]
cooldown = false
retries = 1
backoff = 0.2
quarantine_after = 3
"""


def jobs(store: Path) -> list[tuple[str, str | None]]:
    return store_rows(store, "SELECT status, error FROM jobs ORDER BY id")


def test_a_board_that_hangs_mid_run_is_given_up_after_one_timeout(
    fresh_ssh_board: Any, tmp_path: Path
) -> None:
    lab, suite = board_suite(fresh_ssh_board, tmp_path, SUITE)
    store = tmp_path / "s.db"
    proc = start("run", suite, "--lab", lab, "--store", store, "--json", "--lock-dir", tmp_path / "locks",
                 cwd=tmp_path)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(status == "ok" for status, _ in jobs(store)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.1)
        time.sleep(0.5)  # the next job is under way on the board
        fresh_ssh_board.freeze()
        frozen = time.monotonic()
        out, err = proc.communicate(timeout=6 * TIMEOUT_S)
        took = time.monotonic() - frozen
    finally:
        fresh_ssh_board.thaw()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1 and "Traceback" not in err, err
    doc = json.loads(out)
    [summary] = doc["summary"]
    assert summary["state"] == "quarantined" and "does not answer after a timeout" in summary["error"]
    failed = [error for status, error in jobs(store) if status == "error"]
    assert len(failed) == 6 - summary["ok"] and failed
    assert "timed out" in failed[0] and all("job not run" in e for e in failed[1:])  # one timeout, no more
    assert took < 2 * TIMEOUT_S, f"{took:.0f} s after the freeze: more than one timeout"


def test_bench_timeout_covers_the_health_check_of_a_board_whose_agent_hangs(
    fresh_ssh_board: Any, tmp_path: Path
) -> None:
    # The board answers ssh, but its interpreter never returns: the fingerprint (the agent's info task)
    # used to be bounded by 120 s whatever --timeout said.
    hang = tmp_path / "python-that-hangs"
    hang.write_text("#!/bin/sh\nexec sleep 600\n")
    hang.chmod(0o755)
    lab = tmp_path / "lab"
    fresh_ssh_board.write_descriptor(lab, name="board", python=str(hang))
    start_s = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "edgebench", "bench", "builtin:mlp", "--device", "board", "--lab", str(lab),
         "--timeout", "5", "--store", str(tmp_path / "s.db"), "--lock-dir", str(tmp_path / "locks")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    took = time.monotonic() - start_s
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
    [line] = [ln for ln in res.stderr.splitlines() if ln.startswith("edgebench: error:")]
    assert "board" in line and "timed out after 5 s" in line
    assert took < 3 * 5, f"--timeout 5 took {took:.1f} s"
