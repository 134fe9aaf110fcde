"""One session interface over onnxruntime and MNN: declared inputs, a prepared step, outputs."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class ModelLoadError(Exception):
    """The runtime refused the model (corrupt file, unsupported op)."""


class RuntimeMissing(Exception):
    """The runtime is not installed on this device."""


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
            raise RuntimeMissing(f"onnxruntime is not installed for {os.sys.executable}") from exc
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
        try:
            self.session = ort.InferenceSession(path, opts, providers=providers or ["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
            raise ModelLoadError(_first_line(exc)) from None
        self.inputs = [
            InputInfo(i.name, list(i.shape), ORT_TYPES.get(i.type, "float32"))
            for i in self.session.get_inputs()
        ]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def prepare(self, feeds: dict[str, Any]) -> Callable[[], Any]:
        session, names = self.session, self.output_names
        return lambda: session.run(names, feeds)

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
        try:
            self.interpreter = MNN.Interpreter(path)
            config = {"backend": "CPU", "precision": precision}
            if threads:
                config["numThread"] = threads
            self.session = self.interpreter.createSession(config)
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(f"MNN could not load the model: {_first_line(exc)}") from None
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

    def _load_inputs(self, feeds: dict[str, Any]) -> None:
        m, interp, sess = self.mnn, self.interpreter, self.session
        resized = False
        for name, array in feeds.items():
            tensor = interp.getSessionInput(sess, name)
            if list(tensor.getShape()) != list(array.shape):
                interp.resizeTensor(tensor, tuple(array.shape))
                resized = True
        if resized:
            interp.resizeSession(sess)
        for name, array in feeds.items():
            tensor = interp.getSessionInput(sess, name)
            dtype = str(array.dtype)
            host = m.Tensor(tuple(array.shape), self._halide(dtype), array, m.Tensor_DimensionType_Caffe)
            tensor.copyFrom(host)

    def prepare(self, feeds: dict[str, Any]) -> Callable[[], Any]:
        self._load_inputs(feeds)
        interp, sess = self.interpreter, self.session
        return lambda: interp.runSession(sess)

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
        self.prepare(feeds)()
        return self.read_outputs()


def open_session(runtime: str, path: str, threads: int = 0, **options: Any) -> OrtSession | MnnSession:
    if runtime == "onnxruntime":
        return OrtSession(path, threads, **options)
    if runtime == "mnn":
        return MnnSession(path, threads, **options)
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
