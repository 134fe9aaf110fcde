"""Task `bench`: runtime import, load time, first inference, steady-state latency samples, memory.

`import_ms` is importing the runtime's Python module (its shared libraries load then); `load_ms` is creating
the session only. Memory is in MB (1e6 bytes): the process's peak resident set (`peak_rss_mb`, interpreter
and libraries included), its resident set just before the model loaded (`rss_before_load_mb`: the runtime
and harness baseline), and the model's own memory (`model_memory_mb`): the peak resident set over load and
inference (VmHWM, reset just before the load) minus that baseline, i.e. weights, arena and activations.
Where the peak cannot be reset the figure is the process peak minus the baseline, an upper bound, and says
so (`model_memory_peak`). After the timed runs the outputs of the last one are checked against a fresh
inference (selfcheck.py).
"""

from __future__ import annotations

import os
import time
from typing import Any

from .inputs import InputError, describe, make_inputs
from .loading import cold_load, given_values, open_task_session, placement_of
from .main import TaskError
from .runtimes import import_runtime
from .selfcheck import check_outputs, pristine_copy
from .session import RuntimeMissing
from .timing import (
    TimingPolicy,
    current_rss_mb,
    peak_rss_mb,
    reset_peak_rss,
    sample,
    time_once,
    warm_up,
)


def pin(cpus: list[int] | None) -> list[int] | None:
    """Pin this process (and the runtime threads it starts later) to `cpus`."""
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except (OSError, ValueError) as exc:
            raise TaskError("usage", f"cannot pin to CPUs {cpus}: {exc}") from None
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def import_then_pin(task: dict) -> tuple[list[int] | None, dict[str, Any]]:
    """Import the task's runtime, then pin: (affinity, what the import cost).

    onnxruntime reads the CPUs it may use once, at import: imported after the process was pinned to one
    CPU, its int8 GEMM took 3x as long (4.3 against 1.35 ms for a 1024-cube MatMulInteger). Its thread
    pools start with the session, after the pin, so they inherit it either way.
    """
    runtime = task.get("runtime", "onnxruntime")
    cost: dict[str, Any] = {"rss_start_mb": current_rss_mb()}
    try:
        cost["import_ms"] = import_runtime(runtime)
    except RuntimeMissing as exc:
        raise TaskError("runtime", str(exc)) from None
    affinity = pin(task.get("affinity"))
    cost["rss_before_load_mb"] = current_rss_mb()
    return affinity, cost


def load(
    task: dict, warnings: list[str], cost: dict[str, Any] | None = None
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Open the session and make its inputs: (session, feeds, what loading cost). `cost` is what
    import_then_pin measured; without it the runtime is imported here."""
    runtime = task.get("runtime", "onnxruntime")
    cost = dict(cost) if cost is not None else {"rss_start_mb": current_rss_mb()}
    try:
        if "import_ms" not in cost:
            cost["import_ms"] = import_runtime(runtime)
            cost["rss_before_load_mb"] = current_rss_mb()
    except RuntimeMissing as exc:
        raise TaskError("runtime", str(exc)) from None
    start = time.perf_counter_ns()
    session = open_task_session(task)
    cost["load_ms"] = (time.perf_counter_ns() - start) / 1e6
    try:
        feeds = make_inputs(
            session.inputs, task.get("shapes", {}), int(task.get("seed", 0)), task.get("inputs"), warnings
        )
    except InputError as exc:
        raise TaskError("input", str(exc)) from None
    return session, feeds, cost


def first_inference(step: Any) -> float:
    try:
        return time_once(step)
    except Exception as exc:  # noqa: BLE001 - the runtime's own errors carry the reason
        raise TaskError("model", f"inference failed: {str(exc).strip().splitlines()[0]}") from None


def measure(session: Any, feeds: dict[str, Any], policy: TimingPolicy) -> dict[str, Any]:
    """First inference, warm-up, timed samples, then the output self-check; the bench result's core."""
    pristine = pristine_copy(feeds)
    step = session.prepare(feeds)
    first_ms = first_inference(step)
    warm_calls, warm_s = warm_up(step, policy)
    samples, cut_short = sample(step, policy)
    verdict = check_outputs(session.runtime, session, step, feeds, pristine)
    return {
        "first_inference_ms": first_ms,
        "warmup": warm_calls,
        "warmup_seconds": warm_s,
        "latencies_ms": samples,
        "cut_short": cut_short,
        "self_check": verdict,
    }


def run(task: dict) -> tuple[dict, list[str]]:
    warnings: list[str] = []
    affinity, imported = import_then_pin(task)
    cold = cold_load(task) if task.get("cold_load") else None  # before the warm load below
    process_peak = peak_rss_mb()  # import and cold loads: read before the reset restarts it
    reset = reset_peak_rss()
    imported = {**imported, "rss_before_load_mb": current_rss_mb()}
    session, feeds, cost = load(task, warnings, imported)
    feeds = given_values(task, session, feeds)
    policy = TimingPolicy(
        **{
            k: task[k]
            for k in ("warmup", "warmup_seconds", "runs", "min_seconds", "max_seconds")
            if k in task
        }
    )
    measured = measure(session, feeds, policy)
    if measured.pop("cut_short"):
        warnings.append(
            f"stopped at max_seconds={policy.max_seconds:g} after {len(measured['latencies_ms'])} "
            f"of {policy.runs} runs"
        )
    since_load = peak_rss_mb()
    peak = max(process_peak, since_load)
    before = cost.get("rss_before_load_mb")
    return {
        "runtime": session.runtime,
        "runtime_version": session.version,
        "threads": int(task.get("threads", 0)),
        "effective_threads": getattr(session, "effective_threads", None),
        "affinity": affinity,
        **cost,
        **measured,
        "peak_rss_mb": peak,
        "rss_increase_mb": None if before is None else max(0.0, peak - before),
        "model_memory_mb": None if before is None else max(0.0, since_load - before),
        # The peak since the reset, or (no reset) a process peak that may predate the load: an upper bound.
        "model_memory_peak": "since load" if reset else "process lifetime (upper bound)",
        "inputs": describe(feeds),
        "execution": session.execution() if hasattr(session, "execution") else None,
        "placement": placement_of(session),
        "cold_load": cold,
    }, warnings
