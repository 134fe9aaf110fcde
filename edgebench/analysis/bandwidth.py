"""A device's DRAM bandwidth as the stored bandwidth records give it: the figure a decode floor divides by and
fit's decode prediction multiplies by.

One place, read by the probes (the decode's floor) and by the analysis (fit on a GGUF), so both judge
"DRAM-sized" by one rule: arrays at least four times the last-level cache (STREAM's rule)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..records import Record

MIB = 2**20
DRAM_LLC_MULTIPLE = 4  # bandwidth arrays this many times the last-level cache measure DRAM (STREAM's rule)
DRAM_MIN_BYTES = 256 * MIB  # ... and when the cache size is unknown, at least this


@dataclass(frozen=True)
class DramBandwidth:
    """A device's DRAM bandwidth and where it was measured."""

    gbps: float
    run_id: str | None
    source: str  # "store" or "measured" (by this job, before the decode)
    kernel: str | None = None
    threads: int | None = None
    array_bytes: int | None = None
    llc_bytes: int | None = None
    phase: str | None = None  # measured by a decode job: "before" or "after" it

    @property
    def dram_sized(self) -> bool:
        """The arrays were far larger than the last-level cache, so the figure is DRAM's."""
        return is_dram_sized(self.array_bytes, self.llc_bytes)

    def to_params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_params(cls, data: dict[str, Any]) -> DramBandwidth:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def is_dram_sized(array_bytes: int | None, llc_bytes: int | None) -> bool:
    if not array_bytes:
        return False
    return array_bytes >= (DRAM_LLC_MULTIPLE * llc_bytes if llc_bytes else DRAM_MIN_BYTES)


def dram_bandwidth(
    records: Iterable[Record], source: str, kernel: str | None = None, threads: int | None = None
) -> DramBandwidth | None:
    """The device's DRAM bandwidth from bandwidth records: the best best-of-trials figure of any kernel and
    thread count (a floor must hold however the model is run), or of `kernel` at `threads` where given.
    DRAM-sized runs win over smaller ones. The one place the floor's bandwidth comes from: a memory
    hierarchy can answer here instead."""
    found = []
    for r in records:
        if r.metric != "bandwidth_gbps" or r.value is None or r.params.get("stat") != "best":
            continue
        if (kernel and r.params.get("kernel") != kernel) or (threads and r.params.get("threads") != threads):
            continue
        array, llc = r.params.get("array_bytes"), r.annotations.get("llc_bytes")
        found.append((is_dram_sized(array, llc), float(r.value), r, array, llc))
    if not found:
        return None
    _, gbps, r, array, llc = max(found, key=lambda f: (f[0], f[1]))
    kernel, threads, phase = r.params.get("kernel"), r.params.get("threads"), r.params.get("phase")
    return DramBandwidth(gbps, r.run_id, source, kernel, threads, array, llc, phase)


def latest_dram_bandwidth(
    records: Iterable[Record], device: str, kernel: str, threads: int | None, run_order: Sequence[str]
) -> DramBandwidth | None:
    """The device's `kernel` bandwidth at `threads` from stored bandwidth runs: the latest run's DRAM-sized
    figure, else the latest run's figure (its `dram_sized` False: caches may have fed it)."""
    rank = {run_id: i for i, run_id in enumerate(run_order)}
    mine = [r for r in records if r.device == device and r.probe == "bandwidth"]
    found = []
    for run_id in sorted({r.run_id for r in mine}, key=lambda x: rank.get(x, -1), reverse=True):
        bw = dram_bandwidth([r for r in mine if r.run_id == run_id], "store", kernel, threads)
        if bw is not None:
            found.append(bw)
    return next((b for b in found if b.dram_sized), found[0]) if found else None
