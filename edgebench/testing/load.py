"""Busy loops beside a test: other work on the machine, as a shared lab host has.

Each loop is a shell spinning on `kill -0 <this process>`: it ends by itself when the test's process is
gone (a cancelled CI job, a SIGKILLed pytest), so no loop outlives its test and keeps a CPU busy.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

SPIN = 'while kill -0 "$1" 2>/dev/null; do :; done'


def start(n: int = 2) -> list[subprocess.Popen[bytes]]:
    """`n` busy loops, each the leader of its own process group, tied to this process's life."""
    return [
        subprocess.Popen(
            ["sh", "-c", SPIN, "busy-loop", str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # holds no pipe of the test's open: a reader waits for no loop
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(n)
    ]


def stop(loops: list[subprocess.Popen[bytes]]) -> None:
    """End the loops (their whole groups) and reap them."""
    for p in loops:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


@contextmanager
def busy_loops(n: int = 2) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`n` busy loops for the length of the block."""
    loops = start(n)
    try:
        yield loops
    finally:
        stop(loops)
