"""The simulator's per-board load meter: it counts only tagged processes, including ones tagged at exec."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

from edgebench.testing.sysfs_sim import ProcMeter

# Untagged until told to exec itself into a busy loop with the tag in its environment: the window
# between fork and exec in which a spawner's child still carries the spawner's environment.
EXEC_LATER = textwrap.dedent(
    """
    import os, sys
    sys.stdin.readline()
    env = {**os.environ, "EB_BOARD": sys.argv[1]}
    os.execve(sys.executable, [sys.executable, "-c", "while True: pass"], env)
    """
)


def busy_share(meter: ProcMeter, seconds: float) -> float:
    meter.utilisation()
    time.sleep(seconds)
    return meter.utilisation()


def test_a_process_tagged_at_exec_is_counted_although_first_seen_untagged() -> None:
    tag = uuid.uuid4().hex[:12]
    meter = ProcMeter(f"EB_BOARD={tag}", cpus=1)
    proc = subprocess.Popen([sys.executable, "-c", EXEC_LATER, tag], stdin=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        assert busy_share(meter, 0.3) == 0.0  # seen, idle and untagged
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if busy_share(meter, 0.5) > 0.05:
                break
        else:
            raise AssertionError("the process busy after its exec was never counted")
    finally:
        proc.kill()
        proc.wait()


def test_untagged_busy_processes_are_not_counted() -> None:
    meter = ProcMeter(f"EB_BOARD={uuid.uuid4().hex[:12]}", cpus=1)
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], env={**os.environ})
    try:
        time.sleep(0.2)
        assert busy_share(meter, 1.0) == 0.0
    finally:
        proc.kill()
        proc.wait()
