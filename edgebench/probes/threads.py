"""Probe `threads`: a model's latency for every thread count 1..N, per CPU cluster (the descriptor's
`spec.cpu_clusters`, else the little/big clusters the device's sysfs declares by cpu_capacity; the agent
pinned to the cluster's CPUs), and the thread count that is fastest.

The sweep runs in `rounds` rounds; each round visits every thread count once (in an order rotated from
round to round) with its share of the runs and seconds, so drifting load hits every count alike. A point's
samples are pooled over the rounds into the bench records (latency_ms stats, load time, memory, raw
samples) with `threads`, `affinity` and `cluster` in their params. On top: `thread_speedup` (p50 at 1
thread / p50 at t), `thread_slowdown` (p50 at t / the best p50 with fewer threads; `slower` is true when it
exceeds 1 + `slower_margin`), and `best_threads` per cluster, whose annotations say whether more threads
were slower than fewer anywhere in the sweep and whether the best is significantly faster than the
runner-up: a one-sided Mann-Whitney U test on their pooled samples under `alpha`, and faster in every
round (one ascending pass flipped `best_threads` across three identical runs).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from ..jobs import Job
from ..lab.device import AgentReply, Device
from ..records import ProbeResult, RecordContext
from .bench import bench_records, bench_task
from .common import job_timeout, push_model_and_inputs, runtime_of
from .knobs import device_clusters, device_cpus
from .registry import BenchParams, ThreadsParams

ALL = "all"


@dataclasses.dataclass(frozen=True)
class Group:
    """CPUs swept together: a cluster pinned to its CPUs, or `all` (unpinned, every CPU)."""

    name: str
    cpus: tuple[int, ...]
    pinned: bool


def groups(device: Device, params: ThreadsParams) -> list[Group]:
    """The whole device, plus each CPU cluster (the descriptor's, else those its sysfs declares) unless the
    job names clusters or turns them off."""
    cpus = tuple(device_cpus(device, params.affinity))
    out = [Group(ALL, cpus, bool(params.affinity))]
    clusters = device_clusters(device)
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
    """One point of the sweep, as the bench it is (one round's share of the runs and seconds)."""
    shared = {f: getattr(params, f) for f in BenchParams.names() if f in ThreadsParams.names()}
    share = {
        "runs": max(1, math.ceil(params.runs / params.rounds)),
        "min_seconds": params.min_seconds / params.rounds,
        "max_seconds": max(params.max_seconds / params.rounds, params.min_seconds / params.rounds),
    }
    return dataclasses.replace(BenchParams(), **{**shared, **share, "threads": threads, "affinity": cpus})


def round_order(counts: list[int], round_index: int) -> list[int]:
    """The thread counts of one round, rotated so no count always runs first (or right after another)."""
    k = round_index % len(counts)
    return counts[k:] + counts[:k]


def pooled(replies: list[AgentReply]) -> AgentReply:
    """One point's replies over the rounds as one bench reply: samples pooled, the first load kept."""
    first = replies[0].result
    result = {**first, "latencies_ms": [v for r in replies for v in r.result["latencies_ms"]]}
    result["rounds"] = len(replies)
    warnings = list(dict.fromkeys(w for r in replies for w in r.warnings))
    return AgentReply(result, warnings, sum(r.duration_s for r in replies))


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
        replies: dict[int, list[AgentReply]] = {t: [] for t in counts}
        for index in range(params.rounds):
            for t in round_order(counts, index):
                point = point_params(params, t, group.cpus if group.pinned else None)
                task = bench_task(point, runtime, remote_model, remote_inputs)
                replies[t].append(device.run_agent(task, timeout))
        p50: dict[int, float] = {}
        samples: dict[int, list[float]] = {}
        per_round: dict[int, list[float]] = {}
        for t in counts:
            point = point_params(params, t, group.cpus if group.pinned else None)
            identity = {**point.identity(), "cluster": group.name}
            pctx = dataclasses.replace(ctx, base_params=identity)
            result = bench_records(pctx, pooled(replies[t]))
            out.extend(result)
            p50[t] = next(
                float(r.value or 0.0)
                for r in result.records
                if r.metric == "latency_ms" and r.params.get("stat") == "p50"
            )
            samples[t] = [v for r in replies[t] for v in r.result["latencies_ms"]]
            per_round[t] = [statistics.median(r.result["latencies_ms"]) for r in replies[t]]
        evidence = Evidence(samples, per_round, params.alpha)
        out.extend(sweep_records(ctx, group, p50, params.slower_margin, evidence))
    return out


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What decides whether the best thread count really is the best: pooled samples and round p50s."""

    samples: dict[int, list[float]]
    round_p50: dict[int, list[float]]
    alpha: float


def best_against_runner_up(best: int, p50: dict[int, float], evidence: Evidence) -> dict[str, Any]:
    """Is `best` significantly faster than the runner-up? Mann-Whitney U (one-sided) on the pooled samples
    under alpha, and faster in every round."""
    from scipy import stats as sps  # lazily: scipy costs a second of every CLI start

    others = [t for t in p50 if t != best]
    if not others:
        return {}
    runner = min(others, key=lambda t: p50[t])
    test = sps.mannwhitneyu(evidence.samples[best], evidence.samples[runner], alternative="less")
    rounds = list(zip(evidence.round_p50[best], evidence.round_p50[runner], strict=True))
    won = sum(1 for b, r in rounds if b < r)
    p_value = float(test.pvalue)
    return {
        "runner_up": runner,
        "runner_up_p50_ms": p50[runner],
        "p_value": p_value,
        "rounds": len(rounds),
        "rounds_won": won,
        "significant": bool(p_value < evidence.alpha and won == len(rounds)),
    }


def sweep_records(
    ctx: RecordContext, group: Group, p50: dict[int, float], margin: float, evidence: Evidence | None = None
) -> ProbeResult:
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
    versus = best_against_runner_up(best, p50, evidence) if evidence else {}
    out.records.append(
        ctx.record(
            "best_threads",
            best,
            "threads",
            annotations={
                "p50_ms": p50[best],
                "more_threads_slower": bool(slower_at),
                "slower_at": slower_at,
                **versus,
            },
            **base,
            max_threads=counts[-1],
        )
    )
    if versus and not versus["significant"]:
        out.warnings.append(
            f"{group.name}: best_threads={best} is not significantly faster than {versus['runner_up']} "
            f"(p50 {p50[best]:.3g} vs {versus['runner_up_p50_ms']:.3g} ms, Mann-Whitney "
            f"p={versus['p_value']:.2g}, faster in {versus['rounds_won']} of {versus['rounds']} rounds): "
            "treat them as equal"
        )
    if slower_at:
        out.warnings.append(
            f"{group.name}: more threads were slower than fewer at threads={', '.join(map(str, slower_at))} "
            f"(best: {best} thread{'s' if best > 1 else ''}, p50 {p50[best]:.3g} ms)"
        )
    return out
