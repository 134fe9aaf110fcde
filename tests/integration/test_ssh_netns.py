"""A board at its own address behind a network namespace, and what happens when its cable is pulled.

Pulling the cable is not a crash: the board keeps running, its open connections go silent and new ones
find no route. Every call must still end within its timeout with a typed one-line error, the fleet run
must fail only that board's jobs, and once the cable is back the same transport and `--resume` recover.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edgebench.errors import CommandTimeout, ConnectionLost, TransportError
from edgebench.testing.cli import edgebench
from edgebench.testing.sshd import SshBoard
from edgebench.transports.ssh import SshTransport

sys.path.insert(0, str(Path(__file__).parent))
from test_run_fleet import (
    _utc_now,
    assert_complete_once,
    finish,
    ok_jobs,
    wait_until,
    write_suite,
)
from test_run_fleet import edgebench as edgebench_popen

pytestmark = pytest.mark.integration


def test_a_board_at_its_own_address_is_checked_and_benched(net_ssh_board: SshBoard, tmp_path: Path) -> None:
    assert not ipaddress.ip_address(net_ssh_board.address).is_loopback and net_ssh_board.port == 22
    lab = str(net_ssh_board.lab_dir)
    check = edgebench("devices", "--check", "--device", "netboard", "--lab", lab, "--json", cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    [row] = json.loads(check.stdout)["devices"]
    assert row["reachable"] and row["usable"], row
    res = edgebench("bench", "builtin:mlp", "--device", "netboard", "--lab", lab, "--runs", "20",
                    "--min-seconds", "0", "--json", "--store", tmp_path / "r.db", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    records = json.loads(res.stdout)["records"]
    assert {r["device"] for r in records} == {"netboard"}
    assert any(r["metric"] == "latency_ms" and r["value"] > 0 for r in records)


def test_a_pulled_cable_ends_every_call_within_its_timeout_and_replugging_recovers(
    net_ssh_board: SshBoard,
) -> None:
    transport = SshTransport(net_ssh_board.spec())
    try:
        assert transport.run(["echo", "up"], timeout=20).stdout == "up\n"
        outcome: dict[str, Any] = {}

        def long_call() -> None:
            start = time.monotonic()
            try:
                transport.run(["sleep", "30"], timeout=4.0)
            except TransportError as exc:
                outcome["error"] = exc
            outcome["took"] = time.monotonic() - start

        caller = threading.Thread(target=long_call)
        caller.start()
        time.sleep(1.0)
        net_ssh_board.unplug()
        caller.join(timeout=30)
        assert not caller.is_alive(), "a call on an unplugged board never returned"
        assert isinstance(outcome.get("error"), CommandTimeout | ConnectionLost), outcome
        assert outcome["took"] < 4.0 + 3.0, outcome  # the timeout, then at most 2 s trying to kill the call
        assert "netboard" in str(outcome["error"]) and "\n" not in str(outcome["error"])

        # A new connection finds no route, quickly, and says so in one line.
        start = time.monotonic()
        with pytest.raises(TransportError, match="no route to host") as err:
            SshTransport(net_ssh_board.spec(connect_timeout=5.0))
        assert time.monotonic() - start < 5.0 + 1.5 and "\n" not in str(err.value)

        net_ssh_board.replug()
        assert transport.run(["echo", "back"], timeout=30).stdout == "back\n"  # the same transport reconnects
    finally:
        net_ssh_board.replug()
        transport.close()


def test_an_unplugged_board_fails_only_its_jobs_and_resume_finishes_them(
    net_ssh_board: SshBoard, tmp_path: Path
) -> None:
    lab = tmp_path / "lab"
    # Short bounds so the silent board's calls end soon: the job timeout, then a quick "no route" retry.
    net_ssh_board.write_descriptor(lab, timeout=20.0, connect_timeout=3.0)
    devices = ["local", net_ssh_board.name]
    suite = write_suite(tmp_path, devices, runs=300)
    store, locks = tmp_path / "fleet.db", tmp_path / "locks"
    common = ["--lab", str(lab), "--store", str(store), "--lock-dir", str(locks), "--json"]
    jobs_per_device = 4

    proc = edgebench_popen("run", str(suite), *common, cwd=tmp_path)
    try:
        wait_until(lambda: any(d == net_ssh_board.name for _, d, _ in ok_jobs(store)), proc)
        net_ssh_board.unplug()
        rc, doc, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        net_ssh_board.replug()

    assert rc == 1, err
    assert "Traceback" not in err and doc["status"] == "failed"
    summary = {s["device"]: s for s in doc["summary"]}
    assert (summary["local"]["ok"], summary["local"]["failed"]) == (jobs_per_device, 0)
    board_ok = summary[net_ssh_board.name]["ok"]
    assert 1 <= board_ok < jobs_per_device
    assert {e["device"] for e in doc["errors"]} == {net_ssh_board.name}
    run_id = doc["run_id"]
    before = {key for key, _, _ in ok_jobs(store, run_id)}

    resumed_at = _utc_now()
    rc, doc, err = finish(edgebench_popen("run", str(suite), *common, "--resume", run_id, cwd=tmp_path))
    assert rc == 0, err
    assert doc["status"] == "ok" and doc["errors"] == []
    rerun = {key for key, _, started in ok_jobs(store, run_id) if started >= resumed_at}
    assert len(rerun) == jobs_per_device - board_ok and not rerun & before
    assert_complete_once(store, run_id, 2 * jobs_per_device)
