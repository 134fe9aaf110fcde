"""One session interface over onnxruntime, MNN, LiteRT and ncnn: declared inputs, a prepared step, outputs.

`session.prepare(feeds)` returns a `Step`: `step()` runs one inference (the part timers time),
`step.refresh()` puts the given inputs back into the runtime's input buffers (called before every run,
outside the timed region), `step.outputs()` copies what the last run computed. MNN's session owns its input
tensors and reuses their memory for activations (`Session_Input_Inside`, its default), so an input copied in
once is gone after the first run: every later inference would compute on leftover activations.
"""

from __future__ import annotations

import importlib
import sys
import time
from types import ModuleType
from typing import Any

from .session import RuntimeMissing, Session

# runtime -> the agent module holding its session: one module per runtime, with its `SESSION` class, the
# `PYTHON_MODULE` importing it means, its `installed_version()` and, where it has one, its per-op `profile`
SESSION_MODULES = {
    "onnxruntime": "session_onnxruntime",
    "mnn": "session_mnn",
    "litert": "session_litert",
    "ncnn": "session_ncnn",
}


def import_runtime(runtime: str) -> float:
    """Import the runtime's module and return how long that took in ms (0 when it was already imported)."""
    if runtime not in SESSION_MODULES:
        return 0.0
    module = session_module(runtime).PYTHON_MODULE
    start = time.perf_counter_ns()
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise RuntimeMissing(f"{runtime} is not installed for {sys.executable}") from exc
    return (time.perf_counter_ns() - start) / 1e6


def session_module(runtime: str) -> ModuleType:
    """The runtime's session module (SESSION_MODULES; imported on use): its `SESSION` class and, where it
    has a per-op profile, `profile` and `PROFILE_KEY`."""
    module = SESSION_MODULES.get(runtime)
    if module is None:
        raise ValueError(f"unknown runtime {runtime!r}")
    return importlib.import_module(f"{__package__}.{module}")


def model_files(runtime: str, path: str) -> list[str]:
    """Every file the model at `path` is on this runtime (its session module's `model_files`, where it
    has one: an ncnn graph and its weights); else the one file."""
    found = getattr(session_module(runtime), "model_files", None) if runtime in SESSION_MODULES else None
    return list(found(path)) if found is not None else [path]


def open_session(
    runtime: str,
    path: str,
    threads: int = 0,
    backend: str = "cpu",
    precision: str | None = None,
    **options: Any,
) -> Session:
    """Open the model in the runtime's session, on `backend` at `precision` (None: the backend's own
    default); the CPU at its default is how every session opens without them."""
    if backend != "cpu" or precision is not None:
        options = {**options, "backend": backend, "precision": precision}
    session: Session = session_module(runtime).SESSION(path, threads, **options)
    return session


def task_backend(task: dict) -> dict[str, Any]:
    """The backend options of a model task, as `open_session` takes them."""
    return {"backend": str(task.get("backend") or "cpu"), "precision": task.get("precision")}
