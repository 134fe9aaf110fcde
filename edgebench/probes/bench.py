"""Probe `bench`: model latency percentiles (with their confidence intervals), runtime import, load time,
first inference, memory (the process peak, the baseline before the load, and the model's own memory).

`threads` in the records is the thread count the runtime ran with: `--threads 0` (the runtime's default)
becomes the count the agent saw it start, and `threads_requested` in the annotations says 0 was asked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..agent.protocol import BenchTask
from ..analysis.disturbance import Disturbance
from ..jobs import Job
from ..lab.device import AgentReply, Device
from ..records import ProbeResult, RecordContext
from ..stats import OUTLIER_Z, summarize
from .common import (
    bench_identity,
    check_backend,
    job_timeout,
    placement_notes,
    push_model_and_inputs,
    runtime_of,
    shape_lists,
)
from .registry import BenchParams, values

COLD_ALPHA = 0.05  # cold counts as slower than warm below this one-sided p-value


def bench_task(params: BenchParams, runtime: str, remote_model: str, remote_inputs: str | None) -> BenchTask:
    """The agent task of one bench (a thread sweep's points are benches too)."""
    return BenchTask(
        model=remote_model,
        runtime=runtime,
        threads=params.threads,
        shapes=shape_lists(params.shapes),
        seed=params.seed,
        inputs=remote_inputs,
        affinity=list(params.affinity) if params.affinity else None,
        warmup=params.warmup,
        warmup_seconds=params.warmup_seconds,
        runs=params.runs,
        min_seconds=params.min_seconds,
        max_seconds=params.max_seconds,
        values=values(params.value),
        cold_load=params.cold_load,
        backend=params.backend,
        precision=params.precision,
        require_backend=params.require_backend,
    )


def run_bench(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = BenchParams.of(job)
    if params.stream:
        from .stream import run_stream

        return run_stream(device, job, ctx)
    runtime = runtime_of(job.model, job.runtime)
    check_backend(runtime, params.backend)
    ctx.runtime = runtime
    ctx.base_params = bench_identity(params)
    remote_model, remote_inputs = push_model_and_inputs(device, job, runtime, params.inputs)
    reply = device.run_agent(
        bench_task(params, runtime, remote_model, remote_inputs), job_timeout(device, job)
    )
    out = with_model_bytes(bench_records(ctx, reply), job)
    out.records += Disturbance.from_reply(reply.disturbance).to_records(ctx)
    return out


def effective_threads(ctx: RecordContext, result: dict[str, Any]) -> None:
    """Record the threads the runtime ran with; keep what was asked (0: its default) as an annotation."""
    asked = ctx.base_params.get("threads")
    seen = result.get("effective_threads")
    if asked == 0 and isinstance(seen, int) and seen > 0:
        ctx.base_params = {**ctx.base_params, "threads": seen}
        ctx.base_annotations = {**ctx.base_annotations, "threads_requested": 0}
    elif isinstance(seen, int) and seen > 0 and isinstance(asked, int) and seen != asked:
        # the identity stays what was asked (it pairs runs); what ran is said beside it (a GPU backend
        # fallen back to the CPU runs its GPU mode's thread count, not the one asked)
        ctx.base_annotations = {**ctx.base_annotations, "threads_ran": seen}


def bench_records(ctx: RecordContext, reply: AgentReply) -> ProbeResult:
    """Records from the agent's raw bench result; stats are computed here, from the kept samples."""
    r = reply.result
    if r.get("execution"):
        ctx.base_annotations = {**ctx.base_annotations, "execution": r["execution"]}
    effective_threads(ctx, r)
    if r.get("affinity"):  # the CPUs the agent's process may run on, as it read them after pinning itself
        ctx.base_annotations = {**ctx.base_annotations, "cpus_allowed": list(r["affinity"])}
    out = ProbeResult(warnings=list(reply.warnings))
    if r.get("placement"):
        ctx.base_annotations = {**ctx.base_annotations, **placement_notes(r["placement"], out.warnings)}
    samples = r["latencies_ms"]
    s = summarize(samples)
    checked = {"self_check": r["self_check"]} if r.get("self_check") else {}
    for name, value in s.percentiles.items():
        notes = {**s.percentile_annotations(name), **(checked if name == "p50" else {})}
        out.records.append(ctx.record("latency_ms", value, "ms", notes, stat=name))
    for name, value in {"mean": s.mean, "min": s.min, "max": s.max}.items():
        out.records.append(ctx.record("latency_ms", value, "ms", stat=name))
    out.records.append(ctx.record("latency_cv", s.cv, "ratio"))
    out.records.append(ctx.record("samples_n", s.n, "count"))
    out.warnings += [f"{why}; run more (--runs) for it" for why in s.refused.values()]
    if s.uncertain("p50"):
        out.warnings.append(f"p50 of {s.n} samples has no bounded confidence interval: it is uncertain")
    if s.outliers:
        out.warnings.append(
            f"{s.outliers} of {s.n} samples are outliers (modified z-score > {OUTLIER_Z:g}): "
            "the device was disturbed; consider a longer warm-up or a quieter device"
        )
    if r.get("import_ms") is not None:
        out.records.append(ctx.record("import_ms", r["import_ms"], "ms"))
    out.records.append(ctx.record("load_ms", r["load_ms"], "ms"))
    if r.get("cold_load"):
        out.extend(cold_load_records(ctx, r["cold_load"]))
    out.records.append(ctx.record("first_inference_ms", r["first_inference_ms"], "ms"))
    memory = {k: r.get(k) for k in ("rss_start_mb", "rss_before_load_mb") if r.get(k) is not None}
    out.records.append(ctx.record("peak_rss_mb", r["peak_rss_mb"], "MB", memory))
    if r.get("rss_increase_mb") is not None:
        out.records.append(ctx.record("rss_increase_mb", r["rss_increase_mb"], "MB", memory))
    if r.get("model_memory_mb") is not None:
        out.records.append(ctx.record("model_memory_mb", r["model_memory_mb"], "MB", model_memory_notes(r)))
    out.samples.append(ctx.samples("latency_ms", "ms", samples))
    return out


def with_model_bytes(out: ProbeResult, job: Job) -> ProbeResult:
    """`load_ms` annotated with the model file's bytes (a variant's size against its reference)."""
    try:
        size = job.model.path.stat().st_size if job.model is not None else None
    except OSError:
        size = None
    if size is not None:
        out.records = [
            replace(r, annotations={**r.annotations, "model_bytes": size})
            if r.metric == "load_ms" and not r.params.get("cache")
            else r
            for r in out.records
        ]
    return out


def model_memory_notes(r: dict[str, Any]) -> dict[str, Any]:
    """What `model_memory_mb` is measured against: the baseline beside it, and how the peak was read."""
    return {
        "baseline_mb": r.get("rss_before_load_mb"),  # runtime + harness, just before the load
        "peak_rss_mb": r.get("peak_rss_mb"),
        "measured_by": "agent: VmHWM over load and inference minus VmRSS just before the load",
        "peak": r.get("model_memory_peak"),
    }


def cold_load_records(ctx: RecordContext, cold: dict[str, Any]) -> ProbeResult:
    """`load_ms` with cache = cold: the median of loads with the file evicted, each paired with a warm load
    right after it; whether cold is really slower is tested (one-sided Mann-Whitney U), not assumed."""
    from scipy.stats import mannwhitneyu

    out = ProbeResult()
    cold_ms, warm_ms = [float(v) for v in cold["cold_ms"]], [float(v) for v in cold["warm_ms"]]
    cold_p50, warm_p50 = float(np.median(cold_ms)), float(np.median(warm_ms))
    p_value = float(mannwhitneyu(cold_ms, warm_ms, alternative="greater").pvalue)
    notes = {
        "cold_ms": cold_ms,
        "warm_ms": warm_ms,
        "warm_median_ms": warm_p50,
        "cold_to_warm": cold_p50 / warm_p50 if warm_p50 > 0 else None,
        "slower_p_value": p_value,
        "distinct": p_value < COLD_ALPHA,
        **{k: cold.get(k) for k in ("eviction_verified", "resident_before", "resident_after", "check")},
    }
    out.records.append(ctx.record("load_ms", cold_p50, "ms", annotations=notes, cache="cold"))
    if not cold.get("eviction_verified"):
        out.warnings.append(f"cold load: {cold.get('note') or 'eviction could not be verified'}")
    if p_value >= COLD_ALPHA:
        out.warnings.append(
            f"cold load ({cold_p50:.3g} ms) is not distinguishably slower than warm ({warm_p50:.3g} ms; "
            f"p={p_value:.2f}): the storage is about as fast as the page cache here, or loading is not "
            "bound by reading the file"
        )
    return out
