"""A device's ceilings as a model runs there: peak effective TOPS per dtype and the memory hierarchy's
bandwidths, measured at the thread count (and affinity) the model was benched with, recently, on that
device, with the run each figure came from; and the roofline floor they give.

Which figures (`ceilings_at`):
- a thread count T is served by the matmul and bandwidth measurements at T threads or fewer: a runtime
  with T threads can always do what fewer threads did, so the ceiling at T is the best of those (never a
  figure measured with more threads than the model had);
- recent: per dtype (or level) and thread count, the latest run that measured it, not the best of every
  run ever stored (a device that was re-flashed, throttled or moved keeps no stale maximum);
- an affinity pins the ceilings to measurements with the same affinity (unpinned ones serve unpinned
  benches);
- the memory hierarchy comes from a bandwidth sweep (`probe bandwidth --sweep`): levels (L2, LLC, DRAM) with
  the working set each serves, and the curve itself; without one, the STREAM figure stands for every level.

The floor (`floor_at`): FLOPs of each compute class at its peak, and the model's least memory traffic
(weights + inputs + outputs) at the bandwidth of the level its working set (weights + the activations alive
at once) lives in: the best any sweep kernel reached on working sets from half that size up to the level's
end, so a floor holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..jobs import Job
from ..records import Record
from ..results.store import Store
from ..runtimes import names as runtime_names
from ..runtimes import runtime as runtime_named
from .cost import Floor, ModelCost, floor

CEILING_PROBES = ("matmul", "bandwidth")
DRAM = "DRAM"


@dataclass(frozen=True)
class LevelCeiling:
    """One level of the memory hierarchy: the working sets it serves (up to `capacity_bytes`; None for
    DRAM) and the most any kernel streamed from it."""

    name: str
    gbps: float
    capacity_bytes: int | None
    run_id: str | None = None
    threads: int | None = None

    def to_params(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gbps": self.gbps,
            "capacity_bytes": self.capacity_bytes,
            "run_id": self.run_id,
            "threads": self.threads,
        }

    @classmethod
    def from_params(cls, d: dict[str, Any]) -> LevelCeiling:
        cap = d.get("capacity_bytes")
        return cls(
            str(d["name"]), float(d["gbps"]), int(cap) if cap else None, d.get("run_id"), d.get("threads")
        )


@dataclass(frozen=True)
class Ceilings:
    """Peak TOPS per dtype and bandwidths, with the thread count they serve and where they came from."""

    device: str
    peak_tops: dict[str, float]
    bandwidth_gbps: float  # DRAM (or the one STREAM figure when there is no sweep)
    matmul_run: str | None = None
    bandwidth_run: str | None = None
    peak_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    bandwidth_params: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None  # the thread count these ceilings serve (None: any)
    affinity: tuple[int, ...] | None = None
    levels: tuple[LevelCeiling, ...] = ()
    curve: tuple[tuple[int, float], ...] = ()  # (working-set bytes, best GB/s of any sweep kernel)
    peak_runs: dict[str, str] = field(default_factory=dict)
    peak_shares: dict[str, float] = field(default_factory=dict)  # CPU share of each peak's best trial

    def to_params(self) -> dict[str, Any]:
        """Plain data for a job's params (what the roofline probe is given)."""
        return {
            "device": self.device,
            "peak_tops": dict(self.peak_tops),
            "bandwidth_gbps": self.bandwidth_gbps,
            "matmul_run": self.matmul_run,
            "bandwidth_run": self.bandwidth_run,
            "threads": self.threads,
            "affinity": list(self.affinity) if self.affinity else None,
            "levels": [lv.to_params() for lv in self.levels],
            "curve": [list(p) for p in self.curve],
            "peak_runs": dict(self.peak_runs),
            "peak_shares": dict(self.peak_shares),
        }

    @classmethod
    def from_params(cls, data: dict[str, Any]) -> Ceilings:
        return cls(
            device=str(data.get("device", "")),
            peak_tops={k: float(v) for k, v in data["peak_tops"].items()},
            bandwidth_gbps=float(data["bandwidth_gbps"]),
            matmul_run=data.get("matmul_run"),
            bandwidth_run=data.get("bandwidth_run"),
            threads=data.get("threads"),
            affinity=tuple(data["affinity"]) if data.get("affinity") else None,
            levels=tuple(LevelCeiling.from_params(d) for d in data.get("levels") or ()),
            curve=tuple((int(s), float(g)) for s, g in data.get("curve") or ()),
            peak_runs=dict(data.get("peak_runs") or {}),
            peak_shares=dict(data.get("peak_shares") or {}),
        )

    def level_for(self, working_set_bytes: float) -> LevelCeiling:
        """The level a working set lives in: the smallest whose capacity holds it (DRAM beyond)."""
        for lv in self.levels:
            if lv.capacity_bytes is None or working_set_bytes <= lv.capacity_bytes:
                return lv
        return LevelCeiling(DRAM, self.bandwidth_gbps, None, self.bandwidth_run, self.threads)

    def bandwidth_for(self, working_set_bytes: float) -> tuple[str, float]:
        """(level, GB/s) a working set of this size streams at: the best measured on working sets from half
        its size to the end of its level (the level's own figure when the sweep has no such point)."""
        lv = self.level_for(working_set_bytes)
        start = working_set_bytes / 2
        end = lv.capacity_bytes if lv.capacity_bytes is not None else float("inf")
        near = [g for s, g in self.curve if start <= s <= end]
        if lv.name == DRAM:  # the STREAM figure too, where one was measured: the most DRAM was seen to do
            near.append(self.bandwidth_gbps)
        return lv.name, max(near) if near else lv.gbps


# ---- picking the figures -------------------------------------------------------------------------------
def _is_best(r: Record) -> bool:
    return r.value is not None and r.value > 0 and r.params.get("stat", "best") == "best"


def _threads_of(r: Record) -> int | None:
    t = r.params.get("threads")
    return int(t) if isinstance(t, int | float) and t > 0 else None


def _affinity_of(r: Record) -> tuple[int, ...] | None:
    a = r.params.get("affinity")
    return tuple(int(c) for c in a) if a else None


def _usable(r: Record, threads: int | None, affinity: tuple[int, ...] | None) -> bool:
    """Measured at no more threads than the model had, with the same pinning."""
    t = _threads_of(r)
    if threads is not None and (t is None or t > threads):
        return False
    return _affinity_of(r) == (tuple(affinity) if affinity else None)


def _latest_per(
    records: Iterable[Record], group: Callable[[Record], tuple], order: dict[str, int]
) -> dict[tuple, list[Record]]:
    """Per group, the records of the latest run that has any."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault(group(r), []).append(r)
    out = {}
    for key, recs in groups.items():
        latest = max({r.run_id for r in recs}, key=lambda rid: (order.get(rid, -1), rid))
        out[key] = [r for r in recs if r.run_id == latest]
    return out


def best_peaks(
    records: Iterable[Record], order: dict[str, int] | None = None
) -> tuple[dict[str, float], dict[str, dict[str, Any]], dict[str, str]]:
    """Per dtype, the highest effective_tops of the latest run at each thread count, over those counts
    (with the params that reached it and its run)."""
    found = [r for r in records if r.metric == "effective_tops" and _is_best(r)]
    latest = _latest_per(found, lambda r: (str(r.params.get("dtype", "fp32")), _threads_of(r)), order or {})
    peaks: dict[str, float] = {}
    where: dict[str, dict[str, Any]] = {}
    runs: dict[str, str] = {}
    for (dtype, _), recs in latest.items():
        top = max(recs, key=lambda r: r.value or 0.0)
        if (top.value or 0.0) > peaks.get(dtype, 0.0):
            peaks[dtype], where[dtype], runs[dtype] = float(top.value or 0.0), dict(top.params), top.run_id
    return peaks, where, runs


def best_bandwidth(
    records: Iterable[Record], order: dict[str, int] | None = None
) -> tuple[float | None, dict[str, Any], str | None]:
    """The highest STREAM bandwidth_gbps of the latest run at each thread count, over those counts."""
    found = [r for r in records if r.metric == "bandwidth_gbps" and _is_best(r)]
    latest = _latest_per(found, lambda r: (_threads_of(r),), order or {})
    best, where, run = None, {}, None
    for recs in latest.values():
        top = max(recs, key=lambda r: r.value or 0.0)
        if best is None or (top.value or 0.0) > best:
            best, where, run = float(top.value or 0.0), dict(top.params), top.run_id
    return best, where, run


def hierarchy_at(
    records: Iterable[Record], order: dict[str, int] | None = None
) -> tuple[tuple[LevelCeiling, ...], tuple[tuple[int, float], ...], str | None]:
    """The levels and the curve of the latest sweep at the most threads among the records."""
    levels = [r for r in records if r.metric == "level_bandwidth_gbps" and r.value]
    if not levels:
        return (), (), None
    most = max((_threads_of(r) or 0) for r in levels)
    at = [r for r in levels if (_threads_of(r) or 0) == most]
    run = max({r.run_id for r in at}, key=lambda rid: ((order or {}).get(rid, -1), rid))
    chosen = sorted(
        (r for r in at if r.run_id == run),
        key=lambda r: r.annotations.get("capacity_bytes") or float("inf"),
    )
    out = tuple(
        LevelCeiling(
            str(r.params.get("level")),
            float(r.value or 0.0),
            r.annotations.get("capacity_bytes"),
            r.run_id,
            most or None,
        )
        for r in chosen
    )
    curve: dict[int, float] = {}
    for r in records:
        if (
            r.metric == "sweep_bandwidth_gbps"
            and r.run_id == run
            and (_threads_of(r) or 0) == most
            and r.value
        ):
            size = int(r.params.get("working_set_bytes") or 0)
            curve[size] = max(curve.get(size, 0.0), float(r.value))
    return out, tuple(sorted(curve.items())), run


def ceilings_at(
    records: Sequence[Record],
    device: str,
    threads: int | None = None,
    affinity: Sequence[int] | None = None,
    run_order: Sequence[str] = (),
) -> Ceilings | None:
    """The ceilings serving a model benched on `device` with `threads` (None: any count) and `affinity`:
    see the module docstring. None without both a matmul and a bandwidth figure."""
    order = {rid: i for i, rid in enumerate(run_order)}
    pin = tuple(affinity) if affinity else None
    mine = [
        r for r in records if r.device == device and r.probe in CEILING_PROBES and _usable(r, threads, pin)
    ]
    peaks, peak_params, peak_runs = best_peaks(mine, order)
    bw, bw_params, bw_run = best_bandwidth(mine, order)
    levels, curve, sweep_run = hierarchy_at(mine, order)
    dram = next((lv for lv in levels if lv.name == DRAM), None)
    if bw is None and dram is not None:
        bw, bw_run = dram.gbps, dram.run_id
    if not peaks or bw is None:
        return None
    return Ceilings(
        device,
        peaks,
        bw,
        matmul_run=peak_runs.get("fp32") or next(iter(peak_runs.values()), None),
        bandwidth_run=sweep_run or bw_run,
        peak_params=peak_params,
        bandwidth_params=bw_params,
        threads=threads,
        affinity=pin,
        levels=levels,
        curve=curve,
        peak_runs=peak_runs,
        peak_shares=_shares(mine, peak_params, peak_runs),
    )


def _shares(
    records: Sequence[Record], where: dict[str, dict[str, Any]], runs: dict[str, str]
) -> dict[str, float]:
    """The CPU share of the record behind each dtype's peak: its best trial's own share, or less where other
    processes left its threads less of the CPUs idle (annotations; a spinning pool reads full either way)."""
    out = {}
    for r in records:
        dtype = str(r.params.get("dtype", "fp32"))
        if r.metric != "effective_tops" or r.run_id != runs.get(dtype) or r.params != where.get(dtype):
            continue
        shares = [r.annotations.get(k) for k in ("cpu_share", "idle_cpu_share")]
        known = [float(v) for v in shares if isinstance(v, int | float)]
        if known:
            out[dtype] = min(known)
    return out


def find_ceilings(
    store: Store, device: str, threads: int | None = None, affinity: Sequence[int] | None = None
) -> Ceilings | None:
    """Ceilings for a configuration from the store (see `ceilings_at`)."""
    records = [r for probe in CEILING_PROBES for r in store.records(device=device, probe=probe)]
    return ceilings_at(records, device, threads, affinity, [r.run_id for r in store.runs()])


# ---- the floor ---------------------------------------------------------------------------------------
def floor_at(cost: ModelCost, ceilings: Ceilings) -> Floor:
    """The roofline floor with the working set charged at the level it lives in."""
    level, gbps = ceilings.bandwidth_for(cost.working_set_bytes)
    base = floor(cost, ceilings.peak_tops, gbps)
    return Floor(
        base.compute_ms,
        base.memory_ms,
        base.peak_tops,
        gbps,
        base.notes,
        level=level,
        working_set_bytes=cost.working_set_bytes,
    )


# ---- measuring them ----------------------------------------------------------------------------------
SWEEP_DEFAULTS: dict[str, Any] = {"sweep": True, "trials": 5}


def ceiling_jobs(
    device: str,
    dtypes: list[str],
    overrides: dict[str, dict[str, Any]] | None = None,
    threads: Sequence[int] | None = None,
) -> list[Job]:
    """A quick but honest measurement at the given thread counts (default: all cores): every backend,
    sizes swept until the rate stops growing, no skinny shapes; the memory hierarchy swept from the caches
    to DRAM. `overrides` adds params per probe ({"matmul": {...}, "bandwidth": {...}})."""
    extra = overrides or {}
    counts: Any = list(threads) if threads else "max"
    bandwidth = extra.get("bandwidth", {})
    # An array size or kernel chosen by the caller asks for one working set, not the sweep.
    sweep = {} if {"array_mb", "kernel"} & set(bandwidth) else SWEEP_DEFAULTS
    return [
        Job(
            device=device,
            probe="matmul",
            params={"dtype": dtypes, "threads": counts, "skinny": False, **extra.get("matmul", {})},
        ),
        Job(
            device=device,
            probe="bandwidth",
            params={**sweep, "threads": counts, **bandwidth},
        ),
    ]


# ---- the model's own measurement ---------------------------------------------------------------------
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

    @property
    def threads(self) -> int | None:
        t = self.params.get("threads")
        return int(t) if isinstance(t, int) and t > 0 else None

    @property
    def affinity(self) -> tuple[int, ...] | None:
        a = self.params.get("affinity")
        return tuple(a) if a else None


def measured_latency(
    store: Store,
    device: str,
    model: str,
    shapes: dict[str, list[int]] | None,
    threads: int | None = None,
) -> Measured | None:
    """The fastest p50 of the model on the device in the latest run that benched it with the same shapes
    (and thread count, when given)."""
    found = [
        r
        for r in store.records(device=device, model=model, metric="latency_ms")
        if r.params.get("stat") == "p50"
        and r.value is not None
        and r.probe in ("bench", "threads")
        and (r.params.get("shapes") or {}) == (shapes or {})
        and (threads is None or _threads_of(r) == threads)
    ]
    if not found:
        return None
    created = {r.run_id: r.created for r in store.runs()}
    latest = max({r.run_id for r in found}, key=lambda rid: (created.get(rid, ""), rid))
    best = min((r for r in found if r.run_id == latest), key=lambda r: r.value or 0.0)
    return Measured(float(best.value or 0.0), latest, {k: v for k, v in best.params.items() if k != "stat"})


# ---- floors of benched models, from stored records ---------------------------------------------------
BEATS_MARGIN = 0.05  # a p50 this far under its floor is named (timing noise is a few percent)
BUSY_SHARE = 0.9  # a ceiling whose best trial had less of the CPUs it asked for was measured on a busy device


@dataclass(frozen=True)
class StoredCounts:
    """A model's static counts at some input shapes, read back from `roofline` records: what the floor
    needs (FLOPs per compute class on the floor's path, its least traffic, its working set)."""

    model: str
    shapes: dict[str, Any]
    floor_flops_by_dtype: dict[str, float]
    floor_bytes: float
    working_set_bytes: float
    weight_bytes: float
    winograd_flops: float = 0.0
    run_id: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)  # every input's dims, dynamic ones filled

    @property
    def flops(self) -> float:
        return sum(self.floor_flops_by_dtype.values())


def stored_counts(records: Iterable[Record]) -> dict[tuple[str, str], StoredCounts]:
    """(model, canonical shapes) -> counts, from the latest `roofline` records of each."""
    from ..records import params_key

    parts: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        if r.probe != "roofline" or r.model is None or r.value is None:
            continue
        if r.params.get("scope", "total") != "total" or r.metric == "op_flops":
            continue
        shapes = r.params.get("shapes") or {}
        key = (r.model, params_key(shapes))
        d = parts.setdefault(key, {"shapes": shapes, "run": r.run_id})
        if r.run_id < d["run"]:
            continue  # an older count of the same model and shapes
        if r.run_id > d["run"]:
            d.clear()
            d.update({"shapes": shapes, "run": r.run_id})
        d[r.metric] = r
    out = {}
    for key, d in parts.items():
        flops, weights, ai = d.get("flops"), d.get("weight_bytes"), d.get("arithmetic_intensity")
        if flops is None or weights is None or ai is None:
            continue
        by_dtype = flops.annotations.get("floor_by_dtype") or flops.annotations.get("by_dtype") or {}
        floor_bytes = float(ai.annotations.get("floor_bytes") or weights.value or 0.0)
        ws = d.get("working_set_bytes")
        out[key] = StoredCounts(
            key[0],
            d["shapes"],
            {k: float(v) for k, v in by_dtype.items()} or {"fp32": float(flops.value or 0.0)},
            floor_bytes,
            float(ws.value) if ws is not None and ws.value else floor_bytes,
            float(weights.value or 0.0),
            float(flops.annotations.get("winograd_flops") or 0.0),
            d["run"],
            dict(flops.annotations.get("inputs") or {}),
        )
    return out


def counts_for(
    counts: dict[tuple[str, str], StoredCounts], model: str, shapes: dict[str, Any] | None
) -> StoredCounts | None:
    """The counts of a model at a bench's shapes: counted with the same shapes given, else a count whose
    inputs took those dims (a static input given explicitly on one side and not the other)."""
    from ..records import params_key

    given = shapes or {}
    exact = counts.get((model, params_key(given)))
    if exact is not None:
        return exact
    for (name, _), c in sorted(counts.items(), key=lambda kv: kv[1].run_id, reverse=True):
        if name != model or not c.inputs:
            continue
        full = {**c.inputs, **{k: list(v) for k, v in c.shapes.items()}}
        if all(list(full.get(k, [])) == list(v) for k, v in given.items()) and all(
            list(given.get(k, full[k])) == list(full[k]) for k in c.shapes
        ):
            return c
    return None


@dataclass(frozen=True)
class ModelFloor:
    """One benched configuration against its floor."""

    device: str
    runtime: str | None
    model: str
    config: dict[str, Any]  # the bench's identity params (threads, shapes ...), stat removed
    measured_ms: float
    bench_run: str
    counts: StoredCounts
    ceilings: Ceilings
    floor: Floor

    @property
    def efficiency(self) -> float:
        """floor / measured: at most 1 when the floor holds."""
        return self.floor.floor_ms / self.measured_ms

    @property
    def beats_by(self) -> float:
        """How far the measurement is under the floor, as a share of the floor (0 when it is not)."""
        return max(0.0, 1.0 - self.measured_ms / self.floor.floor_ms)

    @property
    def achieved_gflops(self) -> float:
        return self.counts.flops / (self.measured_ms / 1e3) / 1e9

    def reason(self) -> str | None:
        """Why a measurement beats its floor, when it does (None when it does not)."""
        if self.beats_by <= BEATS_MARGIN:
            return None
        return beat_reason(self)


def _runs_winograd(name: str | None) -> bool:
    """Whether the runtime runs 3x3 stride-1 convolutions as Winograd (`Runtime.winograd_3x3`)."""
    return name in runtime_names() and runtime_named(name).winograd_3x3


def beat_reason(m: ModelFloor) -> str:
    """The most specific explanation of a measurement under its floor."""
    fl, c, ceil = m.floor, m.counts, m.ceilings
    pct = f"{m.beats_by:.0%}"
    if fl.bound == "compute":
        rate = c.flops / (m.measured_ms / 1e3) / 1e12
        share = c.winograd_flops / c.flops if c.flops else 0.0
        if _runs_winograd(m.runtime) and share > 0.3:
            return (
                f"beats the compute floor by {pct}: {share:.0%} of its FLOPs are 3x3 stride-1 convolutions, "
                "which MNN runs as Winograd (F(2,3) does 2.25x fewer multiplies than the 2 x MACs counted)"
            )
        peak = max(ceil.peak_tops.values(), default=0.0)
        where = ceil.peak_params.get("fp32") or {}
        share = ceil.peak_shares.get("fp32")
        busy = (
            f"; its best trial had {share:.0%} of the CPUs it asked for (a busy device)"
            if share is not None and share < BUSY_SHARE
            else ""
        )
        scaled = ""
        threads = where.get("threads")
        if ceil.threads and ceil.threads > 1 and isinstance(threads, int) and threads < ceil.threads:
            scaled = (
                f"; no run at {ceil.threads} threads beat the {threads}-thread figure, so the matmul did not "
                "scale when measured (a co-runner on another core, which CPU shares inside a VM do not show)"
            )
        return (
            f"beats the compute floor by {pct}: the runtime's kernels reached {rate * 1e3:.4g} GFLOP/s, "
            f"above the best matmul measured at {ceil.threads or 'any'} thread(s) ({peak * 1e3:.4g} GFLOP/s"
            + (f", n={where['n']}" if where.get("n") else "")
            + f"{busy}{scaled}): that matmul did not reach the chip's peak"
        )
    rate = c.floor_bytes / (m.measured_ms / 1e3) / 1e9
    lv = ceil.level_for(c.working_set_bytes)
    if lv.capacity_bytes and c.working_set_bytes > lv.capacity_bytes / 2:
        return (
            f"beats the memory floor by {pct}: its working set ({c.working_set_bytes / 1e6:.3g} MB) is near "
            f"the end of {lv.name} ({lv.capacity_bytes / 1e6:.3g} MB), where the measured curve falls; it "
            f"streamed {rate:.4g} GB/s against the {fl.bandwidth_gbps:.4g} GB/s charged"
        )
    faster = [x for x in ceil.levels if x.capacity_bytes and x.capacity_bytes < (lv.capacity_bytes or 1e30)]
    if faster and c.working_set_bytes < 2 * max(x.capacity_bytes or 0 for x in faster):
        up = max(faster, key=lambda x: x.capacity_bytes or 0)
        return (
            f"beats the memory floor by {pct}: its working set ({c.working_set_bytes / 1e6:.3g} MB) is just "
            f"past {up.name} ({(up.capacity_bytes or 0) / 1e6:.3g} MB): part of it stays there, faster than "
            f"{lv.name}"
        )
    return (
        f"beats the memory floor by {pct}: it streamed {rate:.4g} GB/s, above the "
        f"{fl.bandwidth_gbps:.4g} GB/s measured for {lv.name} at {ceil.threads or 'any'} thread(s): "
        "that bandwidth was measured low (a busy device, or kernels slower than the runtime's)"
    )


def model_floors(records: Sequence[Record], run_order: Sequence[str] = ()) -> list[ModelFloor]:
    """Every benched configuration (latest run per configuration) that has counts at its shapes and
    ceilings at its thread count and affinity on its device, against its floor."""
    from ..records import params_key

    counts = stored_counts(records)
    order = {rid: i for i, rid in enumerate(run_order)}
    latest: dict[tuple, Record] = {}
    for r in records:
        if r.probe not in ("bench", "threads") or r.metric != "latency_ms" or r.model is None:
            continue
        if r.params.get("stat") != "p50" or not r.value:
            continue
        config = {k: v for k, v in r.params.items() if k != "stat"}
        key = (r.device, r.runtime, r.model, params_key(config))
        if key not in latest or (order.get(r.run_id, -1), r.run_id) > (
            order.get(latest[key].run_id, -1),
            latest[key].run_id,
        ):
            latest[key] = r
    out = []
    ceiling_records = [r for r in records if r.probe in CEILING_PROBES]
    cache: dict[tuple, Ceilings | None] = {}
    for (device, runtime, model, _), r in sorted(latest.items(), key=lambda kv: kv[0][:3] + (kv[0][3],)):
        c = counts_for(counts, model, r.params.get("shapes"))
        if c is None:
            continue
        threads = _threads_of(r)
        pin = _affinity_of(r)
        ck = (device, threads, pin)
        if ck not in cache:
            cache[ck] = ceilings_at(ceiling_records, device, threads, pin, run_order)
        ceil = cache[ck]
        if ceil is None:
            continue
        fl = floor(c, ceil.peak_tops, ceil.bandwidth_for(c.working_set_bytes)[1])
        level, gbps = ceil.bandwidth_for(c.working_set_bytes)
        fl = Floor(fl.compute_ms, fl.memory_ms, fl.peak_tops, gbps, fl.notes, level, int(c.working_set_bytes))
        config = {k: v for k, v in r.params.items() if k != "stat"}
        out.append(ModelFloor(device, runtime, model, config, float(r.value), r.run_id, c, ceil, fl))
    return out
