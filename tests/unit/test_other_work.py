"""The agent's watch of other processes on its CPUs (agent.timing.OtherWork), checked against the exact
CPU time of a process it does not own, read from that process's own /proc entry over the same stretch."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebench.agent.timing import OtherWork, busy_cpu_seconds


def process_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_cpu() -> int:
    return sorted(os.sched_getaffinity(0))[-1]


def test_a_process_spinning_on_the_watched_cpu_is_counted_as_other_work() -> None:
    cpu = one_cpu()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {cpu})
        time.sleep(0.2)
        before, t0 = process_cpu_seconds(spinner.pid), time.monotonic()
        with OtherWork([cpu]) as watch:
            time.sleep(0.8)
        theirs = (process_cpu_seconds(spinner.pid) - before) / (time.monotonic() - t0)
    finally:
        spinner.kill()
        spinner.wait()
    assert watch.others_cpus is not None
    # at least what the spinner took (ticks: +-0.1), at most the one CPU watched
    assert theirs - 0.1 <= watch.others_cpus <= 1.1, (watch.others_cpus, theirs)
    assert watch.others_cpus >= 0.4  # whatever else runs, the spinner has its share of that CPU


def test_this_processs_own_work_on_the_watched_cpu_is_not_other_work() -> None:
    cpu = one_cpu()
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        own0, t0 = time.thread_time(), time.monotonic()
        with OtherWork([cpu]) as watch:
            while time.monotonic() - t0 < 0.8:
                pass
        own = (time.thread_time() - own0) / (time.monotonic() - t0)
    finally:
        os.sched_setaffinity(0, before)
    assert watch.others_cpus is not None
    # what this thread did not get of the CPU is the most others can have taken (ticks: +-0.1)
    assert watch.others_cpus <= 1.0 - own + 0.1, (watch.others_cpus, own)


def test_a_stretch_too_short_for_the_ticks_or_an_unreadable_cpu_says_nothing() -> None:
    with OtherWork() as short:
        pass
    assert short.others_cpus is None
    assert busy_cpu_seconds([10**6]) is None and busy_cpu_seconds([]) is None
    with OtherWork([10**6]) as missing:
        time.sleep(OtherWork.MIN_SECONDS + 0.05)
    assert missing.others_cpus is None


@pytest.mark.parametrize("cpus", [None, [0]])
def test_it_watches_the_cpus_it_may_run_on_unless_told(cpus: list[int] | None) -> None:
    assert OtherWork(cpus).cpus == (cpus or sorted(os.sched_getaffinity(0)))


def test_the_whole_machine_is_the_sum_of_its_cpus() -> None:
    """None reads /proc/stat's summary line: the sum of every CPU's line (read back to back: a few ticks
    apart at most)."""
    lines = Path("/proc/stat").read_text().splitlines()
    every = [int(line.split()[0][3:]) for line in lines if line[:3] == "cpu" and line[3].isdigit()]
    whole, summed = busy_cpu_seconds(None), busy_cpu_seconds(every)
    assert whole is not None and summed is not None and whole > 0
    assert abs(whole - summed) < 0.1 * len(every), (whole, summed)
