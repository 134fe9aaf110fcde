"""Sustained-load tasks: `thermal` (soak with sensors), `power` (idle / active / idle with a power
sensor), `idle` (the cool-down guard's wait, done on the device), `sample` (read sensors for a while).

Every timestamp is seconds since the task's origin on this device's monotonic clock; the result's
`clock` block gives the origin and the task's own start and end on that clock so the host can line up
samples taken elsewhere (an external power monitor).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from .bench import first_inference, import_then_pin, load
from .main import TaskError
from .selfcheck import check_outputs, pristine_copy
from .sensors import CHARGING_STATUSES, DEFAULT_PERIOD_S, Sampler, SensorSet, battery_status, discover
from .soak import RssSampler
from .timing import TimingPolicy, refresher, warm_up


# ---- load ----------------------------------------------------------------------------------------
def run_load(step: Callable[[], object], duration_s: float, rate_hz: float, origin: float) -> dict[str, Any]:
    """Inferences for `duration_s`: back-to-back, or at `rate_hz` with idle gaps (a duty cycle).

    Returns start times (s since origin) and latencies (ms); `missed` counts inferences that started
    more than one period late because the previous ones ran long.
    """
    starts: list[float] = []
    latencies: list[float] = []
    missed = 0
    period = 1.0 / rate_hz if rate_hz > 0 else 0.0
    refresh = refresher(step)
    begin = time.monotonic()
    end = begin + duration_s
    index = 0
    while True:
        if period:
            target = begin + index * period
            if target >= end:
                break
            now = time.monotonic()
            if target > now:
                time.sleep(target - now)
            elif now - target > period:
                missed += 1
        refresh()
        t0 = time.monotonic()
        c0 = time.perf_counter_ns()
        step()
        c1 = time.perf_counter_ns()
        starts.append(round(t0 - origin, 6))
        latencies.append(round((c1 - c0) / 1e6, 5))
        index += 1
        if not period and t0 + (c1 - c0) / 1e9 >= end:
            break
    return {
        "t": starts,
        "latencies_ms": latencies,
        "missed": missed,
        "begin": begin - origin,
        "end": time.monotonic() - origin,
    }


def prepare_model(
    task: dict, warnings: list[str], imported: dict[str, Any] | None = None
) -> tuple[Callable[[], object], dict[str, Any], Callable[[], str]]:
    """Load the model, run it once, warm it up; returns the step, what loading cost, and the output
    self-check to call once the sustained runs are over."""
    session, feeds, cost = load(task, warnings, imported)
    pristine = pristine_copy(feeds)
    step = session.prepare(feeds)
    first_ms = first_inference(step)
    policy = TimingPolicy(
        warmup=int(task.get("warmup", 1)),
        warmup_seconds=float(task.get("warmup_seconds", 0.5)),
        max_seconds=max(1.0, float(task.get("warmup_seconds", 0.5)) * 4),
    )
    calls, seconds = warm_up(step, policy)
    return (
        step,
        {
            "runtime": session.runtime,
            "runtime_version": session.version,
            "import_ms": cost.get("import_ms"),
            "load_ms": cost["load_ms"],
            "first_inference_ms": first_ms,
            "warmup": calls,
            "warmup_seconds": seconds,
            "threads": int(task.get("threads", 0)),
            "effective_threads": getattr(session, "effective_threads", None),
        },
        lambda: check_outputs(session.runtime, session, step, feeds, pristine),
    )


def sensor_config(task: dict) -> dict[str, Any]:
    return dict(task.get("sensors") or {})


def _period(task: dict) -> float:
    return float(task.get("period_s") or sensor_config(task).get("period_s") or DEFAULT_PERIOD_S)


def _clock(task_start: float, origin: float) -> dict[str, float]:
    return {"start": task_start, "origin": origin, "end": time.monotonic()}


# ---- thermal -------------------------------------------------------------------------------------
def run_thermal(task: dict) -> tuple[dict, list[str]]:
    task_start = time.monotonic()
    warnings: list[str] = []
    affinity, imported = import_then_pin(task)
    sensors = discover(sensor_config(task))
    warnings += sensors.warnings
    step, model, self_check = prepare_model(task, warnings, imported)
    origin = time.monotonic()
    sampler = Sampler(sensors, _period(task), origin, dumpsys=bool(task.get("dumpsys", True))).start()
    rss = RssSampler(max(1.0, _period(task)), origin).start()
    try:
        load_log = run_load(step, float(task["duration_s"]), float(task.get("rate_hz") or 0), origin)
    finally:
        sensor_log = sampler.stop()
        rss_log = rss.stop()
    model["self_check"] = self_check()
    return {
        "rss": rss_log,
        **model,
        "affinity": affinity,
        "duration_s": float(task["duration_s"]),
        "rate_hz": float(task.get("rate_hz") or 0),
        "inferences": load_log,
        "sensors": sensor_log,
        "clock": _clock(task_start, origin),
    }, warnings


# ---- power ---------------------------------------------------------------------------------------
def power_source(sensors: SensorSet, task: dict) -> dict[str, Any]:
    """Which channels measure the device's power: the descriptor's files, else a battery, else hwmon rails."""
    if task.get("monitor"):
        return {"kind": "monitor", "channels": []}
    ids = [c.id for c in sensors.channels if c.labels.get("source") == "descriptor"]
    if ids:
        battery = any("/power_supply/" in c.path for c in sensors.channels if c.id in ids)
        return {"kind": "battery" if battery else "descriptor", "channels": ids}
    batteries = [
        c for c in sensors.channels if "supply" in c.labels and c.metric in ("current_ma", "power_mw")
    ]
    if batteries:
        supply = batteries[0].labels["supply"]
        return {
            "kind": "battery",
            "supply": supply,
            "channels": [c.id for c in sensors.channels if c.labels.get("supply") == supply],
        }
    rails = usable_rails(sensors)
    if rails:
        return {"kind": "rail", "channels": rails}
    return {"kind": "none", "channels": []}


def usable_rails(sensors: SensorSet) -> list[str]:
    """Channels of the hwmon rails that give power: a power reading, or a current with its voltage.

    Many hwmon chips only monitor voltages (or temperatures); those rails cannot measure power.
    """
    by_rail: dict[tuple[str, str], dict[str, str]] = {}
    for c in sensors.channels:
        if "rail" in c.labels:
            by_rail.setdefault((c.labels["chip"], c.labels["channel"]), {})[c.metric] = c.id
    ids = []
    for metrics in by_rail.values():
        if "power_mw" in metrics or ("current_ma" in metrics and "voltage_v" in metrics):
            ids += list(metrics.values())
    return ids


def refuse_if_charging(sensors: SensorSet, source: dict[str, Any]) -> None:
    if source["kind"] != "battery":
        return
    status, supply = battery_status(sensors)
    if status in CHARGING_STATUSES:
        raise TaskError(
            "charging",
            f"battery '{supply}' reports status '{status}': its fuel gauge cannot "
            "measure the device's power while external power is connected",
        )


def run_power(task: dict) -> tuple[dict, list[str]]:
    task_start = time.monotonic()
    warnings: list[str] = []
    affinity, imported = import_then_pin(task)
    sensors = discover(sensor_config(task))
    warnings += sensors.warnings
    source = power_source(sensors, task)
    if source["kind"] == "none":
        raise TaskError(
            "no_power_sensor",
            f"no power sensor under {sensors.root}: no battery fuel gauge "
            "(power_supply current_now or power_now) and no hwmon rail with power or current",
        )
    refuse_if_charging(sensors, source)
    idle_before, idle_after = (
        float(task.get("idle_s", 10.0)),
        float(task.get("idle_after_s", task.get("idle_s", 10.0))),
    )
    origin = time.monotonic()
    sampler = Sampler(sensors, _period(task), origin, dumpsys=False).start()
    phases: dict[str, list[float]] = {}
    try:
        phases["idle_before"] = idle_phase(idle_before, origin)
        load_start = time.monotonic() - origin
        step, model, self_check = prepare_model(task, warnings, imported)
        phases["load"] = [load_start, time.monotonic() - origin]
        load_log = run_load(step, float(task["duration_s"]), float(task.get("rate_hz") or 0), origin)
        phases["active"] = [load_log["begin"], load_log["end"]]
        phases["idle_after"] = idle_phase(idle_after, origin)
    finally:
        sensor_log = sampler.stop()
    model["self_check"] = self_check()  # after the idle phase: its inference must not show in idle power
    return {
        **model,
        "affinity": affinity,
        "duration_s": float(task["duration_s"]),
        "rate_hz": float(task.get("rate_hz") or 0),
        "source": source,
        "phases": phases,
        "inferences": load_log,
        "sensors": sensor_log,
        "clock": _clock(task_start, origin),
    }, warnings


def idle_phase(seconds: float, origin: float) -> list[float]:
    start = time.monotonic()
    time.sleep(max(0.0, seconds))
    return [start - origin, time.monotonic() - origin]


# ---- cool-down -----------------------------------------------------------------------------------
def _fit_at(times: list[float], temps: list[float], tau: float) -> tuple[float, float, float]:
    """Least-squares a, b of T = a + b*exp(-(t - t0)/tau) for a fixed tau; returns (sse, a, b)."""
    n = len(times)
    xs = [math.exp(-(t - times[0]) / tau) for t in times]
    mx, my = sum(xs) / n, sum(temps) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 1e-12:
        return math.inf, my, 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, temps, strict=True)) / sxx
    a = my - b * mx
    return sum((a + b * x - y) ** 2 for x, y in zip(xs, temps, strict=True)), a, b


def settle_estimate(times: list[float], temps: list[float]) -> tuple[float, bool]:
    """Where an idle zone's temperature is heading: the asymptote of T = a + b*exp(-t/tau).

    Newton cooling fitted by least squares: a coarse grid of time constants, then a golden-section
    search around the best (no numpy on the device). Returns (asymptote, cooling); when the zone is
    flat or warming the asymptote is its last reading.
    """
    if len(times) < 3 or times[-1] - times[0] <= 0:
        return temps[-1], False
    span = times[-1] - times[0]
    grid = [math.log(span / 20.0) + k * math.log(1.18) for k in range(40)]  # tau: span/20 .. ~30 x span
    scores = [_fit_at(times, temps, math.exp(g))[0] for g in grid]
    k = min(range(len(grid)), key=scores.__getitem__)
    lo, hi = grid[max(0, k - 1)], grid[min(len(grid) - 1, k + 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(25):
        m1, m2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if _fit_at(times, temps, math.exp(m1))[0] < _fit_at(times, temps, math.exp(m2))[0]:
            hi = m2
        else:
            lo = m1
    sse, a, b = _fit_at(times, temps, math.exp((lo + hi) / 2))
    if not math.isfinite(sse) or b <= 0:
        return temps[-1], False
    return min(a, temps[-1]), True


def cooldown_verdict(
    times: list[float],
    zones: dict[str, list[float]],
    margin_c: float,
    min_observe_s: float,
    idle_c: dict[str, float] | float | None = None,
    history_s: float = 120.0,
) -> dict[str, Any]:
    """Is the hottest zone within `margin_c` of its idle reading?

    The idle reading is given (`idle_c`: per zone, or one figure for whichever zone is hottest, e.g.
    from an earlier measurement) or estimated from the zone's own
    cooling curve once `min_observe_s` of readings exist. Pure function: unit-tested on the host.
    """
    if not zones or not times:
        return {"cooled": True, "reason": "no thermal zones", "zone": None, "temp_c": None, "idle_c": {}}
    latest = {z: v[-1] for z, v in zones.items()}
    hottest = max(latest, key=lambda z: latest[z])
    given = idle_c if isinstance(idle_c, dict) else {hottest: float(idle_c)} if idle_c is not None else {}
    if hottest in given:
        ref = given[hottest]
        cooled = latest[hottest] <= ref + margin_c
        return {
            "cooled": cooled,
            "reason": "given idle reading",
            "zone": hottest,
            "temp_c": latest[hottest],
            "idle_c": dict(given),
        }
    if times[-1] - times[0] < min_observe_s:
        return {
            "cooled": False,
            "reason": "observing",
            "zone": hottest,
            "temp_c": latest[hottest],
            "idle_c": {},
        }
    ref = zone_idle_estimates(times, {hottest: zones[hottest]}, history_s)[hottest]
    cooled = latest[hottest] - ref <= margin_c
    return {
        "cooled": cooled,
        "reason": "estimated idle reading",
        "zone": hottest,
        "temp_c": latest[hottest],
        "idle_c": {hottest: ref},
    }


def zone_idle_estimates(
    times: list[float], zones: dict[str, list[float]], history_s: float = 120.0, points: int = 60
) -> dict[str, float]:
    """Each zone's idle reading, estimated from (at most `points` of) its last `history_s` of readings."""
    keep = [i for i, t in enumerate(times) if t >= times[-1] - history_s]
    keep = keep[:: max(1, math.ceil(len(keep) / points))] if len(keep) > points else keep
    if keep and keep[-1] != len(times) - 1:
        keep.append(len(times) - 1)
    return {
        zone: settle_estimate([times[i] for i in keep], [series[i] for i in keep])[0]
        for zone, series in zones.items()
    }


def run_idle(task: dict) -> tuple[dict, list[str]]:
    """Wait, idle, until the hottest zone is within the margin of its idle reading (or the timeout)."""
    sensors = discover(sensor_config(task))
    warnings = list(sensors.warnings)
    margin, timeout = float(task.get("margin_c", 2.0)), float(task.get("timeout_s", 600.0))
    period, min_observe = float(task.get("period_s", 1.0)), float(task.get("min_observe_s", 10.0))
    idle_c = task.get("idle_c")
    origin = time.monotonic()
    times: list[float] = []
    zones: dict[str, list[float]] = {}
    verdict: dict[str, Any] = {}
    while True:
        temps = sensors.read_temps()
        now = time.monotonic() - origin
        if temps:
            times.append(round(now, 3))
            for zone, value in temps.items():
                series = zones.setdefault(zone, [value] * (len(times) - 1))
                series.append(value)
            for series in zones.values():
                if len(series) < len(times):  # a zone that failed this time repeats its last reading
                    series.append(series[-1])
        verdict = cooldown_verdict(times, zones, margin, min_observe, idle_c)
        if verdict["cooled"] or now >= timeout:
            break
        time.sleep(min(period, max(0.0, timeout - now)))
    hottest = verdict.get("zone")
    if verdict.get("reason") == "estimated idle reading":
        # Every zone's idle reading, once, so the caller can pass them to the next guard.
        verdict["idle_c"] = {**zone_idle_estimates(times, zones), **verdict["idle_c"]}
    return {
        **verdict,
        "waited_s": time.monotonic() - origin,
        "timeout_s": timeout,
        "margin_c": margin,
        "t": times,
        "hottest": zones.get(hottest, []) if hottest else [],
        "zones": sorted(zones),
    }, warnings


# ---- sample --------------------------------------------------------------------------------------
def run_sample(task: dict) -> tuple[dict, list[str]]:
    """Read every sensor for `duration_s` (0: one reading)."""
    task_start = time.monotonic()
    sensors = discover(sensor_config(task))
    origin = time.monotonic()
    sampler = Sampler(sensors, _period(task), origin, dumpsys=bool(task.get("dumpsys", False))).start()
    time.sleep(max(0.0, float(task.get("duration_s", 0.0))))
    log = sampler.stop()
    return {"sensors": log, "clock": _clock(task_start, origin)}, list(sensors.warnings)


def run(task: dict) -> tuple[dict, list[str]]:
    handlers = {"thermal": run_thermal, "power": run_power, "idle": run_idle, "sample": run_sample}
    return handlers[task["kind"]](task)
