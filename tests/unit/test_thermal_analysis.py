"""Thermal analysis on synthetic runs: windows, throttle onset by latency and by frequency cap, ratios."""

from __future__ import annotations

import numpy as np
import pytest

from edgebench.probes.sensing import ChannelSeries, SensorLog
from edgebench.probes.thermal import (
    analyze_thermal,
    choose_window,
    initial_and_steady_spans,
    thermal_records,
    window_bounds,
)
from edgebench.records import RecordContext


def run(duration: float, latency_at, noise: float = 0.0, seed: int = 0, rate: float = 0.0):  # type: ignore[no-untyped-def]
    """Back-to-back (or fixed-rate) inferences whose latency follows latency_at(t) in ms, +- noise."""
    rng = np.random.default_rng(seed)
    starts, lats, t = [], [], 0.0
    while t < duration:
        lat = latency_at(t) * (1 + noise * rng.standard_normal())
        starts.append(t)
        lats.append(lat)
        t = t + 1 / rate if rate else t + lat / 1000
    return np.array(starts), np.array(lats)


def sensors(
    duration: float, cap_at: float | None = None, period: float = 0.25, temp_at=lambda t: 40.0 + t
) -> SensorLog:  # type: ignore[no-untyped-def]
    t = np.arange(0.0, duration + period / 2, period)
    cap = np.where(t >= cap_at, 1000.0, 2400.0) if cap_at is not None else np.full(t.shape, 2400.0)
    cur = np.minimum(cap, 1800.0)
    return SensorLog(
        t=t,
        origin=100.0,
        period_s=period,
        channels=[
            ChannelSeries("temp:cpu", "temp_c", "C", {"zone": "cpu"}, np.array([temp_at(x) for x in t])),
            ChannelSeries("temp:bat", "temp_c", "C", {"zone": "bat"}, np.full(t.shape, 30.0)),
            ChannelSeries("freq_mhz:0-3", "freq_mhz", "MHz", {"cpus": "0-3"}, cur),
            ChannelSeries("freq_cap_mhz:0-3", "freq_cap_mhz", "MHz", {"cpus": "0-3"}, cap),
        ],
        static={"cpufreq": {"0-3": {"cpuinfo_max_mhz": 2400.0}}},
    )


def onset(a, signal: str) -> float | None:  # type: ignore[no-untyped-def]
    return next(o.t_s for o in a.onsets if o.signal == signal)


def test_step_slowdown_with_cap() -> None:
    starts, lats = run(20.0, lambda t: 10.0 if t < 12.0 else 15.0, noise=0.05)
    a = analyze_thermal(starts, lats, sensors(20.0, cap_at=12.3), 20.0, window_s=1.0)
    assert len(a.windows) == 20 and a.window_s == pytest.approx(1.0)
    assert onset(a, "latency") == pytest.approx(12.0, abs=0.5)
    assert onset(a, "freq_cap") == pytest.approx(12.5, abs=0.01)  # first sample at or after the cap
    assert onset(a, "first") == onset(a, "latency")
    assert a.sustained_ratio == pytest.approx(10.0 / 15.0, rel=0.03)
    assert a.stability == pytest.approx(10.0 / 15.0, rel=0.05)
    assert a.windows[0].freq_mhz == {"0-3": 1800.0} and a.windows[-1].cap_mhz == {"0-3": 1000.0}
    assert a.windows[5].temp_c == pytest.approx(45.5, abs=0.2)  # hottest zone, mean over the window
    assert a.max_temp_c == pytest.approx(60.0) and a.start_temp_c == pytest.approx(40.0)


def test_gradual_throttle_is_found_where_it_crosses_the_margin() -> None:
    # 20 ms cold, rising linearly to 40 ms from minute 2 to minute 10 of a 20-minute run.
    def lat(t: float) -> float:
        return 20.0 + 20.0 * min(1.0, max(0.0, (t - 120.0) / 480.0))

    starts, lats = run(1200.0, lat, noise=0.03, rate=20.0)
    a = analyze_thermal(starts, lats, sensors(1200.0, period=1.0), 1200.0)
    assert a.window_s == pytest.approx(10.0) and len(a.windows) == 120
    # 10% over 20 ms is reached at t = 120 + 0.1 * 480 = 168 s
    assert onset(a, "latency") == pytest.approx(168.0, abs=15.0)
    assert onset(a, "freq_cap") is None
    assert a.sustained_ratio == pytest.approx(0.5, rel=0.03)


def test_noise_and_a_single_spike_are_not_throttling() -> None:
    starts, lats = run(20.0, lambda t: 30.0 if 9.0 <= t < 9.6 else 10.0, noise=0.04, seed=3)
    a = analyze_thermal(starts, lats, sensors(20.0), 20.0, window_s=0.5)
    assert onset(a, "latency") is None and onset(a, "first") is None
    assert a.sustained_ratio == pytest.approx(1.0, abs=0.03)
    assert a.stability is not None and a.stability < 0.5  # the spike's windows are the worst ones


def test_recovery_is_not_a_sustained_onset() -> None:
    """Latency that rises and comes back does not 'stay above' the initial level."""
    starts, lats = run(30.0, lambda t: 15.0 if 8.0 <= t < 14.0 else 10.0, noise=0.02)
    a = analyze_thermal(starts, lats, sensors(30.0), 30.0, window_s=1.0)
    assert onset(a, "latency") is None


def test_duty_cycle_ratio_is_about_capacity() -> None:
    starts, lats = run(60.0, lambda t: 4.0 if t < 20 else 8.0, rate=50.0)
    a = analyze_thermal(starts, lats, sensors(60.0), 60.0)
    assert a.sustained_ratio == pytest.approx(0.5, rel=0.01)
    assert onset(a, "latency") == pytest.approx(20.0, abs=0.1)


def test_cap_present_at_start_warns() -> None:
    log = sensors(10.0)
    capped = [
        c
        if c.metric != "freq_cap_mhz"
        else ChannelSeries(c.id, c.metric, c.unit, c.labels, np.full(c.values.shape, 1200.0))
        for c in log.channels
    ]
    log = SensorLog(t=log.t, channels=capped, origin=0.0, period_s=0.25, static=log.static)
    starts, lats = run(10.0, lambda t: 10.0)
    a = analyze_thermal(starts, lats, log, 10.0)
    assert any("already capped at 1200 of 2400 MHz" in w for w in a.warnings)


def test_window_choices() -> None:
    assert choose_window(1200.0) == 10.0
    assert choose_window(20.0) == 2.0
    assert choose_window(20.0, 0.5) == 0.5
    assert len(window_bounds(20.0, 3.0)) == 7  # 20/3 rounds to 7 equal windows, no sliver
    assert initial_and_steady_spans(1200.0, 10.0) == (30.0, 300.0)
    assert initial_and_steady_spans(20.0, 1.0) == (2.0, 5.0)


def test_records_carry_series_summary_and_raw_samples() -> None:
    starts, lats = run(10.0, lambda t: 10.0 if t < 6.0 else 20.0)
    log = sensors(10.0, cap_at=6.0)
    a = analyze_thermal(starts, lats, log, 10.0, window_s=1.0)
    result = {
        "inferences": {"t": starts.tolist(), "latencies_ms": lats.tolist(), "missed": 0},
        "duration_s": 10.0,
        "load_ms": 5.0,
        "rate_hz": 0.0,
        "clock": {"origin": 100.0},
    }
    ctx = RecordContext(run_id="r", device="d", probe="thermal", model="m", runtime="onnxruntime")
    out = thermal_records(ctx, a, result, log, None)
    by_metric: dict[str, list] = {}
    for r in out.records:
        by_metric.setdefault(r.metric, []).append(r)
    windowed = [r for r in by_metric["latency_ms"] if "t_s" in r.params]
    assert [r.params["t_s"] for r in windowed] == [i + 0.5 for i in range(10)]
    assert len([r for r in by_metric["temp_c"] if "t_s" in r.params]) == 10
    assert {r.params["cpus"] for r in by_metric["freq_mhz"]} == {"0-3"}
    assert {r.params["signal"] for r in by_metric["throttle_onset_s"]} == {"first", "latency", "freq_cap"}
    assert by_metric["stability"][0].params["pass_line"] == 0.97
    assert any("pass line" in w for w in out.warnings)
    raw = {(s.metric, s.params.get("series")): s for s in out.samples}
    assert len(raw[("latency_ms", "inference")].values) == lats.size
    assert raw[("inference_t_s", "inference")].annotations["origin_monotonic_s"] == 100.0
    assert "origin_monotonic_s" not in raw[("inference_t_s", "inference")].params
    assert len(raw[("temp_c", "sensor")].values) == log.t.size


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"duration_s": 0}, "duration_s: must be positive"),
        ({"duration_s": "long"}, "duration_s: expected a number"),
        ({"duration_s": float("inf")}, "duration_s: must be finite"),
        ({"duration_s": 10, "window_s": 20}, "window_s: 20 s is longer than duration_s 10 s"),
        ({"rate_hz": -1}, "rate_hz: must be at least 0"),
    ],
)
def test_bad_params_are_refused_before_the_device(params: dict, message: str) -> None:
    from edgebench.probes.params import ParamError
    from edgebench.probes.registry import PowerParams, ThermalParams

    with pytest.raises(ParamError, match=message):
        ThermalParams.parse(params)
    if "window_s" not in params:
        with pytest.raises(ParamError, match=message):
            PowerParams.parse(params)
    ThermalParams.parse({"duration_s": 20, "window_s": 1, "rate_hz": 5, "margin": 0.2})
    PowerParams.parse({"duration_s": 6, "idle_s": 3, "rate_hz": 0})
