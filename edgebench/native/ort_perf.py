"""`onnxruntime_perf_test` (onnxruntime/test/perftest).

Output lines: "Session creation time cost: X s", "First inference time cost: X ms", "Total inference
requests: N", "Average inference time cost[ total]: X ms", "Peak working set size: N bytes" and, with -s,
"Min/Max/P50/P90/P95/P99/P999 Latency: X s". Errors are ONNX Runtime status messages.
"""

from __future__ import annotations

import re

from .base import NativeOptions, NativeResult, NativeToolError, first_error_line, number

_PERCENTILES = {
    "min": "Min",
    "max": "Max",
    "p50": "P50",
    "p90": "P90",
    "p95": "P95",
    "p99": "P99",
    "p999": "P999",
}
_ERRORS = ("[ONNXRuntimeError]", "failed:", "not supported", "Error", "error:")


class OrtPerfTest:
    name = "onnxruntime_perf_test"
    runtime = "onnxruntime"
    model_suffix = ".onnx"
    needs_model_dir = False

    def argv(self, binary: str, model: str, opts: NativeOptions) -> list[str]:
        # -I: generate inputs (free dimensions as 1); -s: print latency percentiles; -m times: fixed count.
        args = [binary, "-I", "-s", "-m", "times", "-r", str(opts.runs), "-e", opts.delegate or "cpu"]
        if opts.threads:
            args += ["-x", str(opts.threads)]
        if opts.profile:
            args += ["-p", model + ".profile"]
        args.append(model)
        return args

    def parse(self, output: str, returncode: int, opts: NativeOptions) -> NativeResult:
        count = number(r"Total inference requests:\s*(\d+)", output)
        avg = number(r"Average inference time cost(?: total)?:\s*([\d.e+-]+)\s*ms", output)
        if returncode != 0 or count is None or avg is None:
            reason = first_error_line(output, _ERRORS) or f"exited {returncode} without a result"
            kind = "delegate" if "provider" in reason.lower() else "model"
            raise NativeToolError(self.name, reason, kind)
        result = NativeResult(aggregates={"mean": avg}, count=int(count), path=opts.delegate or "cpu")
        for stat, label in _PERCENTILES.items():
            seconds = number(rf"^\s*{label} Latency(?::| is)\s*([\d.e+-]+)\s*s", output, re.MULTILINE)
            if seconds is not None:
                result.aggregates[stat] = seconds * 1e3
        create_s = number(r"Session creation time cost:\s*([\d.e+-]+)\s*s", output)
        result.load_ms = create_s * 1e3 if create_s is not None else None
        result.first_ms = number(r"First inference time cost:\s*([\d.e+-]+)\s*ms", output)
        peak = number(r"Peak working set size:\s*(\d+)\s*bytes", output)
        result.peak_memory_mb = peak / 2**20 if peak is not None else None
        return result
