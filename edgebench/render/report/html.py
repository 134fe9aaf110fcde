"""The HTML report: one self-contained file (inline CSS, plots as base64 PNG), references nothing outside.

`render_html(data)` is pure: ReportData in, a string out. Every section is always there, with its data or,
when empty, as one line with no heading (what was not measured and the command that measures it), so a
reader (and a test) finds the same structure in every report.

It opens with the answer (which model fits which chip, what regressed since the suite's previous run,
whether the devices were healthy) and then gives the detail. A section is one entry in SECTIONS (id,
title, group) and one builder in BUILDERS (ReportData -> (html, has_data)): a new section (device
health figures from `doctor`, say) is one function and two lines.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import pandas as pd

from ... import __version__
from ...analysis.ceilings import BEATS_MARGIN
from ...analysis.fit_result import KERNEL_PREDICTOR, ROOFLINE_PREDICTOR, TOO_FEW
from ...execution.provenance import redact_argv
from . import frames, placement, plots, unmeasured, workloads
from .data import ReportData
from .health import COLUMNS as HEALTH_COLUMNS
from .health import latest_health
from .markup import esc, figure, fmt, interval_text, nodata, pct, table

ANSWER, DETAIL = "answer", "detail"
SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("fit", "Which model fits which chip", ANSWER),
    ("regressions", "Regressions against the previous run", ANSWER),
    ("health", "Device health", ANSWER),
    ("variants", "Variants", DETAIL),
    ("placement", "Where it ran", DETAIL),
    ("accuracy", "Accuracy", DETAIL),
    ("sensitivity", "Quantization sensitivity", DETAIL),
    ("ops", "Top ops", DETAIL),
    ("ceilings", "Measured ceilings vs datasheet", DETAIL),
    ("roofline", "Roofline", DETAIL),
    ("threads", "Thread sweep", DETAIL),
    ("latency", "Latency distributions", DETAIL),
    ("thermal", "Thermal", DETAIL),
    ("power", "Power and energy", DETAIL),
    ("decode", "LLM decode", DETAIL),
    ("divergence", "Layer-wise divergence", DETAIL),
    ("streaming", "Streaming and real-time factor", DETAIL),
    ("coldload", "Cold load", DETAIL),
    ("soak", "Soak: memory and latency over a long run", DETAIL),
    ("contention", "Contention with a co-running load", DETAIL),
    ("history", "History", DETAIL),
    ("prediction", "How far to trust the predictions", DETAIL),
    ("deltas", "Changes between runs (raw deltas)", DETAIL),
    ("summary", "Runs and devices", DETAIL),
    ("errors", "Errors", DETAIL),
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
            details = "; ".join(x for x in (details, frames.arm_details(fp)) if x)
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
    ("load_ms", "load", "ms"),
    ("cosine", "cosine", ""),
)
_SHOWN_WHEN_MEASURED = ("energy_mj", "load_ms", "cosine")  # a line only where the pair has the value


def _budget_key(q: str) -> str:
    return {
        "p50": "latency_p50_ms",
        "p90": "latency_p90_ms",
        "p99": "latency_p99_ms",
        "mean": "latency_mean_ms",
        "memory_mb": "memory_mb",
        "energy_mj": "energy_mj",
        "load_ms": "load_ms",
    }.get(q, q)


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


_VERDICT_BADGE = {
    "fits": ("yes", "fits"),
    "does not fit": ("no", "does not fit"),
    "uncertain": ("unsure", "uncertain"),
}


def _verdict_badge(verdict: str) -> str:
    klass, text = _VERDICT_BADGE.get(verdict, ("unknown", "no verdict"))
    return f'<span class="badge {klass}" data-verdict="{esc(verdict)}">{esc(text)}</span>'


def ratio_text(ratio: Any) -> str:
    """value / limit as people read it: 0.62x budget, 36x budget."""
    if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)):
        return "–"
    return f"{ratio:.2f}x budget" if ratio < 10 else f"{ratio:.0f}x budget"


def _verdict_line(v: Any) -> str:
    """The badge, whether measured or predicted, and the limiting budget as a ratio."""
    basis = f' <span class="badge {esc(v.basis)}">{esc(v.basis)}</span>' if v.basis == "predicted" else ""
    limit = ""
    if v.limiting:
        limit = f'<div class="cfg">{esc(v.limiting)}: {esc(ratio_text(v.ratio))}</div>'
    return f'<div class="verdict">{_verdict_badge(v.verdict)}{basis}</div>{limit}'


def _fit(d: ReportData) -> tuple[str, bool]:
    """The answer: a device x model matrix, each cell its verdict (fits, does not fit, uncertain) over
    the values it was judged on, coloured against the budgets; the verdicts in full below it."""
    m = frames.bench_matrix(d.measurements, d.samples, d.run_order)
    verdicts = frames.fit_tables(d.fit)["verdicts"]
    if m.empty and verdicts.empty:
        return nodata("bench measurements"), False
    devices = sorted(set(m["device"]) | set(verdicts["device"]))
    quantities: list[tuple[str, str, str]] = list(_MATRIX_QUANTITIES)
    for b in d.budgets:  # a budget on another statistic gets its own line
        if b.quantity == "latency" and b.stat and b.stat not in ("p50", "p99"):
            quantities.insert(1, (b.stat, b.stat, "ms"))
        elif b.quantity == "load" and ("load_ms", "load", "ms") not in quantities:
            quantities.append(("load_ms", "load", "ms"))
    by_pair = {(v.device, v.runtime, v.model): v for v in verdicts.itertuples()}
    models = sorted(
        {(r.model, r.runtime) for r in m.itertuples()} | {(v.model, v.runtime) for v in verdicts.itertuples()}
    )
    rows = []
    for model, runtime in models:
        cells = [f'<b>{esc(model)}</b><br><span class="cfg">{esc(runtime)}</span>']
        for dev in devices:
            v = by_pair.get((dev, runtime, model))
            head = _verdict_line(v) if v is not None and _judged(verdicts) else ""
            row = m[(m["device"] == dev) & (m["model"] == model) & (m["runtime"] == runtime)]
            if row.empty:
                body = _predicted_cell(v.predicted if v is not None else None, d)
                cells.append(head + body)
                continue
            r = row.iloc[0]
            lines = []
            for col, label, unit in quantities:
                value = r[col]
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    if col in _SHOWN_WHEN_MEASURED:
                        continue
                    shown = "–"
                else:
                    shown = f"{fmt(value)} {unit}".rstrip() if col != "cosine" else _decimals(value, 6)
                status = frames.budget_status(value, d.budget(_budget_key(col)))
                est = " *" if col in str(r["estimated"]).split(",") else ""
                lines.append(
                    f'<div class="q {status}" data-status="{status}"><span>{esc(label)}</span>'
                    f"<span>{shown}{est}</span></div>"
                )
            if r["config"]:
                lines.append(f'<div class="cfg">{esc(r["config"])}</div>')
            cells.append(head + "".join(lines))
        rows.append(cells)
    out = [_fit_kpis(verdicts)]
    if d.budgets:
        out.append(
            '<p class="note">Budgets: '
            + ", ".join(f'<span class="code">{esc(b.key)} = {fmt(b.limit)}</span>' for b in d.budgets)
            + ". Each cell: the verdict, the limiting budget as value / limit, and the best measured "
            "configuration of the latest run, coloured green under, yellow within 10% of, red over its "
            "budget. A prediction fits only when its whole prediction interval is under the budget. "
            "* p99 estimated from fewer than 100 samples. ≈ a pair never measured: fit's prediction.</p>"
        )
    else:
        out.append(
            '<p class="note">No budgets given: pass --budget latency_p99_ms=15 (or --suite with a [budget] '
            "table) for verdicts. Each cell: the best measured configuration of the latest run.</p>"
        )
    out.append(table(["model"] + devices, rows, cls="matrix", raw=True))
    out.append(_verdict_table(verdicts, d))
    return "".join(out), True


def _judged(verdicts: pd.DataFrame) -> bool:
    """fit gave verdicts (it had budgets), not only values."""
    return bool(len(verdicts)) and bool(verdicts["verdict"].astype(bool).any())


def _fit_kpis(verdicts: pd.DataFrame) -> str:
    if not _judged(verdicts):
        return ""
    counts = verdicts["verdict"].value_counts()
    parts = []
    for verdict, what in (("fits", "fit"), ("does not fit", "do not fit"), ("uncertain", "uncertain")):
        n = int(counts.get(verdict, 0))
        parts.append(
            f'<div class="kpi" data-kpi="{esc(verdict)}"><b>{n}</b><span>of {len(verdicts)} pairs '
            f"{esc(what)}</span></div>"
        )
    return "".join(parts)


def _verdict_table(verdicts: pd.DataFrame, d: ReportData) -> str:
    if verdicts.empty or not _judged(verdicts):
        return ""
    rows = []
    for r in verdicts.itertuples():
        intervals = r.intervals or {}
        values = ", ".join(
            f"{esc(k)} {fmt(x)}"
            + (f" [{fmt(intervals[k][0])}–{fmt(intervals[k][1])}]" if k in intervals else "")
            for k, x in (r.values or {}).items()
        )
        rows.append(
            [
                esc(r.device),
                esc(r.model),
                esc(r.runtime),
                _verdict_badge(r.verdict),
                f'<span class="badge {esc(r.basis)}">{esc(r.basis)}</span>',
                esc(r.limiting or "–"),
                esc(ratio_text(r.ratio)),
                values,
                esc(r.why or ""),
                esc(r.evidence or r.config),
            ]
        )
    body = table(
        [
            "device",
            "model",
            "runtime",
            "verdict",
            "basis",
            "limiting budget",
            "value / limit",
            "values [prediction interval]",
            "why",
            "evidence / configuration",
        ],
        rows,
        raw=True,
    )
    opened = " open" if len(rows) <= 12 else ""
    return f"<details{opened}><summary>every verdict and why ({len(rows)})</summary>{body}</details>"


def _regressions(d: ReportData) -> tuple[str, bool]:
    """The latest suite run against the suite's previous run: what got worse, first."""
    g = d.regression
    if not g:
        return (
            '<p class="nodata">No earlier run of the same suite to compare with (select a suite run with an '
            "earlier one in the store).</p>",
            False,
        )
    pairs = g.get("pairs") or []
    order = {"FAIL": 0, "INCOMPLETE": 1, "MISSING": 2, "NOISY": 3, "IMPROVED": 4, "PASS": 5}
    pairs = sorted(pairs, key=lambda p: (order.get(p["verdict"], 9), -abs(p.get("change") or 0.0)))
    counts = ", ".join(f"{n} {k}" for k, n in (g.get("counts") or {}).items() if n) or "nothing compared"
    klass = {"PASS": "yes", "FAIL": "no"}.get(g.get("verdict", ""), "unsure")
    out = [
        f'<p class="answer"><span class="badge {klass}" data-verdict="{esc(g.get("verdict"))}">'
        f'{esc(g.get("verdict"))}</span> run <span class="code">{esc(g.get("candidate"))}</span> against '
        f'<span class="code">{esc(g.get("baseline"))}</span>: {esc(counts)} '
        f'<span class="cfg">({esc(d.regression_source)})</span></p>'
    ]

    def rows(items: list[dict[str, Any]]) -> list[list[Any]]:
        out_rows = []
        for p in items:
            stat = f"[{p['stat']}]" if p.get("stat") else ""
            params = frames.params_label(p.get("params") or {})
            change = p.get("change")
            rel = p.get("change_relative", True)
            text = "–" if change is None else (pct(change, signed=True) if rel else f"{change:+.4g}")
            klass = "worse" if p["verdict"] == "FAIL" else "better" if p["verdict"] == "IMPROVED" else ""
            warn = "".join(f"<br>⚠ {esc(w)}" for w in p.get("warnings") or [])
            out_rows.append(
                [
                    f'<span class="{klass}">{esc(text)}</span>',
                    esc(p["verdict"]),
                    f"{esc(p['device'])} · {esc(p['model'])} · {esc(p['runtime'])}<br>"
                    f'<span class="code">{esc(p["probe"])}:{esc(p["metric"])}{esc(stat)}</span> '
                    + esc(params),
                    f"{fmt(p.get('baseline'))} → {fmt(p.get('candidate'))} {esc(p.get('unit', ''))}",
                    esc(p.get("reason", "")) + warn,
                ]
            )
        return out_rows

    columns = ["change", "verdict", "measurement", "baseline → candidate", "why"]
    look = [p for p in pairs if p["verdict"] != "PASS"]
    passed = [p for p in pairs if p["verdict"] == "PASS"]
    if look:
        out.append(table(columns, rows(look), raw=True))
    if passed:
        folded = table(columns, rows(passed), raw=True)
        out.append(f"<details><summary>{len(passed)} PASS</summary>{folded}</details>")
    return "".join(out), True


def _job_health(d: ReportData) -> tuple[str, bool]:
    """Were the devices fit to measure: reached, jobs ok, no disturbance warnings (and doctor's figures)."""
    h = frames.health(d.runs, d.jobs, d.errors, d.records)
    if h.empty:
        return nodata("device jobs"), False
    klass = {"ok": "yes", "unreachable": "no", "lab errors": "no"}
    rows = [
        [
            esc(r.device),
            f'<span class="badge {klass.get(r.status, "unsure")}" data-health="{esc(r.status)}">'
            f"{esc(r.status)}</span>",
            str(r.jobs),
            str(r.failed),
            str(r.disturbed),
            "<br>".join(esc(n) for n in r.notes) or "–",
            str(r.runs),
        ]
        for r in h.itertuples()
    ]
    note = (
        '<p class="note">Per device over the selected runs: jobs, failed jobs, and jobs whose warnings say '
        "the device was disturbed (outlier samples, not cooled down, transport retries) or whose measured "
        "disturbance passed 10% (other processes' share of the CPUs, run-queue wait unless the job ran "
        "more threads than CPUs); a disturbed "
        "device's numbers are noisier than its silicon.</p>"
    )
    return note + table(
        ["device", "health", "jobs", "failed", "disturbed", "notes", "runs"], rows, raw=True
    ), True


def _variants(d: ReportData) -> tuple[str, bool]:
    from ...analysis.variants import speedup_text

    m = frames.bench_matrix(d.measurements, d.samples, d.run_order)
    v = frames.variants(d.measurements, m, frames.fit_tables(d.fit)["verdicts"], d.samples, d.run_order)
    if v.empty:
        return nodata("variants (edgebench variants)"), False
    rows = [
        [
            esc(r.source),
            f'<b>{esc(r.variant)}</b><br><span class="cfg">{esc(r.model)}</span>',
            esc(r.device),
            esc(r.runtime),
            fmt(r.size_bytes),
            f"{r.size_ratio:.2f}x" if r.size_ratio == r.size_ratio and r.size_ratio is not None else "–",
            esc(speedup_text(r.speedup, r.speedup_low, r.speedup_high)),
            fmt(r.p50),
            fmt(r.p99),
            fmt(r.memory_mb),
            _decimals(r.cosine, 6),
            fmt(r.snr_db),
            _verdict_badge(r.verdict) if r.verdict else "–",
        ]
        for r in v.itertuples()
    ]
    note = (
        '<p class="note">Each variant (made by `edgebench variants`, or benched beside the fp32 model it '
        "is named after): its size against the fp32 model, its p50 speed-up over it where both were "
        "benched (ratio of p50s, [95% bootstrap interval]), its latency and model memory, its worst cosine "
        "and SNR over the outputs against the fp32 reference (`edgebench accuracy`), and its fit "
        "verdict.</p>"
    )
    return note + table(
        [
            "source",
            "variant",
            "device",
            "runtime",
            "bytes",
            "x fp32",
            "speed-up vs fp32",
            "p50 ms",
            "p99 ms",
            "memory MB",
            "cosine",
            "SNR dB",
            "fits",
        ],
        rows,
        raw=True,
    ), True


def _sensitivity(d: ReportData) -> tuple[str, bool]:
    sens = frames.sensitivity(d.measurements)
    if sens.empty:
        return nodata("per-layer sensitivity (edgebench sensitivity)"), False
    out = [
        '<p class="note">Each weight layer fake-quantized alone, the others kept fp32: the layers whose '
        "quantization hurts the output most (lowest cosine), the candidates to keep in higher precision.</p>"
    ]
    for (device, model, bits), g in sens.groupby(["device", "model", "bits"], sort=True):
        out.append(f"<h3>{esc(model)} at int{esc(bits)} on {esc(device)}</h3>")
        out.append(
            table(
                ["rank", "node", "op type", "weight", "cosine", "SNR dB"],
                [
                    [r.rank, r.node, r.op_type, r.weight, _decimals(r.cosine, 6), r.snr_db]
                    for r in g.itertuples()
                ],
            )
        )
    return "".join(out), True


def _health(d: ReportData) -> tuple[str, bool]:
    """Device health: how the devices' jobs went in these runs, then each one's latest doctor figures."""
    jobs, jobs_data = _job_health(d)
    doctor, doctor_data = _doctor_health(d)
    return jobs + doctor, jobs_data or doctor_data


def _doctor_health(d: ReportData) -> tuple[str, bool]:
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
            *frames.ceiling_cells(r, fmt),
            pct(r.efficiency) if r.efficiency is not None and r.efficiency == r.efficiency else "–",
            r.at,
        ]
        for r in c.itertuples()
    ]
    derived = frames.derived_nominals(c)
    out = [
        table(
            [
                "device",
                "probe",
                "dtype / kernel",
                "backend",
                "best measured",
                "unit",
                "datasheet / nominal",
                "efficiency",
                "at",
            ],
            rows,
        )
    ]
    for device, source in derived:
        out.append(
            f'<p class="note">{esc(device)}: no datasheet peak in its descriptor, so the nominal peak is '
            f"{esc(source)} (a descriptor's [spec] peak_tops overrides it). Efficiency above 100% means "
            "the cores ran faster than the clock read (a VM reports its base clock, not the turbo one).</p>"
        )
    out.append('<div class="figure-row">')
    for device, g in c.groupby("device", sort=True):
        out.append(
            figure(plots.ceilings_plot(device, g), f"ceilings-{device}", f"measured ceilings on {device}")
        )
    out.append("</div>")
    return "".join(out), True


def _roofline(d: ReportData) -> tuple[str, bool]:
    m = frames.bench_matrix(d.measurements, d.samples, d.run_order)
    fl = frames.floors(d.measurements, d.run_order)
    pts = frames.roofline(d.measurements, m, frames.fit_counts(d.fit))
    covered = set(zip(fl["device"], fl["model"], strict=True))
    # A boolean Series, not a list: an empty list would select no *columns* and drop "device" with them.
    keep = pd.Series(
        [(r.device, r.model) not in covered for r in pts.itertuples()], index=pts.index, dtype=bool
    )
    pts = pts[keep]
    peaks = frames.device_peaks(frames.ceilings(d.measurements, d.devices))
    if pts.empty and fl.empty and not peaks:
        return nodata("roofline counts or ceilings"), False
    out = []
    devices = sorted(set(pts["device"]) | set(fl["device"]) | set(peaks))
    out.append('<div class="figure-row">')
    for device in devices:
        g = pd.concat([fl[fl["device"] == device], pts[pts["device"] == device]], ignore_index=True)
        plot = plots.roofline_labelled(device, g, peaks.get(device, {}))
        out.append(
            figure(
                plot.uri,
                f"roofline-{device}",
                f"roofline of {device}: models placed by arithmetic intensity and achieved GFLOP/s",
                plot.attrs(),
            )
        )
    out.append("</div>")
    if not fl.empty:
        out.append(_floors_table(fl))
    if pts.empty:
        return "".join(out), True
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


def _floors_table(fl: pd.DataFrame) -> str:
    """The floors as the models ran: each benched configuration against the ceilings at its thread count,
    its working set charged at the level it lives in, and why where a measurement beats its floor."""
    rows = [
        [
            r.device,
            r.model,
            r.runtime,
            r.threads,
            r.shapes or "as declared",
            r.flops,
            r.working_set_bytes / 1e6,
            f"{r.level} {fmt(r.bandwidth_gbps)} GB/s",
            r.peak_gflops,
            r.bound,
            r.floor_ms,
            r.latency_ms,
            r.achieved_gflops,
            r.efficiency,
            r.note,
        ]
        for r in fl.itertuples()
    ]
    beats = fl[fl["named"]]
    summary = (
        f"{len(beats)} of {len(fl)} configuration(s) beat their floor by more than "
        f"{BEATS_MARGIN:.0%}; each says why."
        if len(beats)
        else f"Every configuration is at or above its floor (within {BEATS_MARGIN:.0%})."
    )
    head = [
        "device", "model", "runtime", "threads", "shapes", "FLOPs", "working set MB", "charged at",
        "peak GFLOP/s", "bound", "floor ms", "latency p50 ms", "achieved GFLOP/s", "floor / measured", "why",
    ]  # fmt: skip
    note = (
        '<p class="note">Floors as the models ran: max(FLOPs / the matmul peak, least traffic / bandwidth), '
        "with ceilings measured at the benched thread count (no more threads, same affinity, latest run) "
        "and the traffic (weights + inputs + outputs) charged at the bandwidth of the memory level the "
        "working set (weights + the activations alive at once) lives in, found from the bandwidth sweep's "
        f"curve. {esc(summary)}</p>"
    )
    return note + table(head, rows)


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
                r.threads, r.depth, r.ttft_ms, r.prefill_tokens_per_s, r.decode_ms_per_token, rate,
                r.floor_tokens_per_s, pct(r.decode_efficiency) + flag, esc(r.regime or "–"),
                r.kv_cache_mb, r.peak_rss_mb,
            ]
        )  # fmt: skip
    columns = [
        "device", "model", "runtime", "prompt+new", "threads", "depth", "ttft ms", "prefill tok/s",
        "decode ms/token p50", "decode tok/s", "floor tok/s", "efficiency", "regime", "KV MB", "peak MB",
    ]  # fmt: skip
    legend = (
        '<p class="note">floor tok/s = 1000 / decode_floor_ms: the rate at which the weights and KV cache '
        "one step reads stream from DRAM at the measured bandwidth; efficiency = floor / measured p50. "
        "uncertain: the weights are under twice the last-level cache, or the bandwidth run did not measure "
        "DRAM.</p>"
    )
    swept = df.groupby(["device", "model", "threads"])["depth"].transform("nunique") > 1
    plot = ""
    if swept.any():
        caption = "decode tokens/s against context depth, the bandwidth floor dashed beside each line"
        plot = figure(plots.decode_depth_plot(df[swept]), "decode-depth", caption)
    return legend + table(columns, rows, raw=True) + plot, True


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
    shapes = frames.profile_shapes(d.measurements)
    out = [
        '<p class="note">Each profile names the input shapes it ran at: a dynamic dimension left at 1 '
        "makes a model look many times faster than at its real size.</p>"
    ]
    from ...models.kernel_samples import is_kernel_sample

    # kernel samples are one kernel each, the kernel predictor's calibration: named in one line, not drawn
    samples = sorted({m for m in top["model"] if is_kernel_sample(m)})
    if samples:
        out.append(
            f'<p class="note" data-kernel-samples="{len(samples)}">{len(samples)} kernel samples profiled '
            f"to calibrate the per-kernel predictor (one kernel each, not drawn): {esc(', '.join(samples))}."
            "</p>"
        )
    top = top[~top["model"].isin(samples)]
    for (device, model, runtime), g in top.groupby(["device", "model", "runtime"], sort=True):
        shape = shapes.get((device, model, runtime), "input shapes not recorded")
        out.append(
            f"<h3>{esc(model)} on {esc(device)} ({esc(runtime)}) "
            f'<span class="shapes" data-shapes="{esc(shape)}">at {esc(shape)}</span></h3>'
        )
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
                plots.ops_plot(f"time by op type: {model} on {device} at {shape}", t),
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


PREDICTOR_NAMES = {ROOFLINE_PREDICTOR: "whole-model", KERNEL_PREDICTOR: "per-kernel"}


def _kernel_cv_kpis(summ: Any) -> list[str]:
    """The per-kernel predictor's held-out figures: fleet-wide share and error, each target's interval."""
    if summ.empty:
        return []
    kernel = summ[summ["predictor"] == KERNEL_PREDICTOR]
    out = []
    for r in kernel.itertuples():
        where = "all devices" if r.device == "*" else f"{r.device} {r.runtime}".strip()
        iv = interval_text(r.interval, r.coverage)
        if not r.judged:
            out.append(_too_few_tile(f"cv-kernel-{r.quantity}", r, f"per-kernel predictor ({where})"))
            continue
        out.append(
            f'<div class="kpi" data-kpi="cv-kernel-{esc(r.quantity)}" data-device="{esc(r.device)}">'
            f"<b>{pct(r.cv_within_10pct)}</b><span>within ±10%: p50 of a model never profiled, "
            f"per-kernel predictor ({esc(where)})<br>{int(r.pairs)} held-out profiles, median error "
            f"{pct(r.cv_median_abs_err)}"
            + (f"; measured / predicted {esc(iv)}" if iv else "")
            + "</span></div>"
        )
    return out


def _too_few_tile(kpi: str, r: Any, what: str) -> str:
    """A share's tile where too few models were held out to judge it: says so, and what gives enough."""
    return (
        f'<div class="kpi too-few" data-kpi="{esc(kpi)}" data-device="{esc(r.device)}" data-judged="no">'
        f"<b>{esc(TOO_FEW)}</b><span>{esc(what)}: {esc(r.quantity)}<br>{esc(r.too_few)}</span></div>"
    )


def _prediction(d: ReportData) -> tuple[str, bool]:
    """Where fit predicted: the cross-validation that bounds each prediction, and the calibrations."""
    t = frames.fit_tables(d.fit)
    v, summ, pts, cal = t["verdicts"], t["summary"], t["points"], t["calibration"]
    if v.empty and pts.empty:
        return nodata("bench measurements to judge"), False
    out = [f'<p class="note">Source: {esc(d.fit_source)}.</p>']
    for w in d.fit_warnings:
        out.append(f'<p class="note">Note: {esc(w)}</p>')
    out.append(_predicted_table(v[v["basis"] == "predicted"]))
    if pts.empty:
        out.append(
            '<p class="note">No cross-validation: it needs at least two measured models with FLOP/byte '
            "counts on a device (run `edgebench fit --model PATH ...` or `edgebench roofline`).</p>"
        )
    else:
        out += _whole_model_cv_kpis(summ)
        out += _kernel_cv_kpis(summ)
        out.append(
            '<p class="note">Each measured model is predicted from the others measured on its device, as if '
            "it had never been benched there, and compared with its measurement: by the whole-model "
            "(roofline) predictor, and where the device has per-op profiles by the per-kernel predictor "
            "(each profiled model at each of its shapes, predicted from its graph by a calibration that "
            "never saw it; its interval bounds measured / predicted for a new model). Percentiles also carry "
            "the run-to-run noise of the device: on a busy or thermally unstable device they scatter more "
            "than the fastest inference does.</p>"
        )
        out.append(_cv_figures(summ, pts))
    out.append(_calibration_table(cal))
    return "".join(out), True


def _predicted_table(predicted: pd.DataFrame) -> str:
    """The predicted pairs: p50 and memory, and what each prediction rests on."""
    if predicted.empty:
        return ""
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
    return table(["device", "model", "runtime", "predicted p50 ms", "predicted memory MB", "evidence"], prows)


def _whole_model_cv_kpis(summ: pd.DataFrame) -> list[str]:
    """The whole-model predictor's fleet-wide shares within +-10%, one tile per question it answers."""
    out = []
    overall = summ[summ["device"] == "*"] if not summ.empty else summ
    whole = overall[overall["predictor"] == ROOFLINE_PREDICTOR] if not overall.empty else overall
    labels = {
        ("model", "latency_p50_ms"): "p50 of a model never benched anywhere",
        ("pair", "latency_p50_ms"): "p50 of a model benched on other devices, not this one",
        ("model", "latency_min_ms"): "fastest inference (the calibrated cost, least disturbed by load)",
        ("model", "memory_mb"): "peak memory",
    }
    for (holdout, quantity), what in labels.items():
        found = whole[(whole["holdout"] == holdout) & (whole["quantity"] == quantity)]
        for r in found.itertuples():
            if not r.judged:
                kpi = f"cv-{holdout}-{quantity}"
                out.append(_too_few_tile(kpi, r, f"{what} (whole-model predictor)"))
                continue
            out.append(
                f'<div class="kpi" data-kpi="cv-{esc(holdout)}-{esc(quantity)}">'
                f"<b>{pct(r.cv_within_10pct)}</b><span>within ±10%: {esc(what)} (whole-model "
                f"predictor)<br>{int(r.pairs)} held-out pairs, median error "
                f"{pct(r.cv_median_abs_err)}</span></div>"
            )
    return out


def _cv_figures(summ: pd.DataFrame, pts: pd.DataFrame) -> str:
    """The leave-one-model-out plot of the whole-model p50 and every predictor's summary table."""
    out = []
    p50 = pts[
        (pts["quantity"] == "latency_p50_ms")
        & (pts["holdout"] == "model")
        & (pts["predictor"] == ROOFLINE_PREDICTOR)
    ]
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
                PREDICTOR_NAMES.get(r.predictor, r.predictor),
                r.holdout,
                r.quantity,
                int(r.pairs),
                pct(r.cv_within_10pct) if r.judged else TOO_FEW,
                pct(r.cv_median_abs_err),
                interval_text(r.interval, r.coverage),
            ]
            for r in summ.itertuples()
        ]
        headers = ["device", "runtime", "predictor", "held out", "quantity", "pairs", "within ±10%"]
        out.append(table([*headers, "median error", "interval (measured / predicted)"], rows2))
    out.append("</div>")
    return "".join(out)


def _calibration_table(cal: pd.DataFrame) -> str:
    """Each target's whole-model calibration: its method, efficiencies, overheads and ceilings."""
    if cal.empty:
        return ""
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
    headers = ["device", "runtime", "models", "method", "efficiency of each floor", "overhead ms"]
    return table([*headers, "per node µs", "local correction", "ceilings"], rows3)


def _deltas(d: ReportData) -> tuple[str, bool]:
    if len(d.runs) < 2:
        return (
            '<p class="nodata">Only one run selected: select two or more runs (--run) to see changes.</p>',
            False,
        )
    df = frames.deltas(d.measurements, d.run_order)
    if df.empty:
        return nodata("measurements repeated across runs"), False
    df = df.assign(order=df["direction"].map({"up": 0, "down": 1, "same": 2})).sort_values(
        ["order", "device", "model", "metric"]
    )
    rows = []
    for r in df.itertuples():
        change = esc(pct(r.change, signed=True))
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
                esc(r.direction),
                esc(f"{r.baseline_run} → {r.latest_run}"),
            ]
        )
    moved = int((df["direction"] != "same").sum())
    head = (
        f'<p class="note">Raw deltas: {moved} measurement(s) moved by 5% or more, earliest vs latest '
        "selected run. A direction, not a verdict: the gate's rule and test judge regressions (the "
        "regressions section).</p>"
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
            "direction",
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
    "fit": _fit,
    "regressions": _regressions,
    "health": _health,
    "variants": _variants,
    "placement": placement.where_it_ran,
    "accuracy": _accuracy,
    "sensitivity": _sensitivity,
    "ops": _ops,
    "ceilings": _ceilings,
    "roofline": _roofline,
    "threads": _threads,
    "latency": _latency,
    "thermal": _thermal,
    "power": _power,
    "decode": _decode,
    "divergence": workloads.divergence,
    "streaming": workloads.streaming,
    "coldload": workloads.cold_load,
    "soak": workloads.soak,
    "contention": workloads.contention,
    "history": _history,
    "prediction": _prediction,
    "deltas": _deltas,
    "summary": _summary,
    "errors": _errors,
}
GROUP_TITLES = {ANSWER: "The answer", DETAIL: "The detail"}


def render_html(data: ReportData) -> str:
    """The whole report as one HTML document: the answer first, then the detail."""
    groups: dict[str, list[str]] = {}
    nav: dict[str, list[str]] = {}
    subject = unmeasured.subject_of(data)
    for sid, title, group in SECTIONS:
        body, has_data = BUILDERS[sid](data)
        nav.setdefault(group, []).append(
            f'<a href="#{sid}" class="{"" if has_data else "empty"}">{esc(title)}</a>'
        )
        # An empty section is one line (what was not measured, the command that measures it), no heading.
        inner = (
            f"<h2>{esc(title)}</h2>{body}" if has_data else unmeasured.folded_line(sid, title, body, subject)
        )
        state = "data" if has_data else "empty"
        groups.setdefault(group, []).append(
            f'<section id="{sid}" data-section="{sid}" data-state="{state}">{inner}</section>'
        )
    runs = ", ".join(r.run_id for r in data.runs[-3:]) + (" and earlier" if len(data.runs) > 3 else "")
    meta = (
        f"store {esc(data.store_name)} · {len(data.runs)} run(s): {esc(runs)} · "
        f"{len(data.measurements)} records · generated {esc(data.generated)} by edgebench {esc(__version__)}"
    )
    doc_meta = json.dumps({"runs": data.run_order, "generated": data.generated}, separators=(",", ":"))
    nav_html = "".join(
        f'<span class="group">{esc(GROUP_TITLES[g])}:</span> {" ".join(links)} ' for g, links in nav.items()
    )
    main = "".join(
        f'<div class="group {g}" data-group="{g}">{"".join(sections)}</div>' for g, sections in groups.items()
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(data.title)}</title><style>{css()}</style></head><body>"
        f'<header><h1>{esc(data.title)}</h1><div class="meta">{meta}</div></header>'
        f"<nav>{nav_html}</nav><main>{main}</main>"
        f'<footer data-report="{esc(doc_meta)}">edgebench {esc(__version__)} · self-contained report: every '
        "figure is embedded, nothing is fetched.</footer></body></html>\n"
    )
