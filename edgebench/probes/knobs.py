"""What the compute probes derive from their typed params and the device: the CPUs a measurement may
use and the thread counts to sweep."""

from __future__ import annotations

from collections.abc import Sequence

from ..lab.device import Device


def device_cpus(device: Device, affinity: Sequence[int] | None) -> list[int]:
    """The CPUs the measurement may use: the job's affinity, else every CPU the agent may run on."""
    if affinity:
        return [int(c) for c in affinity]
    info = device.fingerprint()
    cpus = info.get("affinity") or list(range(int(info.get("cores") or 1)))
    return [int(c) for c in cpus]


def thread_counts(threads: Sequence[int] | str | None, cpus: int) -> list[int]:
    """The thread counts of a sweep: the given ones, "max" for all CPUs only, else 1..cpus."""
    if threads == "max":
        return [max(1, cpus)]
    counts = [int(t) for t in threads or () if int(t) > 0]
    return counts or list(range(1, max(1, cpus) + 1))
