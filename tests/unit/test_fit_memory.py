"""fit's memory budgets: `memory_mb` judges the model's own memory (its high end over invocations),
`process_memory_mb` the process peak; a native runner's figure and older stores say what they are."""

from __future__ import annotations

from edgebench.analysis import budgets as budget_defs
from edgebench.analysis import fit, fit_result
from edgebench.records import Record


def latency(model: str, run_id: str = "r1", runtime: str = "onnxruntime") -> list[Record]:
    p = {"threads": 1}
    return [
        Record(run_id, "phone", "bench", model, runtime, "latency_ms", v, "ms", {**p, "stat": s})
        for s, v in (("p50", 1.0), ("p99", 1.2), ("min", 0.9))
    ]


def memory(model: str, metric: str, value: float, run_id: str = "r1", **notes: object) -> Record:
    return Record(
        run_id, "phone", "bench", model, "onnxruntime", metric, value, "MB", {"threads": 1}, annotations=notes
    )


def test_the_model_memory_is_judged_at_its_high_end_over_the_latest_runs_invocations() -> None:
    records = latency("m", "r1") + latency("m", "r2") + latency("m", "r2")  # r2: two invocations
    records += [
        memory("m", "model_memory_mb", 200.0, "r1", baseline_mb=50.0, measured_by="agent"),  # an older build
        memory("m", "model_memory_mb", 18.0, "r2", baseline_mb=50.0, measured_by="agent"),
        memory("m", "model_memory_mb", 21.0, "r2", baseline_mb=51.0, measured_by="agent"),
        memory("m", "peak_rss_mb", 72.0, "r2"),
    ]
    budgets = budget_defs.parse_budgets(["memory_mb=20", "process_memory_mb=100"])
    [v] = fit.assess(records, budgets, run_order=["r1", "r2"]).verdicts
    assert v.values == {"memory_mb": 21.0, "process_memory_mb": 72.0} and v.verdict == fit_result.NO_FIT
    assert v.memory == {
        "model_mb": [18.0, 21.0],
        "baseline_mb": 51.0,
        "process_peak_mb": 72.0,
        "measured_by": "agent",
    }
    later = fit.assess(records, budget_defs.parse_budgets(["memory_mb=25"]), run_order=["r1", "r2"]).verdicts
    assert later[0].verdict == fit_result.FITS  # r1's 200 MB is not the latest build's


def test_a_repeated_configurations_latency_is_the_median_of_its_invocations() -> None:
    records = [
        Record(
            "r1", "phone", "bench", "m", "onnxruntime", "latency_ms", v, "ms", {"threads": 1, "stat": "p50"}
        )
        for v in (10.0, 10.2, 30.0)
    ]
    [v] = fit.assess(records, budget_defs.parse_budgets(["latency_p50_ms=11"])).verdicts
    assert v.values["latency_p50_ms"] == 10.2 and v.verdict == fit_result.FITS


def test_a_native_runner_is_judged_on_its_tools_growth_and_says_so() -> None:
    says = "the runner's own figure: its footprint's growth from start to end (not a peak)"
    records = latency("m", runtime="onnxruntime") + [
        memory("m", "peak_rss_mb", 90.0),
        memory("m", "memory_growth_mb", 12.0, measured_by=says),
    ]
    [v] = fit.assess(records, budget_defs.parse_budgets(["memory_mb=20"])).verdicts
    assert v.values["memory_mb"] == 12.0 and v.verdict == fit_result.FITS and v.memory["measured_by"] == says


def test_a_store_from_before_model_memory_uses_the_peak_over_its_baseline() -> None:
    records = latency("m") + [memory("m", "peak_rss_mb", 70.0, rss_before_load_mb=50.0)]
    [v] = fit.assess(records, budget_defs.parse_budgets(["memory_mb=40"])).verdicts
    assert v.values["memory_mb"] == 20.0 and v.verdict == fit_result.FITS
