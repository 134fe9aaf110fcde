"""Bench mode `stream`: a stateful model fed frame by frame on the device, its state carried.

The agent's `stream` task times each frame (inputs in, one inference, outputs out) with the named outputs
feeding the next frame's inputs (`--state OUT=IN`). Records:

- `frame_latency_ms` (stat p50, p90, p99, mean, min, max; p99 refused under 368 frames, as bench does);
- `rtf`, the real-time factor: frame latency / frame duration (stat p50, p90, p99 and mean): under 1 the
  model keeps up with the stream;
- `deadline_miss_ratio`: the share of frames slower than the time they hold;
- `load_ms`, `first_inference_ms`, `peak_rss_mb` as bench records them; the raw frame latencies as samples.

Params carry `stream = true` and `frame_s`; the state pairing, its shapes and whether resetting the state
changes the outputs (`state_effect_max_abs`) are annotations.
"""

from __future__ import annotations

from typing import Any

from ..agent.protocol import StreamTask
from ..errors import UserError
from ..jobs import Job
from ..lab.device import AgentReply, Device
from ..records import ProbeResult, RecordContext
from ..stats import summarize
from .common import (
    bench_identity,
    job_timeout,
    model_fields,
    push_model_and_inputs,
    runtime_of,
    timing_fields,
)
from .registry import BenchParams, state_pairs

RTF_STATS = ("p50", "p90", "p99", "mean")


def stream_task(
    params: BenchParams, runtime: str, remote_model: str, remote_inputs: str | None
) -> StreamTask:
    return StreamTask(
        **model_fields(params, runtime, remote_model, remote_inputs),
        **timing_fields(params),
        state=state_pairs(params.state),
        frame_seconds=float(params.frame_seconds or 0.0),
        frames=params.frames,
    )


def stream_identity(params: BenchParams) -> dict[str, Any]:
    """Bench identity with the frame duration named `frame_s`, as the stream metrics are keyed."""
    base = bench_identity(params)
    base["frame_s"] = base.pop("frame_seconds")
    return base


def run_stream(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = BenchParams.of(job)
    if device.spec.agent == "native":
        raise UserError(
            f"{device.name}: streaming needs the Python agent (native runners cannot carry state); "
            f"{device.spec.source} sets agent = native"
        )
    runtime = runtime_of(job.model, job.runtime)
    ctx.runtime = runtime
    ctx.base_params = stream_identity(params)
    remote_model, remote_inputs = push_model_and_inputs(device, job, runtime, params.inputs)
    reply = device.run_agent(
        stream_task(params, runtime, remote_model, remote_inputs), job_timeout(device, job)
    )
    return stream_records(ctx, reply)


def stream_records(ctx: RecordContext, reply: AgentReply) -> ProbeResult:
    """Records from the agent's frame latencies: stats computed here, from the kept samples."""
    r = reply.result
    frame_s = float(r["frame_seconds"])
    latencies = [float(v) for v in r["frame_latencies_ms"]]
    ctx.base_annotations = {
        **ctx.base_annotations,
        "state": r.get("state"),
        "state_shapes": r.get("state_shapes"),
        "state_effect_max_abs": r.get("state_effect_max_abs"),
        "frames": len(latencies),
        "sequences": r.get("sequences") or None,
    }
    out = ProbeResult(warnings=list(reply.warnings))
    s = summarize(latencies)
    n = {"n": s.n}
    for name, value in {**s.percentiles, "mean": s.mean, "min": s.min, "max": s.max}.items():
        out.records.append(ctx.record("frame_latency_ms", value, "ms", annotations=n, stat=name))
    rtf = summarize([ms / (frame_s * 1e3) for ms in latencies])
    rtf_values = {**rtf.percentiles, "mean": rtf.mean}
    heads = {"outputs_head": r.get("outputs_head")}
    for name in RTF_STATS:
        if name in rtf_values:
            out.records.append(
                ctx.record("rtf", rtf_values[name], "ratio", annotations={**n, **heads}, stat=name)
            )
    out.warnings += [f"{why}; stream more frames (--frames) for it" for why in s.refused.values()]
    missed = sum(1 for ms in latencies if ms > frame_s * 1e3)
    out.records.append(
        ctx.record(
            "deadline_miss_ratio", missed / len(latencies), "ratio", annotations={**n, "missed": missed}
        )
    )
    out.records.append(
        ctx.record("load_ms", r["load_ms"], "ms", annotations={"import_ms": r.get("import_ms")})
    )
    out.records.append(ctx.record("first_inference_ms", r["first_inference_ms"], "ms"))
    out.records.append(
        ctx.record(
            "peak_rss_mb",
            r["peak_rss_mb"],
            "MB",
            annotations={"rss_before_load_mb": r.get("rss_before_load_mb")},
        )
    )
    out.samples.append(ctx.samples("frame_latency_ms", "ms", latencies))
    return out
