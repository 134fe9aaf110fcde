"""ncnn `benchncnn` (ncnn benchmark/benchncnn.cpp; the lab's build is commit a4d2ea1d4422, 2026-07-22).

Rules, with the upstream source each is read from (and checked against the lab's binary, BUILD.md there):

- argv (main): `benchncnn [loop count] [num threads] [powersave] [gpu device] [cooling down] [key=value...]`,
  all positional, then `param=FILE shape=[w,h,c],...` (parse_shape_list: one bracket per input, 1 to 4
  axes in ncnn's order w, h, [d,] c, no batch). The inputs are fed to the graph's Input layers in the
  order the .param declares them (Net::input_names). edgebench reads each Input layer's shape from the
  .param on the host (`0=w 1=h 11=d 2=c`, written there when edgebench converts from ONNX) and passes it:
  NativeOptions.input_shapes. Its five positions are always passed, so none of the tool's defaults
  applies: threads must be given (0 is not "the default": the lab's build crashes on it, SIGSEGV), so
  threads=0 is refused; powersave is 0 (no binding to big or little cores, as the Python agent without
  an affinity; benchncnn's own default is 2, big cores); gpu device is -1 (the CPU) or 0 (the first
  Vulkan device) for delegate "vulkan"/"gpu"; cooling down is 0 (its default 1 sleeps 10 s before the
  model).
- Output, all on stderr: `loop_count = N`, `num_threads = N`, `powersave = N`, `gpu_device = N`,
  `cooling_down = N`, then `%20s  min = %7.2f  max = %7.2f  avg = %7.2f` (ms) named by the param path as
  given. Only min, max and avg: no percentiles (the probe refuses to invent them), no load time, no
  memory. The path that ran is read from the `gpu_device` echo (-1 cpu, else vulkan) and, on Vulkan, the
  device is named by ncnn's `[0 NAME]  queueC=...` line.
- Counts: exactly `loop count` timed runs after a fixed 8 warm-up runs (10 on Vulkan); no warm-up count,
  warm-up duration, minimum or maximum duration can be asked, and a warning says so.
- Weights and inputs: the .bin is never read; benchncnn makes its own weights (DataReaderFromEmpty: zeros
  in the upstream source, "random" in BUILD.md) and fills every input with 0.01. Its numbers are timing
  only: numerics need the Python agent.
- Precision: benchncnn's Option turns on fp16 packed/storage/arithmetic (and int8 inference) with no flag
  to turn them off, so it runs fp16 wherever the CPU or GPU has it and fp32 elsewhere: recorded as
  precision "low" (as MNN's Low), whatever was asked, and an fp32 request is warned about.
- Failures: `Net::load_param`'s return is ignored, so a param that does not load is still "run" and prints
  `min = 0.00 max = 0.00 avg = 0.00` after ncnn's own message (`fopen X failed`, `parse magic failed`,
  `layer X not exists or registered`, `load_model error at layer N, ...`, `network graph not ready`):
  those lines are errors here, never a zero latency. Fewer shapes than Input layers print `input N
  tensors while model has M inputs` and no result. Shapes are not checked against the graph: one that
  does not fit runs (garbage in, garbage timed) or crashes (SIGSEGV), which is reported with the shape.
  Asking for Vulkan where no driver loads prints `load vulkan driver failed` and crashes: a delegate
  error.
- Resolution: `%7.2f` ms, 10 us steps of the per-loop mean; an avg under 20 steps is marked unresolved
  and the probe takes the mean from the device clock over more loops (probes/native.py, resolve_by_loops).
- Per-layer times: a build with NCNN_BENCHMARK (the lab's `benchncnn-layers`) prints
  `%-24s %-30s %8.2lfms    | SHAPES` per layer and run (ncnn src/benchmark.cpp), warm-up runs included,
  and `%8.2lfus` for layers timed on the GPU (Vulkan timestamps; the format string of the binary, no
  capture here). The last `loop count` of each layer are the timed runs: their mean is the layer's time.
  Those builds' min/max/avg include the timing and printing of every layer, and a warning says so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import ModelError
from ..models.convert_ncnn import param_graph_of_text
from .base import (
    NativeOptions,
    NativeResult,
    NativeToolError,
    crash_reason,
    failure_kind,
    killed_from_outside,
)

TOOL = "benchncnn"
_RESULT = re.compile(
    r"^\s*(\S.*?)\s+(?:(?:cpu|gpu)\s+)?min =\s*(\S+)\s+max =\s*(\S+)\s+avg =\s*(\S+)", re.MULTILINE
)
_ECHO = re.compile(r"^(loop_count|num_threads|powersave|gpu_device|cooling_down) = (-?\d+)\s*$", re.MULTILINE)
_LAYER = re.compile(r"^(\S+)\s+(\S+)\s+(-?[\d.]+)(ms|us)\s+\|", re.MULTILINE)
_GPU_NAME = re.compile(r"^\[(\d+) (.+?)\]\s+queueC=", re.MULTILINE)
_GPU = {"vulkan": 0, "gpu": 0}
_NO_GPU = ("load vulkan driver failed", "vkCreateInstance failed", "vkEnumeratePhysicalDevices failed")
# ncnn's own messages for a graph it did not load (src/net.cpp, src/paramdict.cpp; NCNN_LOGE, stderr).
_LOAD_ERRORS = re.compile(
    r"^(fopen .* failed|parse \w+ failed|read \w+ failed|layer \S+ not exists or registered|"
    r"layer load_param .*failed|layer load_model .*failed|load_model error at layer .*|"
    r"ParamDict load_param.*failed|find_blob_index_by_name .* failed|network graph not ready)\s*$",
    re.MULTILINE,
)
_INPUTS = re.compile(r"^input (\d+) tensors while model has (\d+) inputs", re.MULTILINE)
_USAGE = ("Usage: benchncnn", "input tensor shape empty!", "unsupported input shape size", "unrecognized arg")
WARMUP_CPU, WARMUP_GPU = 8, 10  # Benchmark::warmup_loop_count, 10 when gpu device is not -1
POWERSAVE = 0  # all cores, no binding (ncnn::set_cpu_powersave: 0 all, 1 little, 2 big)
RESOLUTION_MS = 0.01  # `avg = %7.2f` ms
STEPS_NEEDED = 20  # an avg under 20 printed steps is quantised by more than 2.5%
_INPUT_AXES = ("0", "1", "11", "2")  # ncnn Input layer params: w, h, d, c
_SHAPE_FORMS = {
    (True, False, False, False),
    (True, True, False, False),
    (True, True, False, True),
    (True, True, True, True),
}


class BenchNcnn:
    """ncnn's `benchncnn`, plain or per-layer build: one .param at its declared input shapes; min/max/avg
    (and per-layer times) parsed."""

    name = "benchncnn"
    runtime = "ncnn"
    model_suffix = ".param"
    needs_model_dir = False  # takes the .param itself (and never opens the .bin beside it)
    profile_to_file = False  # per-layer times are printed, by an NCNN_BENCHMARK build only

    def argv(self, binary: str, model: str, opts: NativeOptions) -> list[str]:
        backend = opts.delegate or "cpu"
        if backend != "cpu" and backend not in _GPU:
            raise NativeToolError(
                TOOL, f"no delegate '{backend}': benchncnn runs on cpu or vulkan (gpu)", kind="usage"
            )
        if opts.threads <= 0:
            raise NativeToolError(
                TOOL,
                "the thread count is positional and has no 'default' value (0 crashes benchncnn): "
                "give --threads N",
                kind="usage",
            )
        if not opts.input_shapes:
            raise NativeToolError(
                TOOL,
                f"{_label(opts, model)}: no input shape known: benchncnn needs each Input layer's [w,h,c]",
                kind="usage",
            )
        return [
            binary,
            str(opts.runs),
            str(opts.threads),
            str(POWERSAVE),
            str(_GPU.get(backend, -1)),
            "0",  # cooling down off: no 10 s sleep before the model
            f"param={model}",
            "shape=" + ",".join(shape_arg(dims) for _, dims in opts.input_shapes),
        ]

    def parse(self, output: str, returncode: int, opts: NativeOptions) -> NativeResult:
        echo = {k: int(v) for k, v in _ECHO.findall(output)}
        results = _RESULT.findall(output)
        label = _label(opts, results[0][0] if results else None)
        _raise_failures(output, returncode, results, opts, label)
        _, lo, hi, avg = results[-1]
        try:
            aggregates = {"min": float(lo), "max": float(hi), "mean": float(avg)}
        except ValueError:
            raise NativeToolError(
                TOOL, f"{label}: printed no number (min = {lo} max = {hi} avg = {avg})", "measurement"
            ) from None
        gpu = echo.get("gpu_device", _GPU.get(opts.delegate or "cpu", -1))
        path = "cpu" if gpu < 0 else "vulkan"
        asked = "vulkan" if (opts.delegate or "cpu") in _GPU else "cpu"
        if path != asked:
            raise NativeToolError(
                TOOL, f"asked for {asked}, but benchncnn says gpu_device = {gpu} ({path})", "delegate"
            )
        count = echo.get("loop_count", opts.runs)
        result = NativeResult(
            aggregates=aggregates,
            count=count,
            path=path,
            warmup_count=WARMUP_GPU if path == "vulkan" else WARMUP_CPU,
            resolution_ms=RESOLUTION_MS,
            unresolved=aggregates["mean"] < STEPS_NEEDED * RESOLUTION_MS,
        )
        result.ops, per_layer_warnings = layer_times(output, count, result.warmup_count or 0)
        result.applied = {"backend": path, "precision": "low", "layer_timing": bool(result.ops)}
        result.notes = {
            "precision_mode": "fp16 packed/storage/arithmetic on where the hardware has them (benchncnn's "
            "fixed Option; no flag turns them off)",
            "weights": "not the model's: benchncnn never reads the .bin and makes its own; numerics need "
            "the Python agent",
            "inputs": "every input filled with 0.01 by the tool",
            "powersave": f"{echo.get('powersave', POWERSAVE)}: threads not bound to big or little cores",
            "cooling_down": "0: benchncnn's 10 s sleep before the model is off",
            "input_shapes": "; ".join(f"{n}={shape_arg(d)}" for n, d in opts.input_shapes) or "unknown",
        }
        if path == "vulkan":
            device = _GPU_NAME.search(output)
            result.notes["vulkan_device"] = device.group(2) if device else "not printed"
            _placement(result, opts, output)
        threads = echo.get("num_threads")
        if threads is not None and threads != opts.threads:
            result.warnings.append(f"benchncnn ran {threads} threads, not {opts.threads}")
        if echo.get("powersave", POWERSAVE) != POWERSAVE:
            result.warnings.append(
                f"benchncnn reports powersave = {echo['powersave']}, not {POWERSAVE}: its threads are bound"
            )
        if result.ops:
            result.notes["layer_times"] = (
                f"mean of the last {count} of each layer's lines (the timed runs; "
                f"the first {result.warmup_count} are warm-up), printed at 0.01 ms steps"
            )
            result.warnings.append(
                "per-layer build (NCNN_BENCHMARK): its min/max/avg include timing and printing every "
                "layer; take latency from the plain benchncnn"
            )
        result.warnings += per_layer_warnings + _not_applied(opts, result)
        return result


def shape_arg(dims: Sequence[int]) -> str:
    """One input's shape as benchncnn's shape= takes it: [w,h,c]."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def declared_inputs(param_text: str, source: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(blob, [w, h, (d,) c]) of each Input layer of an ncnn .param text, in the graph's input order; a
    NativeToolError naming `source` and the layer when the file is not a .param or an Input layer declares
    no shape (`0=w 1=h 11=d 2=c`, which benchncnn needs and does not read from the graph itself)."""
    try:
        layers = param_graph_of_text(param_text, source)
    except ModelError as exc:
        raise NativeToolError(TOOL, str(exc)) from None
    found = []
    for layer in (layer for layer in layers if layer.type == "Input"):
        blob = layer.tops[-1] if layer.tops else layer.name
        params = dict(layer.params)
        try:
            dims = [int(params.get(axis, "0")) for axis in _INPUT_AXES]
        except ValueError:
            raise NativeToolError(
                TOOL, f"{source}: Input layer '{layer.name}' has a shape that is not integers"
            ) from None
        set_axes = tuple(d > 0 for d in dims)
        if not any(set_axes):
            raise NativeToolError(
                TOOL,
                f"{source}: Input layer '{layer.name}' declares no shape (0=w 1=h 2=c): benchncnn needs "
                "each input's shape; convert the model from ONNX with edgebench, or add it to the layer",
            )
        if set_axes not in _SHAPE_FORMS:  # ncnn Mats are w, (w,h), (w,h,c) or (w,h,d,c)
            given = " ".join(f"{axis}={params[axis]}" for axis in _INPUT_AXES if axis in params)
            raise NativeToolError(
                TOOL, f"{source}: Input layer '{layer.name}' declares a partial shape ({given})"
            )
        found.append((blob, tuple(d for d in dims if d > 0)))
    if not found:
        raise NativeToolError(TOOL, f"{source}: the ncnn graph has no Input layer")
    return tuple(found)


def layer_times(output: str, count: int, warmup: int) -> tuple[list[tuple[str, str, float]], list[str]]:
    """(layer name, layer type, mean ms over the timed runs) from an NCNN_BENCHMARK build's lines, in
    graph order, with a warning when a layer was printed fewer times than warm-up plus timed runs."""
    seen: dict[tuple[str, str], list[float]] = {}
    for kind, name, value, unit in _LAYER.findall(output):
        seen.setdefault((name, kind), []).append(float(value) / (1000.0 if unit == "us" else 1.0))
    ops, short = [], []
    for (name, kind), values in seen.items():
        timed = values[-count:] if count > 0 else values
        ops.append((name, kind, sum(timed) / len(timed)))
        if len(values) < count + warmup:
            short.append(name)
    warnings = []
    if short:
        warnings.append(
            f"layers printed fewer than {count + warmup} times (warm-up and timed runs): "
            f"{', '.join(short[:5])}; their times are means over what was printed"
        )
    return ops, warnings


def _placement(result: NativeResult, opts: NativeOptions, output: str) -> None:
    """On Vulkan, which layers ran on the CPU: a per-layer build times GPU layers in us and the CPU ones
    in ms; without one, placement cannot be shown (ncnn runs a layer it lacks on Vulkan on the CPU)."""
    if not result.ops:
        result.notes["placement_evidence"] = "none: only a per-layer build (NCNN_BENCHMARK) shows it"
        if opts.require_backend:
            raise NativeToolError(
                TOOL,
                "vulkan is required, but this benchncnn prints no per-layer lines: layers ncnn runs on "
                "the CPU (those it lacks on Vulkan) cannot be shown; use the per-layer build",
                "delegate",
            )
        return
    on_cpu = list(dict.fromkeys(name for _, name, _, unit in _LAYER.findall(output) if unit == "ms"))
    result.notes["placement_evidence"] = "per-layer lines: GPU timestamps (us) or CPU times (ms)"
    if on_cpu:
        result.notes["layers_on_cpu"] = ", ".join(on_cpu)
        if opts.require_backend:
            raise NativeToolError(
                TOOL,
                f"vulkan is required, but {len(on_cpu)} layers ran on the CPU: {', '.join(on_cpu[:5])}",
                "delegate",
            )


def _raise_failures(
    output: str, returncode: int, results: list[tuple[str, ...]], opts: NativeOptions, label: str
) -> None:
    """A one-line NativeToolError for every run that measured nothing; returns for a valid result."""
    if killed := killed_from_outside(returncode):
        raise NativeToolError(TOOL, killed, failure_kind(returncode, "model"))
    crash = crash_reason(returncode)
    no_gpu = next((m for m in _NO_GPU if m in output), None)
    if no_gpu and (opts.delegate or "cpu") in _GPU:
        how = f" and crashed ({crash}, exit {returncode})" if crash else ""
        raise NativeToolError(
            TOOL,
            f"asked for vulkan, but benchncnn could not use a Vulkan device ('{no_gpu}'){how}: "
            "install the device's Vulkan driver, or bench on cpu",
            "delegate",
        )
    load = _LOAD_ERRORS.search(output)
    if load:
        then = f", then crashed ({crash}, exit {returncode})" if crash else ""
        raise NativeToolError(TOOL, f"{label}: {_load_reason(load.group(1))}{then}", "model")
    inputs = _INPUTS.search(output)
    if inputs:
        raise NativeToolError(
            TOOL,
            f"{label}: the graph has {inputs.group(2)} inputs, benchncnn was given {inputs.group(1)} shapes",
            "model",
        )
    usage = next((line.strip() for line in output.splitlines() if line.strip().startswith(_USAGE)), None)
    if usage:
        raise NativeToolError(TOOL, f"the arguments were not taken: '{usage}'", "usage")
    if crash:
        shapes = ",".join(shape_arg(d) for _, d in opts.input_shapes) or "unknown"
        raise NativeToolError(
            TOOL,
            f"{label}: crashed ({crash}, exit {returncode}) running the graph at shape {shapes}: benchncnn "
            "checks neither the graph nor the shape (a shape the graph does not fit, or one too large "
            "for memory, ends so)",
            "model",
        )
    if returncode != 0:
        after = "after its result line" if results else "without a result line"
        raise NativeToolError(TOOL, f"{label}: exited {returncode} {after}", "model")
    if not results:
        raise NativeToolError(TOOL, f"{label}: printed no result line", "model")


def _load_reason(line: str) -> str:
    """ncnn's message for a graph it did not load, said as what is wrong with the file."""
    unknown = re.match(r"layer (\S+) not exists or registered", line)
    if unknown:
        return f"ncnn has no layer type '{unknown.group(1)}' ('{line}'): this benchncnn cannot run the graph"
    if line.startswith("fopen"):
        return f"the param file could not be opened ('{line}')"
    return f"the param file did not load ('{line}')"


def _label(opts: NativeOptions, printed: str | None) -> str:
    """How messages name the model: its file name as edgebench staged it, else as the tool printed it."""
    return opts.model_name or (printed.strip() if printed else "the model")


def _not_applied(opts: NativeOptions, result: NativeResult) -> list[str]:
    """What benchncnn cannot be told (it takes a loop count only), said rather than dropped."""
    out = []
    warmup = result.warmup_count
    asked = [f"warmup={opts.warmup}"] if opts.warmup != warmup else []
    asked += [f"warmup_seconds={opts.warmup_seconds:g} s"] if opts.warmup_seconds > 0 else []
    asked += [f"min_seconds={opts.min_seconds:g} s"] if opts.min_seconds > 0 else []
    if asked:
        out.append(
            f"benchncnn runs exactly {result.count} timed and {warmup} warm-up loops: "
            f"{', '.join(asked)} and max_seconds not applied"
        )
    if opts.precision in (None, "fp32"):
        out.append("benchncnn cannot run fp32: it turns fp16 on where the hardware has it (recorded as low)")
    if opts.profile and not result.ops:
        out.append(
            "this benchncnn prints no per-layer times (built without NCNN_BENCHMARK): profile not "
            "applied; use the per-layer build"
        )
    return out
