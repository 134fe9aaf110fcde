"""Device leases across real processes: exclusive, queued, recovered from dead or frozen holders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from edgebench.descriptors import builtin_local
from edgebench.execution.leases import (
    DEFAULT_LEASE_S,
    DeviceLease,
    LeaseTimeout,
    default_lock_dir,
    lease_history,
    lease_key,
    lease_stem,
)

HOLDER = """
import sys, time
from edgebench.execution.leases import DeviceLease
lease = DeviceLease(sys.argv[1], run_id=sys.argv[2], folder=sys.argv[3], lease_s=float(sys.argv[4]),
                    poll_s=0.05)
lease.acquire()
print("held", flush=True)
while True:
    time.sleep(0.05)
    if lease.lost:
        print("lost", flush=True)
        break
lease.release()
"""


class Holder:
    """A process of its own holding a device's lease."""

    def __init__(
        self, folder: Path, device: str = "pixel8", run_id: str = "run-a", lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        argv = [sys.executable, "-c", HOLDER, device, run_id, str(folder), str(lease_s)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "held"

    def line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for h in started:
        try:
            os.kill(h.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        h.stop()


def test_a_held_lease_makes_others_queue_and_says_who_holds_it(tmp_path: Path, holders: list[Holder]) -> None:
    holders.append(Holder(tmp_path))
    seen = []
    lease = DeviceLease("pixel8", run_id="run-b", folder=tmp_path, poll_s=0.05)
    start = time.monotonic()
    with pytest.raises(LeaseTimeout, match=r"pixel8: still leased by run run-a, pid \d+"):
        lease.acquire(timeout=0.6, on_wait=lambda holder, waited: seen.append(holder))
    assert time.monotonic() - start >= 0.6
    assert seen and seen[0] is not None and seen[0].run_id == "run-a" and seen[0].pid == holders[0].proc.pid
    assert not lease.held
    # Another device is free meanwhile: leases are per device.
    other = DeviceLease("rpi5", folder=tmp_path)
    other.acquire(timeout=1)
    other.release()


def test_the_lease_of_a_killed_holder_is_recovered_at_once(tmp_path: Path, holders: list[Holder]) -> None:
    holder = Holder(tmp_path)
    holders.append(holder)
    os.kill(holder.proc.pid, signal.SIGKILL)
    holder.proc.wait(10)
    lease = DeviceLease("pixel8", run_id="run-b", folder=tmp_path)
    start = time.monotonic()
    lease.acquire(timeout=10)
    assert time.monotonic() - start < 5  # not the lease duration (60 s): the holder's process is gone
    lease.release()
    events = [(e["event"], e["run_id"]) for e in lease_history("pixel8", tmp_path)]
    assert events == [("acquired", "run-a"), ("acquired", "run-b"), ("released", "run-b")]


def test_a_frozen_holder_loses_its_lease_after_the_lease_duration(
    tmp_path: Path, holders: list[Holder]
) -> None:
    holder = Holder(tmp_path, lease_s=1.5)
    holders.append(holder)
    os.kill(holder.proc.pid, signal.SIGSTOP)  # alive but not refreshing: a hung controller
    lease = DeviceLease("pixel8", run_id="run-b", folder=tmp_path, lease_s=1.5, poll_s=0.05)
    start = time.monotonic()
    lease.acquire(timeout=15)
    waited = time.monotonic() - start
    assert 1.4 <= waited < 10
    os.kill(holder.proc.pid, signal.SIGCONT)
    assert holder.line() == "lost"  # the old holder learns it must stop using the device
    assert lease.lost is None
    lease.release()
    holder.proc.wait(10)
    assert [e["event"] for e in lease_history("pixel8", tmp_path)][-2:] in (
        ["lost", "released"],
        ["released", "lost"],
    )


def test_leases_are_exclusive_and_queue_in_one_process_too(tmp_path: Path) -> None:
    first = DeviceLease("board", run_id="a", folder=tmp_path, poll_s=0.02)
    second = DeviceLease("board", run_id="b", folder=tmp_path, poll_s=0.02)
    first.acquire()
    with pytest.raises(LeaseTimeout):
        second.acquire(timeout=0.2)
    first.release()
    second.acquire(timeout=2)
    assert second.held and not first.held
    second.release()
    second.release()  # releasing twice is harmless


def test_lock_folder_and_file_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEBENCH_LOCK_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_lock_dir() == tmp_path / "cache" / "edgebench" / "locks"
    monkeypatch.setenv("EDGEBENCH_LOCK_DIR", str(tmp_path / "lab-locks"))
    assert default_lock_dir() == tmp_path / "lab-locks"
    assert lease_stem("pixel8") == "pixel8"
    odd = lease_stem("../phone 1")
    assert "/" not in odd and " " not in odd and odd != lease_stem("../phone_1")
    lease = DeviceLease("../phone 1")
    lease.acquire(timeout=1)
    assert lease.marker_path.parent == tmp_path / "lab-locks"
    lease.release()


def test_a_thawed_holder_knows_at_once_that_its_lease_was_taken(
    tmp_path: Path, holders: list[Holder]
) -> None:
    # filelock's heartbeat looks every third of the lease (2 s here) and lets the first "owner changed"
    # pass; the holder must not measure on for those seconds after it thaws.
    holder = Holder(tmp_path, lease_s=6.0)
    holders.append(holder)
    os.kill(holder.proc.pid, signal.SIGSTOP)
    lease = DeviceLease("pixel8", run_id="run-b", folder=tmp_path, lease_s=6.0, poll_s=0.05)
    lease.acquire(timeout=30)
    thawed = time.monotonic()
    os.kill(holder.proc.pid, signal.SIGCONT)
    assert holder.line() == "lost"
    assert time.monotonic() - thawed < 1.0
    lease.release()


def test_descriptors_of_one_device_share_its_lease(tmp_path: Path) -> None:
    from edgebench.descriptors import DeviceSpec

    def ssh(name: str, host: str, port: int) -> DeviceSpec:
        return DeviceSpec(name=name, transport="ssh", workdir="/w", python="python3", host=host, port=port)

    board, alias, other = (
        ssh("board1", "10.0.0.5", 22),
        ssh("rpi", "10.0.0.5", 22),
        ssh("b2", "10.0.0.5", 2222),
    )
    assert lease_key(board) == lease_key(alias) != lease_key(other)
    phone = DeviceSpec(name="p", transport="adb", workdir="/w", python="python3", serial="SER1")
    assert lease_key(phone) == lease_key(replace(phone, name="pixel8", adb_server="127.0.0.1:5038"))
    assert lease_key(builtin_local()) == lease_key(replace(builtin_local(), name="twin", workdir="/x"))

    first = DeviceLease("board1", key=lease_key(board), run_id="a", folder=tmp_path, poll_s=0.02)
    second = DeviceLease("rpi", key=lease_key(alias), run_id="b", folder=tmp_path, poll_s=0.02)
    first.acquire()
    with pytest.raises(LeaseTimeout, match=r"rpi: still leased by run a, pid \d+ on .* as 'board1'"):
        second.acquire(timeout=0.2)
    first.release()
    second.acquire(timeout=2)
    second.release()
    history = lease_history(board, tmp_path)
    assert [(e["event"], e["device"]) for e in history] == [
        ("acquired", "board1"),
        ("released", "board1"),
        ("acquired", "rpi"),
        ("released", "rpi"),
    ]
