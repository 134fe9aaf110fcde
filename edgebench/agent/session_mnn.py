"""The MNN session: its own input tensors, refreshed before every run (MNN reuses their memory), on the
backend asked for and the precision mode pinned, with where it really ran read back from MNN.

MNN takes any forward type in its config and, when the library has no such backend (the PyPI wheel has
only the CPU), prints "Can't Find type=3 backend, use 0 instead" through printf and runs on the CPU without
an error. That line and the session's own backend type (`getSessionInfo`, code BACKENDS) are what
`placement()` reports, never the backend asked for.
"""

from __future__ import annotations

import os
import platform
import re
import time
from typing import Any

from .placement import Placement, unknown, whole
from .session import (
    BackendError,
    InputInfo,
    ModelLoadError,
    RuntimeMissing,
    Step,
    _dist_version,
    _first_line,
    effective_threads,
    thread_count,
)
from .stderr import with_output
from .timing import alternate

# The backends this session opens, as edgebench names them -> pymnn's config spelling (its createSession
# backend map takes every name whether or not the library has the backend)
BACKENDS = {
    "cpu": "CPU",
    "opencl": "OPENCL",
    "vulkan": "VULKAN",
    "opengl": "OPENGL",
    "metal": "METAL",
    "cuda": "CUDA",
    "nn": "NN",  # CoreML on Apple platforms
}
# MNNForwardType -> the unit that ran. 13 is MNN_FORWARD_CPU_EXTENSION: the CPU backend on its extension
# kernels (x86 AVX2/AVX-512 always; on ARM the ARMv8.2 fp16 or the bf16 backend, made for precision Low
# or Low_BF16 where the CPU has them: CPURuntime::onCreate)
FORWARD_UNITS = {0: "cpu", 1: "metal", 2: "cuda", 3: "opencl", 5: "nn", 6: "opengl", 7: "vulkan", 13: "cpu"}
CPU_EXTENSION = 13
INFO_BACKENDS = 2  # Interpreter::SessionInfoCode BACKENDS: the session's main forward type (pymnn: an int)
GPU_TUNING_WIDE = 4  # numThread on a GPU backend is its tuning mode; MNN's default, as benchmark.out's
FALLBACK = re.compile(r"Can't Find type=(\d+) backend, use (\d+) instead")
# MNN's PrecisionMode as pymnn spells it; "normal" (no spelling of its own) leaves the default, Normal
MNN_PRECISIONS = ("normal", "high", "low", "Low_BF16")
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")


def mnn_precision(precision: str | None, backend: str) -> str:
    """MNN's PrecisionMode for the precision asked. None is MNN's default (Normal: fp32 on the CPU, fp16
    on GPU backends); fp32 is Normal on the CPU and High elsewhere (Normal is fp16 there); fp16 and low
    are Low; bf16 is Low_BF16, which only the CPU backend computes (MNN's GPU backends have no bf16
    kernels). MNN's own names pass through."""
    if precision is None:
        return "normal"
    if precision in MNN_PRECISIONS:
        return precision
    table = {"fp32": "normal" if backend == "cpu" else "high", "fp16": "low", "low": "low"}
    if precision == "bf16" and backend == "cpu":
        return "Low_BF16"
    if precision == "bf16":
        raise BackendError(f"MNN computes bf16 on its CPU backend only, not on {backend}")
    if precision not in table:
        raise BackendError(
            f"MNN takes precision fp32, fp16, bf16 or low (or its own {', '.join(MNN_PRECISIONS)}), "
            f"not '{precision}'"
        )
    return table[precision]


def computed_in(unit: str, forward: int | None, mode: str, machine: str) -> str:
    """The arithmetic the session ran in, from the unit that ran it and MNN's rules: on the CPU, Normal and
    High are fp32; Low is fp16 only on ARM's fp16 backend (type 13 there; type 0 is the plain fp32 CPU
    backend, and x86 has no fp16 kernels: its AVX2 backend is type 13 at every precision and computes
    fp32, bit-identical to Normal with the PyPI wheel); Low_BF16 is bf16 on ARM's bf16 backend (type 13)
    and unknown on x86 (13 is its AVX2 backend too). On a GPU backend High is fp32; the others are fp16
    where the device has it, which the session cannot see: unknown."""
    if mode == "high" or (mode == "normal" and unit == "cpu"):
        return "fp32"
    if unit != "cpu" or forward is None:
        return "unknown"
    x86 = machine.lower() in _X86
    if mode == "low":
        return "fp32" if x86 or forward != CPU_EXTENSION else "fp16"
    if x86:
        return "unknown"
    return "bf16" if forward == CPU_EXTENSION else "fp32"


def placement_of(
    requested: str,
    forward: int | None,
    said: str,
    precision: dict[str, Any],
    gpu_tuning: int | None = None,
    threads: int = 0,
) -> Placement:
    """Where the session ran, from what MNN printed while it was created (`said`) and the main forward type
    it reports (`forward`; None where pymnn gave none): its fallback line means the unit it names (the
    CPU), with the line as evidence, whatever else is reported; else the reported type; else unknown. A
    GPU backend that is the session's main one still runs each op it has no kernel for on MNN's CPU
    backup, which pymnn does not report (ops unknown). A fallback from a GPU backend runs the GPU mode
    (`gpu_tuning`) as its CPU thread count: said, with the `threads` asked (0: none) it did not run."""
    line = FALLBACK.search(said)
    reported = FORWARD_UNITS.get(forward, f"type {forward}") if forward is not None else None
    evidence = [f"'{line.group(0)}' printed by MNN at createSession"] if line else []
    if forward is not None:
        evidence.append(f"getSessionInfo BACKENDS = {forward} ({reported})")
    if line:
        fell_to = FORWARD_UNITS.get(int(line.group(2)), f"type {line.group(2)}")
        if gpu_tuning is not None:
            not_asked = f", not the {threads} asked" if threads and threads != gpu_tuning else ""
            evidence.append(f"the CPU ran {gpu_tuning} threads (the GPU mode taken as a count{not_asked})")
        return whole(requested, fell_to, "; ".join(evidence), precision)
    if reported is None and requested == "cpu":
        return whole("cpu", "cpu", "MNN's CPU backend (always built in; pymnn reported no type)", precision)
    if reported is None:
        return unknown(requested, "pymnn reported no backend type and MNN printed no fallback", precision)
    if reported == "cpu" or reported != requested:
        return whole(requested, reported, "; ".join(evidence), precision)
    told = f"{evidence[0]}, no fallback printed (GPU mode {gpu_tuning}); ops without a {reported} kernel run "
    told += "on MNN's CPU backup and are not reported"
    return Placement(requested, reported, evidence=told, precision=precision)


class MnnSession:
    """MNN Interpreter session (the path MNN's own benchmark tool measures), on one backend."""

    runtime = "mnn"

    def __init__(
        self, path: str, threads: int = 0, precision: str | None = None, backend: str = "cpu"
    ) -> None:
        try:
            import MNN
        except ImportError as exc:
            raise RuntimeMissing("MNN is not installed") from exc
        if backend not in BACKENDS:
            raise BackendError(f"MNN has no backend '{backend}' (it has: {', '.join(BACKENDS)})")
        mode = mnn_precision(precision, backend)
        self.mnn = MNN
        self.version = _dist_version("mnn")
        self.backend = backend
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            raise ModelLoadError(f"cannot read MNN model {path}")
        config: dict[str, Any] = {"backend": BACKENDS[backend], "precision": mode}
        gpu = backend != "cpu"
        if gpu:
            config["numThread"] = GPU_TUNING_WIDE  # the GPU's tuning mode, not threads
        elif threads:
            config["numThread"] = threads
        before = thread_count()
        try:
            self.interpreter = MNN.Interpreter(path)
            self.session, said = with_output(lambda: self.interpreter.createSession(config))
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"MNN could not load the model: {_first_line(exc)}") from None
        # MNN's default (numThread unset) is 4 threads whatever the CPU count, and a GPU backend's CPU
        # fallback runs its tuning mode's number of threads: count what it started.
        self.effective_threads = effective_threads(0 if gpu else threads, before, thread_count())
        if self.session is None:
            raise ModelLoadError("MNN could not create a session for the model")
        self._placement = self._where(said, mode, GPU_TUNING_WIDE if gpu else None, threads)
        tensors = self.interpreter.getSessionInputAll(self.session)
        if not tensors:
            raise ModelLoadError("MNN found no inputs: the file is not a valid MNN model")
        self.inputs = [InputInfo(name, list(t.getShape()), self._dtype(t)) for name, t in tensors.items()]
        self.output_names = list(self.interpreter.getSessionOutputAll(self.session))

    def _forward_type(self) -> int | None:
        """The session's main forward type, as MNN reports it (pymnn returns the first pipeline's; a
        session from one config has one); None where this pymnn has no such report (an older one gave
        every code as a float)."""
        try:
            found = self.interpreter.getSessionInfo(self.session, INFO_BACKENDS)
        except Exception:  # noqa: BLE001 - no report is "unknown", never an error
            return None
        return found if isinstance(found, int) and not isinstance(found, bool) else None

    def _where(self, said: str, mode: str, gpu_tuning: int | None, threads: int) -> Placement:
        """The placement from what MNN said at createSession and the backend type the session reports."""
        forward = self._forward_type()
        fell = FALLBACK.search(said)
        unit = FORWARD_UNITS.get(forward, "unknown") if forward is not None else "unknown"
        if fell or self.backend == "cpu":
            unit = "cpu"  # a fallback runs on the CPU; the CPU backend is always there
        precision = {"mode": computed_in(unit, forward, mode, platform.machine()), "mnn_precision": mode}
        return placement_of(self.backend, forward, said, precision, gpu_tuning, threads)

    def _dtype(self, tensor: Any) -> str:
        m, kind = self.mnn, tensor.getDataType()
        table = [
            (m.Halide_Type_Float, "float32"),
            (m.Halide_Type_Int, "int32"),
            (m.Halide_Type_Int64, "int64"),
            (m.Halide_Type_Uint8, "uint8"),
            (m.Halide_Type_Double, "float64"),
        ]
        return next((name for ref, name in table if kind == ref), "float32")

    def _halide(self, dtype: str) -> Any:
        m = self.mnn
        return {
            "float32": m.Halide_Type_Float,
            "int32": m.Halide_Type_Int,
            "int64": m.Halide_Type_Int64,
            "uint8": m.Halide_Type_Uint8,
            "float64": m.Halide_Type_Double,
        }[dtype]

    def _resize(self, feeds: dict[str, Any]) -> None:
        interp, sess = self.interpreter, self.session
        resized = False
        for name, array in feeds.items():
            tensor = interp.getSessionInput(sess, name)
            if list(tensor.getShape()) != list(array.shape):
                interp.resizeTensor(tensor, tuple(array.shape))
                resized = True
        if resized:
            interp.resizeSession(sess)

    def prepare(self, feeds: dict[str, Any]) -> MnnStep:
        """Resize to the inputs' shapes once; the step copies the inputs in before every run."""
        self._resize(feeds)
        m, interp, sess = self.mnn, self.interpreter, self.session
        pairs = []
        for name, array in feeds.items():
            # The host tensor is made once and kept (with its array) for every refresh.
            host = m.Tensor(
                tuple(array.shape), self._halide(str(array.dtype)), array, m.Tensor_DimensionType_Caffe
            )
            pairs.append((interp.getSessionInput(sess, name), host, array))
        step = MnnStep(self, pairs)
        step.refresh()
        return step

    def read_outputs(self) -> dict[str, Any]:
        import numpy as np

        m, result = self.mnn, {}
        for name in self.output_names:
            tensor = self.interpreter.getSessionOutput(self.session, name)
            shape = tuple(tensor.getShape())
            host = m.Tensor(
                shape, m.Halide_Type_Float, np.zeros(shape, np.float32), m.Tensor_DimensionType_Caffe
            )
            tensor.copyToHostTensor(host)
            # getNumpyData is a view the next run overwrites: keep a copy.
            result[name] = np.array(host.getNumpyData(), copy=True)
        return result

    def placement(self) -> Placement:
        """Where the model ran, read when the session was created (`placement_of`)."""
        return self._placement

    def outputs(self, feeds: dict[str, Any]) -> dict[str, Any]:
        step = self.prepare(feeds)
        step()
        return step.outputs()


class MnnStep(Step):
    """`runSession`; `refresh` copies every input into the session's input tensor again."""

    def __init__(self, owner: MnnSession, pairs: list[tuple[Any, Any, Any]]) -> None:
        self.owner = owner
        self.pairs = pairs
        self.run = owner.interpreter.runSession
        self.session = owner.session

    def __call__(self) -> Any:
        return self.run(self.session)

    def refresh(self) -> None:
        for tensor, host, _ in self.pairs:
            tensor.copyFrom(host)

    def outputs(self) -> dict[str, Any]:
        return self.owner.read_outputs()


# what agent.runtimes.open_session opens for this runtime


def profile(
    task: dict,
    session: Any,
    plain: Any,
    feeds: dict[str, Any],
    warmup: int,
    runs: int,
    min_seconds: float = 0.0,
) -> tuple[list[float], dict[str, Any]]:
    """Per-op wall times from MNN's begin/end callbacks, per run, with plain runs alternated.

    The time between one op's end callback and the next op's begin callback is pure instrumentation
    (no op runs there); its median is reported as the per-op overhead for the host to subtract.
    """
    import numpy as np

    interp, sess = session.interpreter, session.session
    clock = time.perf_counter_ns
    stamps: list[int] = []
    keys: list[tuple[str, str]] = []

    def begin(_tensors: Any, _info: Any) -> bool:
        stamps.append(clock())
        return True

    def end(_tensors: Any, info: Any) -> bool:
        stamps.append(clock())
        keys.append((info.getName(), info.getType()))
        return True

    counts: list[int] = []

    def instrumented() -> None:
        plain.refresh()  # the same session, so the same input tensors to put back
        before = len(keys)
        interp.runSessionWithCallBackInfo(sess, begin, end)
        counts.append(len(keys) - before)

    shapes = _mnn_op_tensors(interp, sess, plain)
    latencies = alternate(plain, instrumented, warmup, runs, min_seconds)
    if not keys:
        from .main import TaskError

        raise TaskError("model", "MNN ran no ops with callbacks (empty model?)")
    t = np.asarray(stamps, dtype=np.int64).reshape(-1, 2)
    skip = sum(counts[:warmup])
    t, keys, counts = t[skip:], keys[skip:], counts[warmup:]
    durations = ((t[:, 1] - t[:, 0]) / 1e6).tolist()
    index: dict[tuple[str, str], int] = {}
    per_run: list[list[float]] = []
    calls: list[int] = []
    gaps: list[float] = []
    offset = 0
    for count in counts:
        row: dict[int, float] = {}
        for j in range(offset, offset + count):
            k = index.setdefault(keys[j], len(index))
            row[k] = row.get(k, 0.0) + durations[j]
            if len(calls) < len(index):
                calls.append(0)
            calls[k] += 1
        if count > 1:
            run = t[offset : offset + count]
            gaps.extend(((run[1:, 0] - run[:-1, 1]) / 1e6).tolist())
        per_run.append([row.get(k, 0.0) for k in range(len(index))])
        offset += count
    width = len(index)
    ops = [
        {"node": n, "op_type": ty, "calls": calls[k] / len(counts), **shapes.get((n, ty), {})}
        for (n, ty), k in index.items()
    ]
    return latencies, {
        "ops": ops,
        "per_run_ms": [r + [0.0] * (width - len(r)) for r in per_run],
        "overhead_ms": float(np.median(gaps)) if gaps else 0.0,
        "runs": len(counts),
    }


def _mnn_op_tensors(interp: Any, sess: Any, plain: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Each op's input and output tensors (element type, dims) from one untimed run: reading shapes in
    the timed runs' callbacks would put that work inside the ops' times."""
    found: dict[tuple[str, str], dict[str, Any]] = {}

    def describe_all(tensors: Any) -> list[list[Any]]:
        out = []
        for t in tensors or []:
            try:
                out.append([_mnn_dtype(t), [int(d) for d in t.getShape()]])
            except Exception:  # noqa: BLE001 - a tensor MNN cannot describe keeps the op's others
                continue
        return out

    def begin(tensors: Any, info: Any) -> bool:
        op = found.setdefault((info.getName(), info.getType()), {})
        op["inputs"] = describe_all(tensors)
        op["mflops"] = float(info.getFlops())  # MNN's own count, in millions
        return True

    def end(tensors: Any, info: Any) -> bool:
        found.setdefault((info.getName(), info.getType()), {})["outputs"] = describe_all(tensors)
        return True

    plain.refresh()
    interp.runSessionWithCallBackInfo(sess, begin, end)
    return found


def _mnn_dtype(tensor: Any) -> str:
    """MNN's halide type as the element-type names onnxruntime's profile uses (float, int32 ...)."""
    import MNN

    code = tensor.getDataType()
    for name, dtype in (("Float", "float"), ("Int", "int32"), ("Int64", "int64"), ("Uint8", "uint8")):
        if code == getattr(MNN, f"Halide_Type_{name}", None):
            return dtype
    return "float"


# ---- task `sensitivity` -----------------------------------------------------------------------------


def installed_version() -> str | None:
    """The installed MNN's version (None: not installed)."""
    try:
        import MNN
    except ImportError:
        return None
    return getattr(MNN, "__version__", None) or _dist_version("mnn") or "unknown"


PYTHON_MODULE = "MNN"  # what importing the runtime means (its shared libraries load)
SESSION = MnnSession
PROFILE_KEY = "mnn"  # where the reply carries the profile
