"""Sustained thermal and power runs on devices without Python: the runner back to back, sensors from the
shell loop.

Each runner invocation is one point on the time axis (its start on the device clock, its mean latency of
`runs` inferences); the shell sampler gives the sensor log in the Python sampler's shape, so the thermal
analysis and records are those of `probe thermal` on a Python device.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ..agent.sensors import CHARGING_STATUSES, Channel, SensorSet
from ..agent.sustained import power_source
from ..errors import MeasurementError, UserError
from ..jobs import Job
from ..lab.device import Device
from ..native import NativeOptions, NativeResult, RunnerAdapter
from ..native.shell_sampler import parse_sampler_output, sensor_log, start_sampler, stop_sampler
from ..records import ProbeResult, RecordContext
from . import power
from .common import job_timeout, model_file_for, require_model
from .native import (
    adapter_and_runner,
    install_runner,
    invoke,
    native_identity,
    native_notes,
    native_options,
    runtime_for,
    stage_model,
    staged_name,
    tool_argv,
    with_input_types,
)
from .power import CHARGING_HINT, ChargingError
from .registry import PowerParams, ThermalParams
from .sensing import parse_sensor_log, sensors_config
from .thermal import analyze_thermal, thermal_records

# Prints the device clock, then becomes the runner: one round trip per invocation.
_STAMPED = 'read -r up _ < /proc/uptime; echo "EDGEBENCH_T0 $up"; exec "$@"'


def stamped_runner(
    device: Device, job: Job, ctx: RecordContext, params: ThermalParams | PowerParams, default_runs: int
) -> tuple[RunnerAdapter, list[str], dict[str, str], NativeOptions]:
    """The runner installed and the model staged; argv that stamps the device clock before each run."""
    timeout = job_timeout(device, job)
    model = require_model(job)
    runtime = runtime_for(model, job)
    model_file = model_file_for(model, runtime, params.shapes)
    adapter, runner = adapter_and_runner(device, runtime, params.runner)
    opts = native_options(params, default_runs)
    binary, env = install_runner(device, runner, timeout)
    staged = stage_model(device, adapter, model_file, model.name, timeout)
    opts = with_input_types(replace(opts, model_name=staged_name(adapter, model.name)), adapter, model_file)
    ctx.runtime = runtime
    ctx.base_params = {**params.identity(), "threads": params.threads, "runner": adapter.name}
    return adapter, ["sh", "-c", _STAMPED, "sh", *tool_argv(adapter, binary, staged, opts)], env, opts


def tool_inferences(result: NativeResult, adapter: RunnerAdapter, device: Device) -> int:
    """Every inference one invocation ran, warm-up included, by the tool's own counts (benchmark_model
    warms up for at least 0.5 s: tens to hundreds of inferences, not `warmup`)."""
    if result.inferences is None:
        raise MeasurementError(
            f"{adapter.name} did not print how many warm-up and timed inferences it ran: no energy per "
            "inference can be made from its invocations",
            device=device.name,
        )
    return result.inferences


def sustained_point(result: NativeResult, adapter: RunnerAdapter, device: Device) -> float:
    """One invocation's mean latency as a point of a sustained run; refused when below what the tool
    prints (a sustained run has no time to raise its loop count)."""
    if result.unresolved:
        raise MeasurementError(
            f"{adapter.name} printed a mean of {result.aggregates['mean']} ms, below what it resolves "
            f"({result.resolution_ms} ms steps): raise runs so each invocation lasts longer, or use bench",
            device=device.name,
        )
    return result.aggregates["mean"]


def name_what_ran(ctx: RecordContext, params: ThermalParams | PowerParams, adapter: RunnerAdapter,
                  first: NativeResult) -> None:  # fmt: skip
    """Records carry what the tool says ran (its first invocation), not what was asked."""
    ctx.base_params = {**params.identity(), **native_identity(params, adapter.name, first)}
    ctx.base_annotations = {**ctx.base_annotations, **native_notes(params, first)}


def run_native_thermal(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = ThermalParams.of(job)
    duration, period = params.duration_s, params.period_s
    timeout = job_timeout(device, job)
    adapter, argv, env, opts = stamped_runner(device, job, ctx, params, default_runs=10)
    sampler = start_sampler(device, period, duration + timeout, timeout)
    starts, lats, results = [], [], []
    try:
        end = time.monotonic() + duration
        while time.monotonic() < end:
            result = invoke(device, adapter, argv, env, opts, timeout)
            results.append(result)
            lats.append(sustained_point(result, adapter, device))
            starts.append(result.started_s if result.started_s is not None else float("nan"))
    finally:
        trace = stop_sampler(device, sampler, timeout)
    if not results:
        raise MeasurementError("no runner invocation finished within the duration", device=device.name)
    name_what_ran(ctx, params, adapter, results[0])
    data = sensor_log(trace, sensors_config(device.spec, period), period)
    log = parse_sensor_log(data)
    rel = [s - log.origin for s in starts]
    analysis = analyze_thermal(rel, lats, log, duration, params.window_s, params.margin, params.hold_s)
    r = {
        "inferences": {"t": rel, "latencies_ms": lats},
        "duration_s": duration,
        "load_ms": results[0].load_ms,
        "clock": {"origin": log.origin},
    }
    out = thermal_records(ctx, analysis, r, log, None)
    out.warnings.append(
        f"{device.name}: each point is one {adapter.name} invocation (mean of {opts.runs} "
        "inferences); no cool-down guard ran before it"
    )
    return out


# ---- power -------------------------------------------------------------------------------------------------
def device_clock(device: Device, timeout: float) -> float:
    """The device's uptime clock now (the clock the shell sampler stamps its ticks with)."""
    res = device.transport.run(["cat", "/proc/uptime"], timeout=timeout).check(device.name)
    return float(res.stdout.split()[0])


def idle_span(device: Device, seconds: float, timeout: float) -> list[float]:
    start = device_clock(device, timeout)
    time.sleep(max(0.0, seconds))
    return [start, device_clock(device, timeout)]


def sensor_set(log: dict[str, Any]) -> SensorSet:
    """The channels of a shell-sampler log, as the agent's source selection expects them."""
    channels = [
        Channel(c["id"], c["metric"], c["unit"], c["path"], 1.0, dict(c["labels"])) for c in log["channels"]
    ]
    return SensorSet(root="/", channels=channels)


def refuse_charging_now(log: dict[str, Any], source: dict[str, Any]) -> None:
    if source["kind"] != "battery":
        return
    for key, changes in log["status"].items():
        if key.startswith("status:") and changes and changes[-1][1] in CHARGING_STATUSES:
            raise ChargingError(
                f"battery '{key.split(':', 1)[1]}' reports status '{changes[-1][1]}': {CHARGING_HINT}"
            )


def run_native_power(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    """Idle, then the runner back to back, then idle again, with the shell sampler throughout."""
    params = PowerParams.of(job)
    duration, idle, period = params.duration_s, params.idle_s, params.period_s
    idle_after = idle if params.idle_after_s is None else params.idle_after_s
    timeout = job_timeout(device, job)
    adapter, argv, env, opts = stamped_runner(device, job, ctx, params, default_runs=100)
    config = sensors_config(device.spec, period)
    sampler = start_sampler(device, period, idle + duration + idle_after + timeout, timeout)
    phases: dict[str, list[float]] = {}
    starts, lats, inferences, first_result = [], [], 0, None
    try:
        first = sensor_log(
            parse_sampler_output(device.transport.read_text(sampler.output, timeout=timeout)), config, period
        )
        source = power_source(sensor_set(first), {})
        if source["kind"] == "none":
            raise UserError(
                f"{device.name}: no power sensor under {device.spec.sensors.sysfs_root}: "
                "no battery fuel gauge and no hwmon rail with power or current"
            )
        refuse_charging_now(first, source)
        phases["idle_before"] = idle_span(device, idle, timeout)
        begin, end = device_clock(device, timeout), time.monotonic() + duration
        while time.monotonic() < end:
            result = invoke(device, adapter, argv, env, opts, timeout)
            first_result = first_result or result
            starts.append(result.started_s if result.started_s is not None else float("nan"))
            lats.append(sustained_point(result, adapter, device))
            inferences += tool_inferences(result, adapter, device)
        phases["active"] = [begin, device_clock(device, timeout)]
        phases["idle_after"] = idle_span(device, idle_after, timeout)
    finally:
        trace = stop_sampler(device, sampler, timeout)
    if first_result is not None:
        name_what_ran(ctx, params, adapter, first_result)
    log = parse_sensor_log(sensor_log(trace, config, period))
    phases = {name: [a - log.origin, b - log.origin] for name, (a, b) in phases.items()}
    trim = power.default_trim(period) if params.trim_s is None else params.trim_s
    with power.named_errors(device.name):
        power.refuse_charging_seen(log, source)
        if source["kind"] == "rail":
            series = power.rail_series(log, source["channels"], phases, trim)
        else:
            series = power.battery_series(log, source["channels"], phases, trim)
        analysis = power.analyze_power(series, phases, inferences, trim)
    r = {
        "inferences": {"t": [s - log.origin for s in starts], "latencies_ms": lats},
        "clock": {"origin": log.origin},
        "source": source,
        "duration_s": duration,
    }
    out = power.power_records(ctx, analysis, r, log, series, phases)
    out.warnings.append(
        f"{device.name}: energy per inference includes each {adapter.name} invocation's "
        f"start-up and model load ({opts.runs} runs per invocation; raise runs to dilute it); "
        "inferences are the tool's own counts, warm-up included"
    )
    return out
