"""Report plots a reader can trust: every series keeps a label of its own (no truncation that makes two
look alike), one unit per axis (TOPS and GB/s never share one), and history on a date axis."""

from __future__ import annotations

import matplotlib.dates as mdates
import numpy as np
import pandas as pd

from edgebench.render.report import frames, plots
from edgebench.render.report.plots import distinct_labels


def test_labels_that_share_a_long_start_stay_distinct() -> None:
    names = [f"tests/test_m.py::test_infer[batch-{i}-threads-{i % 3}] (python)" for i in range(10)]
    labels = distinct_labels(names, 40)
    assert len(set(labels)) == 10
    for name, label in zip(names, labels, strict=True):  # only the shared start is cut, said by "…"
        flat = label.replace("\n", " ").lstrip("…")
        assert name.replace(" ", "").endswith(flat.replace(" ", "")) and len(flat) > 10
    legend = distinct_labels(
        ["encoder-with-a-long-name.fp32 (onnxruntime)", "encoder-with-a-long-name.int8 (onnxruntime)"], 28
    )
    assert len(set(legend)) == 2 and "fp32" in legend[0] and "int8" in legend[1]
    assert distinct_labels(["a", "b"], 28) == ["a", "b"]


def test_latency_boxes_of_the_same_measurement_in_two_runs_are_told_apart() -> None:
    rng = np.random.default_rng(0)
    dists = [
        {
            "device": "d",
            "model": "tests/test_m.py::test_infer",
            "runtime": "python",
            "config": "",
            "run_id": run,
            "values": rng.random(20),
        }
        for run in ("20261201T000000Z-aaaaaa", "20261202T000000Z-bbbbbb")
    ] + [
        {
            "device": "d",
            "model": f"tests/test_m.py::test_infer[case{i}]",
            "runtime": "python",
            "config": "",
            "run_id": "r",
            "values": rng.random(20),
        }
        for i in range(8)
    ]
    fig = plots.latency_figure("d", dists)
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(ticks) == 10 and len(set(ticks)) == 10


def test_ceilings_put_each_unit_on_its_own_axis() -> None:
    ceil = pd.DataFrame(
        [
            {
                "device": "d",
                "kind": "matmul",
                "what": "fp32",
                "backend": "numpy",
                "best": 0.2,
                "unit": "TOPS",
                "datasheet": 1.0,
                "efficiency": 0.2,
            },
            {
                "device": "d",
                "kind": "matmul",
                "what": "int8",
                "backend": "numpy",
                "best": 0.6,
                "unit": "TOPS",
                "datasheet": None,
                "efficiency": None,
            },
            {
                "device": "d",
                "kind": "bandwidth",
                "what": "triad",
                "backend": "",
                "best": 12.0,
                "unit": "GB/s",
                "datasheet": 25.0,
                "efficiency": 0.48,
            },
        ]
    )
    fig = plots.ceilings_figure("d", ceil)
    axes = [ax for ax in fig.axes if ax.get_yticklabels()]
    assert sorted(ax.get_xlabel() for ax in axes) == ["GB/s", "TOPS"]
    by_unit = {ax.get_xlabel(): [t.get_text() for t in ax.get_yticklabels()] for ax in axes}
    assert all("bandwidth" not in t for t in by_unit["TOPS"]) and all(
        "matmul" not in t for t in by_unit["GB/s"]
    )


def test_history_is_drawn_against_dates() -> None:
    series = {
        "label": "phone enc onnxruntime bench:latency_ms[p50]",
        "unit": "ms",
        "values": [4.0, 4.1, 4.0, 5.0, 5.1, 5.0],
        "runs": [f"r{i}" for i in range(6)],
        "ts": [f"2026-12-0{i + 1}T02:00:00Z" for i in range(6)],
        "steps": ["r3"],
    }
    ax = plots.history_figure(series).axes[0]
    assert isinstance(ax.xaxis.get_major_formatter(), mdates.ConciseDateFormatter)
    lo, hi = (mdates.num2date(x).strftime("%Y-%m-%dT%H") for x in ax.get_xlim())
    assert lo <= "2026-12-01T02" and hi >= "2026-12-06T02"  # the x axis is the runs' dates
    assert ax.get_xlabel().startswith("when the run measured")


def test_history_series_carry_the_run_dates() -> None:
    from edgebench.records import Record

    records = []
    for i in range(12):
        value = 4.0 if i < 6 else 6.0
        r = Record(
            f"r{i}",
            "phone",
            "bench",
            "enc",
            "ort",
            "latency_ms",
            value * (1 + 0.001 * (i % 3)),
            "ms",
            {"stat": "p50"},
            ts=f"2026-12-{i + 1:02d}T02:00:00Z",
        )
        records.append(r)
    _, stepped, _ = frames.history(records)
    assert stepped and stepped[0]["ts"][0].startswith("2026-12-01")


def _floor_points() -> pd.DataFrame:
    """Twelve configurations as the floors frame gives them: clustered pairs (1 and 2 threads) at three
    memory levels, two of them at the very same spot."""
    rows = []
    for i, (model, intensity, level, gbps) in enumerate(
        [
            ("tinymlp", 0.5, "L2", 80.0),
            ("mlp", 0.5, "LLC", 60.0),
            ("bigmlp", 0.5, "DRAM", 14.0),
            ("batchmlp", 30.0, "L2", 82.0),
            ("encoder", 60.0, "L2", 75.0),
            ("convnet", 1000.0, "L2", 80.0),
        ]
    ):
        for threads in (1, 2):
            rows.append(
                {
                    "device": "local", "runtime": "onnxruntime", "model": model, "threads": threads,
                    "intensity": intensity, "level": level, "bandwidth_gbps": gbps, "peak_gflops": 300.0,
                    "achieved_gflops": min(intensity * gbps, 300.0) * (0.4 if threads == 1 else 0.4 + i * 1e-3),
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_roofline_draws_the_floors_levels_and_labels_every_point_apart() -> None:
    pts = _floor_points()
    fig, texts = plots.roofline_figure("local", pts, {})
    ax = fig.axes[0]
    roofs = [line.get_label() for line in ax.get_lines()]
    for level in ("L2", "LLC", "DRAM"):  # every level a floor was charged at is a roof of its own
        assert any(r.startswith(f"memory: {level} ") for r in roofs), roofs
    assert any(r.startswith("compute: matmul peak 300") for r in roofs)
    # Each point sits under the roof of its level: the cache-resident ones no longer above the DRAM line.
    for row in pts.itertuples():
        assert row.achieved_gflops <= min(row.intensity * row.bandwidth_gbps, 300.0) * 1.0001
    assert sorted(t.get_text() for t in texts) == sorted(
        f"{m} t{t}" for m, t in zip(pts.model, pts.threads, strict=True)
    )
    placed = plots.roofline_labelled("local", pts, {})
    boxes = placed.boxes
    assert len(boxes) == len(pts) and placed.font_px >= 12
    for i, a in enumerate(boxes):
        assert 0 <= a[0] < a[2] <= 1 and 0 <= a[1] < a[3] <= 1
        for b in boxes[i + 1 :]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
    # The legend is outside the axes: it covers no point and no label.
    legend = fig.legends[0].get_window_extent(fig.canvas.get_renderer())
    assert legend.x0 >= ax.get_window_extent(fig.canvas.get_renderer()).x1


def test_ceilings_legend_is_beside_the_bars() -> None:
    ceil = pd.DataFrame(
        [
            {"device": "d", "kind": "matmul", "what": "fp32", "backend": "onnxruntime", "best": 0.31,
             "unit": "TOPS", "datasheet": 0.33, "efficiency": 0.93, "at": "", "nominal_source": "derived"},
            {"device": "d", "kind": "bandwidth", "what": "triad", "backend": "", "best": 14.0, "unit": "GB/s",
             "datasheet": None, "efficiency": None, "at": "", "nominal_source": ""},
        ]
    )  # fmt: skip
    fig = plots.ceilings_figure("d", ceil)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend().get_window_extent(renderer)
        assert legend.x0 >= ax.get_window_extent(renderer).x1 - 1
