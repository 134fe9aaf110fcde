"""Probe `bench`: model latency percentiles, load time, first inference, peak memory."""

from __future__ import annotations

from ..agent.protocol import BenchTask
from ..analysis.stats import OUTLIER_Z, summarize
from ..execution.jobs import Job
from ..lab.device import AgentReply, Device
from ..records import ProbeResult, RecordContext
from .common import job_timeout, push_model_and_inputs, runtime_of, shape_lists
from .registry import BenchParams


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
    )


def run_bench(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = BenchParams.of(job)
    runtime = runtime_of(job.model, job.runtime)
    ctx.runtime = runtime
    ctx.base_params = params.identity()
    remote_model, remote_inputs = push_model_and_inputs(device, job, runtime, params.inputs)
    reply = device.run_agent(
        bench_task(params, runtime, remote_model, remote_inputs), job_timeout(device, job)
    )
    return bench_records(ctx, reply)


def bench_records(ctx: RecordContext, reply: AgentReply) -> ProbeResult:
    """Records from the agent's raw bench result; stats are computed here, from the kept samples."""
    r = reply.result
    if r.get("execution"):
        ctx.base_annotations = {**ctx.base_annotations, "execution": r["execution"]}
    out = ProbeResult(warnings=list(reply.warnings))
    samples = r["latencies_ms"]
    s = summarize(samples)
    for name, value in {**s.percentiles, "mean": s.mean, "min": s.min, "max": s.max}.items():
        out.records.append(ctx.record("latency_ms", value, "ms", stat=name))
    out.records.append(ctx.record("latency_cv", s.cv, "ratio"))
    out.records.append(ctx.record("samples_n", s.n, "count"))
    out.warnings += [f"{why}; run more (--runs) for it" for why in s.refused.values()]
    if s.outliers:
        out.warnings.append(
            f"{s.outliers} of {s.n} samples are outliers (modified z-score > {OUTLIER_Z:g}): "
            "the device was disturbed; consider a longer warm-up or a quieter device"
        )
    out.records.append(ctx.record("load_ms", r["load_ms"], "ms"))
    out.records.append(ctx.record("first_inference_ms", r["first_inference_ms"], "ms"))
    out.records.append(
        ctx.record(
            "peak_rss_mb",
            r["peak_rss_mb"],
            "MB",
            annotations={"rss_before_load_mb": r.get("rss_before_load_mb")},
        )
    )
    out.samples.append(ctx.samples("latency_ms", "ms", samples))
    return out
