"""Task `bench`: load time, first inference, steady-state latency samples, peak memory."""

from __future__ import annotations

import os
import time

from .inputs import InputError, describe, make_inputs
from .loading import cold_load, given_values
from .main import TaskError
from .runtimes import ModelLoadError, RuntimeMissing, open_session
from .timing import TimingPolicy, current_rss_mb, peak_rss_mb, sample, time_once, warm_up


def pin(cpus: list[int] | None) -> list[int] | None:
    """Pin this process (and the runtime threads it starts later) to `cpus`."""
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except (OSError, ValueError) as exc:
            raise TaskError("usage", f"cannot pin to CPUs {cpus}: {exc}") from None
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def load(task: dict, warnings: list[str]):  # type: ignore[no-untyped-def]
    """Open the session and make its inputs; returns (session, feeds, load_ms)."""
    rss_before = current_rss_mb()
    start = time.perf_counter_ns()
    try:
        session = open_session(task.get("runtime", "onnxruntime"), task["model"], int(task.get("threads", 0)))
    except ModelLoadError as exc:
        raise TaskError("model", str(exc)) from None
    except RuntimeMissing as exc:
        raise TaskError("runtime", str(exc)) from None
    load_ms = (time.perf_counter_ns() - start) / 1e6
    try:
        feeds = make_inputs(
            session.inputs, task.get("shapes", {}), int(task.get("seed", 0)), task.get("inputs"), warnings
        )
    except InputError as exc:
        raise TaskError("input", str(exc)) from None
    return session, feeds, load_ms, rss_before


def run(task: dict) -> tuple[dict, list[str]]:
    warnings: list[str] = []
    affinity = pin(task.get("affinity"))
    cold = cold_load(task) if task.get("cold_load") else None  # before the warm load below
    session, feeds, load_ms, rss_before = load(task, warnings)
    feeds = given_values(task, session, feeds)
    step = session.prepare(feeds)
    try:
        first_ms = time_once(step)
    except Exception as exc:  # noqa: BLE001 - the runtime's own errors carry the reason
        raise TaskError("model", f"inference failed: {str(exc).strip().splitlines()[0]}") from None
    policy = TimingPolicy(
        **{
            k: task[k]
            for k in ("warmup", "warmup_seconds", "runs", "min_seconds", "max_seconds")
            if k in task
        }
    )
    warm_calls, warm_s = warm_up(step, policy)
    samples, cut_short = sample(step, policy)
    if cut_short:
        warnings.append(
            f"stopped at max_seconds={policy.max_seconds:g} after {len(samples)} of {policy.runs} runs"
        )
    return {
        "runtime": session.runtime,
        "runtime_version": session.version,
        "threads": int(task.get("threads", 0)),
        "affinity": affinity,
        "load_ms": load_ms,
        "first_inference_ms": first_ms,
        "warmup": warm_calls,
        "warmup_seconds": warm_s,
        "latencies_ms": samples,
        "peak_rss_mb": peak_rss_mb(),
        "rss_before_load_mb": rss_before,
        "inputs": describe(feeds),
        "execution": session.execution() if hasattr(session, "execution") else None,
        "cold_load": cold,
    }, warnings
