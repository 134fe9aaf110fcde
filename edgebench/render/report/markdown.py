"""The Markdown summary for CI logs and pull requests: the same data as the HTML report, without plots.

`render_markdown(data)` is pure: ReportData in, a string out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from ...analysis.fit_result import KERNEL_PREDICTOR, ROOFLINE_PREDICTOR
from . import frames, placement
from .data import ReportData
from .health import COLUMNS as HEALTH_COLUMNS
from .health import latest_health
from .markup import interval_text

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


_VERDICT = {"fits": "✅ fits", "does not fit": "❌ does not fit", "uncertain": "⚠ uncertain"}


def render_markdown(data: ReportData) -> str:
    """The answer first (fit verdicts with the values, regressions against the suite's previous run,
    device health), then variants, accuracy, ceilings, changes, history, runs and errors."""
    out = [f"# {data.title}", ""]
    out.append(f"{len(data.runs)} run(s) from `{data.store_name}`, generated {data.generated}.")
    if data.budgets:
        out += ["", "Budgets: " + ", ".join(f"`{b.key} = {cell(b.limit)}`" for b in data.budgets)]
    out += _answer(data)
    out += _regressions(data)
    out += _health(data)
    out += _health_section(data)
    out += _variants(data)
    out += _placement(data)
    out += _accuracy(data)
    out += _ceilings(data)
    out += _decode_section(data)
    out += _cv(data)
    if len(data.runs) >= 2:
        d = frames.deltas(data.measurements, data.run_order)
        changed = d[d["direction"] != "same"] if not d.empty else d
        out += ["", "## Changes between runs (raw deltas)", ""]
        out += [
            "_Earliest vs latest selected run, moves of 5% or more: a direction, not a verdict (the gate's "
            "rule and test judge regressions, above)._",
            "",
        ]
        if changed.empty:
            out.append("_No measurement moved by more than 5%._")
        else:
            out.append(
                md_table(
                    ["device", "model", "metric", "params", "baseline", "latest", "change", "direction"],
                    [
                        [
                            r.device,
                            r.model,
                            r.metric,
                            r.params,
                            r.baseline,
                            r.latest,
                            _pct(r.change, signed=True),
                            r.direction,
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
    out += _devices(data)
    out += ["", "## Runs", ""]
    out.append(
        md_table(
            ["run", "kind", "status", "started"],
            [
                [r.run_id, r.kind + (f" ({r.suite})" if r.suite else ""), r.status, r.created]
                for r in data.runs
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
            r.device, r.model, r.runtime, f"{r.prompt_tokens}+{r.new_tokens}", r.depth, cell(r.ttft_ms),
            cell(r.decode_ms_per_token),
            cell(r.decode_tokens_per_s) + _MARK[frames.budget_status(r.decode_tokens_per_s, budget)],
            cell(r.floor_tokens_per_s), _pct(r.decode_efficiency) + (" (uncertain)" if r.uncertain else ""),
        ]
        for r in df.itertuples()
    ]  # fmt: skip
    columns = [
        "device", "model", "runtime", "prompt+new", "depth", "ttft ms", "ms/token p50", "tokens/s",
        "floor tokens/s",
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


def _ratio(r: Any) -> str:
    if r is None or (isinstance(r, float) and math.isnan(r)):
        return "–"
    return f"{r:.2f}x budget" if r < 10 else f"{r:.0f}x budget"


def _answer(data: ReportData) -> list[str]:
    """Device x model: the verdict next to p50, p99, memory and energy, marked against the budgets."""
    out = ["", "## Which model fits which chip", ""]
    m = frames.bench_matrix(data.measurements, data.samples, data.run_order)
    verdicts = frames.fit_tables(data.fit)["verdicts"]
    by = {(v.device, v.runtime, v.model): v for v in verdicts.itertuples()}
    if m.empty and verdicts.empty:
        return [*out, "_No bench measurements._"]

    def q(value: Any, key: str, unit: str) -> str:
        status = frames.budget_status(value, data.budget(key))
        return ("–" if value is None or value != value else f"{cell(value)} {unit}") + _MARK[status]

    rows = []
    seen = set()
    for r in m.itertuples():
        v = by.get((r.device, r.runtime, r.model))
        seen.add((r.device, r.runtime, r.model))
        rows.append(
            [
                _VERDICT.get(v.verdict, "–") if v is not None else "–",
                r.device,
                r.model,
                r.runtime,
                q(r.p50, "latency_p50_ms", "ms"),
                q(r.p99, "latency_p99_ms", "ms"),
                q(r.memory_mb, "memory_mb", "MB"),
                q(r.energy_mj, "energy_mj", "mJ"),
                f"{v.limiting}: {_ratio(v.ratio)}" if v is not None and v.limiting else "–",
                "measured",
            ]
        )
    for v in verdicts.itertuples():  # pairs never benched: fit's prediction
        if (v.device, v.runtime, v.model) in seen:
            continue
        pred = v.predicted or {}
        rows.append(
            [
                _VERDICT.get(v.verdict, "–"),
                v.device,
                v.model,
                v.runtime,
                q(pred.get("predicted_latency_ms:p50"), "latency_p50_ms", "ms"),
                q(pred.get("predicted_latency_ms:p99"), "latency_p99_ms", "ms"),
                q(pred.get("predicted_memory_mb"), "memory_mb", "MB"),
                q(pred.get("predicted_energy_mj"), "energy_mj", "mJ"),
                f"{v.limiting}: {_ratio(v.ratio)}" if v.limiting else "–",
                "predicted",
            ]
        )
    out.append(
        md_table(
            [
                "verdict",
                "device",
                "model",
                "runtime",
                "p50",
                "p99",
                "peak memory",
                "energy",
                "limiting",
                "basis",
            ],
            rows,
        )
    )
    if data.budgets:
        out += [
            "",
            "❌ over budget, ⚠ within 10% of it; a prediction fits only when its whole interval does.",
        ]
    uncertain = [v for v in verdicts.itertuples() if v.verdict == "uncertain" and v.why]
    for v in uncertain[:10]:
        out.append(f"- {v.device} {v.model}: uncertain: {v.why}")
    return out


def _regressions(data: ReportData) -> list[str]:
    g = data.regression
    out = ["", "## Regressions against the previous run", ""]
    if not g:
        return [*out, "_No earlier run of the same suite to compare with._"]
    counts = ", ".join(f"{n} {k}" for k, n in (g.get("counts") or {}).items() if n) or "nothing compared"
    out.append(
        f"**{g.get('verdict')}**: `{g.get('candidate')}` against `{g.get('baseline')}`: {counts} "
        f"({data.regression_source})."
    )
    look = [p for p in g.get("pairs") or [] if p["verdict"] != "PASS"]
    look.sort(key=lambda p: -abs(p.get("change") or 0.0))
    if look:
        out += [""]
        out.append(
            md_table(
                ["change", "verdict", "device", "model", "metric", "baseline", "candidate", "why"],
                [
                    [
                        _pct(p.get("change"), signed=True)
                        if p.get("change_relative", True)
                        else cell(p.get("change")),
                        p["verdict"],
                        p["device"],
                        p["model"],
                        f"{p['probe']}:{p['metric']}" + (f"[{p['stat']}]" if p.get("stat") else ""),
                        p.get("baseline"),
                        p.get("candidate"),
                        p.get("reason", ""),
                    ]
                    for p in look
                ],
            )
        )
    return out


def _ceilings(data: ReportData) -> list[str]:
    """Measured ceilings against the datasheet, or against the derived peak marked as such with its
    arithmetic: a derived figure is an upper bound from the ISA, not a vendor's number."""
    c = frames.ceilings(data.measurements, data.devices)
    if c.empty:
        return []
    rows = [[*frames.ceiling_cells(r, cell), _pct(r.efficiency)] for r in c.itertuples()]
    columns = ["device", "probe", "dtype / kernel", "backend", "best", "unit", "datasheet / nominal"]
    out = ["", "## Measured ceilings", "", md_table([*columns, "efficiency"], rows)]
    for device, source in frames.derived_nominals(c):
        out += ["", f"_{device}: no datasheet peak in its descriptor, so the nominal peak is {source}._"]
    return out


def _devices(data: ReportData) -> list[str]:
    """Each device once: transport, architecture and cores, and on Arm its SIMD features, clusters and
    derived peak (the fingerprint the agent took on the device)."""
    seen: dict[str, dict[str, Any]] = {}
    for info in data.devices:
        seen.setdefault(info["device"], info)
    rows = []
    for name, info in sorted(seen.items()):
        desc, fp = info.get("descriptor") or {}, info.get("fingerprint") or {}
        arm = frames.arm_details(fp) or "–"
        rows.append([name, desc.get("transport"), desc.get("soc"), fp.get("arch"), fp.get("cores"), arm])
    if not rows:
        return []
    return ["", "## Devices", "", md_table(["device", "transport", "soc", "arch", "cores", "Arm CPU"], rows)]


def _health(data: ReportData) -> list[str]:
    h = frames.health(data.runs, data.jobs, data.errors, data.records)
    if h.empty:
        return []
    return [
        "",
        "## Device health",
        "",
        md_table(
            ["device", "health", "jobs", "failed", "disturbed", "notes"],
            [
                [r.device, r.status, r.jobs, r.failed, r.disturbed, "; ".join(r.notes) or "–"]
                for r in h.itertuples()
            ],
        ),
    ]


def _variants(data: ReportData) -> list[str]:
    m = frames.bench_matrix(data.measurements, data.samples, data.run_order)
    from ...analysis.variants import speedup_text

    v = frames.variants(
        data.measurements, m, frames.fit_tables(data.fit)["verdicts"], data.samples, data.run_order
    )
    if v.empty:
        return []
    return [
        "",
        "## Variants",
        "",
        md_table(
            [
                "source",
                "variant",
                "device",
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
            [
                [
                    r.source,
                    r.variant,
                    r.device,
                    r.size_bytes,
                    f"{r.size_ratio:.2f}x"
                    if r.size_ratio == r.size_ratio and r.size_ratio is not None
                    else "–",
                    speedup_text(r.speedup, r.speedup_low, r.speedup_high),
                    r.p50,
                    r.p99,
                    r.memory_mb,
                    "–" if r.cosine is None or r.cosine != r.cosine else f"{r.cosine:.6f}",
                    r.snr_db,
                    _VERDICT.get(r.verdict, "–"),
                ]
                for r in v.itertuples()
            ],
        ),
    ]


def _placement(data: ReportData) -> list[str]:
    found = placement.text_rows(data.measurements)
    if not found:
        return []
    rows = [
        [*cells[:5], cells[5] + ("" if full else " (not wholly on it)"), *cells[6:]] for cells, full in found
    ]
    return ["", "## Where it ran", "", placement.NOTE, "", md_table(list(placement.COLUMNS), rows)]


def _accuracy(data: ReportData) -> list[str]:
    acc = frames.accuracy(data.measurements)
    if acc.empty:
        return []
    return [
        "",
        "## Accuracy",
        "",
        md_table(
            ["device", "model", "detail", "cosine", "max abs err", "mean abs err", "SNR dB"],
            [
                [
                    r.device,
                    r.model,
                    r.detail,
                    "–" if r.cosine != r.cosine or r.cosine is None else f"{r.cosine:.6f}",
                    r.max_abs_err,
                    r.mean_abs_err,
                    r.snr_db,
                ]
                for r in acc.itertuples()
            ],
        ),
    ]


def _cv(data: ReportData) -> list[str]:
    summ = frames.fit_tables(data.fit)["summary"]
    if summ.empty:
        return []
    overall = summ[(summ["device"] == "*") & (summ["holdout"] == "model")]
    whole = overall[overall["predictor"] == ROOFLINE_PREDICTOR]
    kernel = _kernel_cv(summ)
    if whole.empty and not kernel:
        return []
    out = ["", "## How far to trust the predictions"]
    if not whole.empty:
        out += [
            "",
            "Each measured model predicted as if never benched, against its measurement, by the "
            "whole-model (roofline) predictor:",
            "",
        ]
        out += [
            f"- {r.quantity}: {_pct(r.cv_within_10pct)} of {int(r.pairs)} pairs within ±10%, "
            f"median error {_pct(r.cv_median_abs_err)}"
            if r.judged
            else f"- {r.quantity}: {r.too_few}"
            for r in whole.itertuples()
        ]
    if kernel:
        out += ["", "By the per-kernel predictor, each profiled model held out at every shape:", "", *kernel]
    return out


def _kernel_cv(summ: Any) -> list[str]:
    """The per-kernel predictor's held-out figures: fleet-wide, then each target with its interval."""
    out = []
    for r in summ[summ["predictor"] == KERNEL_PREDICTOR].itertuples():
        where = "all devices" if r.device == "*" else f"{r.device} {r.runtime}".strip()
        iv = interval_text(r.interval, r.coverage)
        if not r.judged:
            out.append(f"- per-kernel predictor, {r.quantity} ({where}): {r.too_few}")
            continue
        out.append(
            f"- per-kernel predictor, {r.quantity} ({where}): {_pct(r.cv_within_10pct)} of {int(r.pairs)} "
            f"held-out profiles within ±10%, median error {_pct(r.cv_median_abs_err)}"
            + (f", measured / predicted {iv}" if iv else "")
        )
    return out
