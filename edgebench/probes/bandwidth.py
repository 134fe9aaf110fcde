"""Probe `bandwidth`: STREAM-style read, copy and triad memory bandwidth for 1..N threads.

The agent sizes the arrays at 4x the device's total last-level cache (from its sysfs, or `llc_bytes` from
the job or the descriptor's [spec]), runs one untimed-for-the-result first trial and at least 10 more, and
returns every trial's time. Bytes are counted as STREAM counts them (read 8, copy 16, triad 24 bytes per
float64 element; write-allocate traffic not counted) — see edgebench/agent/bandwidth.py. Each record's
annotations carry the CPU share of its fastest trial (under 1: other work took the CPUs) and, for triad,
the path it ran (memmove + the BLAS daxpy, or numpy in place).
"""

from __future__ import annotations

import statistics
from typing import Any

from ..agent.protocol import BandwidthTask
from ..execution.jobs import Job
from ..lab.device import Device
from ..records import ProbeResult, RecordContext
from .common import job_timeout
from .knobs import device_cpus, thread_counts
from .registry import BANDWIDTH_KERNELS, BandwidthParams

MIB = 2**20


def bandwidth_task(
    device: Device, params: BandwidthParams, threads: list[int], budget_s: float
) -> BandwidthTask:
    llc_mb = params.llc_mb
    llc = int(llc_mb * MIB) if llc_mb else device.spec.spec.llc_bytes
    return BandwidthTask(
        threads=threads,
        budget_s=budget_s,
        kernels=list(params.kernel or BANDWIDTH_KERNELS),
        affinity=list(params.affinity) if params.affinity else None,
        trials=params.trials,
        llc_bytes=int(llc) if llc else None,
        array_bytes=int(params.array_mb * MIB) if params.array_mb else None,
        block_bytes=int(params.block_kb * 1024) if params.block_kb else None,
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
