"""Probe `thermal`: a sustained run (20 min by default) after a cool-down, watched window by window.

Per window: p50 latency, the hottest zone's temperature, each frequency domain's clock and cap.
Summary: `throttle_onset_s` (first moment the latency stays above the initial level by `margin`, or
the frequency cap drops; records for each signal and for the first of them), `sustained_ratio`
(steady-state throughput / initial throughput, throughput taken as 1 / median latency so duty-cycle
runs are judged on capacity too) and `stability` (worst window / best window; 0.97 is the pass line).
Every inference (start time, latency) and every sensor reading is kept as raw samples.

The analysis functions are pure (arrays in, numbers out) and unit-tested on their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..agent.protocol import ThermalTask
from ..jobs import Job
from ..lab.device import Device
from ..records import ProbeResult, RecordContext
from .common import job_timeout
from .cooldown import CooldownPolicy, CooldownResult, wait_for_cooldown
from .registry import ThermalParams
from .sensing import (
    SensorLog,
    parse_sensor_log,
    sensor_samples,
    start_sustained_run,
    sustained_fields,
    window_mean,
)
from .soak import rss_records

DEFAULT_MARGIN = ThermalParams.margin
STABILITY_PASS = 0.97
MAX_WINDOW_S = 10.0
MIN_WINDOWS = 10
CAP_DROP = 0.01  # a cap 1% under its starting value is a drop, not rounding


@dataclass(frozen=True)
class Window:
    index: int
    start_s: float
    end_s: float
    n: int
    p50_ms: float | None
    temp_c: float | None
    freq_mhz: dict[str, float] = field(default_factory=dict)
    cap_mhz: dict[str, float] = field(default_factory=dict)

    @property
    def t_s(self) -> float:
        """The window's middle: where a plot puts its point."""
        return round((self.start_s + self.end_s) / 2, 4)


@dataclass(frozen=True)
class Onset:
    t_s: float | None
    signal: str  # latency | freq_cap | first
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ThermalAnalysis:
    windows: list[Window]
    window_s: float
    initial_s: float
    steady_s: float
    initial_ms: float
    steady_ms: float
    sustained_ratio: float
    stability: float | None
    onsets: list[Onset]
    margin: float
    max_temp_c: float | None
    start_temp_c: float | None
    end_temp_c: float | None
    warnings: list[str] = field(default_factory=list)


# ---- pure analysis -------------------------------------------------------------------------------
def choose_window(duration_s: float, window_s: float | None = None) -> float:
    """The window length: as asked, else 10 s, shorter for short runs so there are at least 10 windows."""
    if window_s and window_s > 0:
        return float(min(window_s, duration_s))
    return float(min(MAX_WINDOW_S, max(duration_s / MIN_WINDOWS, 0.1)))


def window_bounds(duration_s: float, window_s: float) -> list[tuple[float, float]]:
    """Equal windows covering the run; a short remainder is shared out instead of making a tiny window."""
    count = max(1, int(round(duration_s / window_s)))
    width = duration_s / count
    return [(i * width, (i + 1) * width) for i in range(count)]


def initial_and_steady_spans(duration_s: float, window_s: float) -> tuple[float, float]:
    """Initial level: the first 10% of the run (a window to 30 s); steady state: the last 25%."""
    initial = min(max(window_s, 0.1 * duration_s), max(30.0, window_s))
    steady = max(window_s, 0.25 * duration_s)
    return initial, steady


def latency_onset(
    starts: np.ndarray,
    lats: np.ndarray,
    bounds: list[tuple[float, float]],
    p50s: list[float | None],
    threshold: float,
    hold: int,
) -> float | None:
    """First moment the latency rises above `threshold` and stays there.

    A window counts when its p50 and those of the next `hold - 1` windows are above the threshold and
    the median of all windows from it to the end is too. The moment inside it is the first inference
    from which most of the next window's worth of inferences are slow.
    """
    valid = [(i, p) for i, p in enumerate(p50s) if p is not None]
    for pos, (i, p) in enumerate(valid):
        ahead = [q for _, q in valid[pos : pos + hold]]
        if len(ahead) < hold or p <= threshold or min(ahead) <= threshold:
            continue
        if float(np.median([q for _, q in valid[pos:]])) <= threshold:
            continue
        lo = bounds[valid[pos - 1][0]][0] if pos > 0 else bounds[i][0]
        return refine_onset(starts, lats, lo, bounds[i][1], threshold, bounds[i][1] - bounds[i][0])
    return None


def refine_onset(
    starts: np.ndarray, lats: np.ndarray, lo: float, hi: float, threshold: float, window_s: float
) -> float:
    """Within [lo, hi): the first slow inference after which most of one window's inferences are slow."""
    idx = np.flatnonzero((starts >= lo) & (starts < hi))
    if idx.size == 0:
        return lo
    per_window = max(3, int(np.sum((starts >= hi - window_s) & (starts < hi))))
    slow = (lats > threshold).astype(float)
    csum = np.concatenate([[0.0], np.cumsum(slow)])
    for k in idx.tolist():
        end = min(k + per_window, int(lats.size))
        if slow[k] and (csum[end] - csum[k]) / (end - k) > 0.5:
            return float(starts[k])
    return float(starts[idx[0]])


def freq_cap_onset(t: np.ndarray, caps: dict[str, np.ndarray]) -> tuple[float | None, str | None]:
    """First sample where any frequency domain's cap (scaling_max_freq) fell below its starting value."""
    first: tuple[float | None, str | None] = (None, None)
    for name, series in caps.items():
        ok = ~np.isnan(series)
        if not ok.any():
            continue
        start = series[ok][0]
        dropped = np.flatnonzero(ok & (series < start * (1 - CAP_DROP)))
        if dropped.size and (first[0] is None or t[dropped[0]] < first[0]):
            first = (float(t[dropped[0]]), name)
    return first


def _group_series(log: SensorLog, metric: str) -> dict[str, np.ndarray]:
    return {c.labels.get("cpus", c.id): c.values for c in log.of(metric)}


def analyze_thermal(
    starts: list[float] | np.ndarray,
    lats: list[float] | np.ndarray,
    log: SensorLog,
    duration_s: float,
    window_s: float | None = None,
    margin: float = DEFAULT_MARGIN,
    hold_s: float | None = None,
) -> ThermalAnalysis:
    """Windows, onset, sustained ratio and stability from raw inferences and sensor readings."""
    starts_a, lats_a = np.asarray(starts, dtype=float), np.asarray(lats, dtype=float)
    if lats_a.size == 0:
        raise ValueError("no inferences")
    width = choose_window(duration_s, window_s)
    bounds = window_bounds(duration_s, width)
    width = bounds[0][1] - bounds[0][0]
    hottest = log.hottest()
    freqs, caps = _group_series(log, "freq_mhz"), _group_series(log, "freq_cap_mhz")
    windows = []
    for i, (lo, hi) in enumerate(bounds):
        last = i == len(bounds) - 1
        inside = (starts_a >= lo) & ((starts_a < hi) | last)
        n = int(inside.sum())
        windows.append(
            Window(
                index=i,
                start_s=lo,
                end_s=hi,
                n=n,
                p50_ms=float(np.median(lats_a[inside])) if n else None,
                temp_c=window_mean(log.t, hottest, lo, hi) if log.t.size else None,
                freq_mhz=_window_means(log.t, freqs, lo, hi),
                cap_mhz=_window_means(log.t, caps, lo, hi),
            )
        )
    initial_s, steady_s = initial_and_steady_spans(duration_s, width)
    initial_ms = (
        float(np.median(lats_a[starts_a < initial_s])) if np.any(starts_a < initial_s) else float(lats_a[0])
    )
    steady_mask = starts_a >= duration_s - steady_s
    steady_ms = float(np.median(lats_a[steady_mask])) if steady_mask.any() else float(lats_a[-1])
    p50s = [w.p50_ms for w in windows]
    valid = [p for p in p50s if p is not None]
    stability = (min(valid) / max(valid)) if len(valid) >= 2 and max(valid) > 0 else None
    threshold = initial_ms * (1 + margin)
    hold = max(2, math.ceil((hold_s if hold_s is not None else max(3.0, 0.05 * duration_s)) / width))
    # "Stays above" holds to the end: a run whose steady state is back under the threshold has no onset.
    lat_onset = (
        latency_onset(starts_a, lats_a, bounds, p50s, threshold, hold) if steady_ms > threshold else None
    )
    cap_onset, cap_group = freq_cap_onset(log.t, caps) if log.t.size else (None, None)
    onsets = [
        Onset(lat_onset, "latency", {"threshold_ms": round(threshold, 4), "hold_windows": hold}),
        Onset(cap_onset, "freq_cap", {"cpus": cap_group} if cap_group else {}),
    ]
    seen = [o for o in onsets if o.t_s is not None]
    first = min(seen, key=lambda o: o.t_s or 0.0) if seen else None
    onsets.insert(0, Onset(first.t_s if first else None, "first", {"by": first.signal} if first else {}))
    ok = ~np.isnan(hottest)
    warnings = _thermal_warnings(log, caps)
    return ThermalAnalysis(
        windows=windows,
        window_s=width,
        initial_s=initial_s,
        steady_s=steady_s,
        initial_ms=initial_ms,
        steady_ms=steady_ms,
        sustained_ratio=initial_ms / steady_ms if steady_ms > 0 else float("nan"),
        stability=stability,
        onsets=onsets,
        margin=margin,
        max_temp_c=float(hottest[ok].max()) if ok.any() else None,
        start_temp_c=float(hottest[ok][0]) if ok.any() else None,
        end_temp_c=float(hottest[ok][-1]) if ok.any() else None,
        warnings=warnings,
    )


def _window_means(t: np.ndarray, series: dict[str, np.ndarray], lo: float, hi: float) -> dict[str, float]:
    out = {}
    for name, values in series.items():
        mean = window_mean(t, values, lo, hi) if t.size else None
        if mean is not None:
            out[name] = round(mean, 3)
    return out


def _thermal_warnings(log: SensorLog, caps: dict[str, np.ndarray]) -> list[str]:
    warnings = []
    if not log.of("temp_c"):
        warnings.append(
            "no thermal zone readable: temperatures are missing (check sensors.sysfs_root / "
            "sensors.thermal_zones)"
        )
    if not log.of("freq_mhz"):
        warnings.append("no cpufreq readable: frequencies are missing and a frequency cap cannot be seen")
    limits = log.static.get("cpufreq") or {}
    for name, series in caps.items():
        ok = series[~np.isnan(series)]
        hw_max = (limits.get(name) or {}).get("cpuinfo_max_mhz")
        if ok.size and hw_max and ok[0] < hw_max * (1 - CAP_DROP):
            warnings.append(
                f"CPUs {name} were already capped at {ok[0]:.0f} of {hw_max:.0f} MHz when the run "
                "started (a thermal cap or a lab setting)"
            )
    if log.late_ticks:
        warnings.append(f"the sensor sampler missed {log.late_ticks} ticks (the device was saturated)")
    return warnings


# ---- the probe -----------------------------------------------------------------------------------
def thermal_task(
    params: ThermalParams, device: Device, runtime: str, model: str, inputs: str | None
) -> ThermalTask:
    return ThermalTask(**sustained_fields(params, device, runtime, model, inputs))


def cooldown_policy(params: ThermalParams) -> CooldownPolicy | None:
    """None when the job turns the guard off (cooldown_timeout_s = 0 or cooldown = false)."""
    if not params.cooldown or params.cooldown_timeout_s <= 0:
        return None
    return CooldownPolicy(
        margin_c=params.cooldown_margin_c,
        timeout_s=params.cooldown_timeout_s,
        period_s=params.cooldown_period_s,
        min_observe_s=params.cooldown_observe_s,
    )


def guard(device: Device, params: ThermalParams, out: ProbeResult) -> CooldownResult | None:
    policy = cooldown_policy(params)
    if policy is None:
        return None
    result = wait_for_cooldown(device, policy, params.idle_c)
    if not result.cooled:
        out.warnings.append(result.describe())
    return result


def run_thermal(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = ThermalParams.of(job)
    runtime, remote_model, remote_inputs = start_sustained_run(device, job, ctx, params)
    out = ProbeResult()
    cool = guard(device, params, out)
    task = thermal_task(params, device, runtime, remote_model, remote_inputs)
    reply = device.run_agent(task, timeout=task.duration_s + job_timeout(device, job))
    out.warnings += reply.warnings
    r = reply.result
    log = parse_sensor_log(r["sensors"])
    inf = r["inferences"]
    analysis = analyze_thermal(
        inf["t"],
        inf["latencies_ms"],
        log,
        task.duration_s,
        params.window_s,
        params.margin,
        params.hold_s,
    )
    out.extend(thermal_records(ctx, analysis, r, log, cool))
    return out


def thermal_records(
    ctx: RecordContext, a: ThermalAnalysis, r: dict[str, Any], log: SensorLog, cool: CooldownResult | None
) -> ProbeResult:
    """Per-window series, the summary, and every raw inference and sensor reading."""
    out = ProbeResult(warnings=list(a.warnings) + list(log.warnings))
    inf = r["inferences"]
    if inf.get("missed"):
        out.warnings.append(
            f"{inf['missed']} inferences started late at rate {r.get('rate_hz'):g} Hz: the model "
            "is slower than the duty cycle allows"
        )
    for w in a.windows:
        # t_s places the point; every other param is the same along a series (a report draws it as one line).
        at = {"t_s": w.t_s, "window_s": round(a.window_s, 4)}
        if w.p50_ms is not None:
            out.records.append(ctx.record("latency_ms", w.p50_ms, "ms", stat="p50", **at))
        if w.temp_c is not None:
            out.records.append(ctx.record("temp_c", w.temp_c, "C", zone="max", **at))
        for cpus, mhz in w.freq_mhz.items():
            out.records.append(ctx.record("freq_mhz", mhz, "MHz", cpus=cpus, **at))
        for cpus, mhz in w.cap_mhz.items():
            out.records.append(ctx.record("freq_cap_mhz", mhz, "MHz", cpus=cpus, **at))
    out.records += rss_records(ctx, r.get("rss"))  # resident memory over the run, as soak records it
    # Params name what was measured (signal, spans, pass line), never measured values, so runs pair up.
    for onset in a.onsets:
        out.records.append(
            ctx.record("throttle_onset_s", onset.t_s, "s", signal=onset.signal, margin=a.margin)
        )
    spans = {"initial_s": round(a.initial_s, 3), "steady_s": round(a.steady_s, 3)}
    out.records.append(ctx.record("sustained_ratio", a.sustained_ratio, "ratio", **spans))
    out.records.append(ctx.record("latency_ms", a.initial_ms, "ms", stat="p50", phase="initial", **spans))
    out.records.append(ctx.record("latency_ms", a.steady_ms, "ms", stat="p50", phase="steady", **spans))
    if a.stability is not None:
        out.records.append(ctx.record("stability", a.stability, "ratio", pass_line=STABILITY_PASS))
        if a.stability < STABILITY_PASS:
            out.warnings.append(
                f"stability {a.stability:.3f} is under the {STABILITY_PASS} pass line "
                "(worst window / best window)"
            )
    for stat, value in (("start", a.start_temp_c), ("end", a.end_temp_c), ("max", a.max_temp_c)):
        if value is not None:
            out.records.append(ctx.record("temp_c", value, "C", zone="max", stat=stat))
    ran = {"duration_s": r["duration_s"]}
    out.records.append(ctx.record("samples_n", len(inf["latencies_ms"]), "count", annotations=ran))
    out.records.append(ctx.record("load_ms", r["load_ms"], "ms"))
    if cool is not None:
        margin = {"margin_c": cool.margin_c}
        out.records.append(ctx.record("cooldown_s", cool.waited_s, "s", annotations=margin))
    out.samples.append(ctx.samples("latency_ms", "ms", inf["latencies_ms"], series="inference"))
    out.samples.append(
        ctx.samples(
            "inference_t_s",
            "s",
            inf["t"],
            annotations={"origin_monotonic_s": r["clock"]["origin"]},
            series="inference",
        )
    )
    out.samples += sensor_samples(ctx, log)
    return out
