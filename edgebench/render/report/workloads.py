"""Report sections for the workloads phone teams tune: streaming (real-time factor), cold load, soak (memory
over a long run), contention (a co-running load) and layer-wise divergence (the first op over tolerance).

Each builder is pure, like the other sections: ReportData in, (HTML, has data) out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...records import Record
from . import frames, plots
from .data import ReportData
from .markup import esc, figure, fmt, nodata, table


def _latest(records: Sequence[Record], probe: str, metrics: Sequence[str], **match: Any) -> list[Record]:
    """The newest record of each key among those of `probe` and `metrics` whose params match."""
    latest: dict[Any, Record] = {}
    for r in sorted(records, key=lambda r: r.run_id):
        if r.probe != probe or r.metric not in metrics:
            continue
        if all(r.params.get(k) == v for k, v in match.items()):
            latest[r.key()] = r
    return list(latest.values())


def _row_key(r: Record, skip: Sequence[str]) -> tuple[str, str, str, str]:
    return (r.device, r.model or "", r.runtime or "", frames.params_label(r.params, skip=skip))


def streaming(d: ReportData) -> tuple[str, bool]:
    recs = _latest(d.measurements, "bench", ("frame_latency_ms", "rtf", "deadline_miss_ratio"), stream=True)
    if not recs:
        return nodata("streaming benches (bench --stream)"), False
    rows: dict[tuple, dict[str, Any]] = {}
    for r in recs:
        row = rows.setdefault(_row_key(r, ("stat", "stream")), {})
        stat = r.params.get("stat")
        row[f"{r.metric}:{stat}" if stat else r.metric] = r.value
    cols = [
        "frame_latency_ms:p50",
        "frame_latency_ms:p99",
        "rtf:p50",
        "rtf:p99",
        "rtf:mean",
        "deadline_miss_ratio",
    ]
    body = table(
        ["device", "model", "runtime", "params", "frame p50 ms", "frame p99 ms", "RTF p50", "RTF p99",
         "RTF mean", "deadline misses"],
        [[*k, *(fmt(v.get(c)) for c in cols)] for k, v in sorted(rows.items())],
    )  # fmt: skip
    note = (
        "<p>RTF = frame latency / the time the frame holds: under 1 the model keeps up with the stream.</p>"
    )
    return note + body, True


def cold_load(d: ReportData) -> tuple[str, bool]:
    recs = _latest(d.measurements, "bench", ("load_ms",), cache="cold")
    if not recs:
        return nodata("cold loads (bench --cold-load)"), False
    rows = []
    for r in sorted(recs, key=lambda r: (r.device, r.model or "")):
        a = r.annotations
        verdict = "slower" if a.get("distinct") else "not distinguishable"
        if not a.get("eviction_verified"):
            verdict += " (eviction unverified)"
        rows.append(
            [r.device, r.model, r.runtime, fmt(r.value), fmt(a.get("warm_median_ms")),
             fmt(a.get("cold_to_warm")), fmt(a.get("slower_p_value")), verdict]
        )  # fmt: skip
    return table(
        ["device", "model", "runtime", "cold ms", "warm ms", "cold / warm", "p (cold slower)", "verdict"],
        rows,
    ), True


def soak(d: ReportData) -> tuple[str, bool]:
    summary = _latest(
        d.measurements, "soak", ("rss_growth_mb_per_hour", "latency_drift_ratio", "peak_rss_mb")
    )
    s = frames.series(d.measurements, "soak", ["rss_mb", "latency_ms"])
    if not summary and s.empty:
        return nodata("soak runs (probe soak)"), False
    rows: dict[tuple, dict[str, Any]] = {}
    for r in summary:
        row = rows.setdefault(_row_key(r, ()), {})
        row[r.metric] = r.value
        if r.metric == "rss_growth_mb_per_hour":
            a = r.annotations
            row["ci"] = f"{fmt(a.get('ci_low'))} to {fmt(a.get('ci_high'))}"
            row["verdict"] = a.get("verdict")
    out = [
        table(
            [
                "device",
                "model",
                "runtime",
                "params",
                "rss_growth_mb_per_hour",
                "interval",
                "verdict",
                "latency_drift_ratio",
                "peak_rss_mb",
            ],
            [
                [
                    *k,
                    fmt(v.get("rss_growth_mb_per_hour")),
                    v.get("ci", "–"),
                    v.get("verdict", "–"),
                    fmt(v.get("latency_drift_ratio")),
                    fmt(v.get("peak_rss_mb")),
                ]
                for k, v in sorted(rows.items())
            ],
        )  # fmt: skip
    ]
    out.append('<div class="figure-row">')
    for (device, model), g in s.groupby(["device", "model"], sort=True):
        out.append(
            figure(
                plots.series_plot(f"soak: {model} on {device}", g, ["rss_mb", "latency_ms"]),
                f"soak-{device}-{model}",
                f"resident memory and latency over the run, {model} on {device}",
            )
        )
    out.append("</div>")
    return "".join(out), True


def contention(d: ReportData) -> tuple[str, bool]:
    recs = _latest(d.measurements, "contention", ("corunner_slowdown", "latency_ms"))
    if not recs:
        return nodata("contention runs (probe contention)"), False
    rows: dict[tuple, dict[str, Any]] = {}
    alone: dict[tuple, float | None] = {}
    for r in recs:
        base = (r.device, r.model or "", r.runtime or "", r.params.get("threads"))
        n = r.params.get("corunner_threads")
        if r.metric == "latency_ms" and r.params.get("stat") == "p50":
            if n == 0:
                alone[base] = r.value
            else:
                rows.setdefault((*base, n), {})["beside"] = r.value
        elif r.metric == "corunner_slowdown":
            rows.setdefault((*base, n), {})[r.params.get("victim")] = r.value
    body = table(
        ["device", "model", "runtime", "model threads", "co-runner threads", "p50 alone ms", "p50 beside ms",
         "model slowdown", "co-runner slowdown"],
        [[*k, fmt(alone.get(k[:4])), fmt(v.get("beside")), fmt(v.get("model")), fmt(v.get("corunner"))]
         for k, v in sorted(rows.items(), key=lambda kv: tuple(str(x) for x in kv[0]))],
    )  # fmt: skip
    return body, True


def divergence(d: ReportData) -> tuple[str, bool]:
    firsts = _latest(d.measurements, "accuracy", ("first_divergent_op",))
    ops = _latest(d.measurements, "accuracy", ("op_rel_error", "op_cosine"))
    if not firsts and not ops:
        return nodata("per-op comparisons (accuracy --per-op)"), False
    out = [
        table(
            [
                "device",
                "variant",
                "reference",
                "runtime",
                "first divergent op",
                "tensor",
                "rel. error",
                "tolerance",
            ],
            [
                [
                    r.device,
                    r.params.get("variant"),
                    r.params.get("reference"),
                    r.runtime,
                    r.params.get("op") or "none",
                    r.params.get("tensor") or "–",
                    fmt(r.value),
                    fmt(r.params.get("tolerance")),
                ]
                for r in firsts
            ],
        )  # fmt: skip
    ]
    worst: dict[tuple, dict[str, Any]] = {}
    for r in ops:
        key = (r.device, r.params.get("variant"), r.params.get("op"), r.params.get("tensor"))
        worst.setdefault(key, {})[r.metric] = r.value
        worst[key]["order"] = r.annotations.get("order", 0)
    ranked = sorted(worst.items(), key=lambda kv: -(kv[1].get("op_rel_error") or 0.0))[:15]
    if ranked:
        out.append(f"<h3>{esc('ops with the largest relative error')}</h3>")
        out.append(
            table(
                ["device", "variant", "op", "tensor", "topological #", "rel. error", "cosine"],
                [
                    [*k, v.get("order"), fmt(v.get("op_rel_error")), fmt(v.get("op_cosine"), 6)]
                    for k, v in ranked
                ],
            )
        )
    return "".join(out), True
