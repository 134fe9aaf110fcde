"""Power analysis: sign calibration, charging refusal, idle subtraction, rails, external monitor lines."""

from __future__ import annotations

import numpy as np
import pytest

from edgebench.probes.power import (
    ChargingError,
    PowerSeries,
    analyze_power,
    battery_series,
    calibrate_sign,
    monitor_argv,
    monitor_series,
    parse_monitor_lines,
    rail_series,
)
from edgebench.probes.sensing import ChannelSeries, SensorLog

PHASES = {"idle_before": [0.0, 5.0], "load": [5.0, 5.5], "active": [5.5, 15.5], "idle_after": [15.5, 20.5]}


def draw_ma(t: np.ndarray, idle: float = 150.0, extra: float = 600.0) -> np.ndarray:
    active = (t >= PHASES["active"][0]) & (t <= PHASES["active"][1])
    return np.where(active, idle + extra, idle)


def gauge_log(
    sign: int = -1,
    status: str | None = "Discharging",
    charge_ma: float = 0.0,
    noise: float = 2.0,
    volts: float = 3.8,
) -> SensorLog:
    """A fuel gauge sampled at 4 Hz; `sign` is the kernel's sign for discharge."""
    t = np.arange(0.0, 20.5, 0.25)
    rng = np.random.default_rng(1)
    current = sign * (draw_ma(t) - charge_ma) + noise * rng.standard_normal(t.size)
    status_log = {"status:battery": [(0.0, status)]} if status else {}
    return SensorLog(
        t=t,
        origin=0.0,
        period_s=0.25,
        status=status_log,
        channels=[
            ChannelSeries("current:battery", "current_ma", "mA", {"supply": "battery"}, current),
            ChannelSeries("voltage:battery", "voltage_v", "V", {"supply": "battery"}, np.full(t.size, volts)),
        ],
    )


IDS = ["current:battery", "voltage:battery"]


@pytest.mark.parametrize("sign", [-1, 1])
def test_sign_is_calibrated_from_the_load(sign: int) -> None:
    log = gauge_log(sign=sign, status="Unknown")
    series = battery_series(log, IDS, PHASES, 0.5)
    assert series.sign == sign and series.sign_method == "load"
    a = analyze_power(series, PHASES, inferences=1000, trim_s=0.5)
    assert a.idle_mw == pytest.approx(150 * 3.8, rel=0.01)
    assert a.net_mw == pytest.approx(600 * 3.8, rel=0.01)
    assert a.net_current_ma == pytest.approx(600, rel=0.01)
    # net power x active time / inferences: 2280 mW x 10 s / 1000
    assert a.energy_mj_per_inference == pytest.approx(22.8, rel=0.01)
    assert a.counts["active"] == pytest.approx(40 - 2 * 2, abs=1)  # 0.5 s trimmed at each edge
    assert a.sample_rate_hz == pytest.approx(4.0)


def test_charging_by_sign_is_refused() -> None:
    """A charger pushing 1.5 A while the device draws 150-750 mA: the idle current flows into the battery."""
    log = gauge_log(sign=-1, status="Unknown", charge_ma=1500.0)
    with pytest.raises(ChargingError, match="sign says it is charging.*USB power"):
        battery_series(log, IDS, PHASES, 0.5)


def test_sign_from_status_when_the_load_is_too_small() -> None:
    t = np.arange(0.0, 20.5, 0.25)
    sign, how, charging = calibrate_sign(np.full(t.size, 300.0), t, PHASES, "Discharging", 0.5)
    assert (sign, how, charging) == (1, "status", False)
    sign, how, _ = calibrate_sign(np.full(t.size, 300.0), t, PHASES, None, 0.5)
    assert (sign, how) == (-1, "assumed")


def test_assumed_sign_is_a_warning() -> None:
    t = np.arange(0.0, 20.5, 0.25)
    log = SensorLog(
        t=t,
        origin=0.0,
        period_s=0.25,
        channels=[
            ChannelSeries(
                "current:battery", "current_ma", "mA", {"supply": "battery"}, np.full(t.size, -200.0)
            ),
            ChannelSeries("voltage:battery", "voltage_v", "V", {"supply": "battery"}, np.full(t.size, 4.0)),
        ],
    )
    a = analyze_power(battery_series(log, IDS, PHASES, 0.5), PHASES, 10, 0.5)
    assert any("assumed the modern convention" in w for w in a.warnings)
    assert any("not above idle" in w for w in a.warnings)


def test_idle_drift_cancels_and_is_reported() -> None:
    t = np.arange(0.0, 20.5, 0.25)
    power = 500.0 + 10.0 * t + np.where((t >= 5.5) & (t <= 15.5), 1000.0, 0.0)  # linear drift + load
    a = analyze_power(PowerSeries(t, power, "test"), PHASES, 100, 0.5)
    assert a.net_mw == pytest.approx(1000.0, rel=0.01)
    assert any("drifted" in w for w in a.warnings)


def test_the_warm_up_tail_a_gauge_still_shows_does_not_lift_the_idle_baseline() -> None:
    t = np.arange(0.0, 20.5, 0.25)
    power = 575.0 + np.where((t >= 5.5) & (t <= 15.5), 2250.0, 0.0)
    power[t == 0.5] = 895.0  # the first idle reading after the trim: the gauge's filter lags the warm-up
    a = analyze_power(PowerSeries(t, power, "test"), PHASES, 100, 0.5)
    assert a.idle_before_mw == pytest.approx(575.0) and a.idle_mw == pytest.approx(575.0)
    assert a.net_mw == pytest.approx(2250.0)


def test_no_samples_in_a_phase_is_a_measurement_error() -> None:
    from edgebench.errors import MeasurementError

    t = np.array([0.5, 1.0, 19.0])
    with pytest.raises(MeasurementError, match="active phase"):
        analyze_power(PowerSeries(t, np.ones(3), "test"), PHASES, 10, 0.1)


def test_largest_rail_is_the_input() -> None:
    t = np.arange(0.0, 20.5, 0.25)
    chans = []
    for ch, label, scale in (("1", "VDD_IN", 1.0), ("2", "VDD_CPU", 0.6)):
        labels = {"rail": f"ina3221/{label}", "chip": "hwmon0", "channel": ch}
        chans.append(ChannelSeries(f"power_mw:{label}", "power_mw", "mW", labels, scale * draw_ma(t) * 5.0))
        chans.append(ChannelSeries(f"voltage_v:{label}", "voltage_v", "V", labels, np.full(t.size, 5.0)))
    log = SensorLog(t=t, channels=chans, origin=0.0, period_s=0.25)
    series = rail_series(log, [c.id for c in chans], PHASES, 0.5)
    assert series.source == "rail:ina3221/VDD_IN"
    assert analyze_power(series, PHASES, 100, 0.5).net_mw == pytest.approx(3000.0, rel=0.01)


# ---- external monitor ----------------------------------------------------------------------------
def test_monitor_header_formats_and_units() -> None:
    lines = [(10.0, "time (s), power (W)\n"), (10.1, "0.0, 1.5\n"), (10.2, "0.1, 1.6\n")]
    _, power = parse_monitor_lines(lines)
    assert power.tolist() == pytest.approx([1500.0, 1600.0])
    lines = [(0.0, "t_s,current_ma,voltage_v"), (0.1, "0.0,100,4.0"), (0.2, "garbage"), (0.3, "0.2,200,4.0")]
    _, power = parse_monitor_lines(lines)
    assert power.tolist() == pytest.approx([400.0, 800.0])


def test_monitor_positional_and_buffered_timestamps() -> None:
    """Lines of a block-buffered monitor arrive together; their own timestamps still place them."""
    lines = [(5.0, f"{0.1 * i:.1f} {1000 + i}") for i in range(10)]  # 10 samples, arrive at once
    lines += [(6.0, f"{1.0 + 0.1 * i:.1f} {2000 + i}") for i in range(10)]
    host_t, power = parse_monitor_lines(lines)
    # smallest arrival - stamp gap: 5.0 - 0.9 -> the monitor's t=0 is host 4.1
    assert host_t[0] == pytest.approx(4.1) and host_t[-1] == pytest.approx(6.0)
    assert power[0] == 1000 and power[-1] == 2009
    only_power = parse_monitor_lines([(1.0, "250"), (2.0, "260")])
    assert only_power[0].tolist() == [1.0, 2.0]


def test_monitor_series_maps_host_time_to_the_device_clock() -> None:
    lines = [(100.0 + 0.5 * i, f"{0.5 * i} {1000}") for i in range(10)]
    # Device: task clock origin 50.0, the task ended at device 55.0; the host saw the call end at 105.0.
    series, uncertainty = monitor_series(lines, {"start": 49.9, "origin": 50.0, "end": 55.0}, (99.0, 105.0))
    assert series.t[0] == pytest.approx(0.0) and series.source == "monitor"
    assert uncertainty == pytest.approx(6.0 - 5.1)


def test_monitor_argv_accepts_a_command_line() -> None:
    assert monitor_argv(("joulescope-log --rate 1000 -",)) == ["joulescope-log", "--rate", "1000", "-"]
    assert monitor_argv(("mon", "--rate", "1 k")) == ["mon", "--rate", "1 k"]
