"""The Markdown summary for CI logs and pull requests: the same data as the HTML report, without plots.

`render_markdown(data)` is pure: ReportData in, a string out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from . import frames
from .data import ReportData
from .health import COLUMNS as HEALTH_COLUMNS
from .health import latest_health

_MARK = {"ok": "", "near": " ⚠", "over": " ❌", "none": ""}


def cell(value: Any) -> str:
    """A table cell: numbers with a few significant digits, pipes escaped, no newlines."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        v = float(value)
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += [
        "| " + " | ".join(cell(v) if not isinstance(v, str) else cell(v) for v in row) + " |" for row in rows
    ]
    return "\n".join(lines)


def _pct(v: Any, signed: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:+.1%}" if signed else f"{v:.1%}"


def render_markdown(data: ReportData) -> str:
    """Summary: runs, the device x model matrix against budgets, ceilings, fit verdicts, errors, changes."""
    out = [f"# {data.title}", ""]
    out.append(f"{len(data.runs)} run(s) from `{data.store_name}`, generated {data.generated}.")
    out.append("")
    out.append(
        md_table(
            ["run", "kind", "status", "started"],
            [
                [r.run_id, r.kind + (f" ({r.suite})" if r.suite else ""), r.status, r.created]
                for r in data.runs
            ],
        )
    )
    if data.budgets:
        out += ["", "Budgets: " + ", ".join(f"`{b.key} = {cell(b.limit)}`" for b in data.budgets)]
    out += _health_section(data)
    out += ["", "## Device × model", ""]
    m = frames.bench_matrix(data.measurements, data.samples, data.run_order)
    if m.empty:
        out.append("_No bench measurements._")
    else:
        rows = []
        for r in m.itertuples():

            def q(value: Any, key: str, unit: str) -> str:
                status = frames.budget_status(value, data.budget(key))
                return ("–" if value is None or value != value else f"{cell(value)} {unit}") + _MARK[status]

            rows.append(
                [
                    r.device,
                    r.model,
                    r.runtime,
                    q(r.p50, "latency_p50_ms", "ms"),
                    q(r.p99, "latency_p99_ms", "ms"),
                    q(r.memory_mb, "memory_mb", "MB"),
                    q(r.energy_mj, "energy_mj", "mJ"),
                    r.config,
                ]
            )
        out.append(
            md_table(
                ["device", "model", "runtime", "p50", "p99", "peak memory", "energy", "configuration"], rows
            )
        )
        if data.budgets:
            out += ["", "❌ over budget, ⚠ within 10% of it."]
    c = frames.ceilings(data.measurements, data.devices)
    if not c.empty:
        out += ["", "## Measured ceilings", ""]
        out.append(
            md_table(
                ["device", "probe", "dtype / kernel", "backend", "best", "unit", "datasheet", "efficiency"],
                [
                    [r.device, r.kind, r.what, r.backend, r.best, r.unit, r.datasheet, _pct(r.efficiency)]
                    for r in c.itertuples()
                ],
            )
        )
    out += _decode_section(data)
    out += _fit_section(data)
    if len(data.runs) >= 2:
        d = frames.deltas(data.measurements, data.run_order)
        changed = d[d["verdict"] != "same"] if not d.empty else d
        out += ["", "## Changes between runs", ""]
        if changed.empty:
            out.append("_No measurement changed by more than 5%._")
        else:
            out.append(
                md_table(
                    ["device", "model", "metric", "params", "baseline", "latest", "change", "verdict"],
                    [
                        [
                            r.device,
                            r.model,
                            r.metric,
                            r.params,
                            r.baseline,
                            r.latest,
                            _pct(r.change, signed=True),
                            r.verdict,
                        ]
                        for r in changed.itertuples()
                    ],
                )
            )
    steps, _, _ = frames.history(data.measurements)
    if not steps.empty:
        out += ["", "## History change points", ""]
        out.append(
            md_table(
                ["device", "model", "series", "first run at new level", "before", "after", "change"],
                [
                    [r.device, r.model, r.series, r.run_id, r.before, r.after, _pct(r.change, signed=True)]
                    for r in steps.itertuples()
                ],
            )
        )
    out += ["", "## Errors", ""]
    if data.errors:
        out.append(
            md_table(
                ["device", "probe", "model", "error"],
                [
                    [e.get("device"), e.get("probe"), e.get("model") or "", e.get("error") or ""]
                    for e in data.errors
                ],
            )
        )
    else:
        out.append("_No failed jobs._")
    return "\n".join(out) + "\n"


def _decode_section(data: ReportData) -> list[str]:
    df = frames.decode_summary(data.measurements, data.run_order)
    if df.empty:
        return []
    budget = data.budget("decode_tokens_per_s_min")
    rows = [
        [
            r.device, r.model, r.runtime, f"{r.prompt_tokens}+{r.new_tokens}", cell(r.ttft_ms),
            cell(r.decode_ms_per_token),
            cell(r.decode_tokens_per_s) + _MARK[frames.budget_status(r.decode_tokens_per_s, budget)],
            cell(r.floor_tokens_per_s), _pct(r.decode_efficiency) + (" (uncertain)" if r.uncertain else ""),
        ]
        for r in df.itertuples()
    ]  # fmt: skip
    columns = [
        "device", "model", "runtime", "prompt+new", "ttft ms", "ms/token p50", "tokens/s", "floor tokens/s",
        "efficiency",
    ]  # fmt: skip
    return ["", "## LLM decode", "", md_table(columns, rows)]


def _health_section(data: ReportData) -> list[str]:
    """Device health (latest `edgebench doctor` per device), only when some was measured."""
    found = latest_health(data.health, data.health_order)
    if not found:
        return []
    out = ["", "## Device health", ""]
    out += [f"⚠ **{h.device}**: {'; '.join(h.flags)}" for h in found if h.flags]
    out += [""] if any(h.flags for h in found) else []
    out.append(md_table(list(HEALTH_COLUMNS), [list(row) for h in found for row in h.rows]))
    return out


def _fit_section(data: ReportData) -> list[str]:
    t = frames.fit_tables(data.fit_records)
    v, summ = t["verdicts"], t["summary"]
    out: list[str] = []
    budgets: dict[str, float] = {}
    for row in v.itertuples():
        budgets.update(row.budgets or {})
    if budgets and not v.empty:
        out += ["", "## Which model fits which chip", ""]
        rows = []
        for r in v.itertuples():
            verdict = {1.0: "✅ fits", 0.0: "❌ does not fit"}.get(r.fits, "unknown")
            rows.append(
                [
                    r.device,
                    r.model,
                    r.runtime,
                    verdict,
                    r.basis,
                    r.limiting or "–",
                    _pct(r.margin, signed=True),
                    ", ".join(r.unchecked),
                ]
            )
        out.append(
            md_table(
                [
                    "device",
                    "model",
                    "runtime",
                    "verdict",
                    "basis",
                    "limiting budget",
                    "margin",
                    "not checked",
                ],
                rows,
            )
        )
    if not summ.empty:
        overall = summ[(summ["device"] == "*") & (summ["holdout"] == "model")]
        if not overall.empty:
            out += [
                "",
                "Prediction cross-validation (each measured model predicted as if never benched):",
                "",
            ]
            for r in overall.itertuples():
                out.append(
                    f"- {r.quantity}: {_pct(r.cv_within_10pct)} of {int(r.pairs)} pairs within ±10%, "
                    f"median error {_pct(r.cv_median_abs_err)}"
                )
    return out
