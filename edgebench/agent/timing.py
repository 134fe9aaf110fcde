"""Measurement policy on the device: warm-up by count and time, then samples until runs AND seconds.

Knows nothing of models or devices: it times a zero-argument step with the device's monotonic clock. A step
may have a `refresh()` (session.Step): it is called before every run, outside the timed region, so a
runtime that reuses its input buffers computes on the given inputs every time.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class TimingPolicy:
    """Warm-up by count and time, then samples until `runs` and `min_seconds`, stopping at `max_seconds`."""

    warmup: int = 1
    warmup_seconds: float = 0.5
    runs: int = 100
    min_seconds: float = 1.0
    max_seconds: float = 60.0


def refresher(step: Callable[[], object]) -> Callable[[], None]:
    """The step's `refresh` (put its inputs back before a run), or a no-op for a plain callable."""
    return getattr(step, "refresh", None) or _nothing


def _nothing() -> None:
    return None


def time_once(step: Callable[[], object]) -> float:
    """One call in milliseconds."""
    refresher(step)()
    start = time.perf_counter_ns()
    step()
    return (time.perf_counter_ns() - start) / 1e6


def warm_up(step: Callable[[], object], policy: TimingPolicy) -> tuple[int, float]:
    """At least `warmup` calls and `warmup_seconds` (bounded by max_seconds); returns (calls, seconds)."""
    refresh = refresher(step)
    start = time.perf_counter()
    calls = 0
    while calls < policy.warmup or time.perf_counter() - start < policy.warmup_seconds:
        refresh()
        step()
        calls += 1
        if time.perf_counter() - start > policy.max_seconds:
            break
    return calls, time.perf_counter() - start


def sample(step: Callable[[], object], policy: TimingPolicy) -> tuple[list[float], bool]:
    """Time calls until at least `runs` samples and `min_seconds`; stop at `max_seconds`.

    Returns the samples in ms and whether max_seconds cut the run short of `runs`.
    """
    samples: list[float] = []
    clock = time.perf_counter_ns
    refresh = refresher(step)
    start = clock()
    max_ns, min_ns = policy.max_seconds * 1e9, policy.min_seconds * 1e9
    while True:
        refresh()
        t0 = clock()
        step()
        t1 = clock()
        samples.append((t1 - t0) / 1e6)
        elapsed = t1 - start
        if elapsed >= max_ns:
            return samples, len(samples) < policy.runs
        if len(samples) >= policy.runs and elapsed >= min_ns:
            return samples, False


KIB_TO_MB = 1024 / 1e6  # /proc and getrusage count KiB; edgebench reports MB (1e6 bytes)


def peak_rss_mb() -> float:
    """High-water resident set of this process (VmHWM), in MB (1e6 bytes)."""
    kib = _status_kib("VmHWM:")
    if kib is None:
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib * KIB_TO_MB


def current_rss_mb() -> float | None:
    """Resident set of this process now (VmRSS), in MB (1e6 bytes)."""
    kib = _status_kib("VmRSS:")
    return None if kib is None else kib * KIB_TO_MB


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current resident set; True if the kernel took it.

    Writing 5 to /proc/self/clear_refs (Linux 4.0+) restarts the high-water mark, so a peak read later is
    the peak since the reset: the model's load and inference, not the runtime import's transient buffers.
    getrusage's ru_maxrss follows it in a live process, so read the process peak before resetting."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def process_cpu_ns() -> int:
    """CPU nanoseconds of every thread of this process, each read from its own clock.

    The process clock (`time.process_time`) adds the other threads' time as the scheduler last accounted
    it, at its tick or a switch: a 1.3 ms call on two spinning onnxruntime threads read a CPU share of 0.5,
    and over 50 calls 1.0. A thread's own clock brings a running thread up to date (Linux encodes it from
    the thread id, as pthread_getcpuclockid does); elsewhere the process clock it is. A thread that ends
    between two readings takes its time with it: the pools timed here live as long as their session."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return time.process_time_ns()
    total = 0
    for tid in tids:
        try:
            total += time.clock_gettime_ns(((~int(tid)) << 3) | 6)
        except (OSError, ValueError):
            continue  # the thread ended between the listing and the read: its time is gone with it
    return total or time.process_time_ns()


def busy_cpu_seconds(cpus: list[int] | None) -> float | None:
    """Busy seconds (all but idle and iowait) of the given CPUs since boot (None: every CPU, the summary
    line), from /proc/stat; None where it cannot be read (not Linux, or an app sandbox that hides it)."""
    wanted = {"cpu"} if cpus is None else {f"cpu{c}" for c in cpus}
    if not wanted:
        return None
    total, seen = 0, 0
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                name, *fields = line.split()
                if name not in wanted:
                    continue
                ticks = [int(v) for v in fields[:8]]
                total += sum(ticks) - ticks[3] - ticks[4]  # idle, iowait
                seen += 1
    except (OSError, ValueError, IndexError):
        return None
    return total / os.sysconf("SC_CLK_TCK") if seen == len(wanted) else None


class OtherWork:
    """How many CPUs' worth of other processes ran on this process's CPUs over a stretch (`others_cpus`;
    None when /proc/stat is unreadable or the stretch too short for its ticks).

    A runtime's CPU share cannot see that: its pool spins while its other thread waits for a CPU, so
    beside two busy loops a 2-thread onnxruntime GEMM read share 0.97 at 40% of its undisturbed rate. The
    CPUs' own counters, minus what this process used, can."""

    MIN_SECONDS = 0.25  # /proc/stat counts in ticks (10 ms): shorter stretches are mostly rounding

    def __init__(self, cpus: list[int] | None = None) -> None:
        if not cpus and hasattr(os, "sched_getaffinity"):
            cpus = sorted(os.sched_getaffinity(0))
        self.cpus = sorted(cpus or [])
        self.others_cpus: float | None = None

    def __enter__(self) -> OtherWork:
        self._busy, self._own, self._t = busy_cpu_seconds(self.cpus), process_cpu_ns(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.monotonic() - self._t
        busy = busy_cpu_seconds(self.cpus)
        if busy is None or self._busy is None or wall < self.MIN_SECONDS:
            return
        own = (process_cpu_ns() - self._own) / 1e9
        self.others_cpus = max(0.0, busy - self._busy - own) / wall


# what `min_seconds` may stretch a profile to: a profiler's trace grows by every kernel of every
# instrumented run, and a second of PP-OCR cls's 235 kernels is ~100k events (~25 MB of JSON) already
MAX_ROUNDS = 1000


def alternate(plain: Any, instrumented: Any, warmup: int, runs: int, min_seconds: float = 0.0) -> list[float]:
    """Warm both up, then alternate one instrumented and one plain (timed) run; returns the plain times.

    At least `runs` rounds, and more until the measured rounds have lasted `min_seconds` (up to
    MAX_ROUNDS): a shared device's speed moves from one fraction of a second to the next (20 runs of a
    0.02 ms kernel, 0.4 ms in all, read anywhere in a 2x band over ten seconds here, while the median over
    those ten seconds came back within 5% in a new process), so a p50 stands for the device only when its
    runs are spread over a window that long.

    Each run is preceded by its step's refresh (outside the timer): the inputs are the inputs every time.
    """
    refresh_plain, refresh_instrumented = refresher(plain), refresher(instrumented)
    for _ in range(warmup):
        refresh_plain()
        plain()
        refresh_instrumented()
        instrumented()
    clock = time.perf_counter_ns
    samples: list[float] = []
    start = clock()
    while len(samples) < runs or (
        clock() - start < min_seconds * 1e9 and len(samples) < max(runs, MAX_ROUNDS)
    ):
        refresh_instrumented()
        instrumented()
        refresh_plain()
        t0 = clock()
        plain()
        samples.append((clock() - t0) / 1e6)
    return samples
