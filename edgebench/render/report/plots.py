"""Report figures: matplotlib with the Agg canvas, returned as base64 PNG data URIs (no files, no network).

Each function takes frames (or samples) and returns a `data:image/png;base64,...` string. Figures are built
on `matplotlib.figure.Figure` directly, never through pyplot, so nothing global is touched.
"""

from __future__ import annotations

import base64
import io
import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ...records import Samples

WIDTH_IN, HEIGHT_IN, DPI = 7.2, 3.6, 100
LEGEND_POINTS = 8
_PALETTE = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#0a7e8c", "#bf3989", "#57606a"]


def new_figure(height: float = HEIGHT_IN, width: float = WIDTH_IN) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def to_data_uri(fig: Figure) -> str:
    """PNG bytes as a data URI; PNG metadata (software name and its web address) is stripped."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _horizontal() -> dict[str, Any]:
    """Horizontal box plots: `orientation` since matplotlib 3.10, `vert=False` before."""
    import inspect

    from matplotlib.axes import Axes

    if "orientation" in inspect.signature(Axes.boxplot).parameters:
        return {"orientation": "horizontal"}
    return {"vert": False}


def _style(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, which="major", alpha=0.3)


def distinct_labels(labels: Sequence[str], width: int = 32) -> list[str]:
    """Labels that still tell every series apart: what all of them share at the start is cut (said once
    by a leading "…"), and what is still too long is wrapped onto more lines, never truncated, so ten
    `tests/test_m.py::test_infer[...]` boxes or `enc.fp32` vs `enc.int8` keep their difference."""
    if all(len(x) <= width for x in labels):
        return list(labels)
    unique = sorted(set(labels))
    prefix = os.path.commonprefix(unique) if len(unique) > 1 else ""
    cut = max(prefix.rfind(c) for c in " /:.[(_-") + 1 if prefix else 0
    out = []
    for x in labels:
        body = ("…" + x[cut:]) if cut > 3 and len(x) > width else x
        out.append("\n".join(textwrap.wrap(body, width, break_on_hyphens=False)) or body)
    return out


def roofline_figure(device: str, points: pd.DataFrame, peaks: Mapping[str, Any]) -> Figure:
    """Attainable GFLOP/s vs arithmetic intensity: ceilings as lines, each benched model as a point."""
    fig = new_figure(height=4.0)
    ax = fig.add_subplot()
    pts = points.dropna(subset=["intensity"])
    xs = pts["intensity"].to_numpy(dtype=float)
    lo = min([0.05, *xs[xs > 0]]) / 2 if len(xs) else 0.05
    hi = max([100.0, *xs]) * 2 if len(xs) else 100.0
    grid = np.logspace(math.log10(lo), math.log10(hi), 200)
    bw = peaks.get("bandwidth")
    flops = peaks.get("flops") or {}
    styles = ["-", "--", ":", "-."]
    for i, (dtype, peak) in enumerate(sorted(flops.items())):
        roof = np.full_like(grid, peak / 1e9)
        if bw:
            roof = np.minimum(roof, grid * bw / 1e9)
        ax.plot(
            grid,
            roof,
            styles[i % 4],
            color="#57606a",
            lw=1.5,
            label=f"ceiling {dtype} ({peak / 1e9:.0f} GFLOP/s)",
        )
    if bw and not flops:
        ax.plot(grid, grid * bw / 1e9, "-", color="#57606a", lw=1.5, label=f"bandwidth {bw / 1e9:.1f} GB/s")
    elif bw:
        ax.plot([], [], " ", label=f"bandwidth {bw / 1e9:.1f} GB/s")
    measured = pts.dropna(subset=["achieved_gflops"])
    # A few models get legend entries; a fleet gets its names written next to the points instead.
    crowded = len(measured) > LEGEND_POINTS
    names = distinct_labels(
        [f"{r.model} ({r.runtime})" if r.runtime else str(r.model) for r in measured.itertuples()], 36
    )
    for i, row in enumerate(measured.itertuples()):
        color = _PALETTE[i % len(_PALETTE)]
        name = names[i]
        ax.scatter(
            [row.intensity],
            [row.achieved_gflops],
            s=30 if crowded else 40,
            color=color,
            zorder=3,
            label=None if crowded else name,
        )
        if crowded:
            ax.annotate(
                name,
                (row.intensity, row.achieved_gflops),
                fontsize=6,
                xytext=(3, 2),
                textcoords="offset points",
                color="#1f2328",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    _style(ax, f"roofline: {device}", "arithmetic intensity (FLOP per weight byte)", "GFLOP/s")
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=7, loc="lower right", framealpha=0.8)
    return fig


def roofline_plot(device: str, points: pd.DataFrame, peaks: Mapping[str, Any]) -> str:
    return to_data_uri(roofline_figure(device, points, peaks))


def thread_plot(device: str, curve: pd.DataFrame) -> str:
    """Latency vs thread count, one line per model (and affinity / cluster series)."""
    fig = new_figure()
    ax = fig.add_subplot()
    groups = list(curve.groupby(["model", "runtime", "series"], sort=True))
    labels = distinct_labels(
        [" ".join(x for x in (m, f"({rt})" if rt else "", se) if x) for (m, rt, se), _ in groups], 40
    )
    for i, ((_, g), label) in enumerate(zip(groups, labels, strict=True)):
        g = g.groupby("threads", as_index=False)["latency_ms"].min()
        ax.plot(g["threads"], g["latency_ms"], "o-", color=_PALETTE[i % len(_PALETTE)], label=label)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    _style(ax, f"thread sweep: {device}", "threads", "latency p50 (ms)")
    ax.legend(fontsize=7)
    return to_data_uri(fig)


def latency_figure(device: str, dists: Sequence[Mapping[str, Any]]) -> Figure:
    """Latency distributions (box plots over the raw samples), one row per model and configuration."""
    fig = new_figure(height=max(2.0, 0.45 * len(dists) + 1.0))
    ax = fig.add_subplot()
    names = [" ".join(x for x in (d["model"], f"({d['runtime']})", d["config"]) if x) for d in dists]
    # The same measurement in several runs: the run tells the boxes apart.
    names = [
        f"{n} · run {d.get('run_id', '?')}" if names.count(n) > 1 else n
        for n, d in zip(names, dists, strict=True)
    ]
    labels = distinct_labels(names, 40)
    lines = sum(label.count("\n") + 1 for label in labels)
    if lines > len(labels):  # wrapped labels need the room
        fig.set_size_inches(WIDTH_IN, max(2.0, 0.3 * lines + 1.0))
    data = [d["values"] for d in dists]
    ax.boxplot(
        data,
        whis=(1, 99),
        showfliers=True,
        widths=0.6,
        flierprops={"markersize": 2, "alpha": 0.4},
        **_horizontal(),
    )
    ax.set_yticks(range(1, len(labels) + 1), labels)
    lows = [float(np.min(v)) for v in data if len(v)]
    highs = [float(np.max(v)) for v in data if len(v)]
    if lows and min(lows) > 0 and max(highs) / min(lows) > 20:
        ax.set_xscale("log")
    _style(ax, f"latency distribution: {device} (whiskers p1..p99)", "latency (ms)", "")
    return fig


def latency_plot(device: str, dists: Sequence[Mapping[str, Any]]) -> str:
    return to_data_uri(latency_figure(device, dists))


def series_plot(title: str, df: pd.DataFrame, metrics: Sequence[str]) -> str:
    """Stacked time series (e.g. latency, temperature, frequency over a sustained run), shared time axis."""
    present = [m for m in metrics if (df["metric"] == m).any()]
    fig = new_figure(height=1.6 * len(present) + 0.8)
    axes = fig.subplots(len(present), 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, present, strict=True):
        part = df[df["metric"] == metric]
        unit = part["unit"].iloc[0] if len(part) else ""
        groups = list(part.groupby("series", sort=True))
        labels = distinct_labels([str(name) for name, _ in groups], 30)
        for i, ((series, g), label) in enumerate(zip(groups, labels, strict=True)):
            ax.plot(
                g["t_s"],
                g["value"],
                "-",
                lw=1.2,
                color=_PALETTE[i % len(_PALETTE)],
                label=label if series else None,
            )
        ax.set_ylabel(f"{metric}\n({unit})" if unit else metric, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.3)
        if part["series"].nunique() > 1:
            ax.legend(fontsize=6, loc="upper right")
    axes[0].set_title(title, fontsize=10, loc="left")
    axes[-1].set_xlabel("time (s)", fontsize=9)
    return to_data_uri(fig)


def samples_plot(title: str, samples: Sequence[Samples]) -> str:
    """Raw sensor samples (e.g. power readings) in the order taken."""
    fig = new_figure()
    ax = fig.add_subplot()
    labels = distinct_labels(
        [" ".join(x for x in (s.model or "", s.metric, s.run_id) if x) for s in samples], 40
    )
    for i, (s, label) in enumerate(zip(samples, labels, strict=True)):
        ax.plot(np.arange(len(s.values)), s.values, "-", lw=1, color=_PALETTE[i % len(_PALETTE)], label=label)
    _style(ax, title, "sample", samples[0].unit if samples else "")
    ax.legend(fontsize=7)
    return to_data_uri(fig)


def ops_plot(title: str, totals: pd.DataFrame) -> str:
    """Time per op type (summed over nodes), largest first."""
    t = totals.sort_values("ms", ascending=True).tail(12)
    fig = new_figure(height=max(2.0, 0.3 * len(t) + 1.0))
    ax = fig.add_subplot()
    ax.barh(t["op_type"].astype(str), t["ms"], color=_PALETTE[0])
    _style(ax, title, "time (ms)", "")
    return to_data_uri(fig)


def ceilings_figure(device: str, ceil: pd.DataFrame) -> Figure:
    """Measured ceilings as bars, the datasheet figure as a marker and the efficiency as text; one panel
    per unit (TOPS and GB/s never share an axis)."""
    units = list(dict.fromkeys(str(u) for u in ceil["unit"]))
    heights = [max(1.2, 0.4 * int((ceil["unit"] == u).sum()) + 0.8) for u in units]
    fig = new_figure(height=sum(heights) + 0.3)
    axes = fig.subplots(len(units), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, unit in zip(axes, units, strict=True):
        part = ceil[ceil["unit"] == unit]
        labels = distinct_labels([f"{r.kind} {r.what} {r.backend}".strip() for r in part.itertuples()], 34)
        ys = np.arange(len(part))
        ax.barh(ys, part["best"].astype(float), color=_PALETTE[0], label="measured")
        sheet = part["datasheet"].astype(float)
        if sheet.notna().any():
            ax.scatter(sheet, ys, marker="|", s=300, color=_PALETTE[1], zorder=3, label="datasheet")
        for y, r in zip(ys, part.itertuples(), strict=True):
            if r.efficiency is not None and r.efficiency == r.efficiency:
                ax.text(float(r.best), float(y), f" {r.efficiency:.0%}", va="center", fontsize=8)
        ax.set_yticks(ys, labels)
        values = pd.concat([part["best"], sheet]).astype(float).dropna()
        if len(values) and values.min() > 0 and values.max() / values.min() > 20:
            ax.set_xscale("log")
        _style(ax, f"ceilings: {device} ({unit})" if ax is axes[0] else unit, unit, "")
        ax.legend(fontsize=7, loc="lower right")
    return fig


def ceilings_plot(device: str, ceil: pd.DataFrame) -> str:
    return to_data_uri(ceilings_figure(device, ceil))


def cv_plot(points: pd.DataFrame) -> str:
    """Cross-validated prediction vs measurement (log-log), with the +-10% band."""
    fig = new_figure(height=4.0, width=5.6)
    ax = fig.add_subplot()
    vals = pd.concat([points["measured"], points["predicted"]]).astype(float)
    lo, hi = float(vals.min()) / 1.5, float(vals.max()) * 1.5
    line = np.array([lo, hi])
    ax.fill_between(line, line * 0.9, line * 1.1, color="#1a7f37", alpha=0.15, label="within ±10%")
    ax.plot(line, line, "-", color="#1a7f37", lw=1)
    for i, ((device, runtime), g) in enumerate(points.groupby(["device", "runtime"], sort=True)):
        ax.scatter(
            g["measured"],
            g["predicted"],
            s=22,
            color=_PALETTE[i % len(_PALETTE)],
            label=f"{device} ({runtime})" if runtime else device,
            zorder=3,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    _style(ax, "held-out prediction vs measurement", "measured latency p50 (ms)", "predicted (ms)")
    ax.legend(fontsize=7, loc="upper left")
    return to_data_uri(fig)


def history_figure(series: Mapping[str, Any]) -> Figure:
    """A nightly series: value per run on a date axis (when each run measured), the steps marked."""
    import matplotlib.dates as mdates

    fig = new_figure(height=3.0)
    ax = fig.add_subplot()
    values = np.asarray(series["values"], dtype=float)
    stamps = series.get("ts") or []
    when = pd.to_datetime(pd.Series(stamps), utc=True, errors="coerce") if stamps else pd.Series(dtype=float)
    if len(when) == len(values) and when.notna().all():
        xs = [t.to_pydatetime() for t in when]
        ax.plot(xs, values, "o-", ms=3, color=_PALETTE[0])
        for run in series["steps"]:
            if run in series["runs"]:
                i = series["runs"].index(run)
                mid = xs[i - 1] + (xs[i] - xs[i - 1]) / 2 if i else xs[i]
                ax.axvline(mid, color=_PALETTE[1], ls="--", lw=1)
        locator = mdates.AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        xlabel = "when the run measured (UTC)"
    else:  # runs without timestamps: their order
        ax.plot(np.arange(len(values)), values, "o-", ms=3, color=_PALETTE[0])
        for run in series["steps"]:
            if run in series["runs"]:
                ax.axvline(series["runs"].index(run) - 0.5, color=_PALETTE[1], ls="--", lw=1)
        xlabel = "run (oldest first)"
    title = "\n".join(textwrap.wrap(f"history: {series['label']}", 90))
    _style(ax, title, xlabel, series.get("unit", ""))
    return fig


def history_plot(series: Mapping[str, Any]) -> str:
    return to_data_uri(history_figure(series))
