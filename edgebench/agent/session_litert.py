"""The LiteRT session: the interpreter with explicit threads, inputs resized to the feeds' shapes."""

from __future__ import annotations

import os
from typing import Any

from .placement import Placement, whole
from .session import InputInfo, ModelLoadError, RuntimeMissing, Step, _dist_version, _first_line


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

    def placement(self) -> Placement:
        """Where the model ran: this session opens the CPU alone."""
        return whole("cpu", "cpu", "the CPU interpreter")

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


def installed_version() -> str | None:
    """The installed LiteRT's version, by its metadata (importing it loads its native libraries, too
    slow for a fingerprint; None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ai-edge-litert")
    except PackageNotFoundError:
        return None


PYTHON_MODULE = "ai_edge_litert.interpreter"  # what importing the runtime means (its shared libraries load)
SESSION = LiteRtSession  # what agent.runtimes.open_session opens for this runtime
