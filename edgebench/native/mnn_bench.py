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
  backend the library lacks, or cannot start, makes the library print `Can't Find type=3 backend, use 0
  instead` (core/Schedule.cpp:136, MNN_PRINT), after its own reason where it has one (`Load vulkan
  library error: libvulkan.so: cannot open shared object file...` without the loader, `Invalide device
  for support vulkan` without a driver, `OpenCL init error, fallback ...`), and run on the CPU at
  `numberThread` threads (the GPU mode, 4) without an error: recorded as the CPU, that line its evidence
  (notes["placement_evidence"]), never as the one asked; an error (kind "delegate") when the backend is
  required. No such line where the library's messages reach stdout is the evidence that the asked
  backend ran: the 3.6.1 OpenCL+Vulkan build at forward 7 on Mesa's lavapipe prints none and takes tens
  of times the CPU's time (fixtures vulkan_lavapipe, vulkan_no_loader, vulkan_no_icd, opencl_init_error
  are that build's real output). But MNN_PRINT/MNN_ERROR write
  to logcat, not stdout, in builds with MNN_USE_LOGCAT (include/MNN/MNNDefine.h:29-30; CMake's default
  on Android): then neither that line nor "not resized" is printed. benchmark.cpp:437 prints
  `[-INFO-]: precision...` through MNN_PRINT on every run, so its absence says the library's messages
  are hidden: a non-CPU backend is then recorded as "unknown" (with a warning; an error when the backend
  is required), never as the one asked.
- Precision (BackendConfig::PrecisionMode): 0 Normal, 1 High, 2 Low, 3 Low_BF16. On the CPU Normal and High
  are fp32 and Low is fp16 where the CPU has it (`precision!=2, use fp32 inference.`); on OpenCL/Vulkan
  Normal is fp16 (vulkan/runtime/VulkanRuntime.cpp:108 keeps fp32 only for High): fp32 is 0 on the CPU and
  1 on GPU backends.
- Threads: on GPU backends `numberThread` is the GPU mode (MNNForwardType.h, MNN_GPU_TUNING_*): edgebench
  passes 4 (MNN_GPU_TUNING_WIDE, MNN's default) there, not a thread count.
- No valid measurement: a model with unset input dimensions prints `Can't run session because not resized`
  (core/Session.cpp:247) on every loop and then `avg = 0.000 ms`-like near-zero times; a file that is not an
  MNN model crashes the tool (SIGSEGV, exit 139, nothing printed after `Benchmarking...`). Both are errors.
- Resolution: `%8.3f` ms (benchmark.cpp:197) is 1 us steps of the per-loop mean (sum / loop), so more
  loops do not resolve it. An avg under 20 steps is marked unresolved: the probe then times two
  invocations with different loop counts on the device clock and takes the difference per extra loop
  (probes/native.py, resolve_by_loops). With the library's messages hidden (no `[-INFO-]` line) a
  near-zero avg cannot be told from a model that never ran (not resized): an error.
- Counts: `--------> Benchmarking... loop = L, warmup = W` (benchmark.cpp:432) echoes them; doBench runs
  exactly W warm-up and L timed loops (benchmark.cpp:160-180): no minimum, maximum or warm-up duration,
  and a warning says so when they are asked for.
- It prints min/max/avg only: no load time, no first inference, no percentiles, no per-op profile.
"""

from __future__ import annotations

import re

from .base import (
    NativeOptions,
    NativeResult,
    NativeToolError,
    crash_reason,
    failure_kind,
    first_error_line,
    killed_from_outside,
)

_LINE = re.compile(r"\[ - \]\s+(\S+)\s+max =\s*([\d.]+)\s*ms\s+min =\s*([\d.]+)\s*ms\s+avg =\s*([\d.]+)\s*ms")
_FORWARD = {"cpu": 0, "metal": 1, "cuda": 2, "opencl": 3, "opengl": 6, "vulkan": 7, "hexagon": 10}
_GPU = {"metal", "cuda", "opencl", "opengl", "vulkan"}
_GPU_TUNING_WIDE = 4
_PRECISION_NAMES = {0: "normal", 1: "high", 2: "low"}
_ERRORS = ("Invalid", "failed", "Error", "error", "Don't support", "open ")
_FALLBACK = re.compile(r"Can't Find type=(\d+) backend, use (\d+) instead")
# What a GPU backend prints before its fallback: `Load vulkan library error: ...`, `Invalide device for
# support vulkan` (MNN's spelling), `OpenCL init error, fallback ...`
_FELL_BECAUSE = ("error", "Error", "fallback", "Invalid")
_RESOLUTION_MS = 0.001  # displayStats prints %8.3f ms
_STEPS_NEEDED = 20  # an avg under 20 printed steps is quantised by more than 2.5%


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
            raise NativeToolError(
                self.name, _failure(output, returncode, lines, opts), failure_kind(returncode, "model")
            )
        if "Can't run session because not resized" in _own_log(output, mine[0][0]):
            raise NativeToolError(
                self.name,
                "Can't run session because not resized: the model has unset input dimensions and "
                "benchmark.out never resizes them (set them at conversion, e.g. a fixed-shape ONNX model)",
                "model",
            )
        name, hi, lo, avg = mine[0]
        hidden = "[-INFO-]" not in output  # MNN_PRINT goes to logcat (MNN_USE_LOGCAT)
        unresolved = float(avg) < _STEPS_NEEDED * _RESOLUTION_MS
        if unresolved and hidden:
            raise NativeToolError(
                self.name,
                f"{name}: avg = {avg} ms is below what benchmark.out resolves (%8.3f ms), and this build "
                "logs to logcat (no '[-INFO-]' line): a model that never ran ('not resized') cannot be "
                "ruled out",
                "measurement",
            )
        backend = opts.delegate or "cpu"
        ran, evidence = _backend_ran(output, backend, hidden)
        precision = precision_code(backend, opts.precision)
        loops = re.search(r"Benchmarking\.\.\. loop = (\d+), warmup = (\d+)", output)
        result = NativeResult(
            aggregates={"max": float(hi), "min": float(lo), "mean": float(avg)},
            count=int(loops.group(1)) if loops else opts.runs,
            path=ran,
            warmup_count=int(loops.group(2)) if loops else opts.warmup,
            resolution_ms=_RESOLUTION_MS,
            unresolved=unresolved,
        )
        result.applied = {"backend": ran, "precision": _precision_ran(output, ran, precision)}
        result.notes = {
            "precision_mode": _PRECISION_NAMES.get(precision, str(precision)),
            "inputs": "the tool's own, never refreshed",
            "placement_evidence": evidence,
        }
        if backend in _GPU:
            result.notes["gpu_mode"] = _GPU_TUNING_WIDE
            result.warnings.append(
                f"{backend}: the thread argument of benchmark.out is the GPU mode (4, wide tuning)"
            )
        threads = re.search(r"thread=(\d+)", output)
        if threads and backend not in _GPU and opts.threads and int(threads.group(1)) != opts.threads:
            result.warnings.append(f"benchmark.out ran {threads.group(1)} threads, not {opts.threads}")
        if ran not in (backend, "unknown"):
            _fell_back(result, opts, backend, ran, evidence, threads.group(1) if threads else None)
        if ran == "unknown":
            result.notes["backend_evidence"] = "none: libMNN logs to logcat (no '[-INFO-]' line on stdout)"
            if opts.require_backend:
                raise NativeToolError(
                    self.name,
                    f"{backend} is required, but this benchmark.out logs to logcat (no '[-INFO-]' line): "
                    f"whether libMNN had the {backend} backend or fell back to the CPU cannot be shown",
                    "delegate",
                )
            result.warnings.append(
                f"asked for {backend}; this benchmark.out logs to logcat, so a fallback to the CPU "
                "('Can't Find type=N backend') would not show: backend recorded as unknown"
            )
        result.warnings += _not_applied(opts)
        return result


def _not_applied(opts: NativeOptions) -> list[str]:
    """What benchmark.out cannot honour (it takes a loop and a warm-up count only), said not dropped."""
    out = []
    durations = [f"min_seconds={opts.min_seconds:g} s"] if opts.min_seconds > 0 else []
    if opts.warmup_seconds > 0:
        durations.append(f"warmup_seconds={opts.warmup_seconds:g} s")
    if durations:
        out.append(
            f"benchmark.out runs exactly {opts.runs} timed and {opts.warmup} warm-up loops: "
            f"{', '.join(durations)} and max_seconds not applied"
        )
    if opts.profile:
        out.append("benchmark.out prints no per-op profile: profile not applied")
    return out


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


def _backend_ran(output: str, asked: str, hidden: bool) -> tuple[str, str]:
    """(the backend that ran, the evidence read): the one libMNN says it fell back to (`Can't Find type=N
    backend, use M instead`, after its reason where it printed one); the asked one where libMNN's
    messages reach stdout and it printed no fallback; "unknown" when they are hidden (logcat builds) and
    a fallback could not have shown. The CPU is always there."""
    missing = _FALLBACK.search(output)
    if missing:
        names = {v: k for k, v in _FORWARD.items()}
        used = names.get(int(missing.group(2)), f"type {missing.group(2)}")
        reason = first_error_line(output[: missing.start()].split("The device supports")[-1], _FELL_BECAUSE)
        said = f"'{reason}', then '{missing.group(0)}'" if reason else f"'{missing.group(0)}'"
        return used, f"libMNN printed {said}"
    if asked == "cpu":
        return "cpu", "the CPU backend (always built into libMNN)"
    if hidden:
        return "unknown", "none: libMNN logs to logcat (no '[-INFO-]' line on stdout)"
    return asked, (
        f"no 'Can't Find type={_FORWARD[asked]} backend' line, with libMNN's messages on stdout "
        "('[-INFO-]' line seen): libMNN made the backend"
    )


def _fell_back(
    result: NativeResult, opts: NativeOptions, asked: str, ran: str, evidence: str, threads: str | None
) -> None:
    """A run libMNN moved off the asked backend: an error when that backend is required, else recorded as
    where it ran, said in a warning (with the threads the CPU ran, the GPU mode taken as a count)."""
    if opts.require_backend:
        raise NativeToolError(
            "mnn_benchmark",
            f"{asked} is required, but libMNN has no {asked} backend it can start and ran on {ran} "
            f"({evidence}): build MNN with it (and preload its library), or bench on cpu",
            "delegate",
        )
    at = f" at {threads} threads (the GPU mode argument taken as a thread count)" if threads else ""
    result.warnings.append(
        f"asked for {asked}, but libMNN has no {asked} backend it can start: the run is on {ran}{at}, "
        f"recorded as {ran} ({evidence})"
    )


def _failure(output: str, returncode: int, lines: list[tuple[str, ...]], opts: NativeOptions) -> str:
    crash = crash_reason(returncode)
    if killed := killed_from_outside(returncode):
        return killed
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
