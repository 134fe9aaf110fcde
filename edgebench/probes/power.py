"""Probe `power`: idle baseline, active inference, idle again; power and energy net of idle.

    power_mw                 = mean active power - mean idle power (idle = average of before and after,
                               so a linear drift cancels)
    energy_mj_per_inference  = power_mw x active seconds / inferences

Sources, in order: an external monitor (`sensors.power.monitor`, a command on the controller host that
prints timestamped samples: Monsoon, Joulescope and INA boards are driven that way), the descriptor's
current/voltage files, the battery fuel gauge, the largest hwmon rail (the board's input).

The fuel gauge only sees the device's draw when nothing else feeds it: a battery that is charging
(status, or a current whose sign says energy flows in) is refused. Which sign means "discharging"
differs between kernels (modern ones report discharge as negative), so it is calibrated per run from
the direction the load moves the current, or from the status.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..agent.protocol import PowerTask
from ..errors import LabError, MeasurementError, UserError
from ..jobs import Job
from ..lab.device import Device
from ..records import ProbeResult, RecordContext
from .common import job_timeout
from .registry import PowerParams
from .sensing import (
    SensorLog,
    parse_sensor_log,
    sensor_samples,
    start_sustained_run,
    sustained_fields,
)

CHARGING_STATUSES = ("Charging", "Full", "Not charging")
CHARGING_HINT = (
    "cut the device's USB power (a switchable hub; adb over Wi-Fi) or measure with an external "
    "power monitor (sensors.power.monitor in the descriptor)"
)
PHASES = ("idle_before", "active", "idle_after")


class ChargingError(LabError):
    """The battery is being charged, so its fuel gauge cannot measure the device's draw."""


# ---- series --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PowerSeries:
    """Power over time on the device's clock (s since the task's origin), from one source."""

    t: np.ndarray
    power_mw: np.ndarray
    source: str
    current_ma: np.ndarray | None = None  # discharge-positive
    voltage_v: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)
    sign: int = 1
    sign_method: str = ""


def phase_mask(t: np.ndarray, span: list[float] | tuple[float, float], trim_s: float) -> np.ndarray:
    """Readings inside a phase, minus `trim_s` at each edge (sensor lag, filtering, clock alignment)."""
    lo, hi = float(span[0]), float(span[1])
    trim = min(trim_s, 0.25 * max(0.0, hi - lo))
    return (t >= lo + trim) & (t <= hi - trim)


def _mean_se(x: np.ndarray) -> tuple[float, float]:
    x = x[~np.isnan(x)]
    if x.size == 0:
        return float("nan"), float("inf")
    se = float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else float("inf")
    return float(x.mean()), se


def calibrate_sign(
    raw_ma: np.ndarray, t: np.ndarray, phases: dict[str, list[float]], status: str | None, trim_s: float
) -> tuple[int, str, bool]:
    """(discharge sign, how it was found, charging?) for a fuel gauge's signed current.

    Load always draws more, so the direction the active phase moves the reading is "discharge".
    Without a clear move, a "Discharging" status makes the idle reading's sign the discharge sign;
    otherwise the modern convention (discharge negative) is assumed. The battery is charging when,
    with the sign known from the load, the idle current flows the other way.
    """
    idle = np.concatenate(
        [raw_ma[phase_mask(t, phases[p], trim_s)] for p in ("idle_before", "idle_after") if p in phases]
    )
    active = raw_ma[phase_mask(t, phases["active"], trim_s)]
    idle_mean, idle_se = _mean_se(idle)
    act_mean, act_se = _mean_se(active)
    delta = act_mean - idle_mean
    noise = float(np.hypot(idle_se, act_se)) if np.isfinite(idle_se) and np.isfinite(act_se) else 0.0
    load_sign = _clear_sign(delta, noise)
    idle_sign = _clear_sign(idle_mean, idle_se if np.isfinite(idle_se) else 0.0)
    if load_sign:
        return load_sign, "load", idle_sign == -load_sign
    if status == "Discharging" and idle_sign:
        return idle_sign, "status", False
    return -1, "assumed", False


def _clear_sign(value: float, noise: float) -> int:
    """The sign of `value` when it stands clear of the noise (4 standard errors and 0.5 mA), else 0."""
    if not np.isfinite(value) or abs(value) <= max(4 * noise, 0.5):
        return 0
    return int(np.sign(value))


def battery_series(
    log: SensorLog, ids: list[str], phases: dict[str, list[float]], trim_s: float
) -> PowerSeries:
    """Power from a fuel gauge (or descriptor files): V x I with the calibrated sign, or its power file."""
    chans = log.by_id(ids)
    power = next((c for c in chans if c.metric == "power_mw"), None)
    current = next((c for c in chans if c.metric == "current_ma"), None)
    voltage = next((c for c in chans if c.metric == "voltage_v"), None)
    if voltage is None and current is not None:
        # Descriptor named only the current: take the voltage of the battery it belongs to, if any.
        voltage = next((c for c in log.of("voltage_v") if "supply" in c.labels), None)
    known = current or power or voltage
    name = known.labels.get("supply") if known is not None else None
    source = f"battery:{name}" if name else "descriptor"
    status = _battery_status(log)
    if current is not None and voltage is not None:
        sign, how, charging = calibrate_sign(current.values, log.t, phases, status, trim_s)
        if charging:
            raise ChargingError(
                f"the battery current's sign says it is charging (status '{status or 'unknown'}'): "
                f"{CHARGING_HINT}"
            )
        amps = sign * current.values
        notes = (
            []
            if how != "assumed"
            else [
                "could not calibrate the current's sign (the load did not move it); "
                "assumed the modern convention, discharge negative"
            ]
        )
        return PowerSeries(log.t, amps * voltage.values, source, amps, voltage.values, notes, sign, how)
    if power is not None:
        return PowerSeries(log.t, np.abs(power.values), source, notes=[], sign=1, sign_method="power file")
    missing = "voltage" if current is not None else "current"
    raise UserError(
        f"the power sensor has no {missing} reading: set sensors.power.{missing} in the descriptor"
    )


def _battery_status(log: SensorLog) -> str | None:
    """The battery's status when the run started."""
    for key, changes in log.status.items():
        if key.startswith("status:") and changes:
            return changes[0][1]
    return None


def rail_series(log: SensorLog, ids: list[str], phases: dict[str, list[float]], trim_s: float) -> PowerSeries:
    """The hwmon rail drawing the most while active: with nested rails (VDD_CPU inside VDD_IN), the input."""
    rails: dict[str, dict[str, np.ndarray]] = {}
    names: dict[str, str] = {}
    for c in log.by_id(ids):
        key = f"{c.labels.get('chip')}:{c.labels.get('channel')}"
        rails.setdefault(key, {})[c.metric] = c.values
        names.setdefault(key, c.labels.get("rail", key))
    best: PowerSeries | None = None
    best_mean = -np.inf
    active = phase_mask(log.t, phases["active"], trim_s)
    for key, rail in rails.items():
        if "power_mw" in rail:
            p = np.abs(rail["power_mw"])
        elif "current_ma" in rail and "voltage_v" in rail:
            p = np.abs(rail["current_ma"] * rail["voltage_v"])
        else:
            continue
        mean = float(np.nanmean(p[active])) if active.any() else -np.inf
        if mean > best_mean:
            best_mean, best = (
                mean,
                PowerSeries(
                    log.t,
                    p,
                    f"rail:{names[key]}",
                    rail.get("current_ma"),
                    rail.get("voltage_v"),
                    sign_method="rail",
                ),
            )
    if best is None:
        raise MeasurementError("no hwmon rail gives power or current and voltage")
    return best


# ---- external monitor ----------------------------------------------------------------------------
_TIME = {
    "t": 1.0,
    "t_s": 1.0,
    "time": 1.0,
    "time_s": 1.0,
    "timestamp": 1.0,
    "ts": 1.0,
    "t_ms": 1e-3,
    "time_ms": 1e-3,
    "t_us": 1e-6,
}
_POWER = {
    "power_mw": 1.0,
    "power": 1.0,
    "p_mw": 1.0,
    "power_w": 1e3,
    "p_w": 1e3,
    "power_uw": 1e-3,
    "mw": 1.0,
    "w": 1e3,
}
_CURRENT = {
    "current_ma": 1.0,
    "current": 1.0,
    "i_ma": 1.0,
    "main_current_ma": 1.0,
    "current_a": 1e3,
    "i_a": 1e3,
    "current_ua": 1e-3,
    "ma": 1.0,
    "a": 1e3,
}
_VOLTAGE = {"voltage_v": 1.0, "voltage": 1.0, "v": 1.0, "main_voltage_v": 1.0, "voltage_mv": 1e-3, "mv": 1e-3}
_DELIMITED = re.compile(r"[,;\t]")


@dataclass
class MonitorFormat:
    """Which column is what: from a header line, else by count (P | t P | t I V in s, mW, mA, V)."""

    time: tuple[int, float] | None = None
    power: tuple[int, float] | None = None
    current: tuple[int, float] | None = None
    voltage: tuple[int, float] | None = None

    @classmethod
    def from_header(cls, names: list[str]) -> MonitorFormat | None:
        fmt = cls()
        for i, raw in enumerate(names):
            name = re.sub(r"[^a-z0-9]+", "_", raw.lower()).strip("_")  # "Power (W)" -> power_w
            for attr, table in (
                ("time", _TIME),
                ("power", _POWER),
                ("current", _CURRENT),
                ("voltage", _VOLTAGE),
            ):
                if name in table and getattr(fmt, attr) is None:
                    setattr(fmt, attr, (i, table[name]))
                    break
        return fmt if fmt.power or (fmt.current and fmt.voltage) else None

    @classmethod
    def positional(cls, columns: int) -> MonitorFormat | None:
        if columns == 1:
            return cls(power=(0, 1.0))
        if columns == 2:
            return cls(time=(0, 1.0), power=(1, 1.0))
        if columns >= 3:
            return cls(time=(0, 1.0), current=(1, 1.0), voltage=(2, 1.0))
        return None

    def parse(self, cells: list[str]) -> tuple[float | None, float] | None:
        """(monitor time s or None, power mW) from one line's cells."""
        try:
            if self.power:
                power = float(cells[self.power[0]]) * self.power[1]
            elif self.current and self.voltage:
                power = abs(
                    float(cells[self.current[0]])
                    * self.current[1]
                    * float(cells[self.voltage[0]])
                    * self.voltage[1]
                )
            else:
                return None
            t = float(cells[self.time[0]]) * self.time[1] if self.time else None
        except (ValueError, IndexError):
            return None
        return (t, power) if np.isfinite(power) else None


def split_cells(line: str) -> list[str]:
    """CSV-ish (comma, semicolon or tab) when delimited, else whitespace-separated."""
    text = line.strip()
    if _DELIMITED.search(text):
        return [c.strip() for c in re.split(r"[,;\t]", text) if c.strip()]
    return text.split()


def parse_monitor_lines(lines: list[tuple[float, str]]) -> tuple[np.ndarray, np.ndarray]:
    """(host times, power mW) from (host arrival time, line) pairs.

    Monitor timestamps are on the monitor's own clock: the offset to the host clock is the smallest gap
    between a line's arrival and its timestamp (the line that came through without buffering).
    """
    fmt: MonitorFormat | None = None
    parsed: list[tuple[float, float | None, float]] = []
    for received, line in lines:
        cells = split_cells(line)
        if not cells:
            continue
        if any(re.search(r"[a-df-zA-DF-Z_]", c) for c in cells):  # a header (letters other than exponents)
            fmt = MonitorFormat.from_header(cells) or fmt
            continue
        fmt = fmt or MonitorFormat.positional(len(cells))
        sample = fmt.parse(cells) if fmt else None
        if sample is not None:
            parsed.append((received, sample[0], sample[1]))
    if not parsed:
        return np.array([]), np.array([])
    arrival = np.array([p[0] for p in parsed])
    power = np.array([p[2] for p in parsed])
    if all(p[1] is not None for p in parsed):
        stamps = np.array([p[1] for p in parsed], dtype=float)
        offset = float(np.min(arrival - stamps))
        return stamps + offset, power
    return arrival, power


class PowerMonitor:
    """An external monitor command, run on the controller host while the device works.

    Lines are kept with their arrival times on the host's monotonic clock.
    """

    def __init__(self, argv: list[str], device: str) -> None:
        self.argv = argv
        self.device = device
        self.lines: list[tuple[float, str]] = []
        self.proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._stderr = b""

    def start(self) -> PowerMonitor:
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise UserError(
                f"{self.device}: sensors.power.monitor {self.argv[0]!r} cannot start: {exc.strerror}"
            ) from None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc and self.proc.stdout
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.append((time.monotonic(), raw.decode("utf-8", "replace")))

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._reader:
            self._reader.join(timeout=5)
        if proc.stderr:
            self._stderr = proc.stderr.read() or b""
            proc.stderr.close()
        if proc.stdout:
            proc.stdout.close()

    def failure(self) -> str:
        tail = self._stderr.decode("utf-8", "replace").strip().splitlines()
        code = self.proc.returncode if self.proc else None
        return f"exit {code}: {tail[-1][:200]}" if tail else f"exit {code}, no output"

    def __enter__(self) -> PowerMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def monitor_argv(monitor: tuple[str, ...]) -> list[str]:
    """The descriptor gives argv (a list), or one command line string that is split like a shell would."""
    return shlex.split(monitor[0]) if len(monitor) == 1 else list(monitor)


def monitor_series(
    lines: list[tuple[float, str]], clock: dict[str, float], host_span: tuple[float, float]
) -> tuple[PowerSeries, float]:
    """Monitor samples moved onto the device's task clock; returns the series and the alignment uncertainty.

    The agent's last act is to read its clock, so the host's "call returned" moment anchors the device
    clock (late by the return trip only); the rest of the call's overhead bounds the uncertainty.
    """
    host_t, power = parse_monitor_lines(lines)
    h0, h1 = host_span
    device_t = host_t - h1 + clock["end"] - clock["origin"]
    uncertainty = max(0.0, (h1 - h0) - (clock["end"] - clock["start"]))
    return PowerSeries(device_t, power, "monitor", sign_method="monitor"), uncertainty


# ---- analysis ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PowerAnalysis:
    source: str
    idle_mw: float
    idle_before_mw: float | None
    idle_after_mw: float | None
    active_mw: float
    net_mw: float
    energy_mj_per_inference: float
    inferences: int
    active_s: float
    counts: dict[str, int]
    sample_rate_hz: float
    net_current_ma: float | None
    idle_current_ma: float | None
    voltage_v: float | None
    sign: int
    sign_method: str
    warnings: list[str] = field(default_factory=list)


def analyze_power(
    series: PowerSeries, phases: dict[str, list[float]], inferences: int, trim_s: float
) -> PowerAnalysis:
    """Idle baselines and the active mean (edges trimmed), net power and energy per inference.

    An idle phase's figure is the median of its readings: it is the device's baseline, and a gauge's
    filter still shows the tail of the warm-up at the start of the first one (one reading of 895 mW among
    seven of 575 lifted a mean by 6%), as a background wake-up would. Active is the mean: energy counts all.
    """
    means: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    currents: dict[str, float | None] = {}
    for name in PHASES:
        if name not in phases or phases[name][1] - phases[name][0] <= 0:
            means[name], counts[name] = None, 0
            continue
        mask = phase_mask(series.t, phases[name], trim_s) & ~np.isnan(series.power_mw)
        counts[name] = int(mask.sum())
        typical = np.nanmean if name == "active" else np.nanmedian
        means[name] = float(typical(series.power_mw[mask])) if mask.any() else None
        if series.current_ma is not None and mask.any():
            currents[name] = float(typical(series.current_ma[mask]))
    if counts.get("active", 0) == 0:
        raise MeasurementError(
            f"no power samples during the active phase ({series.source}): run longer "
            "(duration_s) or sample faster"
        )
    idle_values = [v for v in (means.get("idle_before"), means.get("idle_after")) if v is not None]
    if not idle_values:
        raise MeasurementError(f"no power samples while idle ({series.source}): lengthen idle_s")
    idle = float(np.mean(idle_values))
    active = float(means["active"] or 0.0)
    net = active - idle
    active_s = float(phases["active"][1] - phases["active"][0])
    idle_currents = [v for v in (currents.get("idle_before"), currents.get("idle_after")) if v is not None]
    active_current = currents.get("active")
    net_current = (
        active_current - float(np.mean(idle_currents))
        if active_current is not None and idle_currents
        else None
    )
    warnings = list(series.notes)
    if len(idle_values) == 2 and idle > 0 and abs(idle_values[0] - idle_values[1]) > 0.2 * idle:
        warnings.append(
            f"idle power drifted from {idle_values[0]:.0f} to {idle_values[1]:.0f} mW between the "
            "baselines (background activity?): the net figure is less certain"
        )
    if net <= 0:
        warnings.append(
            f"active power is not above idle ({active:.0f} vs {idle:.0f} mW): the load is below "
            "what this sensor resolves; run longer or use a finer power monitor"
        )
    rate = (
        float((series.t.size - 1) / (series.t[-1] - series.t[0]))
        if series.t.size > 1 and series.t[-1] > series.t[0]
        else 0.0
    )
    volts = (
        float(np.nanmean(series.voltage_v[phase_mask(series.t, phases["active"], trim_s)]))
        if series.voltage_v is not None
        else None
    )
    return PowerAnalysis(
        source=series.source,
        idle_mw=idle,
        idle_before_mw=means.get("idle_before"),
        idle_after_mw=means.get("idle_after"),
        active_mw=active,
        net_mw=net,
        energy_mj_per_inference=net * active_s / inferences if inferences else float("nan"),
        inferences=inferences,
        active_s=active_s,
        counts=counts,
        sample_rate_hz=rate,
        net_current_ma=net_current,
        idle_current_ma=float(np.mean(idle_currents)) if idle_currents else None,
        voltage_v=volts,
        sign=series.sign,
        sign_method=series.sign_method,
        warnings=warnings,
    )


def default_trim(period_s: float) -> float:
    """Edge trim: two sensor periods of lag (fuel gauges filter), at least 0.5 s; phase_mask caps it at a
    quarter of the phase."""
    return max(2 * period_s, 0.5)


# ---- the probe -----------------------------------------------------------------------------------
def power_task(
    params: PowerParams, device: Device, runtime: str, model: str, inputs: str | None, monitor: bool
) -> PowerTask:
    idle_after = params.idle_s if params.idle_after_s is None else params.idle_after_s
    return PowerTask(
        **sustained_fields(params, device, runtime, model, inputs),
        idle_s=params.idle_s,
        idle_after_s=idle_after,
        monitor=monitor,
    )


def run_power(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = PowerParams.of(job)
    runtime, remote_model, remote_inputs = start_sustained_run(device, job, ctx, params)
    monitor = device.spec.sensors.power.monitor
    task = power_task(params, device, runtime, remote_model, remote_inputs, bool(monitor))
    timeout = task.duration_s + task.idle_s + task.idle_after_s + job_timeout(device, job)
    device.agent_path(timeout)  # pushed now, so the timed call below is the agent's run and nothing else
    lines: list[tuple[float, str]] = []
    if monitor:
        with PowerMonitor(monitor_argv(monitor), device.name) as mon:
            h0 = time.monotonic()
            reply = _run_power_agent(device, task, timeout)
            h1 = time.monotonic()
        lines = mon.lines
    else:
        h0 = time.monotonic()
        reply = _run_power_agent(device, task, timeout)
        h1 = time.monotonic()
    r = reply.result
    log = parse_sensor_log(r["sensors"])
    phases = {k: list(v) for k, v in r["phases"].items()}
    trim = default_trim(log.period_s) if params.trim_s is None else params.trim_s
    with named_errors(device.name):
        refuse_charging_seen(log, r["source"])
        if monitor:
            series, uncertainty = monitor_series(lines, r["clock"], (h0, h1))
            if series.t.size == 0:
                raise MeasurementError(f"power monitor gave no samples ({mon.failure()})")
            trim += min(uncertainty, 1.0)
        elif r["source"]["kind"] == "rail":
            series = rail_series(log, r["source"]["channels"], phases, trim)
        else:
            series = battery_series(log, r["source"]["channels"], phases, trim)
        analysis = analyze_power(series, phases, len(r["inferences"]["latencies_ms"]), trim)
    out = power_records(ctx, analysis, r, log, series, phases)
    out.warnings = list(reply.warnings) + out.warnings
    return out


@contextlib.contextmanager
def named_errors(device: str) -> Iterator[None]:
    """The analysis is device-agnostic; its errors reach the user naming the device."""
    try:
        yield
    except ChargingError as exc:
        raise ChargingError(f"{device}: {exc}") from None
    except MeasurementError as exc:
        raise MeasurementError(str(exc), device=device, kind=exc.kind) from None
    except UserError as exc:
        raise UserError(f"{device}: {exc}") from None


def _run_power_agent(device: Device, task: PowerTask, timeout: float):
    try:
        return device.run_agent(task, timeout)
    except MeasurementError as exc:
        if exc.kind == "charging":
            raise ChargingError(
                f"{device.name}: {_agent_message(exc, device.name)}; {CHARGING_HINT}"
            ) from None
        if exc.kind == "no_power_sensor":
            where = (
                device.spec.source if device.spec.source != "<built-in>" else f"devices/{device.name}.toml"
            )
            raise UserError(
                f"{device.name}: {_agent_message(exc, device.name)}; set sensors.power (current/"
                f"voltage or monitor) in {where}"
            ) from None
        raise


def _agent_message(exc: MeasurementError, device: str) -> str:
    text = str(exc)
    return text[len(device) + 2 :] if text.startswith(f"{device}: ") else text


def refuse_charging_seen(log: SensorLog, source: dict[str, Any]) -> None:
    """A charger plugged in during the run spoils a fuel-gauge measurement too."""
    if source.get("kind") != "battery":
        return
    seen = log.statuses_seen() & set(CHARGING_STATUSES)
    if seen:
        raise ChargingError(f"the battery reported '{sorted(seen)[0]}' during the run: {CHARGING_HINT}")


def power_records(
    ctx: RecordContext,
    a: PowerAnalysis,
    r: dict[str, Any],
    log: SensorLog,
    series: PowerSeries,
    phases: dict[str, list[float]],
) -> ProbeResult:
    out = ProbeResult(warnings=list(a.warnings) + list(log.warnings))
    counts = {
        "samples_idle": a.counts.get("idle_before", 0) + a.counts.get("idle_after", 0),
        "samples_active": a.counts.get("active", 0),
        "sample_rate_hz": round(a.sample_rate_hz, 3),
    }
    out.records.append(ctx.record("power_mw", a.net_mw, "mW", counts, idle_subtracted=True, source=a.source))
    runs = {**counts, "inferences": a.inferences, "active_s": round(a.active_s, 4)}
    out.records.append(
        ctx.record("energy_mj_per_inference", a.energy_mj_per_inference, "mJ", runs, source=a.source)
    )
    out.records.append(ctx.record("idle_power_mw", a.idle_mw, "mW", phase="mean", source=a.source))
    for name, value in (("before", a.idle_before_mw), ("after", a.idle_after_mw)):
        if value is not None:
            out.records.append(ctx.record("idle_power_mw", value, "mW", phase=name, source=a.source))
    out.records.append(ctx.record("active_power_mw", a.active_mw, "mW", source=a.source))
    if a.net_current_ma is not None:
        out.records.append(
            ctx.record(
                "current_ma",
                a.net_current_ma,
                "mA",
                {"sign": a.sign, "sign_calibration": a.sign_method},
                idle_subtracted=True,
                source=a.source,
            )
        )
    if a.voltage_v is not None:
        out.records.append(ctx.record("voltage_v", a.voltage_v, "V", source=a.source))
    lats = r["inferences"]["latencies_ms"]
    if lats:
        out.records.append(ctx.record("latency_ms", float(np.median(lats)), "ms", stat="p50", phase="active"))
        out.records.append(ctx.record("latency_ms", float(np.mean(lats)), "ms", stat="mean", phase="active"))
    out.records.append(ctx.record("samples_n", len(lats), "count"))
    out.samples.append(ctx.samples("latency_ms", "ms", lats, series="inference"))
    out.samples.append(
        ctx.samples(
            "inference_t_s",
            "s",
            r["inferences"]["t"],
            {"origin_monotonic_s": r["clock"]["origin"]},
            series="inference",
        )
    )
    out.samples.append(
        ctx.samples(
            "power_t_s",
            "s",
            series.t.tolist(),
            {"origin_monotonic_s": r["clock"]["origin"]},
            series="power",
            source=series.source,
        )
    )
    out.samples.append(
        ctx.samples("power_mw", "mW", series.power_mw.tolist(), series="power", source=series.source)
    )
    out.samples.append(
        ctx.samples(
            "phase_bounds_s",
            "s",
            [v for p in PHASES for v in phases.get(p, [])],
            {"origin_monotonic_s": r["clock"]["origin"]},
            series="phases",
            phases=[p for p in PHASES if p in phases],
        )
    )
    out.samples += sensor_samples(ctx, log)
    return out
