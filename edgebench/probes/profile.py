"""Probe `profile`: where a model's time goes, per op, on the device.

onnxruntime: the agent runs the model with onnxruntime's profiler on; the trace (JSON, gzipped on the
device) is pulled and parsed here. Node events are assigned to runs by the `model_run` events, warm-up
runs are dropped, and control-flow nodes (If, Loop, Scan) count their self time only, since their
subgraph's nodes are timed on their own. MNN: per-op begin/end callbacks, returned per run by the agent.
Plain runs (the latency) and instrumented runs alternate on the device, so both meet the same load; op
timings that a busy device preempted are left out (see `aggregate`).

Both instruments cost time inside every op's timer. It is measured, not guessed: for onnxruntime a chain
of trivial ops is timed with and without the profiler on the same device; for MNN the gap between two
consecutive callbacks (no op runs there) is the cost of one callback pair. That overhead is subtracted
from every op, and reported (`profiler_overhead_us`).

Records: `op_time_ms` (params node, op_type; mean per inference), `op_type_time_ms` (per op type),
`op_time_total_ms`, `latency_ms` (stat mean/p50, plain runs without instrumentation), `op_time_coverage`
(sum of op times / p50 latency), `profiler_overhead_us` and `speed_reference_ms` (p50 of each fixed
reference kernel timed around the plain runs, param `reference`).
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..agent.protocol import ProfileTask
from ..errors import MeasurementError, UserError
from ..jobs import Job
from ..lab.device import AgentReply, Device
from ..models.refs import models_cache_dir
from ..records import ProbeResult, RecordContext
from ..runtimes import names as runtime_names
from ..runtimes import runtime as runtime_named
from ..stats import summarize
from .common import job_timeout, push_model_and_inputs, shape_lists
from .numerics import pull, remote_tmp_dir, remove_remote, runtime_for, scratch_dir
from .registry import ProfileParams

# Fixed kernels timed in a block right before and one right after the model's rounds (`speed_reference_ms`;
# never between its runs, whose caches they would evict): a compute-bound GEMM that lives in cache and a
# GEMV that streams its 16 MiB of weights from memory. They tell how steady the device ran over its
# profiles (`kernel_predict.speed_span`, a `fit` warning); the predictor does not rescale profiles by
# them, which on a shared host made its held-out predictions worse (docs/report.md).
SPEED_REFERENCES = ("kernel:gemm,m=256,k=256,n=256", "kernel:gemm,m=1,k=2048,n=2048")
CALIBRATION_NODES = 200
CALIBRATION_REVISION = 1
COVERAGE_BAND = (0.7, 1.3)


TensorShapes = tuple[tuple[str, tuple[int, ...]], ...]  # (element type, dims) per tensor


@dataclass(frozen=True)
class OpTime:
    """One op's time per inference (instrumentation overhead removed), and the tensors the runtime's kernel
    saw (its element types and shapes, as the runtime reports them; a weight it pre-packed may be absent)."""

    node: str
    op_type: str
    ms: float
    calls: float  # executions per inference (more than 1 inside loops)
    provider: str = ""
    inputs: TensorShapes = ()
    outputs: TensorShapes = ()
    parameter_bytes: int | None = None
    runtime_flops: float | None = None  # the runtime's own count of the kernel's work (MNN's getFlops)
    activation_bytes: int | None = None  # activations read and written, as the runtime counts them


@dataclass(frozen=True)
class OpProfile:
    """Per-op times over the undisturbed runs, and how they were corrected."""

    ops: list[OpTime]
    overhead_us: float
    correction: str
    runs: int
    disturbed: int  # op timings left out: far slower than that op's others (the device was busy)


@dataclass(frozen=True)
class OpKey:
    node: str
    op_type: str
    provider: str = ""


@dataclass(frozen=True)
class OpTensors:
    """What a kernel read and wrote, as its runtime reports it."""

    inputs: TensorShapes = ()
    outputs: TensorShapes = ()
    parameter_bytes: int | None = None
    runtime_flops: float | None = None  # the runtime's own count of the kernel's work (MNN's getFlops)
    activation_bytes: int | None = None  # activations read and written, as the runtime counts them


def aggregate(
    keys: list[OpKey],
    per_run_ms: np.ndarray,
    calls: list[float],
    overhead_us: float,
    correction: str,
    tensors: dict[OpKey, OpTensors] | None = None,
) -> OpProfile:
    """Mean time per op over the runs, leaving out the few op timings a busy device disturbed.

    On a shared device an op can be preempted for milliseconds; the mean of 20 runs would carry that into
    the op. A timing is left out when it exceeds the op's median by more than the widest of: 5 robust
    standard deviations (MAD x 1.4826), half the median, and 5 us (the profiler's 1 us resolution). So in
    a quiet run nothing is left out and the mean stays unbiased; a preempted op is dropped on its own.
    """
    m = np.atleast_2d(np.asarray(per_run_ms, dtype=float))
    if m.size == 0:
        return OpProfile([], overhead_us, correction, len(m), 0)
    median = np.median(m, axis=0)
    spread = np.median(np.abs(m - median), axis=0) * 1.4826
    limit = median + np.maximum.reduce([5.0 * spread, 0.5 * median, np.full_like(median, 0.005)])
    ok = m <= limit
    means = (m * ok).sum(axis=0) / np.maximum(ok.sum(axis=0), 1)
    seen = tensors or {}
    ops = [
        OpTime(k.node, k.op_type, float(x), c, k.provider, *_tensor_fields(seen.get(k)))
        for k, x, c in zip(keys, means, calls, strict=True)
    ]
    return OpProfile(ops, overhead_us, correction, len(m), int((~ok).sum()))


def _tensor_fields(t: OpTensors | None) -> tuple[Any, ...]:
    if t is None:
        return (), (), None, None, None
    return t.inputs, t.outputs, t.parameter_bytes, t.runtime_flops, t.activation_bytes


def ort_tensors(args: dict[str, Any]) -> OpTensors:
    """A kernel event's `input_type_shape` / `output_type_shape` ([{"float": [1, 3, 8, 8]}, ...]) and its
    `parameter_size` (bytes of the initializers it reads), `activation_size` + `output_size` (bytes of the
    activations it reads and writes; pre-packed weights are absent from its input shapes)."""

    def shapes(items: Any) -> TensorShapes:
        out = []
        for item in items or []:
            if isinstance(item, dict):
                for dtype, dims in item.items():
                    out.append((str(dtype), tuple(int(d) for d in dims or ())))
        return tuple(out)

    def number(key: str) -> int | None:
        text = str(args.get(key, ""))
        return int(text) if text.isdigit() else None

    read, written = number("activation_size"), number("output_size")
    return OpTensors(
        shapes(args.get("input_type_shape")),
        shapes(args.get("output_type_shape")),
        number("parameter_size"),
        None,
        read + written if read is not None and written is not None else None,
    )


def calibration_model() -> Path:
    """A chain of trivial Adds on one float: per op, profiled time minus plain time is the profiler's cost."""
    path = models_cache_dir() / f"profile-calibration.r{CALIBRATION_REVISION}.onnx"
    if path.exists():
        return path
    nodes = [
        helper.make_node("Add", [f"t{i}", "one"], [f"t{i + 1}"], name=f"add{i}")
        for i in range(CALIBRATION_NODES)
    ]
    graph = helper.make_graph(
        nodes,
        "profile_calibration",
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info(f"t{CALIBRATION_NODES}", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edgebench")
    model.ir_version = 7
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    onnx.save(model, tmp)
    os.replace(tmp, path)
    return path


def speed_reference_files(runtime: str) -> dict[str, Path]:
    """identity -> the file `runtime` loads, for every speed reference."""
    from ..models.kernel_samples import sample_model

    files = {}
    convert = runtime_named(runtime).converter("onnx")
    for key in SPEED_REFERENCES:
        identity, path = sample_model(key)
        files[identity] = convert(path) if convert is not None else path
    return files


def profile_task(
    params: ProfileParams,
    runtime: str,
    remote_model: str,
    remote_inputs: str | None,
    profile_dir: str,
    calibration: str | None,
    speed_references: list[str] | None = None,
) -> ProfileTask:
    return ProfileTask(
        runtime=runtime,
        model=remote_model,
        threads=params.threads,
        shapes=shape_lists(params.shapes),
        seed=params.seed,
        inputs=remote_inputs,
        affinity=list(params.affinity) if params.affinity else None,
        runs=params.runs,
        warmup=params.warmup,
        min_seconds=params.min_seconds,
        profile_dir=profile_dir,
        calibration_model=calibration,
        speed_references=list(speed_references or []),
        token=secrets.token_hex(6),
    )


def run_profile(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = ProfileParams.of(job)
    model = job.model
    runtime = runtime_for(model, job.runtime) if model is not None else (job.runtime or "onnxruntime")
    ctx.runtime = runtime
    ctx.base_params = params.identity()
    # fit predicts from this graph, and cross-validates on it
    if model is not None and model.format == "onnx":
        ctx.base_annotations = {**ctx.base_annotations, "model_path": str(model.path.resolve())}
    rt = runtime_named(runtime)
    read_profile = rt.profile_reader()
    if read_profile is None:
        profiled = [n for n in runtime_names() if runtime_named(n).profiler is not None]
        raise UserError(
            f"profile: {rt.display} has no per-op profile here (use --runtime {' or '.join(profiled)})"
        )
    timeout = job_timeout(device, job)
    remote_model, remote_inputs = push_model_and_inputs(device, job, runtime, params.inputs)
    calibration = None
    if rt.profiler_calibration:
        calibration = device.ensure_files([calibration_model()], timeout)[0]
    references = speed_reference_files(runtime) if params.speed_references else {}
    remote_references = device.ensure_models(list(references.values()), timeout)
    task = profile_task(
        params, runtime, remote_model, remote_inputs, remote_tmp_dir(device), calibration, remote_references
    )
    reply = device.run_agent(task, timeout)
    out = profile_records(ctx, reply, read_profile(device, reply, timeout))
    named = dict(zip(remote_references, references, strict=True))
    out.records.extend(speed_reference_records(ctx, reply.result.get("speed_references_ms") or {}, named))
    return out


def speed_reference_records(
    ctx: RecordContext, times: dict[str, list[float]], identities: dict[str, str]
) -> list[Any]:
    """`speed_reference_ms` (p50, param `reference`: the reference's identity) per reference timed."""
    out = []
    for remote, samples in times.items():
        values = [float(v) for v in samples if float(v) > 0]
        if values and remote in identities:
            p50 = float(np.median(values))
            out.append(
                ctx.record(
                    "speed_reference_ms",
                    p50,
                    "ms",
                    {"runs": len(values)},
                    stat="p50",
                    reference=identities[remote],
                )
            )
    return out


# ---- onnxruntime -------------------------------------------------------------------------------------
def mnn_profile_of(device: Device, reply: AgentReply, timeout: float) -> OpProfile:
    """MNN's per-op profile: the agent's callbacks timed each op (nothing to pull)."""
    return mnn_profile(reply.result["mnn"])


def ncnn_profile_of(device: Device, reply: AgentReply, timeout: float) -> OpProfile:
    """ncnn's per-layer profile: the agent timed each layer's extract (nothing to pull); the overhead is
    an extract of a blob already computed."""
    return mnn_profile(reply.result["ncnn"], "median extract of a computed blob")


def ort_profile_of(device: Device, reply: AgentReply, timeout: float) -> OpProfile:
    ort = reply.result["ort"]
    cal = ort.get("calibration") or {}
    with scratch_dir() as tmp:
        try:
            trace = _load_trace(pull(device, ort["trace"], Path(tmp) / "trace.json.gz", timeout))
            cal_trace = (
                _load_trace(pull(device, cal["trace"], Path(tmp) / "cal.json.gz", timeout)) if cal else None
            )
        finally:
            remove_remote(device, [ort.get("trace", ""), cal.get("trace", "")], timeout)
    overhead = ProfilerOverhead(0.0, 0.0)
    if cal_trace is not None:
        overhead = ort_overhead(cal_trace, cal["plain_ms"], len(cal["plain_ms"]))
    return ort_profile(trace, int(ort["runs"]), overhead)


def _load_trace(path: Path) -> list[dict[str, Any]]:
    try:
        with gzip.open(path, "rt") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise MeasurementError(f"onnxruntime profile {path.name} is unreadable: {exc}") from None
    if isinstance(data, dict):  # the Chrome trace format also allows {"traceEvents": [...]}
        data = data.get("traceEvents", [])
    return [e for e in data if isinstance(e, dict)]


def _measured_runs(events: list[dict[str, Any]], runs: int) -> list[tuple[float, float]]:
    """The (start, end) of the last `runs` model_run events: the measured runs after the warm-up."""
    model_runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e["ts"],
    )
    if not model_runs:
        raise MeasurementError("the onnxruntime profile has no model_run events")
    return [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in model_runs[-runs:]]


def _node_events(
    events: list[dict[str, Any]], windows: list[tuple[float, float]]
) -> list[list[dict[str, Any]]]:
    """Kernel events grouped by the measured run they fall in."""
    per_run: list[list[dict[str, Any]]] = [[] for _ in windows]
    starts = np.array([w[0] for w in windows])
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        ts = float(e["ts"])
        i = int(np.searchsorted(starts, ts, side="right")) - 1
        if i >= 0 and ts <= windows[i][1]:
            per_run[i].append(e)
    return per_run


def _self_times(run_events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float, int]]:
    """Each event's duration minus its nested events' (a control-flow node contains its subgraph's), and
    how many events nest directly in it."""
    ordered = sorted(run_events, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
    out: list[list[Any]] = []
    stack: list[list[Any]] = []
    for e in ordered:
        start, dur = float(e["ts"]), float(e.get("dur", 0))
        while stack and start >= stack[-1][2]:
            stack.pop()
        entry = [e, dur, start + dur, 0]
        if stack:
            stack[-1][1] -= dur
            stack[-1][3] += 1
        stack.append(entry)
        out.append(entry)
    return [(e, max(0.0, self_us), children) for e, self_us, _, children in out]


@dataclass(frozen=True)
class ProfilerOverhead:
    """What onnxruntime's profiler adds per node: inside the node's own timer, and around it (recording
    the event), which lands in the enclosing control-flow node's time when the node runs in a subgraph."""

    inside_us: float
    outside_us: float


def ort_overhead(cal_events: list[dict[str, Any]], plain_ms: list[float], runs: int) -> ProfilerOverhead:
    """The profiler's cost per node, from a chain of trivial ops timed with and without it.

    Inside: a trivial op's profiled kernel time minus its share of the plain latency. Outside: the
    profiled run's time between kernels, per node, minus the same share. Medians over runs, so that a run
    the device preempted does not count as profiler overhead.
    """
    windows = _measured_runs(cal_events, runs)
    per_run = [(w, run) for w, run in zip(windows, _node_events(cal_events, windows), strict=True) if run]
    if not per_run:
        return ProfilerOverhead(0.0, 0.0)
    nodes = int(np.median([len(run) for _, run in per_run]))
    kernel_us = float(np.median([np.mean([float(e.get("dur", 0)) for e in run]) for _, run in per_run]))
    between_us = float(
        np.median(
            [((w[1] - w[0]) - sum(float(e.get("dur", 0)) for e in run)) / len(run) for w, run in per_run]
        )
    )
    plain_per_op_us = float(np.median(plain_ms)) * 1000.0 / max(1, nodes)
    return ProfilerOverhead(max(0.0, kernel_us - plain_per_op_us), max(0.0, between_us - plain_per_op_us))


def ort_profile(events: list[dict[str, Any]], runs: int, overhead: ProfilerOverhead) -> OpProfile:
    windows = _measured_runs(events, runs)
    per_run = _node_events(events, windows)
    index: dict[OpKey, int] = {}
    rows: list[dict[int, float]] = []
    calls: list[int] = []
    tensors: dict[OpKey, OpTensors] = {}
    for run in per_run:
        row: dict[int, float] = {}
        for e, self_us, children in _self_times(run):
            args = e.get("args") or {}
            key = OpKey(
                str(e["name"])[: -len("_kernel_time")],
                str(args.get("op_name", "")),
                str(args.get("provider", "")),
            )
            if key not in tensors:
                tensors[key] = ort_tensors(args)
            k = index.setdefault(key, len(index))
            if k == len(calls):
                calls.append(0)
            calls[k] += 1
            corrected = self_us - overhead.inside_us - children * overhead.outside_us
            row[k] = row.get(k, 0.0) + max(0.0, corrected) / 1000.0
        rows.append(row)
    matrix = np.array([[row.get(k, 0.0) for k in range(len(index))] for row in rows]).reshape(len(rows), -1)
    n = max(1, len(rows))
    return aggregate(
        list(index),
        matrix,
        [c / n for c in calls],
        overhead.inside_us,
        "calibration chain of trivial ops",
        tensors,
    )


# ---- MNN -----------------------------------------------------------------------------------------------
def mnn_profile(result: dict[str, Any], overhead_method: str = "median gap between callbacks") -> OpProfile:
    """A per-op profile the agent aggregated (MNN's callbacks, ncnn's extracts): each op's time per run
    less the instrument's overhead per call."""
    overhead_ms = float(result.get("overhead_ms", 0.0))
    keys = [OpKey(op["node"], op["op_type"]) for op in result["ops"]]
    calls = [float(op["calls"]) for op in result["ops"]]
    raw = np.asarray(result["per_run_ms"], dtype=float).reshape(-1, len(keys))
    # Each call of an op carries one callback pair's overhead.
    corrected = np.maximum(raw - overhead_ms * np.asarray(calls), 0.0)
    tensors = {
        k: OpTensors(
            _mnn_shapes(op.get("inputs")),
            _mnn_shapes(op.get("outputs")),
            int(op["parameter_bytes"]) if op.get("parameter_bytes") is not None else None,
            float(op["mflops"]) * 1e6 if op.get("mflops") is not None else None,
        )
        for k, op in zip(keys, result["ops"], strict=True)
        if op.get("inputs") is not None or op.get("outputs") is not None
    }
    return aggregate(keys, corrected, calls, overhead_ms * 1000.0, overhead_method, tensors)


def _mnn_shapes(items: Any) -> TensorShapes:
    """[[dtype, [dims]], ...] as the agent sends MNN's tensors."""
    return tuple((str(t), tuple(int(d) for d in dims)) for t, dims in items or [])


# ---- records -------------------------------------------------------------------------------------------
def profile_records(ctx: RecordContext, reply: AgentReply, profile: OpProfile) -> ProbeResult:
    r = reply.result
    if r.get("inputs"):  # the shapes the profile ran at (a dynamic dim left at 1 makes a model look fast)
        shapes = {name: list(d.get("shape") or []) for name, d in r["inputs"].items()}
        ctx.base_annotations = {**ctx.base_annotations, "input_shapes": shapes}
    out = ProbeResult(warnings=list(reply.warnings))
    latencies = [float(v) for v in r["latencies_ms"]]
    s = summarize(latencies)
    out.records.append(ctx.record("latency_ms", s.mean, "ms", stat="mean"))
    out.records.append(ctx.record("latency_ms", s.percentiles["p50"], "ms", stat="p50"))
    out.samples.append(ctx.samples("latency_ms", "ms", latencies))
    # records go out slowest first; `order` keeps where each op ran in the inference (its neighbours and
    # the repeats before it are features of its cost)
    order = {id(op): i for i, op in enumerate(profile.ops)}
    ops = sorted(profile.ops, key=lambda o: o.ms, reverse=True)
    for op in ops:
        notes: dict[str, Any] = {"order": order[id(op)]}
        if op.calls != 1:
            notes["calls"] = op.calls
        if op.inputs or op.outputs:
            notes["inputs"] = [[t, list(d)] for t, d in op.inputs]
            notes["outputs"] = [[t, list(d)] for t, d in op.outputs]
        if op.parameter_bytes is not None:
            notes["parameter_bytes"] = op.parameter_bytes
        if op.runtime_flops is not None:
            notes["runtime_flops"] = op.runtime_flops
        if op.activation_bytes is not None:
            notes["activation_bytes"] = op.activation_bytes
        out.records.append(ctx.record("op_time_ms", op.ms, "ms", notes, node=op.node, op_type=op.op_type))
    by_type: dict[str, float] = {}
    for op in ops:
        by_type[op.op_type] = by_type.get(op.op_type, 0.0) + op.ms
    for op_type, ms in sorted(by_type.items(), key=lambda kv: kv[1], reverse=True):
        out.records.append(ctx.record("op_type_time_ms", ms, "ms", op_type=op_type))
    total = sum(op.ms for op in ops)
    p50 = s.percentiles["p50"]
    out.records.append(ctx.record("op_time_total_ms", total, "ms", {"ops": len(ops), "runs": profile.runs}))
    coverage = total / p50 if p50 else None
    out.records.append(ctx.record("op_time_coverage", coverage, "ratio", against="latency p50"))
    out.records.append(
        ctx.record("profiler_overhead_us", profile.overhead_us, "us", {"correction": profile.correction})
    )
    if not ops:
        out.warnings.append("the profile holds no op events")
    elif coverage is not None and not COVERAGE_BAND[0] <= coverage <= COVERAGE_BAND[1]:
        why = (
            "time outside ops (session overhead, input copies) dominates"
            if coverage < 1
            else "the ops are too short for the instrument"
        )
        out.warnings.append(
            f"per-op times add up to {coverage:.0%} of the measured latency ({total:.3g} of "
            f"{p50:.3g} ms): {why}; try larger inputs or more runs"
        )
    if profile.disturbed:
        timings = profile.runs * len(ops)
        out.warnings.append(
            f"{profile.disturbed} of {timings} op timings were far slower than the same op's others "
            "(the device was busy) and were left out"
        )
    return out
