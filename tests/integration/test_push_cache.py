"""Content-addressed, verified pushes (Device.ensure_files) on a real ssh board."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgebench.errors import TransferError
from edgebench.lab.device import Device
from edgebench.testing.sshd import SshBoard
from edgebench.transports.ssh import SshTransport

pytestmark = pytest.mark.integration

FAST = ["--runs", "5", "--min-seconds", "0", "--warmup", "0", "--timeout", "120"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def payload(tmp_path: Path, name: str = "weights.onnx", size: int = 300_000) -> Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(size))
    return path


def own_workdir_spec(board: SshBoard, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The shared board, with a workdir of this test's own so cache states do not leak between tests."""
    workdir = tmp_path / "board-workdir"
    return board.spec(workdir=str(workdir)), workdir


class CorruptingSsh(SshTransport):
    """A real ssh transport whose pushes land damaged on the board (a flaky link, a bad flash sector)."""

    def __init__(self, spec, bad_pushes: int) -> None:  # type: ignore[no-untyped-def]
        super().__init__(spec)
        self.bad_pushes = bad_pushes
        self.pushes = 0

    def push(self, local: Path, remote: str, *, timeout: float) -> None:
        super().push(local, remote, timeout=timeout)
        self.pushes += 1
        if self.pushes <= self.bad_pushes:
            self.run(["sh", "-c", 'printf garbage >> "$1"', "sh", remote], timeout=10).check()


def test_present_file_is_skipped_and_verified_by_hash(ssh_board: SshBoard, tmp_path: Path) -> None:
    spec, workdir = own_workdir_spec(ssh_board, tmp_path)
    local = payload(tmp_path)
    with Device(spec) as first:
        [remote] = first.ensure_files([local], timeout=30)
        assert first.stats.pushed_bytes == local.stat().st_size
        assert first.ensure_files([local], timeout=30) == [remote]  # same session: no second push
        assert first.stats.pushed_bytes == local.stat().st_size
    assert remote == f"{workdir}/cache/{sha256(local)}.onnx"
    assert sha256(Path(remote)) == sha256(local)
    assert not [p for p in Path(remote).parent.iterdir() if ".part" in p.name]  # temp names renamed away
    with Device(spec) as second:  # a new session asks the board, finds the file, pushes nothing
        assert second.ensure_files([local], timeout=30) == [remote]
        assert second.stats.pushed_bytes == 0 and second.stats.skipped == 1 and second.stats.verified == 1


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "delete"])
def test_damaged_cached_file_is_detected_and_repushed(
    ssh_board: SshBoard, tmp_path: Path, damage: str
) -> None:
    spec, _ = own_workdir_spec(ssh_board, tmp_path)
    local = payload(tmp_path)
    with Device(spec) as device:
        [remote] = device.ensure_files([local], timeout=30)
    cached = Path(remote)
    if damage == "corrupt":  # same size, one flipped byte: only the hash can tell
        data = bytearray(cached.read_bytes())
        data[len(data) // 2] ^= 0xFF
        cached.write_bytes(bytes(data))
    elif damage == "truncate":
        cached.write_bytes(cached.read_bytes()[:1000])
    else:
        cached.unlink()
    with Device(spec) as device:
        assert device.ensure_files([local], timeout=30) == [remote]
        assert device.stats.pushed_bytes == local.stat().st_size  # re-pushed, once
    assert sha256(cached) == sha256(local)


def test_push_damaged_in_flight_is_repushed_once(ssh_board: SshBoard, tmp_path: Path) -> None:
    spec, _ = own_workdir_spec(ssh_board, tmp_path)
    local = payload(tmp_path)
    transport = CorruptingSsh(spec, bad_pushes=1)
    with Device(spec, transport) as device:
        [remote] = device.ensure_files([local], timeout=30)
    assert transport.pushes == 2
    assert sha256(Path(remote)) == sha256(local)


def test_push_that_never_verifies_is_a_clear_transfer_error(ssh_board: SshBoard, tmp_path: Path) -> None:
    spec, _ = own_workdir_spec(ssh_board, tmp_path)
    local = payload(tmp_path)
    transport = CorruptingSsh(spec, bad_pushes=99)
    with Device(spec, transport) as device, pytest.raises(TransferError) as err:
        device.ensure_files([local], timeout=30)
    assert transport.pushes == 2  # one push and exactly one re-push
    message = str(err.value)
    assert "\n" not in message and "weights.onnx" in message and "does not match" in message
    assert message.startswith(f"{spec.name}: ")


def test_file_names_with_shell_syntax_and_newlines_cache_cleanly(ssh_board: SshBoard, tmp_path: Path) -> None:
    spec, _ = own_workdir_spec(ssh_board, tmp_path)
    local = payload(tmp_path, name="in puts;$(id).n\npz", size=5000)
    with Device(spec) as device:
        [remote] = device.ensure_files([local], timeout=30)
        assert Path(remote).name == sha256(local)  # an odd suffix is dropped, not carried to the board
        assert sha256(Path(remote)) == sha256(local)
    with Device(spec) as device:
        device.ensure_files([local], timeout=30)
        assert device.stats.pushed_bytes == 0


def test_cli_bench_repairs_a_corrupted_cached_model(ssh_board: SshBoard, tmp_path: Path) -> None:
    spec, workdir = own_workdir_spec(ssh_board, tmp_path)
    lab = tmp_path / "lab"
    ssh_board.write_descriptor(lab, workdir=str(workdir))
    from edgebench.models.builtin import builtin_model

    model = builtin_model("mlp")
    cmd = [
        sys.executable,
        "-m",
        "edgebench",
        "bench",
        str(model),
        "--device",
        ssh_board.name,
        "--lab",
        str(lab),
        *FAST,
        "--no-store",
        "--json",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    cached = workdir / "cache" / f"{sha256(model)}.onnx"
    cached.write_bytes(b"\x08\x07not a model any more" + cached.read_bytes()[40:])
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # the damaged copy was found by hash and replaced
    assert sha256(cached) == sha256(model)
