"""Probe `soak`: a model run for minutes or hours on the device, its resident memory and latency sampled
window by window.

Records:
- `rss_mb` per window (param `t_s`, the window's end) and `latency_ms` (stat p50) per window: the series a
  report plots;
- `rss_growth_mb_per_hour`: the least-squares slope of RSS over time (scipy's linregress), with its
  confidence interval from the slope's standard error and Student's t (`ci_low`, `ci_high`,
  `confidence`); `leak` is true when the whole interval is above zero;
- `latency_drift_ratio`: median latency of the last quarter of the windows / that of the first quarter;
- `load_ms`, `peak_rss_mb`, `samples_n` (inferences).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..agent.protocol import SoakTask
from ..jobs import Job
from ..lab.device import AgentReply, Device
from ..records import ProbeResult, RecordContext
from .common import job_timeout, model_fields, push_model_and_inputs, runtime_of
from .registry import SoakParams, values

MIN_WINDOWS = 3
PERIOD_BOUNDS_S = (0.25, 60.0)


@dataclass(frozen=True)
class Growth:
    """RSS slope in MB per hour with its confidence interval."""

    mb_per_hour: float
    ci_low: float
    ci_high: float
    stderr: float
    n: int
    confidence: float

    def verdict(self, hours: float, floor_mb: float) -> str:
        """`leak`: growth sure (interval above 0) and at least `floor_mb` over the run; `growing`: sure but
        under the floor (a one-time allocation looks the same in a short run); else `none`."""
        if self.ci_low <= 0.0:
            return "none"
        return "leak" if self.mb_per_hour * hours >= floor_mb else "growing"


def rss_growth(t_s: list[float], rss_mb: list[float], confidence: float = 0.95) -> Growth | None:
    """The slope of RSS over time and its two-sided interval; None with fewer than 3 points."""
    from scipy.stats import linregress
    from scipy.stats import t as student

    if len(t_s) < MIN_WINDOWS or len(set(t_s)) < 2:
        return None
    y = np.asarray(rss_mb, float)
    if float(np.ptp(y)) == 0.0:  # flat: no slope and no scatter (linregress's stderr would be nan)
        return Growth(0.0, 0.0, 0.0, 0.0, len(t_s), confidence)
    fit = linregress(np.asarray(t_s, float), y)
    half = float(student.ppf(0.5 + confidence / 2, len(t_s) - 2)) * float(fit.stderr)
    slope = float(fit.slope) * 3600.0
    return Growth(
        slope, slope - half * 3600.0, slope + half * 3600.0, float(fit.stderr) * 3600.0, len(t_s), confidence
    )


def drift_ratio(p50s: list[float]) -> tuple[float, float, float] | None:
    """(late / early, early ms, late ms): medians of the last and the first quarter of the windows."""
    if len(p50s) < 4:
        return None
    quarter = max(1, len(p50s) // 4)
    early, late = float(np.median(p50s[:quarter])), float(np.median(p50s[-quarter:]))
    return (late / early if early > 0 else float("nan")), early, late


def period_for(params: SoakParams) -> float:
    """The sampling window: as asked, else 1/60 of the run within PERIOD_BOUNDS_S."""
    if params.period_s is not None:
        return params.period_s
    lo, hi = PERIOD_BOUNDS_S
    return min(hi, max(lo, params.minutes * 60 / 60))


def run_soak(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = SoakParams.of(job)
    runtime = runtime_of(job.model, job.runtime)
    ctx.runtime = runtime
    given = values(params.value)
    ctx.base_params = {**params.identity(), **({"value": given} if given else {})}
    remote_model, remote_inputs = push_model_and_inputs(device, job, runtime, params.inputs)
    duration = params.minutes * 60
    task = SoakTask(
        **model_fields(params, runtime, remote_model, remote_inputs),
        duration_s=duration,
        rate_hz=params.rate_hz,
        period_s=period_for(params),
        warmup=params.warmup,
    )
    reply = device.run_agent(task, timeout=duration + job_timeout(device, job))
    return soak_records(ctx, reply, params.confidence, params.leak_floor_mb)


def soak_records(
    ctx: RecordContext, reply: AgentReply, confidence: float = 0.95, floor_mb: float = 1.0
) -> ProbeResult:
    """The window series, the growth with its interval, the drift; from the agent's soak result."""
    r = reply.result
    out = ProbeResult(warnings=list(reply.warnings))
    windows = [w for w in r["windows"] if w.get("rss_mb") is not None]
    at = {"period_s": round(float(r["period_s"]), 4)}
    for w in windows:
        t = round(float(w["t"]), 3)
        out.records.append(ctx.record("rss_mb", w["rss_mb"], "MB", annotations={"n": w["n"]}, t_s=t, **at))
        if w.get("p50_ms") is not None:
            out.records.append(
                ctx.record(
                    "latency_ms", w["p50_ms"], "ms", annotations={"n": w["n"]}, stat="p50", t_s=t, **at
                )
            )
    t_s, rss = [float(w["t"]) for w in windows], [float(w["rss_mb"]) for w in windows]
    growth = rss_growth(t_s, rss, confidence)
    if growth is None:
        out.warnings.append(f"{len(windows)} RSS samples: too few for a growth rate (run longer)")
    else:
        hours = (t_s[-1] - t_s[0]) / 3600.0
        verdict = growth.verdict(hours, floor_mb)
        notes = {
            "verdict": verdict,
            "leak": verdict == "leak",
            "grown_mb": growth.mb_per_hour * hours,
            "leak_floor_mb": floor_mb,
            "ci_low": growth.ci_low,
            "ci_high": growth.ci_high,
            "confidence": growth.confidence,
            "stderr": growth.stderr,
            "n": growth.n,
            "rss_start_mb": rss[0],
            "rss_end_mb": rss[-1],
        }
        out.records.append(
            ctx.record("rss_growth_mb_per_hour", growth.mb_per_hour, "MB/h", annotations=notes)
        )
        interval = f"{confidence:.0%} interval {growth.ci_low:.3g} to {growth.ci_high:.3g}"
        if verdict == "leak":
            out.warnings.append(f"resident memory grows {growth.mb_per_hour:.3g} MB/h ({interval}): a leak")
        elif verdict == "growing":
            out.warnings.append(
                f"resident memory grew {notes['grown_mb']:.2g} MB over the run "
                f"({growth.mb_per_hour:.3g} MB/h, {interval}), under the {floor_mb:g} MB leak floor: "
                "a one-time allocation looks the same in a short run; run longer"
            )
    drift = drift_ratio([float(w["p50_ms"]) for w in r["windows"] if w.get("p50_ms") is not None])
    if drift is not None:
        ratio, early, late = drift
        notes = {"early_ms": early, "late_ms": late}
        out.records.append(ctx.record("latency_drift_ratio", ratio, "ratio", annotations=notes))
    out.records.append(ctx.record("load_ms", r["load_ms"], "ms"))
    out.records.append(ctx.record("peak_rss_mb", r["peak_rss_mb"], "MB"))
    ran = {"seconds": r.get("seconds"), "late": r.get("late")}
    out.records.append(ctx.record("samples_n", r["inferences"], "count", annotations=ran))
    out.samples.append(ctx.samples("rss_mb", "MB", rss, series="window"))
    out.samples.append(ctx.samples("rss_t_s", "s", t_s, series="window"))
    return out


def soak_summary(records: list[Any]) -> dict[str, Any]:
    """The headline figures of a soak's records, for the command line."""
    out: dict[str, Any] = {}
    for r in records:
        if r.metric in ("rss_growth_mb_per_hour", "latency_drift_ratio", "peak_rss_mb", "samples_n"):
            out[r.metric] = r.value
            if r.metric == "rss_growth_mb_per_hour":
                out["rss_growth_ci"] = [r.annotations.get("ci_low"), r.annotations.get("ci_high")]
                out["leak"] = r.annotations.get("verdict")
    return out


def rss_records(ctx: RecordContext, points: list[list[float]] | None) -> list[Any]:
    """`rss_mb` at each point (seconds since the run's origin, MB) of a run sampled on a thread."""
    return [ctx.record("rss_mb", mb, "MB", t_s=round(float(t), 3)) for t, mb in points or []]
