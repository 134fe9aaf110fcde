"""Records into pandas frames, one per report section. Pure functions: records in, DataFrames out.

Every frame is empty (with its columns) when the records hold nothing for it, so renderers can say
"no data" without special cases.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ...analysis.budgets import Budget
from ...analysis.fit_result import CvSummary, FitResult, Verdict
from ...analysis.observations import observations
from ...records import Record, RecordKey, Samples

# Metrics where a higher value is better (everything else compared in deltas is better lower).
HIGHER_IS_BETTER = {
    "effective_tops",
    "bandwidth_gbps",
    "efficiency",
    "sustained_ratio",
    "stability",
    "cosine",
    "snr_db",
    "best_threads",
}
DELTA_METRICS = {
    "latency_ms",
    "peak_rss_mb",
    "load_ms",
    "first_inference_ms",
    "effective_tops",
    "bandwidth_gbps",
    "energy_mj_per_inference",
    "power_mw",
    "sustained_ratio",
    "throttle_onset_s",
    "cosine",
    "max_abs_err",
    "snr_db",
    "op_time_ms",
}
# Params that describe a time series point, not the series: left out when grouping series.
_SERIES_POINT = ("t_s", "stat")


def frame(records: Iterable[Record]) -> pd.DataFrame:
    """All records, with each scalar param as its own `p.NAME` column next to the `params` dict."""
    rows = []
    for r in records:
        row = r.to_dict()
        for k, v in r.params.items():
            if v is None or isinstance(v, str | int | float | bool):
                row[f"p.{k}"] = v
        rows.append(row)
    cols = ["run_id", "device", "probe", "model", "runtime", "metric", "value", "unit", "params", "ts"]
    return pd.DataFrame(rows, columns=None if rows else cols)


def _select(records: Iterable[Record], probe: str, metrics: Sequence[str] | None = None) -> list[Record]:
    return [
        r
        for r in records
        if r.probe == probe
        and (metrics is None or r.metric in metrics)
        and r.value is not None
        and math.isfinite(r.value)
    ]


def params_label(params: Mapping[str, Any], skip: Sequence[str] = ()) -> str:
    """A short human label for params: `threads=2, dtype=fp32`."""
    parts = []
    for k, v in sorted(params.items()):
        if k in skip or v is None or v == "" or v == [] or v == {}:
            continue
        if isinstance(v, float):
            v = f"{v:g}"
        elif isinstance(v, list | dict):
            v = json.dumps(v, separators=(",", ":"))
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def bench_matrix(
    records: Sequence[Record], samples: Sequence[Samples] = (), run_order: Sequence[str] = ()
) -> pd.DataFrame:
    """Device x model: p50, p99, peak memory, energy per inference, load, at each pair's best configuration;
    and the worst cosine against the fp32 reference over its outputs (`accuracy`, its latest run), so one
    model on several runtimes reads side by side."""
    cosine = worst_cosine(records, run_order)
    rows = [
        {
            "device": o.device,
            "runtime": o.runtime or "",
            "model": o.model,
            "p50": o.latency.get("p50"),
            "p90": o.latency.get("p90"),
            "p99": o.latency.get("p99"),
            "mean": o.latency.get("mean"),
            "memory_mb": o.memory_mb,
            "energy_mj": o.energy_mj,
            "load_ms": o.load_ms,
            "cosine": cosine.get((o.device, o.model, o.runtime or "")),
            "config": params_label(o.config),
            "run_id": o.run_id,
            "estimated": ",".join(o.estimated),
        }
        for o in observations(records, samples, run_order)
    ]
    cols = [
        "device",
        "runtime",
        "model",
        "p50",
        "p90",
        "p99",
        "mean",
        "memory_mb",
        "energy_mj",
        "load_ms",
        "cosine",
        "config",
        "run_id",
        "estimated",
    ]
    return pd.DataFrame(rows, columns=cols)


def worst_cosine(
    records: Sequence[Record], run_order: Sequence[str] = ()
) -> dict[tuple[str, str, str], float]:
    """(device, model, runtime) -> the lowest cosine over its outputs in its latest `accuracy` run."""
    order = {rid: i for i, rid in enumerate(run_order)}
    latest: dict[tuple[str, str, str], tuple[tuple[int, str], float]] = {}
    for r in _select(records, "accuracy", ("cosine",)):
        key = (r.device, r.model or "", r.runtime or "")
        rank = (order.get(r.run_id, -1), r.run_id)
        seen = latest.get(key)
        if seen is None or rank > seen[0]:
            latest[key] = (rank, float(r.value))  # type: ignore[arg-type]
        elif rank == seen[0]:
            latest[key] = (rank, min(seen[1], float(r.value)))  # type: ignore[arg-type]
    return {key: value for key, (_, value) in latest.items()}


DECODE_COLUMNS = (
    "device", "model", "runtime", "prompt_tokens", "new_tokens", "threads", "depth", "ttft_ms",
    "prefill_tokens_per_s",
    "decode_ms_per_token", "decode_tokens_per_s", "floor_tokens_per_s", "decode_efficiency", "regime",
    "uncertain", "kv_cache_mb", "peak_rss_mb", "run_id",
)  # fmt: skip


def decode_summary(records: Sequence[Record], run_order: Sequence[str] = ()) -> pd.DataFrame:
    """LLM decode per device x model x configuration (latest run): tokens/s with the bandwidth floor's
    tokens/s beside it (1000 / decode_floor_ms: the most a decode that streams its weights from DRAM can
    reach), the efficiency, and whether the floor is backed; one row per context depth (llama.cpp decodes at
    several; the agent's decode at depth 0)."""
    order = {rid: i for i, rid in enumerate(run_order)}
    groups: dict[tuple, dict[str, Any]] = {}
    for r in _select(records, "decode"):
        p = r.params
        ident = (
            r.device,
            r.model or "",
            r.runtime or "",
            p.get("prompt_tokens"),
            p.get("new_tokens"),
            p.get("threads"),
            int(p.get("depth") or 0),
        )
        rank = (order.get(r.run_id, -1), r.run_id)
        g = groups.get(ident)
        if g is None or rank > g["rank"]:
            g = groups[ident] = {"rank": rank, "run_id": r.run_id}
        if r.run_id != g["run_id"] or p.get("stat") not in (None, "p50"):
            continue
        g[r.metric] = r.value
        if r.metric == "decode_floor_ms":
            g["floor_tokens_per_s"] = 1e3 / r.value if r.value else None
            g["regime"] = r.annotations.get("regime")
            g["uncertain"] = bool(r.annotations.get("uncertain"))
    rows = []
    for ident, g in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        keys = dict(zip(DECODE_COLUMNS[:7], ident, strict=True))
        rows.append({**keys, **{c: g.get(c) for c in DECODE_COLUMNS[7:]}})
    return pd.DataFrame(rows, columns=list(DECODE_COLUMNS))


def budget_status(value: float | None, budget: Budget | None) -> str:
    """ok (10% headroom), near (within 10% of the limit), over (past it), or none (no budget / no value).
    A rate budget (`decode_tokens_per_s_min`) is past its limit below it."""
    if budget is None or value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    margin = budget.margin(value)
    if margin < 0:
        return "over"
    return "near" if margin < 0.1 else "ok"


def ceilings(records: Sequence[Record], device_info: Sequence[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """Measured ceilings vs the datasheet: best effective TOPS per dtype and backend, bandwidth per kernel."""
    from ...lab.nominal import derived_peak

    datasheet: dict[str, dict[str, Any]] = {}
    derived: dict[str, Any] = {}
    for info in device_info:
        datasheet[info["device"]] = (info.get("descriptor") or {}).get("spec") or {}
        derived[info["device"]] = derived_peak(info.get("fingerprint") or {}) or derived.get(info["device"])
    rows = []
    groups: dict[tuple, list[Record]] = {}
    for r in _select(records, "matmul", ["effective_tops"]):
        key = (r.device, "matmul", r.params.get("dtype", "fp32"), r.params.get("backend") or r.runtime or "")
        groups.setdefault(key, []).append(r)
    for r in _select(records, "bandwidth", ["bandwidth_gbps"]):
        key = (r.device, "bandwidth", r.params.get("kernel", ""), r.params.get("backend") or "")
        groups.setdefault(key, []).append(r)
    eff_records = {
        (r.device, r.params.get("dtype", "fp32"), r.params.get("backend") or r.runtime or ""): r.value
        for r in _select(records, "matmul", ["efficiency"])
    }
    for (device, kind, what, backend), recs in sorted(groups.items()):
        best = max(recs, key=lambda r: r.value or 0.0)
        spec = datasheet.get(device, {})
        source = "datasheet"
        if kind == "matmul":
            nominal = (spec.get("peak_tops") or {}).get(what)
            unit = "TOPS"
            peak = derived.get(device)
            if nominal is None and peak is not None and what in peak.tops:
                nominal, source = peak.tops[what], f"derived: {peak.basis}"
        else:
            nominal = spec.get("memory_bandwidth_gbps")
            unit = "GB/s"
        eff = (
            best.value / nominal
            if nominal
            else eff_records.get((device, what, backend))
            if kind == "matmul"
            else None
        )
        rows.append(
            {
                "device": device,
                "kind": kind,
                "what": what,
                "backend": backend,
                "best": best.value,
                "unit": unit,
                "datasheet": nominal,
                "efficiency": eff,
                "at": params_label(best.params, skip=("dtype", "kernel", "backend", "stat")),
                "nominal_source": source if nominal else "",
            }
        )
    cols = [
        "device", "kind", "what", "backend", "best", "unit", "datasheet", "efficiency", "at", "nominal_source"
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def ceiling_cells(r: Any, number: Callable[[Any], str]) -> list[Any]:
    """One ceilings row's cells up to the nominal, the nominal marked "(derived)" where no datasheet gave
    it (an upper bound from the ISA, not a vendor's number); `number` formats it as the page does."""
    nominal = f"{number(r.datasheet)} (derived)" if r.nominal_source.startswith("derived") else r.datasheet
    return [r.device, r.kind, r.what, r.backend, r.best, r.unit, nominal]


def derived_nominals(c: pd.DataFrame) -> list[tuple[str, str]]:
    """(device, how its nominal was derived) of the devices whose ceilings stand on a derived peak."""
    return sorted(
        {(r.device, r.nominal_source) for r in c.itertuples() if r.nominal_source.startswith("derived")}
    )


def arm_details(fingerprint: Mapping[str, Any]) -> str:
    """An Arm device's SIMD features, clusters (core names from the MIDR) and derived nominal peak in one
    line; "" for other architectures. Both renderers show it beside the device, so the peak a report's
    efficiencies are taken against is never a bare number."""
    if not str(fingerprint.get("arch") or "").startswith(("aarch64", "arm")):
        return ""
    from ...lab.nominal import cluster_summary, derived_peak

    parts = []
    if fingerprint.get("cpu_flags"):
        parts.append("SIMD: " + " ".join(fingerprint["cpu_flags"]))
    if fingerprint.get("cpu_clusters"):
        parts.append("clusters: " + cluster_summary(fingerprint["cpu_clusters"]))
    peak = derived_peak(fingerprint)
    if peak is not None:
        tops = ", ".join(f"{k} {v:.3g}" for k, v in peak.tops.items())
        parts.append(f"nominal peak (derived, not datasheet): {tops} TOPS from {peak.basis}")
    return "; ".join(parts)


def device_peaks(ceil: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per device: best FLOP/s per dtype and best bandwidth (bytes/s), for the roofline plot."""
    out: dict[str, dict[str, Any]] = {}
    for row in ceil.itertuples():
        d = out.setdefault(row.device, {"flops": {}, "bandwidth": None})
        if row.kind == "matmul":
            d["flops"][row.what] = max(d["flops"].get(row.what, 0.0), row.best * 1e12)
        else:
            d["bandwidth"] = max(d["bandwidth"] or 0.0, row.best * 1e9)
    return out


def roofline(
    records: Sequence[Record], matrix: pd.DataFrame, counts: Mapping[str, tuple[float, float]] | None = None
) -> pd.DataFrame:
    """Per device x model: FLOPs, weight bytes, intensity, achieved FLOP/s, and the roofline probe's verdict.

    Counts come from `roofline` records (per model, any device) and `counts` (e.g. from fit records).
    """
    flops: dict[str, float] = {}
    wbytes: dict[str, float] = {}
    per_pair: dict[tuple, dict[str, Any]] = {}
    for r in _select(records, "roofline"):
        if r.model is None:
            continue
        if r.metric == "flops" and r.params.get("scope", "total") == "total":
            flops[r.model] = float(r.value or 0.0)
        elif r.metric == "weight_bytes":
            wbytes[r.model] = float(r.value or 0.0)
        elif r.metric in ("floor_ms", "efficiency"):
            d = per_pair.setdefault((r.device, r.model), {})
            d[r.metric] = r.value
            if r.params.get("bound"):
                d["bound"] = r.params["bound"]
    for model, (f, w) in (counts or {}).items():
        flops.setdefault(model, f)
        wbytes.setdefault(model, w)
    rows = []
    seen = set()
    for m in matrix.itertuples():
        if m.model not in flops:
            continue
        seen.add((m.device, m.model))
        f, w = flops[m.model], wbytes.get(m.model) or float("nan")
        extra = per_pair.get((m.device, m.model), {})
        rows.append(
            {
                "device": m.device,
                "runtime": m.runtime,
                "model": m.model,
                "flops": f,
                "weight_bytes": w,
                "intensity": f / w if w and w == w and w > 0 else float("nan"),
                "latency_ms": m.p50,
                "achieved_gflops": f / (m.p50 / 1e3) / 1e9 if m.p50 else float("nan"),
                "floor_ms": extra.get("floor_ms"),
                "bound": extra.get("bound"),
                "efficiency": extra.get("efficiency"),
            }
        )
    for (device, model), extra in per_pair.items():
        if (device, model) in seen:
            continue
        f, w = flops.get(model, float("nan")), wbytes.get(model, float("nan"))
        rows.append(
            {
                "device": device,
                "runtime": "",
                "model": model,
                "flops": f,
                "weight_bytes": w,
                "intensity": f / w if w and w == w and w > 0 else float("nan"),
                "latency_ms": None,
                "achieved_gflops": float("nan"),
                "floor_ms": extra.get("floor_ms"),
                "bound": extra.get("bound"),
                "efficiency": extra.get("efficiency"),
            }
        )
    cols = [
        "device",
        "runtime",
        "model",
        "flops",
        "weight_bytes",
        "intensity",
        "latency_ms",
        "achieved_gflops",
        "floor_ms",
        "bound",
        "efficiency",
    ]
    return pd.DataFrame(rows, columns=cols)


def floors(records: Sequence[Record], run_order: Sequence[str] = ()) -> pd.DataFrame:
    """Per benched configuration (device, runtime, model, threads, shapes; latest run): the roofline floor
    from the ceilings measured at its thread count and the memory level its working set lives in, the
    measured p50, floor / measured, and, where the measurement beats its floor, by how much and why."""
    from ...analysis.ceilings import BEATS_MARGIN, model_floors

    rows = []
    for f in model_floors(records, run_order):
        shapes = f.config.get("shapes") or {}
        note = f.reason()
        if note is None:
            note = (
                f"within the floor's margin ({f.beats_by:.0%} under it)"
                if f.beats_by > 0
                else "the floor holds"
            )
        rows.append(
            {
                "device": f.device,
                "runtime": f.runtime or "",
                "model": f.model,
                "threads": f.config.get("threads"),
                "shapes": ", ".join(f"{k}={'x'.join(str(d) for d in v)}" for k, v in sorted(shapes.items())),
                "flops": f.counts.flops,
                "floor_bytes": f.counts.floor_bytes,
                "working_set_bytes": f.counts.working_set_bytes,
                "intensity": f.counts.flops / f.counts.floor_bytes if f.counts.floor_bytes else float("nan"),
                "level": f.floor.level,
                "bandwidth_gbps": f.floor.bandwidth_gbps,
                "peak_gflops": max(f.ceilings.peak_tops.values(), default=0.0) * 1e3,
                "bound": f.floor.bound,
                "floor_ms": f.floor.floor_ms,
                "latency_ms": f.measured_ms,
                "achieved_gflops": f.achieved_gflops,
                "efficiency": f.efficiency,
                "beats_by": f.beats_by,
                "named": f.beats_by > BEATS_MARGIN,
                "note": note,
                "ceiling_runs": ", ".join(
                    sorted({*f.ceilings.peak_runs.values(), f.ceilings.bandwidth_run or ""} - {""})
                ),
            }
        )
    cols = [
        "device", "runtime", "model", "threads", "shapes", "flops", "floor_bytes", "working_set_bytes",
        "intensity", "level", "bandwidth_gbps", "peak_gflops", "bound", "floor_ms", "latency_ms",
        "achieved_gflops", "efficiency", "beats_by", "named", "note", "ceiling_runs",
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def thread_sweep(records: Sequence[Record]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(curve points, best thread counts) from probe `threads`."""
    rows = []
    for r in _select(records, "threads", ["latency_ms"]):
        stat = r.params.get("stat", "p50")
        if stat not in ("p50", None):
            continue
        threads = r.params.get("threads")
        if threads is None:
            continue
        series = params_label(r.params, skip=("threads", "stat"))
        rows.append(
            {
                "device": r.device,
                "model": r.model or "",
                "runtime": r.runtime or "",
                "series": series,
                "threads": int(threads),
                "latency_ms": r.value,
                "run_id": r.run_id,
            }
        )
    best = [
        {
            "device": r.device,
            "model": r.model or "",
            "runtime": r.runtime or "",
            "best_threads": r.value,
            "note": params_label(r.params),
        }
        for r in _select(records, "threads", ["best_threads"])
    ]
    curve = pd.DataFrame(
        rows, columns=["device", "model", "runtime", "series", "threads", "latency_ms", "run_id"]
    )
    return curve.sort_values(["device", "model", "series", "threads"]).reset_index(drop=True), pd.DataFrame(
        best, columns=["device", "model", "runtime", "best_threads", "note"]
    )


def latency_samples(samples: Sequence[Samples]) -> list[dict[str, Any]]:
    """Raw bench latencies per device x model x config (the distributions)."""
    out = []
    for s in samples:
        if s.probe == "bench" and s.metric == "latency_ms" and s.values:
            out.append(
                {
                    "device": s.device,
                    "model": s.model or "",
                    "runtime": s.runtime or "",
                    "config": params_label(s.params),
                    "run_id": s.run_id,
                    "values": np.asarray(s.values),
                }
            )
    return out


def series(records: Sequence[Record], probe: str, metrics: Sequence[str]) -> pd.DataFrame:
    """Time series (records with `t_s`) of a probe: one row per point, `series` labels the rest of params."""
    rows = []
    for r in _select(records, probe, metrics):
        t = r.params.get("t_s")
        if t is None:
            continue
        rows.append(
            {
                "device": r.device,
                "model": r.model or "",
                "runtime": r.runtime or "",
                "metric": r.metric,
                "unit": r.unit,
                "series": params_label(r.params, skip=_SERIES_POINT),
                "t_s": float(t),
                "value": r.value,
                "run_id": r.run_id,
            }
        )
    cols = ["device", "model", "runtime", "metric", "unit", "series", "t_s", "value", "run_id"]
    return pd.DataFrame(rows, columns=cols).sort_values(["device", "model", "metric", "series", "t_s"])


def scalars(records: Sequence[Record], probe: str, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Records of a probe that are not time-series points (summaries like throttle_onset_s, power_mw)."""
    rows = [
        {
            "device": r.device,
            "model": r.model or "",
            "runtime": r.runtime or "",
            "metric": r.metric,
            "value": r.value,
            "unit": r.unit,
            "params": params_label(r.params),
            "run_id": r.run_id,
        }
        for r in _select(records, probe, metrics)
        if "t_s" not in r.params
    ]
    return pd.DataFrame(
        rows, columns=["device", "model", "runtime", "metric", "value", "unit", "params", "run_id"]
    )


def probe_samples(samples: Sequence[Samples], probe: str) -> list[Samples]:
    return [s for s in samples if s.probe == probe and s.values]


def top_ops(records: Sequence[Record], n: int = 10) -> pd.DataFrame:
    """Per device x model, the n nodes that take the most time (probe `profile`, metric `op_time_ms`)."""
    rows = []
    for r in _select(records, "profile", ["op_time_ms"]):
        rows.append(
            {
                "device": r.device,
                "model": r.model or "",
                "runtime": r.runtime or "",
                "node": str(r.params.get("node", "?")),
                "op_type": str(r.params.get("op_type", "?")),
                "ms": r.value,
                "run_id": r.run_id,
            }
        )
    df = pd.DataFrame(rows, columns=["device", "model", "runtime", "node", "op_type", "ms", "run_id"])
    if df.empty:
        return df.assign(share=pd.Series(dtype=float))
    # Latest run only per device x model, so two runs of a profile do not add up.
    latest = df.groupby(["device", "model", "runtime"])["run_id"].transform("max")
    df = df[df["run_id"] == latest]
    df = df.groupby(["device", "model", "runtime", "node", "op_type"], as_index=False)["ms"].sum()
    df["share"] = df["ms"] / df.groupby(["device", "model", "runtime"])["ms"].transform("sum")
    return (
        df.sort_values(["device", "model", "runtime", "ms"], ascending=[True, True, True, False])
        .groupby(["device", "model", "runtime"])
        .head(n)
        .reset_index(drop=True)
    )


def op_type_totals(records: Sequence[Record]) -> pd.DataFrame:
    ops = top_ops(records, n=10**9)
    if ops.empty:
        return pd.DataFrame(columns=["device", "model", "runtime", "op_type", "ms"])
    return ops.groupby(["device", "model", "runtime", "op_type"], as_index=False)["ms"].sum()


def accuracy(records: Sequence[Record]) -> pd.DataFrame:
    """Numerics vs the reference: cosine, max_abs_err, snr_db (and mean_abs_err) per output."""
    metrics = ("cosine", "max_abs_err", "mean_abs_err", "snr_db")
    rows: dict[tuple, dict[str, Any]] = {}
    for r in records:
        if r.metric not in metrics or r.value is None or r.probe == "sensitivity":
            continue
        label = params_label(r.params, skip=("stat",))
        key = (r.device, r.model or "", r.runtime or "", label, r.run_id)
        row = rows.setdefault(
            key,
            {
                "device": r.device,
                "model": r.model or "",
                "runtime": r.runtime or "",
                "detail": label,
                "run_id": r.run_id,
            },
        )
        row[r.metric] = r.value
    cols = [
        "device",
        "model",
        "runtime",
        "detail",
        "cosine",
        "max_abs_err",
        "mean_abs_err",
        "snr_db",
        "run_id",
    ]
    return pd.DataFrame(list(rows.values()), columns=cols)


HISTORY_MIN_RUNS = 5
_HISTORY_COLS = [
    "device",
    "model",
    "runtime",
    "series",
    "run_id",
    "previous_run",
    "before",
    "after",
    "change",
    "p_value",
    "unit",
]


def history(
    records: Sequence[Record], min_runs: int = HISTORY_MIN_RUNS, max_series: int = 200
) -> tuple[pd.DataFrame, list[dict[str, Any]], int]:
    """Change points: stored `history` records, else found now in the bench series of the selected runs.

    Returns (change points, the series that stepped with their points for plotting, series examined).
    Series need `min_runs` runs; detection is analysis.history's (a change-point test, not a threshold).
    """
    stored = [r for r in records if r.probe == "history" and r.metric == "change_point"]
    rows: list[dict[str, Any]] = []
    plotted: list[dict[str, Any]] = []
    examined = 0
    if stored:
        for r in stored:
            p = r.params
            label = f"{p.get('series_probe', '?')}:{p.get('series_metric', '?')}" + (
                f"[{p['stat']}]" if p.get("stat") else ""
            )
            rows.append(
                {
                    "device": r.device,
                    "model": r.model or "",
                    "runtime": r.runtime or "",
                    "series": label,
                    "run_id": r.run_id,
                    "previous_run": p.get("previous_run", ""),
                    "before": p.get("before"),
                    "after": p.get("after"),
                    "change": r.value,
                    "p_value": p.get("p_value"),
                    "unit": p.get("level_unit", ""),
                }
            )
        return pd.DataFrame(rows, columns=_HISTORY_COLS), plotted, len({(r.device, r.model) for r in stored})
    from ...analysis.history import build_series, change_points

    bench = [r for r in records if r.probe == "bench" and r.metric in ("latency_ms", "peak_rss_mb")]
    candidates = [s for s in build_series(bench, stat="p50") if len(s.points) >= min_runs][:max_series]
    for series in candidates:
        examined += 1
        cps = change_points(series)
        if not cps:
            continue
        for cp in cps:
            rows.append(
                {
                    "device": series.device,
                    "model": series.model or "",
                    "runtime": series.runtime or "",
                    "series": f"{series.probe}:{series.metric}" + (f"[{series.stat}]" if series.stat else ""),
                    "run_id": cp.run_id,
                    "previous_run": cp.previous_run,
                    "before": cp.before,
                    "after": cp.after,
                    "change": cp.change,
                    "p_value": cp.p_value,
                    "unit": series.unit,
                }
            )
        plotted.append(
            {
                "label": series.label(),
                "unit": series.unit,
                "values": [p.value for p in series.points],
                "runs": [p.run_id for p in series.points],
                "ts": [p.ts for p in series.points],
                "steps": [cp.run_id for cp in cps],
            }
        )
    return pd.DataFrame(rows, columns=_HISTORY_COLS), plotted, examined


def deltas(records: Sequence[Record], run_order: Sequence[str], threshold: float = 0.05) -> pd.DataFrame:
    """With two or more runs: each measurement in the earliest run that has it vs the latest that has it.

    Raw deltas: `direction` says which way the value moved ("up", "down", or "same" under `threshold`),
    never better or worse; whether a move is a regression is the gate's question (its rule, its test)."""
    order = {rid: i for i, rid in enumerate(run_order)}
    by_key: dict[RecordKey, dict[str, float]] = {}
    for r in records:
        if (
            r.metric not in DELTA_METRICS
            or r.value is None
            or r.probe in ("fit", "history")
            or r.run_id not in order
            or "t_s" in r.params
        ):
            continue
        by_key.setdefault(r.key(), {})[r.run_id] = r.value  # the one pairing rule, as the gate pairs
    rows = []
    for key, values in sorted(by_key.items()):
        device, probe, metric, params = key.device, key.probe, key.metric, key.params
        model, runtime = ("" if v == "-" else v for v in (key.model, key.runtime))
        if len(values) < 2:
            continue
        runs = sorted(values, key=order.__getitem__)
        base, last = values[runs[0]], values[runs[-1]]
        change = (last - base) / abs(base) if base else float("nan")
        if change != change or abs(change) < threshold:
            direction = "same"
        else:
            direction = "up" if change > 0 else "down"
        rows.append(
            {
                "device": device,
                "model": model,
                "runtime": runtime,
                "probe": probe,
                "metric": metric,
                "params": params_label(json.loads(params)),
                "baseline_run": runs[0],
                "baseline": base,
                "latest_run": runs[-1],
                "latest": last,
                "change": change,
                "direction": direction,
            }
        )
    cols = [
        "device",
        "model",
        "runtime",
        "probe",
        "metric",
        "params",
        "baseline_run",
        "baseline",
        "latest_run",
        "latest",
        "change",
        "direction",
    ]
    return pd.DataFrame(rows, columns=cols)


VERDICT_COLUMNS = [
    "device",
    "runtime",
    "model",
    "fits",
    "verdict",
    "why",
    "basis",
    "limiting",
    "ratio",
    "intervals",
    "values",
    "budgets",
    "unchecked",
    "evidence",
    "config",
    "predicted",
    "flops",
    "weight_bytes",
]
SUMMARY_INDEX = ["device", "runtime", "predictor", "holdout", "quantity", "pairs"]
POINT_COLUMNS = [
    "device",
    "runtime",
    "predictor",
    "model",
    "holdout",
    "quantity",
    "measured",
    "predicted",
    "error",
]
CALIBRATION_COLUMNS = [
    "device",
    "runtime",
    "models",
    "method",
    "efficiency",
    "overhead_ms",
    "per_node_us",
    "local_correction",
    "ceilings",
]


def fit_tables(fit: FitResult) -> dict[str, pd.DataFrame]:
    """Verdicts, cross-validation summaries, cross-validation points and calibrations of a fit result;
    the summaries and points name their predictor (`roofline` or `kernel`) and a summary its interval on
    measured / predicted where the predictor gives one for its target."""
    limits = {b.key: b.limit for b in fit.budgets}
    return {
        "verdicts": pd.DataFrame([_verdict_row(v, limits) for v in fit.verdicts], columns=VERDICT_COLUMNS),
        "summary": _summary_table(fit.cv_summaries()),
        "points": pd.DataFrame(
            [
                [p.device, p.runtime or "", p.predictor, p.model, p.holdout, p.quantity]
                + [p.measured, p.predicted, p.error]
                for p in fit.cv
            ],
            columns=POINT_COLUMNS,
        ),
        "calibration": pd.DataFrame(
            [
                [device, runtime or "", desc.get("models")]
                + [desc.get("method"), desc.get("efficiency") or {}, desc.get("overhead_ms")]
                + [desc.get("per_node_us"), desc.get("local_correction"), desc.get("ceilings") or {}]
                for (device, runtime), desc in sorted(
                    fit.calibrations.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
                )
            ],
            columns=CALIBRATION_COLUMNS,
        ),
    }


def _verdict_row(v: Verdict, limits: Mapping[str, float]) -> dict[str, Any]:
    weights = v.counts.weight_bytes if v.counts is not None else None
    return {
        "device": v.device,
        "runtime": v.runtime or "",
        "model": v.model or "",
        "fits": None if v.fits is None else float(v.fits),
        "verdict": v.verdict,
        "why": v.why or "",
        "basis": v.basis,
        "limiting": v.limiting,
        "ratio": v.ratio,
        "intervals": {k: list(iv) for k, iv in v.intervals.items()},
        "values": v.values,
        "budgets": v.limits or dict(limits),
        "unchecked": list(v.unchecked),
        "evidence": v.evidence or "",
        "config": params_label(v.config or {}),
        "predicted": v.predicted,
        "flops": v.counts.flops if v.counts is not None else None,
        "weight_bytes": None if weights is None or weights != weights else weights,
    }


def _summary_table(summaries: Sequence[CvSummary]) -> pd.DataFrame:
    """One row per predictor x target x holdout x quantity, sorted so."""
    if not summaries:
        return pd.DataFrame(columns=[*SUMMARY_INDEX[:-1], "metric", "value", "pairs"])
    rows = [
        {
            "device": s.device,
            "runtime": s.runtime or "",
            "predictor": s.predictor,
            "holdout": s.holdout,
            "quantity": s.quantity,
            "pairs": s.pairs,
            "cv_median_abs_err": s.median_abs_err,
            "cv_within_10pct": s.within,
            "interval": s.interval,
            "coverage": s.coverage if s.interval else None,
            "judged": s.judged,
            "too_few": s.too_few(),
        }
        for s in summaries
    ]
    return pd.DataFrame(rows).sort_values(SUMMARY_INDEX, kind="stable").reset_index(drop=True)


def fit_counts(fit: FitResult) -> dict[str, tuple[float, float]]:
    """Model FLOPs and weight bytes carried in fit's verdicts (for the roofline plot)."""
    return {
        v.model: (float(v.counts.flops), float(v.counts.weight_bytes))
        for v in fit.verdicts
        if v.model and v.counts is not None
    }


def profile_shapes(records: Sequence[Record]) -> dict[tuple[str, str, str], str]:
    """The input shapes each device x model x runtime profile ran at (`x=1x3x224x224`), from what the
    agent fed (annotations) or the shapes asked for (params); "not recorded" for older profiles."""
    out: dict[tuple[str, str, str], str] = {}
    for r in records:
        if r.probe != "profile" or r.metric != "op_time_total_ms":
            continue
        shapes = r.annotations.get("input_shapes") or r.params.get("shapes")
        text = (
            ", ".join(f"{k}={'x'.join(str(d) for d in v)}" for k, v in sorted(shapes.items()))
            if isinstance(shapes, dict) and shapes
            else "input shapes not recorded"
        )
        out[(r.device, r.model or "", r.runtime or "")] = text
    return out


VARIANT_COLUMNS = [
    "source",
    "variant",
    "model",
    "device",
    "runtime",
    "size_bytes",
    "size_ratio",
    "p50",
    "p99",
    "memory_mb",
    "cosine",
    "snr_db",
    "verdict",
    "reference",
    "speedup",
    "speedup_low",
    "speedup_high",
]


def variants(
    records: Sequence[Record],
    matrix: pd.DataFrame,
    fit_verdicts: pd.DataFrame,
    samples: Sequence[Samples] = (),
    run_order: Sequence[str] = (),
) -> pd.DataFrame:
    """One row per variant (and per device it was benched on): size and size x fp32 from `variants`,
    latency and memory from `bench`, the worst cosine and SNR over its outputs from `accuracy`, and its
    fit verdict. A variant is known by its model name (the file stem, e.g. `enc.int8-static`); variants
    benched without `edgebench variants` records are paired with their fp32 reference by name or by their
    accuracy records (edgebench.analysis.variants), which also gives each row its p50 speed-up over the
    reference with a bootstrap interval."""
    made: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.probe != "variants" or r.model is None:
            continue
        row = made.setdefault(
            r.model,
            {"source": r.params.get("source", ""), "variant": r.params.get("variant", ""), "model": r.model},
        )
        row.setdefault("runtime", r.runtime or "")
        row[r.metric] = r.value
    worst: dict[tuple[str, str], dict[str, float]] = {}
    for r in records:
        if r.probe == "accuracy" and r.metric in ("cosine", "snr_db") and r.value is not None and r.model:
            acc = worst.setdefault((r.device, r.model), {})
            acc[r.metric] = min(acc.get(r.metric, math.inf), float(r.value))
    verdicts = (
        {(v.device, v.model): v.verdict for v in fit_verdicts.itertuples()} if len(fit_verdicts) else {}
    )
    paired = _paired_variants(records, samples, run_order, verdicts)
    rows = []
    for name, v in sorted(made.items(), key=lambda kv: (kv[1]["source"], kv[1].get("size_ratio") or 0)):
        benched = matrix[matrix["model"] == name] if len(matrix) else matrix
        targets = [(b.device, b.runtime, b) for b in benched.itertuples()] or [
            (d, v["runtime"], None) for d in sorted({d for d, m in worst if m == name}) or ["–"]
        ]
        for device, runtime, b in targets:
            acc = worst.get((device, name), {})
            rows.append(
                {
                    **{k: v.get(k) for k in ("source", "variant", "model", "size_bytes", "size_ratio")},
                    "device": device,
                    "runtime": runtime,
                    "p50": getattr(b, "p50", None),
                    "p99": getattr(b, "p99", None),
                    "memory_mb": getattr(b, "memory_mb", None),
                    "cosine": acc.get("cosine"),
                    "snr_db": acc.get("snr_db"),
                    "verdict": verdicts.get((device, name), ""),
                    **_speedup(paired.get((device, name))),
                }
            )
    for (device, name), pr in sorted(paired.items()):
        if name in made:
            continue
        b = matrix[(matrix["model"] == name) & (matrix["device"] == device)] if len(matrix) else matrix
        first = next(iter(b.itertuples()), None)
        rows.append(
            {
                "source": pr.reference,
                "variant": pr.kind or name.removeprefix(pr.reference).lstrip("._-"),
                "model": name,
                "device": device,
                "runtime": pr.runtime or "",
                "size_bytes": pr.size_bytes,
                "size_ratio": pr.size_ratio,
                "p50": getattr(first, "p50", pr.p50_ms),
                "p99": getattr(first, "p99", None),
                "memory_mb": getattr(first, "memory_mb", None),
                "cosine": pr.cosine,
                "snr_db": pr.snr_db,
                "verdict": pr.verdict,
                **_speedup(pr),
            }
        )
    return pd.DataFrame(rows, columns=VARIANT_COLUMNS)


def _paired_variants(
    records: Sequence[Record],
    samples: Sequence[Samples],
    run_order: Sequence[str],
    verdicts: Mapping[tuple[str, str], str],
) -> dict[tuple[str, str], Any]:
    """(device, variant) -> its row against the fp32 reference (edgebench.analysis.variants)."""
    from ...analysis.variants import variant_rows

    obs = observations(records, samples, run_order)
    return {(r.device, r.variant): r for r in variant_rows(records, samples, obs, verdicts)}


def _speedup(row: Any) -> dict[str, Any]:
    if row is None:
        return {}
    return {
        "reference": row.reference,
        "speedup": row.speedup,
        "speedup_low": row.speedup_low,
        "speedup_high": row.speedup_high,
    }


def sensitivity(records: Sequence[Record], n: int = 10) -> pd.DataFrame:
    """Per model and bit width, the n layers whose fake quantization alone hurts the output most."""
    rows: dict[tuple, dict[str, Any]] = {}
    for r in records:
        if r.probe != "sensitivity" or r.metric not in ("cosine", "snr_db"):
            continue
        key = (r.device, r.model or "", r.params.get("bits"), r.params.get("node"), r.run_id)
        row = rows.setdefault(
            key,
            {
                "device": r.device,
                "model": r.model or "",
                "bits": r.params.get("bits"),
                "node": r.params.get("node", "?"),
                "op_type": r.params.get("op_type", "?"),
                "weight": r.params.get("weight", ""),
                "rank": r.annotations.get("rank"),
                "run_id": r.run_id,
            },
        )
        row[r.metric] = r.value
    cols = ["device", "model", "bits", "rank", "node", "op_type", "weight", "cosine", "snr_db", "run_id"]
    df = pd.DataFrame(list(rows.values()), columns=cols)
    if df.empty:
        return df
    latest = df.groupby(["device", "model", "bits"])["run_id"].transform("max")
    df = df[df["run_id"] == latest].sort_values(["device", "model", "bits", "cosine"])
    return df.groupby(["device", "model", "bits"]).head(n).reset_index(drop=True)


DISTURBED = ("outlier", "disturb", "did not cool", "starts warm", "throttl", "transport error")
HEALTH_COLUMNS = ["device", "status", "jobs", "failed", "disturbed", "notes"]


def health(
    runs: Sequence[Any],
    jobs: Sequence[Mapping[str, Any]],
    errors: Sequence[Mapping[str, Any]],
    records: Sequence[Record],
) -> pd.DataFrame:
    """Per device over the selected runs: jobs ok and failed, jobs whose warnings say the device was
    disturbed (outliers, not cooled down, transport retries) or whose measured disturbance passes the
    default threshold (others' CPU share, run-queue wait: analysis.disturbance), lab failures, and what
    `doctor` records (probe `doctor`) say. Further health figures join here as more `notes`."""
    from ...analysis.disturbance import Thresholds, by_job, summary

    selected = {r.run_id for r in runs}
    measured = by_job(r for r in records if r.run_id in selected)
    rows = []
    for device in sorted({j["device"] for j in jobs if j["run_id"] in selected}):
        mine = [j for j in jobs if j["device"] == device and j["run_id"] in selected]
        failed = [e for e in errors if e["device"] == device and e["run_id"] in selected]
        disturbed = [j for j in mine if _disturbance(j.get("warnings") or [])]
        notes = [f"lab: {e.get('error')}" for e in failed if e.get("kind") == "lab"][:2]
        for d in disturbed[:3]:
            notes.append(
                f"{d['probe']} {d.get('model') or ''}: {_disturbance(d['warnings'])}".replace("  ", " ")
            )
        mine_measured = {k: d for k, d in measured.items() if k[1] == device}
        flagged = [(k, why) for k, d in sorted(mine_measured.items()) if (why := Thresholds().evidence(d))]
        for k, why in flagged[:3]:
            inv = f" invocation {k[6]}" if k[6] else ""
            notes.append(f"measured: {k[4]} {'' if k[2] == '-' else k[2]}{inv}: {why}".replace("  ", " "))
        if len(flagged) > 3:
            notes.append(f"measured: {len(flagged) - 3} more disturbed job(s)")
        if mine_measured and not flagged:
            worst = max(mine_measured.values(), key=lambda d: d.others_cpu_share or 0.0)
            notes.append(f"measured: {len(mine_measured)} job(s) quiet (at worst {summary(worst)})")
        for r in records:
            if r.probe == "doctor" and r.device == device and r.value is not None:
                verdict = r.annotations.get("verdict") or r.params.get("verdict") or ""
                notes.append(f"doctor {r.metric} = {r.value:.4g} {r.unit} {verdict}".strip())
        lab = any(e.get("kind") == "lab" for e in failed)
        if lab and len(failed) == len(mine):
            status = "unreachable"
        elif lab:
            status = "lab errors"
        else:
            status = "disturbed" if disturbed or flagged else ("jobs failed" if failed else "ok")
        rows.append(
            {
                "device": device,
                "status": status,
                "jobs": len(mine),
                "failed": len(failed),
                "disturbed": max(len(disturbed), len(flagged)),
                "notes": notes,
                "runs": len({j["run_id"] for j in mine}),
            }
        )
    return pd.DataFrame(rows, columns=[*HEALTH_COLUMNS, "runs"])


def _disturbance(warnings: Sequence[str]) -> str:
    """The first warning that says the device was disturbed, or ""."""
    return next((w for w in warnings if any(d in w.lower() for d in DISTURBED)), "")
