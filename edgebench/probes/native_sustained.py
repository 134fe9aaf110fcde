"""Sustained thermal runs on devices without Python: the runner back to back, sensors from the shell loop.

Each runner invocation is one point on the time axis (its start on the device clock, its mean latency of
`runs` inferences); the shell sampler gives the sensor log in the Python sampler's shape, so the thermal
analysis and records are those of `probe thermal` on a Python device.
"""

from __future__ import annotations

import dataclasses
import time

from ..device import Device
from ..errors import MeasurementError
from ..jobs import Job
from ..native.shell_sampler import sensor_log, start_sampler, stop_sampler
from ..records import ProbeResult, RecordContext
from .common import job_timeout, model_file_for, require_model
from .native import adapter_and_runner, install_runner, invoke, native_options, runtime_for, stage_model
from .sensing import DEFAULT_PERIOD_S, parse_sensor_log, sensors_config
from .thermal import DEFAULT_DURATION_S, DEFAULT_MARGIN, analyze_thermal, check_params, thermal_records

# Prints the device clock, then becomes the runner: one round trip per invocation.
_STAMPED = 'read -r up _ < /proc/uptime; echo "EDGEBENCH_T0 $up"; exec "$@"'


def run_native_thermal(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    check_params(job.params)
    p = job.params
    duration = float(p.get("duration_s", DEFAULT_DURATION_S))
    period = float(p.get("period_s", DEFAULT_PERIOD_S))
    timeout = job_timeout(device, job)
    model = require_model(job)
    runtime = runtime_for(model, job)
    model_file = model.path if runtime == "tflite" else model_file_for(model, runtime)
    adapter, runner = adapter_and_runner(device, runtime, job)
    opts = native_options(dataclasses.replace(job, params={"runs": 10, "warmup": 1, **p}))
    binary, env = install_runner(device, runner, timeout)
    argv = ["sh", "-c", _STAMPED, "sh", *adapter.argv(binary, stage_model(device, adapter, model_file,
                                                                             model.name, timeout), opts)]
    ctx.runtime = runtime
    ctx.base_params = {"threads": opts.threads, "runner": adapter.name}
    sampler = start_sampler(device, period, duration + timeout, timeout)
    starts, lats, results = [], [], []
    try:
        end = time.monotonic() + duration
        while time.monotonic() < end:
            result = invoke(device, adapter, argv, env, opts, timeout)
            results.append(result)
            lats.append(result.aggregates["mean"])
            starts.append(result.started_s if result.started_s is not None else float("nan"))
    finally:
        trace = stop_sampler(device, sampler, timeout)
    if not results:
        raise MeasurementError("no runner invocation finished within the duration", device=device.name)
    data = sensor_log(trace, sensors_config(device.spec, period), period)
    log = parse_sensor_log(data)
    rel = [s - log.origin for s in starts]
    analysis = analyze_thermal(rel, lats, log, duration, p.get("window_s"), float(p.get("margin", DEFAULT_MARGIN)),
                               p.get("hold_s"))
    r = {"inferences": {"t": rel, "latencies_ms": lats}, "duration_s": duration, "load_ms": results[0].load_ms,
         "clock": {"origin": log.origin}}
    out = thermal_records(ctx, analysis, r, log, None)
    out.warnings.append(f"{device.name}: each point is one {adapter.name} invocation (mean of {opts.runs} "
                        "inferences); no cool-down guard ran before it")
    return out
