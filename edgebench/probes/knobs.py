"""What the compute probes derive from their typed params and the device: the CPUs a measurement may
use (a cluster named in `affinity` resolved to its CPUs) and the thread counts to sweep."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..jobs import Job
from ..lab.clusters import cluster_cpus
from ..lab.clusters import device_clusters as named_clusters
from ..lab.device import Device


def device_cpus(device: Device, affinity: Sequence[int] | None) -> list[int]:
    """The CPUs the measurement may use: the job's affinity, else every CPU the agent may run on."""
    if affinity:
        return [int(c) for c in affinity]
    info = device.fingerprint()
    cpus = info.get("affinity") or list(range(int(info.get("cores") or 1)))
    return [int(c) for c in cpus]


def device_clusters(device: Device) -> dict[str, tuple[int, ...]]:
    """The device's CPU clusters by name: its descriptor's, else those its sysfs declares (asked of the
    fingerprint only then)."""
    declared = device.spec.spec.cpu_clusters
    return named_clusters(declared, {} if declared else device.fingerprint())


def resolve_affinity(device: Device, job: Job) -> tuple[Job, dict[str, Any]]:
    """The job with a cluster-named affinity ("big") turned into that cluster's CPUs on this device, and
    the annotations saying so; the job unchanged when its affinity is CPU numbers or absent. Resolved
    here, where the device is known, so every probe sees CPU numbers and records carry them."""
    name = job.params.get("affinity")
    if not isinstance(name, str):
        return job, {}
    cpus = cluster_cpus(name, device_clusters(device), device.name)
    params = {**job.params, "affinity": list(cpus)}
    return dataclasses.replace(job, params=params), {"affinity_cluster": name}


def thread_counts(threads: Sequence[int] | str | None, cpus: int) -> list[int]:
    """The thread counts of a sweep: the given ones, "max" for all CPUs only, else 1..cpus."""
    if threads == "max":
        return [max(1, cpus)]
    counts = [int(t) for t in threads or () if int(t) > 0]
    return counts or list(range(1, max(1, cpus) + 1))
