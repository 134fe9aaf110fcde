"""Host side of the on-device samplers: the sensors config a task carries, the log it returns, raw samples.

Shared by the thermal and power probes and the cool-down guard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..descriptors import DeviceSpec
from ..errors import UserError
from ..jobs import Job
from ..lab.device import Device
from ..records import RecordContext, Samples
from .common import push_model_and_inputs, runtime_of, shape_lists
from .registry import PowerParams, ThermalParams

DEFAULT_PERIOD_S = 0.25


def sensors_config(spec: DeviceSpec, period_s: float = DEFAULT_PERIOD_S) -> dict[str, Any]:
    """What an agent task needs to find the device's sensors: all paths resolve under sysfs_root."""
    s = spec.sensors
    zones = s.thermal_zones if s.thermal_zones == "auto" else list(s.thermal_zones)
    return {
        "sysfs_root": s.sysfs_root,
        "thermal_zones": zones,
        "current": s.power.current,
        "voltage": s.power.voltage,
        "period_s": float(period_s),
    }


def sustained_fields(
    params: ThermalParams | PowerParams, device: Device, runtime: str, model: str, inputs: str | None
) -> dict[str, Any]:
    """The fields every sustained agent task (thermal, power) shares: model, inputs, load and sensors."""
    return {
        "runtime": runtime,
        "model": model,
        "inputs": inputs,
        "shapes": shape_lists(params.shapes),
        "threads": params.threads,
        "seed": params.seed,
        "affinity": list(params.affinity) if params.affinity else None,
        "duration_s": params.duration_s,
        "rate_hz": params.rate_hz,
        "warmup": params.warmup,
        "warmup_seconds": params.warmup_seconds,
        "sensors": sensors_config(device.spec, params.period_s),
    }


def start_sustained_run(
    device: Device, job: Job, ctx: RecordContext, params: ThermalParams | PowerParams
) -> tuple[str, str, str | None]:
    """What thermal and power runs share before their task: a Python agent, the identity params (the paced
    rate among them: it changes what is measured) and the model pushed. Returns (runtime, model, inputs)."""
    require_python_agent(device, job.probe)
    runtime = runtime_of(job.model, job.runtime)
    ctx.runtime = runtime
    ctx.base_params = params.identity()
    return (runtime, *push_model_and_inputs(device, job, runtime, params.inputs))


def require_python_agent(device: Device, probe: str) -> None:
    if device.spec.agent != "python":
        raise UserError(
            f"{device.name}: probe '{probe}' samples sensors inside the Python agent; "
            f'{device.spec.source} sets agent = "{device.spec.agent}"'
        )


@dataclass(frozen=True)
class ChannelSeries:
    """One sensor's readings, aligned with SensorLog.t (NaN where a read failed)."""

    id: str
    metric: str
    unit: str
    labels: dict[str, str]
    values: np.ndarray


@dataclass(frozen=True)
class SensorLog:
    """What the agent's sampler returned: times (s since origin, device monotonic clock) and channels."""

    t: np.ndarray
    channels: list[ChannelSeries]
    origin: float
    period_s: float
    status: dict[str, list[tuple[float, str | None]]] = field(default_factory=dict)
    static: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    late_ticks: int = 0
    android: dict[str, Any] | None = None

    def of(self, metric: str) -> list[ChannelSeries]:
        return [c for c in self.channels if c.metric == metric]

    def by_id(self, ids: list[str]) -> list[ChannelSeries]:
        wanted = set(ids)
        return [c for c in self.channels if c.id in wanted]

    def hottest(self) -> np.ndarray:
        """Per sample, the hottest zone's temperature (NaN when no zone read)."""
        temps = self.of("temp_c")
        if not temps or not self.t.size:
            return np.full(self.t.shape, np.nan)
        stack = np.vstack([c.values for c in temps])
        out = np.full(self.t.shape, np.nan)
        ok = ~np.all(np.isnan(stack), axis=0)
        out[ok] = np.nanmax(stack[:, ok], axis=0)
        return out

    def statuses_seen(self, prefix: str = "status:") -> set[str]:
        return {
            text
            for key, changes in self.status.items()
            if key.startswith(prefix)
            for _, text in changes
            if text
        }

    @property
    def rate_hz(self) -> float:
        if self.t.size < 2 or self.t[-1] <= self.t[0]:
            return 0.0
        return float((self.t.size - 1) / (self.t[-1] - self.t[0]))


def _floats(values: list[Any]) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=float)


def parse_sensor_log(data: dict[str, Any]) -> SensorLog:
    t = _floats(data.get("t") or [])
    channels = [
        ChannelSeries(c["id"], c["metric"], c["unit"], dict(c.get("labels") or {}), _floats(c["values"]))
        for c in data.get("channels") or []
        if len(c.get("values") or []) == t.size
    ]
    status = {k: [(float(a), b) for a, b in v] for k, v in (data.get("status") or {}).items()}
    return SensorLog(
        t=t,
        channels=channels,
        origin=float(data.get("origin") or 0.0),
        period_s=float(data.get("period_s") or 0.0),
        status=status,
        static=data.get("static") or {},
        warnings=list(data.get("warnings") or []),
        late_ticks=int(data.get("late_ticks") or 0),
        android=data.get("android_thermal"),
    )


def sensor_samples(ctx: RecordContext, log: SensorLog) -> list[Samples]:
    """Every sensor reading as raw samples: `sensor_t_s` holds the times, each channel its values."""
    out = [
        ctx.samples(
            "sensor_t_s",
            "s",
            log.t.tolist(),
            {"origin_monotonic_s": log.origin, "period_s": log.period_s},
            series="sensor",
        )
    ]
    for c in log.channels:
        out.append(ctx.samples(c.metric, c.unit, c.values.tolist(), series="sensor", sensor=c.id, **c.labels))
    if log.android:
        # Android's thermal service, polled every few seconds: its throttling status and HAL temperatures.
        status = log.android.get("status") or []
        if status:
            out.append(
                ctx.samples("android_thermal_t_s", "s", [a for a, _ in status], series="android_thermal")
            )
            out.append(
                ctx.samples(
                    "android_thermal_status", "level", [b for _, b in status], series="android_thermal"
                )
            )
        for name, points in (log.android.get("temps") or {}).items():
            out.append(
                ctx.samples("android_temp_t_s", "s", [a for a, _ in points], series="android_hal", zone=name)
            )
            out.append(ctx.samples("temp_c", "C", [b for _, b in points], series="android_hal", zone=name))
    for key, changes in log.status.items():
        # Text statuses keep their change times; the texts themselves go into the annotations.
        out.append(
            ctx.samples(
                "status_t_s",
                "s",
                [a for a, _ in changes],
                {"texts": [b for _, b in changes]},
                series="status",
                sensor=key,
            )  # fmt: skip
        )
    return out


def window_mean(t: np.ndarray, values: np.ndarray, start: float, end: float) -> float | None:
    """Mean of the readings taken in [start, end); interpolated at the middle when none fall inside."""
    ok = ~np.isnan(values)
    if not ok.any():
        return None
    inside = ok & (t >= start) & (t < end)
    if inside.any():
        return float(values[inside].mean())
    return float(np.interp((start + end) / 2, t[ok], values[ok]))
