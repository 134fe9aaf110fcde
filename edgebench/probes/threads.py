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
from .common import job_timeout, push_model_and_inputs, runtime_of
from .knobs import device_cpus
from .registry import BenchParams, ThreadsParams

ALL = "all"


@dataclasses.dataclass(frozen=True)
class Group:
    """CPUs swept together: a cluster pinned to its CPUs, or `all` (unpinned, every CPU)."""

    name: str
    cpus: tuple[int, ...]
    pinned: bool


def groups(device: Device, params: ThreadsParams) -> list[Group]:
    """The whole device, plus each descriptor cluster unless the job names clusters or turns them off."""
    cpus = tuple(device_cpus(device, params.affinity))
    out = [Group(ALL, cpus, bool(params.affinity))]
    clusters = device.spec.spec.cpu_clusters
    wanted = list(params.clusters or ())
    if params.per_cluster and clusters:
        for name, members in clusters.items():
            if wanted and name not in wanted:
                continue
            out.append(Group(name, tuple(members), True))
        if wanted:
            out = [g for g in out if g.name in wanted] or out
    return out


def point_params(params: ThreadsParams, threads: int, cpus: tuple[int, ...] | None) -> BenchParams:
    """One point of the sweep, as the bench it is."""
    shared = {f: getattr(params, f) for f in BenchParams.names() if f in ThreadsParams.names()}
    return dataclasses.replace(BenchParams(), **{**shared, "threads": threads, "affinity": cpus})


def run_threads(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = ThreadsParams.of(job)
    runtime = runtime_of(job.model, job.runtime)
    ctx.runtime = runtime
    remote_model, remote_inputs = push_model_and_inputs(device, job, runtime, params.inputs)
    timeout = job_timeout(device, job)
    out = ProbeResult()
    wanted = params.threads if isinstance(params.threads, tuple) else ()
    for group in groups(device, params):
        counts = [t for t in wanted if t <= len(group.cpus)] or list(range(1, len(group.cpus) + 1))
        if params.threads == "max":
            counts = [len(group.cpus)]
        p50: dict[int, float] = {}
        for t in counts:
            point = point_params(params, t, group.cpus if group.pinned else None)
            pctx = dataclasses.replace(ctx, base_params={**point.identity(), "cluster": group.name})
            reply = device.run_agent(bench_task(point, runtime, remote_model, remote_inputs), timeout)
            result = bench_records(pctx, reply)
            out.extend(result)
            p50[t] = next(
                float(r.value or 0.0)
                for r in result.records
                if r.metric == "latency_ms" and r.params.get("stat") == "p50"
            )
        out.extend(sweep_records(ctx, group, p50, params.slower_margin))
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
                "thread_slowdown",
                ratio,
                "ratio",
                annotations={"versus_threads": fewer, "slower": slower},
                **base,
                threads=t,
            )
        )
    best = min(counts, key=lambda c: p50[c])
    out.records.append(
        ctx.record(
            "best_threads",
            best,
            "threads",
            annotations={"p50_ms": p50[best], "more_threads_slower": bool(slower_at), "slower_at": slower_at},
            **base,
            max_threads=counts[-1],
        )
    )
    if slower_at:
        out.warnings.append(
            f"{group.name}: more threads were slower than fewer at threads={', '.join(map(str, slower_at))} "
            f"(best: {best} thread{'s' if best > 1 else ''}, p50 {p50[best]:.3g} ms)"
        )
    return out
