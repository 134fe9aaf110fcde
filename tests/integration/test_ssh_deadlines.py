"""Real OpenSSH boards that misbehave: every call ends in a typed one-line error within its timeout plus a
few seconds, and nothing of the call is left running on the board (checked with the board's own `ps`).

The faults: a board that opens a session and then never answers the exec (or SFTP subsystem) request, a
board frozen mid-command (SIGSTOP of sshd and its sessions), a board whose cable is pulled (its network
namespace's link down), a controller killed with SIGKILL mid-job. How long each took is printed (run with
-s to see the figures)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgebench.errors import CommandTimeout, ConnectionLost, HostKeyError, TransportError
from edgebench.testing.sshd import SshBoard, generate_key
from edgebench.transports.ssh import SshTransport

pytestmark = pytest.mark.integration

SLACK_S = 3.0  # "a few seconds" past a call's timeout: the kill of what it left, then the error
# A frozen or unplugged board stays so this long after the error: longer than any kill attempt the
# transport could still have running in the background, so only the board itself can end the call.
HELD_S = 8.0


def unique() -> str:
    """A number no other process on this host has in its command line."""
    return f"{os.getpid() % 1000}{time.monotonic_ns() % 1_000_000:06d}"


def on_board(board: SshBoard, marker: str) -> list[str]:
    """Command lines of the board's processes that carry `marker`, from `ps` on the board itself."""
    probe = SshTransport(board.spec())
    try:
        res = probe.run(["ps", "-eo", "stat=,args="], timeout=30)
    finally:
        probe.close()
    return [line for line in res.stdout.splitlines() if marker in line and not line.lstrip().startswith("Z")]


def wait_gone(board: SshBoard, marker: str, limit: float) -> float:
    """Seconds until nothing on the board carries `marker` (fails after `limit`)."""
    start = time.monotonic()
    while left := on_board(board, marker):
        assert time.monotonic() - start < limit, f"still running on the board after {limit} s: {left}"
        time.sleep(0.2)
    return time.monotonic() - start


def timed(call: Callable[[], Any], limit: float) -> tuple[BaseException | None, float]:
    """Run `call` in a thread; (what it raised, seconds). Fails if it has not returned after `limit`
    (so a call that hangs, as on the code before deadlines held, fails the test instead of hanging it)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        start = time.monotonic()
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome["error"] = exc
        outcome["took"] = time.monotonic() - start

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(limit)
    assert not worker.is_alive(), f"the call did not return within {limit} s"
    return outcome.get("error"), outcome["took"]


def report(what: str, seconds: float) -> None:
    print(f"\n[figure] {what}: {seconds:.2f} s", file=sys.stderr)


def one_line_naming(error: BaseException | None, device: str) -> str:
    text = str(error)
    assert error is not None and "\n" not in text and text.startswith(f"{device}: "), text
    return text


@pytest.fixture
def transport(fresh_ssh_board: SshBoard) -> Iterator[SshTransport]:
    t = SshTransport(fresh_ssh_board.spec())
    yield t
    fresh_ssh_board.thaw()
    t.close()


def hang_after_open(transport: SshTransport, board: SshBoard) -> None:
    """The board hangs the moment it has opened the next session: the request that follows (exec or
    subsystem) reaches a board that never answers it."""
    opened = transport._open_channel

    def open_then_hang(*args: Any, **kwargs: Any) -> Any:
        channel = opened(*args, **kwargs)
        transport._open_channel = opened
        board.freeze()
        return channel

    transport._open_channel = open_then_hang  # type: ignore[method-assign]


def test_a_board_that_never_answers_exec(fresh_ssh_board: SshBoard, transport: SshTransport) -> None:
    marker = unique()
    hang_after_open(transport, fresh_ssh_board)
    error, took = timed(lambda: transport.run(["sleep", f"1001.{marker}"], timeout=3.0), 60)
    report("ssh board that never answers exec (timeout 3 s)", took)
    assert isinstance(error, CommandTimeout), error
    assert "did not answer the exec request" in one_line_naming(error, "fresh")
    assert took < 3.0 + SLACK_S
    fresh_ssh_board.thaw()  # sshd now reads the exec, then the close: the guard must end the command
    report("  ...its command gone from the board after the thaw", wait_gone(fresh_ssh_board, marker, 15))
    assert transport.run(["echo", "back"], timeout=20).stdout == "back\n"


def test_a_board_that_never_answers_the_sftp_request(
    fresh_ssh_board: SshBoard, transport: SshTransport
) -> None:
    hang_after_open(transport, fresh_ssh_board)
    error, took = timed(lambda: transport.read_text("/proc/version", timeout=2.0), 60)
    report("ssh board that never answers the SFTP subsystem request (timeout 2 s)", took)
    assert isinstance(error, CommandTimeout), error
    assert "did not answer the SFTP request" in one_line_naming(error, "fresh")
    assert took < 2.0 + SLACK_S
    fresh_ssh_board.thaw()
    assert transport.read_text("/proc/version", timeout=20).startswith("Linux")


def test_a_board_frozen_mid_command(fresh_ssh_board: SshBoard, transport: SshTransport) -> None:
    marker = unique()
    transport.run(["true"], timeout=20)
    freezer = threading.Timer(1.0, fresh_ssh_board.freeze)
    freezer.start()
    error, took = timed(
        lambda: transport.run(["sh", "-c", f"sleep 1002.{marker}; echo done"], timeout=4.0), 60
    )
    freezer.join()
    report("ssh board frozen mid-command (timeout 4 s)", took)
    assert isinstance(error, CommandTimeout), error
    one_line_naming(error, "fresh")
    assert took < 4.0 + SLACK_S
    time.sleep(HELD_S)
    fresh_ssh_board.thaw()
    report("  ...its command gone from the board after the thaw", wait_gone(fresh_ssh_board, marker, 15))


def test_a_timed_out_command_is_gone_before_the_error_and_the_close(
    fresh_ssh_board: SshBoard, transport: SshTransport
) -> None:
    """bench --timeout 5 once left `sleep 1001` running: the kill ran in the background and the connection
    was closed first. Now the call's processes are killed and checked gone before the error is raised."""
    marker = unique()
    error, took = timed(lambda: transport.run(["sh", "-c", f"sleep 1003.{marker} & wait"], timeout=2.0), 60)
    transport.close()
    assert isinstance(error, CommandTimeout) and took < 2.0 + SLACK_S, (error, took)
    assert on_board(fresh_ssh_board, marker) == []  # at once, not eventually


def test_a_pulled_cable_mid_command(net_ssh_board: SshBoard) -> None:
    marker = unique()
    transport = SshTransport(net_ssh_board.spec())
    try:
        transport.run(["true"], timeout=20)
        unplug = threading.Timer(1.0, net_ssh_board.unplug)
        unplug.start()
        error, took = timed(lambda: transport.run(["sleep", f"1004.{marker}"], timeout=4.0), 60)
        unplug.join()
        report("ssh board whose cable is pulled mid-command (timeout 4 s)", took)
        assert isinstance(error, CommandTimeout | ConnectionLost), error
        one_line_naming(error, "netboard")
        assert took < 4.0 + SLACK_S
        # While unplugged the board cannot hear anything; once the cable is back it must end the call.
        time.sleep(HELD_S)
        net_ssh_board.replug()
        report("  ...its command gone from the board after the replug", wait_gone(net_ssh_board, marker, 30))
    finally:
        net_ssh_board.replug()
        transport.close()


def test_keepalives_find_a_frozen_board_long_before_the_command_timeout(fresh_ssh_board: SshBoard) -> None:
    marker = unique()
    transport = SshTransport(fresh_ssh_board.spec(keepalive_interval=1.0, keepalive_count_max=3))
    try:
        # A board that answers is never declared lost, however long its command runs.
        assert transport.run(["sh", "-c", "sleep 6; echo slept"], timeout=30).stdout == "slept\n"
        freezer = threading.Timer(1.0, fresh_ssh_board.freeze)
        freezer.start()
        error, took = timed(lambda: transport.run(["sleep", f"1005.{marker}"], timeout=120), 60)
        freezer.join()
        report("ssh keepalives (1 s x 3) find a board frozen 1 s into a 120 s command", took)
        assert isinstance(error, ConnectionLost), error
        assert "no answer to keepalives" in one_line_naming(error, "fresh")
        assert took < 1.0 + 1.0 * (3 + 1) + SLACK_S
        fresh_ssh_board.thaw()
        wait_gone(fresh_ssh_board, marker, 15)
    finally:
        fresh_ssh_board.thaw()
        transport.close()


def test_the_default_keepalive_finds_a_frozen_board_within_a_minute(ssh_board: SshBoard) -> None:
    spec = ssh_board.spec()
    # One probe unanswered for count_max intervals, sent at most one interval after the board froze.
    assert spec.keepalive_interval_s * (spec.keepalive_count_max + 1) < 60


def test_a_failed_push_leaves_no_temporary_file(
    fresh_ssh_board: SshBoard, transport: SshTransport, tmp_path: Path
) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(64_000_000))
    folder = tmp_path / "remote"
    transport.run(["mkdir", "-p", str(folder)], timeout=20)

    def freeze_once_written() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any(p.stat().st_size > 0 for p in folder.glob("model.bin.part-*")):
                fresh_ssh_board.freeze()
                return
            time.sleep(0.001)

    watcher = threading.Thread(target=freeze_once_written)
    watcher.start()
    error, took = timed(lambda: transport.push(big, str(folder / "model.bin"), timeout=4.0), 60)
    watcher.join()
    assert isinstance(error, CommandTimeout), error
    assert took < 4.0 + SLACK_S
    assert [p.name for p in folder.iterdir() if p.name.startswith("model.bin.part-")], "not frozen mid-push"
    fresh_ssh_board.thaw()
    transport.run(["true"], timeout=20)  # the next call on a working connection removes it
    assert sorted(p.name for p in folder.iterdir()) == []


def test_known_hosts_with_cert_authority_and_revoked_lines(fresh_ssh_board: SshBoard, tmp_path: Path) -> None:
    kind, data = Path(str(fresh_ssh_board.host_key) + ".pub").read_text().split()[:2]
    ca = generate_key(tmp_path / "ca").split()
    known = tmp_path / "known_hosts"
    # OpenSSH accepts this file: a CA line, a revoked (other) key, the board's pin.
    other = generate_key(tmp_path / "old").split()
    known.write_text(
        f"@cert-authority *.lab.example {ca[0]} {ca[1]}\n"
        f"@revoked * {other[0]} {other[1]}\n"
        f"{fresh_ssh_board.host_key_line()}\n"
    )
    ok = SshTransport(fresh_ssh_board.spec(known_hosts=str(known)))
    assert ok.run(["echo", "pinned"], timeout=20).stdout == "pinned\n"
    ok.close()
    # The board's own key revoked: refused in one line, even though its pin is still in the file.
    known.write_text(f"@revoked * {kind} {data}\n{fresh_ssh_board.host_key_line()}\n")
    with pytest.raises(HostKeyError) as err:
        SshTransport(fresh_ssh_board.spec(known_hosts=str(known)))
    assert "@revoked" in one_line_naming(err.value, "fresh") and "line 1" in str(err.value)
    # ...and trust-on-first-use never pins a revoked key.
    known.write_text(f"@revoked * {kind} {data}\n")
    with pytest.raises(HostKeyError, match="@revoked"):
        SshTransport(fresh_ssh_board.spec(known_hosts=str(known), trust_on_first_use=True))
    assert known.read_text() == f"@revoked * {kind} {data}\n"


def test_a_killed_controller_leaves_no_agent_on_the_board(fresh_ssh_board: SshBoard, tmp_path: Path) -> None:
    lab = fresh_ssh_board.lab_dir
    agent_mark = f"{fresh_ssh_board.workdir}/cache/"
    controller = subprocess.Popen(
        [sys.executable, "-m", "edgebench", "bench", "builtin:mlp", "--device", "fresh", "--lab", str(lab),
         "--runs", "1000000", "--min-seconds", "120", "--max-seconds", "200", "--timeout", "300",
         "--no-store"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not [a for a in on_board(fresh_ssh_board, agent_mark) if '"kind":"bench"' in a]:
            assert controller.poll() is None, controller.communicate()[1]
            assert time.monotonic() < deadline, "the bench agent never started on the board"
            time.sleep(0.2)
        time.sleep(1.0)  # measuring
        controller.kill()
        controller.wait(10)
        took = wait_gone(fresh_ssh_board, agent_mark, 10)
        report("no agent left on the ssh board after kill -9 of its controller", took)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait(10)


def test_a_board_that_is_down_is_still_one_line(fresh_ssh_board: SshBoard) -> None:
    transport = SshTransport(fresh_ssh_board.spec())
    fresh_ssh_board.kill()
    try:
        with pytest.raises(TransportError) as err:
            transport.run(["true"], timeout=10)
        one_line_naming(err.value, "fresh")
    finally:
        transport.close()
