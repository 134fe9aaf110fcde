"""The agent's per-job disturbance figures: /proc/stat summed over the same CPUs at both ends of a job (one
that pins itself, or a phone that takes CPUs offline, changes the set between the two readings), from
synthetic /proc/stat texts and from a real job that pins itself while a child burns the other CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgebench.agent import disturbance

HZ = os.sysconf("SC_CLK_TCK")


def _stat(cpus: dict[int, tuple[int, int, int]]) -> str:
    """A /proc/stat text: per CPU (user, idle, steal) jiffies, and the `cpu` line summing them."""

    def line(name: str, user: int, idle: int, steal: int) -> str:
        return f"{name} {user} 0 0 {idle} 0 0 0 {steal} 0 0"

    total = [sum(v[i] for v in cpus.values()) for i in range(3)]
    rows = [line("cpu", *total)] + [line(f"cpu{n}", *v) for n, v in sorted(cpus.items())]
    return "\n".join([*rows, "intr 1 0 0", "ctxt 99"]) + "\n"


def _reader(stat: str) -> Callable[[str], str | None]:
    return lambda path: stat if path == "/proc/stat" else None


def _snap(stat: str, allowed: list[int] | None, t: float, own_s: float) -> dict[str, Any]:
    snap = disturbance.snapshot(read=_reader(stat), allowed=lambda: allowed)
    return {**snap, "t": t, "own_s": own_s}


def test_a_job_that_pins_itself_still_counts_the_others_on_the_cpus_it_left() -> None:
    """Allowed CPUs 0-3 at the start, pinned to CPU 0 by the end (bench.pin): its own second on CPU 0 is
    its own, the neighbour's second on CPU 2 is the others' share, over the four CPUs it could use."""
    start = _snap(_stat({n: (1000, 5000, 0) for n in range(4)}), [0, 1, 2, 3], 0.0, 0.0)
    end_rows = {
        0: (1000 + HZ, 5000, 0),
        1: (1000, 5000 + HZ, 0),
        2: (1000 + HZ, 5000, 0),
        3: (1000, 5000 + HZ, 0),
    }
    end = _snap(_stat(end_rows), [0], 1.0, 1.0)
    d = disturbance.delta(start, end)
    assert disturbance.counted_cpus(start, end) == [0, 1, 2, 3]
    assert d["cpus_counted"] == 4 and d["own_cpu_s"] == 1.0
    assert d["cpus"] == 1  # what the job's threads ran on at the end
    assert d["others_cpu_share"] == pytest.approx(0.25)  # before: CPU 0 alone at the end, clamped to 0


def test_cpus_the_job_was_never_allowed_are_not_counted() -> None:
    """Allowed 0-1 at both ends of a 4-CPU board: a neighbour on CPU 3 is not the job's disturbance."""
    start = _snap(_stat({n: (1000, 5000, 0) for n in range(4)}), [0, 1], 0.0, 0.0)
    end = _snap(
        _stat(
            {
                0: (1000, 5000 + HZ, 0),
                1: (1000 + HZ, 5000, 0),
                2: (1000, 5000 + HZ, 0),
                3: (1000 + HZ, 5000, 0),
            }
        ),
        [0, 1],
        1.0,
        0.0,
    )
    d = disturbance.delta(start, end)
    assert d["cpus_counted"] == 2 and d["others_cpu_share"] == pytest.approx(0.5)


def test_a_cpu_taken_offline_between_the_snapshots_is_left_out() -> None:
    """A phone that takes CPU 3 offline drops its row from /proc/stat: the shares are over CPUs 0-2."""
    start = _snap(_stat({n: (1000, 5000, 10) for n in range(4)}), [0, 1, 2, 3], 0.0, 0.0)
    end_rows = {0: (1000 + HZ, 5000, 10 + HZ // 2), 1: (1000, 5000 + HZ, 10), 2: (1000, 5000 + HZ, 10)}
    end = _snap(_stat(end_rows), [0, 1, 2], 1.0, 0.0)
    d = disturbance.delta(start, end)
    assert disturbance.counted_cpus(start, end) == [0, 1, 2]
    assert d["cpus_counted"] == 3
    assert d["others_cpu_share"] == pytest.approx(1 / 3)
    assert d["steal_share"] == pytest.approx(0.5 / 3)


def test_without_per_cpu_rows_the_cpu_line_is_used_and_without_proc_stat_nothing_is_guessed() -> None:
    only_total = "cpu 1000 0 0 5000 0 0 0 0 0 0\n"
    start = _snap(only_total, [0], 0.0, 0.0)
    end = _snap(f"cpu {1000 + HZ} 0 0 5000 0 0 0 0 0 0\n", [0], 1.0, 0.0)
    d = disturbance.delta(start, end)
    n = os.cpu_count() or 1
    assert d["cpus_counted"] == n and d["others_cpu_share"] == pytest.approx(min(1.0, 1 / n))
    unreadable = disturbance.snapshot(read=lambda path: None, allowed=lambda: [0])
    assert unreadable["stat"] is None
    assert "others_cpu_share" not in disturbance.delta(unreadable, {**unreadable, "t": unreadable["t"] + 1})


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc/PID/stat: the independent reference for the neighbour."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs"
)
def test_a_job_that_pins_itself_sees_a_neighbour_burning_the_other_cpu() -> None:
    """Real: the job pins itself to one CPU between the snapshots and burns a little on it, while a child
    (ending with this test, or when its parent goes) burns the other CPU. The others' share counts the
    child's CPU time (read from its /proc entry); before the per-CPU fix it read 0.0."""
    allowed = sorted(os.sched_getaffinity(0))
    mine, other = allowed[0], allowed[1]
    burn = (
        f"import os\nos.sched_setaffinity(0, {{{other}}})\nwhile os.getppid() == {os.getpid()}:\n    pass\n"
    )
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        time.sleep(0.3)
        before = _cpu_seconds(child.pid)
        start = disturbance.snapshot()
        os.sched_setaffinity(0, {mine})
        t0 = time.process_time()
        while time.process_time() - t0 < 0.3:
            pass
        time.sleep(0.7)
        end = disturbance.snapshot()
        neighbour = _cpu_seconds(child.pid) - before
    finally:
        os.sched_setaffinity(0, allowed)
        child.kill()
        child.wait()
    d = disturbance.delta(start, end)
    others_s = d["others_cpu_share"] * d["elapsed_s"] * d["cpus_counted"]
    assert neighbour > 0.2, neighbour  # the child ran on its CPU (the host's load decides how much)
    assert d["cpus_counted"] == len(allowed) and d["cpus"] == 1
    assert others_s >= neighbour - 0.05, (others_s, neighbour, d)  # jiffy rounding: 10 ms per CPU-read
    assert d["others_cpu_share"] > 0.1, d


def test_the_reply_says_how_many_threads_the_task_ran_on_how_many_cpus() -> None:
    """`threads` as the task gave it (0: the runtime's default; a sweep: its largest), `cpus` the CPUs
    allowed at the end; a task that names no thread count leaves `threads` out."""
    assert disturbance.task_threads({"kind": "bench", "threads": 4}) == 4
    assert disturbance.task_threads({"kind": "bench", "threads": 0}) == 0
    assert disturbance.task_threads({"kind": "matmul", "threads": [1, 2, 4]}) == 4
    assert disturbance.task_threads({"kind": "bandwidth", "threads": []}) == 0  # the sweep's default
    assert disturbance.task_threads({"kind": "info"}) is None
    assert disturbance.task_threads({"kind": "bench", "threads": True}) is None
    stat = _stat({0: (1000, 5000, 0), 1: (1000, 5000, 0)})
    start, end = _snap(stat, [0, 1], 0.0, 0.0), _snap(stat, [0, 1], 1.0, 0.0)
    assert disturbance.delta(start, end, threads=4)["threads"] == 4
    assert disturbance.delta(start, end, threads=4)["cpus"] == 2
    assert "threads" not in disturbance.delta(start, end)
