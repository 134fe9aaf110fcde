"""Task `doctor`: the harness against bare loops on this device, so every figure it reports has a reference.

- timer: the smallest step of the clock the agent times with (perf_counter_ns) and what one read costs;
- per runtime, on a small model: the harness's own timing path (session Step, input refresh, sampler:
  bench.measure) against a bare loop written straight on the runtime's API, alternated over rounds in this
  one process; and the noise floor, the CV of the bare loop's back-to-back runs;
- CPU governors and frequencies from cpufreq (under the task's sysfs root);
- the matmul probe's kernel against each runtime's plain GEMM call (numpy.matmul, InferenceSession.run on a
  MatMul graph, MNN's Interpreter session), and the bandwidth probe's copy (its worker threads and slices)
  against numpy's own copy of the same arrays.

Standard library plus numpy and the runtimes; a runtime that is missing is reported, not fatal.
"""

from __future__ import annotations

import glob
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from . import onnxwrite as ox
from .bench import measure as harness_measure
from .bench import pin
from .info import _read
from .inputs import make_inputs
from .main import TaskError
from .runtimes import SESSION_MODULES, import_runtime, open_session
from .session import RuntimeMissing
from .timing import TimingPolicy


# ---- timer ---------------------------------------------------------------------------------------
def timer_facts(reads: int = 20000) -> dict[str, float]:
    """Smallest non-zero step between back-to-back clock reads, and the mean cost of one read, in ns."""
    clock = time.perf_counter_ns
    steps = []
    start = clock()
    last = start
    for _ in range(reads):
        now = clock()
        if now != last:
            steps.append(now - last)
        last = now
    getres = time.clock_getres(time.CLOCK_MONOTONIC) * 1e9 if hasattr(time, "clock_getres") else None
    return {
        "resolution_ns": float(min(steps)) if steps else float("nan"),
        "read_ns": (last - start) / reads,
        "getres_ns": getres,
    }


# ---- bare loops (the runtime's own API, nothing of the harness) ---------------------------------------
def bare_onnxruntime(path: str, feeds: dict[str, Any], threads: int) -> Callable[[int], list[float]]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    def loop(runs: int) -> list[float]:
        out = []
        for _ in range(runs):
            t0 = time.perf_counter_ns()
            sess.run(None, feeds)
            out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    return loop


def bare_mnn(path: str, feeds: dict[str, Any], threads: int) -> Callable[[int], list[float]]:
    import MNN

    interp = MNN.Interpreter(path)
    sess = interp.createSession({"backend": "CPU", "numThread": threads})
    for name, array in feeds.items():
        tensor = interp.getSessionInput(sess, name)
        if list(tensor.getShape()) != list(array.shape):
            interp.resizeTensor(tensor, tuple(array.shape))
    interp.resizeSession(sess)
    pairs = [
        (
            interp.getSessionInput(sess, name),
            MNN.Tensor(tuple(a.shape), MNN.Halide_Type_Float, a, MNN.Tensor_DimensionType_Caffe),
        )
        for name, a in feeds.items()
    ]

    def loop(runs: int) -> list[float]:
        out = []
        for _ in range(runs):
            for tensor, host in pairs:  # MNN reuses its input buffer: the inputs go back in, untimed
                tensor.copyFrom(host)
            t0 = time.perf_counter_ns()
            interp.runSession(sess)
            out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    return loop


def bare_litert(path: str, feeds: dict[str, Any], threads: int) -> Callable[[int], list[float]]:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=path, num_threads=threads or None)
    details = {d["name"]: d for d in interp.get_input_details()}
    for name, array in feeds.items():
        if list(details[name]["shape"]) != list(array.shape):
            interp.resize_tensor_input(details[name]["index"], list(array.shape))
    interp.allocate_tensors()
    pairs = [(details[name]["index"], array) for name, array in feeds.items()]

    def loop(runs: int) -> list[float]:
        out = []
        for _ in range(runs):
            for index, array in pairs:  # the interpreter keeps its input buffer: refilled, untimed
                interp.set_tensor(index, array)
            t0 = time.perf_counter_ns()
            interp.invoke()
            out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    return loop


def bare_ncnn(path: str, feeds: dict[str, Any], threads: int) -> Callable[[int], list[float]]:
    """A loop as an ncnn user writes it: one Net (fp32: fp16/bf16 storage and arithmetic off, as the
    harness's session pins them), an extractor per inference, every output extracted."""
    import ncnn
    import numpy as np

    net = ncnn.Net()
    net.opt.num_threads = threads or ncnn.get_physical_big_cpu_count() or ncnn.get_cpu_count()
    for name in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage"):
        setattr(net.opt, name, False)
    net.load_param(path)
    net.load_model(os.path.splitext(path)[0] + ".bin")
    arrays = {name: np.ascontiguousarray(a, dtype=np.float32) for name, a in feeds.items()}  # kept alive
    mats = [(name, ncnn.Mat(a).clone()) for name, a in arrays.items()]  # owned: see NcnnStep
    outputs = list(net.output_names())

    def loop(runs: int) -> list[float]:
        out = []
        for _ in range(runs):
            t0 = time.perf_counter_ns()
            ex = net.create_extractor()
            for name, mat in mats:
                ex.input(name, mat)
            for name in outputs:
                ex.extract(name)
            out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    return loop


BARE = {"onnxruntime": bare_onnxruntime, "mnn": bare_mnn, "litert": bare_litert, "ncnn": bare_ncnn}


def cv(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if len(values) > 1 and mean else 0.0


def robust_cv(values: list[float]) -> float:
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return 1.4826 * mad / median if median else 0.0


def runtime_health(runtime: str, path: str, task: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """Harness vs bare p50 per round (alternated) and the bare loop's noise floor on one runtime."""
    threads, runs, rounds = int(task["threads"]), int(task["runs"]), int(task["rounds"])
    session = open_session(runtime, path, threads)
    feeds = make_inputs(session.inputs, task.get("shapes") or {}, 0, None, warnings)
    bare = BARE[runtime](path, feeds, threads)
    policy = TimingPolicy(warmup=1, warmup_seconds=float(task["warmup_seconds"]), runs=runs, min_seconds=0.0)
    bare(max(3, runs // 4))  # the bare side's warm-up (the harness warms itself up)
    harness_p50, bare_p50, noise, robust = [], [], [], []
    for _ in range(rounds):
        harness_p50.append(statistics.median(harness_measure(session, feeds, policy)["latencies_ms"]))
        samples = bare(runs)
        bare_p50.append(statistics.median(samples))
        noise.append(cv(samples))
        robust.append(robust_cv(samples))
    return {
        "version": session.version,
        "harness_p50_ms": harness_p50,
        "bare_p50_ms": bare_p50,
        "noise_cv": noise,
        "robust_cv": robust,
        "runs": runs,
        "threads": threads,
    }


# ---- CPU frequencies -----------------------------------------------------------------------------
FREQUENCY_FILES = (
    ("cur_mhz", "scaling_cur_freq"),
    ("min_mhz", "scaling_min_freq"),
    ("max_mhz", "cpuinfo_max_freq"),
)


def cpu_frequencies(sysfs_root: str = "/") -> list[dict[str, Any]]:
    """Per CPU with cpufreq: governor and current/min/max frequency in MHz (cpufreq counts kHz)."""
    base = os.path.join(sysfs_root, "sys/devices/system/cpu")
    found = []
    for folder in sorted(glob.glob(f"{base}/cpu[0-9]*/cpufreq"), key=_cpu_number):
        row: dict[str, Any] = {"cpu": _cpu_number(folder), "governor": _read(f"{folder}/scaling_governor")}
        for key, name in FREQUENCY_FILES:
            text = _read(f"{folder}/{name}")
            row[key] = int(text) / 1000.0 if text and text.isdigit() else None
        found.append(row)
    return found


def _cpu_number(folder: str) -> int:
    name = folder.rstrip("/").split("/")[-2]
    return int(name[3:]) if name[3:].isdigit() else -1


# ---- matmul and bandwidth probes against the plain calls ------------------------------------------------
def best_rate(step: Callable[[], Any], work: float, seconds: float = 0.25) -> float:
    """Best work per second over short trials for `seconds` (after one warm-up call)."""
    step()
    best = float("inf")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or best == float("inf"):
        t0 = time.perf_counter_ns()
        step()
        best = min(best, (time.perf_counter_ns() - t0) / 1e9)
    return work / best


def matmul_reach(n: int, threads: int, rounds: int, warnings: list[str]) -> list[dict[str, Any]]:
    """Per backend: the probe's fp32 kernel against that runtime's plain GEMM call, alternated."""
    from . import matmul as mm

    out = []
    flops = 2.0 * n**3
    for name in mm.BACKENDS:
        try:
            backend = mm.open_backend(name, None, warnings)
        except mm.Unsupported as exc:
            out.append({"backend": name, "error": str(exc)})
            continue
        try:
            op = backend.ops("fp32")[0]
            with backend.threads(threads):
                kernel = backend.build(op, "fp32", n, n, n, threads, 0)
                plain = plain_gemm(name, n, threads)
                probe, bare = [], []
                for _ in range(rounds):
                    probe.append(best_rate(kernel.step, flops))
                    bare.append(best_rate(plain, flops))
            out.append(
                {
                    "backend": name,
                    "op": op,
                    "n": n,
                    "threads": threads,
                    "probe_flops": max(probe),
                    "bare_flops": max(bare),
                }  # fmt: skip
            )
        except Exception as exc:  # noqa: BLE001 - one backend's failure is reported, not fatal
            out.append({"backend": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        finally:
            if hasattr(backend, "close"):
                backend.close()
    return out


def plain_gemm(backend: str, n: int, threads: int) -> Callable[[], Any]:
    """The runtime's plain fp32 GEMM call on fresh operands, the way a user would write it."""
    import numpy as np

    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    if backend == "numpy":
        return lambda: np.matmul(a, b)  # BLAS threads: set around the comparison by the backend
    model = ox.model_bytes(
        [ox.Node("MatMul", ["A", "B"], ["C"])],
        [ox.value_info("A", ox.FLOAT, [n, n])],
        [ox.value_info("C", ox.FLOAT, [n, n])],
        [ox.tensor_from_array("B", b)],
        {"": 17},
    )
    if backend == "onnxruntime":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        return lambda: sess.run(None, {"A": a})
    import MNN
    import MNN.expr as F

    x = F.placeholder([n, n], F.NCHW, F.float)
    x.name = "A"
    y = F.matmul(x, F.const(b, [n, n], F.NCHW, F.float))
    y.name = "C"
    folder = tempfile.mkdtemp(prefix="edgebench-doctor-")
    try:
        path = os.path.join(folder, "mm.mnn")
        F.save([y], path)
        interp = MNN.Interpreter(path)
        sess = interp.createSession({"backend": "CPU", "numThread": threads})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    tensor = interp.getSessionInput(sess)
    host = MNN.Tensor((n, n), MNN.Halide_Type_Float, a, MNN.Tensor_DimensionType_Caffe)

    def mnn_call() -> Any:
        tensor.copyFrom(host)
        return interp.runSession(sess)

    return mnn_call


def bandwidth_reach(array_bytes: int, rounds: int) -> dict[str, Any]:
    """The probe's copy (worker thread, slices, barriers) against numpy's own copy of the same arrays."""
    import numpy as np

    from . import bandwidth as bw

    elements = array_bytes // 8
    arrays = bw.Arrays(np, elements, 1, 4096)
    workers = bw.Workers(1, None)
    try:
        workers.run(arrays.init)
        moved = 16.0 * elements
        probe, bare = [], []
        for _ in range(rounds):
            probe.append(max(moved / workers.run(arrays.copy) for _ in range(3)))
            bare.append(max(best_rate(lambda: np.copyto(arrays.c, arrays.a), moved, 0.0) for _ in range(3)))
    finally:
        workers.close()
    return {"kernel": "copy", "bytes": int(moved), "probe_bps": max(probe), "bare_bps": max(bare)}


# ---- the task ------------------------------------------------------------------------------------
def run(task: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    warnings: list[str] = []
    for runtime in task.get("models") or {}:  # imported before the pin: see bench.import_then_pin
        try:
            import_runtime(runtime)
        except RuntimeMissing:
            pass  # reported per runtime below
    affinity = pin(task.get("affinity"))
    if int(task.get("rounds", 1)) < 1 or int(task.get("runs", 1)) < 2:
        raise TaskError("usage", "doctor needs at least 1 round of 2 runs")
    result: dict[str, Any] = {"affinity": affinity, "timer": timer_facts(), "runtimes": {}}
    for runtime, path in (task.get("models") or {}).items():
        if runtime not in SESSION_MODULES:
            result["runtimes"][runtime] = {"error": f"unknown runtime {runtime!r}"}
            continue
        try:
            result["runtimes"][runtime] = runtime_health(runtime, path, task, warnings)
        except TaskError as exc:
            result["runtimes"][runtime] = {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a missing or broken runtime is reported, not fatal
            result["runtimes"][runtime] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    sensors = task.get("sensors") or {}
    result["cpus"] = cpu_frequencies(str(sensors.get("sysfs_root") or "/"))
    rounds = int(task["rounds"])
    if int(task.get("matmul_n") or 0) > 0:
        result["matmul"] = matmul_reach(int(task["matmul_n"]), int(task["threads"]), rounds, warnings)
    if int(task.get("bandwidth_bytes") or 0) > 0:
        result["bandwidth"] = bandwidth_reach(int(task["bandwidth_bytes"]), rounds)
    return result, warnings
