"""`affinity = "big"`: a cluster's name, kept by the params until the job meets its device, then that
device's CPUs, ranked by the capacity its sysfs declares (or named by its descriptor)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from edgebench.errors import UserError
from edgebench.jobs import Job
from edgebench.lab.clusters import cluster_cpus, device_clusters, ranked_names, sysfs_clusters
from edgebench.probes.knobs import resolve_affinity
from edgebench.probes.registry import BenchParams, ThreadsParams

# a phone whose big cores are the low-numbered ones: the names follow cpu_capacity, not CPU numbers
PHONE = [
    {"cpus": [4, 5, 6, 7], "capacity": 160, "max_mhz": 1800.0, "core": "Cortex-A55"},
    {"cpus": [2, 3], "capacity": 700, "max_mhz": 2400.0, "core": "Cortex-A78"},
    {"cpus": [0, 1], "capacity": 1024, "max_mhz": 3000.0, "core": "Cortex-X1"},
]


def test_clusters_are_named_by_rank_of_capacity() -> None:
    assert ranked_names(1) == [] and ranked_names(2) == ["little", "big"]
    assert ranked_names(4) == ["little", "mid1", "mid2", "big"]
    assert sysfs_clusters(PHONE) == {"little": (4, 5, 6, 7), "mid": (2, 3), "big": (0, 1)}
    assert sysfs_clusters(list(reversed(PHONE)))["big"] == (0, 1)  # order given does not matter
    alike = [
        {"cpus": [0], "capacity": 1024, "max_mhz": 2000.0},
        {"cpus": [1], "capacity": 1024, "max_mhz": 2000.0},
    ]
    assert sysfs_clusters(alike) == {}  # one rank (an x86 VM, or parts told apart only by MIDR)


def test_the_descriptor_names_its_clusters_over_the_sysfs() -> None:
    declared = {"silver": (0, 1), "gold": (2, 3)}
    assert device_clusters(declared, {"cpu_clusters": PHONE}) == declared
    assert device_clusters({}, {"cpu_clusters": PHONE})["little"] == (4, 5, 6, 7)


def test_an_unknown_or_unrankable_cluster_is_a_one_line_user_error() -> None:
    with pytest.raises(UserError, match=r"has no such CPU cluster \(it has little \(4,5,6,7\), mid"):
        cluster_cpus("prime", sysfs_clusters(PHONE), "pixel")
    with pytest.raises(UserError, match="declares no CPU clusters"):
        cluster_cpus("big", {}, "vm")


def test_params_keep_a_cluster_name_and_still_parse_cpu_numbers() -> None:
    assert BenchParams.parse({"affinity": "big"}).affinity == "big"
    assert ThreadsParams.parse({"affinity": "4-5,7"}).affinity == (4, 5, 7)


def fake_device(declared: dict[str, Any], clusters: list[dict[str, Any]]) -> Any:
    """The two things resolve_affinity asks of a Device: its descriptor's clusters and its fingerprint."""
    spec = SimpleNamespace(spec=SimpleNamespace(cpu_clusters=declared))
    return SimpleNamespace(name="pixel", spec=spec, fingerprint=lambda: {"cpu_clusters": clusters})


def test_a_job_pinned_by_name_runs_pinned_to_that_clusters_cpus() -> None:
    job = Job("pixel", "bench", params={"affinity": "little", "runs": 3})
    pinned, notes = resolve_affinity(fake_device({}, PHONE), job)
    assert pinned.params == {"affinity": [4, 5, 6, 7], "runs": 3} and notes == {"affinity_cluster": "little"}
    assert BenchParams.of(pinned).affinity == (4, 5, 6, 7)
    numbered = Job("pixel", "bench", params={"affinity": [1]})
    assert resolve_affinity(fake_device({}, PHONE), numbered) == (numbered, {})
