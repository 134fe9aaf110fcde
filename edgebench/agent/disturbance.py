"""What else used the device while a task ran, read at the task's start and end (stdlib only: on devices).

From /proc/stat the machine's busy and steal jiffies (per CPU, for the CPUs the agent may run on), from
os.times the agent's own CPU time, from /proc/self/task/*/schedstat how long the agent's threads waited on
a run queue, and where readable the cpufreq current frequencies and the thermal zones. `delta` turns two
snapshots into shares of the time the CPUs were available:

  others_cpu_share     (busy jiffies of the allowed CPUs - own CPU time) / (elapsed x CPUs allowed)
  steal_share          steal jiffies / (elapsed x CPUs allowed)   (a VM's host took the CPU)
  runqueue_wait_share  run-queue wait / (run time + run-queue wait) of the agent's threads

Anything unreadable is left out (None), never guessed. Linux boards and Android shells can read these
files; elsewhere the result is empty.
"""

from __future__ import annotations

import glob
import os
import time
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


def _proc_stat(cpus: list[int] | None) -> dict[str, int] | None:
    """Busy and steal jiffies summed over the allowed CPUs (the `cpu` line when per-CPU lines are absent)."""
    text = _read("/proc/stat")
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
        if parts[0] == "cpu":
            total = fields
        elif parts[0][3:].isdigit():
            per[int(parts[0][3:])] = fields
    chosen = [per[c] for c in cpus if c in per] if cpus and per else []
    rows = chosen or ([total] if total else [])
    if not rows:
        return None
    busy = sum(sum(f[i] for i in range(8) if i not in IDLE_FIELDS and i != STEAL_FIELD) for f in rows)
    steal = sum(f[STEAL_FIELD] for f in rows)
    return {"busy": busy, "steal": steal, "cpus": len(chosen) if chosen else os.cpu_count() or 1}


def _schedstat() -> dict[str, int] | None:
    """Run time and run-queue wait (ns) summed over the agent's threads (/proc/self/task/*/schedstat)."""
    run = wait = 0
    found = False
    for path in glob.glob("/proc/self/task/*/schedstat") or ["/proc/self/schedstat"]:
        text = _read(path)
        parts = text.split() if text else []
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            run, wait, found = run + int(parts[0]), wait + int(parts[1]), True
    return {"run_ns": run, "wait_ns": wait} if found else None


def _freqs_mhz(cpus: list[int] | None) -> list[float]:
    out = []
    for cpu in cpus if cpus is not None else range(os.cpu_count() or 1):
        text = _read(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq")
        if text and text.strip().isdigit():
            out.append(int(text.strip()) / 1000.0)
    return out


def _temps_c() -> list[float]:
    out = []
    for path in glob.glob("/sys/class/thermal/thermal_zone*/temp"):
        text = _read(path)
        try:
            value = int((text or "").strip())
        except ValueError:
            continue
        out.append(value / 1000.0 if abs(value) > 1000 else float(value))
    return out


def snapshot() -> dict[str, Any]:
    """One reading of the counters (and the frequency and temperature now)."""
    cpus = _allowed_cpus()
    t = os.times()
    return {
        "t": time.monotonic(),
        "own_s": t.user + t.system,
        "stat": _proc_stat(cpus),
        "sched": _schedstat(),
        "freq_mhz": _freqs_mhz(cpus),
        "temp_c": _temps_c(),
    }


def delta(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """Shares of the CPUs' available time between two snapshots; unreadable parts are left out."""
    elapsed = end["t"] - start["t"]
    out: dict[str, Any] = {"elapsed_s": elapsed}
    try:
        hz = os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        hz = 100
    a, b = start.get("stat"), end.get("stat")
    if a and b and elapsed > 0:
        cpus = b["cpus"]
        available = elapsed * cpus
        own = max(0.0, end["own_s"] - start["own_s"])
        busy = (b["busy"] - a["busy"]) / hz
        out["cpus"] = cpus
        out["own_cpu_s"] = own
        out["others_cpu_share"] = min(1.0, max(0.0, (busy - own) / available))
        out["steal_share"] = min(1.0, max(0.0, (b["steal"] - a["steal"]) / hz / available))
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
