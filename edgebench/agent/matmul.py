"""Task `matmul`: effective TOPS of GEMM through one backend (numpy BLAS, onnxruntime or MNN) on the device.

For each dtype and thread count, square sizes are swept (doubling) until the rate stops growing, and at
least up to `min_top`; then model-shaped skinny GEMMs (M = 1, decode-style) are measured. Every
configuration is built once, its output checked against float64 dot products of sampled entries (so a
runtime cannot skip the work and a wrong kernel is caught), warmed up, calibrated so one trial lasts at
least `min_trial_seconds` (small GEMMs repeat inside a trial), and timed for `trials` trials. The agent
returns the per-call time of every trial; the host turns them into TOPS (2·M·N·K operations per call) and
stats.

Operand conventions: C[M, N] = A[M, K] · B[K, N]; B is a constant (a weight) where the backend can treat it
so (onnxruntime initializer, MNN const), as in a model layer. int8 uses uint8 activations x int8 weights:
that is the operand pair x86 VNNI/AMX and ARM dot-product kernels take (uint8 x uint8 misses the VNNI path
and is only measured when asked for, as op "MatMulInteger:u8u8"). A and C live in 64-byte aligned buffers
(a cache line, an AVX-512 vector): numpy's 16-byte alignment cost onnxruntime's int8 kernels 11-16%.

Reduced precision is reported as it ran: fp16 / bf16 through a path with no such arithmetic is "emulated"
(onnxruntime: the Cast nodes it inserted; MNN: results that carry fp32 precision, which half-precision
arithmetic cannot give), and a backend without any kernel for the dtype says so instead of a figure. MNN
runs at the requested thread count through its own runtime manager (`load_module_from_file`'s thread_num
alone is ignored: MNN's default of 4 threads ran "1 thread" on 2 CPUs).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import onnxwrite as ox
from .main import TaskError
from .timing import OtherWork, process_cpu_ns

DTYPES = ("fp32", "fp16", "bf16", "int8")
DEFAULT_DTYPES = ("fp32", "fp16", "int8")
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
ALIGN = 64
BACKENDS = ("numpy", "onnxruntime", "mnn")
# onnxruntime int8 paths: integer GEMM, the quantized linear GEMM, and the dynamic-quantized MatMul
# (fp32 activations quantized on the fly, int8 weights) that quantize_dynamic produces and ORT fuses.
ORT_INT8_OPS = ("MatMulInteger", "QLinearMatMul", "DynamicQuantizeMatMul")
ORT_OPTIONAL_OPS = ("MatMulInteger:u8u8",)
DEFAULT_SKINNY = ((1, 1024, 1024), (1, 4096, 4096), (1, 11008, 4096))
VERIFY_SAMPLES = 16


@dataclass
class MatmulPolicy:
    """How hard to look: sizes, trials, and the time budget of this agent call."""

    trials: int = 7
    warmup_seconds: float = 0.2
    min_trial_seconds: float = 0.05
    start: int = 128
    min_top: int = 2048
    max_size: int = 8192
    growth: float = 1.05
    budget_s: float = 600.0


@dataclass
class Kernel:
    """One built GEMM: `step` computes C once; `result` returns the last C; `expected` checks entries."""

    op: str
    step: Callable[[], Any]
    result: Callable[[], Any]
    expected: Callable[[list[tuple[int, int]]], tuple[list[float], list[float]]]
    operands: str
    emulated: str | None = None
    close: Callable[[], None] = field(default=lambda: None)


class Unsupported(Exception):
    """The backend has no path for this dtype/op on this device (reported as skipped, not failed)."""


# ---- measurement policy ------------------------------------------------------------------------
def time_calls(step: Callable[[], Any], calls: int) -> tuple[float, float]:
    """Wall and process CPU seconds per call over `calls` back-to-back calls.

    The CPU time covers every thread of the process: against wall x threads it tells whether the runtime
    had the CPUs it asked for (runtimes spin their workers, so an undisturbed trial is close to 1).
    """
    c0, t0 = process_cpu_ns(), time.perf_counter_ns()
    for _ in range(calls):
        step()
    t1, c1 = time.perf_counter_ns(), process_cpu_ns()
    return (t1 - t0) / 1e9 / calls, (c1 - c0) / 1e9 / calls


def measure(step: Callable[[], Any], policy: MatmulPolicy) -> tuple[list[float], list[float], int, int]:
    """Warm up, calibrate calls per trial, time the trials: (per-call ms, per-call CPU ms, calls, warmups)."""
    start = time.perf_counter()
    estimate = time_calls(step, 1)[0]
    warm = 1
    while time.perf_counter() - start < policy.warmup_seconds:
        estimate = min(estimate, time_calls(step, 1)[0])
        warm += 1
    calls = max(1, math.ceil(policy.min_trial_seconds / max(estimate, 1e-9)))
    timed = [time_calls(step, calls) for _ in range(policy.trials)]
    return [w * 1e3 for w, _ in timed], [c * 1e3 for _, c in timed], calls, warm


def estimated_seconds(call_s: float, policy: MatmulPolicy) -> float:
    """What measuring one configuration costs when one call takes `call_s`."""
    return max(policy.warmup_seconds, 2 * call_s) + policy.trials * max(policy.min_trial_seconds, call_s)


def square_sweep(
    measure_size: Callable[[int], tuple[float, float]],
    policy: MatmulPolicy,
    time_left: Callable[[], float],
    fits: Callable[[int], bool],
) -> tuple[list[int], str | None]:
    """Double n from `start` while the rate grows by `growth`, at least to `min_top`, at most `max_size`.

    `measure_size(n)` measures one size and returns (rate, seconds per call). Returns the sizes measured
    and why the sweep stopped early (None when it ended normally).
    """
    done: list[int] = []
    best, n = 0.0, policy.start
    call_s = 0.0
    while n <= policy.max_size:
        if not fits(n):
            return done, f"n={n} does not fit in the device's available memory"
        # The next size costs about 8x the last one's call time (2·n³ operations).
        if done and estimated_seconds(call_s * 8, policy) > time_left():
            return done, f"time budget reached before n={n}"
        rate, call_s = measure_size(n)
        done.append(n)
        grew = rate > best * policy.growth
        best = max(best, rate)
        if n >= policy.min_top and not grew:
            break
        n *= 2
    return done, None


# ---- data and checks -----------------------------------------------------------------------------
def aligned_empty(np: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised array whose data starts on an ALIGN-byte boundary."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    offset = (-raw.ctypes.data) % ALIGN
    return raw[offset : offset + nbytes].view(dt).reshape(shape)


def aligned_copy(np: Any, array: Any) -> Any:
    out = aligned_empty(np, array.shape, array.dtype)
    out[...] = array
    return out


def sample_points(m: int, n: int, seed: int) -> list[tuple[int, int]]:
    import random

    rng = random.Random(seed)
    points = {(0, 0), (m - 1, n - 1)}
    while len(points) < min(VERIFY_SAMPLES, m * n):
        points.add((rng.randrange(m), rng.randrange(n)))
    return sorted(points)


def dot_reference(
    a: Any,
    b: Any,
    points: list[tuple[int, int]],
    a_off: float = 0.0,
    b_off: float = 0.0,
    b_scale: float = 1.0,
) -> tuple[list[float], list[float]]:
    """Exact float64 values of C[i, j] for the points, and the sum of |terms| that bounds rounding error."""
    import numpy as np

    values, magnitudes = [], []
    for i, j in points:
        x = a[i, :].astype(np.float64) - a_off
        y = (b[:, j].astype(np.float64) - b_off) * b_scale
        values.append(float(np.dot(x, y)))
        magnitudes.append(float(np.dot(np.abs(x), np.abs(y))))
    return values, magnitudes


def verify(kernel: Kernel, m: int, n: int, rel_tol: float, seed: int) -> tuple[bool, str, float, float]:
    """Compare sampled entries of the kernel's output with float64 references: (ok, detail, checksum, worst
    relative error)."""
    import numpy as np

    out = kernel.result()
    points = sample_points(m, n, seed)
    expected, magnitude = kernel.expected(points)
    worst = 0.0
    for (i, j), want, mag in zip(points, expected, magnitude, strict=True):
        got = float(out[i, j])
        err = abs(got - want) / max(mag, 1e-30)
        worst = max(worst, err)
    checksum = float(np.sum(out, dtype=np.float64))
    ok = worst <= rel_tol and math.isfinite(checksum)
    return (
        ok,
        f"max relative error {worst:.2e} over {len(points)} sampled entries (tolerance {rel_tol:g})",
        checksum,
        worst,
    )


TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 3e-2, "int8": 1e-9}
# fp32 arithmetic over these operands stays under this relative error; fp16 (11-bit significand) and bf16
# (8-bit) rounding of the operands alone puts them far above it.
FP32_PRECISION = 1e-5


def tolerance(dtype: str, op: str) -> float:
    if op == "QLinearMatMul":
        return 2e-2  # the output is requantized to uint8: compared after dequantizing, +-1 step
    if op == "DynamicQuantizeMatMul":
        return 2e-2  # activations quantized on the fly to 8 bits
    return TOLERANCE[dtype]


def make_operands(dtype: str, m: int, n: int, k: int, seed: int) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    if dtype == "int8":
        return (
            aligned_copy(np, rng.integers(0, 256, size=(m, k), dtype=np.uint8)),
            aligned_copy(np, rng.integers(-128, 128, size=(k, n), dtype=np.int8)),
        )
    a = rng.uniform(-1.0, 1.0, size=(m, k)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, size=(k, n)).astype(np.float32)
    if dtype == "fp16":
        return aligned_copy(np, a.astype(np.float16)), aligned_copy(np, b.astype(np.float16))
    return aligned_copy(np, a), aligned_copy(np, b)


def available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def fits(m: int, n: int, k: int, itemsize: int, copies: float = 6.0) -> bool:
    """A, B, C plus the runtime's copies (packed weights, serialized model) within half of free memory."""
    free = available_bytes()
    return free is None or copies * (m * k + k * n + m * n) * max(itemsize, 4) <= free / 2


# ---- numpy (BLAS) ----------------------------------------------------------------------------------
@contextlib.contextmanager
def blas_threads(threads: int, warnings: list[str]) -> Iterator[bool]:
    """Limit the BLAS numpy uses to `threads` (threadpoolctl when present, else the library's own setter)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None:
        with threadpool_limits(limits=threads, user_api="blas"):
            yield True
        return
    setter = _blas_setter()
    if setter is None:
        warnings.append(
            "cannot set the BLAS thread count (no threadpoolctl, no known setter): numpy ran with "
            "its default threads"
        )
        yield False
        return
    set_threads, get_threads = setter
    before = get_threads() if get_threads else None
    set_threads(threads)
    try:
        yield True
    finally:
        if before:
            set_threads(before)


def _blas_setter() -> tuple[Callable[[int], None], Callable[[], int] | None] | None:
    """OpenBLAS / MKL / BLIS thread setters found in the libraries this process has loaded."""
    import ctypes

    names = [
        ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
        ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
        ("openblas_set_num_threads", "openblas_get_num_threads"),
        ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
        ("MKL_Set_Num_Threads", "MKL_Get_Max_Threads"),
        ("bli_thread_set_num_threads", "bli_thread_get_num_threads"),
    ]
    for lib in _loaded_libraries():
        try:
            handle = ctypes.CDLL(lib)
        except OSError:
            continue
        for set_name, get_name in names:
            setter = getattr(handle, set_name, None)
            if setter is not None:
                getter = getattr(handle, get_name, None)
                return (lambda t, f=setter: f(ctypes.c_int(t))), (
                    lambda g=getter: int(g())
                ) if getter else None
    return None


def _loaded_libraries() -> list[str]:
    found: list[str] = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                base = os.path.basename(path).lower()
                if any(tag in base for tag in ("openblas", "mkl_rt", "blis")) and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def blas_name() -> str | None:
    try:
        from threadpoolctl import threadpool_info

        for pool in threadpool_info():
            if pool.get("user_api") == "blas":
                return f"{pool.get('internal_api')} {pool.get('version')} ({pool.get('architecture')})"
    except ImportError:
        pass
    libs = _loaded_libraries()
    return os.path.basename(libs[0]) if libs else None


class NumpyBackend:
    """numpy.matmul on the BLAS numpy links: the CPU's tuned fp32 path. fp16/int8 have no BLAS kernel."""

    name = "numpy"

    def __init__(self, warnings: list[str]) -> None:
        try:
            import numpy
        except ImportError as exc:
            raise Unsupported("numpy is not installed") from exc
        self.np = numpy
        self.version = numpy.__version__
        self.detail = blas_name()
        self.warnings = warnings

    def ops(self, dtype: str) -> tuple[str, ...]:
        if dtype != "fp32":
            raise Unsupported(
                "numpy has no BLAS kernel for this dtype (its generic loops are not a hardware path)"
            )
        return ("matmul",)

    @contextlib.contextmanager
    def threads(self, threads: int) -> Iterator[None]:
        with blas_threads(threads, self.warnings):
            yield

    def build(self, op: str, dtype: str, m: int, n: int, k: int, threads: int, seed: int) -> Kernel:
        np = self.np
        a, b = make_operands(dtype, m, n, k, seed)
        out = aligned_empty(np, (m, n), np.float32)
        return Kernel(
            op,
            lambda: np.matmul(a, b, out=out),
            lambda: out,
            lambda pts: dot_reference(a, b, pts),
            operands="f32f32",
        )


def qlinear_scale(k: int) -> float:
    """QLinearMatMul output scale: the accumulator's spread (about 74·74·sqrt(K)) lands on ~30 uint8 steps."""
    return 192.0 * math.sqrt(k)


def requantized(reference: tuple[list[float], list[float]], k: int) -> tuple[list[float], list[float]]:
    """Exact accumulators mapped through QLinearMatMul's requantization (zero point 128, clipped to uint8)."""
    scale = float(qlinear_scale(k))
    values, magnitudes = reference
    return [(min(255.0, max(0.0, round(v / scale) + 128.0)) - 128.0) * scale for v in values], magnitudes


# ---- onnxruntime -----------------------------------------------------------------------------------
class OrtBackend:
    """onnxruntime CPU provider on a one-node graph, B as an initializer (pre-packed like a model weight)."""

    name = "onnxruntime"

    def __init__(self, ops: list[str] | None, warnings: list[str]) -> None:
        try:
            import onnxruntime
        except ImportError as exc:
            raise Unsupported("onnxruntime is not installed") from exc
        import numpy

        self.ort = onnxruntime
        self.np = numpy
        self.version = onnxruntime.__version__
        self.detail = None
        self.wanted = ops
        self.warnings = warnings
        self._emulation: dict[tuple[str, str], str | None] = {}

    def ops(self, dtype: str) -> tuple[str, ...]:
        if dtype == "bf16":
            raise Unsupported(self._bf16_missing())
        available = ("MatMul",) if dtype in ("fp32", "fp16") else ORT_INT8_OPS + ORT_OPTIONAL_OPS
        default = ("MatMul",) if dtype in ("fp32", "fp16") else ORT_INT8_OPS
        chosen = tuple(o for o in available if o in self.wanted) if self.wanted else default
        if not chosen:
            raise Unsupported(f"none of the requested ops {self.wanted} applies to {dtype}")
        return chosen

    def _bf16_missing(self) -> str:
        """Why onnxruntime has no bf16 GEMM here: the provider's own refusal of a bf16 MatMul graph."""
        b = ox.Tensor("B", ox.BFLOAT16, (2, 2), bytes(8))
        model = ox.model_bytes(
            [ox.Node("MatMul", ["A", "B"], ["C"])],
            [ox.value_info("A", ox.BFLOAT16, [2, 2])],
            [ox.value_info("C", ox.BFLOAT16, [2, 2])],
            [b],
            {"": 17},
        )
        try:
            self._session(model, 1)
        except Unsupported as exc:
            return f"no bf16 kernel: {exc}"
        return "bf16 inputs cannot be fed from this agent (numpy has no bf16 dtype)"

    @contextlib.contextmanager
    def threads(self, threads: int) -> Iterator[None]:
        yield  # set per session

    def _session(self, model: bytes, threads: int, profile_dir: str | None = None) -> Any:
        ort = self.ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        if profile_dir:
            opts.enable_profiling = True
            opts.profile_file_prefix = os.path.join(profile_dir, "ort")
        try:
            return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise Unsupported(f"onnxruntime cannot run this graph: {first[:200]}") from None

    def graph(self, op: str, dtype: str, m: int, n: int, k: int, b: Any) -> tuple[bytes, str, Any]:
        """The model bytes, the operand description, and the numpy dtype of C."""
        np = self.np
        a_type = {"fp32": ox.FLOAT, "fp16": ox.FLOAT16, "int8": ox.UINT8}[dtype]
        scalars: list[ox.Tensor] = []
        domain = {"": 17}
        if op == "MatMul":
            node = ox.Node("MatMul", ["A", "B"], ["C"])
            c_type, c_dtype, operands = a_type, np.float16 if dtype == "fp16" else np.float32, f"{dtype}"
        elif op.startswith("MatMulInteger"):
            u8u8 = op.endswith("u8u8")
            if u8u8:
                b = (b.astype(np.int16) + 128).astype(np.uint8)
            scalars = [
                ox.tensor_from_array("a_zp", np.array(128, np.uint8)),
                ox.tensor_from_array("b_zp", np.array(128 if u8u8 else 0, b.dtype)),
            ]
            node = ox.Node("MatMulInteger", ["A", "B", "a_zp", "b_zp"], ["C"])
            c_type, c_dtype, operands = ox.INT32, np.int32, "u8u8" if u8u8 else "u8s8"
        elif op == "QLinearMatMul":
            y_scale = np.float32(qlinear_scale(k))
            scalars = [
                ox.tensor_from_array("a_s", np.array(1.0, np.float32)),
                ox.tensor_from_array("a_zp", np.array(128, np.uint8)),
                ox.tensor_from_array("b_s", np.array(1.0, np.float32)),
                ox.tensor_from_array("b_zp", np.array(0, np.int8)),
                ox.tensor_from_array("y_s", np.array(y_scale, np.float32)),
                ox.tensor_from_array("y_zp", np.array(128, np.uint8)),
            ]
            node = ox.Node("QLinearMatMul", ["A", "a_s", "a_zp", "B", "b_s", "b_zp", "y_s", "y_zp"], ["C"])
            c_type, c_dtype, operands = ox.UINT8, np.uint8, "u8s8"
        elif op == "DynamicQuantizeMatMul":
            a_type = ox.FLOAT
            scalars = [
                ox.tensor_from_array("b_s", np.array(1.0 / 128, np.float32)),
                ox.tensor_from_array("b_zp", np.array(0, np.int8)),
            ]
            node = ox.Node("DynamicQuantizeMatMul", ["A", "B", "b_s", "b_zp"], ["C"], domain="com.microsoft")
            domain["com.microsoft"] = 1
            c_type, c_dtype, operands = ox.FLOAT, np.float32, "f32(u8 dynamic)s8"
        else:
            raise Unsupported(f"unknown onnxruntime op {op!r}")
        model = ox.model_bytes(
            [node],
            [ox.value_info("A", a_type, [m, k])],
            [ox.value_info("C", c_type, [m, n])],
            [ox.tensor_from_array("B", b), *scalars],
            domain,
        )
        return model, operands, (c_dtype, b)

    def build(self, op: str, dtype: str, m: int, n: int, k: int, threads: int, seed: int) -> Kernel:
        np = self.np
        a, b = make_operands(dtype, m, n, k, seed)
        if op == "DynamicQuantizeMatMul":
            a = np.random.default_rng(seed).uniform(-1.0, 1.0, size=(m, k)).astype(np.float32)
        a = aligned_copy(np, a)
        model, operands, (c_dtype, b_used) = self.graph(op, dtype, m, n, k, b)
        session = self._session(model, threads)
        out = aligned_empty(np, (m, n), c_dtype)
        binding = session.io_binding()
        binding.bind_cpu_input("A", a)
        binding.bind_output("C", "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)
        emulated = self.emulation(op, dtype, model, a, threads)
        return Kernel(
            op,
            lambda: session.run_with_iobinding(binding),
            lambda: self._decoded(op, out, k),
            self._reference(op, a, b_used),
            operands=operands,
            emulated=emulated,
        )

    def _decoded(self, op: str, out: Any, k: int) -> Any:
        """QLinearMatMul's uint8 output mapped back to the accumulator scale, to compare with float64."""
        if op != "QLinearMatMul":
            return out
        return (out.astype(self.np.float64) - 128.0) * float(self.np.float32(qlinear_scale(k)))

    def _reference(self, op: str, a: Any, b: Any) -> Callable[[list[tuple[int, int]]], tuple[list, list]]:
        if op.startswith("MatMulInteger"):
            b_off = 128.0 if op.endswith("u8u8") else 0.0
            return lambda pts: dot_reference(a, b, pts, a_off=128.0, b_off=b_off)
        if op == "QLinearMatMul":
            return lambda pts: requantized(dot_reference(a, b, pts, a_off=128.0), a.shape[1])
        if op == "DynamicQuantizeMatMul":
            return lambda pts: dot_reference(a, b, pts, b_scale=1.0 / 128)
        return lambda pts: dot_reference(a, b, pts)

    def emulation(self, op: str, dtype: str, model: bytes, a: Any, threads: int) -> str | None:
        """Profile one run: Cast kernels in a graph that has none mean the dtype is emulated."""
        key = (op, dtype)
        if key not in self._emulation:
            self._emulation[key] = self._profile_for_casts(model, a, threads) if dtype == "fp16" else None
        return self._emulation[key]

    def _profile_for_casts(self, model: bytes, a: Any, threads: int) -> str | None:
        folder = tempfile.mkdtemp(prefix="edgebench-ortprof-")
        try:
            session = self._session(model, threads, profile_dir=folder)
            session.run(None, {"A": a})
            path = session.end_profiling()
            with open(path) as fh:
                events = json.load(fh)
        except (OSError, ValueError):
            return None
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        ran = {e.get("args", {}).get("op_name") for e in events if isinstance(e, dict)}
        if "Cast" in ran:
            return (
                "emulated: onnxruntime's CPU provider has no fp16 MatMul kernel here; it inserted Cast nodes "
                "and computes in fp32"
            )
        return None


# ---- MNN -----------------------------------------------------------------------------------------
MNN_PRECISION = {"fp32": "normal", "fp16": "low", "bf16": "Low_BF16"}  # pymnn's config spellings


class MnnBackend:
    """MNN.expr.matmul saved as a module and loaded on a runtime manager with the requested thread count."""

    name = "mnn"

    def __init__(self, warnings: list[str]) -> None:
        try:
            import MNN
            import MNN.expr
            import MNN.nn
        except ImportError as exc:
            raise Unsupported("MNN is not installed") from exc
        import numpy

        self.F, self.nn, self.np = MNN.expr, MNN.nn, numpy
        self.version = _dist_version("mnn")
        self.detail = None
        self.folder = tempfile.mkdtemp(prefix="edgebench-mnn-")
        self._runtimes: dict[tuple[int, str], Any] = {}

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def ops(self, dtype: str) -> tuple[str, ...]:
        if dtype == "int8":
            raise Unsupported("MNN.expr.matmul has no int8 kernel (MNN runs int8 through quantized models)")
        return ("expr.matmul",)

    @contextlib.contextmanager
    def threads(self, threads: int) -> Iterator[None]:
        yield  # set per runtime manager

    def runtime(self, threads: int, dtype: str) -> Any:
        """One runtime manager per thread count and precision (it owns the thread pool)."""
        key = (threads, dtype)
        if key not in self._runtimes:
            config = {"backend": "CPU", "numThread": threads, "precision": MNN_PRECISION[dtype]}
            self._runtimes[key] = self.nn.create_runtime_manager((config,))
        return self._runtimes[key]

    def build(self, op: str, dtype: str, m: int, n: int, k: int, threads: int, seed: int) -> Kernel:
        F, np = self.F, self.np
        a, b = make_operands("fp32", m, n, k, seed)
        x = F.placeholder([m, k], F.NCHW, F.float)
        x.name = "A"
        y = F.matmul(x, F.const(b, [k, n], F.NCHW, F.float))
        y.name = "C"
        path = os.path.join(self.folder, f"mm_{m}_{n}_{k}.mnn")
        F.save([y], path)
        module = self.nn.load_module_from_file(
            path, ["A"], ["C"], runtime_manager=self.runtime(threads, dtype)
        )
        os.remove(path)
        feed = F.const(a, [m, k], F.NCHW, F.float)
        holder: dict[str, Any] = {}

        def step() -> None:
            holder["c"] = module.forward(feed).read()  # read() waits for the result

        def result() -> Any:
            return np.array(holder["c"], copy=True)  # MNN reuses the buffer: copy before the next run

        return Kernel(
            op,
            step,
            result,
            lambda pts: dot_reference(a, b, pts),
            operands="f32f32" if dtype == "fp32" else f"f32({MNN_PRECISION[dtype]} precision)",
        )

    def precision_evidence(self, dtype: str, worst: float) -> str | None:
        """fp16/bf16 results as precise as fp32 were computed in fp32: the reduced precision is emulated."""
        if dtype in ("fp16", "bf16") and worst < FP32_PRECISION:
            return (
                f"emulated: MNN precision={MNN_PRECISION[dtype]} gave fp32-precise results (max relative "
                f"error {worst:.1e}): this CPU backend computed in fp32"
            )
        return None


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


def open_backend(name: str, ops: list[str] | None, warnings: list[str]) -> Any:
    if name == "numpy":
        return NumpyBackend(warnings)
    if name == "onnxruntime":
        return OrtBackend(ops, warnings)
    if name == "mnn":
        return MnnBackend(warnings)
    raise TaskError("usage", f"unknown matmul backend {name!r} (use {', '.join(BACKENDS)})")


# ---- the task ------------------------------------------------------------------------------------
class Run:
    """One agent call: measures configurations until the budget runs out."""

    def __init__(self, backend: Any, policy: MatmulPolicy, seed: int, warnings: list[str]) -> None:
        self.backend, self.policy, self.seed, self.warnings = backend, policy, seed, warnings
        self.deadline = time.monotonic() + policy.budget_s
        self.results: list[dict[str, Any]] = []
        self.cut_short: list[str] = []

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def one(
        self, op: str, dtype: str, m: int, n: int, k: int, threads: int, shape: str
    ) -> tuple[float, float]:
        """Build, verify, time one configuration; returns (operations per second, seconds per call)."""
        kernel = self.backend.build(op, dtype, m, n, k, threads, self.seed)
        try:
            kernel.step()
            ok, detail, _, worst = verify(kernel, m, n, tolerance(dtype, op), self.seed)
            if not ok:
                raise TaskError(
                    "measurement",
                    f"{self.backend.name} {op} {dtype} {m}x{n}x{k} gave wrong results: {detail}",
                )
            evidence = getattr(self.backend, "precision_evidence", None)
            if evidence and not kernel.emulated:
                kernel.emulated = evidence(dtype, worst)
            with OtherWork() as others:
                trials, cpu, calls, warm = measure(kernel.step, self.policy)
            _, _, checksum, _ = verify(kernel, m, n, tolerance(dtype, op), self.seed)
        finally:
            kernel.close()
        self.results.append(
            {
                "op": op,
                "dtype": dtype,
                "m": m,
                "n": n,
                "k": k,
                "threads": threads,
                "shape": shape,
                "operands": kernel.operands,
                "emulated": kernel.emulated,
                "calls_per_trial": calls,
                "warmup_calls": warm,
                "trial_ms": trials,
                "trial_cpu_ms": cpu,
                "others_cpus": others.others_cpus,
                "cpus_watched": len(others.cpus),
                "checksum": checksum,
                "verified": detail,
            }
        )
        best_s = min(trials) / 1e3
        return 2.0 * m * n * k / best_s, best_s

    def sweep(self, op: str, dtype: str, threads: int, sizes: list[int] | None) -> None:
        itemsize = ITEMSIZE[dtype]
        if sizes:
            for size in sizes:
                if self.time_left() <= 0:
                    self.cut_short.append(
                        f"{op} {dtype} threads={threads}: time budget reached before n={size}"
                    )
                    return
                if not fits(size, size, size, itemsize):
                    self.cut_short.append(f"{op} {dtype}: n={size} does not fit in available memory")
                    continue
                self.one(op, dtype, size, size, size, threads, "square")
            return
        _, why = square_sweep(
            lambda s: self.one(op, dtype, s, s, s, threads, "square"),
            self.policy,
            self.time_left,
            lambda s: fits(s, s, s, itemsize),
        )
        if why:
            self.cut_short.append(f"{op} {dtype} threads={threads}: {why}")

    def skinny(self, op: str, dtype: str, threads: int, shapes: list[tuple[int, int, int]]) -> None:
        itemsize = ITEMSIZE[dtype]
        for m, n, k in shapes:
            if self.time_left() <= 0:
                self.cut_short.append(
                    f"{op} {dtype} threads={threads}: time budget reached before {m}x{n}x{k}"
                )
                return
            if not fits(m, n, k, itemsize):
                self.cut_short.append(f"{op} {dtype}: {m}x{n}x{k} does not fit in available memory")
                continue
            self.one(op, dtype, m, n, k, threads, "skinny")


def policy_from(task: dict[str, Any]) -> MatmulPolicy:
    fields = (
        "trials",
        "warmup_seconds",
        "min_trial_seconds",
        "start",
        "min_top",
        "max_size",
        "growth",
        "budget_s",
    )
    kinds: dict[str, type] = {"trials": int, "start": int, "min_top": int, "max_size": int}
    values: dict[str, Any] = {f: kinds.get(f, float)(task[f]) for f in fields if task.get(f) is not None}
    return MatmulPolicy(**values)


def run(task: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    from .bench import pin

    warnings: list[str] = []
    policy = policy_from(task)
    if policy.trials < 1:
        raise TaskError("usage", "trials must be at least 1")
    name = task.get("backend", "numpy")
    try:
        # the runtime is imported (opening the backend) before the pin: see bench.import_then_pin
        backend = open_backend(name, task.get("ops"), warnings)
    except Unsupported as exc:
        return {"backend": name, "available": False, "reason": str(exc), "results": [], "skipped": []}, []
    affinity = pin(task.get("affinity"))
    dtypes = task.get("dtypes") or list(DEFAULT_DTYPES)
    threads_list = [int(t) for t in task.get("threads") or [len(affinity or []) or os.cpu_count() or 1]]
    given = task.get("skinny")
    skinny = [tuple(int(d) for d in s) for s in (DEFAULT_SKINNY if given is None else given)]
    sizes = [int(s) for s in task.get("sizes") or []] or None
    measured = Run(backend, policy, int(task.get("seed", 0)), warnings)
    skipped: list[dict[str, str]] = []
    try:
        for dtype in dtypes:
            if dtype not in DTYPES:
                raise TaskError("usage", f"unknown dtype {dtype!r} (use {', '.join(DTYPES)})")
            try:
                ops = backend.ops(dtype)
            except Unsupported as exc:
                skipped.append({"dtype": dtype, "reason": str(exc)})
                continue
            for op in ops:
                for threads in threads_list:
                    try:
                        with backend.threads(threads):
                            if not task.get("skip_square"):
                                measured.sweep(op, dtype, threads, sizes)
                            measured.skinny(op, dtype, threads, list(skinny))  # type: ignore[arg-type]
                    except Unsupported as exc:
                        skipped.append({"dtype": dtype, "op": op, "reason": str(exc)})
                        break
    finally:
        if hasattr(backend, "close"):
            backend.close()
    return {
        "backend": backend.name,
        "available": True,
        "version": backend.version,
        "detail": backend.detail,
        "affinity": affinity,
        "results": measured.results,
        "skipped": skipped,
        "cut_short": measured.cut_short,
        "policy": vars(policy),
    }, warnings
