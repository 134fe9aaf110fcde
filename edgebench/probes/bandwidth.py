"""Probe `bandwidth`: STREAM-style read, copy and triad memory bandwidth for 1..N threads.

The agent sizes the arrays at 4x the device's total last-level cache (from its sysfs, or `llc_bytes` from
the job or the descriptor's [spec]), runs one untimed-for-the-result first trial and at least 10 more, and
returns every trial's time. Bytes are counted as STREAM counts them (read 8, copy 16, triad 24 bytes per
float64 element; write-allocate traffic not counted) — see edgebench/agent/bandwidth.py. Each record's
annotations carry the CPU share of its fastest trial (under 1: other work took the CPUs) and, for triad,
the path it ran (memmove + the BLAS daxpy, or numpy in place).

With `sweep`, the agent measures working sets from `sweep_min_kb` to `sweep_max_mb` instead (ddot reads and
memmove copies, see the agent's docstring), and the memory hierarchy is found here from the curve
(`hierarchy`): `sweep_bandwidth_gbps` per kernel, thread count and working-set size, and one
`level_bandwidth_gbps` per level (L2, LLC, DRAM ...) and thread count, whose annotations say up to which
working set the level serves (`capacity_bytes`, the knee) and what sysfs claimed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..agent.protocol import BandwidthTask
from ..jobs import Job
from ..lab.device import Device
from ..records import ProbeResult, RecordContext
from .common import job_timeout
from .knobs import device_cpus, thread_counts
from .registry import BANDWIDTH_KERNELS, BandwidthParams

MIB = 2**20
DEFAULT_SWEEP_MAX = 512 * MIB
KNEE_DROP = 0.25  # a level ends where the read bandwidth falls this far below the level's own
LEVEL_NAMES = ("DRAM", "LLC", "L2")  # from the largest (L1 is hidden by call overhead at 32 KiB)


def sweep_sizes(min_bytes: float, max_bytes: float, steps: int) -> list[int]:
    """Working-set sizes from min to max, `steps` per doubling, each a multiple of 4 KiB."""
    count = int(math.floor(math.log2(max_bytes / min_bytes) * steps + 1e-9)) + 1
    sizes = {int(round(min_bytes * 2 ** (i / steps) / 4096)) * 4096 for i in range(count)}
    return sorted(s for s in sizes if s > 0)


def bandwidth_task(
    device: Device, params: BandwidthParams, threads: list[int], budget_s: float
) -> BandwidthTask:
    llc_mb = params.llc_mb
    llc = int(llc_mb * MIB) if llc_mb else device.spec.spec.llc_bytes
    if params.sweep:
        top = params.sweep_max_mb * MIB if params.sweep_max_mb else min(DEFAULT_SWEEP_MAX, 4 * (llc or 2**62))
        return BandwidthTask(
            threads=threads,
            budget_s=budget_s,
            affinity=list(params.affinity) if params.affinity else None,
            trials=params.trials,
            sweep=sweep_sizes(params.sweep_min_kb * 1024, top, params.sweep_steps),
        )
    return BandwidthTask(
        threads=threads,
        budget_s=budget_s,
        kernels=list(params.kernel or BANDWIDTH_KERNELS),
        affinity=list(params.affinity) if params.affinity else None,
        trials=params.trials,
        llc_bytes=int(llc) if llc else None,
        array_bytes=int(params.array_mb * MIB) if params.array_mb else None,
        block_bytes=int(params.block_kb * 1024) if params.block_kb else None,
        triad_path=params.triad_path,
    )


def run_bandwidth(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = BandwidthParams.of(job)
    timeout = job_timeout(device, job)
    budget = min(params.max_seconds, max(10.0, 0.8 * timeout - 10.0))
    threads = thread_counts(params.threads, len(device_cpus(device, params.affinity)))
    task = bandwidth_task(device, params, threads, budget)
    if task.affinity:
        ctx.base_params = {**ctx.base_params, "affinity": task.affinity}
    reply = device.run_agent(task, timeout)
    if params.sweep:
        return sweep_records(ctx, reply.result, reply.warnings)
    return bandwidth_records(ctx, reply.result, reply.warnings, device.spec.spec.memory_bandwidth_gbps)


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms / 1e3) / 1e9


def bandwidth_records(
    ctx: RecordContext, result: dict[str, Any], warnings: list[str], nominal_gbps: float | None
) -> ProbeResult:
    """bandwidth_gbps (best and median of the trials after the first), raw trial_ms, efficiency per kernel.

    The `trial_ms` samples keep every trial in order; the first one is the warm-up the stats leave out.
    """
    out = ProbeResult(warnings=list(warnings))
    best: dict[str, Any] = {}
    for r in result.get("results", []):
        warm = int(r.get("warmup_trials", 1))
        timed = [float(t) for t in r["trial_ms"][warm:]] or [float(t) for t in r["trial_ms"]]
        params = {"kernel": r["kernel"], "threads": r["threads"], "array_bytes": result.get("array_bytes")}
        notes: dict[str, Any] = {"bytes": r["bytes"], "llc_bytes": result.get("llc_bytes")}
        if r["kernel"] == "triad" and result.get("triad_path"):
            notes["path"] = result["triad_path"]
        cpu = [float(c) for c in r.get("trial_cpu_ms") or []][warm:]
        if len(cpu) == len(timed) and cpu:
            fastest = min(range(len(timed)), key=timed.__getitem__)
            # CPU time over wall x threads of the fastest trial: under 1 when other work took the CPUs
            notes["cpu_share"] = round(cpu[fastest] / (timed[fastest] * max(int(r["threads"]), 1)), 3)
        best_gbps, median_gbps = gbps(r["bytes"], min(timed)), gbps(r["bytes"], statistics.median(timed))
        rec = ctx.record("bandwidth_gbps", best_gbps, "GB/s", notes, **params, stat="best")
        out.records.append(rec)
        out.records.append(ctx.record("bandwidth_gbps", median_gbps, "GB/s", notes, **params, stat="median"))
        out.samples.append(ctx.samples("trial_ms", "ms", r["trial_ms"], notes, **params))
        if r["kernel"] not in best or rec.value > best[r["kernel"]].value:
            best[r["kernel"]] = rec
    if nominal_gbps:
        for rec in best.values():
            params = {k: v for k, v in rec.params.items() if k != "stat"}
            notes = {**rec.annotations, "nominal_gbps": nominal_gbps}
            out.records.append(ctx.record("efficiency", rec.value / nominal_gbps, "ratio", notes, **params))
    return out


# ---- the memory hierarchy ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Level:
    """One plateau of the bandwidth curve: the working sets it serves and the most it streamed."""

    name: str
    gbps: float
    from_bytes: int  # smallest working set measured on the plateau
    to_bytes: int  # largest
    capacity_bytes: int | None  # where the next level starts (the knee); None for the last level (DRAM)
    points: int


def _smoothed(values: Sequence[float]) -> list[float]:
    """Median of each point and its neighbours: one disturbed trial does not make a knee."""
    out = []
    for i in range(len(values)):
        window = sorted(values[max(0, i - 1) : i + 2])
        out.append(window[len(window) // 2])
    return out


def _merged(segments: list[list[int]], smooth: Sequence[float], most: int) -> list[list[int]]:
    """At most `most` segments: the two adjacent ones whose best bandwidths are closest are joined until
    then (a gradual decline under noise makes more knees than a chip has levels)."""
    segs = [list(s) for s in segments]
    while len(segs) > most:
        tops = [max(smooth[i] for i in s) for s in segs]
        ratios = [tops[i + 1] / tops[i] if tops[i] else 0.0 for i in range(len(segs) - 1)]
        j = max(range(len(ratios)), key=lambda i: ratios[i])
        segs[j : j + 2] = [segs[j] + segs[j + 1]]
    return segs


def hierarchy(read: Sequence[tuple[int, float]], best: Sequence[tuple[int, float]] = ()) -> list[Level]:
    """Levels of the memory hierarchy from a bandwidth curve (working-set bytes, GB/s), smallest first.

    Knees are found on the `read` curve: a level ends where the (smoothed) bandwidth falls more than
    KNEE_DROP below the best the level reached and stays there at the next size. A rise at the start
    (the calls' own overhead on the smallest sets) belongs to the first level. Each level's bandwidth is
    the best any kernel (`best`, default the read curve) reached on its working sets: a ceiling. Levels
    are named from the largest: the last is DRAM, then LLC, L2 (at most three).
    """
    pts = sorted(read)
    if not pts:
        return []
    sizes = [s for s, _ in pts]
    smooth = _smoothed([g for _, g in pts])
    segments: list[list[int]] = [[0]]
    top = smooth[0]
    for i in range(1, len(pts)):
        falls = smooth[i] < (1 - KNEE_DROP) * top
        stays = i + 1 >= len(pts) or smooth[i + 1] < (1 - KNEE_DROP) * top
        if falls and stays:
            segments.append([i])
            top = smooth[i]
        else:
            segments[-1].append(i)
            top = max(top, smooth[i])
    segments = _merged(segments, smooth, len(LEVEL_NAMES))
    names = LEVEL_NAMES
    by_size: dict[int, float] = {}
    for s, g in [*pts, *best]:
        by_size[s] = max(by_size.get(s, 0.0), g)
    levels = []
    for n, seg in enumerate(segments):
        lo, hi = sizes[seg[0]], sizes[seg[-1]]
        nxt = sizes[segments[n + 1][0]] if n + 1 < len(segments) else None
        rank = len(segments) - 1 - n
        gbps = max(by_size[s] for s in sizes if lo <= s <= hi)
        levels.append(
            Level(
                names[rank],
                gbps,
                lo,
                hi,
                int(math.sqrt(hi * nxt)) if nxt else None,
                len(seg),
            )
        )
    return levels


def sweep_records(ctx: RecordContext, result: dict[str, Any], warnings: list[str]) -> ProbeResult:
    """Every sweep point (best of its trials) and the levels found in each thread count's curve."""
    out = ProbeResult(warnings=list(warnings))
    curves: dict[int, dict[str, list[tuple[int, float]]]] = {}
    for p in result.get("sweep", []):
        threads, size, kernel = int(p["threads"]), int(p["working_set_bytes"]), str(p["kernel"])
        value = gbps(int(p["bytes"]), min(float(t) for t in p["trial_ms"]))
        ident = {"kernel": kernel, "threads": threads, "working_set_bytes": size}
        notes: dict[str, Any] = {"bytes": p["bytes"]}
        if kernel == "read":
            notes["path"] = result.get("sweep_read_path")
        out.records.append(ctx.record("sweep_bandwidth_gbps", value, "GB/s", notes, **ident, stat="best"))
        out.samples.append(ctx.samples("trial_ms", "ms", p["trial_ms"], notes, **ident))
        curves.setdefault(threads, {}).setdefault(kernel, []).append((size, value))
    sysfs = result.get("llc_bytes")
    for threads, curve in sorted(curves.items()):
        best = [pt for k, c in curve.items() if k != "read" for pt in c]
        levels = hierarchy(curve.get("read") or best, best)
        for lv in levels:
            notes = {
                "capacity_bytes": lv.capacity_bytes,
                "from_bytes": lv.from_bytes,
                "to_bytes": lv.to_bytes,
                "points": lv.points,
                "knee": "from the measured curve",
                "sysfs_llc_bytes": sysfs,
            }
            out.records.append(
                ctx.record("level_bandwidth_gbps", lv.gbps, "GB/s", notes, level=lv.name, threads=threads)
            )
        llc = next((lv for lv in levels if lv.name == "LLC"), None)
        if sysfs and llc is not None and llc.capacity_bytes and sysfs > 2 * llc.capacity_bytes:
            out.warnings.append(
                f"sysfs reports a {sysfs / MIB:.0f} MiB last-level cache, but the bandwidth falls to DRAM "
                f"speed past {llc.capacity_bytes / MIB:.0f} MiB (threads={threads}): the curve is used"
            )
    return out
