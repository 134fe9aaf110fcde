"""What else used the device while a task ran, read at the task's start and end (stdlib only: on devices).

From /proc/stat the busy and steal jiffies of every CPU (its cpuN rows, kept per CPU), from os.times the
agent's own CPU time, from /proc/self/task/*/schedstat how long the agent's threads waited on a run queue,
the CPUs the agent may run on, and where readable the cpufreq current frequencies and the thermal zones.
`delta` turns two snapshots into shares of the time the CPUs were available:

  others_cpu_share     (busy jiffies of the counted CPUs - own CPU time) / (elapsed x CPUs counted)
  steal_share          steal jiffies of the counted CPUs / (elapsed x CPUs counted)   (a VM's host took it)
  runqueue_wait_share  run-queue wait / (run time + run-queue wait) of the agent's threads
  cpus                 the CPUs the agent was allowed at the end (those its runtime's threads ran on)
  threads              the most threads the task ran at once (`task_threads`; 0: the runtime's default)

The counted CPUs (`cpus_counted`) are those allowed at either snapshot and present in both
(`counted_cpus`): a job that pins itself, or a phone that takes CPUs offline, changes the set between the
two readings. `threads` beside `cpus` lets the host tell a job whose own threads outnumber its CPUs, whose
run-queue wait is then its own (analysis.disturbance).

Anything unreadable is left out (None), never guessed. Linux boards and Android shells can read these
files; elsewhere the result is empty. The files are read through `read` (a path -> text function), so tests
can hand in their own /proc/stat.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable
from typing import Any

STEAL_FIELD = 7  # user nice system idle iowait irq softirq steal guest guest_nice
IDLE_FIELDS = (3, 4)  # idle, iowait: not busy


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _allowed_cpus() -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def parse_proc_stat(text: str | None) -> dict[str, Any] | None:
    """Busy and steal jiffies per CPU (`per`: cpu number -> [busy, steal]) and of the `cpu` line (`all`)."""
    if text is None:
        return None
    total: list[int] | None = None
    per: dict[int, list[int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or not parts[0].startswith("cpu"):
            continue
        try:
            fields = [int(v) for v in parts[1:9]]
        except ValueError:
            continue
        fields += [0] * (8 - len(fields))
        busy = sum(fields[i] for i in range(8) if i not in IDLE_FIELDS and i != STEAL_FIELD)
        if parts[0] == "cpu":
            total = [busy, fields[STEAL_FIELD]]
        elif parts[0][3:].isdigit():
            per[int(parts[0][3:])] = [busy, fields[STEAL_FIELD]]
    if total is None and not per:
        return None
    return {"per": per, "all": total}


def _schedstat(read: Callable[[str], str | None]) -> dict[str, int] | None:
    """Run time and run-queue wait (ns) summed over the agent's threads (/proc/self/task/*/schedstat)."""
    run = wait = 0
    found = False
    for path in glob.glob("/proc/self/task/*/schedstat") or ["/proc/self/schedstat"]:
        text = read(path)
        parts = text.split() if text else []
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            run, wait, found = run + int(parts[0]), wait + int(parts[1]), True
    return {"run_ns": run, "wait_ns": wait} if found else None


def _freqs_mhz(cpus: list[int] | None, read: Callable[[str], str | None]) -> list[float]:
    out = []
    for cpu in cpus if cpus is not None else range(os.cpu_count() or 1):
        text = read(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq")
        if text and text.strip().isdigit():
            out.append(int(text.strip()) / 1000.0)
    return out


def _temps_c(read: Callable[[str], str | None]) -> list[float]:
    out = []
    for path in glob.glob("/sys/class/thermal/thermal_zone*/temp"):
        text = read(path)
        try:
            value = int((text or "").strip())
        except ValueError:
            continue
        out.append(value / 1000.0 if abs(value) > 1000 else float(value))
    return out


def snapshot(
    read: Callable[[str], str | None] = _read,
    allowed: Callable[[], list[int] | None] = _allowed_cpus,
) -> dict[str, Any]:
    """One reading of the counters (and the frequency and temperature now); `read` and `allowed` stand in
    for the files and the affinity in tests."""
    cpus = allowed()
    t = os.times()
    return {
        "t": time.monotonic(),
        "own_s": t.user + t.system,
        "allowed": cpus,
        "stat": parse_proc_stat(read("/proc/stat")),
        "sched": _schedstat(read),
        "freq_mhz": _freqs_mhz(cpus, read),
        "temp_c": _temps_c(read),
    }


def counted_cpus(start: dict[str, Any], end: dict[str, Any]) -> list[int]:
    """The CPUs whose jiffies `delta` sums: allowed at either snapshot (the union) and present in both.

    The union, not the end's set, because the agent's own CPU time (os.times) is subtracted from the busy
    jiffies and covers every CPU it ran on: the import and load before a bench pins itself ran on the start
    set, the timed runs on the end set, and a sweep's end mask is only its last step. Summing over the end
    set alone would subtract time it never counted (reading others' share low again). The union is also
    the conservative side: a neighbour on any CPU the job could use counts, and a job measured disturbed is
    NOISY rather than FAIL. Its cost: a neighbour confined to the one CPU a job pinned itself to is diluted
    by the union's width. A CPU missing from either snapshot (offline) is left out: its counters say
    nothing about the time between them.
    """
    a, b = start.get("stat") or {}, end.get("stat") or {}
    present = set(a.get("per") or {}) & set(b.get("per") or {})
    allowed = set(start.get("allowed") or ()) | set(end.get("allowed") or ())
    return sorted(present & allowed if allowed else present)


def task_threads(task: dict[str, Any]) -> int | None:
    """The most threads a task runs at once: its `threads`, or the largest of a sweep's list; 0 where it
    leaves the count to the runtime (an empty sweep: the CPU count); None where it names none."""
    threads = task.get("threads")
    if isinstance(threads, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in threads):
        return max(threads, default=0)
    if isinstance(threads, int) and not isinstance(threads, bool):
        return threads
    return None


def delta(start: dict[str, Any], end: dict[str, Any], threads: int | None = None) -> dict[str, Any]:
    """Shares of the CPUs' available time between two snapshots (over `counted_cpus`, their number in
    `cpus_counted`); unreadable parts are left out. Without per-CPU rows in both snapshots the `cpu` line
    is used, over every CPU.

    `cpus` is how many CPUs the agent was allowed at the end (its runtime's thread pool inherits the pin),
    `threads` the task's count (`task_threads`) as given: the host compares the two, and reads 0 as the
    runtime's default, one thread per CPU.
    """
    elapsed = end["t"] - start["t"]
    out: dict[str, Any] = {"elapsed_s": elapsed}
    try:
        hz = os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        hz = 100
    allowed = end.get("allowed")
    out["cpus"] = len(allowed) if allowed else os.cpu_count() or 1
    if threads is not None:
        out["threads"] = threads
    a, b = start.get("stat"), end.get("stat")
    counted = counted_cpus(start, end)
    if counted and a and b:
        rows = [(a["per"][c], b["per"][c]) for c in counted]
        n = len(counted)
    elif a and b and a.get("all") and b.get("all"):
        rows, n = [(a["all"], b["all"])], os.cpu_count() or 1
    else:
        rows, n = [], 0
    if rows and elapsed > 0:
        available = elapsed * n
        own = max(0.0, end["own_s"] - start["own_s"])
        busy = sum(y[0] - x[0] for x, y in rows) / hz
        steal = sum(y[1] - x[1] for x, y in rows) / hz
        out["cpus_counted"] = n
        out["own_cpu_s"] = own
        out["others_cpu_share"] = min(1.0, max(0.0, (busy - own) / available))
        out["steal_share"] = min(1.0, max(0.0, steal / available))
    s0, s1 = start.get("sched"), end.get("sched")
    if s0 and s1:
        ran, waited = s1["run_ns"] - s0["run_ns"], s1["wait_ns"] - s0["wait_ns"]
        if ran + waited > 0 and waited >= 0:
            out["runqueue_wait_share"] = waited / (ran + waited)
    freqs = list(start.get("freq_mhz") or []) + list(end.get("freq_mhz") or [])
    if freqs:
        out["freq_min_mhz"], out["freq_max_mhz"] = min(freqs), max(freqs)
    temps = list(start.get("temp_c") or []) + list(end.get("temp_c") or [])
    if temps:
        out["temp_max_c"] = max(temps)
    return out
