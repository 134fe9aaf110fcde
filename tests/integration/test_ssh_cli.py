"""The CLI on a real ssh board: bench records, devices --check, and no key material anywhere."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebench.testing.cli import edgebench
from edgebench.testing.sshd import SshBoard

pytestmark = pytest.mark.integration

FAST = ["--runs", "40", "--min-seconds", "0", "--warmup", "1", "--timeout", "120"]  # p90 needs 36 samples
PASSPHRASE = "correct horse battery staple 42"


def secrets_of(board: SshBoard) -> list[str]:
    """The private key text, each line of its body, and the passphrase: none may appear anywhere."""
    text = board.private_key_text()
    body = [ln for ln in text.splitlines() if ln and not ln.startswith("-----")]
    return [text.strip(), *body, *([board.passphrase] if board.passphrase else [])]


def store_bytes(store: Path) -> bytes:
    """Every byte the store wrote: the db, its -wal and -shm, and the model copies under <store>.models/."""
    files = [p for p in sorted(store.parent.glob(store.name + "*")) if p.is_file()]
    files += [p for p in sorted(store.parent.glob(store.name + ".models/**/*")) if p.is_file()]
    return b"".join(p.read_bytes() for p in files)


def assert_no_secrets(board: SshBoard, blobs: list[str | bytes]) -> None:
    for secret in secrets_of(board):
        for blob in blobs:
            data = blob if isinstance(blob, bytes) else blob.encode()
            assert secret.encode() not in data, "key material or passphrase leaked"


def test_bench_on_the_board_records_latency_load_first_and_peak(ssh_board: SshBoard, tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    res = edgebench(
        "bench",
        "builtin:mlp",
        "--device",
        "board",
        "--lab",
        str(ssh_board.lab_dir),
        *FAST,
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
    for metric in ("load_ms", "first_inference_ms", "peak_rss_mb"):
        assert got[(metric, None)] > 0
    assert {r["device"] for r in records} == {"board"} and {r["model"] for r in records} == {"mlp"}
    with sqlite3.connect(store) as db:
        assert db.execute("SELECT COUNT(*) FROM records WHERE device='board'").fetchone()[0] == len(records)
    assert_no_secrets(ssh_board, [res.stdout, res.stderr, store_bytes(store)])


def test_encrypted_key_passphrase_and_key_never_leak(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    from edgebench.testing.pytest_ssh import require_sshd

    require_sshd()
    board = SshBoard(tmp_path_factory.mktemp("ssh-locked"), "locked", passphrase=PASSPHRASE).start()
    try:
        lab, store = str(board.lab_dir), tmp_path / "s.db"
        outputs: list[str | bytes] = []
        no_pass = edgebench(
            "bench",
            "builtin:mlp",
            "--device",
            "locked",
            "--lab",
            lab,
            "--store",
            str(store),
            cwd=tmp_path,
            env={"EDGEBENCH_SSH_PASSPHRASE": ""},
        )
        assert no_pass.returncode == 2 and "encrypted" in no_pass.stderr and "Traceback" not in no_pass.stderr
        wrong = edgebench(
            "devices",
            "--check",
            "--lab",
            lab,
            "--json",
            cwd=tmp_path,
            env={"EDGEBENCH_SSH_PASSPHRASE": "not it"},
        )
        assert wrong.returncode == 3
        locked = next(d for d in json.loads(wrong.stdout)["devices"] if d["name"] == "locked")
        assert not locked["reachable"] and "passphrase is wrong" in locked["error"]
        env = {"EDGEBENCH_SSH_PASSPHRASE": PASSPHRASE}
        ok = edgebench(
            "bench",
            "builtin:mlp",
            "--device",
            "locked",
            "--lab",
            lab,
            *FAST,
            "--store",
            str(store),
            "--json",
            cwd=tmp_path,
            env=env,
        )
        assert ok.returncode == 0, ok.stderr
        check = edgebench(
            "devices", "--check", "--device", "locked", "--lab", lab, "--json", cwd=tmp_path, env=env
        )
        assert check.returncode == 0, check.stderr
        results = edgebench("results", "--store", str(store), "--all", "--json", cwd=tmp_path)
        for res in (no_pass, wrong, ok, check, results):
            outputs += [res.stdout, res.stderr]
        outputs.append(store_bytes(store))
        assert_no_secrets(board, outputs)
    finally:
        board.stop()


def test_devices_check_reports_facts_and_exits_3_naming_the_unreachable(
    ssh_board: SshBoard, tmp_path: Path
) -> None:
    lab = tmp_path / "lab"
    ssh_board.write_descriptor(lab)
    dead = ssh_board.write_descriptor(lab, name="deadboard", port=1, connect_timeout=3.0)
    assert dead.exists()
    res = edgebench("devices", "--check", "--lab", str(lab), "--json", cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    doc = json.loads(res.stdout)
    by_name = {d["name"]: d for d in doc["devices"]}
    assert set(by_name) == {"board", "deadboard", "local"} and doc["ok"] is False
    board = by_name["board"]
    assert board["reachable"] and board["usable"] and board["status"] == "ok"
    assert board["arch"] and board["cores"] >= 1 and board["memory_mb"] > 0
    assert board["kernel"].startswith("Linux")
    assert board["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert board["runtimes"]["onnxruntime"] and set(board["sensors"]) >= {"thermal_zones", "cpufreq"}
    dead_row = by_name["deadboard"]
    assert not dead_row["reachable"] and "connection refused" in dead_row["error"]
    table = edgebench("devices", "--check", "--lab", str(lab), cwd=tmp_path)
    assert table.returncode == 3 and "Traceback" not in table.stderr
    assert "unreachable" in table.stdout
    [reason] = [ln for ln in table.stderr.splitlines() if "deadboard" in ln]
    assert "unreachable: cannot connect to" in reason and "127.0.0.1:1" in reason
    only_board = edgebench("devices", "--check", "--device", "board", "--lab", str(lab), cwd=tmp_path)
    assert only_board.returncode == 0, only_board.stderr
    unknown = edgebench("devices", "--check", "--device", "nosuch", "--lab", str(lab), cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown device 'nosuch'" in unknown.stderr


def test_board_dying_mid_bench_is_one_line_exit_3_without_a_hang(
    fresh_ssh_board: SshBoard, tmp_path: Path
) -> None:
    import psutil

    def agent_measuring() -> bool:
        for pid in fresh_ssh_board.session_pids():
            try:
                if '"kind":"bench"' in " ".join(psutil.Process(pid).cmdline()):
                    return True
            except psutil.NoSuchProcess:
                pass
        return False

    cmd = [
        sys.executable,
        "-m",
        "edgebench",
        "bench",
        "builtin:mlp",
        "--device",
        fresh_ssh_board.name,
        "--lab",
        str(fresh_ssh_board.lab_dir),
        "--runs",
        "1000000",
        "--min-seconds",
        "60",
        "--max-seconds",
        "120",
        "--timeout",
        "90",
        "--store",
        str(tmp_path / "s.db"),
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not agent_measuring():
            assert proc.poll() is None and time.monotonic() < deadline, "the bench never started measuring"
            time.sleep(0.1)
        fresh_ssh_board.kill()  # power cut: sshd and the agent die together
        killed = time.monotonic()
        out, err = proc.communicate(timeout=60)
        noticed = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert noticed < 15, f"the CLI took {noticed:.1f} s to notice the board died"
    assert proc.returncode == 3 and "Traceback" not in err, err
    [line] = [ln for ln in err.splitlines() if ln.startswith("edgebench: error:")]
    assert "lost" in line and fresh_ssh_board.name in line
    with sqlite3.connect(tmp_path / "s.db") as db:  # the failed job is kept as data
        [(error,)] = db.execute("SELECT error FROM jobs").fetchall()
    assert "lost" in error


def test_devices_check_flags_a_reachable_board_whose_interpreter_is_missing(
    ssh_board: SshBoard, tmp_path: Path
) -> None:
    lab = tmp_path / "lab"
    ssh_board.write_descriptor(lab, name="nopython", python="/nonexistent/python3")
    res = edgebench("devices", "--check", "--device", "nopython", "--lab", str(lab), "--json", cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    [row] = json.loads(res.stdout)["devices"]
    assert row["reachable"] and not row["usable"]
    assert row["status"].startswith("not usable: interpreter '/nonexistent/python3' not found")
    assert row["arch"] and row["kernel"] and row["cores"]  # the shell still told us what the board is
