"""The MNN session: its own input tensors, refreshed before every run (MNN reuses their memory)."""

from __future__ import annotations

import os
import time
from typing import Any

from .placement import Placement, whole
from .session import (
    InputInfo,
    ModelLoadError,
    RuntimeMissing,
    Step,
    _dist_version,
    _first_line,
    effective_threads,
    thread_count,
)
from .timing import alternate


class MnnSession:
    """MNN Interpreter session (the path MNN's own benchmark tool measures)."""

    runtime = "mnn"

    def __init__(self, path: str, threads: int = 0, precision: str = "normal") -> None:
        try:
            import MNN
        except ImportError as exc:
            raise RuntimeMissing("MNN is not installed") from exc
        self.mnn = MNN
        self.version = _dist_version("mnn")
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            raise ModelLoadError(f"cannot read MNN model {path}")
        before = thread_count()
        try:
            self.interpreter = MNN.Interpreter(path)
            config = {"backend": "CPU", "precision": precision}
            if threads:
                config["numThread"] = threads
            self.session = self.interpreter.createSession(config)
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"MNN could not load the model: {_first_line(exc)}") from None
        # MNN's default (numThread unset) is 4 threads whatever the CPU count: count what it started.
        self.effective_threads = effective_threads(threads, before, thread_count())
        if self.session is None:
            raise ModelLoadError("MNN could not create a session for the model")
        tensors = self.interpreter.getSessionInputAll(self.session)
        if not tensors:
            raise ModelLoadError("MNN found no inputs: the file is not a valid MNN model")
        self.inputs = [InputInfo(name, list(t.getShape()), self._dtype(t)) for name, t in tensors.items()]
        self.output_names = list(self.interpreter.getSessionOutputAll(self.session))

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
        """Where the model ran: this session opens the CPU alone."""
        return whole("cpu", "cpu", "MNN's CPU backend")

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
