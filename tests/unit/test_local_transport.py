"""LocalTransport: argv only, bounded calls, children that die with the caller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgebench.errors import CommandTimeout, TransferError
from edgebench.transports.local import LocalTransport


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


def test_run_returns_exit_code_and_output() -> None:
    res = LocalTransport().run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (res.returncode, res.stdout, res.stderr) == (3, "out\n", "err\n")
    assert LocalTransport().run(["no-such-binary-xyz"], timeout=10).returncode == 127


def test_argv_is_never_a_shell_line(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    res = LocalTransport().run(["echo", f"$(touch {canary}); `touch {canary}`"], timeout=10)
    assert "touch" in res.stdout and not canary.exists()


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with pytest.raises(CommandTimeout) as info:
        LocalTransport("dev").run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout=0.5)
    assert "dev" in str(info.value) and "0.5" in str(info.value)
    time.sleep(0.2)
    assert not alive(int(pidfile.read_text()))


def test_child_dies_with_a_killed_caller(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    code = (
        "import sys; from edgebench.transports.local import LocalTransport\n"
        f"LocalTransport().run(['sh', '-c', 'echo $$ > {pidfile}; exec sleep 60'], timeout=120)\n"
    )
    caller = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_transfer_errors_are_typed(tmp_path: Path) -> None:
    with pytest.raises(TransferError, match="dev"):
        LocalTransport("dev").pull(str(tmp_path / "missing"), tmp_path / "x", timeout=5)
    with pytest.raises(TransferError):
        LocalTransport("dev").read_text(str(tmp_path / "missing"), timeout=5)


def test_a_signal_death_reads_128_plus_n() -> None:
    res = LocalTransport().run(["sh", "-c", "kill -9 $$"], timeout=10)
    assert (res.returncode, res.signal) == (137, 9)


def test_file_calls_honour_their_timeout(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading blocks until a writer comes: it never does
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            LocalTransport("dev").read_text(str(fifo), timeout=0.5)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome.append(exc)

    start = time.monotonic()
    caller = threading.Thread(target=read, daemon=True)
    caller.start()
    caller.join(10)
    if caller.is_alive():  # unblock the reader before failing
        with open(fifo, "w"):
            pass
    assert not caller.is_alive() and time.monotonic() - start < 5
    assert isinstance(outcome[0], CommandTimeout) and "dev" in str(outcome[0])
    with open(fifo, "w"):  # let the abandoned worker finish
        pass

    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(64 << 20))
    dest = tmp_path / "out" / "big.bin"
    with pytest.raises(CommandTimeout):
        LocalTransport("dev").push(big, str(dest), timeout=1e-6)
    time.sleep(0.5)  # the worker stops at its next chunk and removes its temporary file
    assert not dest.exists() and not [p for p in dest.parent.glob("*")]
    LocalTransport("dev").push(big, str(dest), timeout=60)
    assert dest.read_bytes() == big.read_bytes() and [p.name for p in dest.parent.iterdir()] == ["big.bin"]
