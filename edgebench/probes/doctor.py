"""Probe `doctor`: device health, the reference beside every figure the device reports.

On the device (agent/doctor.py): the harness's timing path against a bare loop of each runtime on a small
model, alternated over rounds; the noise floor (CV of back-to-back bare runs); the timer's resolution;
governors and frequencies; the matmul and bandwidth probes against each runtime's plain call. Here the
figures become records, each judged against its bound (DoctorParams): `harness_overhead` over
`max_overhead` is flagged OVERHEAD, `noise_cv` over `max_noise_cv` NOISY, `probe_reach` under `min_reach`
LOW-REACH. `health_flags` sums them up; the report shows the device's latest health beside its numbers.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from ..agent.protocol import DoctorTask
from ..errors import UserError
from ..jobs import Job, ModelRef
from ..lab.device import Device
from ..models.refs import resolve_model
from ..records import ProbeResult, RecordContext
from ..runtimes import runtime as runtime_named
from ..stats import corroborated_ratio
from .common import check_runtime, job_timeout, model_file_for
from .registry import RUNTIMES, DoctorParams
from .sensing import sensors_config

MIB = 2**20
OVERHEAD, NOISY, LOW_REACH = "OVERHEAD", "NOISY", "LOW-REACH"


def doctor_task(params: DoctorParams, models: dict[str, str], sensors: dict[str, Any]) -> DoctorTask:
    return DoctorTask(
        models=models,
        threads=params.threads,
        affinity=list(params.affinity) if params.affinity else None,
        rounds=params.rounds,
        runs=params.runs,
        warmup_seconds=params.warmup_seconds,
        matmul_n=params.matmul_n,
        bandwidth_bytes=int(params.bandwidth_mb * MIB),
        sensors=sensors,
    )


def runtimes_on(device: Device) -> list[str]:
    """The runtimes the device's agent found (its fingerprint), in the registry's order."""
    found = device.fingerprint().get("runtimes") or {}
    return [r for r in RUNTIMES if found.get(r)]


def models_for(model: ModelRef, runtimes: list[str]) -> dict[str, ModelRef]:
    """The model each runtime's check runs: the doctor's model where the runtime runs it, else the
    runtime's own check model (`Runtime.check_model`: LiteRT's built-in flatbuffer MLP); a runtime that
    can run neither (onnxruntime given an .mnn) is left out."""
    out: dict[str, ModelRef] = {}
    for runtime in runtimes:
        own = runtime_named(runtime).check_model
        for candidate in (model, resolve_model(own)) if own else (model,):
            try:
                check_runtime(candidate, runtime)
            except UserError:
                continue
            out[runtime] = candidate
            break
    return out


def run_doctor(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = DoctorParams.of(job)
    if device.spec.agent != "python":
        raise UserError(f"{device.name}: doctor needs the Python agent (the device runs native runners)")
    ctx.base_params = params.identity()
    model = resolve_model(params.model)
    models = models_for(model, runtimes_on(device))
    runtimes = list(models)
    timeout = job_timeout(device, job)
    local = [model_file_for(models[r], r) for r in runtimes]
    files = device.ensure_models(local, timeout)
    task = doctor_task(params, dict(zip(runtimes, files, strict=True)), sensors_config(device.spec))
    reply = device.run_agent(task, timeout)
    out = doctor_records(ctx, reply.result, params, {r: m.name for r, m in models.items()})
    out.warnings[:0] = reply.warnings
    if not runtimes:
        out.warnings.append(f"{device.name}: no runtime found (onnxruntime, mnn): no harness comparison")
    return out


def flag(value: float, bound: float, above: bool, name: str) -> str | None:
    """`name` when the value is beyond its bound (above it, or below when `above` is False)."""
    return name if (value > bound if above else value < bound) else None


def doctor_records(
    ctx: RecordContext, r: dict[str, Any], params: DoctorParams, models: dict[str, str]
) -> ProbeResult:
    out = ProbeResult()
    flags: list[str] = []
    timer = r.get("timer") or {}
    out.records.append(
        ctx.record(
            "timer_resolution_ns",
            timer.get("resolution_ns"),
            "ns",
            {"read_ns": timer.get("read_ns"), "getres_ns": timer.get("getres_ns")},
        )
    )
    for runtime, health in (r.get("runtimes") or {}).items():
        if "error" in health:
            out.warnings.append(f"doctor: {runtime} not checked: {health['error']}")
            continue
        out.records += runtime_records(
            dataclasses.replace(ctx, runtime=runtime), health, params, models.get(runtime, "?"), flags
        )
    for cpu in r.get("cpus") or []:
        notes = {k: cpu.get(k) for k in ("governor", "min_mhz", "max_mhz")}
        out.records.append(ctx.record("cpu_freq_mhz", cpu.get("cur_mhz"), "MHz", notes, cpu=cpu["cpu"]))
    governors = sorted({c.get("governor") for c in r.get("cpus") or [] if c.get("governor")})
    if governors and governors != ["performance"]:
        out.warnings.append(
            f"doctor: CPU governor {', '.join(governors)}: frequencies follow the load, so latency does too"
        )
    for m in r.get("matmul") or []:
        if "error" in m:
            out.warnings.append(f"doctor: matmul {m['backend']} not checked: {m['error']}")
            continue
        ratio = m["probe_flops"] / m["bare_flops"]
        why = flag(ratio, params.min_reach, False, LOW_REACH)
        notes = {"probe_gflops": m["probe_flops"] / 1e9, "bare_gflops": m["bare_flops"] / 1e9,
                 "bound": params.min_reach, "flag": why, "op": m["op"]}  # fmt: skip
        bctx = dataclasses.replace(ctx, runtime=m["backend"])
        out.records.append(
            bctx.record("probe_reach", ratio, "ratio", notes, kind="matmul", dtype="fp32", n=m["n"])
        )
        flags += [f"{why}: matmul {m['backend']} {ratio:.2f}"] if why else []
    bw = r.get("bandwidth")
    if bw:
        ratio = bw["probe_bps"] / bw["bare_bps"]
        why = flag(ratio, params.min_reach, False, LOW_REACH)
        notes = {"probe_gbps": bw["probe_bps"] / 1e9, "bare_gbps": bw["bare_bps"] / 1e9,
                 "bound": params.min_reach, "flag": why, "bytes": bw["bytes"]}  # fmt: skip
        out.records.append(
            ctx.record("probe_reach", ratio, "ratio", notes, kind="bandwidth", kernel=bw["kernel"])
        )
        flags += [f"{why}: bandwidth {bw['kernel']} {ratio:.2f}"] if why else []
    out.records.append(ctx.record("health_flags", len(flags), "count", {"flags": flags}))
    out.warnings += [f"doctor: {f}" for f in flags]
    return out


def runtime_records(
    ctx: RecordContext, health: dict[str, Any], params: DoctorParams, model: str, flags: list[str]
) -> list[Any]:
    """harness_overhead and noise_cv of one runtime, flagged against their bounds."""
    ratios = [h / b for h, b in zip(health["harness_p50_ms"], health["bare_p50_ms"], strict=True) if b > 0]
    # Each side's corroborated fastest round, not a median of round ratios (see corroborated_ratio).
    pairs = [(h, b) for h, b in zip(health["harness_p50_ms"], health["bare_p50_ms"], strict=True) if b > 0]
    overhead = corroborated_ratio([h for h, _ in pairs], [b for _, b in pairs])
    noise = statistics.median(health["noise_cv"])
    over = flag(overhead, params.max_overhead, True, OVERHEAD)
    noisy = flag(noise, params.max_noise_cv, True, NOISY)
    flags += [f"{over}: {ctx.runtime} harness {overhead:.3f} x the bare loop"] if over else []
    flags += [f"{noisy}: {ctx.runtime} back-to-back CV {noise:.1%}"] if noisy else []
    rounds = len(ratios)
    return [
        ctx.record(
            "harness_overhead",
            overhead,
            "ratio",
            {
                "harness_p50_ms": statistics.median(health["harness_p50_ms"]),
                "bare_p50_ms": statistics.median(health["bare_p50_ms"]),
                "round_ratios": ratios,
                "rounds": rounds,
                "runs": health.get("runs"),
                "model": model,
                "bound": params.max_overhead,
                "flag": over,
                "runtime_version": health.get("version"),
            },
        ),
        ctx.record(
            "noise_cv",
            noise,
            "ratio",
            {
                "robust_cv": statistics.median(health["robust_cv"]),
                "rounds": rounds,
                "runs": health.get("runs"),
                "model": model,
                "bound": params.max_noise_cv,
                "flag": noisy,
            },
        ),
    ]
