"""Busy loops a test starts (edgebench.testing.load) end with the test's process, however it ends."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from edgebench.testing import load


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_loop_spins_and_ends_when_its_block_ends() -> None:
    with load.busy_loops(1) as [loop]:
        time.sleep(0.3)
        assert _alive(loop.pid)
    assert loop.returncode is not None and not _alive(loop.pid)


def test_loops_outlive_no_killed_test_process() -> None:
    """A process that starts two loops and is killed without stopping them: the loops end by themselves."""
    code = "import os, sys; from edgebench.testing import load; print(*[p.pid for p in load.start(2)]); sys.stdout.flush(); os._exit(0)"
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    pids = [int(p) for p in child.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in pids if _alive(p)]
    for p in alive:
        os.killpg(p, 9)
    assert not alive, "busy loops outlived the process that started them"
