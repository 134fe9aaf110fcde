"""Task `soak`: a model run for a long time (back to back, or at `rate_hz`), its resident memory and latency
sampled window by window, to see memory grow (a leak) and latency drift.

Each window of `period_s` keeps its inference count, median and mean latency, and the process's resident
set at the window's end (VmRSS); the reply stays small however long the run. `RssSampler` is the same
reading on a thread, for runs whose loop is someone else's (the thermal task).

Standard library only (numpy and the runtime through the session).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .bench import pin
from .loading import model_inputs, open_timed
from .main import TaskError
from .timing import TimingPolicy, current_rss_mb, peak_rss_mb, time_once, warm_up


class RssSampler:
    """Resident set (MB) every `period_s` on a daemon thread: [(seconds since origin, MB), ...]."""

    def __init__(self, period_s: float, origin: float) -> None:
        self.period_s, self.origin = period_s, origin
        self.points: list[list[float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            self._read()
            if self._stop.wait(self.period_s):
                break

    def _read(self) -> None:
        rss = current_rss_mb()
        if rss is not None:
            self.points.append([round(time.monotonic() - self.origin, 4), rss])

    def stop(self) -> list[list[float]]:
        self._stop.set()
        self._thread.join(timeout=max(1.0, self.period_s * 2))
        self._read()
        return self.points


def soak_windows(step: Any, duration_s: float, rate_hz: float, period_s: float) -> dict[str, Any]:
    """Inferences for `duration_s`, summarised per window of `period_s` (t is the window's end).

    Latencies go into one preallocated buffer reused by every window: the loop itself allocates nothing
    that lives on, so the RSS it samples is the runtime's, not this bookkeeping's.
    """
    import numpy as np

    clock = time.perf_counter_ns
    windows: list[dict[str, Any]] = []
    origin = time.monotonic()
    end = origin + duration_s
    gap = 1.0 / rate_hz if rate_hz > 0 else 0.0
    window_end = origin + period_s
    buf = np.empty(4096, dtype=np.float64)
    k = total = late = 0
    next_start = origin
    while True:
        now = time.monotonic()
        if now >= window_end or now >= end:
            windows.append(_window(np, now - origin, buf[:k]))
            total, k = total + k, 0
            window_end += period_s
            if now >= end:
                break
        if gap:
            if next_start > now:
                time.sleep(min(next_start, end) - now)
                continue
            late += now - next_start > gap
            next_start += gap
        t0 = clock()
        step()
        if k == len(buf):
            buf = np.concatenate([buf, np.empty_like(buf)])
        buf[k] = (clock() - t0) / 1e6
        k += 1
    return {"windows": windows, "inferences": total, "late": late, "seconds": time.monotonic() - origin}


def _window(np: Any, t: float, latencies: Any) -> dict[str, Any]:
    return {
        "t": round(t, 4),
        "n": int(latencies.size),
        "p50_ms": float(np.median(latencies)) if latencies.size else None,
        "mean_ms": float(latencies.mean()) if latencies.size else None,
        "rss_mb": current_rss_mb(),
    }


def run(task: dict) -> tuple[dict, list[str]]:
    warnings: list[str] = []
    affinity = pin(task.get("affinity"))
    session, cost = open_timed(task)
    feeds = model_inputs(task, session, warnings)
    step = session.prepare(feeds)
    try:
        first_ms = time_once(step)
        calls, _ = warm_up(step, TimingPolicy(warmup=int(task.get("warmup", 1)), warmup_seconds=0.2))
        log = soak_windows(
            step, float(task["duration_s"]), float(task.get("rate_hz") or 0), float(task["period_s"])
        )
    except Exception as exc:  # noqa: BLE001 - the runtime's own errors carry the reason
        raise TaskError("model", f"inference failed: {str(exc).strip().splitlines()[0]}") from None
    return {
        "runtime": session.runtime,
        "runtime_version": session.version,
        "threads": int(task.get("threads", 0)),
        "affinity": affinity,
        **cost,
        "first_inference_ms": first_ms,
        "warmup": calls,
        "duration_s": float(task["duration_s"]),
        "period_s": float(task["period_s"]),
        "rate_hz": float(task.get("rate_hz") or 0),
        **log,
        "peak_rss_mb": peak_rss_mb(),
    }, warnings
