"""TFLite / LiteRT `benchmark_model` (tensorflow/lite/tools/benchmark).

Output: "Initialized session in X ms", two `count=.. first=.. curr=.. min=.. max=.. avg=.. std=..` lines
(warm-up, then the timed runs; all in microseconds), "Inference timings in us: Init: .., First inference: ..",
a peak memory line and, with --enable_op_profiling, per-node tables.
"""

from __future__ import annotations

import re

from .base import NativeOptions, NativeResult, NativeToolError, first_error_line, number

_STATS = re.compile(
    r"count=(\d+)\s+first=(\d+)\s+curr=(\d+)\s+min=(\d+)\s+max=(\d+)\s+avg=([\d.e+]+)\s+std=(\d+)"
)
_DELEGATE_FLAGS = {
    "xnnpack": "--use_xnnpack=true",
    "nnapi": "--use_nnapi=true",
    "gpu": "--use_gpu=true",
    "hexagon": "--use_hexagon=true",
    "cpu": "--use_xnnpack=false",
}
_ERRORS = (
    "Failed to apply",
    "Benchmarking failed",
    "Failed to mmap",
    "Failed to load",
    "ERROR:",
    "Could not open",
    "failed to prepare",
)


class TfliteBenchmarkModel:
    name = "benchmark_model"
    runtime = "tflite"
    model_suffix = ".tflite"
    needs_model_dir = False

    def argv(self, binary: str, model: str, opts: NativeOptions) -> list[str]:
        args = [
            binary,
            f"--graph={model}",
            f"--warmup_runs={opts.warmup}",
            f"--num_runs={opts.runs}",
            f"--min_secs={opts.min_seconds:g}",
            f"--max_secs={opts.max_seconds:g}",
            "--report_peak_memory_footprint=true",
        ]
        if opts.threads:
            args.append(f"--num_threads={opts.threads}")
        if opts.delegate:
            if opts.delegate not in _DELEGATE_FLAGS:
                raise NativeToolError(
                    self.name,
                    f"unknown delegate '{opts.delegate}' (use {', '.join(_DELEGATE_FLAGS)})",
                    kind="usage",
                )
            args.append(_DELEGATE_FLAGS[opts.delegate])
        if opts.precision == "fp16":
            args += ["--allow_fp16=true", "--gpu_precision_loss_allowed=true"]
        if opts.profile:
            args.append("--enable_op_profiling=true")
        return args

    def parse(self, output: str, returncode: int, opts: NativeOptions) -> NativeResult:
        stats = _STATS.findall(output)
        if returncode != 0 or not stats:
            reason = first_error_line(output, _ERRORS) or f"exited {returncode} without a result"
            kind = "delegate" if "delegate" in reason.lower() else "model"
            raise NativeToolError(self.name, reason, kind)
        count, first, _curr, lo, hi, avg, std = stats[-1]  # the last block is the timed runs
        result = NativeResult(
            aggregates={
                "min": int(lo) / 1e3,
                "max": int(hi) / 1e3,
                "mean": float(avg) / 1e3,
                "std": int(std) / 1e3,
            },
            count=int(count),
            path=_path(output, opts),
        )
        init_us = number(r"Inference timings in us: Init: ([\d.]+)", output)
        first_us = number(r"First inference: ([\d.]+)", output)
        result.load_ms = (
            init_us / 1e3 if init_us is not None else number(r"Initialized session in ([\d.]+)\s*ms", output)
        )
        result.first_ms = first_us / 1e3 if first_us is not None else int(stats[0][1]) / 1e3
        result.peak_memory_mb = number(
            r"(?:Peak memory footprint|Memory footprint delta from the start of the tool)"
            r" \(MB\): init=[\d.]+ overall=([\d.]+)",
            output,
        )
        result.ops = _run_order(output)
        if re.search(r"will not be executed by the delegate", output):
            result.warnings.append("the delegate was applied but runs none of the graph: measured on the CPU")
        return result


def _path(output: str, opts: NativeOptions) -> str:
    if "XNNPACK delegate" in output:
        return "xnnpack"
    return opts.delegate or "cpu"


def _run_order(output: str) -> list[tuple[str, str, float]]:
    """Per-node times from the 'Run Order' table of the regular (not init) runs."""
    marker = output.rfind("Operator-wise Profiling Info for Regular Benchmark Runs")
    if marker < 0:
        return []
    section = output[marker:]
    start = section.find("Run Order")
    ops = []
    for line in section[start:].splitlines()[2:]:
        if not line.strip() or line.startswith("="):
            break
        cols = [c.strip() for c in line.strip().split("\t") if c.strip()]
        if len(cols) >= 8:
            try:
                ops.append((cols[-1], cols[0], float(cols[3])))
            except ValueError:
                continue
    return ops
