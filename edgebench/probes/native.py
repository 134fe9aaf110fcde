"""Probes through a device's native runner binaries (agent = "native"): bench, matmul, bandwidth.

The tool measures on the device; edgebench maps its options onto the tool's flags and its output onto the
canonical records. A tool's own aggregates are marked `aggregated_by = "tool"`; a distribution made from
repeated short invocations is marked `aggregated_by = "edgebench"` with what each sample is.
"""

from __future__ import annotations

import json
import posixpath
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from ..descriptors import RunnerSpec
from ..errors import MeasurementError, ModelError, UserError
from ..jobs import Job, ModelRef
from ..lab.device import Device
from ..native import ADAPTERS, RUNNER_FOR_RUNTIME, NativeOptions, NativeResult, NativeToolError, RunnerAdapter
from ..native.abi import device_abis, runner_for_device
from ..native.benchncnn import declared_inputs
from ..records import ProbeResult, RecordContext
from ..stats import MIN_SAMPLES_FOR_P90, MIN_SAMPLES_FOR_P99, summarize
from .common import job_timeout, model_file_for, require_model, runtime_of
from .registry import BandwidthParams, BenchParams, MatmulParams, PowerParams, ThermalParams

_NEEDED = {
    "p5": MIN_SAMPLES_FOR_P90,
    "p90": MIN_SAMPLES_FOR_P90,
    "p95": MIN_SAMPLES_FOR_P90,
    "p99": MIN_SAMPLES_FOR_P99,
    "p999": 1000,
}


def runtime_for(model: ModelRef, job: Job) -> str:
    """The asked-for runtime (`tflite`, LiteRT's former name, is `litert`), else the model file's."""
    if job.runtime:
        return "litert" if job.runtime == "tflite" else job.runtime
    return runtime_of(model, None)


def adapter_and_runner(
    device: Device, runtime: str, runner_name: str | None
) -> tuple[RunnerAdapter, RunnerSpec]:
    name = runner_name or RUNNER_FOR_RUNTIME.get(runtime)
    if name not in ADAPTERS:
        raise UserError(f"no native runner for runtime '{runtime}' (known runners: {', '.join(ADAPTERS)})")
    runner = device.spec.runners.get(name)
    if runner is None:
        raise UserError(
            f"{device.name}: no '{name}' in [runners] of {device.spec.source} "
            f"(needed for runtime '{runtime}' on a native device)"
        )
    return ADAPTERS[name](), runner


def native_options(
    params: BenchParams | ThermalParams | PowerParams, default_runs: int = 100
) -> NativeOptions:
    """The runner's options from a job's typed params (bench, or a sustained run's runner settings)."""
    runs = params.runs if isinstance(params.runs, int) else default_runs
    return NativeOptions(
        threads=params.threads,
        warmup=params.warmup,
        runs=runs,
        min_seconds=getattr(params, "min_seconds", 0.0),
        max_seconds=getattr(params, "max_seconds", 150.0),
        delegate=native_delegate(params),
        precision=params.precision,
        profile=getattr(params, "profile", False),
        warmup_seconds=params.warmup_seconds,
        seed=params.seed,
        require_backend=getattr(params, "require_backend", False),
    )


def native_delegate(params: BenchParams | ThermalParams | PowerParams) -> str | None:
    """The delegate/backend a vendor tool is told: `--delegate`, or `--backend` where it names other than
    the CPU (one flag for both paths); a UserError when the two name different ones."""
    backend = getattr(params, "backend", "cpu")
    asked = backend if backend != "cpu" else None
    if params.delegate and asked and params.delegate != asked:
        raise UserError(
            f"backend: --backend {asked} and --delegate {params.delegate} name different backends"
        )
    return params.delegate or asked


def run_env(spec_env: dict[str, str], env: dict[str, str]) -> dict[str, str] | None:
    """The environment a runner runs in: the descriptor's, with what the adapter sets over it (its pushed
    libraries' LD_LIBRARY_PATH first, the descriptor's after it, so an LD_PRELOAD or a driver path the
    descriptor gives is kept)."""
    merged = {**spec_env, **env}
    if spec_env.get("LD_LIBRARY_PATH") and env.get("LD_LIBRARY_PATH"):
        merged["LD_LIBRARY_PATH"] = f"{env['LD_LIBRARY_PATH']}:{spec_env['LD_LIBRARY_PATH']}"
    return merged or None


def with_input_types(opts: NativeOptions, adapter: RunnerAdapter, model_file: Path) -> NativeOptions:
    """`opts` carrying what a tool must be told of the model's inputs, read on the host: each ONNX input's
    element type (which inputs a tool that randomises only some types, onnxruntime_perf_test, ran on
    zeros), each ncnn input's shape (benchncnn takes them as arguments). Other formats are left as is."""
    if adapter.model_suffix == ".param":
        return replace(opts, input_shapes=ncnn_input_shapes(model_file))
    if adapter.model_suffix != ".onnx":
        return opts
    try:
        graph = onnx.load(str(model_file), load_external_data=False).graph
    except (OSError, ValueError, DecodeError):
        return opts  # not readable as ONNX: the tool's own error names it
    weights = {init.name for init in graph.initializer}
    types = tuple(
        (i.name, TensorProto.DataType.Name(i.type.tensor_type.elem_type))
        for i in graph.input
        if i.name not in weights and i.type.HasField("tensor_type")
    )
    return replace(opts, input_types=types)


def ncnn_input_shapes(param: Path) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(blob, [w, h, (d,) c]) of each Input layer of an ncnn .param on the host; a one-line ModelError
    naming the file and layer when one declares no shape."""
    try:
        text = param.read_text(errors="replace")
    except OSError as exc:
        raise ModelError(f"{param}: cannot read ncnn param file: {exc.strerror}") from None
    try:
        return declared_inputs(text, str(param))
    except NativeToolError as exc:
        raise ModelError(str(exc)) from None


def tool_argv(adapter: RunnerAdapter, binary: str, model: str, opts: NativeOptions) -> list[str]:
    """The adapter's argv; options it refuses (a delegate it lacks, a thread count it cannot take) are a
    one-line usage or model error, as the tool's own refusals are."""
    try:
        return adapter.argv(binary, model, opts)
    except NativeToolError as exc:
        raise (ModelError if exc.kind == "model" else UserError)(str(exc)) from None


def native_identity(
    params: BenchParams | ThermalParams | PowerParams, runner: str, ran: NativeResult
) -> dict[str, Any]:
    """What a runner's records are: threads, the runner, and what the tool says ran (delegate or
    backend, precision), never merely what was asked."""
    return {"threads": params.threads, "runner": runner, **ran.applied}


def native_notes(params: BenchParams | ThermalParams | PowerParams, ran: NativeResult) -> dict[str, Any]:
    """Descriptive: the path that ran, what was asked, and what the tool says about how it measured."""
    notes: dict[str, Any] = {"path": ran.path, **ran.notes}
    placed = native_placement(params, ran)
    notes.update(backend_actual=placed["actual"], placement=placed)
    if params.delegate:
        notes["delegate_asked"] = params.delegate
    if params.precision:
        notes["precision_asked"] = params.precision
    return notes


def native_placement(params: BenchParams | ThermalParams | PowerParams, ran: NativeResult) -> dict[str, Any]:
    """Where a vendor tool's run ran, in the agent's placement shape (agent.placement), from what the tool
    printed (its adapter's path: "gpu", "gpu+cpu", "vulkan"...): a share it could not see is "unknown",
    never the delegate asked for. The tools print no per-op units: ops are not counted."""
    asked = native_delegate(params) or "cpu"
    actual = ran.path or "unknown"
    if "unknown" in actual.split("+"):
        actual = "unknown"
    precision = ran.applied.get("precision")
    return {
        "requested": asked,
        "actual": actual,
        "ops_by_unit": {},
        "partitions": 1 if "+" not in actual and actual != "unknown" else None,
        "fallback_ops": [],
        "evidence": str(ran.notes.get("placement_evidence") or f"{ran.path or 'nothing'} as the tool said"),
        "precision": {"mode": precision} if precision else {},
    }


def install_runner(device: Device, runner: RunnerSpec, timeout: float) -> tuple[str, dict[str, str]]:
    """The runner's path on the device, pushing it (and its libraries) from the host when asked to: the
    build for the device's ABI (`native.abi`), refused before any push when built for another."""
    if not runner.pushed:
        return runner.path, {}
    abis = device_abis(device.fingerprint(timeout))
    runner = runner_for_device(runner, abis, device.name, str(device.spec.source))
    if not runner.host_path:
        return runner.path, {}
    host = Path(runner.host_path).expanduser()
    libs = [Path(lib).expanduser() for lib in runner.libs]
    for f in [host, *libs]:
        if not f.is_file():
            raise UserError(f"{device.spec.source}: runners.{runner.name}: no such file {f}")
    remote = device.ensure_files([host, *libs], timeout)
    # Libraries keep their names (the loader looks them up by name) in a folder of links to the cache.
    folder = posixpath.join(device.spec.workdir, "runners", runner.name)
    script = (
        'd=$1; shift; mkdir -p "$d" && chmod 755 "$1" && '
        'while [ $# -ge 2 ]; do ln -sf "$1" "$d/$2"; shift 2; done'
    )
    pairs: list[str] = [remote[0], posixpath.basename(runner.path) or runner.name]
    for lib, remote_lib in zip(libs, remote[1:], strict=True):
        pairs += [remote_lib, lib.name]
    device.transport.run(["sh", "-c", script, "sh", folder, *pairs], timeout=timeout).check(device.name)
    binary = posixpath.join(folder, pairs[1])
    return binary, ({"LD_LIBRARY_PATH": folder} if libs else {})


def stage_model(device: Device, adapter: RunnerAdapter, model_file: Path, name: str, timeout: float) -> str:
    """Push the model; tools that take a folder (benchmark.out runs every file in it) get a folder
    emptied first, holding only this model under its name. Only the file the tool opens is pushed: an ncnn
    graph's .bin stays on the host, as benchncnn never reads it (it makes its own weights)."""
    [remote] = device.ensure_files([model_file], timeout)
    if not adapter.needs_model_dir:
        return remote
    folder = posixpath.join(device.spec.workdir, "native", posixpath.basename(remote).split(".")[0])
    target = posixpath.join(folder, staged_name(adapter, name))
    script = 'rm -rf "$1" && mkdir -p "$1" && ln -s "$2" "$3"'
    device.transport.run(["sh", "-c", script, "sh", folder, remote, target], timeout=timeout).check(
        device.name
    )
    return folder


def staged_name(adapter: RunnerAdapter, name: str) -> str:
    """The model's file name in a staging folder: the name the tool prints on its result line."""
    return f"{name}{adapter.model_suffix}"


def invoke(
    device: Device,
    adapter: RunnerAdapter,
    argv: list[str],
    env: dict[str, str],
    opts: NativeOptions,
    timeout: float,
) -> NativeResult:
    res = device.transport.run(argv, timeout=timeout, env=run_env(dict(device.spec.env or {}), env))
    if res.returncode == 127:
        raise UserError(f"{device.name}: runner binary {argv[0]} not found on the device")
    try:
        result = adapter.parse(res.stdout + "\n" + res.stderr, res.returncode, opts)
    except NativeToolError as exc:
        if exc.kind == "usage":
            raise UserError(str(exc)) from None
        if exc.kind == "model":
            raise ModelError(f"{device.name}: {exc}") from None
        raise MeasurementError(str(exc), device=device.name, kind=exc.kind) from None
    stamp = re.search(r"^EDGEBENCH_T0 ([\d.]+)", res.stdout, re.MULTILINE)
    result.started_s = float(stamp.group(1)) if stamp else None
    span = re.search(r"^EDGEBENCH_SPAN ([\d.]+) ([\d.]+)", res.stdout, re.MULTILINE)
    if span:
        result.started_s, result.ended_s = float(span.group(1)), float(span.group(2))
    return result


# The device's uptime clock before and after the tool (10 ms steps), then the tool's own exit code.
_SPANNED = (
    'read -r a _ < /proc/uptime; "$@"; rc=$?; read -r b _ < /proc/uptime; echo "EDGEBENCH_SPAN $a $b"; '
    'exit "$rc"'
)
RESOLVE_TARGET_S = 1.0  # the extra loops' time on the device clock: its 10 ms steps are then 1%
UPTIME_STEP_S = 0.01  # /proc/uptime's resolution
MAX_LOOPS = 10**9


def resolve_by_loops(
    device: Device,
    adapter: RunnerAdapter,
    argv_for: Callable[[NativeOptions], list[str]],
    env: dict[str, str],
    opts: NativeOptions,
    timeout: float,
    printed: NativeResult,
) -> NativeResult:
    """A mean per inference the tool prints below its resolution (MNN's %8.3f ms: a mean of 0.000 or
    0.001 ms), measured on the device clock: the tool run end to end with L and then 10x, 100x... more
    loops until the extra loops take RESOLVE_TARGET_S; their time over their number is the mean. Start-up,
    model load and warm-up are in both runs and cancel; more loops of the tool's own mean would not help,
    as it prints sum / loops."""

    def spanned(loops: int) -> tuple[float, NativeResult]:
        o = replace(opts, runs=loops)
        ran = invoke(device, adapter, ["sh", "-c", _SPANNED, "sh", *argv_for(o)], env, o, timeout)
        if ran.started_s is None or ran.ended_s is None:
            raise MeasurementError(
                "the device clock stamps around the runner were not printed", device=device.name
            )
        return ran.ended_s - ran.started_s, ran

    base = max(opts.runs, 1)
    base_s, _ = spanned(base)
    loops = base * 10
    while True:
        more_s, ran = spanned(loops)
        extra_s = more_s - base_s
        if extra_s >= RESOLVE_TARGET_S or loops >= MAX_LOOPS:
            break
        if extra_s >= 5 * UPTIME_STEP_S:  # enough clock steps to aim the next count at the target
            aimed = base + (loops - base) * 1.2 * RESOLVE_TARGET_S / extra_s
            loops = min(MAX_LOOPS, max(loops * 2, int(aimed)))
        else:
            loops = min(MAX_LOOPS, loops * 10)
    if extra_s <= 0:
        raise MeasurementError(
            f"{loops} loops took no longer than {base} on the device clock: no time to measure",
            device=device.name,
        )
    mean_ms = extra_s * 1e3 / (loops - base)
    resolved = replace(ran, aggregates={"mean": mean_ms}, count=loops - base, unresolved=False)
    resolved.notes = {
        **ran.notes,
        "aggregated_by": "edgebench",
        "latency_method": (
            f"device clock: ({loops} loops - {base} loops) end to end / {loops - base}; the tool printed "
            f"avg = {printed.aggregates['mean']:.3f} ms at {printed.resolution_ms} ms steps"
        ),
    }
    resolved.warnings = [
        *ran.warnings,
        f"the tool printed avg = {printed.aggregates['mean']:.3f} ms, below what it resolves: loops raised "
        f"from {base} to {loops} and the mean taken from the device clock ({mean_ms * 1e3:.3f} us)",
    ]
    return resolved


def run_tool(
    device: Device,
    job: Job,
    params: BenchParams,
    model_file: Path,
    model_name: str,
    runtime: str,
) -> tuple[list[NativeResult], RunnerAdapter, NativeOptions]:
    """Run the runner once, or `invocations` times for a distribution; returns each parsed output."""
    timeout = job_timeout(device, job)
    adapter, runner = adapter_and_runner(device, runtime, params.runner)
    opts = replace(native_options(params), model_name=staged_name(adapter, model_name))
    opts = with_input_types(opts, adapter, model_file)
    if opts.profile and adapter.profile_to_file:  # the others print their profile, or have none
        opts = replace(
            opts, profile_path=posixpath.join(device.spec.workdir, "tmp", f"perf-{time.time_ns()}")
        )
    binary, env = install_runner(device, runner, timeout)
    staged = stage_model(device, adapter, model_file, model_name, timeout)
    argv = tool_argv(adapter, binary, staged, opts)
    if opts.profile_path:  # the tool writes its profile there; it does not make the folder
        mkdir = ["mkdir", "-p", posixpath.dirname(opts.profile_path)]
        device.transport.run(mkdir, timeout=timeout).check(device.name)
    results = []
    for _ in range(params.invocations):
        results.append(invoke(device, adapter, argv, env, opts, timeout))
        if results[-1].unresolved:

            def argv_for(o: NativeOptions) -> list[str]:
                return adapter.argv(binary, staged, o)

            results[-1] = resolve_by_loops(device, adapter, argv_for, env, opts, timeout, results[-1])
        if opts.profile_path:
            results[-1].ops = pull_ort_profile(device, opts.profile_path, opts.runs, timeout)
    return results, adapter, opts


def pull_ort_profile(device: Device, prefix: str, runs: int, timeout: float) -> list[tuple[str, str, float]]:
    """onnxruntime_perf_test -p PREFIX writes PREFIX_<date>.json: pull it, remove it, per-node times."""
    from .numerics import pull, scratch_dir
    from .profile import ProfilerOverhead, ort_profile

    listing = device.transport.run(
        ["sh", "-c", 'for f in "$1"_*.json; do [ -f "$f" ] && echo "$f"; done', "sh", prefix], timeout=timeout
    )
    files = [ln.strip() for ln in listing.stdout.splitlines() if ln.strip()]
    if not files:
        raise MeasurementError(
            f"onnxruntime_perf_test wrote no profile at {prefix}_*.json", device=device.name
        )
    with scratch_dir() as tmp:
        local = pull(device, files[-1], Path(tmp) / "profile.json", timeout)
        try:
            events = json.loads(local.read_text())
        except ValueError as exc:
            raise MeasurementError(f"onnxruntime profile {files[-1]} is unreadable: {exc}") from None
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    profile = ort_profile([e for e in events if isinstance(e, dict)], runs, ProfilerOverhead(0.0, 0.0))
    return [(op.node, op.op_type, op.ms) for op in profile.ops]


def run_native_bench(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    model = require_model(job)
    runtime = runtime_for(model, job)
    params = BenchParams.of(job)
    model_file = model_file_for(model, runtime, params.shapes)  # a converter that bakes shapes gets them
    results, adapter, opts = run_tool(device, job, params, model_file, model.name, runtime)
    ctx.runtime = runtime
    ctx.base_params = native_identity(params, adapter.name, results[0])
    ctx.base_annotations = native_notes(params, results[0])
    return native_records(ctx, results, opts)


def native_records(ctx: RecordContext, results: list[NativeResult], opts: NativeOptions) -> ProbeResult:
    out = ProbeResult()
    first = results[0]
    for r in results:
        out.warnings += r.warnings
    if len(results) == 1:
        tool_records(ctx, first, out)
    else:
        invocation_records(ctx, results, opts, out)
    # What the tool's memory figures are (fit budgets memory_mb on the growth, the closest a runner gives
    # to the model's own memory, and says so).
    measured_by = {
        "peak_rss_mb": "the runner's own figure: its whole process's peak",
        "memory_growth_mb": "the runner's own figure: its footprint's growth from start to end (not a peak)",
    }
    for metric, value, unit in (
        ("load_ms", first.load_ms, "ms"),
        ("first_inference_ms", first.first_ms, "ms"),
        ("peak_rss_mb", first.peak_memory_mb, "MB"),
        ("memory_growth_mb", first.memory_growth_mb, "MB"),
    ):
        if value is not None:
            notes = {"aggregated_by": "tool"}
            if metric in measured_by:
                notes["measured_by"] = measured_by[metric]
            out.records.append(ctx.record(metric, value, unit, annotations=notes))
    totals: dict[tuple[str, str], float] = {}
    for node, op_type, ms in first.ops:
        totals[(node, op_type)] = totals.get((node, op_type), 0.0) + ms
    for (node, op_type), ms in totals.items():
        out.records.append(
            ctx.record("op_time_ms", ms, "ms", {"aggregated_by": "tool"}, node=node, op_type=op_type)
        )
    return out


def tool_records(ctx: RecordContext, result: NativeResult, out: ProbeResult) -> None:
    """The tool's own statistics, minus percentiles its sample count cannot support."""
    n = result.count or 0
    for stat, value in result.aggregates.items():
        need = _NEEDED.get(stat)
        if need and n < need:
            out.warnings.append(f"the tool printed {stat} from {n} runs; dropped ({stat} needs {need})")
            continue
        metric = "latency_std_ms" if stat == "std" else "latency_ms"
        params: dict[str, Any] = {"stat": stat} if metric == "latency_ms" else {}
        by = result.notes.get("aggregated_by", "tool")
        out.records.append(ctx.record(metric, value, "ms", {"aggregated_by": by, "n": n}, **params))
    if not any(s.startswith("p") for s in result.aggregates):
        out.warnings.append(
            f"{ctx.device}: the tool prints only {', '.join(sorted(result.aggregates))}; "
            "set invocations to get a distribution"
        )


def invocation_records(
    ctx: RecordContext, results: list[NativeResult], opts: NativeOptions, out: ProbeResult
) -> None:
    """A distribution over invocations: each sample is one invocation's mean of `runs` inferences."""
    values = [r.aggregates["mean"] for r in results]
    s = summarize(values)
    what = "single inference" if opts.runs == 1 else f"mean of {opts.runs} inferences"
    for stat, value in {**s.percentiles, "mean": s.mean, "min": s.min, "max": s.max}.items():
        notes = {"aggregated_by": "edgebench", "sample": what, "n": s.n}
        out.records.append(ctx.record("latency_ms", value, "ms", notes, stat=stat))
    out.warnings += [f"{why} (invocations)" for why in s.refused.values()]
    out.samples.append(ctx.samples("latency_ms", "ms", values, {"sample": what}))


# ---- ceilings through the product's runtime ----------------------------------------------------------------
def matmul_model(n: int) -> onnx.ModelProto:
    """y = x @ W with square n x n fp32 operands: 2*n^3 FLOPs per inference."""
    w = numpy_helper.from_array(np.random.default_rng(7).standard_normal((n, n)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        f"matmul{n}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
        [w],
    )
    return _model(graph)


def bandwidth_model(elements: int) -> onnx.ModelProto:
    """y = x + 1 over a large vector: reads and writes 4N bytes per inference (STREAM 'copy'-like)."""
    one = numpy_helper.from_array(np.ones(1, np.float32), "one")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "stream_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [elements])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [elements])],
        [one],
    )
    return _model(graph)


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="edgebench")
    model.ir_version = 8
    return model


def _probe_model_file(model: onnx.ModelProto, name: str) -> ModelRef:
    folder = Path(tempfile.gettempdir()) / "edgebench-native-probes"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.onnx"
    if not path.exists():
        onnx.save(model, path)
    return ModelRef(name, path)


def _ceiling_run(
    device: Device, job: Job, ctx: RecordContext, model: ModelRef, threads: int
) -> tuple[float, str, str]:
    runtime = job.runtime or "onnxruntime"
    bench = BenchParams(threads=threads)
    results, adapter, _ = run_tool(device, job, bench, model_file_for(model, runtime), model.name, runtime)
    ctx.runtime = runtime
    best = min(r.aggregates.get("min", r.aggregates["mean"]) for r in results)
    return best, adapter.name, results[0].path


def first_threads(threads: tuple[int, ...] | str | None) -> int:
    """A runner takes one thread count: the first asked for (0 = the tool's default)."""
    return threads[0] if isinstance(threads, tuple) and threads else 0


def run_native_matmul(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = MatmulParams.of(job)
    threads = first_threads(params.threads)
    out = ProbeResult()
    for n in params.sizes or (1024,):
        model = _probe_model_file(matmul_model(n), f"matmul{n}")
        best_ms, runner, path = _ceiling_run(device, job, ctx, model, threads)
        tops = 2 * n**3 / (best_ms / 1e3) / 1e12
        ident = {"dtype": "fp32", "n": n, "threads": threads, "runner": runner, "backend": runner}
        out.records.append(ctx.record("effective_tops", tops, "TOPS", {"path": path}, **ident, stat="best"))
        peak = device.spec.spec.peak_tops.get("fp32")
        if peak:
            notes = {"path": path, "nominal_tops": peak}
            out.records.append(ctx.record("efficiency", tops / peak, "ratio", notes, **ident, stat="best"))
    return out


def run_native_bandwidth(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = BandwidthParams.of(job)
    threads = first_threads(params.threads)
    elements = int(params.array_mb * 2**20 / 4) if params.array_mb else 32 * 2**20
    model = _probe_model_file(bandwidth_model(elements), f"stream_add{elements}")
    best_ms, runner, path = _ceiling_run(device, job, ctx, model, threads)
    moved = 2 * 4 * elements  # read x, write y; write-allocate not counted (STREAM convention)
    gbps = moved / (best_ms / 1e3) / 1e9
    ident = {"kernel": "add", "threads": threads, "runner": runner, "array_bytes": 4 * elements}
    notes = {"bytes": moved, "path": path}
    out = ProbeResult(records=[ctx.record("bandwidth_gbps", gbps, "GB/s", notes, **ident)])
    nominal = device.spec.spec.memory_bandwidth_gbps
    if nominal:
        out.records.append(
            ctx.record("efficiency", gbps / nominal, "ratio", {**notes, "nominal_gbps": nominal}, **ident)
        )
    return out
