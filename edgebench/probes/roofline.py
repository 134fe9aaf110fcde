"""Probe `roofline`: a model's static cost (edgebench.analysis.cost) against a device's measured ceilings.

The job may carry the ceilings (`ceilings`, as Ceilings.to_params) and the measured latency (`measured`,
as Measured.to_params), which is what `edgebench roofline` does after looking them up in the store. Without
them (a suite's roofline job) the probe measures the ceilings itself at the job's thread count (its matmul
and bandwidth records are kept, as probe matmul / bandwidth; `matmul` and `bandwidth` dicts in the params
restrict those runs) and, unless `bench` is false, benches the model for the efficiency. With
`measure = false` it only counts: a suite that measures its ceilings and benches in jobs of their own gets
each model's floor at each benched thread count from the records (edgebench.analysis.ceilings.model_floors,
the report's roofline).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..analysis.ceilings import Ceilings, Measured, ceiling_jobs, ceilings_at, floor_at
from ..analysis.cost import Floor, ModelCost, analyze, efficiency_check
from ..errors import MeasurementError, UserError
from ..jobs import Job
from ..lab.device import Device
from ..records import ProbeResult, RecordContext
from .common import require_model, runtime_of, shape_lists
from .registry import BenchParams, RooflineParams

BENCH_DEFAULTS = {"runs": 50, "min_seconds": 1.0}


def run_roofline(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = RooflineParams.of(job)
    model = require_model(job)
    if model.format != "onnx":
        raise UserError(f"{model.path}: roofline analyses ONNX models (got {model.format})")
    shapes = shape_lists(params.shapes)
    cost = analyze(model.path, shapes, params.values or {})
    out = ProbeResult()
    found = (
        Ceilings.from_params(params.ceilings)
        if params.ceilings
        else measure_here(device, job, params, cost, out, ctx)
        if params.measure
        else None
    )
    result = (
        Measured.from_params(params.measured)
        if params.measured
        else (bench_here(device, job, params, ctx, out) if params.bench else None)
    )
    out.extend(roofline_records(ctx, cost, found, result, shapes))
    return out


def measure_here(
    device: Device, job: Job, params: RooflineParams, cost: ModelCost, out: ProbeResult, ctx: RecordContext
) -> Ceilings:
    """Measure the ceilings on this device; their records join the result under their own probe names."""
    from . import probe_function

    dtypes = sorted({d for d in cost.floor_flops_by_dtype if d in ("fp32", "fp16", "int8")} | {"fp32"})
    records = []
    overrides = {k: dict(v) for k, v in (("matmul", params.matmul), ("bandwidth", params.bandwidth)) if v}
    threads = [params.threads] if params.threads else None
    if params.affinity:
        for probe in ("matmul", "bandwidth"):
            overrides.setdefault(probe, {}).setdefault("affinity", list(params.affinity))
    for sub in ceiling_jobs(device.name, dtypes, overrides, threads):
        sub = dataclasses.replace(sub, timeout_s=job.timeout_s)
        sctx = dataclasses.replace(ctx, probe=sub.probe, model=None, runtime=None, base_params={})
        result = probe_function(sub.probe)(device, sub, sctx)
        out.extend(result)
        records += result.records
    found = ceilings_at(records, device.name, params.threads or None, params.affinity, [ctx.run_id])
    if found is None:
        raise MeasurementError("could not measure the device's ceilings", device=device.name)
    return found


def bench_here(
    device: Device, job: Job, params: RooflineParams, ctx: RecordContext, out: ProbeResult
) -> Measured | None:
    from .bench import run_bench

    bench = BenchParams.parse(
        {**BENCH_DEFAULTS, "shapes": params.shapes, "threads": params.threads, "affinity": params.affinity}
    )
    sub = dataclasses.replace(job, probe="bench", params=bench.given())
    bctx = dataclasses.replace(ctx, probe="bench", runtime=runtime_of(job.model, job.runtime), base_params={})
    result = run_bench(device, sub, bctx)
    out.extend(result)
    p50 = next(
        (r for r in result.records if r.metric == "latency_ms" and r.params.get("stat") == "p50"), None
    )
    return (
        Measured(float(p50.value), ctx.run_id, {k: v for k, v in p50.params.items() if k != "stat"})
        if p50 is not None and p50.value
        else None
    )


def roofline_records(
    ctx: RecordContext,
    cost: ModelCost,
    ceilings: Ceilings | None,
    measured: Measured | None,
    shapes: dict[str, list[int]],
) -> ProbeResult:
    """The model's cost as records, plus floor_ms / efficiency when the device's ceilings are known.

    Their `shapes` param is every input's dims (dynamic dimensions filled), as ever; a bench names only
    the shapes it was given, and edgebench.analysis.ceilings.counts_for pairs the two on those dims."""
    rctx = dataclasses.replace(ctx, base_params={**ctx.base_params, "shapes": cost.inputs})
    out = ProbeResult(warnings=list(cost.warnings))
    out.records += [
        rctx.record(
            "flops",
            cost.flops,
            "FLOP",
            {
                "inputs": cost.inputs,
                "branch_choice": cost.branch_choice,
                "by_dtype": cost.flops_by_dtype,
                "floor_by_dtype": cost.floor_flops_by_dtype,
                "winograd_flops": cost.winograd_flops,
            },
        ),
        rctx.record(
            "weight_bytes", cost.weight_bytes, "B", {"stored_weight_bytes": cost.stored_weight_bytes}
        ),
        rctx.record(
            "activation_bytes",
            cost.activation_bytes,
            "B",
            {"input_bytes": cost.input_bytes, "output_bytes": cost.output_bytes},
        ),
        rctx.record("arithmetic_intensity", cost.intensity, "FLOP/B", {"floor_bytes": cost.floor_bytes}),
        rctx.record(
            "working_set_bytes",
            cost.working_set_bytes,
            "B",
            {"weight_bytes": cost.floor_weight_bytes, "peak_activation_bytes": cost.peak_activation_bytes},
        ),
    ]
    out.records += [rctx.record("op_flops", v, "FLOP", op_type=op) for op, v in cost.flops_by_op.items() if v]
    if ceilings is None:
        return out
    fl = floor_at(cost, ceilings)
    out.warnings += list(fl.notes)
    out.records.append(
        rctx.record("floor_ms", fl.floor_ms, "ms", floor_notes(fl, ceilings, cost), bound=fl.bound)
    )
    if measured is not None and measured.p50_ms > 0:
        eff, problem = efficiency_check(fl.floor_ms, measured.p50_ms)
        if problem:
            out.warnings.append(problem)
        out.records.append(
            rctx.record(
                "efficiency",
                eff,
                "ratio",
                {
                    "floor_ms": fl.floor_ms,
                    "measured_p50_ms": measured.p50_ms,
                    "bench_run": measured.run_id,
                    "bench_params": measured.params,
                    "ceiling_suspect": problem is not None,
                },
                bound=fl.bound,
            )
        )
    return out


def floor_notes(fl: Floor, ceilings: Ceilings, cost: ModelCost) -> dict[str, Any]:
    """How the floor was found: both floors, the ceilings used and the runs they came from."""
    return {
        "compute_ms": fl.compute_ms,
        "memory_ms": fl.memory_ms,
        "peak_tops": fl.peak_tops,
        "bandwidth_gbps": fl.bandwidth_gbps,
        "memory_level": fl.level,
        "working_set_bytes": fl.working_set_bytes,
        "floor_bytes": cost.floor_bytes,
        "floor_flops": sum(cost.floor_flops_by_dtype.values()),
        "ceiling_threads": ceilings.threads,
        "matmul_run": ceilings.matmul_run,
        "bandwidth_run": ceilings.bandwidth_run,
    }
