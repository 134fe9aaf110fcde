"""The probe registry: every probe kind as one typed object (its params, whether it needs a model, its
Python-agent and native-runner implementations, and which record params are annotations).

Light on purpose (standard library only): suites, the command line, the store's migrations and the probes
themselves all read it. Implementations are "module:function" in `edgebench.probes`, imported on use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..models.kv_cache import KV_CACHE_TYPES
from ..runtimes import names as runtime_names
from .params import IDENTITY as ID
from .params import POLICY as PO
from .params import ParamError, ProbeParams, param

RUNTIMES = runtime_names()  # edgebench.runtimes: one module each
DTYPES = ("fp32", "fp16", "int8")
MATMUL_DTYPES = (*DTYPES, "bf16")  # bf16 is measured when asked for
MATMUL_BACKENDS = ("numpy", "onnxruntime", "mnn")
ORT_OPS = ("MatMul", "MatMulInteger", "QLinearMatMul", "DynamicQuantizeMatMul", "MatMulInteger:u8u8")
BANDWIDTH_KERNELS = ("read", "copy", "triad")
TRIAD_PATHS = ("auto", "compiled", "blas", "numpy")
PRECISIONS = ("fp32", "fp16", "low")
BACKEND_PRECISIONS = ("fp32", "fp16", "bf16", "low")
MIN_BITS, MAX_BITS = 2, 8

# ---- fields many kinds share (one declaration, one name, one check) ----------------------------------
_THREADS = ("Intra-op threads (0 = the runtime's default).",)
_AFFINITY = "Pin the agent to these CPUs, e.g. 4-7 or 0,2, or to a CPU cluster by name: big, little."
_SHAPES = "Input shapes for dynamic dimensions: NAME=DIMS like input=1x3x224x224."
_INPUTS = ".npz with one array per model input (default: seeded random inputs)."
_SEED = "Seed of the random inputs."


def _threads() -> Any:
    return param(0, ID, "int", _THREADS[0], minimum=0)


def _affinity() -> Any:
    return param(None, ID, "cpus", _AFFINITY)


def _shapes() -> Any:
    return param(None, ID, "shapes", _SHAPES, flag="--shape")


def _inputs() -> Any:
    return param(None, ID, "path", _INPUTS)


def _seed() -> Any:
    return param(0, PO, "int", _SEED, minimum=0)


def _sweep_threads() -> Any:
    return param(
        None,
        ID,
        "ints",
        "Thread counts, e.g. 1-4, 1,2,4 or max (default: 1..all).",
        minimum=1,
        allow_max=True,
    )


# ---- params of each kind ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchParams(ProbeParams):
    KIND = "bench"
    threads: int = _threads()
    affinity: tuple[int, ...] | None = _affinity()
    shapes: dict[str, tuple[int, ...]] | None = _shapes()
    inputs: str | None = _inputs()
    seed: int = _seed()
    runs: int = param(400, PO, "int", "At least this many timed runs (368 bound a p99 at 95%).", minimum=1)
    warmup: int = param(1, PO, "int", "At least this many warm-up runs (and warmup_seconds).", minimum=0)
    warmup_seconds: float = param(0.5, PO, "float", "At least this long warming up.", unit="s", minimum=0)
    min_seconds: float = param(1.0, PO, "float", "Sample for at least this long.", unit="s", minimum=0)
    max_seconds: float = param(60.0, PO, "float", "Stop sampling after this long.", unit="s", positive=True)
    delegate: str | None = param(
        None,
        ID,
        "str",
        "Native runners: delegate or execution provider (nnapi, gpu, qnn, opencl...).",
        native_only=True,
    )
    backend: str = param(
        "cpu",
        ID,
        "str",
        "The runtime's backend, as it names it (cpu, vulkan, gpu, openvino...); where the model actually "
        "ran is recorded with every number.",
    )
    precision: str | None = param(
        None,
        ID,
        "choice",
        "The backend's arithmetic: fp32, fp16, bf16 (native runners: low) (default: the backend's own, "
        "recorded as it ran).",
        choices=BACKEND_PRECISIONS,
    )
    require_backend: bool = param(
        False,
        PO,
        "bool",
        "Fail when part of the model ran off the asked backend (or delegate), or where is unknown.",
    )
    invocations: int = param(
        1,
        PO,
        "int",
        "Native runners: repeat the tool N times for a distribution.",
        minimum=1,
        native_only=True,
    )
    repeats: int = param(
        1,
        PO,
        "int",
        "Measure in N independent invocations (fresh agent processes), interleaved across models; "
        "the gate judges on their statistics (use 3 or more).",
        minimum=1,
    )
    runner: str | None = param(
        None, ID, "str", "Native runners: which runner of the descriptor.", native_only=True, cli=False
    )
    profile: bool = param(
        False, PO, "bool", "Native runners: ask the tool for per-op times.", native_only=True, cli=False
    )
    value: tuple[str, ...] | None = param(
        None, ID, "strs", "Inputs given as one value, NAME=V (e.g. sr=16000), filled over their shape."
    )
    cold_load: bool = param(
        False, PO, "bool", "Also load with the model file evicted from the page cache (load_ms, cache=cold)."
    )
    stream: bool = param(False, ID, "bool", "Feed the model frame by frame, its state carried (--state).")
    state: tuple[str, ...] | None = param(
        None, ID, "strs", "Streaming: output OUT feeds input IN of the next frame, OUT=IN."
    )
    frame_seconds: float | None = param(
        None, ID, "float", "Streaming: audio or video time one frame holds.", unit="s", positive=True
    )
    frames: int | None = param(
        None, PO, "int", "Streaming: timed frames (default: runs and min_seconds).", minimum=1
    )

    def check(self) -> None:
        if self.max_seconds < self.min_seconds:
            raise ParamError(
                "max_seconds", f"{self.max_seconds:g} s is below min_seconds {self.min_seconds:g} s"
            )
        values(self.value)
        state_pairs(self.state)
        if not self.stream:
            for name in ("state", "frame_seconds", "frames"):
                if getattr(self, name) is not None:
                    raise ParamError(name, "applies to streaming (stream = true, --stream)")
        elif self.frame_seconds is None:
            raise ParamError("frame_seconds", "streaming needs the time one frame holds (--frame-seconds)")
        if self.stream and self.cold_load:
            raise ParamError("cold_load", "measure a cold load with a plain bench, not a stream")


def _pairs(key: str, items: tuple[str, ...] | None, what: str) -> list[tuple[str, str]]:
    out = []
    for text in items or ():
        left, sep, right = text.partition("=")
        if not sep or not left.strip() or not right.strip():
            raise ParamError(key, f"expected {what}, got {text!r}")
        out.append((left.strip(), right.strip()))
    return out


def state_pairs(items: tuple[str, ...] | None) -> dict[str, str]:
    """--state OUT=IN pairs as {output: input}; an input fed twice is refused."""
    pairs = _pairs("state", items, "OUT=IN like stateN=state")
    fed = [inp for _, inp in pairs]
    dup = next((i for i in fed if fed.count(i) > 1), None)
    if dup:
        raise ParamError("state", f"input '{dup}' is fed by two outputs")
    return dict(pairs)


def values(items: tuple[str, ...] | None) -> dict[str, float]:
    """--value NAME=V pairs as {input: number}."""
    out: dict[str, float] = {}
    for name, text in _pairs("value", items, "NAME=V like sr=16000"):
        try:
            number = float(text)
        except ValueError:
            raise ParamError("value", f"{name}={text}: {text!r} is not a number") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise ParamError("value", f"{name}={text}: must be finite")
        out[name] = int(number) if number.is_integer() else number
    return out


@dataclass(frozen=True)
class MatmulParams(ProbeParams):
    KIND = "matmul"
    dtype: tuple[str, ...] | None = param(
        None, ID, "choices", "fp32, fp16, int8, bf16 (default: fp32, fp16, int8).", choices=MATMUL_DTYPES
    )
    backend: tuple[str, ...] | None = param(
        None, ID, "choices", "numpy, onnxruntime, mnn (default: all present).", choices=MATMUL_BACKENDS
    )
    ops: tuple[str, ...] | None = param(
        None, ID, "choices", "onnxruntime ops to try (default: all for the dtype).", choices=ORT_OPS
    )
    threads: tuple[int, ...] | str | None = _sweep_threads()
    affinity: tuple[int, ...] | None = _affinity()
    sizes: tuple[int, ...] | None = param(
        None,
        ID,
        "ints",
        "Square sizes, e.g. 512,1024 (default: swept until the rate stops growing).",
        minimum=2,
    )
    skinny: tuple[tuple[int, int, int], ...] | bool | None = param(
        None,
        ID,
        "gemms",
        "Decode-style GEMMs MxNxK (default 1x1024x1024, 1x4096x4096, 1x11008x4096; false: none).",
    )
    square: bool = param(True, ID, "bool", "Measure square sizes (false: only the skinny shapes).")
    trials: int | None = param(None, PO, "int", "Timed trials per configuration (default 7).", minimum=1)
    start: int | None = param(None, PO, "int", "First size of the sweep (default 128).", minimum=2)
    min_top: int | None = param(None, PO, "int", "Sweep at least up to this size (default 2048).", minimum=2)
    max_size: int | None = param(None, PO, "int", "Never beyond this size (default 8192).", minimum=2)
    warmup_seconds: float | None = param(None, PO, "float", "Warm-up before each size.", unit="s", minimum=0)
    min_trial_seconds: float | None = param(
        None, PO, "float", "Shortest trial (calls are looped up to it).", unit="s", minimum=0
    )
    max_seconds: float = param(600.0, PO, "float", "Time budget of each agent call.", unit="s", minimum=1)
    seed: int = _seed()

    def check(self) -> None:
        if self.skinny is False and self.square is False:
            raise ParamError("square", "square = false needs skinny shapes (skinny is false)")


@dataclass(frozen=True)
class BandwidthParams(ProbeParams):
    KIND = "bandwidth"
    kernel: tuple[str, ...] | None = param(
        None, ID, "choices", "read, copy, triad (default: all).", choices=BANDWIDTH_KERNELS
    )
    threads: tuple[int, ...] | str | None = _sweep_threads()
    affinity: tuple[int, ...] | None = _affinity()
    array_mb: float | None = param(
        None, ID, "float", "Size of each array (default: 4x the last-level cache).", unit="MiB", positive=True
    )
    llc_mb: float | None = param(
        None,
        PO,
        "float",
        "Last-level cache size to size arrays by (default: sysfs or the descriptor).",
        unit="MiB",
        positive=True,
    )
    block_kb: float | None = param(None, PO, "float", "Block of the blocked kernels.", unit="KiB", minimum=1)
    triad_path: str = param(
        "auto",
        PO,
        "choice",
        "Triad as a loop compiled on the device, memmove + BLAS daxpy or numpy (auto: the first it has).",
        choices=TRIAD_PATHS,
    )
    trials: int = param(10, PO, "int", "Timed trials per kernel and thread count.", minimum=1)
    max_seconds: float = param(600.0, PO, "float", "Time budget of each agent call.", unit="s", minimum=1)
    sweep: bool = param(
        False, ID, "bool", "Sweep working-set sizes from the caches to DRAM: the memory hierarchy."
    )
    sweep_min_kb: float = param(32.0, PO, "float", "Sweep: smallest working set.", unit="KiB", minimum=4)
    sweep_max_mb: float | None = param(
        None,
        PO,
        "float",
        "Sweep: largest working set (default 512 MiB, or 4x a smaller last-level cache).",
        unit="MiB",
        positive=True,
    )
    sweep_steps: int = param(2, PO, "int", "Sweep: sizes per doubling.", minimum=1, maximum=8)

    def check(self) -> None:
        if self.sweep and (self.array_mb is not None or self.kernel is not None):
            raise ParamError(
                "sweep", "a sweep sizes its own working sets and kernels: drop array_mb / kernel"
            )


@dataclass(frozen=True)
class ThreadsParams(ProbeParams):
    KIND = "threads"
    threads: tuple[int, ...] | str | None = _sweep_threads()
    affinity: tuple[int, ...] | None = _affinity()
    clusters: tuple[str, ...] | None = param(None, ID, "strs", "Only these CPU clusters (little, big...).")
    per_cluster: bool = param(True, ID, "bool", "Also sweep each CPU cluster (descriptor, else sysfs).")
    shapes: dict[str, tuple[int, ...]] | None = _shapes()
    inputs: str | None = _inputs()
    seed: int = _seed()
    slower_margin: float = param(
        0.05, PO, "float", "More threads count as slower beyond this margin.", minimum=0
    )
    rounds: int = param(
        3, PO, "int", "Rounds of the sweep, thread counts interleaved (runs split among them).", minimum=1
    )
    alpha: float = param(
        0.01, PO, "float", "Significance level of the best thread count against the runner-up.", positive=True
    )
    runs: int = param(100, PO, "int", "At least this many timed runs per point.", minimum=1)
    warmup: int = param(1, PO, "int", "At least this many warm-up runs per point.", minimum=0)
    warmup_seconds: float = param(0.5, PO, "float", "At least this long warming up.", unit="s", minimum=0)
    min_seconds: float = param(
        1.0, PO, "float", "Sample each point for at least this long.", unit="s", minimum=0
    )
    max_seconds: float = param(
        60.0, PO, "float", "Stop sampling a point after this long.", unit="s", positive=True
    )


@dataclass(frozen=True)
class RooflineParams(ProbeParams):
    KIND = "roofline"
    shapes: dict[str, tuple[int, ...]] | None = _shapes()
    values: dict[str, Any] | None = param(
        None, ID, "mapping", "Values of inputs that set shapes (NAME = [..]).", cli=False
    )
    threads: int = _threads()
    affinity: tuple[int, ...] | None = _affinity()
    bench: bool = param(True, PO, "bool", "Bench the model for its efficiency against the floor.")
    measure: bool = param(
        True,
        PO,
        "bool",
        "Measure the ceilings when none are given (false: count only; floors come from the run's records).",
    )
    matmul: dict[str, Any] | None = param(
        None, PO, "table", "Params of the matmul ceiling run.", table=MatmulParams, cli=False
    )
    bandwidth: dict[str, Any] | None = param(
        None, PO, "table", "Params of the bandwidth ceiling run.", table=BandwidthParams, cli=False
    )
    ceilings: dict[str, Any] | None = param(
        None, PO, "mapping", "Ceilings found in the store.", cli=False, suite=False
    )
    measured: dict[str, Any] | None = param(
        None, PO, "mapping", "Latency found in the store.", cli=False, suite=False
    )


@dataclass(frozen=True)
class ThermalParams(ProbeParams):
    KIND = "thermal"
    threads: int = _threads()
    affinity: tuple[int, ...] | None = _affinity()
    shapes: dict[str, tuple[int, ...]] | None = _shapes()
    inputs: str | None = _inputs()
    seed: int = _seed()
    duration_s: float = param(1200.0, ID, "float", "Length of the sustained run.", unit="s", positive=True)
    rate_hz: float = param(0.0, ID, "float", "Inferences per second (0: back to back).", unit="Hz", minimum=0)
    window_s: float | None = param(
        None,
        ID,
        "float",
        "Window of the latency series (default: about 1/100 of the run, at most 10 s).",
        unit="s",
        positive=True,
    )
    margin: float = param(0.10, PO, "float", "Slowdown that counts as throttling.", minimum=0)
    hold_s: float | None = param(
        None, PO, "float", "Throttling must last this long.", unit="s", positive=True
    )
    period_s: float = param(0.25, PO, "float", "Sensor sampling period.", unit="s", positive=True)
    warmup: int = param(1, PO, "int", "At least this many warm-up runs.", minimum=0)
    warmup_seconds: float = param(0.5, PO, "float", "At least this long warming up.", unit="s", minimum=0)
    cooldown: bool = param(True, PO, "bool", "Wait for the device to cool down first.")
    cooldown_timeout_s: float = param(
        600.0, PO, "float", "Give up waiting for the cool-down after this long.", unit="s", minimum=0
    )
    cooldown_margin_c: float = param(2.0, PO, "float", "Cool means within this of idle.", unit="C", minimum=0)
    cooldown_period_s: float = param(1.0, PO, "float", "Cool-down sensor period.", unit="s", positive=True)
    cooldown_observe_s: float = param(
        10.0, PO, "float", "Watch the cooling curve at least this long.", unit="s", minimum=0
    )
    idle_c: float | None = param(
        None,
        PO,
        "float",
        "The device's idle temperature, if known (default: estimated while cooling).",
        unit="C",
    )
    runs: int | None = param(
        None,
        PO,
        "int",
        "Native runners: inferences per runner invocation (default: 10).",
        minimum=1,
        native_only=True,
    )
    delegate: str | None = param(
        None, ID, "str", "Native runners: delegate or execution provider.", native_only=True
    )
    precision: str | None = param(
        None, ID, "choice", "Native runners: fp32, fp16 or low.", choices=PRECISIONS, native_only=True
    )
    runner: str | None = param(
        None, ID, "str", "Native runners: which runner of the descriptor.", native_only=True, cli=False
    )
    runs: int | None = param(
        None,
        PO,
        "int",
        "Native runners: inferences per runner invocation (default: 10).",
        minimum=1,
        native_only=True,
    )
    delegate: str | None = param(
        None, ID, "str", "Native runners: delegate or execution provider.", native_only=True
    )
    precision: str | None = param(
        None, ID, "choice", "Native runners: fp32, fp16 or low.", choices=PRECISIONS, native_only=True
    )
    runner: str | None = param(
        None, ID, "str", "Native runners: which runner of the descriptor.", native_only=True, cli=False
    )

    def check(self) -> None:
        if self.window_s is not None and self.window_s > self.duration_s:
            raise ParamError(
                "window_s", f"{self.window_s:g} s is longer than duration_s {self.duration_s:g} s"
            )


@dataclass(frozen=True)
class PowerParams(ProbeParams):
    KIND = "power"
    threads: int = _threads()
    affinity: tuple[int, ...] | None = _affinity()
    shapes: dict[str, tuple[int, ...]] | None = _shapes()
    inputs: str | None = _inputs()
    seed: int = _seed()
    duration_s: float = param(60.0, PO, "float", "Length of the active phase.", unit="s", positive=True)
    rate_hz: float = param(0.0, ID, "float", "Inferences per second (0: back to back).", unit="Hz", minimum=0)
    idle_s: float = param(10.0, PO, "float", "Idle phase before the run.", unit="s", positive=True)
    idle_after_s: float | None = param(
        None, PO, "float", "Idle phase after the run (default: idle_s).", unit="s", minimum=0
    )
    period_s: float = param(0.25, PO, "float", "Sensor sampling period.", unit="s", positive=True)
    trim_s: float | None = param(
        None,
        PO,
        "float",
        "Phase edges left out (default: two sensor periods, at least 0.5 s).",
        unit="s",
        minimum=0,
    )
    warmup: int = param(1, PO, "int", "At least this many warm-up runs.", minimum=0)
    warmup_seconds: float = param(0.5, PO, "float", "At least this long warming up.", unit="s", minimum=0)
    runs: int | None = param(
        None,
        PO,
        "int",
        "Native runners: inferences per runner invocation (default: 100).",
        minimum=1,
        native_only=True,
    )
    delegate: str | None = param(
        None, ID, "str", "Native runners: delegate or execution provider.", native_only=True
    )
    precision: str | None = param(
        None, ID, "choice", "Native runners: fp32, fp16 or low.", choices=PRECISIONS, native_only=True
    )
    runner: str | None = param(
        None, ID, "str", "Native runners: which runner of the descriptor.", native_only=True, cli=False
    )


@dataclass(frozen=True)
class ProfileParams(ProbeParams):
    KIND = "profile"
    threads: int = _threads()
    affinity: tuple[int, ...] | None = _affinity()
    shapes: dict[str, tuple[int, ...]] | None = _shapes()
    inputs: str | None = _inputs()
    seed: int = _seed()
    runs: int = param(20, PO, "int", "Profiled runs.", minimum=1)
    warmup: int = param(3, PO, "int", "Warm-up runs before profiling.", minimum=0)
    min_seconds: float = param(
        1.0, PO, "float", "And more runs until they have lasted this long.", unit="s", minimum=0
    )
    speed_references: bool = param(
        True,
        PO,
        "bool",
        "Time the fixed speed-reference kernels before and after the model's rounds (off: ~0.25 s less "
        "per job, and no word on how steady the device ran).",
    )


@dataclass(frozen=True)
class AccuracyParams(ProbeParams):
    KIND = "accuracy"
    reference: str | None = param(
        None,
        ID,
        "path",
        "The fp32 reference model (a file, builtin:NAME or a suite model's name).",
        cli=False,
    )
    reference_runtime: str | None = param(
        None, ID, "choice", "Runtime of the reference (default: from its file).", choices=RUNTIMES
    )
    threads: int = _threads()
    shapes: dict[str, tuple[int, ...]] | None = _shapes()
    inputs: str | None = _inputs()
    seed: int = _seed()
    per_op: bool = param(False, ID, "bool", "Compare every intermediate tensor, name the first divergent op.")
    tolerance: float = param(
        1e-3, PO, "float", "Per-op: relative error over which an op diverges.", positive=True
    )
    backend: str = param(
        "cpu",
        ID,
        "str",
        "Run the model on this backend of its runtime and compare it with the same model on the CPU in "
        "fp32 (the reference, unless one is given).",
    )
    precision: str | None = param(
        None,
        ID,
        "choice",
        "The backend's arithmetic: fp32, fp16 or bf16 (default: the backend's own).",
        choices=BACKEND_PRECISIONS[:3],
    )


@dataclass(frozen=True)
class SensitivityParams(ProbeParams):
    KIND = "sensitivity"
    bits: int = param(
        8, ID, "int", "Weight bit width of the fake quantization.", minimum=MIN_BITS, maximum=MAX_BITS
    )
    threads: int = _threads()
    shapes: dict[str, tuple[int, ...]] | None = _shapes()
    inputs: str | None = _inputs()
    seed: int = _seed()


@dataclass(frozen=True)
class SoakParams(ProbeParams):
    KIND = "soak"
    threads: int = _threads()
    affinity: tuple[int, ...] | None = _affinity()
    shapes: dict[str, tuple[int, ...]] | None = _shapes()
    inputs: str | None = _inputs()
    seed: int = _seed()
    value: tuple[str, ...] | None = param(None, ID, "strs", "Inputs given as one value, NAME=V.")
    minutes: float = param(
        60.0, ID, "float", "Length of the run (fractions allowed).", unit="min", positive=True
    )
    rate_hz: float = param(0.0, ID, "float", "Inferences per second (0: back to back).", unit="Hz", minimum=0)
    period_s: float | None = param(
        None,
        PO,
        "float",
        "Sampling window of RSS and latency (default: 1/60 of the run, 0.25 to 60 s).",
        unit="s",
        positive=True,
    )
    warmup: int = param(1, PO, "int", "At least this many warm-up runs.", minimum=0)
    confidence: float = param(
        0.95, PO, "float", "Confidence of the growth interval.", minimum=0.5, maximum=0.999
    )
    leak_floor_mb: float = param(
        1.0, PO, "float", "Growth over the run below this is not called a leak.", unit="MB", minimum=0
    )

    def check(self) -> None:
        values(self.value)
        if self.period_s is not None and self.period_s * 3 > self.minutes * 60:
            raise ParamError(
                "period_s", f"{self.period_s:g} s leaves fewer than 3 samples in {self.minutes:g} min"
            )


@dataclass(frozen=True)
class ContentionParams(ProbeParams):
    KIND = "contention"
    threads: tuple[int, ...] | str | None = _sweep_threads()
    affinity: tuple[int, ...] | None = _affinity()
    shapes: dict[str, tuple[int, ...]] | None = _shapes()
    inputs: str | None = _inputs()
    seed: int = _seed()
    value: tuple[str, ...] | None = param(None, ID, "strs", "Inputs given as one value, NAME=V.")
    corunner_threads: tuple[int, ...] | None = param(
        None, ID, "ints", "Busy co-runner threads beside the model, e.g. 1,2 (default: 1).", minimum=1
    )
    runs: int = param(100, PO, "int", "At least this many timed runs per phase.", minimum=1)
    warmup: int = param(1, PO, "int", "At least this many warm-up runs.", minimum=0)
    warmup_seconds: float = param(0.5, PO, "float", "At least this long warming up.", unit="s", minimum=0)
    min_seconds: float = param(
        1.0, PO, "float", "Time each phase for at least this long.", unit="s", minimum=0
    )
    max_seconds: float = param(60.0, PO, "float", "Stop a phase after this long.", unit="s", positive=True)

    def check(self) -> None:
        values(self.value)


@dataclass(frozen=True)
class DecodeParams(ProbeParams):
    KIND = "decode"
    prompt_tokens: int = param(128, ID, "int", "Prompt tokens of the prefill.", unit="tokens", minimum=1)
    new_tokens: int = param(64, ID, "int", "Greedy decode steps after the prefill.", unit="tokens", minimum=1)
    threads: int = _threads()
    affinity: tuple[int, ...] | None = _affinity()
    seed: int = param(0, PO, "int", "Seed of the random prompt.", minimum=0)
    rounds: int = param(3, PO, "int", "At least this many timed rounds (prefill and decode).", minimum=1)
    warmup: int = param(
        1, PO, "int", "At least this many warm-up rounds (a prefill and two steps).", minimum=0
    )
    warmup_seconds: float = param(0.5, PO, "float", "At least this long warming up.", unit="s", minimum=0)
    min_seconds: float = param(0.0, PO, "float", "Time rounds for at least this long.", unit="s", minimum=0)
    max_seconds: float = param(
        600.0, PO, "float", "Start no new round after this long.", unit="s", positive=True
    )
    verify: bool = param(
        True, PO, "bool", "Run the whole sequence once without the cache and compare the tokens."
    )
    floor: bool = param(
        True,
        PO,
        "bool",
        "The bandwidth floor per token (DRAM bandwidth from the store, else measured first).",
    )
    bandwidth_mb: float | None = param(
        None,
        PO,
        "float",
        "Arrays of the DRAM bandwidth run when one is needed (default: 4x the last-level cache).",
        unit="MiB",
        positive=True,
    )
    bandwidth: dict[str, Any] | None = param(
        None, PO, "mapping", "DRAM bandwidth found in the store.", cli=False, suite=False
    )
    depths: tuple[int, ...] = param(
        (0,), ID, "ints", "llama.cpp: context depths to decode at, e.g. 0,512,2048.", minimum=0
    )
    repack: bool | None = param(
        None, ID, "bool", "llama.cpp: its CPU weight repacking on or off (default: the tool's, on)."
    )
    kv_type: str | None = param(
        None,
        ID,
        "choice",
        "llama.cpp: the KV cache type of K and V (-ctk/-ctv; default: the tool's, f16).",
        choices=tuple(KV_CACHE_TYPES),
    )


@dataclass(frozen=True)
class DoctorParams(ProbeParams):
    KIND = "doctor"
    threads: int = param(1, ID, "int", "Intra-op threads of every comparison.", minimum=1)
    affinity: tuple[int, ...] | None = _affinity()
    model: str = param("builtin:mlp", ID, "str", "The small model of the harness-vs-bare comparison.")
    rounds: int = param(5, PO, "int", "Rounds, harness and bare loop alternated in each.", minimum=1)
    runs: int = param(50, PO, "int", "Runs per side and round.", minimum=2)
    warmup_seconds: float = param(0.2, PO, "float", "Warm-up of the harness side.", unit="s", minimum=0)
    matmul_n: int = param(512, ID, "int", "Square GEMM size of the matmul check (0: none).", minimum=0)
    bandwidth_mb: float = param(
        64.0, ID, "float", "Array size of the bandwidth check (0: none).", unit="MiB", minimum=0
    )
    max_overhead: float = param(
        1.10, PO, "float", "Flag a harness slower than this ratio to the bare loop.", positive=True
    )
    max_noise_cv: float = param(
        0.05, PO, "float", "Flag back-to-back runs noisier than this CV.", positive=True
    )
    min_reach: float = param(
        0.90, PO, "float", "Flag a probe under this ratio to the plain runtime call.", positive=True
    )


# ---- the kinds ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeKind:
    """One probe kind: everything the harness knows about it before it runs."""

    name: str
    params: type[ProbeParams]
    needs_model: bool
    python: str  # "module:function" in edgebench.probes, for devices running the Python agent
    native: str | None = None  # the same for devices with agent = "native" (runner binaries)
    help: str = ""

    def implementation(self, agent: str = "python") -> Callable[..., Any]:
        target = self.native if agent == "native" else self.python
        if target is None:
            raise ParamError("kind", f"probe '{self.name}' has no implementation for {agent} devices")
        module, func = target.split(":")
        return getattr(importlib.import_module(f"{__package__}.{module}"), func)


KINDS: dict[str, ProbeKind] = {
    k.name: k
    for k in (
        ProbeKind(
            "bench",
            BenchParams,
            True,
            "bench:run_bench",
            "native:run_native_bench",
            "Model latency percentiles, load time, first inference, peak memory.",
        ),
        ProbeKind(
            "matmul",
            MatmulParams,
            False,
            "matmul:run_matmul",
            "native:run_native_matmul",
            "Effective TOPS of GEMM per dtype, backend, size and thread count.",
        ),
        ProbeKind(
            "bandwidth",
            BandwidthParams,
            False,
            "bandwidth:run_bandwidth",
            "native:run_native_bandwidth",
            "STREAM-style read, copy and triad memory bandwidth.",
        ),
        ProbeKind(
            "threads",
            ThreadsParams,
            True,
            "threads:run_threads",
            None,
            "A model's latency for every thread count, per CPU cluster, and the fastest.",
        ),
        ProbeKind(
            "roofline",
            RooflineParams,
            True,
            "roofline:run_roofline",
            None,
            "FLOPs, weight bytes, the latency floor and what bounds the model.",
        ),
        ProbeKind(
            "thermal",
            ThermalParams,
            True,
            "thermal:run_thermal",
            "native_sustained:run_native_thermal",
            "A sustained run: throttle onset, sustained ratio, stability.",
        ),
        ProbeKind(
            "power",
            PowerParams,
            True,
            "power:run_power",
            "native_sustained:run_native_power",
            "Power net of idle and energy per inference.",
        ),
        ProbeKind(
            "profile",
            ProfileParams,
            True,
            "profile:run_profile",
            "profile_native:run_native_profile",  # a runner's per-layer build, layers described on the host
            "Where a model's time goes, per op.",
        ),
        ProbeKind(
            "accuracy",
            AccuracyParams,
            True,
            "accuracy:run_accuracy",
            None,
            "A variant's outputs against its fp32 reference.",
        ),
        ProbeKind(
            "sensitivity",
            SensitivityParams,
            True,
            "sensitivity:run_sensitivity",
            None,
            "Per-layer quantization sensitivity.",
        ),
        ProbeKind(
            "soak",
            SoakParams,
            True,
            "soak:run_soak",
            None,
            "A long run: RSS growth per hour with its confidence interval, latency drift.",
        ),
        ProbeKind(
            "contention",
            ContentionParams,
            True,
            "contention:run_contention",
            None,
            "Latency beside a busy co-runner, and the co-runner's own slowdown.",
        ),
        ProbeKind(
            "decode",
            DecodeParams,
            True,
            "decode_llama:run_decode",
            "decode_llama:run_decode",  # on a device without Python: llama.cpp's llama-bench alone
            "LLM decode: prefill and decode tokens/s, KV cache, the bandwidth floor per token.",
        ),
        ProbeKind(
            "doctor",
            DoctorParams,
            False,
            "doctor:run_doctor",
            None,
            "Device health: the harness against bare loops, timer, noise floor, governors, probe reach.",
        ),
    )  # fmt: skip
}


def probe_kind(name: str) -> ProbeKind:
    if name not in KINDS:
        raise ParamError("kind", f"unknown probe '{name}' (known: {', '.join(sorted(KINDS))})")
    return KINDS[name]


def params_class(name: str) -> type[ProbeParams]:
    return probe_kind(name).params
