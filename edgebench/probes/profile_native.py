"""Probe `profile` on a device without Python: the runtime's vendor tool in its per-layer build (ncnn's
`benchncnn` built with NCNN_BENCHMARK) times each layer on the device, and the host describes each layer's
work (the shapes it reads and writes, its multiply-adds and weights) from the same graph, run once on the
host (`Runtime.graph_kernels`: the layers the kernel predictor predicts), joined by layer name.

Records as the agent's profile writes them (`op_time_ms` per layer with its shapes and work, in the order
the tool ran them), so `fit`'s kernel predictor calibrates on a phone's own per-layer times. The tool
prints min/max/avg only: the whole inference is recorded as `latency_ms` stat `mean` (no p50 invented), and
the predictor takes that mean as the reference of a profile that has no p50, saying so."""

from __future__ import annotations

from typing import Any

from ..errors import MeasurementError, UserError
from ..jobs import Job
from ..lab.device import Device
from ..records import ProbeResult, RecordContext
from ..runtimes import runtime as runtime_named
from .common import model_file_for, require_model
from .native import native_identity, native_notes, run_tool, runtime_for
from .registry import BenchParams, ProfileParams


def run_native_profile(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    """Per-layer times from the runner's per-layer build, each layer's work from the host's copy."""
    model = require_model(job)
    runtime = runtime_for(model, job)
    rt = runtime_named(runtime)
    describe = rt.own_graph_layers()
    if describe is None or rt.native_tool is None:
        raise UserError(
            f"{device.name}: profile on a device without Python needs a runtime whose layers the host can "
            f"describe from its own graph (ncnn, with benchncnn's per-layer build), not {rt.display}"
        )
    params = ProfileParams.of(job)
    given = {"threads": params.threads, "runs": params.runs, "warmup": params.warmup, "profile": True}
    if params.shapes:
        given["shapes"] = {k: list(v) for k, v in params.shapes.items()}
    bench = BenchParams.parse(given, origin="code")
    model_file = model_file_for(model, runtime, bench.shapes)
    results, adapter, _ = run_tool(device, job, bench, model_file, model.name, runtime)
    ran = results[0]
    if not ran.ops:
        raise MeasurementError(
            f"{adapter.name} printed no per-layer times for {model.path.name}: give the runner its per-layer "
            "build (benchncnn built with -DNCNN_BENCHMARK=ON)",
            device=device.name,
        )
    layers = layer_descriptions(describe(model_file))
    ctx.runtime = runtime
    ctx.base_params = {**native_identity(bench, adapter.name, ran), **params.identity()}
    ctx.base_annotations = native_notes(bench, ran)
    out = ProbeResult(warnings=list(ran.warnings))
    missing = [node for node, _, _ in ran.ops if node not in layers]
    if missing:
        raise MeasurementError(
            f"{adapter.name} timed layers the graph on the host does not have ({', '.join(missing[:3])}): "
            "the runner ran another graph than edgebench pushed",
            device=device.name,
        )
    for order, (node, op_type, ms) in enumerate(ran.ops):
        notes = {**layers[node], "order": order, "aggregated_by": "tool"}
        out.records.append(ctx.record("op_time_ms", ms, "ms", notes, node=node, op_type=op_type))
    mean = ran.aggregates.get("mean")
    if mean is not None:
        note = {"aggregated_by": "tool", "n": ran.count, "why": "the tool prints min/max/avg only"}
        out.records.append(ctx.record("latency_ms", mean, "ms", note, stat="mean"))
    return out


def layer_descriptions(ops: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each layer's shapes and work by its name, as the op records annotate them."""
    return {
        str(op["node"]): {
            "inputs": op.get("inputs") or [],
            "outputs": op.get("outputs") or [],
            **(
                {"parameter_bytes": int(op["parameter_bytes"])}
                if op.get("parameter_bytes") is not None
                else {}
            ),
            **({"runtime_flops": float(op["mflops"]) * 1e6} if op.get("mflops") is not None else {}),
        }
        for op in ops
    }
