"""MNN `benchmark.out` (MNN/benchmark/benchmark.cpp).

Usage: `benchmark.out models_folder [loop] [warmup] [forwardtype] [threads] [precision]`; it benchmarks
every file in the folder and prints one line per model: "[ - ] NAME max = X ms min = Y ms avg = Z ms".
It prints min/max/avg only: no load time, no first inference, no percentiles.
"""

from __future__ import annotations

import re

from .base import NativeOptions, NativeResult, NativeToolError, first_error_line

_LINE = re.compile(r"\[ - \]\s+(\S+)\s+max =\s*([\d.]+)\s*ms\s+min =\s*([\d.]+)\s*ms\s+avg =\s*([\d.]+)\s*ms")
_FORWARD = {"cpu": 0, "metal": 1, "opencl": 3, "opengl": 6, "vulkan": 7}
_PRECISION = {None: 2, "low": 2, "fp16": 2, "normal": 0, "fp32": 0, "high": 1}
_ERRORS = ("Invalid", "failed", "Error", "error", "Can't", "Don't support")


class MnnBenchmark:
    name = "mnn_benchmark"
    runtime = "mnn"
    model_suffix = ".mnn"
    needs_model_dir = True

    def argv(self, binary: str, model_dir: str, opts: NativeOptions) -> list[str]:
        forward = _FORWARD.get(opts.delegate or "cpu")
        if forward is None:
            raise NativeToolError(
                self.name, f"unknown forward type '{opts.delegate}' (use {', '.join(_FORWARD)})", kind="usage"
            )
        precision = _PRECISION.get(opts.precision, 2)
        return [
            binary,
            model_dir,
            str(opts.runs),
            str(opts.warmup),
            str(forward),
            str(opts.threads or 4),
            str(precision),
        ]

    def parse(self, output: str, returncode: int, opts: NativeOptions) -> NativeResult:
        lines = _LINE.findall(output)
        if returncode != 0 or not lines:
            reason = first_error_line(output, _ERRORS) or f"exited {returncode} without a result line"
            raise NativeToolError(self.name, reason, "model")
        _name, hi, lo, avg = lines[0]
        threads = re.search(r"thread=(\d+)", output)
        result = NativeResult(
            aggregates={"max": float(hi), "min": float(lo), "mean": float(avg)},
            count=opts.runs,
            path=_forward_name(output, opts),
        )
        if threads and opts.threads and int(threads.group(1)) != opts.threads:
            result.warnings.append(f"benchmark.out ran {threads.group(1)} threads, not {opts.threads}")
        return result


def _forward_name(output: str, opts: NativeOptions) -> str:
    match = re.search(r"Forward type: \*\*(\w+)\*\*", output)
    return match.group(1).lower() if match else (opts.delegate or "cpu")
