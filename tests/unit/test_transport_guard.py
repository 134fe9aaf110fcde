"""The remote-command guard of `transports.base`, run here by the real shells boards and phones have:
dash (Debian, Raspberry Pi OS), bash, busybox ash (embedded Linux) and mksh (Android's /system/bin/sh).

Each test starts `sh -c LINE` as sshd or adbd would (a session leader whose stdin is the channel), with a
PATH whose `sh` is the shell under test (and, for busybox, every tool the guard uses from busybox too)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from edgebench.errors import CommandError, UserError, exit_description, signal_of
from edgebench.transports.base import (
    CALL_ENV,
    CLEAN_MARK,
    MAX_ARG_BYTES,
    CommandResult,
    Leftovers,
    check_argv,
    cleanup_argv,
    command_line,
    guarded_command,
    new_call_token,
    reap_budget,
    script_file_command,
)

SHELLS = ["dash", "bash", "busybox", "mksh"]
BUSYBOX_TOOLS = ["sh", "env", "grep", "kill", "sleep", "rm", "cat", "printf", "echo", "setsid", "tr", "wc"]


@pytest.fixture(params=SHELLS)
def shell_path(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A PATH whose `sh` is the shell under test."""
    name = request.param
    binary = shutil.which(name)
    if binary is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{name} not installed (scripts/install-test-deps.sh installs it)")
        pytest.skip(f"{name} not installed")
    bin_dir = tmp_path / f"bin-{name}"
    bin_dir.mkdir()
    for tool in BUSYBOX_TOOLS if name == "busybox" else ["sh"]:
        (bin_dir / tool).symlink_to(binary)
    return f"{bin_dir}:{os.environ['PATH']}"


def start(
    path: str, argv: list[str], token: str | None = None, heartbeat_s: float = 0.0
) -> tuple[str, subprocess.Popen[bytes]]:
    """LINE as sshd/adbd run it: `sh -c LINE` in a new session, stdin a pipe the test holds open."""
    token = token or new_call_token()
    line = guarded_command(argv, {"EB_X": "1"}, token, heartbeat_s)
    proc = subprocess.Popen(
        ["sh", "-c", line],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "PATH": path},
    )
    return token, proc


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    """Read to the end with stdin still open (closing it would be the controller going away)."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    code = proc.wait(20)
    assert proc.stdin is not None
    proc.stdin.close()
    return code, out, err


def alive_with(marker: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if marker in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p.pid)
    return found


def wait_gone(marker: str, timeout: float = 5.0) -> float:
    start = time.monotonic()
    while alive_with(marker):
        assert time.monotonic() - start < timeout, f"still running: {marker}"
        time.sleep(0.02)
    return time.monotonic() - start


def test_status_streams_and_argv_pass_through(shell_path: str) -> None:
    _, proc = start(shell_path, ["sh", "-c", 'echo out; echo err >&2; printf "%s|" "$EB_X" "$@"; exit 7',
                                 "x", "a b", "$(id)", "it's"])  # fmt: skip
    assert finish(proc) == (7, "out\n1|a b|$(id)|it's|", "err\n")


def test_a_signal_death_reads_128_plus_n_and_is_described(shell_path: str) -> None:
    _, proc = start(shell_path, ["sh", "-c", "kill -9 $$"])
    code, out, err = finish(proc)
    assert (code, err) == (137, "")  # the shell's own "Killed" note is kept out of the command's stderr
    result = CommandResult(("sh",), code, out, err, 0.0)
    assert result.signal == 9
    with pytest.raises(CommandError, match=r"command sh killed by signal 9 \(SIGKILL\)"):
        result.check("board")


def test_the_command_sees_eof_on_stdin(shell_path: str) -> None:
    start_s = time.monotonic()
    _, proc = start(shell_path, ["cat"])
    assert finish(proc) == (0, "", "")
    assert time.monotonic() - start_s < 10


def test_closing_the_lifeline_kills_every_process_of_the_call(shell_path: str) -> None:
    marker = f"{os.getpid() % 1000}{time.time_ns() % 1000:03d}"
    script = (
        f"sleep 1001.{marker} & setsid sleep 1002.{marker} & "
        f"(trap '' HUP; sleep 1003.{marker}) & echo started; wait"
    )
    _, other = start(shell_path, ["sleep", f"1004.{marker}"])  # another call: must survive
    _, proc = start(shell_path, ["sh", "-c", script])
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
        deadline = time.monotonic() + 10
        while len(alive_with(f".{marker}")) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.stdin is not None
        proc.stdin.close()  # the controller timed out or died
        took = sum(wait_gone(f"{n}.{marker}") for n in (1001, 1002, 1003))
        assert took < 5
        assert alive_with(f"1004.{marker}"), "an unrelated call was killed too"
    finally:
        for p in (proc, other):
            assert p.stdin is not None
            if not p.stdin.closed:
                p.stdin.close()
            p.wait(20)
    wait_gone(f"1004.{marker}")


def test_what_a_finished_command_left_running_is_killed(shell_path: str) -> None:
    marker = f"{os.getpid() % 1000}{time.time_ns() % 1000:03d}"
    _, proc = start(shell_path, ["sh", "-c", f"sleep 1005.{marker} >/dev/null 2>&1 & echo bye"])
    assert finish(proc) == (0, "bye\n", "")
    wait_gone(f"1005.{marker}", 3.0)


def test_cleanup_kills_tagged_calls_removes_files_and_spares_the_rest(tmp_path: Path) -> None:
    marker = f"{os.getpid() % 1000}{time.time_ns() % 1000:03d}"
    path = os.environ["PATH"]
    token, tagged = start(path, ["sleep", f"1006.{marker}"])
    _, spared = start(path, ["sleep", f"1007.{marker}"])
    leftover = tmp_path / "x.part-1"
    leftover.write_text("half")
    try:
        deadline = time.monotonic() + 10
        while len(alive_with(f".{marker}")) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        res = subprocess.run(
            cleanup_argv([token], [str(leftover)]), capture_output=True, text=True, timeout=30
        )
        assert res.returncode == 0 and CLEAN_MARK in res.stdout, res
        assert not alive_with(f"1006.{marker}") and alive_with(f"1007.{marker}")
        assert not leftover.exists()
    finally:
        for p in (tagged, spared):
            assert p.stdin is not None
            p.stdin.close()
            p.wait(20)


def test_a_long_command_line_runs_from_a_script_that_removes_itself(tmp_path: Path) -> None:
    token = new_call_token()
    big = "y" * 100_000
    line = guarded_command(["sh", "-c", 'printf %s "$1" | wc -c', "sh", big], None, token)
    script = tmp_path / f".edgebench-cmd-{token}.sh"
    text, short = script_file_command(line, str(script))
    script.write_text(text)
    proc = subprocess.Popen(["sh", "-c", short], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    assert finish(proc) == (0, "100000\n", "")
    assert len(short) < 200 and not script.exists()


def test_limits_and_env_names_are_one_line_user_errors() -> None:
    with pytest.raises(UserError, match="MAX_ARG_STRLEN"):
        check_argv(["python3", "x" * MAX_ARG_BYTES])
    assert check_argv(["a", "x" * (MAX_ARG_BYTES - 1)])[0] == "a"
    with pytest.raises(UserError, match="invalid environment variable name 'A-B'"):
        command_line(["true"], {"A-B": "1"})
    with pytest.raises(UserError):
        guarded_command(["true"], {"1X": "1"}, new_call_token())
    with pytest.raises(ValueError):
        cleanup_argv(["not-a-token; rm -rf /"])
    assert f"{CALL_ENV}=" in guarded_command(["true"], None, new_call_token())


def test_exit_descriptions_and_reap_budget() -> None:
    assert (signal_of(137), signal_of(1), signal_of(255), signal_of(None)) == (9, None, None, None)
    assert exit_description(3) == "exited 3"
    assert exit_description(143) == "killed by signal 15 (SIGTERM)"
    assert exit_description(None) == "died without an exit status"
    assert (reap_budget(1.0), reap_budget(3.0), reap_budget(900.0)) == (0.5, 1.5, 2.0)


def test_leftovers_are_taken_and_given_back() -> None:
    pending = Leftovers()
    assert not pending
    pending.add(call="a" * 16, file="/w/x.part-1")
    assert pending
    calls, files = pending.take()
    assert (calls, files) == (["a" * 16], ["/w/x.part-1"]) and not pending
    pending.give_back(calls, files)
    assert pending.take() == (calls, files)


def test_a_silent_controller_is_taken_for_dead_after_its_heartbeat(shell_path: str) -> None:
    """A controller that keeps the channel open but sends nothing (frozen) loses its call after the
    heartbeat period: the board reaps it, so it cannot go on measuring after its lease ran out."""
    marker = f"10{os.getpid()}"
    _, proc = start(shell_path, ["sleep", f"1013.{marker}"], heartbeat_s=1.0)
    start_s = time.monotonic()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pytest.fail("the call outlived its silent controller")
    took = time.monotonic() - start_s
    assert 0.8 < took < 5.0, took
    wait_gone(marker)
    assert proc.stdin is not None
    proc.stdin.close()


def test_a_beating_controller_keeps_its_call(shell_path: str) -> None:
    _, proc = start(shell_path, ["sh", "-c", "sleep 2.5; echo slept"], heartbeat_s=1.0)
    assert proc.stdin is not None
    for _ in range(10):
        if proc.poll() is not None:
            break
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        time.sleep(0.3)
    assert finish(proc)[:2] == (0, "slept\n")
