"""Opening a model for the workload tasks (stream, soak, contention), and a cold load.

The runtime's module is imported before the session is timed, so `load_ms` is creating the session only.
A cold load evicts the model file from the page cache first: fsync, then `posix_fadvise(DONTNEED)` (no root
needed), and checks with `mincore` (through ctypes) how much of the file is still resident; when it cannot
check, or pages stayed resident (tmpfs, a file mapped by another process), the result says so.

Standard library only (numpy and the runtime imported lazily, through the session).
"""

from __future__ import annotations

import mmap
import os
import time
from typing import Any

from .inputs import InputError, apply_values, make_inputs
from .main import TaskError
from .runtimes import SESSION_MODULES, import_runtime, model_files, open_session, task_backend
from .session import BackendError, ModelLoadError, RuntimeMissing
from .timing import current_rss_mb

EVICTED_BELOW = 0.05  # resident fraction under which the file counts as evicted
COLD_ROUNDS = 5  # cold/warm load pairs


def import_runtime_ms(runtime: str) -> float:
    """Import the runtime's module (its shared libraries load then); ms, 0 if it was already loaded."""
    if runtime not in SESSION_MODULES:
        raise TaskError("usage", f"unknown runtime {runtime!r}")
    try:
        return import_runtime(runtime)
    except RuntimeMissing as exc:
        raise TaskError("runtime", str(exc)) from None


def open_task_session(task: dict, path: str | None = None, **options: Any) -> Any:
    """The task's model (or `path`) open in its runtime on the task's backend, its errors as task errors;
    with `require_backend`, a model not wholly on that backend is refused here, its fallen-back ops named
    (kind "backend"), before anything is timed."""
    try:
        session = open_session(
            task.get("runtime", "onnxruntime"),
            path or task["model"],
            int(task.get("threads", 0)),
            **task_backend(task),
            **options,
        )
    except ModelLoadError as exc:
        raise TaskError("model", str(exc)) from None
    except RuntimeMissing as exc:
        raise TaskError("runtime", str(exc)) from None
    except BackendError as exc:
        raise TaskError("backend", str(exc)) from None
    if task.get("require_backend"):
        why = session.placement().shortfall()
        if why is not None:
            raise TaskError("backend", f"the backend is required: {why}")
    return session


def placement_of(session: Any) -> dict[str, Any]:
    """The session's placement as the reply carries it."""
    placement: dict[str, Any] = session.placement().as_dict()
    return placement


def open_timed(task: dict, path: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The session and what opening it cost: import_ms, load_ms, rss_before_load_mb."""
    runtime = task.get("runtime", "onnxruntime")
    cost: dict[str, Any] = {"import_ms": import_runtime_ms(runtime), "rss_before_load_mb": current_rss_mb()}
    start = time.perf_counter_ns()
    session = open_task_session(task, path)
    cost["load_ms"] = (time.perf_counter_ns() - start) / 1e6
    return session, cost


def model_inputs(task: dict, session: Any, warnings: list[str]) -> dict[str, Any]:
    """The task's inputs (its .npz, or seeded random), with the inputs given as one value filled in."""
    try:
        feeds = make_inputs(
            session.inputs, task.get("shapes", {}), int(task.get("seed", 0)), task.get("inputs"), warnings
        )
        return apply_values(feeds, task.get("values"), session.inputs)
    except InputError as exc:
        raise TaskError("input", str(exc)) from None


def given_values(task: dict, session: Any, feeds: dict[str, Any]) -> dict[str, Any]:
    """`feeds` with the task's one-value inputs (`values`) filled in."""
    try:
        return apply_values(feeds, task.get("values"), session.inputs)
    except InputError as exc:
        raise TaskError("input", str(exc)) from None


# ---- page cache -------------------------------------------------------------------------------------
def resident_fraction(path: str) -> float | None:
    """Share of the file's pages in the page cache (mincore on a private mapping); None if unknown."""
    import ctypes
    import ctypes.util

    size = os.path.getsize(path)
    if size == 0:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        mincore = libc.mincore
    except (OSError, AttributeError):
        return None
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    with open(path, "rb") as fh:
        # ACCESS_COPY gives a writable (private) buffer ctypes can take an address of; mapping faults no page.
        mapped = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        anchor = ctypes.c_char.from_buffer(mapped)
        vec = (ctypes.c_ubyte * pages)()
        rc = mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
        del anchor
        if rc != 0:
            return None
        return sum(v & 1 for v in vec) / pages
    finally:
        mapped.close()


def evict(path: str) -> dict[str, Any]:
    """Drop the file's pages from the page cache and say whether that could be verified."""
    before = resident_fraction(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages are not dropped: write them back first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    after = resident_fraction(path)
    verified = after is not None and after < EVICTED_BELOW
    out: dict[str, Any] = {
        "resident_before": before,
        "resident_after": after,
        "eviction_verified": verified,
        "method": "posix_fadvise(DONTNEED)",
        "check": "mincore" if after is not None else None,
    }
    if after is None:
        out["note"] = "mincore is not available here: eviction could not be verified"
    elif not verified:
        out["note"] = f"{after:.0%} of the file stayed in the page cache (tmpfs, or mapped elsewhere)"
    return out


def evict_model(paths: list[str]) -> dict[str, Any]:
    """Evict every file of a model (an ncnn graph and its weights); the resident fractions are the files'
    own weighted by their sizes, verified only when every file's eviction is."""
    each = [evict(path) for path in paths]
    if len(each) == 1:
        return each[0]
    sizes = [max(1, os.path.getsize(path)) for path in paths]

    def weighted(key: str) -> float | None:
        values = [e[key] for e in each]
        if any(v is None for v in values):
            return None
        return sum(v * s for v, s in zip(values, sizes, strict=True)) / sum(sizes)

    notes = sorted({e["note"] for e in each if e.get("note")})
    return {
        **each[0],
        "resident_before": weighted("resident_before"),
        "resident_after": weighted("resident_after"),
        "eviction_verified": all(e["eviction_verified"] for e in each),
        **({"note": "; ".join(notes)} if notes else {}),
    }


def cold_load(task: dict, rounds: int = COLD_ROUNDS) -> dict[str, Any]:
    """Cold and warm loads alternated `rounds` times: evict, load (cold), load again (warm).

    Alternating pairs meet the same machine load, so a busy device shifts both sides alike. The sessions
    are dropped after each load; the bench's own (warm) load follows.
    """
    runtime = task.get("runtime", "onnxruntime")
    import_runtime_ms(runtime)  # its libraries are not the model file
    files = model_files(runtime, task["model"])
    cold, warm, evictions = [], [], []
    for _ in range(rounds):
        evictions.append(evict_model(files))
        for times in (cold, warm):
            session, cost = open_timed(task)
            del session
            times.append(cost["load_ms"])
    verified = all(e["eviction_verified"] for e in evictions)
    notes = sorted({e["note"] for e in evictions if e.get("note")})
    return {
        "cold_ms": cold,
        "warm_ms": warm,
        "eviction_verified": verified,
        "resident_after": [e["resident_after"] for e in evictions],
        "resident_before": evictions[0]["resident_before"],
        "check": evictions[0]["check"],
        "method": evictions[0]["method"],
        "note": "; ".join(notes) or None,
    }
