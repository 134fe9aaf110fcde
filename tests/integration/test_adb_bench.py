"""The CLI and Device on an emulated adb phone: bench records, shell syntax in a model path, a corrupted
cached file re-pushed, and a phone that is gone or dies mid-job as one line and exit 3."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebench.descriptors import DeviceSpec
from edgebench.errors import TransferError
from edgebench.lab.device import Device
from edgebench.models.builtin import builtin_model
from edgebench.testing.adblab import free_port
from edgebench.testing.cli import edgebench
from edgebench.testing.pytest_adb import AdbPhoneLab
from edgebench.transports.adb import AdbTransport

pytestmark = pytest.mark.integration

FAST = ["--runs", "40", "--min-seconds", "0", "--warmup", "0", "--timeout", "120"]  # p90 needs 36 samples
# No "/" (it is a host folder name): the canaries land in the device HOME, /data/local/tmp.
NASTY_DIR = "we ird;$(cd;touch pwned)`cd;touch pwned2`'q\" & cd;touch pwned3"


def records_by_metric(stdout: str) -> dict[tuple[str, str | None], float]:
    records = json.loads(stdout)["records"]
    return {(r["metric"], r["params"].get("stat")): r["value"] for r in records}


def assert_bench_records(got: dict[tuple[str, str | None], float]) -> None:
    for stat in ("p50", "p90", "mean", "min", "max"):
        assert got[("latency_ms", stat)] > 0
    for metric in ("load_ms", "first_inference_ms", "peak_rss_mb"):
        assert got[(metric, None)] > 0


def test_bench_on_the_phone_then_a_gone_phone_is_one_line_exit_3(
    adb_phone_module: AdbPhoneLab, tmp_path: Path
) -> None:
    store = tmp_path / "s.db"
    lab = adb_phone_module.lab_dir
    res = edgebench(
        "bench",
        "builtin:mlp",
        "--device",
        "phone",
        "--lab",
        str(lab),
        *FAST,
        "--store",
        str(store),
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert_bench_records(records_by_metric(res.stdout))
    assert {r["device"] for r in json.loads(res.stdout)["records"]} == {"phone"}
    commands = adb_phone_module.phone.status()["commands"]
    assert any(".pyz --task" in c and '"kind":"bench"' in c for c in commands)  # it ran on the phone

    gone_lab = tmp_path / "gone-lab"
    gone_lab.mkdir()
    (gone_lab / "gone.toml").write_text(
        'name = "gone"\ntransport = "adb"\nserial = "127.0.0.1:1"\n'
        f'adb_server = "127.0.0.1:{free_port()}"\npython = "python3"\n'
    )
    start = time.monotonic()
    res = edgebench(
        "bench",
        "builtin:mlp",
        "--device",
        "gone",
        "--lab",
        str(gone_lab),
        *FAST,
        "--store",
        str(store),
        cwd=tmp_path,
    )
    assert res.returncode == 3 and time.monotonic() - start < 60
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and "bench mlp on gone" not in ln]
    assert len(lines) == 1 and "gone" in lines[0] and "not reachable" in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    with sqlite3.connect(store) as db:  # the earlier results are still there
        assert db.execute("SELECT COUNT(*) FROM records WHERE device='phone'").fetchone()[0] > 0


def test_model_path_full_of_shell_syntax_runs_nothing_on_the_phone(
    adb_phone_module: AdbPhoneLab, tmp_path: Path
) -> None:
    folder = tmp_path / NASTY_DIR
    folder.mkdir()
    model = folder / "m o;d$(reboot)el 'x'.onnx"
    shutil.copyfile(builtin_model("mlp"), model)
    res = edgebench(
        "bench",
        str(model),
        "--device",
        "phone",
        "--lab",
        str(adb_phone_module.lab_dir),
        *FAST,
        "--no-store",
        "--json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert_bench_records(records_by_metric(res.stdout))
    phone = adb_phone_module.phone
    assert not phone.host_path("/data/local/tmp/pwned").exists()
    assert not phone.host_path("/data/local/tmp/pwned2").exists()
    assert not phone.host_path("/data/local/tmp/pwned3").exists()
    assert not phone.status()["rebooting"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_corrupted_cached_file_on_the_phone_is_detected_and_re_pushed(
    adb_phone: AdbPhoneLab, tmp_path: Path
) -> None:
    model = tmp_path / "weights.onnx"
    model.write_bytes(os.urandom(400_000))
    spec = adb_phone.spec()
    with Device(spec) as first:
        [remote] = first.ensure_files([model], timeout=30)
        assert first.stats.pushed_bytes == model.stat().st_size
    cached = adb_phone.phone.host_path(remote)
    assert _sha256(cached) == _sha256(model)
    with cached.open("r+b") as fh:  # a flipped byte in flash (read, then write back at the same offset)
        fh.seek(1000)
        flipped = fh.read(1)[0] ^ 0xFF
        fh.seek(1000)
        fh.write(bytes([flipped]))
    assert _sha256(cached) != _sha256(model)
    with Device(spec) as second:
        assert second.ensure_files([model], timeout=30) == [remote]
        assert second.stats.pushed_bytes == model.stat().st_size  # detected by hash, pushed again
    assert _sha256(cached) == _sha256(model)
    with Device(spec) as third:
        third.ensure_files([model], timeout=30)
        assert third.stats.pushed_bytes == 0 and third.stats.skipped == 1


class CorruptingAdb(AdbTransport):
    """A real adb transport whose every push lands damaged (a bad cable that never heals)."""

    def push(self, local: Path, remote: str, *, timeout: float) -> None:
        super().push(local, remote, timeout=timeout)
        self.run(["sh", "-c", 'printf garbage >> "$1"', "sh", remote], timeout=10).check()


def test_a_file_that_never_arrives_intact_is_a_clear_transfer_error(
    adb_phone: AdbPhoneLab, tmp_path: Path
) -> None:
    model = tmp_path / "w.onnx"
    model.write_bytes(os.urandom(10_000))
    spec: DeviceSpec = adb_phone.spec()
    with Device(spec, CorruptingAdb(spec)) as dev, pytest.raises(TransferError, match="does not match"):
        dev.ensure_files([model], timeout=30)


def test_phone_killed_during_a_bench_fails_the_job_in_time(adb_phone: AdbPhoneLab, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgebench",
            "bench",
            "builtin:mlp",
            "--device",
            "phone",
            "--lab",
            str(adb_phone.lab_dir),
            "--runs",
            "100000",
            "--min-seconds",
            "60",
            "--max-seconds",
            "120",
            "--timeout",
            "120",
            "--no-store",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the agent's bench is running on the phone
            if any('"kind":"bench"' in c for c in adb_phone.phone.status()["commands"]):
                break
            time.sleep(0.1)
        time.sleep(0.5)
        adb_phone.phone.kill()
        killed = time.monotonic()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert time.monotonic() - killed < 30
    assert proc.returncode == 3, err
    assert "connection to the device lost" in err and "Traceback" not in err
