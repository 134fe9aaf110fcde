"""One session interface over onnxruntime, MNN and LiteRT: declared inputs, a prepared step, outputs.

`session.prepare(feeds)` returns a `Step`: `step()` runs one inference (the part timers time),
`step.refresh()` puts the given inputs back into the runtime's input buffers (called before every run,
outside the timed region), `step.outputs()` copies what the last run computed. MNN's session owns its input
tensors and reuses their memory for activations (`Session_Input_Inside`, its default), so an input copied in
once is gone after the first run: every later inference would compute on leftover activations.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

# The Python module each runtime is imported as (importing it loads its shared libraries).
RUNTIME_MODULES = {"onnxruntime": "onnxruntime", "mnn": "MNN", "litert": "ai_edge_litert.interpreter"}


class ModelLoadError(Exception):
    """The runtime refused the model (corrupt file, unsupported op)."""


class RuntimeMissing(Exception):
    """The runtime is not installed on this device."""


def import_runtime(runtime: str) -> float:
    """Import the runtime's module and return how long that took in ms (0 when it was already imported)."""
    module = RUNTIME_MODULES.get(runtime)
    if module is None:
        return 0.0
    start = time.perf_counter_ns()
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise RuntimeMissing(f"{runtime} is not installed for {sys.executable}") from exc
    return (time.perf_counter_ns() - start) / 1e6


def thread_count() -> int | None:
    """Threads of this process now (Linux /proc), to see how many a runtime started."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def effective_threads(asked: int, before: int | None, after: int | None) -> int | None:
    """The intra-op threads a session runs with: the threads it started plus the caller's own.

    Only needed when `asked` is 0 (the runtime's default); None when the platform cannot tell.
    """
    if asked > 0:
        return asked
    if before is None or after is None:
        return None
    return max(1, after - before + 1)


class Step:
    """One prepared inference on fixed inputs; see the module docstring for the contract."""

    def __call__(self) -> Any:
        raise NotImplementedError

    def refresh(self) -> None:
        """Make the runtime's input buffers hold the given inputs again (no-op where they cannot change)."""

    def outputs(self) -> dict[str, Any]:
        """Copies of the outputs of the last run, by output name."""
        raise NotImplementedError


@dataclass
class InputInfo:
    name: str
    shape: list  # ints, or str/None for dynamic dimensions
    dtype: str  # numpy dtype name


ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int16)": "int16",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(bool)": "bool",
}


class OrtSession:
    """onnxruntime CPU session with explicit intra-op threads and sequential execution."""

    runtime = "onnxruntime"

    def __init__(
        self,
        path: str,
        threads: int = 0,
        profile_prefix: str | None = None,
        providers: list[str] | None = None,
        optimization: str = "all",
    ) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise RuntimeMissing(f"onnxruntime is not installed for {sys.executable}") from exc
        self.version = ort.__version__
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = {
            "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[optimization]
        opts.log_severity_level = 3
        if profile_prefix:
            opts.enable_profiling = True
            opts.profile_file_prefix = profile_prefix
        before = thread_count()
        try:
            self.session = ort.InferenceSession(path, opts, providers=providers or ["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
            raise ModelLoadError(_first_line(exc)) from None
        self.effective_threads = effective_threads(threads, before, thread_count())
        self.inputs = [
            InputInfo(i.name, list(i.shape), ORT_TYPES.get(i.type, "float32"))
            for i in self.session.get_inputs()
        ]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def prepare(self, feeds: dict[str, Any]) -> OrtStep:
        return OrtStep(self.session, self.output_names, feeds)

    def outputs(self, feeds: dict[str, Any]) -> dict[str, Any]:
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds), strict=True))

    def end_profiling(self) -> str | None:
        return self.session.end_profiling()


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

    def outputs(self, feeds: dict[str, Any]) -> dict[str, Any]:
        step = self.prepare(feeds)
        step()
        return step.outputs()


class OrtStep(Step):
    """`InferenceSession.run` on fixed feeds; onnxruntime never writes into its inputs."""

    def __init__(self, session: Any, names: list[str], feeds: dict[str, Any]) -> None:
        self.session, self.names, self.feeds = session, names, feeds
        self.last: list[Any] = []

    def __call__(self) -> Any:
        self.last = self.session.run(self.names, self.feeds)
        return self.last

    def outputs(self) -> dict[str, Any]:
        import numpy as np

        return {n: np.array(v, copy=True) for n, v in zip(self.names, self.last, strict=True)}


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


class LiteRtStep(Step):
    """`invoke`; `refresh` copies every input into the interpreter's input tensor again (`set_tensor`)."""

    def __init__(self, owner: LiteRtSession, pairs: list[tuple[int, Any]]) -> None:
        self.owner, self.pairs = owner, pairs
        self.invoke = owner.interpreter.invoke

    def __call__(self) -> Any:
        return self.invoke()

    def refresh(self) -> None:
        for index, array in self.pairs:
            self.owner.interpreter.set_tensor(index, array)

    def outputs(self) -> dict[str, Any]:
        return self.owner.read_outputs()


class LiteRtSession:
    """LiteRT (TFLite) interpreter from the `ai-edge-litert` wheel, XNNPACK applied as LiteRT applies it.

    The interpreter's default op resolver applies the XNNPACK delegate to the nodes it supports; which ran
    where is read back from the graph (`execution`). The step's refresh copies the inputs in (`set_tensor`)
    before every run and the timed call invokes, so every timed run computes on the inputs given. The Python
    API has no op profiler.
    """

    runtime = "litert"

    def __init__(self, path: str, threads: int = 0) -> None:
        try:
            import ai_edge_litert
            from ai_edge_litert.interpreter import Interpreter
        except ImportError as exc:
            raise RuntimeMissing(f"ai-edge-litert is not installed for {os.sys.executable}") from exc
        self.version = getattr(ai_edge_litert, "__version__", None) or _dist_version("ai-edge-litert")
        try:
            self.interpreter = Interpreter(model_path=path, num_threads=threads or None)
            self.interpreter.allocate_tensors()
        except Exception as exc:  # noqa: BLE001 - LiteRT raises ValueError/RuntimeError with its reason
            raise ModelLoadError(f"LiteRT could not load the model: {_first_line(exc)}") from None
        self.threads = threads
        details = self.interpreter.get_input_details()
        self.inputs = [InputInfo(d["name"], _litert_shape(d), _litert_dtype(d["dtype"])) for d in details]
        self._index = {d["name"]: d["index"] for d in details}
        self._outputs = [(d["name"], d["index"]) for d in self.interpreter.get_output_details()]
        self.output_names = [name for name, _ in self._outputs]

    def execution(self) -> dict[str, Any]:
        """How LiteRT placed the graph: XNNPACK delegate partitions and whether they cover all of it."""
        interp = self.interpreter
        ops = interp._get_ops_details()
        delegated = [op for op in ops if op["op_name"] == "DELEGATE"]
        graph_in = {d["index"] for d in interp.get_input_details()}
        graph_out = {d["index"] for d in interp.get_output_details()}
        full = len(delegated) == 1 and graph_out <= set(delegated[0]["outputs"])
        full = full and graph_in <= set(delegated[0]["inputs"])
        return {
            "delegate": "xnnpack" if delegated else "none",
            "delegate_partitions": len(delegated),
            "delegated": "full" if full else ("partial" if delegated else "none"),
            "graph_ops": len(ops) - len(delegated),
            "num_threads": self.threads or None,
        }

    def _resize_for(self, feeds: dict[str, Any]) -> None:
        interp, resized = self.interpreter, False
        current = {d["name"]: list(d["shape"]) for d in interp.get_input_details()}
        for name, array in feeds.items():
            if current.get(name) != list(array.shape):
                interp.resize_tensor_input(self._index[name], list(array.shape), strict=True)
                resized = True
        if resized:
            interp.allocate_tensors()

    def prepare(self, feeds: dict[str, Any]) -> Step:
        self._resize_for(feeds)
        step = LiteRtStep(self, [(self._index[name], array) for name, array in feeds.items()])
        step.refresh()
        return step

    def read_outputs(self) -> dict[str, Any]:
        # get_tensor returns a copy: the next invoke does not change it.
        return {name: self.interpreter.get_tensor(index) for name, index in self._outputs}

    def outputs(self, feeds: dict[str, Any]) -> dict[str, Any]:
        step = self.prepare(feeds)
        step()
        return step.outputs()


def _litert_shape(detail: dict[str, Any]) -> list:
    signature = list(detail.get("shape_signature", detail["shape"]))
    return [int(d) if int(d) > 0 else None for d in signature]


def _litert_dtype(dtype: Any) -> str:
    import numpy as np

    return np.dtype(dtype).name


def open_session(
    runtime: str, path: str, threads: int = 0, **options: Any
) -> OrtSession | MnnSession | LiteRtSession:
    if runtime == "onnxruntime":
        return OrtSession(path, threads, **options)
    if runtime == "mnn":
        return MnnSession(path, threads, **options)
    if runtime == "litert":
        return LiteRtSession(path, threads, **options)
    raise ValueError(f"unknown runtime {runtime!r}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return "unknown"
