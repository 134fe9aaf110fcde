"""The onnxruntime session: explicit intra-op threads and sequential execution, on the CPU provider or on
another execution provider (EP) with the CPU provider after it, and where each node ran, read back.

A backend is named as a user types it (`openvino`, `cuda`, `qnn`...) and opens the EP onnxruntime
registers for it (BACKENDS). onnxruntime drops an EP it cannot create (not in this wheel, a device it
cannot open, an option it refuses) with a warning on stderr and runs on the CPU alone: the session refuses
both, naming what was asked and what there is, so a CPU number is never recorded as the accelerator's.

Where the nodes ran (non-CPU backends): the EP of each node as onnxruntime assigned it
(`get_provider_graph_assignment_info`, onnxruntime 1.24 on; the nodes of a fused EP subgraph such as
OpenVINO-EP-subgraph_1 each count as a node of that EP). Where they are on more than one EP, one run at
a twin session of the same model and options, profiled for one run on zeros, gives the order of the
kernels, so the partitions: made when the placement is first asked for (after the measurement), so the
measured session is never profiled and its load and first run are its own. An onnxruntime without the
assignment record gives that profiled run alone, where a fused EP subgraph is one op.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import tempfile
from dataclasses import replace
from typing import Any

from .placement import CPU, OpUnit, Placement, from_ops, partitions_of, unknown, whole
from .session import (
    BackendError,
    InputInfo,
    ModelLoadError,
    RuntimeMissing,
    Step,
    _first_line,
    effective_threads,
    thread_count,
)
from .stderr import with_stderr
from .timing import alternate

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

# Backend as a user names it -> (the EP onnxruntime registers for it, the EP options that make it that
# backend). OpenVINO's device is named, not left to the wheel's default, so "openvino" is its CPU plugin.
BACKENDS: dict[str, tuple[str, dict[str, str]]] = {
    "cpu": ("CPUExecutionProvider", {}),
    "openvino": ("OpenVINOExecutionProvider", {"device_type": "CPU"}),
    "openvino-gpu": ("OpenVINOExecutionProvider", {"device_type": "GPU"}),
    "openvino-npu": ("OpenVINOExecutionProvider", {"device_type": "NPU"}),
    "cuda": ("CUDAExecutionProvider", {}),
    "tensorrt": ("TensorrtExecutionProvider", {}),
    "rocm": ("ROCMExecutionProvider", {}),
    "migraphx": ("MIGraphXExecutionProvider", {}),
    "dml": ("DmlExecutionProvider", {}),
    "qnn": ("QNNExecutionProvider", {}),  # its default backend library: HTP (the NPU)
    "nnapi": ("NnapiExecutionProvider", {}),
    "coreml": ("CoreMLExecutionProvider", {}),
    "xnnpack": ("XnnpackExecutionProvider", {}),
    "webgpu": ("WebGpuExecutionProvider", {}),
    "dnnl": ("DnnlExecutionProvider", {}),
    "acl": ("ACLExecutionProvider", {}),
    "armnn": ("ArmNNExecutionProvider", {}),
    "vitisai": ("VitisAIExecutionProvider", {}),
    "cann": ("CANNExecutionProvider", {}),
}
# Where an EP that is not in this onnxruntime comes from, for the error that says so
WHEELS = {
    # its own venv: the wheel replaces the plain onnxruntime package
    "OpenVINOExecutionProvider": "onnxruntime-openvino (scripts/install-openvino-env.sh)",
    "CUDAExecutionProvider": "onnxruntime-gpu",
    "TensorrtExecutionProvider": "onnxruntime-gpu",
    "QNNExecutionProvider": "onnxruntime-qnn",
    "DmlExecutionProvider": "onnxruntime-directml",
}
# precision -> OpenVINO's INFERENCE_PRECISION_HINT, set through the EP's load_config: its `precision`
# option takes FP32 or ACCURACY alone on the CPU device (1.24.1); the hint takes f16 and bf16 there too
OPENVINO_HINTS = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}
# What OpenVINO computes in without a hint: the EP's default `precision` per device (FP32 on the CPU: its
# outputs matched the CPU provider's to 6e-7 on a 4-MatMul chain, where the bf16 hint moved them 7e-3)
OPENVINO_DEFAULTS = {"CPU": "fp32", "GPU": "fp16", "NPU": "fp16"}
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"


def provider_of(backend: str) -> str:
    """The EP that runs `backend`; a BackendError naming the backends there are for any other name."""
    if backend not in BACKENDS:
        raise BackendError(f"onnxruntime has no backend '{backend}' (it has: {', '.join(BACKENDS)})")
    return BACKENDS[backend][0]


def unit_of(provider: str, backend: str) -> str:
    """The unit a node on `provider` ran on, in backend names: the backend asked for where it is that
    backend's EP, the first backend naming the EP otherwise, the EP's own name where none does."""
    if BACKENDS.get(backend, ("", {}))[0] == provider:
        return backend
    return next((name for name, (ep, _) in BACKENDS.items() if ep == provider), provider)


def backend_options(
    backend: str, threads: int, precision: str | None
) -> tuple[dict[str, str], dict[str, Any]]:
    """The EP options that open `backend` with `threads` at `precision`, and the precision record
    (Placement.precision) saying what it computes in and what set it."""
    provider, fixed = BACKENDS[backend]
    options = dict(fixed)
    if provider != "OpenVINOExecutionProvider":
        if precision is not None:
            raise BackendError(
                f"onnxruntime backend '{backend}' takes no precision here (openvino does: "
                f"{', '.join(OPENVINO_HINTS)})"
            )
        return options, {"mode": "unknown", "set_by": f"{provider}'s own default, not read back"}
    device = options["device_type"]
    if threads > 0:
        options["num_of_threads"] = str(threads)  # OpenVINO's own pool: the intra-op threads are the CPU EP's
    if precision is None:
        mode = OPENVINO_DEFAULTS.get(device, "unknown")
        return options, {"mode": mode, "device_type": device, "set_by": "the OpenVINO EP's default"}
    if precision not in OPENVINO_HINTS:
        raise BackendError(f"openvino takes precision {', '.join(OPENVINO_HINTS)}, not '{precision}'")
    hint = OPENVINO_HINTS[precision]
    options["load_config"] = json.dumps({device: {"INFERENCE_PRECISION_HINT": hint}})
    record = {
        "mode": precision,
        "INFERENCE_PRECISION_HINT": hint,
        "device_type": device,
        "set_by": "load_config (OpenVINO computes in it where the device has the instructions)",
    }
    return options, record


def ort_errors(log: str) -> list[str]:
    """The error lines onnxruntime logged (its "[E:onnxruntime:..." lines), each without its time stamp,
    source location and colour codes: what an EP said when it could not be created."""
    found = []
    for line in log.splitlines():
        line = line.replace("\x1b[1;31m", "").replace("\x1b[m", "").strip()
        if "[E:onnxruntime" not in line:
            continue
        said = line.split("] ", 1)[1] if "] " in line else line
        said = said.split("[ERROR] ", 1)[1] if "[ERROR] " in said else said
        found.append(said.strip())
    return found


def assigned_ops(subgraphs: list[dict[str, Any]], backend: str) -> list[OpUnit]:
    """Each node's unit from onnxruntime's record of what it assigned to each EP: subgraphs as
    [{"ep": provider, "nodes": [[name, op_type], ...]}, ...] (`assignment_of`); a fused EP subgraph's
    nodes each count once. The order is onnxruntime's (by EP, then subgraph), not execution order."""
    return [
        OpUnit(name or "(unnamed)", op_type, unit_of(sub["ep"], backend))
        for sub in subgraphs
        for name, op_type in sub["nodes"]
    ]


def assignment_of(session: Any) -> list[dict[str, Any]] | None:
    """The session's EP assignment as plain data (`assigned_ops` reads it); None where this onnxruntime
    does not record it (before 1.24)."""
    read = getattr(session, "get_provider_graph_assignment_info", None)
    if read is None:
        return None
    return [
        {"ep": sub.ep_name, "nodes": [[node.name, node.op_type] for node in sub.get_nodes()]}
        for sub in read()
    ]


def profile_kernels(events: list[dict[str, Any]], backend: str) -> list[OpUnit]:
    """Each kernel of the first run in an onnxruntime profile (its "Node" events, in execution order) and
    the unit its "provider" says ran it; a fused EP subgraph is one kernel, named as onnxruntime names it
    ("OpenVINO-EP-subgraph_1")."""
    kernels: list[OpUnit] = []
    for event in events:
        args = event.get("args") or {}
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or "provider" not in args or not name.endswith("_kernel_time"):
            continue
        if kernels and event.get("name") == kernels[0].name + "_kernel_time":
            break  # the second run starts
        kernels.append(
            OpUnit(
                name[: -len("_kernel_time")],
                str(args.get("op_name", "?")),
                unit_of(args["provider"], backend),
            )
        )
    return kernels


def read_placement(
    backend: str,
    assigned: list[OpUnit] | None,
    kernels: list[OpUnit] | None,
    precision: dict[str, Any],
    note: str = "",
) -> Placement:
    """The placement from the assigned nodes (counts, fallen-back nodes) and a profiled run's kernels
    (their order: the partitions); either alone where the other is missing, "unknown" with neither."""
    if assigned:
        placed = from_ops(
            backend,
            assigned,
            "onnxruntime's record of the EP each node was assigned "
            "(nodes of a fused EP subgraph counted one by one)",
            precision,
        )
        if len(placed.ops_by_unit) == 1:
            return replace(placed, partitions=1)
        if kernels:
            return replace(
                placed,
                partitions=partitions_of([k.unit for k in kernels]),
                evidence=placed.evidence + "; partitions from the kernel order of one profiled run of a twin",
            )
        return replace(
            placed,
            partitions=None,
            evidence=placed.evidence + f"; partitions unknown ({note or 'no profiled run'})",
        )
    if kernels:
        return from_ops(
            backend,
            kernels,
            "the provider of each kernel of one profiled run of a twin session (a fused EP subgraph counts "
            "as one op)",
            precision,
        )
    return unknown(backend, note or "onnxruntime recorded no assignment and no profiled run", precision)


def placeholder_feeds(inputs: list[InputInfo]) -> dict[str, Any] | None:
    """Zeros at each input's declared shape (a dimension it leaves open: 1), for the twin's profiled run;
    None where an input's type has no array here."""
    import numpy as np

    if any(i.dtype not in ORT_TYPES.values() for i in inputs):
        return None
    return {
        i.name: np.zeros([d if isinstance(d, int) and d > 0 else 1 for d in i.shape], dtype=i.dtype)
        for i in inputs
    }


class OrtSession:
    """onnxruntime session with explicit intra-op threads and sequential execution, on the CPU provider or
    on the EP of another backend (with the CPU provider after it for the nodes that EP does not take)."""

    runtime = "onnxruntime"

    def __init__(
        self,
        path: str,
        threads: int = 0,
        profile_prefix: str | None = None,
        optimization: str = "all",
        backend: str = "cpu",
        precision: str | None = None,
    ) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise RuntimeMissing(f"onnxruntime is not installed for {sys.executable}") from exc
        self.version = ort.__version__
        self.backend = backend
        self.provider = provider_of(backend)
        if backend == CPU and precision not in (None, "fp32"):
            raise BackendError(
                f"onnxruntime's CPU provider computes the model's own types, not '{precision}'"
            )
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
        if backend == CPU:
            self.session = self._create(ort, path, opts, ["CPUExecutionProvider"])
            self._placement: Placement | None = whole(
                CPU, CPU, "the CPU execution provider alone", {"mode": precision} if precision else None
            )
            self.options: dict[str, Any] = {}
        else:
            self._open_backend(ort, path, opts, threads, precision, profiled=bool(profile_prefix))
        self.effective_threads = effective_threads(threads, before, thread_count())
        self.inputs = [
            InputInfo(i.name, list(i.shape), ORT_TYPES.get(i.type, "float32"))
            for i in self.session.get_inputs()
        ]
        self.output_names = [o.name for o in self.session.get_outputs()]
        if backend != CPU:
            self._placement = self._where(profiled=bool(profile_prefix))  # None: the twin's, when asked

    @staticmethod
    def _create(ort: Any, path: str, opts: Any, providers: list[Any]) -> Any:
        try:
            return ort.InferenceSession(path, opts, providers=providers)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
            raise ModelLoadError(_first_line(exc)) from None

    def _open_backend(
        self, ort: Any, path: str, opts: Any, threads: int, precision: str | None, profiled: bool
    ) -> None:
        """Open the session on the backend's EP with the CPU provider after it; refuse an EP this
        onnxruntime does not have, and one it registered and then dropped (it only warns on stderr, which
        is caught for the reason and passed on)."""
        available = ort.get_available_providers()
        if self.provider not in available:
            wheel = WHEELS.get(self.provider)
            raise BackendError(
                f"backend '{self.backend}' needs {self.provider}, which onnxruntime {self.version} at "
                f"{sys.executable} does not have (it has: {', '.join(available)})"
                + (f"; it comes with {wheel}" if wheel else "")
            )
        self.options, self.precision = backend_options(self.backend, threads, precision)
        opts.add_session_config_entry(RECORD_ASSIGNMENT, "1")
        providers = [(self.provider, self.options), "CPUExecutionProvider"]
        self._twin = (ort, path, opts, providers)  # the recipe of a profiled twin (`_twin_kernels`)
        (session, failure), log = with_stderr(lambda: _attempt(self._create, ort, path, opts, providers))
        sys.stderr.write(log)
        if failure is None and self.provider not in session.get_providers():
            said = "; ".join(ort_errors(log)) or "it gave no reason"
            failure = BackendError(
                f"onnxruntime {self.version} did not take {self.provider} for backend '{self.backend}' "
                f"(options {self.options}; the session would run on {', '.join(session.get_providers())} "
                f"alone): {said}"
            )
        if failure is not None:
            raise failure
        self.session = session

    def _where(self, profiled: bool) -> Placement | None:
        """Each node's unit from onnxruntime's assignment record; None where they are on more than one unit
        (or there is no record): their order then comes from a profiled twin, when asked (`placement`)."""
        subgraphs = assignment_of(self.session)
        self._assigned = assigned_ops(subgraphs, self.backend) if subgraphs is not None else None
        if profiled:  # profiled for its caller, whose runs these are
            return read_placement(
                self.backend, self._assigned, None, self.precision, "a session profiled for its caller"
            )
        if self._assigned is not None and len({op.unit for op in self._assigned}) == 1:
            return read_placement(self.backend, self._assigned, None, self.precision)
        return None

    def _twin_kernels(self) -> tuple[list[OpUnit] | None, str]:
        """The kernels of one run on zeros of a twin session (the same model, EP and options, profiled), in
        order, or None and why not; the twin is closed and its trace removed."""
        feeds = placeholder_feeds(self.inputs)
        if feeds is None:
            return None, "an input type the twin's profiled run cannot make"
        ort, path, opts, providers = self._twin
        folder = tempfile.mkdtemp(prefix="edgebench-ort-placement-")
        try:
            opts.enable_profiling = True
            opts.profile_file_prefix = os.path.join(folder, "placement")
            (twin, failure), _ = with_stderr(lambda: _attempt(self._create, ort, path, opts, providers))
            if failure is not None:
                return None, f"the profiled twin could not be opened: {_first_line(failure)}"
            try:
                twin.run(None, feeds)
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
                twin.end_profiling()
                return None, f"the twin's profiled run failed: {_first_line(exc)}"
            with open(twin.end_profiling(), encoding="utf-8") as fh:
                events = json.load(fh)
        except (OSError, ValueError) as exc:
            return None, f"the twin's profile could not be read: {exc}"
        finally:
            opts.enable_profiling = False
            shutil.rmtree(folder, ignore_errors=True)
        return profile_kernels(events, self.backend), ""

    def prepare(self, feeds: dict[str, Any]) -> OrtStep:
        return OrtStep(self.session, self.output_names, feeds)

    def placement(self) -> Placement:
        """Where the model ran: the CPU provider as a whole, or each node's EP (see the module docstring);
        a model on more than one unit has its partitions read from a profiled twin the first time."""
        if self._placement is None:
            kernels, note = self._twin_kernels()
            self._placement = read_placement(self.backend, self._assigned, kernels, self.precision, note)
        return self._placement

    def execution(self) -> dict[str, Any] | None:
        """The EP and options the numbers of a non-CPU backend were measured with (None on the CPU)."""
        if self.backend == CPU:
            return None
        providers = list(self.session.get_providers())
        return {
            "onnxruntime": {"backend": self.backend, "providers": providers, "provider_options": self.options}
        }

    def outputs(self, feeds: dict[str, Any]) -> dict[str, Any]:
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds), strict=True))

    def end_profiling(self) -> str:
        """End the caller's profiling (`profile_prefix`): the path of the trace onnxruntime wrote."""
        return str(self.session.end_profiling())


def _attempt(call: Any, *args: Any) -> tuple[Any, Exception | None]:
    """(call(*args), None), or (None, the exception it raised): a failure inside a stderr capture is
    raised after the capture gives the stream back."""
    try:
        return call(*args), None
    except Exception as exc:  # noqa: BLE001 - re-raised by the caller
        return None, exc


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


# what agent.runtimes.open_session opens for this runtime


def _open_profiled(task: dict, path: str | None = None, **options: Any) -> OrtSession:
    """A session on the task's model with the task's threads and backend, as its plain session was opened
    (or on `path`, a calibration model, on the CPU); a refusal is the model's, or the backend's."""
    from .main import TaskError
    from .runtimes import task_backend

    on = task_backend(task) if path is None else {}
    try:
        return OrtSession(path or task["model"], int(task.get("threads", 0)), **on, **options)
    except ModelLoadError as exc:
        raise TaskError("model", str(exc)) from None
    except BackendError as exc:
        raise TaskError("backend", str(exc)) from None


def profile(
    task: dict,
    session: Any,
    plain: Any,
    feeds: dict[str, Any],
    warmup: int,
    runs: int,
    min_seconds: float = 0.0,
) -> tuple[list[float], dict[str, Any]]:
    """Plain runs and profiled runs (a second session, onnxruntime's own profiler); returns the plain
    latencies and the gzipped traces (the host reads them: probes.profile.ort_profile_of)."""
    folder = task["profile_dir"]
    os.makedirs(folder, exist_ok=True)
    token = task.get("token", str(os.getpid()))
    profiled = _open_profiled(task, profile_prefix=os.path.join(folder, f"ort-{token}"))
    latencies = alternate(plain, profiled.prepare(feeds), warmup, runs, min_seconds)
    trace = _gzip(profiled.end_profiling(), folder)
    out: dict[str, Any] = {"trace": trace, "warmup": warmup, "runs": len(latencies)}
    calibration = task.get("calibration_model")
    if calibration:
        out["calibration"] = _ort_calibration(task, calibration, folder, token, warmup, runs)
    return latencies, out


def _ort_calibration(
    task: dict, path: str, folder: str, token: str, warmup: int, runs: int
) -> dict[str, Any]:
    """A chain of trivial ops, plain and profiled: per op, the difference is the profiler's own cost."""
    import numpy as np

    plain = _open_profiled(task, path)
    feeds = {
        i.name: np.ones([d if isinstance(d, int) and d > 0 else 1 for d in i.shape], dtype=i.dtype)
        for i in plain.inputs
    }
    profiled = _open_profiled(task, path, profile_prefix=os.path.join(folder, f"cal-{token}"))
    plain_ms = alternate(plain.prepare(feeds), profiled.prepare(feeds), warmup, runs)
    return {"trace": _gzip(profiled.end_profiling(), folder), "plain_ms": plain_ms}


def _gzip(path: str, folder: str) -> str:
    path = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    target = os.path.join(folder, os.path.basename(path) + ".gz")
    with open(path, "rb") as src, gzip.open(target, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path)
    return target


def installed_version() -> str | None:
    """The installed onnxruntime's version (None: not installed)."""
    try:
        import onnxruntime
    except ImportError:
        return None
    return str(onnxruntime.__version__)


PYTHON_MODULE = "onnxruntime"  # what importing the runtime means (its shared libraries load)
SESSION = OrtSession
PROFILE_KEY = "ort"  # where the reply carries the profile
