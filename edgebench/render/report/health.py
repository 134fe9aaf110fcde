"""Device health for the report: each device's latest `doctor` figures, flagged beside its numbers.

Pure functions over records (the `doctor` probe's, see probes/doctor.py): one row per device and runtime.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...records import Record

PROBE = "doctor"
COLUMNS = (
    "device",
    "doctor run",
    "runtime",
    "harness / bare loop",
    "noise CV",
    "timer",
    "governors",
    "matmul reach",
    "bandwidth reach",
    "flags",
)


@dataclass(frozen=True)
class DeviceHealth:
    device: str
    run_id: str
    rows: tuple[tuple[str, ...], ...]
    flags: tuple[str, ...]


def latest_health(records: Iterable[Record], run_order: Sequence[str]) -> list[DeviceHealth]:
    """Per device, its latest doctor run's figures (run order given oldest first)."""
    order = {rid: i for i, rid in enumerate(run_order)}
    by_device: dict[str, dict[str, list[Record]]] = {}
    for r in records:
        if r.probe == PROBE:
            by_device.setdefault(r.device, {}).setdefault(r.run_id, []).append(r)
    out = []
    for device in sorted(by_device):
        runs = by_device[device]
        run_id = max(runs, key=lambda rid: (order.get(rid, -1), rid))
        out.append(device_health(device, run_id, runs[run_id]))
    return out


def _ratio(r: Record | None, percent: bool = False) -> str:
    if r is None or r.value is None:
        return "–"
    text = f"{r.value:.1%}" if percent else f"{r.value:.3f}"
    return f"{text} ⚠" if r.annotations.get("flag") else text


def device_health(device: str, run_id: str, records: list[Record]) -> DeviceHealth:
    def one(metric: str, runtime: str | None = None, **params: object) -> Record | None:
        for r in records:
            if r.metric == metric and (runtime is None or r.runtime == runtime):
                if all(r.params.get(k) == v for k, v in params.items()):
                    return r
        return None

    timer = one("timer_resolution_ns")
    governors = sorted({str(r.annotations.get("governor")) for r in records if r.metric == "cpu_freq_mhz"})
    flags = tuple(next((r.annotations.get("flags") or [] for r in records if r.metric == "health_flags"), []))
    bandwidth = one("probe_reach", kind="bandwidth")
    runtimes = sorted({r.runtime for r in records if r.metric == "harness_overhead" and r.runtime})
    rows = []
    for runtime in runtimes or [""]:
        rows.append(
            (
                device,
                run_id,
                runtime or "–",
                _ratio(one("harness_overhead", runtime)),
                _ratio(one("noise_cv", runtime), percent=True),
                f"{timer.value:.0f} ns" if timer and timer.value is not None else "–",
                ", ".join(governors) or "–",
                _ratio(one("probe_reach", runtime, kind="matmul")),
                _ratio(bandwidth),
                "; ".join(f for f in flags if f" {runtime} " in f) or ("ok" if not flags else "see below"),
            )
        )
    return DeviceHealth(device, run_id, tuple(rows), flags)
