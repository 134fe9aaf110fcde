"""MNN `benchmark.out` (MNN benchmark/benchmark.cpp; identical at tag 3.6.1 and HEAD 4d40bdbd).

Rules, with the upstream source each is read from and the versions it covers:

- argv (benchmark.cpp:386-427 at 3.6.1): `MODELS_DIR [loop] [warmup] [forward] [numberThread] [precision]
  [sparsity] [sparseBlockOC] [testQuantizedModel] [enableKleidiAI]`; the same positions since 1.0.
- It benchmarks every file of MODELS_DIR in readdir order (findModelFiles, benchmark.cpp:54-95), one line
  each: `[ - ] NAME    max = X ms  min = Y ms  avg = Z ms` (displayStats, `%8.3f`; before 1.1 `X ms`
  had no space). The line is picked by the model's file name, and the staging folder holds only it.
- Forward type (MNNForwardType.h): cpu 0, metal 1, cuda 2, opencl 3, opengl 6, vulkan 7, hexagon 10.
  The header line is `Forward type: CPU thread=4 precision=2 ...` since 2.6.2 and
  `Forward type: **CPU** thread=4** precision=2...` before; it echoes what was asked, not what ran. A
  backend the library lacks makes the library print `Can't Find type=3 backend, use 0 instead`
  (core/Schedule.cpp:136) and run on the CPU: an error here, never a record named "opencl".
- Precision (BackendConfig::PrecisionMode): 0 Normal, 1 High, 2 Low, 3 Low_BF16. On the CPU Normal and High
  are fp32 and Low is fp16 where the CPU has it (`precision!=2, use fp32 inference.`); on OpenCL/Vulkan
  Normal is fp16 (vulkan/runtime/VulkanRuntime.cpp:108 keeps fp32 only for High): fp32 is 0 on the CPU and
  1 on GPU backends.
- Threads: on GPU backends `numberThread` is the GPU mode (MNNForwardType.h, MNN_GPU_TUNING_*): edgebench
  passes 4 (MNN_GPU_TUNING_WIDE, MNN's default) there, not a thread count.
- No valid measurement: a model with unset input dimensions prints `Can't run session because not resized`
  (core/Session.cpp:247) on every loop and then `avg = 0.000 ms`-like near-zero times; a file that is not an
  MNN model crashes the tool (SIGSEGV, exit 139, nothing printed after `Benchmarking...`). Both are errors.
- It prints min/max/avg only: no load time, no first inference, no percentiles.
"""

from __future__ import annotations

import re

from .base import NativeOptions, NativeResult, NativeToolError, crash_reason, first_error_line

_LINE = re.compile(r"\[ - \]\s+(\S+)\s+max =\s*([\d.]+)\s*ms\s+min =\s*([\d.]+)\s*ms\s+avg =\s*([\d.]+)\s*ms")
_FORWARD = {"cpu": 0, "metal": 1, "cuda": 2, "opencl": 3, "opengl": 6, "vulkan": 7, "hexagon": 10}
_GPU = {"metal", "cuda", "opencl", "opengl", "vulkan"}
_GPU_TUNING_WIDE = 4
_PRECISION_NAMES = {0: "normal", 1: "high", 2: "low"}
_ERRORS = ("Invalid", "failed", "Error", "error", "Don't support", "open ")


class MnnBenchmark:
    name = "mnn_benchmark"
    runtime = "mnn"
    model_suffix = ".mnn"
    needs_model_dir = True
    profile_to_file = False  # benchmark.out has no per-op profile

    def argv(self, binary: str, model_dir: str, opts: NativeOptions) -> list[str]:
        backend = opts.delegate or "cpu"
        if backend not in _FORWARD:
            raise NativeToolError(
                self.name, f"unknown forward type '{backend}' (use {', '.join(_FORWARD)})", kind="usage"
            )
        return [
            binary,
            model_dir,
            str(opts.runs),
            str(opts.warmup),
            str(_FORWARD[backend]),
            str(_GPU_TUNING_WIDE if backend in _GPU else (opts.threads or 4)),
            str(precision_code(backend, opts.precision)),
        ]

    def parse(self, output: str, returncode: int, opts: NativeOptions) -> NativeResult:
        lines = _LINE.findall(output)
        mine = [ln for ln in lines if opts.model_name is None or ln[0] == opts.model_name]
        if returncode != 0 or not mine:
            raise NativeToolError(self.name, _failure(output, returncode, lines, opts), "model")
        if "Can't run session because not resized" in _own_log(output, mine[0][0]):
            raise NativeToolError(
                self.name,
                "Can't run session because not resized: the model has unset input dimensions and "
                "benchmark.out never resizes them (set them at conversion, e.g. a fixed-shape ONNX model)",
                "model",
            )
        name, hi, lo, avg = mine[0]
        if float(avg) <= 0.0:
            raise NativeToolError(self.name, f"{name}: avg = {avg} ms is not a measurement", "model")
        backend = opts.delegate or "cpu"
        ran = _backend_ran(output, backend)
        precision = precision_code(backend, opts.precision)
        result = NativeResult(
            aggregates={"max": float(hi), "min": float(lo), "mean": float(avg)},
            count=opts.runs,
            path=ran,
        )
        result.applied = {"backend": ran, "precision": _precision_ran(output, ran, precision)}
        result.notes = {
            "precision_mode": _PRECISION_NAMES.get(precision, str(precision)),
            "inputs": "the tool's own, never refreshed",
        }
        if backend in _GPU:
            result.notes["gpu_mode"] = _GPU_TUNING_WIDE
            result.warnings.append(
                f"{backend}: the thread argument of benchmark.out is the GPU mode (4, wide tuning)"
            )
        threads = re.search(r"thread=(\d+)", output)
        if threads and backend not in _GPU and opts.threads and int(threads.group(1)) != opts.threads:
            result.warnings.append(f"benchmark.out ran {threads.group(1)} threads, not {opts.threads}")
        return result


def _own_log(output: str, name: str) -> str:
    """What the tool printed while it ran this model: from the previous result line to this one's."""
    before = output[: output.find(f"] {name} ")] if f"] {name} " in output else output
    last = before.rfind("[ - ]")
    return before[last:] if last >= 0 else before


def precision_code(backend: str, precision: str | None) -> int:
    """MNN's PrecisionMode for what was asked: fp32 (the default) is Normal on the CPU, High elsewhere."""
    if precision in ("fp16", "low"):
        return 2
    return 1 if backend in _GPU else 0


def _precision_ran(output: str, backend: str, code: int) -> str:
    """fp32 for Normal/High; Low is fp16 on GPU backends, and on the CPU only where it has fp16
    (`The device supports: ... fp16:0|1`, printed by the CPU backend since 2.x)."""
    if code != 2:
        return "fp32"
    if backend in _GPU:
        return "fp16"
    supports = re.search(r"The device supports:.*?fp16:\s*(\d)", output)
    if supports:
        return "fp16" if supports.group(1) == "1" else "fp32"
    return "low"


def _backend_ran(output: str, asked: str) -> str:
    missing = re.search(r"Can't Find type=(\d+) backend, use (\d+) instead", output)
    if missing:
        names = {v: k for k, v in _FORWARD.items()}
        used = names.get(int(missing.group(2)), missing.group(2))
        raise NativeToolError(
            "mnn_benchmark",
            f"asked for {asked}, but libMNN has no such backend and ran on {used} "
            f"('{missing.group(0)}'): build MNN with it, or bench on cpu",
            "delegate",
        )
    return asked


def _failure(output: str, returncode: int, lines: list[tuple[str, ...]], opts: NativeOptions) -> str:
    crash = crash_reason(returncode)
    if crash:
        return (
            f"crashed ({crash}, exit {returncode}) loading the model: not a valid MNN model file "
            "(benchmark.out does not check the file)"
        )
    if lines and opts.model_name:
        return f"printed no result for {opts.model_name} (only for {', '.join(ln[0] for ln in lines)})"
    if "Usage:" in output:
        return "printed its usage: the arguments were not taken"
    reason = first_error_line(output, _ERRORS)
    return reason or f"exited {returncode} without a result line"
