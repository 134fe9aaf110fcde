"""The onnxruntime session: the CPU provider with explicit intra-op threads and sequential execution."""

from __future__ import annotations

import gzip
import os
import shutil
import sys
from typing import Any

from .placement import Placement, whole
from .session import (
    InputInfo,
    ModelLoadError,
    RuntimeMissing,
    Step,
    _first_line,
    effective_threads,
    thread_count,
)
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

    def placement(self) -> Placement:
        """Where the model ran: this session opens the CPU alone."""
        return whole("cpu", "cpu", "the CPU execution provider alone")

    def outputs(self, feeds: dict[str, Any]) -> dict[str, Any]:
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds), strict=True))

    def end_profiling(self) -> str | None:
        return self.session.end_profiling()


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
    """A session on the task's model (or `path`) with the task's threads; a refusal is the model's."""
    from .main import TaskError

    try:
        return OrtSession(path or task["model"], int(task.get("threads", 0)), **options)
    except ModelLoadError as exc:
        raise TaskError("model", str(exc)) from None


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
