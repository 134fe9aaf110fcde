"""Report figures: matplotlib with the Agg canvas, returned as base64 PNG data URIs (no files, no network).

Each function takes frames (or samples) and returns a `data:image/png;base64,...` string. Figures are built
on `matplotlib.figure.Figure` directly, never through pyplot, so nothing global is touched.
"""

from __future__ import annotations

import base64
import io
import math
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


def _short(label: str, n: int = 28) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


def roofline_plot(device: str, points: pd.DataFrame, peaks: Mapping[str, Any]) -> str:
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
    for i, row in enumerate(measured.itertuples()):
        color = _PALETTE[i % len(_PALETTE)]
        name = _short(f"{row.model} ({row.runtime})" if row.runtime else str(row.model))
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
                _short(str(row.model), 16),
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
    return to_data_uri(fig)


def thread_plot(device: str, curve: pd.DataFrame) -> str:
    """Latency vs thread count, one line per model (and affinity / cluster series)."""
    fig = new_figure()
    ax = fig.add_subplot()
    for i, ((model, runtime, series), g) in enumerate(
        curve.groupby(["model", "runtime", "series"], sort=True)
    ):
        label = " ".join(x for x in (model, f"({runtime})" if runtime else "", series) if x)
        g = g.groupby("threads", as_index=False)["latency_ms"].min()
        ax.plot(
            g["threads"], g["latency_ms"], "o-", color=_PALETTE[i % len(_PALETTE)], label=_short(label, 40)
        )
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    _style(ax, f"thread sweep: {device}", "threads", "latency p50 (ms)")
    ax.legend(fontsize=7)
    return to_data_uri(fig)


def latency_plot(device: str, dists: Sequence[Mapping[str, Any]]) -> str:
    """Latency distributions (box plots over the raw samples), one row per model and configuration."""
    fig = new_figure(height=max(2.0, 0.45 * len(dists) + 1.0))
    ax = fig.add_subplot()
    labels = [
        _short(" ".join(x for x in (d["model"], f"({d['runtime']})", d["config"]) if x), 40) for d in dists
    ]
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
    return to_data_uri(fig)


def series_plot(title: str, df: pd.DataFrame, metrics: Sequence[str]) -> str:
    """Stacked time series (e.g. latency, temperature, frequency over a sustained run), shared time axis."""
    present = [m for m in metrics if (df["metric"] == m).any()]
    fig = new_figure(height=1.6 * len(present) + 0.8)
    axes = fig.subplots(len(present), 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, present, strict=True):
        part = df[df["metric"] == metric]
        unit = part["unit"].iloc[0] if len(part) else ""
        for i, (series, g) in enumerate(part.groupby("series", sort=True)):
            ax.plot(
                g["t_s"],
                g["value"],
                "-",
                lw=1.2,
                color=_PALETTE[i % len(_PALETTE)],
                label=_short(series, 30) if series else None,
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
    for i, s in enumerate(samples):
        label = " ".join(x for x in (s.model or "", s.metric) if x)
        ax.plot(
            np.arange(len(s.values)),
            s.values,
            "-",
            lw=1,
            color=_PALETTE[i % len(_PALETTE)],
            label=_short(label, 40),
        )
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


def ceilings_plot(device: str, ceil: pd.DataFrame) -> str:
    """Measured ceilings as bars, with the datasheet figure as a marker and the efficiency as text."""
    fig = new_figure(height=max(2.0, 0.4 * len(ceil) + 1.0))
    ax = fig.add_subplot()
    labels = [f"{r.kind} {r.what} {r.backend}".strip() + f" ({r.unit})" for r in ceil.itertuples()]
    ys = np.arange(len(ceil))
    ax.barh(ys, ceil["best"].astype(float), color=_PALETTE[0], label="measured")
    sheet = ceil["datasheet"].astype(float)
    if sheet.notna().any():
        ax.scatter(sheet, ys, marker="|", s=300, color=_PALETTE[1], zorder=3, label="datasheet")
    for y, r in zip(ys, ceil.itertuples(), strict=True):
        if r.efficiency is not None and r.efficiency == r.efficiency:
            ax.text(float(r.best), float(y), f" {r.efficiency:.0%}", va="center", fontsize=8)
    ax.set_yticks(ys, labels)
    ax.set_xscale("log")
    _style(ax, f"ceilings: {device}", "measured (log scale)", "")
    ax.legend(fontsize=7, loc="lower right")
    return to_data_uri(fig)


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
            label=_short(f"{device} ({runtime})" if runtime else device, 30),
            zorder=3,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    _style(ax, "held-out prediction vs measurement", "measured latency p50 (ms)", "predicted (ms)")
    ax.legend(fontsize=7, loc="upper left")
    return to_data_uri(fig)


def history_plot(series: Mapping[str, Any]) -> str:
    """A nightly series: value per run (oldest first), the runs where it stepped marked."""
    fig = new_figure(height=3.0)
    ax = fig.add_subplot()
    values = np.asarray(series["values"], dtype=float)
    ax.plot(np.arange(len(values)), values, "o-", ms=3, color=_PALETTE[0])
    for run in series["steps"]:
        if run in series["runs"]:
            ax.axvline(series["runs"].index(run) - 0.5, color=_PALETTE[1], ls="--", lw=1)
    _style(ax, _short(f"history: {series['label']}", 70), "run (oldest first)", series.get("unit", ""))
    return to_data_uri(fig)
