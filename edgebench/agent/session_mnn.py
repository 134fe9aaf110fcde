"""The MNN session: its own input tensors, refreshed before every run (MNN reuses their memory)."""

from __future__ import annotations

import os
from typing import Any

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


SESSION = MnnSession  # what agent.runtimes.open_session opens for this runtime
