"""Native runners: lab-provided benchmark binaries (TFLite `benchmark_model`, `onnxruntime_perf_test`,
MNN `benchmark.out`, ncnn `benchncnn`) driven through the transport, for phones without Python.

Each adapter builds argv from edgebench's options and parses the tool's output into one NativeResult.
"""

from __future__ import annotations

from ..runtimes import names as runtime_names
from ..runtimes import runtime
from .base import NativeOptions, NativeResult, NativeToolError, RunnerAdapter
from .benchncnn import BenchNcnn
from .mnn_bench import MnnBenchmark
from .ort_perf import OrtPerfTest
from .tflite import TfliteBenchmarkModel

# descriptor [runners] key -> adapter
ADAPTERS: dict[str, type[RunnerAdapter]] = {
    "benchmark_model": TfliteBenchmarkModel,
    "onnxruntime_perf_test": OrtPerfTest,
    "mnn_benchmark": MnnBenchmark,
    "benchncnn": BenchNcnn,  # the plain build, or the per-layer one (NCNN_BENCHMARK): parsed alike
}

# runtime -> the runner that measures it (each runtime's `native_tool`)
RUNNER_FOR_RUNTIME = {
    **{name: tool for name in runtime_names() if (tool := runtime(name).native_tool) is not None},
    "tflite": runtime("litert").native_tool,  # LiteRT's former name, still accepted
}

__all__ = [
    "ADAPTERS",
    "RUNNER_FOR_RUNTIME",
    "NativeOptions",
    "NativeResult",
    "NativeToolError",
    "RunnerAdapter",
]
