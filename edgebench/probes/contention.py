"""Probe `contention`: the model's latency alone and beside a busy co-runner of N threads on the device,
and what the model costs the co-runner; per thread count of the model.

The agent starts and stops the co-runner (N busy processes, see `agent/contention.py`). Records, per model
thread count (`threads`):
- `latency_ms` (stat p50 and mean) with `corunner_threads` = 0 (alone) and N;
- `corunner_slowdown` with `victim = "model"` (mean beside / mean alone: the throughput the model loses;
  an inference shorter than a scheduler slice often runs whole, so time-slicing shows in the mean and the
  tail, not the median, which is kept in the annotations) and `victim = "corunner"` (the co-runner's
  throughput alone / beside the model), per N. "Alone" is timed before and after the co-run phases;
- `load_ms`; the raw latencies of every phase as samples.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..agent.protocol import ContentionTask
from ..jobs import Job
from ..lab.device import AgentReply, Device
from ..records import ProbeResult, RecordContext
from ..stats import summarize
from .common import job_timeout, model_fields, push_model_and_inputs, runtime_of, timing_fields
from .knobs import device_cpus, thread_counts
from .registry import ContentionParams, values

CORUNNER_SECONDS = 1.0


def contention_task(
    params: ContentionParams, threads: int, runtime: str, model: str, inputs: str | None
) -> ContentionTask:
    return ContentionTask(
        **{**model_fields(params, runtime, model, inputs), "threads": threads},
        **timing_fields(params),
        corunner_threads=list(params.corunner_threads or (1,)),
        corunner_seconds=CORUNNER_SECONDS,
    )


def run_contention(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = ContentionParams.of(job)
    runtime = runtime_of(job.model, job.runtime)
    ctx.runtime = runtime
    given = values(params.value)
    base = {**params.identity(), **({"value": given} if given else {})}
    remote_model, remote_inputs = push_model_and_inputs(device, job, runtime, params.inputs)
    if isinstance(params.threads, tuple) or params.threads == "max":
        counts = thread_counts(params.threads, len(device_cpus(device, params.affinity)))
    else:
        counts = [0]  # the runtime's default
    out = ProbeResult()
    phases = len(params.corunner_threads or (1,)) + 1
    timeout = job_timeout(device, job) + phases * (params.max_seconds + CORUNNER_SECONDS + 10)
    for threads in counts:
        tctx = dataclasses.replace(ctx, base_params={**base, "threads": threads})
        task = contention_task(params, threads, runtime, remote_model, remote_inputs)
        out.extend(contention_records(tctx, device.run_agent(task, timeout)))
    return out


def contention_records(ctx: RecordContext, reply: AgentReply) -> ProbeResult:
    r = reply.result
    out = ProbeResult(warnings=list(reply.warnings))
    alone_samples = r["latencies_alone_ms"] + (r.get("latencies_alone_after_ms") or [])
    alone = summarize(alone_samples)
    ctx.base_annotations = {**ctx.base_annotations, "cpus": r.get("cpus"), "corunner_token": r.get("token")}
    _latency(ctx, out, alone, 0, alone_samples)
    for phase in r["phases"]:
        n = int(phase["corunner_threads"])
        with_load = summarize(phase["latencies_ms"])
        _latency(ctx, out, with_load, n, phase["latencies_ms"])
        model_notes: dict[str, Any] = {
            "alone_mean_ms": alone.mean,
            "beside_mean_ms": with_load.mean,
            "alone_p50_ms": alone.percentiles["p50"],
            "beside_p50_ms": with_load.percentiles["p50"],
            "p50_ratio": with_load.percentiles["p50"] / alone.percentiles["p50"],
        }
        out.records.append(
            ctx.record(
                "corunner_slowdown",
                with_load.mean / alone.mean,
                "ratio",
                annotations=model_notes,
                corunner_threads=n,
                victim="model",
            )
        )
        rates = {"alone_per_s": phase["corunner_rate_alone"], "beside_per_s": phase["corunner_rate_beside"]}
        out.records.append(
            ctx.record(
                "corunner_slowdown",
                phase["corunner_rate_alone"] / phase["corunner_rate_beside"],
                "ratio",
                annotations=rates,
                corunner_threads=n,
                victim="corunner",
            )
        )
    out.records.append(ctx.record("load_ms", r["load_ms"], "ms"))
    return out


def _latency(ctx: RecordContext, out: ProbeResult, s: Any, corunner: int, samples: list[float]) -> None:
    for stat in ("p50", "mean"):
        value = s.percentiles["p50"] if stat == "p50" else s.mean
        out.records.append(
            ctx.record(
                "latency_ms", value, "ms", annotations={"n": s.n}, stat=stat, corunner_threads=corunner
            )
        )
    out.samples.append(ctx.samples("latency_ms", "ms", samples, corunner_threads=corunner))
