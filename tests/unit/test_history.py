"""Change points over nightly series: an injected step is found, flat noise is not flagged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgebench.analysis.history import (
    build_series,
    change_point_records,
    change_points,
    detect_steps,
    load_series,
)
from edgebench.cli import main
from edgebench.errors import UserError
from edgebench.jobs import Job, JobOutcome, ModelRef
from edgebench.records import Record, RecordContext
from edgebench.results.store import Store


def nightly(rng: np.random.Generator, n: int, cv: float, steps: dict[int, float] | None = None) -> np.ndarray:
    y = 20.0 * np.exp(rng.normal(0.0, cv, n))
    for at, factor in (steps or {}).items():
        y[at:] *= factor
    return y


def test_injected_step_is_found_at_its_run() -> None:
    rng = np.random.default_rng(1)
    y = nightly(rng, 30, 0.03, {18: 1.12})
    steps = detect_steps(y)
    assert [s.index for s in steps] == [18]
    assert steps[0].p_value < 0.01


def test_flat_noisy_series_is_not_flagged() -> None:
    rng = np.random.default_rng(2)
    for seed in range(5):
        y = nightly(rng, 40, 0.08)
        y[rng.integers(40)] *= 1.5  # one disturbed night is an outlier, not a step
        assert detect_steps(y, seed=seed) == []


def test_flat_false_alarm_rate_is_at_most_alpha() -> None:
    rng = np.random.default_rng(3)
    flagged = sum(bool(detect_steps(nightly(rng, 30, 0.05), seed=i)) for i in range(100))
    assert flagged <= 3  # alpha = 0.01 per series; 3 of 100 allows for sampling error


def test_several_steps_and_a_late_step() -> None:
    rng = np.random.default_rng(4)
    y = nightly(rng, 45, 0.02, {15: 1.2, 30: 1 / 1.2})  # a regression that was later fixed
    assert [s.index for s in detect_steps(y)] == [15, 30]
    late = nightly(rng, 30, 0.02, {26: 1.3})  # four nights at the new level
    assert [s.index for s in detect_steps(late)] == [26]


def test_small_steps_under_min_change_are_not_reported() -> None:
    rng = np.random.default_rng(5)
    y = nightly(rng, 40, 0.001, {20: 1.01})
    assert detect_steps(y, min_change=0.02) == []
    assert [s.index for s in detect_steps(y, min_change=0.005)] == [20]


def test_short_or_constant_series() -> None:
    assert detect_steps([1.0, 2.0, 3.0]) == []
    assert detect_steps([5.0] * 20) == []
    with pytest.raises(ValueError):
        detect_steps([1.0, float("nan"), 2.0, 3.0])


def _records(values: np.ndarray, model: str = "enc") -> list[Record]:
    out = []
    for i, v in enumerate(values):
        ts = f"2026-10-{i + 1:02d}T02:00:00.000000Z"
        for stat, factor in (("p50", 1.0), ("p99", 1.5)):
            out.append(
                Record(
                    f"night{i:02d}",
                    "pixel8",
                    "bench",
                    model,
                    "onnxruntime",
                    "latency_ms",
                    float(v * factor),
                    "ms",
                    {"threads": 4, "stat": stat},
                    ts,
                    {"runs": 200},
                )
            )
    return out


def test_series_and_change_point_records() -> None:
    rng = np.random.default_rng(6)
    y = nightly(rng, 25, 0.02, {12: 1.25})
    records = _records(y)
    records.reverse()  # order of storage does not matter: measurement time does
    [series] = build_series(records, "p50")
    assert [p.run_id for p in series.points] == [f"night{i:02d}" for i in range(25)]
    assert series.params == {"threads": 4}
    [cp] = change_points(series)
    assert (cp.run_id, cp.previous_run) == ("night12", "night11")
    assert cp.before == pytest.approx(np.median(y[:12]))
    assert cp.after == pytest.approx(np.median(y[12:]))
    [rec] = change_point_records(series, [cp])
    assert (rec.probe, rec.metric, rec.unit, rec.run_id) == ("history", "change_point", "ratio", "night12")
    assert rec.value == pytest.approx(0.25, abs=0.05)
    assert rec.params["before"] == cp.before and rec.params["series_metric"] == "latency_ms"


def _fill_store(path: Path, values: np.ndarray) -> None:
    with Store(path) as st:
        for rec in _records(values):
            if rec.params["stat"] != "p50":
                continue
            ctx = RecordContext(rec.run_id, rec.device, "bench", rec.model, rec.runtime)
            st.begin_run(rec.run_id, "run", {})
            job = Job(rec.device, "bench", ModelRef("enc", Path("enc.onnx")), "onnxruntime", {"threads": 4})
            st.save_job(rec.run_id, JobOutcome(job, "ok", [rec, ctx.record("peak_rss_mb", 50.0, "MB")]))
            st.finish_run(rec.run_id, "ok")


def test_history_from_a_store_and_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(7)
    db = tmp_path / "nightly.db"
    _fill_store(db, nightly(rng, 20, 0.02, {14: 1.15}))
    with Store(db) as st:
        [series] = load_series(st, "pixel8", "enc")
        with pytest.raises(UserError, match="no records for device 'pixel8', model 'nope'"):
            load_series(st, "pixel8", "nope")
    assert len(series.points) == 20
    with pytest.raises(SystemExit) as done:
        main(["history", "--device", "pixel8", "--model", "enc", "--store", str(db), "--json"])
    assert done.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in doc["records"]] == ["night14"]
    assert doc["records"][0]["params"]["after"] > doc["records"][0]["params"]["before"]
    assert len(doc["series"][0]["points"]) == 20 and doc["series"][0]["change_points"] == ["night14"]
    with pytest.raises(SystemExit) as done:
        main(["history", "--device", "pixel8", "--model", "enc", "--store", str(db)])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "night14" in out and "1 step(s)" in out
    with pytest.raises(SystemExit) as done:
        main(["history", "--device", "pixel8", "--model", "nope", "--store", str(db)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and "model 'nope'" in err
    missing = tmp_path / "absent.db"
    with pytest.raises(SystemExit) as done:
        main(["history", "--device", "pixel8", "--model", "enc", "--store", str(missing)])
    assert done.value.code == 2 and not missing.exists()
