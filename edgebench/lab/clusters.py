"""CPU clusters by name: what `affinity = "big"` and the thread sweep's per-cluster groups pin to.

A descriptor's `[spec] cpu_clusters` names its clusters itself. Without one, the clusters the device's own
sysfs declares (the fingerprint's `cpu_clusters`, grouped by cpu_capacity and cpufreq maximum, slowest
first) are named by rank: "little" the slowest, "big" the fastest, "mid" between (mid1, mid2... when there
are several). The rank comes from the kernel's capacity figures, not from CPU numbers: on some phones the
big cores are the low-numbered ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import UserError


def ranked_names(count: int) -> list[str]:
    """Names for `count` clusters, slowest first: little, (mid | mid1, mid2...), big; none for one cluster."""
    if count < 2:
        return []
    middle = ["mid"] if count == 3 else [f"mid{i}" for i in range(1, count - 1)]
    return ["little", *middle, "big"]


def sysfs_clusters(found: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, ...]]:
    """The fingerprint's clusters named by rank of (capacity, max clock); groups of the same rank (one
    capacity and clock, different core parts) are one cluster. Empty when the CPUs are all alike."""
    ranks: dict[tuple[float, float], list[int]] = {}
    for c in found:
        key = (float(c.get("capacity") or 0), float(c.get("max_mhz") or 0))
        ranks.setdefault(key, []).extend(int(cpu) for cpu in c.get("cpus") or ())
    ordered = [tuple(sorted(ranks[k])) for k in sorted(ranks)]
    return dict(zip(ranked_names(len(ordered)), ordered, strict=False))


def device_clusters(
    declared: Mapping[str, Sequence[int]], fingerprint: Mapping[str, Any]
) -> dict[str, tuple[int, ...]]:
    """The descriptor's clusters when it names any, else those the device's sysfs declares."""
    if declared:
        return {name: tuple(int(c) for c in cpus) for name, cpus in declared.items()}
    return sysfs_clusters(fingerprint.get("cpu_clusters") or ())


def cluster_cpus(name: str, clusters: Mapping[str, tuple[int, ...]], device: str) -> tuple[int, ...]:
    """The CPUs of the cluster `name`; a UserError naming the device and the clusters it has otherwise."""
    if name in clusters:
        return clusters[name]
    if not clusters:
        raise UserError(
            f"affinity '{name}': device '{device}' declares no CPU clusters (no [spec] cpu_clusters, and "
            "its sysfs shows no cpu_capacity or cpufreq maximum that tells them apart); give CPU numbers"
        )
    known = ", ".join(f"{n} ({','.join(map(str, cpus))})" for n, cpus in clusters.items())
    raise UserError(f"affinity '{name}': device '{device}' has no such CPU cluster (it has {known})")
