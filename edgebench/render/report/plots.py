"""Report figures: matplotlib with the Agg canvas, returned as base64 PNG data URIs (no files, no network).

Each function takes frames (or samples) and returns a `data:image/png;base64,...` string. Figures are built
on `matplotlib.figure.Figure` directly, never through pyplot, so nothing global is touched.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class PlacedLabels:
    """A figure as a data URI and where its point labels landed: boxes as (left, top, right, bottom) in
    fractions of the image (origin top left), and the labels' font size in image pixels, so a browser test
    can check at the displayed width that no two labels overlap and the text is large enough to read."""

    uri: str
    boxes: tuple[tuple[float, float, float, float], ...]
    font_px: float

    def attrs(self) -> dict[str, str]:
        """data-* attributes for the figure element."""
        boxes = [[round(v, 5) for v in b] for b in self.boxes]
        return {
            "data-labels": json.dumps(boxes, separators=(",", ":")),
            "data-label-px": f"{self.font_px:.2f}",
        }


LABEL_PT = 9.0  # 12.5 px at 100 dpi: legible where the 1000 px figure is shown at its size (1400 px window)
ROOF_WIDTH_IN, ROOF_HEIGHT_IN = 10.0, 5.2
# Directions tried around a point, nearest first; then the same further out, with a leader line.
_DIRECTIONS = [
    (1, 0.3),
    (1, -0.3),
    (-1, 0.3),
    (-1, -0.3),
    (0, 1),
    (0, -1),
    (1, 1),
    (-1, 1),
    (1, -1),
    (-1, -1),
]
_RADII = [5, 12, 22, 34, 48, 64, 84, 108, 136, 170]


def _roofs(
    points: pd.DataFrame, peaks: Mapping[str, Any]
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(memory roofs as (label, GB/s), compute roofs as (label, GFLOP/s)) for the plot.

    Where the points carry their floors (the memory level each working set was charged at, the bandwidth
    and the matmul peak it was charged with), the roofs are those levels: each level at the most any floor
    charged at it used, so every point sits under the roof of the level it lives in unless it beats its
    floor (which the floors table explains). Without floors: the device's best triad and matmul peaks.
    """
    memory: list[tuple[str, float]] = []
    compute: list[tuple[str, float]] = []
    if "level" in points and points["level"].notna().any():
        fl = points.dropna(subset=["level", "bandwidth_gbps"])
        for level, g in fl.groupby("level", sort=False):
            gbps = float(g["bandwidth_gbps"].astype(float).max())
            memory.append((f"{level} {gbps:.0f} GB/s" if gbps >= 10 else f"{level} {gbps:.1f} GB/s", gbps))
        peak = points["peak_gflops"].astype(float).max()
        if peak == peak and peak > 0:
            compute.append((f"matmul peak {peak:.0f} GFLOP/s", float(peak)))
        memory.sort(key=lambda x: -x[1])
        return memory, compute
    bw = peaks.get("bandwidth")
    if bw:
        memory.append((f"DRAM (triad) {bw / 1e9:.1f} GB/s", bw / 1e9))
    for dtype, peak in sorted((peaks.get("flops") or {}).items()):
        compute.append((f"matmul {dtype} {peak / 1e9:.0f} GFLOP/s", peak / 1e9))
    return memory, compute


def _point_label(row: Any, runtimes: int) -> str:
    threads = getattr(row, "threads", None)
    parts = [str(row.model)]
    if runtimes > 1 and row.runtime:
        parts.append(f"({row.runtime})")
    if threads is not None and threads == threads and threads != "":
        parts.append(f"t{int(threads)}")
    return " ".join(parts)


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float], pad: float) -> bool:
    return a[0] < b[2] + pad and b[0] < a[2] + pad and a[1] < b[3] + pad and b[1] < a[3] + pad


def _place_labels(ax: Any, xy: list[tuple[float, float]], labels: list[str], color: list[str]) -> list[Any]:
    """Annotate each point with its label where it overlaps no other label, no point and stays inside the
    axes: the nearest free spot of a few directions at growing distances, joined by a leader line when
    it had to move away. Works in display pixels, so the layout must be final (drawn, engine off)."""
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    pix = [tuple(ax.transData.transform(p)) for p in xy]
    marks = [(x - 5.0, y - 5.0, x + 5.0, y + 5.0) for x, y in pix]
    placed: list[tuple[float, float, float, float]] = []
    texts = []
    # Crowded points first (the most neighbours within 60 px), so they get the nearest spots.
    order = sorted(range(len(xy)), key=lambda i: -sum(math.dist(pix[i], p) < 60 for p in pix))
    for i in order:
        probe = ax.text(0, 0, labels[i], fontsize=LABEL_PT)
        bb = probe.get_window_extent(renderer)
        probe.remove()
        w, h = bb.width, bb.height
        x, y = pix[i]
        best = None
        for r in _RADII:
            for dx, dy in _DIRECTIONS:
                cx, cy = x + r * dx, y + r * dy
                x0 = cx if dx > 0 else cx - w if dx < 0 else cx - w / 2
                y0 = cy if dy > 0 else cy - h if dy < 0 else cy - h / 2
                box = (x0, y0, x0 + w, y0 + h)
                inside = box[0] >= frame.x0 + 2 and box[2] <= frame.x1 - 2
                inside = inside and box[1] >= frame.y0 + 2 and box[3] <= frame.y1 - 2
                if not inside or any(_overlaps(box, o, 2.0) for o in placed + marks):
                    continue
                best = (box, r)
                break
            if best:
                break
        if best is None:  # nowhere free: the nearest spot inside the axes, said by the label test
            best = ((x + 6, y, x + 6 + w, y + h), 5)
        box, r = best
        placed.append(box)
        texts.append(
            ax.annotate(
                labels[i],
                xy[i],
                xytext=(box[0] - x, box[1] - y),
                textcoords="offset pixels",
                ha="left",
                va="bottom",
                fontsize=LABEL_PT,
                color=color[i],  # the point's colour: a label is read with its point
                arrowprops={"arrowstyle": "-", "color": color[i], "lw": 0.7, "shrinkA": 0, "shrinkB": 4}
                if r > 12
                else None,
                annotation_clip=False,
            )
        )
    return texts


def roofline_figure(device: str, points: pd.DataFrame, peaks: Mapping[str, Any]) -> tuple[Figure, list[Any]]:
    """Attainable GFLOP/s vs arithmetic intensity: the memory levels the floors use and the matmul peak as
    roofs, each benched configuration as a point labelled with its model and threads (labels placed apart,
    the legend outside the axes). Returns the figure and the label artists."""
    fig = new_figure(height=ROOF_HEIGHT_IN, width=ROOF_WIDTH_IN)
    ax = fig.add_subplot()
    pts = points.dropna(subset=["intensity"])
    xs = pts["intensity"].to_numpy(dtype=float)
    xs = xs[np.isfinite(xs) & (xs > 0)]
    memory, compute = _roofs(pts, peaks)
    top = max((g for _, g in compute), default=math.inf)
    # The range holds every point and every ridge (where a memory roof meets the compute roof).
    ridges = [top / gbps for _, gbps in memory if math.isfinite(top)]
    lo = min([*xs, *ridges]) / 4 if len(xs) or ridges else 0.05
    hi = max([*xs, *ridges]) * 4 if len(xs) or ridges else 100.0
    grid = np.logspace(math.log10(lo), math.log10(hi), 200)
    for i, (label, gbps) in enumerate(memory):
        ax.plot(grid, np.minimum(grid * gbps, top), ["-", "--", "-.", ":"][i % 4], color=_ROOF_COLORS[i % 4],
                lw=1.6, label=f"memory: {label}")  # fmt: skip
    for label, gflops in compute:
        ax.axhline(gflops, color="#24292f", lw=1.0, ls=(0, (1, 1)), label=f"compute: {label}")
    measured = pts.dropna(subset=["achieved_gflops"])
    measured = measured[np.isfinite(measured["achieved_gflops"].astype(float))]
    runtimes = measured["runtime"].replace("", np.nan).dropna().nunique()
    models = sorted(set(measured["model"].astype(str)))
    color_of = {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(models)}
    xy, labels, colors = [], [], []
    for row in measured.itertuples():
        xy.append((float(row.intensity), float(row.achieved_gflops)))
        labels.append(_point_label(row, runtimes))
        colors.append(color_of[str(row.model)])
    if xy:
        ax.scatter(
            [p[0] for p in xy], [p[1] for p in xy], s=36, c=colors, zorder=3, edgecolors="white", lw=0.6
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ys = [p[1] for p in xy] + [g for _, g in compute] + [lo * g for _, g in memory]
    if ys:
        ax.set_ylim(min(ys) / 3, max(ys) * 2.5)
    only = measured["runtime"].replace("", np.nan).dropna().unique()
    suffix = f" ({only[0]})" if len(only) == 1 else ""
    xlabel = (
        "arithmetic intensity (FLOP per byte moved: weights + inputs + outputs)"
        if "level" in pts and pts["level"].notna().any()
        else "arithmetic intensity (FLOP per weight byte)"
    )
    _style(ax, f"roofline: {device}{suffix}; points: model tTHREADS", xlabel, "GFLOP/s")
    ax.tick_params(labelsize=9)
    ax.xaxis.label.set_size(10)
    ax.yaxis.label.set_size(10)
    ax.title.set_size(11)
    if ax.get_legend_handles_labels()[1]:
        fig.legend(loc="outside right upper", fontsize=9, frameon=False)
    # Place the labels on the final layout: draw once, then keep the axes where the layout put them.
    fig.canvas.draw()
    fig.set_layout_engine("none")
    texts = _place_labels(ax, xy, labels, colors)
    return fig, texts


_ROOF_COLORS = ["#0a7e8c", "#8250df", "#9a6700", "#57606a"]


def roofline_labelled(device: str, points: pd.DataFrame, peaks: Mapping[str, Any]) -> PlacedLabels:
    """The roofline as a data URI with its labels' boxes (see PlacedLabels)."""
    from matplotlib.text import Text

    fig, texts = roofline_figure(device, points, peaks)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    w, h = fig.bbox.width, fig.bbox.height
    boxes = []
    for t in texts:
        bb = Text.get_window_extent(t, renderer)  # the text alone, not its leader line
        boxes.append((bb.x0 / w, 1 - bb.y1 / h, bb.x1 / w, 1 - bb.y0 / h))
    return PlacedLabels(to_data_uri(fig), tuple(boxes), LABEL_PT * DPI / 72)


def roofline_plot(device: str, points: pd.DataFrame, peaks: Mapping[str, Any]) -> str:
    return roofline_labelled(device, points, peaks).uri


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


def decode_depth_plot(decode: pd.DataFrame) -> str:
    """Decode tokens/s against context depth, one line per device, model and threads (a GGUF's name carries
    its quantization), its bandwidth floor's tokens/s dashed beside it in the same colour."""
    fig = new_figure()
    ax = fig.add_subplot()
    groups = [
        (k, g.sort_values("depth")) for k, g in decode.groupby(["device", "model", "threads"], sort=True)
    ]
    labels = distinct_labels([f"{m} on {d} ({t} threads)" for (d, m, t), _ in groups], 48)
    for i, ((_, g), label) in enumerate(zip(groups, labels, strict=True)):
        color = _PALETTE[i % len(_PALETTE)]
        ax.plot(g["depth"], g["decode_tokens_per_s"], "o-", color=color, label=label)
        floor = g.dropna(subset=["floor_tokens_per_s"])
        if not floor.empty:
            ax.plot(floor["depth"], floor["floor_tokens_per_s"], "--", color=color, label=f"{label}: floor")
    _style(ax, "LLM decode against context depth", "context depth (positions)", "decode tokens/s")
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
                right = max(float(r.best), float(r.datasheet) if r.datasheet == r.datasheet else 0.0)
                ax.text(right, float(y), f"  {r.efficiency:.0%}", va="center", fontsize=8)
        ax.margins(x=0.15)  # room for the efficiency beside the longest bar
        ax.set_yticks(ys, labels)
        values = pd.concat([part["best"], sheet]).astype(float).dropna()
        if len(values) and values.min() > 0 and values.max() / values.min() > 20:
            ax.set_xscale("log")
        _style(ax, f"ceilings: {device} ({unit})" if ax is axes[0] else unit, unit, "")
        # Beside the panel, never over a bar or its figures.
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
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
