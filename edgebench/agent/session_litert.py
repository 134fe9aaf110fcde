"""The LiteRT session: the interpreter with explicit threads, inputs resized to the feeds' shapes (backend
"cpu"), or a CompiledModel on LiteRT's GPU accelerator with the CPU for the ops it lacks (backend "gpu").

LiteRT's GPU accelerator (ai-edge-litert 2.x) is WebGPU (Dawn) over the machine's Vulkan driver. It says
where the ops went only in its log on the process's stderr (the ops it does not support, and how many ops
run on each side), which is caught at the descriptor while the model compiles (`with_stderr`) and read back
into a placement (`gpu_placement`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, NamedTuple

from .placement import OpUnit, Placement, from_ops, unknown, whole
from .session import (
    BackendError,
    InputInfo,
    ModelLoadError,
    RuntimeMissing,
    Step,
    _dist_version,
    _first_line,
)
from .stderr import with_stderr

BACKENDS = ("cpu", "gpu")  # the interpreter (XNNPACK), and the GPU accelerator with the CPU beside it
# What the GPU computes in unless enforce_f32 is set (LiteRT allows precision loss by default): the default's
# outputs are the "fp16" outputs and differ from fp32's by fp16's resolution (seen with ai-edge-litert
# 2.3.0, WebGPU on Mesa 25.0.7 lavapipe). LiteRT's Python API has no option forcing fp16 beyond this.
GPU_DEFAULT_PRECISION = "fp16"
PRECISIONS = ("fp32", "fp16")


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

    `LiteRtSession(path, threads, backend="gpu")` opens a `LiteRtGpuSession` (its own class: another API of
    LiteRT's, the CompiledModel), so every caller opens LiteRT one way.
    """

    runtime = "litert"

    def __new__(
        cls, path: str, threads: int = 0, backend: str = "cpu", precision: str | None = None
    ) -> LiteRtSession:
        if cls is LiteRtSession and backend == "gpu":
            return super().__new__(LiteRtGpuSession)
        return super().__new__(cls)

    def __init__(
        self, path: str, threads: int = 0, backend: str = "cpu", precision: str | None = None
    ) -> None:
        if backend not in BACKENDS:
            raise BackendError(f"LiteRT has no backend '{backend}' (it has: {', '.join(BACKENDS)})")
        if precision not in (None, "fp32"):
            raise BackendError(
                f"LiteRT's CPU interpreter computes in fp32, not '{precision}' (fp16 is a gpu option)"
            )
        try:
            import ai_edge_litert
            from ai_edge_litert.interpreter import Interpreter
        except ImportError as exc:
            raise RuntimeMissing(f"ai-edge-litert is not installed for {sys.executable}") from exc
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


# ---- backend "gpu": LiteRT's CompiledModel on its GPU accelerator, the CPU beside it ------------------


class GraphOp(NamedTuple):
    """One op of the model in execution order: its name (its first output tensor's, as TFLite tools name
    a node) and its type ("FULLY_CONNECTED")."""

    name: str
    type: str


class Graph(NamedTuple):
    """What the .tflite declares, read without running it: its ops, inputs, outputs and signatures (each
    signature's names -> tensor names)."""

    ops: list[GraphOp]
    inputs: list[InputInfo]
    outputs: list[str]
    signatures: dict[str, dict[str, dict[str, str]]]


def read_graph(path: str) -> Graph:
    """The model's ops (subgraph 0, execution order), inputs and outputs, from an interpreter with no
    delegate applied and no tensor allocated (so the op list is the file's, not XNNPACK's partitions)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    try:
        interp = Interpreter(
            model_path=path, experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        )
    except Exception as exc:  # noqa: BLE001 - LiteRT raises ValueError/RuntimeError with its reason
        raise ModelLoadError(f"LiteRT could not load the model: {_first_line(exc)}") from None
    names = {d["index"]: d["name"] for d in interp.get_tensor_details()}
    ops = [GraphOp(_op_name(op, names), op["op_name"]) for op in interp._get_ops_details()]
    details = interp.get_input_details()
    inputs = [InputInfo(d["name"], _litert_shape(d), _litert_dtype(d["dtype"])) for d in details]
    signatures = {
        key: {side: {name: names.get(index, name) for name, index in sig[side].items()} for side in sig}
        for key, sig in interp._get_full_signature_list().items()
    }
    return Graph(ops, inputs, [d["name"] for d in interp.get_output_details()], signatures)


def _op_name(op: dict[str, Any], tensors: dict[int, str]) -> str:
    """An op's name: its first output tensor's (a TFLite op has none of its own), else "#index"."""
    outputs = list(op["outputs"])
    return tensors.get(int(outputs[0]), f"#{op['index']}") if outputs else f"#{op['index']}"


# The lines of LiteRT's log that say where ops went (ai-edge-litert 2.3.0's WebGPU accelerator)
_UNSUPPORTED = "Following operations are not supported by GPU delegate:"
_SPLIT = re.compile(
    r"(\d+) operations will run on the GPU, and the remaining (\d+) operations will run on the CPU"
)
_NONE = re.compile(r"No operations will run on the GPU, and all (\d+) operations will run on the CPU")
_ADAPTER = re.compile(r"Selected adapter: (.+?), arch=.*?adapterType=([^,]+)")
_APPLIED = "Initializing WebGPU-based API from graph"
_NOT_LOADED = "GPU accelerator could not be loaded and registered"
_FAILED = re.compile(r"Failed to initialize WebGPU environment: (.+)")
_LOG_PREFIX = re.compile(r"^(INFO|WARNING|ERROR|VERBOSE|DEBUG): |^[IWEF]\d{4} ")


@dataclass(frozen=True)
class DelegationLog:
    """What LiteRT's log said while a model compiled for its GPU accelerator."""

    adapter: str | None = None  # the WebGPU adapter ("llvmpipe (LLVM 15.0.6, 256 bits)")
    adapter_type: str | None = None  # "CPU / Software", "Discrete GPU"...
    applied: bool = False  # the WebGPU delegate initialised a graph
    not_loaded: bool = False  # LiteRT found no GPU accelerator library
    unsupported: tuple[tuple[str, str], ...] = ()  # (op type, why) for each type the GPU refused
    gpu_ops: int | None = None  # the split it announced; None where it announced none
    cpu_ops: int | None = None
    failure: str | None = None  # why the WebGPU environment could not be made
    refusals: tuple[str, ...] = ()  # what Dawn said of each adapter it refused


def parse_delegation(log: str) -> DelegationLog:
    """The delegation facts in LiteRT's stderr from one model's compile (see DelegationLog)."""
    lines = log.splitlines()
    found: dict[str, Any] = {}
    unsupported: list[tuple[str, str]] = []
    refusals: list[str] = []
    in_block = False
    for i, line in enumerate(lines):
        text = line.strip()
        if _UNSUPPORTED in text:
            in_block = True
            continue
        split, none = _SPLIT.search(text), _NONE.search(text)
        if split or none:
            in_block = False
            found["gpu_ops"] = int(split.group(1)) if split else 0
            found["cpu_ops"] = int(split.group(2)) if split else int(none.group(1))  # type: ignore[union-attr]
        elif in_block and not _LOG_PREFIX.match(text) and ": " in text:
            kind, why = text.split(": ", 1)
            unsupported.append((kind.strip(), why.strip()))
        if (adapter := _ADAPTER.search(text)) is not None:
            found["adapter"], found["adapter_type"] = adapter.group(1), adapter.group(2).strip()
        if (failed := _FAILED.search(text)) is not None:
            found.setdefault("failure", failed.group(1).strip())  # the first: later lines restate it
        if _refusal(text, "".join(lines[i + 1 : i + 2])):
            refusals.append(text.removeprefix("Warning: "))
        found["applied"] = found.get("applied", False) or _APPLIED in text
        found["not_loaded"] = found.get("not_loaded", False) or _NOT_LOADED in text
    return DelegationLog(unsupported=tuple(unsupported), refusals=tuple(refusals), **found)


def _refusal(text: str, after: str) -> bool:
    """Whether a log line is Dawn's reason for refusing an adapter ("Vulkan shaderUniform*ArrayDynamic
    Indexing required." before " - While initializing adapter"), or the Vulkan loader's for having none
    ("vkCreateInstance: Found no drivers!")."""
    if not text.startswith("Warning: "):
        return False
    return "While initializing adapter" in after or text.startswith("Warning: vkCreateInstance: Found no")


def gpu_run(types: list[str], unsupported: set[str], gpu_ops: int) -> range | None:
    """The ops (indices, execution order) LiteRT's GPU delegate took, where the log's count pins them.

    The delegate takes one partition of the ops it supports, the largest (TFLite's graph partition helper
    with max_delegated_partitions 1): here the longest run of consecutive ops whose type the log did not
    name as unsupported. Only where that run is the one run of its length and holds exactly the ops the log
    counted on the GPU; else None (a tie, a type refused for one op and taken for another, a branching
    graph partitioned otherwise: which ops ran where is not known)."""
    if gpu_ops == 0:
        return range(0)
    runs, start = [], None
    for i, kind in enumerate([*types, None]):
        if kind is not None and kind not in unsupported:
            start = i if start is None else start
        elif start is not None:
            runs.append(range(start, i))
            start = None
    longest = max((len(r) for r in runs), default=0)
    best = [r for r in runs if len(r) == longest]
    return best[0] if len(best) == 1 and longest == gpu_ops else None


def gpu_placement(
    ops: list[GraphOp], log: DelegationLog, fully: bool, precision: dict[str, Any]
) -> Placement:
    """Where each op ran on backend "gpu", from `is_fully_accelerated()` and the compile's log, never from
    what was asked: the whole model on "gpu" only with both saying so; a split the log announced named op
    by op where `gpu_run` pins it, else "gpu+cpu" with the ops unknown; the whole model on "cpu" where no
    GPU delegate was applied."""
    where = f" on {log.adapter} ({log.adapter_type})" if log.adapter else ""
    if log.gpu_ops is None:
        if fully and log.applied:
            said = f"is_fully_accelerated() and the WebGPU delegate's log{where}"
            return whole("gpu", "gpu", said, precision, len(ops))
        if not fully and not log.applied:
            why = "LiteRT found no GPU accelerator" if log.not_loaded else "LiteRT applied no GPU delegate"
            return whole("gpu", "cpu", f"{why}: every op ran on the CPU", precision, len(ops))
        said = "shows" if log.applied else "does not show"
        return unknown(
            "gpu", f"is_fully_accelerated() is {fully}; the log {said} the WebGPU delegate", precision
        )
    refused = "; ".join(f"{kind} ({why})" for kind, why in log.unsupported) or "none named"
    said = f"LiteRT's delegation log{where}: {log.gpu_ops} ops on the GPU, {log.cpu_ops} on the CPU"
    said += f", unsupported: {refused}"
    if fully:
        return unknown("gpu", f"is_fully_accelerated() contradicts {said}", precision)
    pinned = None
    if log.gpu_ops + (log.cpu_ops or 0) == len(ops):
        pinned = gpu_run([op.type for op in ops], {kind for kind, _ in log.unsupported}, log.gpu_ops)
    if pinned is None:
        evidence = f"{said}; which of the model's {len(ops)} ops ran on each is unknown"
        return Placement("gpu", "gpu+cpu", evidence=evidence, precision=dict(precision))
    units = [OpUnit(op.name, op.type, "gpu" if i in pinned else "cpu") for i, op in enumerate(ops)]
    taken = f"ops {pinned.start}-{pinned.stop - 1}, its one partition" if pinned else "no op"
    return from_ops("gpu", units, f"{said}; the GPU took {taken}", precision)


def gpu_failure(log: DelegationLog, exc: BaseException) -> str:
    """Why LiteRT's GPU accelerator could not compile the model, in one line: what its log said (no
    adapter, and what Dawn refused each adapter for), else the exception's innermost line."""
    said = log.failure or _innermost_line(exc)
    refused = f" (Dawn: {'; '.join(dict.fromkeys(log.refusals))})" if log.refusals else ""
    return f"LiteRT's GPU backend (WebGPU over Vulkan) could not be opened: {said}{refused}"


def _innermost_line(exc: BaseException) -> str:
    """The last line of a LiteRT error, without its tree marks ("└ Some ops are not accelerated...")."""
    lines = [line.strip().lstrip("└").strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


class LiteRtGpuStep(Step):
    """`run_by_index`, then every output read back into numpy, both timed: `run_by_index` only queues the
    GPU's work (0.15 ms against 10.1 ms through the read for the built-in MLP on lavapipe), so the read is
    what waits for it. `refresh` writes the inputs into the input buffers again."""

    def __init__(self, owner: LiteRtGpuSession, arrays: list[Any]) -> None:
        compiled = owner.compiled
        self.arrays = arrays
        self.ins = compiled.create_input_buffers(0)
        self.outs = compiled.create_output_buffers(0)
        self.run = compiled.run_by_index
        self.reads = owner.output_layout()
        self.last: list[Any] = []

    def __call__(self) -> Any:
        self.run(0, self.ins, self.outs)
        self.last = [
            buf.read(count, dtype) for buf, (_, count, dtype, _) in zip(self.outs, self.reads, strict=True)
        ]
        return self.last

    def refresh(self) -> None:
        for buf, array in zip(self.ins, self.arrays, strict=True):
            buf.write(array)

    def outputs(self) -> dict[str, Any]:
        return {
            name: array.reshape(shape).copy()
            for array, (name, _, _, shape) in zip(self.last, self.reads, strict=True)
        }


class LiteRtGpuSession(LiteRtSession):
    """A CompiledModel on LiteRT's GPU accelerator with the CPU for the ops it lacks (GPU|CPU: the GPU
    alone refuses a model with one op it lacks), at LiteRT's default precision (fp16) unless fp32 is asked
    for (enforce_f32).

    A GPU accelerator that cannot be made (no Vulkan adapter Dawn takes) is a BackendError with LiteRT's
    reason; one LiteRT cannot find at all leaves the model on the CPU, recorded so (`placement()`)."""

    def __init__(
        self, path: str, threads: int = 0, backend: str = "gpu", precision: str | None = None
    ) -> None:
        if precision not in (None, *PRECISIONS):
            raise BackendError(f"LiteRT's gpu takes precision fp32 or fp16, not '{precision}'")
        try:
            import ai_edge_litert
        except ImportError as exc:
            raise RuntimeMissing(f"ai-edge-litert is not installed for {sys.executable}") from exc
        self.version = getattr(ai_edge_litert, "__version__", None) or _dist_version("ai-edge-litert")
        graph = read_graph(path)
        self.threads, self.backend, self.enforce_f32 = threads, "gpu", precision == "fp32"
        compiled, said = with_stderr(lambda: _compile(path, threads, self.enforce_f32))
        self.log = parse_delegation(said)
        if isinstance(compiled, BaseException):
            raise BackendError(gpu_failure(self.log, compiled))
        self.compiled, self.graph = compiled, graph
        self.fully_accelerated = bool(compiled.is_fully_accelerated())
        mode = "fp32" if self.enforce_f32 else GPU_DEFAULT_PRECISION
        precision_record = {"mode": mode, "enforce_f32": self.enforce_f32, "asked": precision}
        self._placement = gpu_placement(graph.ops, self.log, self.fully_accelerated, precision_record)
        signature = compiled.get_signature_by_index(0)
        self._key = signature["key"]
        names = graph.signatures.get(self._key, {})
        self._in_keys, self._out_keys = list(signature["inputs"]), list(signature["outputs"])
        in_names = [names.get("inputs", {}).get(k, k) for k in self._in_keys]
        declared = {info.name: info for info in graph.inputs}
        if any(name not in declared for name in in_names):
            raise ModelLoadError(f"{path}: the signature's inputs {in_names} are not the graph's inputs")
        self.inputs = [declared[name] for name in in_names]
        self.output_names = [names.get("outputs", {}).get(k, k) for k in self._out_keys]
        self._step: LiteRtGpuStep | None = None

    def execution(self) -> dict[str, Any]:
        """How LiteRT placed the graph on its GPU accelerator, and on which adapter."""
        return {
            "delegate": "webgpu",
            "adapter": self.log.adapter,
            "adapter_type": self.log.adapter_type,
            "fully_accelerated": self.fully_accelerated,
            "enforce_f32": self.enforce_f32,
            "graph_ops": len(self.graph.ops),
            "num_threads": self.threads or None,
        }

    def output_layout(self) -> list[tuple[str, int, Any, list[int]]]:
        """(name, elements, dtype, shape) of each output buffer, in the signature's order, as compiled now."""
        import numpy as np

        details = self.compiled.get_output_tensor_details(self._key)
        layout = []
        for key, name in zip(self._out_keys, self.output_names, strict=True):
            shape = [int(d) for d in details[key]["shape"]]
            layout.append((name, int(np.prod(shape)), np.dtype(details[key]["dtype"]), shape))
        return layout

    def _resize_inputs(self, arrays: list[Any]) -> None:
        details = self.compiled.get_input_tensor_details(self._key)
        for i, (key, array) in enumerate(zip(self._in_keys, arrays, strict=True)):
            if [int(d) for d in details[key]["shape"]] != list(array.shape):
                self.compiled.resize_input_tensor(i, list(array.shape))

    def prepare(self, feeds: dict[str, Any]) -> Step:
        import numpy as np

        arrays = [np.ascontiguousarray(feeds[info.name], dtype=info.dtype) for info in self.inputs]
        self._resize_inputs(arrays)
        step = LiteRtGpuStep(self, arrays)
        step.refresh()
        self._step = step
        return step

    def read_outputs(self) -> dict[str, Any]:
        """The outputs the last step read back (copies)."""
        return self._step.outputs() if self._step is not None else {}

    def placement(self) -> Placement:
        return self._placement


def _compile(path: str, threads: int, enforce_f32: bool) -> Any:
    """The CompiledModel on GPU|CPU, or the exception LiteRT raised (returned, so the log caught around
    this call is kept for the reason)."""
    try:
        from ai_edge_litert.compiled_model import (
            CompiledModel,
            CpuOptions,
            GpuOptions,
            HardwareAccelerator,
            Options,
        )
    except ImportError as exc:
        return exc
    options = Options(
        hardware_accelerators=HardwareAccelerator.GPU | HardwareAccelerator.CPU,
        cpu_options=CpuOptions(num_threads=threads) if threads > 0 else None,
        gpu_options=GpuOptions(enforce_f32=enforce_f32),
    )
    try:
        return CompiledModel.from_file(path, options=options)
    except Exception as exc:  # noqa: BLE001 - LiteRT raises RuntimeError; its reason is in its log
        return exc


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
