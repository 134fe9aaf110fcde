"""Probe `threads`: a model's latency for every thread count 1..N, per CPU cluster when the descriptor has
`spec.cpu_clusters` (the agent pinned to the cluster's CPUs), and the thread count that is fastest.

Each point is one run of the `bench` agent task, so its records are the bench records (latency_ms stats,
load time, memory, raw samples) with `threads`, `affinity` and `cluster` in their params. On top:
`thread_speedup` (p50 at 1 thread / p50 at t), `thread_slowdown` (p50 at t / the best p50 with fewer
threads; `slower` is true when it exceeds 1 + `slower_margin`), and `best_threads` per cluster, whose
params say whether more threads were slower than fewer anywhere in the sweep.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..execution.jobs import Job
from ..lab.device import Device
from ..records import ProbeResult, RecordContext
from .bench import bench_records, bench_task
from .common import identity_params, job_timeout, push_model_and_inputs
from .knobs import as_list, device_cpus, int_list, number

ALL = "all"
PARAMS = frozenset({
    "threads", "affinity", "clusters", "per_cluster", "slower_margin", "shapes", "inputs", "seed", "runs",
    "warmup", "warmup_seconds", "min_seconds", "max_seconds",
})  # fmt: skip
DEFAULT_MARGIN = 0.05


@dataclasses.dataclass(frozen=True)
class Group:
    """CPUs swept together: a cluster pinned to its CPUs, or `all` (unpinned, every CPU)."""

    name: str
    cpus: tuple[int, ...]
    pinned: bool


def groups(device: Device, job: Job) -> list[Group]:
    """The whole device, plus each descriptor cluster unless the job names clusters or turns them off."""
    p = job.params
    cpus = tuple(device_cpus(device, p))
    out = [Group(ALL, cpus, bool(p.get("affinity")))]
    clusters = device.spec.spec.cpu_clusters
    wanted = [str(c) for c in as_list(p.get("clusters"))]
    if p.get("per_cluster", True) and clusters:
        for name, members in clusters.items():
            if wanted and name not in wanted:
                continue
            out.append(Group(name, tuple(members), True))
        if wanted:
            out = [g for g in out if g.name in wanted] or out
    return out


def run_threads(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    runtime = job.runtime or "onnxruntime"
    remote_model, remote_inputs = push_model_and_inputs(device, job, runtime)
    timeout = job_timeout(device, job)
    margin = number(job.params, "slower_margin", DEFAULT_MARGIN)
    out = ProbeResult()
    for group in groups(device, job):
        counts = [t for t in int_list(job.params, "threads") if t <= len(group.cpus)] or list(
            range(1, len(group.cpus) + 1)
        )
        p50: dict[int, float] = {}
        for t in counts:
            params = {**job.params, "threads": t, "affinity": list(group.cpus) if group.pinned else None}
            point = dataclasses.replace(job, params=params)
            pctx = dataclasses.replace(ctx, base_params={**identity_params(point), "cluster": group.name})
            reply = device.run_agent(bench_task(point, runtime, remote_model, remote_inputs), timeout)
            result = bench_records(pctx, reply)
            out.extend(result)
            p50[t] = next(
                float(r.value or 0.0)
                for r in result.records
                if r.metric == "latency_ms" and r.params.get("stat") == "p50"
            )
        out.extend(sweep_records(ctx, group, p50, margin))
    return out


def sweep_records(ctx: RecordContext, group: Group, p50: dict[int, float], margin: float) -> ProbeResult:
    """thread_speedup, thread_slowdown and best_threads for one group's p50 by thread count."""
    out = ProbeResult()
    if not p50:
        return out
    base: dict[str, Any] = {"cluster": group.name}
    if group.pinned:
        base["affinity"] = list(group.cpus)
    counts = sorted(p50)
    slower_at: list[int] = []
    for i, t in enumerate(counts):
        if 1 in p50:
            out.records.append(ctx.record("thread_speedup", p50[1] / p50[t], "ratio", **base, threads=t))
        if i == 0:
            continue
        fewer = min(counts[:i], key=lambda c: p50[c])
        ratio = p50[t] / p50[fewer]
        slower = ratio > 1.0 + margin
        if slower:
            slower_at.append(t)
        out.records.append(
            ctx.record(
                "thread_slowdown", ratio, "ratio", **base, threads=t, versus_threads=fewer, slower=slower
            )
        )
    best = min(counts, key=lambda c: p50[c])
    out.records.append(
        ctx.record(
            "best_threads",
            best,
            "threads",
            **base,
            p50_ms=p50[best],
            max_threads=counts[-1],
            more_threads_slower=bool(slower_at),
            slower_at=slower_at,
        )
    )
    if slower_at:
        out.warnings.append(
            f"{group.name}: more threads were slower than fewer at threads={', '.join(map(str, slower_at))} "
            f"(best: {best} thread{'s' if best > 1 else ''}, p50 {p50[best]:.3g} ms)"
        )
    return out
