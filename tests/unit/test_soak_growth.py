"""Soak statistics on series whose truth is known: a deliberately leaking fake step (its leaked bytes are an
exact count), a flat one, and a one-time allocation that a short run must not call a leak."""

from __future__ import annotations

import mmap
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from edgebench.agent.soak import soak_windows
from edgebench.lab.device import AgentReply
from edgebench.probes.soak import drift_ratio, rss_growth, soak_records
from edgebench.records import RecordContext

CHUNK = 256 * 1024


class LeakingStep:
    """Keeps every buffer it maps (touched, so resident): a leak of CHUNK bytes per call. Fresh anonymous
    mappings, not the heap: a long-lived test process has freed heap pages still resident, which a heap
    leak would refill without its RSS growing."""

    def __init__(self) -> None:
        self.kept: list[mmap.mmap] = []
        self.times: list[float] = []

    def __call__(self) -> None:
        buffer = mmap.mmap(-1, CHUNK)
        buffer.write(b"\x01" * CHUNK)
        self.kept.append(buffer)
        self.times.append(time.monotonic())


def soak_reply(step, seconds: float, rate_hz: float, period_s: float) -> AgentReply:
    log = soak_windows(step, seconds, rate_hz, period_s)
    result = {**log, "period_s": period_s, "load_ms": 1.0, "peak_rss_mb": 1.0}
    return AgentReply(result, [], seconds)


def ctx() -> RecordContext:
    return RecordContext("run", "local", "soak", "fake", "none")


def by_metric(records):
    return {r.metric: r for r in records if "t_s" not in r.params}


def leak_in_a_fresh_process(seconds: float, rate_hz: float, period_s: float) -> tuple[dict, list[float]]:
    """The soak loop over a leaking step, in its own interpreter: a test process hundreds of MB large
    frees earlier tests' garbage while the loop runs, which hid most of the leak from its RSS."""
    step = LeakingStep()
    log = soak_windows(step, seconds, rate_hz, period_s)
    return log, step.times


def test_a_leaking_step_is_a_leak_at_the_rate_it_leaks() -> None:
    rate_hz, seconds, period_s = 40.0, 3.0, 0.25
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        log, times = pool.submit(leak_in_a_fresh_process, seconds, rate_hz, period_s).result(timeout=120)
    result = {**log, "period_s": period_s, "load_ms": 1.0, "peak_rss_mb": 1.0}
    out = soak_records(ctx(), AgentReply(result, [], seconds))
    growth = by_metric(out.records)["rss_growth_mb_per_hour"]
    # The reference: the slope of the bytes the fake kept against the times it kept them (an exact count,
    # fitted as the probe fits RSS, so a loaded machine's uneven call times cannot tell them apart).
    kept_mb = np.arange(1, len(times) + 1) * CHUNK / 1e6
    leaked_mb_per_hour = float(np.polyfit(times, kept_mb, 1)[0]) * 3600
    assert growth.annotations["verdict"] == "leak" and growth.annotations["ci_low"] > 0
    assert 0.7 < growth.value / leaked_mb_per_hour < 1.3  # MB against MiB would read 0.95 or 1.05
    assert any("a leak" in w for w in out.warnings)


def test_a_flat_series_has_an_interval_holding_zero() -> None:
    g = rss_growth([0, 1, 2, 3, 4], [50.0] * 5)
    assert g is not None and g.ci_low <= 0.0 <= g.ci_high and g.verdict(1.0, 1.0) == "none"
    rng = np.random.default_rng(0)
    noisy = rss_growth(list(range(30)), list(50 + rng.normal(0, 0.01, 30)))
    assert noisy is not None and noisy.ci_low <= 0.0 <= noisy.ci_high


def test_a_one_time_step_in_a_short_run_is_not_called_a_leak() -> None:
    t = [0.5 * i for i in range(24)]
    rss = [100.0] * 17 + [100.6] * 7  # onnxruntime's +0.6 MB some seconds after load, then flat
    g = rss_growth(t, rss)
    assert g is not None and g.ci_low > 0  # a straight line through a step slopes up...
    assert g.verdict((t[-1] - t[0]) / 3600, 1.0) == "growing"  # ...but 0.6 MB is under the floor


def test_too_few_windows_give_no_growth_and_drift_needs_four() -> None:
    assert rss_growth([0, 1], [1.0, 2.0]) is None
    assert drift_ratio([1.0, 1.0, 1.0]) is None
    ratio, early, late = drift_ratio([1.0, 1.0, 2.0, 2.0])
    assert (ratio, early, late) == (2.0, 1.0, 2.0)
