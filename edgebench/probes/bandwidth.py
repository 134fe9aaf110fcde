"""Probe `bandwidth`: STREAM-style read, copy and triad memory bandwidth for 1..N threads.

The agent sizes the arrays at 4x the device's total last-level cache (from its sysfs, or `llc_bytes` from
the job or the descriptor's [spec]), runs one untimed-for-the-result first trial and at least 10 more, and
returns every trial's time. Bytes are counted as STREAM counts them (read 8, copy 16, triad 24 bytes per
float64 element; write-allocate traffic not counted) — see edgebench/agent/bandwidth.py.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..execution.jobs import Job
from ..lab.device import Device
from ..records import ProbeResult, RecordContext
from .common import job_timeout
from .knobs import as_list, choices, device_cpus, number, thread_counts

KERNELS = ("read", "copy", "triad")
DEFAULT_BUDGET_S = 600.0
PARAMS = frozenset({
    "kernel", "kernels", "threads", "affinity", "trials", "llc_bytes", "llc_mb", "array_bytes", "array_mb",
    "block_bytes", "max_seconds",
})  # fmt: skip
MIB = 2**20


def bandwidth_task(device: Device, job: Job, threads: list[int], budget_s: float) -> dict[str, Any]:
    p = job.params
    task: dict[str, Any] = {
        "kind": "bandwidth",
        "threads": threads,
        "budget_s": budget_s,
        "kernels": choices(p, "kernel", KERNELS, aliases=("kernels",)) or list(KERNELS),
        "affinity": [int(c) for c in as_list(p.get("affinity"))] or None,
        "trials": int(number(p, "trials", 10, minimum=1)),
    }
    llc = (
        p.get("llc_bytes")
        or (number(p, "llc_mb", 0) * MIB if p.get("llc_mb") else None)
        or device.spec.spec.llc_bytes
    )
    if llc:
        task["llc_bytes"] = int(llc)
    if p.get("array_bytes") or p.get("array_mb"):
        task["array_bytes"] = int(p.get("array_bytes") or number(p, "array_mb", 0, minimum=1) * MIB)
    if p.get("block_bytes"):
        task["block_bytes"] = int(number(p, "block_bytes", 0, minimum=1024))
    return task


def check_params(params: dict[str, Any]) -> None:
    """Refuse bad params before any device is touched (the CLI calls this first)."""
    choices(params, "kernel", KERNELS, aliases=("kernels",))
    thread_counts(params, 1)
    for key in ("trials", "array_mb", "llc_mb", "max_seconds"):
        if params.get(key) is not None:
            number(params, key, 0, minimum=1e-9)


def run_bandwidth(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    p = job.params
    timeout = job_timeout(device, job)
    budget = min(number(p, "max_seconds", DEFAULT_BUDGET_S, minimum=1.0), max(10.0, 0.8 * timeout - 10.0))
    threads = thread_counts(p, len(device_cpus(device, p)))
    task = bandwidth_task(device, job, threads, budget)
    if task["affinity"]:
        ctx.base_params = {**ctx.base_params, "affinity": task["affinity"]}
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
        params = {
            "kernel": r["kernel"],
            "threads": r["threads"],
            "bytes": r["bytes"],
            "array_bytes": result.get("array_bytes"),
            "llc_bytes": result.get("llc_bytes"),
        }
        rec = ctx.record("bandwidth_gbps", gbps(r["bytes"], min(timed)), "GB/s", **params, stat="best")
        out.records.append(rec)
        out.records.append(
            ctx.record(
                "bandwidth_gbps", gbps(r["bytes"], statistics.median(timed)), "GB/s", **params, stat="median"
            )
        )
        out.samples.append(ctx.samples("trial_ms", "ms", r["trial_ms"], **params))
        if r["kernel"] not in best or rec.value > best[r["kernel"]].value:
            best[r["kernel"]] = rec
    if nominal_gbps:
        for rec in best.values():
            params = {k: v for k, v in rec.params.items() if k != "stat"}
            out.records.append(
                ctx.record(
                    "efficiency", rec.value / nominal_gbps, "ratio", **params, nominal_gbps=nominal_gbps
                )
            )
    return out
