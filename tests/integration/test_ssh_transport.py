"""SshTransport against a real OpenSSH sshd on loopback: commands, streams, timeouts, transfers, faults."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil
import pytest

from edgebench.errors import CommandTimeout, ConnectionLost, TransferError, TransportError
from edgebench.testing.sshd import SshBoard, cgroup_v2_cpu_root
from edgebench.transports.ssh import SshTransport

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ssh(ssh_board: SshBoard):  # type: ignore[no-untyped-def]
    transport = SshTransport(ssh_board.spec())
    yield transport
    transport.close()


def test_exit_codes_streams_and_argv_survive_exactly(ssh: SshTransport) -> None:
    res = ssh.run(["printf", "%s|", "two words", "it's", '"q"', "$HOME", "a\nb"], timeout=20)
    assert (res.returncode, res.stdout, res.stderr) == (0, 'two words|it\'s|"q"|$HOME|a\nb|', "")
    res = ssh.run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=20)
    assert (res.returncode, res.stdout, res.stderr) == (7, "out\n", "err\n")
    assert res.argv == ("sh", "-c", "echo out; echo err >&2; exit 7")
    missing = ssh.run(["no-such-command-edgebench"], timeout=20)
    assert missing.returncode == 127 and "not found" in missing.stderr


def test_env_values_are_quoted(ssh: SshTransport) -> None:
    res = ssh.run(["sh", "-c", 'printf %s "$EB_X"'], timeout=20, env={"EB_X": "a b;$(id)`id`'\""})
    assert res.stdout == "a b;$(id)`id`'\""


def test_large_stdout_and_stderr_together_do_not_hang(ssh: SshTransport, ssh_board: SshBoard) -> None:
    # 6 MB on each stream, interleaved: whichever window fills first would stall an undrained channel.
    script = (
        "import sys\nfor i in range(96):\n"
        "    sys.stdout.write('o' * 65536); sys.stderr.write('e' * 65536)\n"
        "sys.stdout.flush(); sys.stderr.flush()\n"
    )
    start = time.monotonic()
    res = ssh.run([ssh_board.spec().python, "-c", script], timeout=60)
    assert res.returncode == 0
    assert len(res.stdout) == len(res.stderr) == 96 * 65536
    assert set(res.stdout) == {"o"} and set(res.stderr) == {"e"}
    assert time.monotonic() - start < 60


def test_timeout_raises_and_kills_the_remote_process(ssh: SshTransport, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    start = time.monotonic()
    with pytest.raises(CommandTimeout) as err:
        ssh.run(
            ["sh", "-c", 'echo $$ > "$1"; sleep 1; echo partial; sleep 60', "sh", str(pidfile)], timeout=2.0
        )
    assert time.monotonic() - start < 10
    assert err.value.timeout == 2.0 and err.value.argv[0] == "sh" and err.value.device == "board"
    assert "partial" in err.value.output
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the timed-out command is still running on the board"
        time.sleep(0.1)
    assert ssh.run(["true"], timeout=20).returncode == 0  # the connection is still good


def test_push_pull_read_text(ssh: SshTransport, tmp_path: Path) -> None:
    local = tmp_path / "blob.bin"
    local.write_bytes(os.urandom(3_000_000))
    remote = tmp_path / "remote dir" / "deeper" / "blob copy.bin"
    ssh.push(local, str(remote), timeout=30)
    assert remote.read_bytes() == local.read_bytes()
    assert not [p for p in remote.parent.iterdir() if p.name != remote.name]  # no temp file left
    ssh.push(local, str(remote), timeout=30)  # overwrite in place
    back = tmp_path / "back.bin"
    ssh.pull(str(remote), back, timeout=30)
    assert back.read_bytes() == local.read_bytes()
    (tmp_path / "note.txt").write_text("héllo\nboard\n")
    assert ssh.read_text(str(tmp_path / "note.txt"), timeout=10) == "héllo\nboard\n"
    assert ssh.read_text("/proc/self/status", timeout=10).startswith("Name:")  # size-less proc files


def test_missing_files_are_typed_transfer_errors(ssh: SshTransport, tmp_path: Path) -> None:
    with pytest.raises(TransferError, match="no such file"):
        ssh.read_text(str(tmp_path / "absent"), timeout=10)
    with pytest.raises(TransferError, match="no such file"):
        ssh.pull(str(tmp_path / "absent"), tmp_path / "x", timeout=10)
    with pytest.raises(TransferError, match="no such local file"):
        ssh.push(tmp_path / "absent", str(tmp_path / "y"), timeout=10)
    assert not (tmp_path / "x").exists()


def test_reconnects_lazily_after_the_board_restarts(fresh_ssh_board: SshBoard) -> None:
    transport = SshTransport(fresh_ssh_board.spec())
    try:
        assert transport.run(["echo", "one"], timeout=20).stdout == "one\n"
        fresh_ssh_board.kill()
        fresh_ssh_board.restart()
        assert transport.run(["echo", "two"], timeout=20).stdout == "two\n"
        fresh_ssh_board.kill()
        fresh_ssh_board.restart()
        assert transport.read_text("/proc/version", timeout=20).startswith("Linux")
    finally:
        transport.close()


def test_board_killed_mid_command_raises_a_typed_error_quickly(fresh_ssh_board: SshBoard) -> None:
    transport = SshTransport(fresh_ssh_board.spec())
    killer = threading.Timer(1.0, fresh_ssh_board.kill)
    killer.start()
    start = time.monotonic()
    try:
        with pytest.raises(ConnectionLost) as err:
            transport.run(["sh", "-c", "echo started; sleep 60"], timeout=30)
        elapsed = time.monotonic() - start
        assert elapsed < 10, f"took {elapsed:.1f} s to notice the board died"
        assert err.value.device == fresh_ssh_board.name and err.value.argv[0] == "sh"
        assert "started" in err.value.stdout and "lost" in str(err.value)
        # The board stays down: the next call fails fast and typed, no hang.
        start = time.monotonic()
        with pytest.raises(TransportError, match="cannot connect"):
            transport.run(["true"], timeout=30)
        assert time.monotonic() - start < 10
    finally:
        killer.cancel()
        transport.close()


def test_unreachable_board_is_one_line(fresh_ssh_board: SshBoard) -> None:
    spec = fresh_ssh_board.spec()
    fresh_ssh_board.stop()
    start = time.monotonic()
    with pytest.raises(TransportError) as err:
        SshTransport(spec)
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "\n" not in message and "cannot connect" in message and str(fresh_ssh_board.port) in message


def test_frozen_board_every_call_ends_at_its_timeout(fresh_ssh_board: SshBoard, tmp_path: Path) -> None:
    """A hung board keeps its TCP connection open and silent: only our own bounds can end the calls."""
    transport = SshTransport(fresh_ssh_board.spec())
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(24_000_000))  # far more than the channel window and socket buffers
    transport.run(["true"], timeout=20)
    transport.read_text("/proc/version", timeout=20)  # an SFTP session is open: the push hits the watchdog
    fresh_ssh_board.freeze()
    try:
        # run: no channel opens; read_text: the SFTP call's deadline closes its channel (not the connection);
        # push: no new SFTP session opens.
        calls = [
            ("run", lambda: transport.run(["echo", "hi"], timeout=2.0)),
            ("read_text", lambda: transport.read_text("/proc/version", timeout=2.0)),
            ("push", lambda: transport.push(big, str(tmp_path / "remote.bin"), timeout=2.0)),
        ]
        for what, call in calls:
            start = time.monotonic()
            with pytest.raises(TransportError) as err:
                call()
            elapsed = time.monotonic() - start
            assert elapsed < 2.0 + 1.5, f"{what} on a frozen board took {elapsed:.1f} s (timeout 2 s)"
            assert isinstance(err.value, CommandTimeout), err.value
        fresh_ssh_board.thaw()
        assert transport.run(["echo", "back"], timeout=20).stdout == "back\n"  # and it recovers
    finally:
        fresh_ssh_board.thaw()
        transport.close()


def test_slow_board_runs_its_sessions_under_a_cpu_quota(slow_ssh_board: SshBoard) -> None:
    transport = SshTransport(slow_ssh_board.spec())
    try:
        groups = transport.run(["cat", "/proc/self/cgroup"], timeout=20).stdout
    finally:
        transport.close()
    v1 = [ln for ln in groups.splitlines() if ln.split(":")[1].split(",").count("cpu")]
    if v1:  # cgroup v1: the cpu controller's own hierarchy
        group = Path("/sys/fs/cgroup/cpu") / v1[0].split(":", 2)[2].lstrip("/")
        quota, period = (int((group / n).read_text()) for n in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
    else:  # cgroup v2: the unified hierarchy's "0::/path" line, the quota in cpu.max
        [line] = [ln for ln in groups.splitlines() if ln.startswith("0::")]
        root = cgroup_v2_cpu_root()
        assert root is not None
        group = root / line.split(":", 2)[2].lstrip("/")
        quota, period = (int(v) for v in (group / "cpu.max").read_text().split())
    assert group.name.startswith("edgebench-slowboard-")
    assert quota == period // 2
