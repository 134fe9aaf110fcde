"""A device's measured ceilings (peak effective TOPS per dtype, memory bandwidth) for the roofline floor:
found in the store from the latest matmul and bandwidth runs of that device, or measured now.

The ceilings are the best figures measured, whatever backend, size or thread count reached them: a floor
must hold for any way of running the model, so it uses the most the chip was seen to deliver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MeasurementError
from ..execution.jobs import Job
from ..lab.descriptors import DeviceSpec
from ..records import Record
from ..results.store import Store

CEILING_PROBES = ("matmul", "bandwidth")


@dataclass(frozen=True)
class Ceilings:
    """Best measured peak TOPS per dtype and best bandwidth, with where they came from."""

    device: str
    peak_tops: dict[str, float]
    bandwidth_gbps: float
    matmul_run: str | None = None
    bandwidth_run: str | None = None
    peak_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    bandwidth_params: dict[str, Any] = field(default_factory=dict)

    def to_params(self) -> dict[str, Any]:
        """Plain data for a job's params (what the roofline probe is given)."""
        return {
            "device": self.device,
            "peak_tops": dict(self.peak_tops),
            "bandwidth_gbps": self.bandwidth_gbps,
            "matmul_run": self.matmul_run,
            "bandwidth_run": self.bandwidth_run,
        }

    @classmethod
    def from_params(cls, data: dict[str, Any]) -> Ceilings:
        return cls(
            device=str(data.get("device", "")),
            peak_tops={k: float(v) for k, v in data["peak_tops"].items()},
            bandwidth_gbps=float(data["bandwidth_gbps"]),
            matmul_run=data.get("matmul_run"),
            bandwidth_run=data.get("bandwidth_run"),
        )


def best_peaks(records: Iterable[Record]) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Highest effective_tops per dtype among best-of-trials records (and the params that reached it)."""
    peaks: dict[str, float] = {}
    where: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.metric != "effective_tops" or r.value is None or r.params.get("stat", "best") != "best":
            continue
        dtype = str(r.params.get("dtype", "fp32"))
        if r.value > peaks.get(dtype, 0.0):
            peaks[dtype], where[dtype] = float(r.value), dict(r.params)
    return peaks, where


def best_bandwidth(records: Iterable[Record]) -> tuple[float | None, dict[str, Any]]:
    best, where = None, {}
    for r in records:
        if r.metric != "bandwidth_gbps" or r.value is None or r.params.get("stat", "best") != "best":
            continue
        if best is None or r.value > best:
            best, where = float(r.value), dict(r.params)
    return best, where


def ceilings_from_records(device: str, matmul: list[Record], bandwidth: list[Record]) -> Ceilings | None:
    peaks, peak_params = best_peaks(matmul)
    bw, bw_params = best_bandwidth(bandwidth)
    if not peaks or bw is None:
        return None
    return Ceilings(
        device,
        peaks,
        bw,
        matmul[0].run_id if matmul else None,
        bandwidth[0].run_id if bandwidth else None,
        peak_params,
        bw_params,
    )


def latest_records(store: Store, device: str, metric: str) -> list[Record]:
    """The records of `metric` for `device` from the most recent run that has any."""
    found = store.records(device=device, metric=metric)
    if not found:
        return []
    created = {r.run_id: r.created for r in store.runs()}
    latest = max({r.run_id for r in found}, key=lambda rid: (created.get(rid, ""), rid))
    return [r for r in found if r.run_id == latest]


def find_ceilings(store: Store, device: str) -> Ceilings | None:
    """Ceilings from the latest matmul and bandwidth runs of this device in the store, if both exist."""
    return ceilings_from_records(
        device,
        latest_records(store, device, "effective_tops"),
        latest_records(store, device, "bandwidth_gbps"),
    )


def ceiling_jobs(
    device: str, dtypes: list[str], overrides: dict[str, dict[str, Any]] | None = None
) -> list[Job]:
    """A quick but honest measurement: every backend at all cores, sizes swept to the plateau, no skinny
    shapes; bandwidth for every thread count (it often peaks before all cores). `overrides` adds params per
    probe ({"matmul": {...}, "bandwidth": {...}}), e.g. to restrict sizes in a suite or a test."""
    extra = overrides or {}
    return [
        Job(
            device=device,
            probe="matmul",
            params={"dtype": dtypes, "threads": "max", "skinny": False, **extra.get("matmul", {})},
        ),
        Job(device=device, probe="bandwidth", params={**extra.get("bandwidth", {})}),
    ]


def measure_ceilings(
    spec: DeviceSpec,
    store_path: Path | None,
    dtypes: list[str],
    overrides: dict[str, dict[str, Any]] | None = None,
    on_state: Callable[[str, str], None] | None = None,
) -> Ceilings:
    """Run the ceiling jobs on the device now (stored as their own run when a store is given), through the
    device's session (lease, retries); on_state hears "queued" while another run holds the device."""
    from ..execution.oneshot import run_now

    jobs = ceiling_jobs(spec.name, dtypes, overrides)
    shot = run_now(spec, jobs, store_path, "ceilings", on_state=on_state)
    shot.raise_first_error()
    records = shot.records
    found = ceilings_from_records(
        spec.name,
        [r for r in records if r.metric == "effective_tops"],
        [r for r in records if r.metric == "bandwidth_gbps"],
    )
    if found is None:
        raise MeasurementError(
            "the ceiling measurement produced no matmul or bandwidth figure", device=spec.name
        )
    return found


@dataclass(frozen=True)
class Measured:
    """A model's measured p50 latency on a device, from the store."""

    p50_ms: float
    run_id: str
    params: dict[str, Any]

    def to_params(self) -> dict[str, Any]:
        return {"p50_ms": self.p50_ms, "run_id": self.run_id, "params": self.params}

    @classmethod
    def from_params(cls, data: dict[str, Any]) -> Measured:
        return cls(float(data["p50_ms"]), str(data.get("run_id", "")), dict(data.get("params") or {}))


def measured_latency(
    store: Store, device: str, model: str, shapes: dict[str, list[int]] | None
) -> Measured | None:
    """The fastest p50 of the model on the device in the latest run that benched it with the same shapes."""
    found = [
        r
        for r in store.records(device=device, model=model, metric="latency_ms")
        if r.params.get("stat") == "p50"
        and r.value is not None
        and r.probe in ("bench", "threads")
        and (r.params.get("shapes") or {}) == (shapes or {})
    ]
    if not found:
        return None
    created = {r.run_id: r.created for r in store.runs()}
    latest = max({r.run_id for r in found}, key=lambda rid: (created.get(rid, ""), rid))
    best = min((r for r in found if r.run_id == latest), key=lambda r: r.value or 0.0)
    return Measured(float(best.value or 0.0), latest, {k: v for k, v in best.params.items() if k != "stat"})
