"""The emulated phone behind the real adb server leaves what a real adbd leaves, and AdbTransport leaves
nothing: timed-out commands and commands whose controller was killed are gone from the phone (checked in
its own process list), a frozen phone is found by probes long before a command's timeout, stdin is at EOF,
command lines over 64 KiB run. How long each took is printed (run with -s to see the figures)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgebench.errors import CommandTimeout, ConnectionLost, UserError
from edgebench.testing.adblab import AdbServer, EmulatedPhone
from edgebench.testing.pytest_adb import AdbPhoneLab
from edgebench.transports.adb import AdbTransport

pytestmark = pytest.mark.integration


def unique() -> str:
    return f"{os.getpid() % 1000}{time.monotonic_ns() % 1_000_000:06d}"


def on_phone(phone: EmulatedPhone, marker: str) -> list[str]:
    """Command lines of the phone's processes that carry `marker` (its own process table)."""
    return [p["args"] for p in phone.processes() if marker in p["args"]]


def wait_gone(phone: EmulatedPhone, marker: str, limit: float) -> float:
    start = time.monotonic()
    while left := on_phone(phone, marker):
        assert time.monotonic() - start < limit, f"still running on the phone after {limit} s: {left}"
        time.sleep(0.1)
    return time.monotonic() - start


def report(what: str, seconds: float) -> None:
    print(f"\n[figure] {what}: {seconds:.2f} s", file=sys.stderr)


def test_a_closed_shell_stream_leaves_what_a_real_adbd_leaves(adb_phone: AdbPhoneLab) -> None:
    """AOSP's adbd hangs the shell up (SIGHUP to its pid) and closes its pipes, no more: a command that
    `sh -c` forked outlives it. The real adb client is killed mid-command to close the stream."""
    marker = unique()
    server: AdbServer = adb_phone.phone.server
    client = subprocess.Popen(
        [server.adb, "-P", str(server.port), "-s", adb_phone.phone.serial, "shell", f"sleep 1010.{marker}; true"],
        env={**os.environ, "HOME": str(server.home)}, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while len(on_phone(adb_phone.phone, marker)) < 2:  # the shell and its sleep
            assert time.monotonic() < deadline, adb_phone.phone.processes()
            time.sleep(0.05)
    finally:
        client.kill()
        client.wait(10)
    time.sleep(1.5)
    left = on_phone(adb_phone.phone, marker)
    assert left == [f"sleep 1010.{marker}"], left  # the shell got SIGHUP and died; its child lives on


def test_a_timed_out_command_leaves_nothing_on_the_phone(adb_phone: AdbPhoneLab) -> None:
    marker = unique()
    adb = AdbTransport(adb_phone.spec())
    start = time.monotonic()
    with pytest.raises(CommandTimeout) as err:
        adb.run(["sh", "-c", f"sleep 1011.{marker}; echo done"], timeout=1.5)
    took = time.monotonic() - start
    report("adb command timeout 1.5 s, its processes killed and checked gone", took)
    assert took < 1.5 + 3 and "\n" not in str(err.value) and str(err.value).startswith("phone: ")
    assert on_phone(adb_phone.phone, marker) == []  # at once, not eventually


def test_the_command_sees_eof_on_stdin(adb_phone: AdbPhoneLab) -> None:
    adb = AdbTransport(adb_phone.spec())
    start = time.monotonic()
    res = adb.run(["cat"], timeout=15)
    assert (res.returncode, res.stdout) == (0, "") and time.monotonic() - start < 10


def test_command_lines_over_64_kib(adb_phone: AdbPhoneLab) -> None:
    adb = AdbTransport(adb_phone.spec())
    res = adb.run(["sh", "-c", 'printf %s "$1" | wc -c', "sh", "y" * 100_000], timeout=60)
    assert (res.returncode, res.stdout.strip()) == (0, "100000"), res
    assert not [p for p in (adb_phone.root / "data" / "local" / "tmp").rglob(".edgebench-cmd-*")]
    with pytest.raises(UserError, match="MAX_ARG_STRLEN"):
        adb.run(["echo", "z" * 200_000], timeout=30)


def test_probes_find_a_frozen_phone_long_before_the_command_timeout(
    adb_phone_factory: Callable[..., AdbPhoneLab],
) -> None:
    lab = adb_phone_factory("quick", extra="keepalive_interval = 1.0\nkeepalive_count_max = 3")
    marker = unique()
    adb = AdbTransport(lab.spec())
    # A phone that answers is never declared lost, however long its command runs.
    assert adb.run(["sh", "-c", "sleep 6; echo slept"], timeout=30).stdout == "slept\n"
    freezer = threading.Timer(1.0, lab.phone.freeze)
    freezer.start()
    start = time.monotonic()
    try:
        with pytest.raises(ConnectionLost) as err:
            adb.run(["sleep", f"1012.{marker}"], timeout=120)
        took = time.monotonic() - start
        report("adb probes (1 s x 3) find a phone frozen 1 s into a 120 s command", took)
        assert "answered no probe" in str(err.value) and "\n" not in str(err.value)
        assert took < 1.0 + 1.0 * (3 + 1) + 3
    finally:
        freezer.join()
        lab.phone.thaw()
    adb.run(["true"], timeout=20)  # thawed: the next call ends what the lost one left
    assert on_phone(lab.phone, marker) == []


def test_a_killed_controller_leaves_no_agent_on_the_phone(adb_phone: AdbPhoneLab, tmp_path: Path) -> None:
    controller = subprocess.Popen(
        [sys.executable, "-m", "edgebench", "bench", "builtin:mlp", "--device", "phone",
         "--lab", str(adb_phone.lab_dir), "--runs", "1000000", "--min-seconds", "120",
         "--max-seconds", "200", "--timeout", "300", "--no-store"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    agent = "/data/local/tmp/edgebench/cache/"
    try:
        deadline = time.monotonic() + 120
        while not [a for a in on_phone(adb_phone.phone, agent) if '"kind":"bench"' in a]:
            assert controller.poll() is None, controller.communicate()[1]
            assert time.monotonic() < deadline, "the bench agent never started on the phone"
            time.sleep(0.2)
        time.sleep(1.0)  # measuring
        controller.kill()
        controller.wait(10)
        took = wait_gone(adb_phone.phone, agent, 10)
        report("no agent left on the emulated phone after kill -9 of its controller", took)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait(10)
