"""The HTML report: one self-contained file (inline CSS, plots as base64 PNG), references nothing outside.

`render_html(data)` is pure: ReportData in, a string out. Every section is always there, with its data or
a one-line "no data" note, so a reader (and a test) finds the same structure in every report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import pandas as pd

from ... import __version__
from ...execution.provenance import redact_argv
from . import frames, plots, workloads
from .data import ReportData
from .health import COLUMNS as HEALTH_COLUMNS
from .health import latest_health
from .markup import esc, figure, fmt, nodata, pct, table

SECTIONS: tuple[tuple[str, str], ...] = (
    ("summary", "Run summary"),
    ("health", "Device health"),
    ("matrix", "Device × model"),
    ("ceilings", "Measured ceilings vs datasheet"),
    ("roofline", "Roofline"),
    ("threads", "Thread sweep"),
    ("latency", "Latency distributions"),
    ("thermal", "Thermal"),
    ("power", "Power and energy"),
    ("decode", "LLM decode"),
    ("ops", "Top ops"),
    ("accuracy", "Accuracy"),
    ("divergence", "Layer-wise divergence"),
    ("streaming", "Streaming and real-time factor"),
    ("coldload", "Cold load"),
    ("soak", "Soak: memory and latency over a long run"),
    ("contention", "Contention with a co-running load"),
    ("history", "History"),
    ("fit", "Which model fits which chip"),
    ("deltas", "Changes between runs"),
    ("errors", "Errors"),
)
_SECRET_WORDS = ("key", "password", "passphrase", "token", "secret", "credential")
_FINGERPRINT_KEYS = (
    "arch",
    "cpu_model",
    "cores",
    "memory_mb",
    "kernel",
    "android",
    "build",
    "governors",
    "runtimes",
    "caches",
)


def css() -> str:
    return resources.files(__package__).joinpath("report.css").read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------- sections


SUMMARY_RUNS = 8  # runs listed in full; the rest fold away under a details element


def _when(ts: str | None) -> str:
    return (ts or "")[:19].replace("T", " ")


def _duration(start: str | None, end: str | None) -> str:
    import datetime as dt

    try:
        a = dt.datetime.fromisoformat((start or "").replace("Z", "+00:00"))
        b = dt.datetime.fromisoformat((end or "").replace("Z", "+00:00"))
    except ValueError:
        return ""
    secs = (b - a).total_seconds()
    return f"{secs:.1f} s" if secs < 120 else f"{secs / 60:.1f} min"


def _run_rows(d: ReportData, runs: Sequence[Any]) -> list[list[Any]]:
    jobs: dict[str, dict[str, int]] = {}
    for j in d.jobs:
        c = jobs.setdefault(j["run_id"], {"ok": 0, "error": 0})
        c["ok" if j["status"] == "ok" else "error"] += 1
    rows = []
    for r in runs:
        p = r.provenance or {}
        argv = " ".join(redact_argv([str(a) for a in p.get("argv") or []]))
        c = jobs.get(r.run_id, {"ok": 0, "error": 0})
        rows.append(
            [
                f'<span class="code">{esc(r.run_id)}</span>',
                esc(r.kind + (f" ({r.suite})" if r.suite else "")),
                esc(r.status),
                esc(_when(r.created)),
                esc(_duration(r.created, r.finished)),
                esc(f"{c['ok']} ok" + (f", {c['error']} failed" if c["error"] else "")),
                f'<span class="code">{esc(argv if len(argv) <= 90 else argv[:89] + "…")}</span>',
            ]
        )
    return rows


def _summary(d: ReportData) -> tuple[str, bool]:
    kinds: dict[str, int] = {}
    for r in d.runs:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    prov = [r.provenance or {} for r in d.runs]
    versions = sorted({str(p.get("edgebench")) for p in prov if p.get("edgebench")})
    commits = sorted({str(p.get("git_commit"))[:12] for p in prov if p.get("git_commit")})
    hosts = sorted({str(p.get("host")) for p in prov if p.get("host")})
    failed = sum(1 for r in d.runs if r.status != "ok")
    overview = (
        f"{len(d.runs)} run(s), {esc(_when(d.runs[0].created))} to {esc(_when(d.runs[-1].created))}: "
        + esc(", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
        + (f"; <b>{failed} not ok</b>" if failed else "; all ok")
        + f" · edgebench {esc(', '.join(versions) or '?')} · commit {esc(', '.join(commits[:4]) or '?')}"
        + (" …" if len(commits) > 4 else "")
        + f" · controller {esc(', '.join(hosts) or '?')}"
    )
    columns = ["run", "kind", "status", "started", "took", "jobs", "command"]
    recent = list(d.runs)[-SUMMARY_RUNS:]
    out = [f'<p class="note">{overview}</p>', table(columns, _run_rows(d, recent), raw=True)]
    if len(d.runs) > SUMMARY_RUNS:
        older = list(d.runs)[:-SUMMARY_RUNS]
        out.append(
            f"<details><summary>{len(older)} earlier run(s)</summary>"
            f"{table(columns, _run_rows(d, older), raw=True)}</details>"
        )
    seen: dict[str, dict[str, Any]] = {}
    for info in d.devices:
        seen.setdefault(info["device"], info)
    if seen:
        drows = []
        for name, info in sorted(seen.items()):
            desc = _redact(info.get("descriptor") or {})
            fp = _redact(info.get("fingerprint") or {})
            details = "; ".join(
                f"{k}: {_short_value(fp[k])}"
                for k in _FINGERPRINT_KEYS
                if fp.get(k) not in (None, {}, [], "")
            )
            if fp.get("error"):
                details = f"fingerprint failed: {fp['error']}"
            where = desc.get("host") or desc.get("serial") or ""
            drows.append(
                [name, desc.get("transport", ""), desc.get("soc", ""), where, measured_by(desc, fp), details]
            )
        out.append("<h3>Devices</h3>")
        out.append(table(["device", "transport", "soc", "address", "measured by", "fingerprint"], drows))
    if d.budgets:
        out.append(
            '<p class="note">Budgets: '
            + ", ".join(f'<span class="code">{esc(b.key)} = {fmt(b.limit)}</span>' for b in d.budgets)
            + "</p>"
        )
    return "".join(out), bool(d.runs)


def _redact(obj: Any) -> Any:
    """Drop anything whose key looks like a credential, at any depth."""
    if isinstance(obj, dict):
        return {k: _redact(v) for k, v in obj.items() if not any(w in str(k).lower() for w in _SECRET_WORDS)}
    if isinstance(obj, list):
        return [_redact(v) for v in obj]
    return obj


def measured_by(descriptor: dict[str, Any], fingerprint: dict[str, Any]) -> str:
    """Which path measured the device: the Python agent, or the native runner binaries it names."""
    if descriptor.get("agent") == "native" or fingerprint.get("agent") == "native":
        runners = sorted(fingerprint.get("runners") or {})
        return "native runners" + (f": {', '.join(runners)}" if runners else "")
    return "python agent"


def _short_value(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_short_value(x)}" for k, x in v.items())
    if isinstance(v, list):
        return ",".join(str(x) for x in v)
    if isinstance(v, float):
        return f"{v:.0f}"
    return str(v)


_MATRIX_QUANTITIES = (
    ("p50", "p50", "ms"),
    ("p99", "p99", "ms"),
    ("memory_mb", "mem", "MB"),
    ("energy_mj", "energy", "mJ"),
)


def _budget_key(q: str) -> str:
    return {
        "p50": "latency_p50_ms",
        "p90": "latency_p90_ms",
        "p99": "latency_p99_ms",
        "mean": "latency_mean_ms",
        "memory_mb": "memory_mb",
        "energy_mj": "energy_mj",
        "load_ms": "load_ms",
    }[q]


def _predicted_cell(values: dict[str, float] | None, d: ReportData) -> str:
    """A pair never measured: fit's prediction when there is one, marked as such."""
    if not values:
        return '<span class="cfg">not measured</span>'
    lines = []
    for key, label, unit, budget in (
        ("predicted_latency_ms:p50", "p50", "ms", "latency_p50_ms"),
        ("predicted_latency_ms:p99", "p99", "ms", "latency_p99_ms"),
        ("predicted_memory_mb", "mem", "MB", "memory_mb"),
        ("predicted_energy_mj", "energy", "mJ", "energy_mj"),
    ):
        if values.get(key) is None:
            continue
        status = frames.budget_status(values[key], d.budget(budget))
        lines.append(
            f'<div class="q {status} pred" data-status="{status}"><span>{esc(label)}</span>'
            f"<span>≈ {fmt(values[key])} {unit}</span></div>"
        )
    return (
        "".join(lines) + '<div class="cfg"><span class="badge predicted">predicted</span> not measured</div>'
    )


def _matrix(d: ReportData) -> tuple[str, bool]:
    m = frames.bench_matrix(d.measurements, d.samples, d.run_order)
    if m.empty:
        return nodata("bench measurements"), False
    devices = sorted(m["device"].unique())
    quantities: list[tuple[str, str, str]] = list(_MATRIX_QUANTITIES)
    for b in d.budgets:  # a budget on another statistic gets its own line
        if b.quantity == "latency" and b.stat and b.stat not in ("p50", "p99"):
            quantities.insert(1, (b.stat, b.stat, "ms"))
        elif b.quantity == "load":
            quantities.append(("load_ms", "load", "ms"))
    verdicts = frames.fit_tables(d.fit_records)["verdicts"]
    predicted = {
        (v.device, v.runtime, v.model): v.predicted for v in verdicts.itertuples() if v.basis == "predicted"
    }
    rows = []
    for (model, runtime), g in m.groupby(["model", "runtime"], sort=True):
        cells = [f'<b>{esc(model)}</b><br><span class="cfg">{esc(runtime)}</span>']
        for dev in devices:
            row = g[g["device"] == dev]
            if row.empty:
                cells.append(_predicted_cell(predicted.get((dev, runtime, model)), d))
                continue
            r = row.iloc[0]
            lines = []
            for col, label, unit in quantities:
                value = r[col]
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    if col == "energy_mj":
                        continue
                    shown = "–"
                else:
                    shown = f"{fmt(value)} {unit}"
                status = frames.budget_status(value, d.budget(_budget_key(col)))
                est = " *" if col in str(r["estimated"]).split(",") else ""
                lines.append(
                    f'<div class="q {status}" data-status="{status}"><span>{esc(label)}</span>'
                    f"<span>{shown}{est}</span></div>"
                )
            if r["config"]:
                lines.append(f'<div class="cfg">{esc(r["config"])}</div>')
            cells.append("".join(lines))
        rows.append(cells)
    legend = (
        '<p class="note">Each cell: the best measured configuration of the latest run. Colours against the '
        "budgets: green under, yellow within 10% of the limit, red over; no colour without a budget. "
        "* p99 estimated from fewer than 100 samples. ≈ a pair never measured: fit's prediction.</p>"
    )
    if not d.budgets:
        legend += '<p class="note">No budgets given (pass --budget or --suite to colour the matrix).</p>'
    return legend + table(["model"] + devices, rows, cls="matrix", raw=True), True


def _health(d: ReportData) -> tuple[str, bool]:
    """Each device's latest `edgebench doctor` figures; a flagged device is named above the table."""
    found = latest_health(d.health, d.health_order)
    if not found:
        return nodata("device health (run `edgebench doctor --device NAME`)"), False
    flagged = [h for h in found if h.flags]
    notes = "".join(
        f'<p class="flag" data-flagged="{esc(h.device)}">⚠ {esc(h.device)}: {esc("; ".join(h.flags))}: '
        "its figures in this report carry that uncertainty</p>"
        for h in flagged
    )
    rows = [list(row) for h in found for row in h.rows]
    return notes + table(list(HEALTH_COLUMNS), rows, cls="health"), True


def _ceilings(d: ReportData) -> tuple[str, bool]:
    c = frames.ceilings(d.measurements, d.devices)
    if c.empty:
        return nodata("matmul or bandwidth measurements"), False
    rows = [
        [
            r.device,
            r.kind,
            r.what,
            r.backend,
            r.best,
            r.unit,
            r.datasheet,
            pct(r.efficiency) if r.efficiency is not None and r.efficiency == r.efficiency else "–",
            r.at,
        ]
        for r in c.itertuples()
    ]
    out = [
        table(
            [
                "device",
                "probe",
                "dtype / kernel",
                "backend",
                "best measured",
                "unit",
                "datasheet",
                "efficiency",
                "at",
            ],
            rows,
        )
    ]
    out.append('<div class="figure-row">')
    for device, g in c.groupby("device", sort=True):
        out.append(
            figure(plots.ceilings_plot(device, g), f"ceilings-{device}", f"measured ceilings on {device}")
        )
    out.append("</div>")
    return "".join(out), True


def _roofline(d: ReportData) -> tuple[str, bool]:
    m = frames.bench_matrix(d.measurements, d.samples, d.run_order)
    pts = frames.roofline(d.measurements, m, frames.fit_counts(d.fit_records))
    peaks = frames.device_peaks(frames.ceilings(d.measurements, d.devices))
    if pts.empty and not peaks:
        return nodata("roofline counts or ceilings"), False
    out = []
    devices = sorted(set(pts["device"]) | set(peaks))
    out.append('<div class="figure-row">')
    for device in devices:
        g = pts[pts["device"] == device]
        out.append(
            figure(
                plots.roofline_plot(device, g, peaks.get(device, {})),
                f"roofline-{device}",
                f"roofline of {device}: models placed by arithmetic intensity and achieved GFLOP/s",
            )
        )
    out.append("</div>")
    if not pts.empty:
        rows = [
            [
                r.device,
                r.model,
                r.runtime,
                r.flops,
                r.weight_bytes,
                r.intensity,
                r.latency_ms,
                r.achieved_gflops,
                r.floor_ms,
                r.bound or "",
                r.efficiency,
            ]
            for r in pts.itertuples()
        ]
        out.append(
            table(
                [
                    "device",
                    "model",
                    "runtime",
                    "FLOPs",
                    "weight bytes",
                    "FLOP/byte",
                    "latency p50 ms",
                    "achieved GFLOP/s",
                    "floor ms",
                    "bound",
                    "floor / measured",
                ],
                rows,
            )
        )
    if not peaks:
        out.append(
            '<p class="note">No measured ceilings: run `edgebench probe matmul` and `probe bandwidth` to '
            "draw the roofs.</p>"
        )
    return "".join(out), True


def _threads(d: ReportData) -> tuple[str, bool]:
    curve, best = frames.thread_sweep(d.measurements)
    if curve.empty:
        return nodata("thread sweeps"), False
    out = ['<div class="figure-row">']
    for device, g in curve.groupby("device", sort=True):
        out.append(
            figure(plots.thread_plot(device, g), f"threads-{device}", f"latency by thread count on {device}")
        )
    out.append("</div>")
    if not best.empty:
        out.append(
            table(
                ["device", "model", "runtime", "best threads", "detail"],
                [[r.device, r.model, r.runtime, int(r.best_threads), r.note] for r in best.itertuples()],
            )
        )
    return "".join(out), True


def _latency(d: ReportData) -> tuple[str, bool]:
    dists = frames.latency_samples(d.samples)
    if not dists:
        return nodata("raw latency samples"), False
    out = ['<div class="figure-row">']
    by_device: dict[str, list[dict[str, Any]]] = {}
    for x in dists:
        by_device.setdefault(x["device"], []).append(x)
    for device, xs in sorted(by_device.items()):
        out.append(
            figure(
                plots.latency_plot(device, xs[:30]),
                f"latency-{device}",
                f"latency distributions on {device} ({len(xs)} measurement(s))",
            )
        )
    out.append("</div>")
    return "".join(out), True


def _thermal(d: ReportData) -> tuple[str, bool]:
    s = frames.series(d.measurements, "thermal", ["latency_ms", "temp_c", "freq_mhz"])
    summary = frames.scalars(d.measurements, "thermal", ["throttle_onset_s", "sustained_ratio", "stability"])
    if s.empty and summary.empty:
        return nodata("thermal runs"), False
    out = []
    if not summary.empty:
        out.append(
            _pivot_table(
                summary, ["device", "model", "runtime"], ["throttle_onset_s", "sustained_ratio", "stability"]
            )
        )
    out.append('<div class="figure-row">')
    for (device, model), g in s.groupby(["device", "model"], sort=True):
        out.append(
            figure(
                plots.series_plot(
                    f"sustained run: {model} on {device}", g, ["latency_ms", "temp_c", "freq_mhz"]
                ),
                f"thermal-{device}-{model}",
                f"latency, temperature and frequency over time, {model} on {device}",
            )
        )
    out.append("</div>")
    return "".join(out), True


def _power(d: ReportData) -> tuple[str, bool]:
    summary = frames.scalars(d.measurements, "power")
    s = frames.series(d.measurements, "power", ["power_mw", "current_ma", "energy_mj_per_inference"])
    raw = frames.probe_samples(d.samples, "power")
    if summary.empty and s.empty and not raw:
        return nodata("power measurements"), False
    out = []
    if not summary.empty:
        cols = [
            m
            for m in ("power_mw", "energy_mj_per_inference", "idle_mw", "active_mw", "inferences")
            if (summary["metric"] == m).any()
        ]
        others = sorted(set(summary["metric"]) - set(cols))
        out.append(_pivot_table(summary, ["device", "model", "runtime"], cols + others))
    out.append('<div class="figure-row">')
    for (device, model), g in s.groupby(["device", "model"], sort=True):
        out.append(
            figure(
                plots.series_plot(f"power: {model} on {device}", g, ["power_mw", "current_ma"]),
                f"power-{device}-{model}",
                f"power over time, {model} on {device}",
            )
        )
    by: dict[tuple, list] = {}
    for smp in raw:
        by.setdefault((smp.device, smp.model or ""), []).append(smp)
    for (device, model), smps in sorted(by.items()):
        out.append(
            figure(
                plots.samples_plot(f"power samples: {model} on {device}", smps[:6]),
                f"power-samples-{device}-{model}",
                f"raw power samples, {model} on {device}",
            )
        )
    out.append("</div>")
    return "".join(out), True


def _decode(d: ReportData) -> tuple[str, bool]:
    df = frames.decode_summary(d.measurements, d.run_order)
    if df.empty:
        return nodata("decode runs (edgebench probe decode)"), False
    budget = d.budget("decode_tokens_per_s_min")
    rows = []
    for r in df.itertuples():
        status = frames.budget_status(r.decode_tokens_per_s, budget)
        rate = f'<span class="q {status}" data-status="{status}">{fmt(r.decode_tokens_per_s)}</span>'
        flag = ' <span class="badge">uncertain</span>' if r.uncertain else ""
        rows.append(
            [
                esc(r.device), esc(r.model), esc(r.runtime), esc(f"{r.prompt_tokens}+{r.new_tokens}"),
                r.threads, r.ttft_ms, r.prefill_tokens_per_s, r.decode_ms_per_token, rate,
                r.floor_tokens_per_s, pct(r.decode_efficiency) + flag, esc(r.regime or "–"),
                r.kv_cache_mb, r.peak_rss_mb,
            ]
        )  # fmt: skip
    columns = [
        "device", "model", "runtime", "prompt+new", "threads", "ttft ms", "prefill tok/s",
        "decode ms/token p50", "decode tok/s", "floor tok/s", "efficiency", "regime", "KV MB", "peak MB",
    ]  # fmt: skip
    legend = (
        '<p class="note">floor tok/s = 1000 / decode_floor_ms: the rate at which the weights and KV cache '
        "one step reads stream from DRAM at the measured bandwidth; efficiency = floor / measured p50. "
        "uncertain: the weights are under twice the last-level cache, or the bandwidth run did not measure "
        "DRAM.</p>"
    )
    return legend + table(columns, rows, raw=True), True


def _pivot_table(df: pd.DataFrame, index: list[str], metrics: list[str]) -> str:
    latest = df.sort_values("run_id").groupby(index + ["metric"], as_index=False).last()
    wide = latest.pivot_table(index=index, columns="metric", values="value", aggfunc="first").reset_index()
    metrics = [m for m in metrics if m in wide.columns]
    rows = [[*(row[c] for c in index), *(row[m] for m in metrics)] for _, row in wide.iterrows()]
    return table(index + metrics, rows)


def _ops(d: ReportData) -> tuple[str, bool]:
    top = frames.top_ops(d.measurements)
    if top.empty:
        return nodata("per-op profiles"), False
    totals = frames.op_type_totals(d.measurements)
    out = []
    for (device, model, runtime), g in top.groupby(["device", "model", "runtime"], sort=True):
        out.append(f"<h3>{esc(model)} on {esc(device)} ({esc(runtime)})</h3>")
        out.append('<div class="figure-row">')
        out.append(
            table(
                ["node", "op type", "ms", "share"],
                [[r.node, r.op_type, r.ms, pct(r.share)] for r in g.itertuples()],
            )
        )
        t = totals[(totals["device"] == device) & (totals["model"] == model) & (totals["runtime"] == runtime)]
        out.append(
            figure(
                plots.ops_plot(f"time by op type: {model} on {device}", t),
                f"ops-{device}-{model}",
                f"time by op type, {model} on {device}",
            )
        )
        out.append("</div>")
    return "".join(out), True


def _accuracy(d: ReportData) -> tuple[str, bool]:
    acc = frames.accuracy(d.measurements)
    if acc.empty:
        return nodata("accuracy checks"), False
    # Cosine similarity lives in the last decimals (0.9999 vs 0.99999): six of them, not three digits.
    rows = [
        [
            r.device,
            r.model,
            r.runtime,
            r.detail,
            _decimals(r.cosine, 6),
            r.max_abs_err,
            r.mean_abs_err,
            r.snr_db,
        ]
        for r in acc.itertuples()
    ]
    return table(
        ["device", "model", "runtime", "detail", "cosine", "max abs err", "mean abs err", "SNR dB"], rows
    ), True


def _decimals(value: Any, n: int) -> str:
    return "–" if value is None or value != value else f"{value:.{n}f}"


def _history(d: ReportData) -> tuple[str, bool]:
    steps, stepped, examined = frames.history(d.measurements)
    if steps.empty:
        if examined:
            return (
                f'<p class="nodata">No steps found in {examined} series of at least '
                f"{frames.HISTORY_MIN_RUNS} runs.</p>"
            ), False
        return (
            f'<p class="nodata">No history: change points need series of at least {frames.HISTORY_MIN_RUNS} '
            "runs (select more runs, or store `edgebench history` results).</p>"
        ), False
    rows = [
        [
            r.device,
            r.model,
            r.runtime,
            r.series,
            r.run_id,
            r.previous_run,
            r.before,
            r.after,
            pct(r.change, signed=True),
            r.p_value,
        ]
        for r in steps.itertuples()
    ]
    out = [
        table(
            [
                "device",
                "model",
                "runtime",
                "series",
                "first run at new level",
                "previous run",
                "before",
                "after",
                "change",
                "p",
            ],
            rows,
        )
    ]
    out.append('<div class="figure-row">')
    for i, s in enumerate(stepped[:12]):
        out.append(figure(plots.history_plot(s), f"history-{i}", f"history of {s['label']}"))
    out.append("</div>")
    return "".join(out), True


def _fit(d: ReportData) -> tuple[str, bool]:
    t = frames.fit_tables(d.fit_records)
    v, summ, pts, cal = t["verdicts"], t["summary"], t["points"], t["calibration"]
    if v.empty and pts.empty:
        return nodata("bench measurements to judge"), False
    out = [f'<p class="note">Source: {esc(d.fit_source)}.</p>']
    for w in d.fit_warnings:
        out.append(f'<p class="note">Note: {esc(w)}</p>')
    budgets: dict[str, float] = {}
    for row in v.itertuples():
        budgets.update(row.budgets or {})
    if budgets:
        out.append(
            '<p class="note">Budgets: '
            + ", ".join(f'<span class="code">{esc(k)} = {fmt(x)}</span>' for k, x in budgets.items())
            + "</p>"
        )
        rows = []
        for r in v.itertuples():
            verdict = {
                1.0: '<span class="badge yes">fits</span>',
                0.0: '<span class="badge no">does not fit</span>',
            }
            badge = verdict.get(r.fits, '<span class="badge unknown">unknown</span>')
            basis = f'<span class="badge {esc(r.basis)}">{esc(r.basis)}</span>'
            values = ", ".join(f"{esc(k)} {fmt(x)}" for k, x in (r.values or {}).items())
            unchecked = ", ".join(esc(x) for x in r.unchecked) or ""
            margin = pct(r.margin, signed=True) if r.margin is not None else "–"
            rows.append(
                [
                    esc(r.device),
                    esc(r.model),
                    esc(r.runtime),
                    badge,
                    basis,
                    esc(r.limiting or "–"),
                    margin,
                    values,
                    unchecked,
                    esc(r.evidence or r.config),
                ]
            )
        out.append(
            table(
                [
                    "device",
                    "model",
                    "runtime",
                    "verdict",
                    "basis",
                    "limiting budget",
                    "margin",
                    "values",
                    "not checked",
                    "evidence / configuration",
                ],
                rows,
                raw=True,
            )
        )
    else:
        out.append('<p class="note">No budgets given: verdicts need --budget (or a suite with [budget]).</p>')
    predicted = v[v["basis"] == "predicted"]
    if not predicted.empty and not budgets:
        prows: list[list[Any]] = [
            [
                r.device,
                r.model,
                r.runtime,
                (r.predicted or {}).get("predicted_latency_ms:p50"),
                (r.predicted or {}).get("predicted_memory_mb"),
                r.evidence,
            ]
            for r in predicted.itertuples()
        ]
        out.append(
            table(
                ["device", "model", "runtime", "predicted p50 ms", "predicted memory MB", "evidence"], prows
            )
        )
    out.append("<h3>How far to trust the predictions</h3>")
    if pts.empty:
        out.append(
            '<p class="note">No cross-validation: it needs at least two measured models with FLOP/byte '
            "counts on a device (run `edgebench fit --model PATH ...` or `edgebench roofline`).</p>"
        )
    else:
        overall = summ[summ["device"] == "*"] if not summ.empty else summ
        labels = {
            ("model", "latency_p50_ms"): "p50 of a model never benched anywhere",
            ("pair", "latency_p50_ms"): "p50 of a model benched on other devices, not this one",
            ("model", "latency_min_ms"): "fastest inference (the calibrated cost, least disturbed by load)",
            ("model", "memory_mb"): "peak memory",
        }
        for (holdout, quantity), what in labels.items():
            found = overall[(overall["holdout"] == holdout) & (overall["quantity"] == quantity)]
            for r in found.itertuples():
                out.append(
                    f'<div class="kpi" data-kpi="cv-{esc(holdout)}-{esc(quantity)}">'
                    f"<b>{pct(r.cv_within_10pct)}</b><span>within ±10%: {esc(what)}<br>{int(r.pairs)} "
                    f"held-out pairs, median error "
                    f"{pct(r.cv_median_abs_err)}</span></div>"
                )
        out.append(
            '<p class="note">Each measured model is predicted from the others measured on its device, as if '
            "it had never been benched there, and compared with its measurement. Percentiles also carry "
            "the run-to-run noise of the device: on a busy or thermally unstable device they scatter more "
            "than the fastest inference does.</p>"
        )
        p50 = pts[(pts["quantity"] == "latency_p50_ms") & (pts["holdout"] == "model")]
        out.append('<div class="figure-row">')
        if not p50.empty:
            out.append(
                figure(
                    plots.cv_plot(p50),
                    "fit-cv",
                    "leave-one-model-out: each measured model predicted from the others on its device",
                )
            )
        if not summ.empty:
            rows2: list[list[Any]] = [
                [
                    r.device,
                    r.runtime,
                    r.holdout,
                    r.quantity,
                    int(r.pairs),
                    pct(r.cv_within_10pct),
                    pct(r.cv_median_abs_err),
                ]
                for r in summ.itertuples()
            ]
            out.append(
                table(
                    ["device", "runtime", "held out", "quantity", "pairs", "within ±10%", "median error"],
                    rows2,
                )
            )
        out.append("</div>")
    if not cal.empty:
        rows3: list[list[Any]] = []
        for r in cal.itertuples():
            eff = ", ".join(f"{k} {x:.0%}" for k, x in (r.efficiency or {}).items())
            ce = r.ceilings or {}
            rows3.append(
                [
                    r.device,
                    r.runtime,
                    int(r.models) if r.models == r.models else 0,
                    r.method,
                    eff,
                    r.overhead_ms,
                    r.per_node_us,
                    "yes" if r.local_correction else "no",
                    f"{fmt(ce.get('peak_gflops'))} GFLOP/s, {fmt(ce.get('bandwidth_gbps'))} GB/s "
                    f"({ce.get('source', '')})",
                ]
            )
        out.append(
            table(
                [
                    "device",
                    "runtime",
                    "models",
                    "method",
                    "efficiency of each floor",
                    "overhead ms",
                    "per node µs",
                    "local correction",
                    "ceilings",
                ],
                rows3,
            )
        )
    return "".join(out), True


def _deltas(d: ReportData) -> tuple[str, bool]:
    if len(d.runs) < 2:
        return (
            '<p class="nodata">Only one run selected: select two or more runs (--run) to see changes.</p>',
            False,
        )
    df = frames.deltas(d.measurements, d.run_order)
    if df.empty:
        return nodata("measurements repeated across runs"), False
    df = df.assign(order=df["verdict"].map({"worse": 0, "better": 1, "same": 2})).sort_values(
        ["order", "device", "model", "metric"]
    )
    rows = []
    for r in df.itertuples():
        change = f'<span class="{r.verdict}">{pct(r.change, signed=True)}</span>'
        rows.append(
            [
                esc(r.device),
                esc(r.model),
                esc(r.runtime),
                esc(r.probe),
                esc(r.metric),
                esc(r.params),
                fmt(r.baseline),
                fmt(r.latest),
                change,
                esc(r.verdict),
                esc(f"{r.baseline_run} → {r.latest_run}"),
            ]
        )
    worse = int((df["verdict"] == "worse").sum())
    head = (
        f'<p class="note">{worse} measurement(s) worse by more than 5%, earliest vs latest selected run.</p>'
    )
    return head + table(
        [
            "device",
            "model",
            "runtime",
            "probe",
            "metric",
            "params",
            "baseline",
            "latest",
            "change",
            "verdict",
            "runs",
        ],
        rows,
        raw=True,
    ), True


def _errors(d: ReportData) -> tuple[str, bool]:
    if not d.errors:
        return '<p class="nodata">No failed jobs in the selected runs.</p>', False
    rows = [
        [
            e.get("device"),
            e.get("probe"),
            e.get("model") or "",
            e.get("kind") or "",
            e.get("error") or "",
            e.get("run_id"),
            e.get("ts") or "",
        ]
        for e in d.errors
    ]
    return table(["device", "probe", "model", "kind", "error", "run", "when"], rows), True


BUILDERS: dict[str, Callable[[ReportData], tuple[str, bool]]] = {
    "summary": _summary,
    "health": _health,
    "matrix": _matrix,
    "ceilings": _ceilings,
    "roofline": _roofline,
    "threads": _threads,
    "latency": _latency,
    "thermal": _thermal,
    "power": _power,
    "decode": _decode,
    "ops": _ops,
    "accuracy": _accuracy,
    "divergence": workloads.divergence,
    "streaming": workloads.streaming,
    "coldload": workloads.cold_load,
    "soak": workloads.soak,
    "contention": workloads.contention,
    "history": _history,
    "fit": _fit,
    "deltas": _deltas,
    "errors": _errors,
}


def render_html(data: ReportData) -> str:
    """The whole report as one HTML document."""
    bodies = []
    nav = []
    for sid, title in SECTIONS:
        body, has_data = BUILDERS[sid](data)
        state = "data" if has_data else "empty"
        nav.append(f'<a href="#{sid}" class="{"" if has_data else "empty"}">{esc(title)}</a>')
        bodies.append(
            f'<section id="{sid}" data-section="{sid}" data-state="{state}"><h2>{esc(title)}</h2>'
            f"{body}</section>"
        )
    runs = ", ".join(r.run_id for r in data.runs[-3:]) + (" and earlier" if len(data.runs) > 3 else "")
    meta = (
        f"store {esc(data.store_name)} · {len(data.runs)} run(s): {esc(runs)} · "
        f"{len(data.measurements)} records · generated {esc(data.generated)} by edgebench {esc(__version__)}"
    )
    doc_meta = json.dumps({"runs": data.run_order, "generated": data.generated}, separators=(",", ":"))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(data.title)}</title><style>{css()}</style></head><body>"
        f'<header><h1>{esc(data.title)}</h1><div class="meta">{meta}</div></header>'
        f"<nav>{''.join(nav)}</nav><main>{''.join(bodies)}</main>"
        f'<footer data-report="{esc(doc_meta)}">edgebench {esc(__version__)} · self-contained report: every '
        "figure is embedded, nothing is fetched.</footer></body></html>\n"
    )
