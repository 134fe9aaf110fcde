"""Probe `bench`: model latency percentiles, load time, first inference, peak memory."""

from __future__ import annotations

from typing import Any

from ..analysis.stats import OUTLIER_Z, summarize
from ..execution.jobs import Job
from ..lab.device import AgentReply, Device
from ..records import ProbeResult, RecordContext
from .common import identity_params, job_timeout, push_model_and_inputs, shapes_param

POLICY_KEYS = {
    "runs": "runs",
    "warmup": "warmup_runs",
    "warmup_seconds": "warmup_s",
    "min_seconds": "min_s",
    "max_seconds": "max_s",
}
DEFAULTS: dict[str, Any] = {
    "runs": 100,
    "warmup": 1,
    "warmup_seconds": 0.5,
    "min_seconds": 1.0,
    "max_seconds": 60.0,
}


def bench_task(job: Job, runtime: str, remote_model: str, remote_inputs: str | None) -> dict[str, Any]:
    p = job.params
    task: dict[str, Any] = {
        "kind": "bench",
        "runtime": runtime,
        "model": remote_model,
        "threads": int(p.get("threads") or 0),
        "shapes": shapes_param(job),
        "seed": int(p.get("seed", 0)),
        "inputs": remote_inputs,
        "affinity": p.get("affinity"),
    }
    for key, agent_key in POLICY_KEYS.items():
        task[agent_key] = (
            float(p.get(key, DEFAULTS[key])) if "seconds" in key else int(p.get(key, DEFAULTS[key]))
        )
    return task


def run_bench(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    runtime = job.runtime or "onnxruntime"
    ctx.base_params = identity_params(job)
    remote_model, remote_inputs = push_model_and_inputs(device, job, runtime)
    reply = device.run_agent(bench_task(job, runtime, remote_model, remote_inputs), job_timeout(device, job))
    return bench_records(ctx, reply)


def bench_records(ctx: RecordContext, reply: AgentReply) -> ProbeResult:
    """Records from the agent's raw bench result; stats are computed here, from the kept samples."""
    r = reply.result
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
        ctx.record("peak_rss_mb", r["peak_rss_mb"], "MB", rss_before_load_mb=r.get("rss_before_load_mb"))
    )
    out.samples.append(ctx.samples("latency_ms", "ms", samples))
    return out
