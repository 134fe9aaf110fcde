"""fit: budgets, measured verdicts, predictions from counts, cross-validation, static counts (no devices)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgebench.analysis import budgets as budget_defs
from edgebench.analysis import fit, fit_result, model_counts, observations, roofline_predict
from edgebench.errors import ConfigError, UserError
from edgebench.models.builtin import build_convnet, build_mlp
from edgebench.records import RECORD_FIELDS, Record, Samples

# ------------------------------------------------------------------------------------------- helpers

TRUE_PEAK = 80e9  # FLOP/s the synthetic device runs convolutions at
TRUE_GEMM = 60e9
TRUE_BW = 12e9  # bytes/s for weights streamed by memory-bound nodes
TRUE_ACT_BW = 40e9
TRUE_OVERHEAD_MS = 0.02
TRUE_PER_NODE_MS = 0.003


def synthetic_model(
    name: str, conv_gflop: float, gemv_mb: float, attn_gflop: float, n_act: int
) -> model_counts.ModelCounts:
    """A model made of a few node kinds, sized by the arguments."""
    nodes = []
    for _ in range(4):
        nodes.append(model_counts.OpCost("Conv", conv_gflop * 1e9 / 4, 40_000.0, 200_000.0))
        nodes.append(model_counts.OpCost("Relu", 50_000.0, 0.0, 400_000.0))
    for _ in range(3):
        nodes.append(model_counts.OpCost("MatMul", gemv_mb * 1e6 / 2 / 3, gemv_mb * 1e6 / 3, 8_000.0))
        nodes.append(model_counts.OpCost("Add", 1_000.0, 4_000.0, 8_000.0))
    nodes.append(model_counts.OpCost("MatMul", attn_gflop * 1e9, 0.0, 1_000_000.0))
    for _ in range(n_act):
        nodes.append(model_counts.OpCost("Mul", 100_000.0, 0.0, 800_000.0))
    return model_counts.ModelCounts(
        name, sum(n.flops for n in nodes), sum(n.weight_bytes for n in nodes), tuple(nodes)
    )


def true_latency_ms(c: model_counts.ModelCounts, slow: float = 1.0) -> float:
    """Ground truth of the synthetic device: every node at its own rate, plus per-node and fixed overheads."""
    t = TRUE_OVERHEAD_MS + TRUE_PER_NODE_MS * len(c.nodes)
    for n in c.nodes:
        if n.op_type == "Conv":
            t += n.flops / TRUE_PEAK * 1e3
        elif n.op_type == "MatMul" and n.weight_bytes == 0:
            t += n.flops / TRUE_GEMM * 1e3
        else:
            t += n.weight_bytes / TRUE_BW * 1e3 + n.activation_bytes / TRUE_ACT_BW * 1e3
    return t * slow


def _fleet(n: int = 16, seed: int = 5) -> list[model_counts.ModelCounts]:
    """Synthetic models spread over two decades of compute and of weight bytes."""
    rng = np.random.default_rng(seed)
    return [
        synthetic_model(
            f"m{i}",
            10 ** rng.uniform(-1.3, 0.2),
            10 ** rng.uniform(0, 1.6),
            10 ** rng.uniform(-2, -0.4),
            int(rng.integers(1, 10)),
        )
        for i in range(n)
    ]


FLEET = _fleet()


def bench_records(
    device: str,
    model: str,
    p50: float,
    *,
    p99: float | None = None,
    rss: float = 80.0,
    run_id: str = "r1",
    threads: int = 1,
    runtime: str = "onnxruntime",
) -> list[Record]:
    stats = {"p50": p50, "p90": p50 * 1.05, "mean": p50 * 1.02, "min": p50 * 0.97, "max": p50 * 1.3}
    if p99 is not None:
        stats["p99"] = p99
    out = [
        Record(
            run_id, device, "bench", model, runtime, "latency_ms", v, "ms", {"threads": threads, "stat": s}
        )
        for s, v in stats.items()
    ]
    out.append(
        Record(
            run_id,
            device,
            "bench",
            model,
            runtime,
            "peak_rss_mb",
            rss + 30.0,
            "MB",
            {"threads": threads},
            annotations={"rss_before_load_mb": 30.0},
        )
    )
    # `rss` is the model's own memory (what memory_mb budgets), over a 30 MB runtime + harness baseline
    out.append(
        Record(
            run_id,
            device,
            "bench",
            model,
            runtime,
            "model_memory_mb",
            rss,
            "MB",
            {"threads": threads},
            annotations={"baseline_mb": 30.0},
        )
    )
    out.append(Record(run_id, device, "bench", model, runtime, "load_ms", 12.0, "ms", {"threads": threads}))
    return out


def fleet_records(
    device: str = "board", slow: float = 1.0, noise: float = 0.0, seed: int = 0, skip: tuple[str, ...] = ()
) -> list[Record]:
    rng = np.random.default_rng(seed)
    out = []
    for c in FLEET:
        if c.name in skip:
            continue
        p50 = true_latency_ms(c, slow) * (1 + noise * rng.standard_normal())
        out += bench_records(device, c.name, p50, p99=p50 * 1.2, rss=50.0 + 1.1 * c.weight_bytes / 1e6)
    return out


COUNTS = {c.name: c for c in FLEET}

# ------------------------------------------------------------------------------------------- budgets


def test_budgets_parse_and_override() -> None:
    budgets = budget_defs.parse_budgets(
        ["latency_p99_ms=15", "memory_mb=60", "energy_mj=2.5", "latency_p99_ms=12"]
    )
    by = {b.key: b for b in budgets}
    assert by["latency_p99_ms"].limit == 12 and by["latency_p99_ms"].stat == "p99"
    assert by["memory_mb"].quantity == "memory" and by["energy_mj"].unit == "mJ"


@pytest.mark.parametrize(
    "bad, words",
    [
        ("latency_p98_ms=3", "unknown budget"),
        ("memory_mb=-1", "positive"),
        ("memory_mb", "KEY=NUMBER"),
        ("memory_mb=lots", "KEY=NUMBER"),
        ("=3", "KEY=NUMBER"),
    ],
)
def test_bad_budget_is_one_line_user_error(bad: str, words: str) -> None:
    with pytest.raises(UserError) as err:
        budget_defs.parse_budgets([bad])
    assert words in str(err.value) and "\n" not in str(err.value)


def test_budgets_from_suite(tmp_path: Path) -> None:
    suite = tmp_path / "nightly.toml"
    suite.write_text('name = "n"\n[budget]\nlatency_p99_ms = 15\nmemory_mb = 60\n')
    assert {b.key: b.limit for b in budget_defs.budgets_from_suite(suite)} == {
        "latency_p99_ms": 15,
        "memory_mb": 60,
    }
    suite.write_text("[budget]\nlatency_p98_ms = 15\n")
    with pytest.raises(ConfigError, match="nightly.toml.*latency_p98_ms"):
        budget_defs.budgets_from_suite(suite)
    suite.write_text("[budget\n")
    with pytest.raises(ConfigError, match="nightly.toml"):
        budget_defs.budgets_from_suite(suite)


# ------------------------------------------------------------------------------------- measured verdicts


def test_measured_verdicts_under_and_over_budget() -> None:
    records = bench_records("phone", "small", 4.0, p99=12.0, rss=40.0) + bench_records(
        "phone", "big", 12.0, p99=20.0, rss=90.0
    )
    budgets = budget_defs.parse_budgets(["latency_p99_ms=15", "memory_mb=60"])
    result = fit.assess(records, budgets)
    by = {v.model: v for v in result.verdicts}
    assert by["small"].fits is True and by["small"].basis == "measured"
    assert by["small"].limiting == "latency_p99_ms"
    assert by["small"].margin == pytest.approx((15 - 12) / 15)
    assert by["big"].fits is False
    assert by["big"].limiting == "memory_mb"  # 90 MB is 50% over; 20 ms is 33% over
    assert by["big"].margin == pytest.approx((60 - 90) / 60)
    recs = result.to_records("fit-run")
    fits = {r.model: r for r in recs if r.metric == "fits"}
    assert fits["small"].value == 1.0 and fits["big"].value == 0.0
    assert (
        fits["big"].annotations["basis"] == "measured" and fits["big"].annotations["limiting"] == "memory_mb"
    )
    assert (
        fits["big"].annotations["verdict"] == "does not fit"
        and fits["small"].annotations["verdict"] == "fits"
    )
    ratios = {r.params["budget"]: r.value for r in recs if r.metric == "budget_ratio" and r.model == "big"}
    assert ratios == pytest.approx({"latency_p99_ms": 20 / 15, "memory_mb": 90 / 60})  # value / limit
    assert by["big"].ratio == pytest.approx(1.5) and "memory_mb (1.5x the budget)" in by["big"].why
    for r in recs:
        assert list(r.to_dict()) == list(RECORD_FIELDS) and r.probe == "fit"


def decode_rate(device: str, model: str, rate: float, run_id: str = "r1", threads: int = 2) -> list[Record]:
    seq = {"prompt_tokens": 128, "new_tokens": 64, "threads": threads}
    return [
        Record(run_id, device, "decode", model, "onnxruntime", "decode_tokens_per_s", rate, "tokens/s", seq),
        Record(
            run_id, device, "decode", model, "onnxruntime", "peak_rss_mb", 950.0, "MB", seq,
            annotations={"rss_before_load_mb": 50.0},  # memory_mb budgets the 900 MB the model adds
        ),
    ]  # fmt: skip


def test_decode_tokens_per_s_min_is_a_floor_not_a_ceiling() -> None:
    [budget] = budget_defs.parse_budgets(["decode_tokens_per_s_min=20"])
    assert budget.at_least and budget.unit == "tokens/s" and budget.margin(25.0) == pytest.approx(0.25)
    records = bench_records("phone", "llm", 30.0) + decode_rate("phone", "llm", 25.0)
    records += decode_rate("phone", "tiny-llm", 12.0, run_id="old") + decode_rate("phone", "tiny-llm", 15.0)
    records += decode_rate("phone", "tiny-llm", 18.0, threads=4)
    budgets = budget_defs.parse_budgets(["decode_tokens_per_s_min=20", "memory_mb=1000"])
    by = {v.model: v for v in fit.assess(records, budgets, run_order=["old", "r1"]).verdicts}
    assert by["llm"].fits is True and by["llm"].values["decode_tokens_per_s_min"] == 25.0
    # Only decoded (never benched): judged on the decode's own figures, its fastest configuration.
    tiny = by["tiny-llm"]
    assert tiny.fits is False and tiny.basis == "measured" and tiny.limiting == "decode_tokens_per_s_min"
    assert tiny.values == {"decode_tokens_per_s_min": 18.0, "memory_mb": 900.0}
    assert tiny.margin == pytest.approx((18 - 20) / 20) and tiny.config["threads"] == 4
    with pytest.raises(UserError, match="decode_tokens_per_s_min"):
        budget_defs.parse_budgets(["decode_tokens_per_s=3"])


def test_latest_run_wins_and_best_configuration_is_used() -> None:
    records = (
        bench_records("phone", "m", 10.0, run_id="old")
        + bench_records("phone", "m", 5.0, run_id="new")
        + bench_records("phone", "m", 4.0, run_id="new", threads=4)
    )
    obs = observations.observations(records, run_order=["old", "new"])
    assert len(obs) == 1 and obs[0].latency["p50"] == 4.0 and obs[0].config == {"threads": 4}
    records = bench_records("phone", "m", 3.0, run_id="old") + bench_records("phone", "m", 5.0, run_id="new")
    assert observations.observations(records, run_order=["old", "new"])[0].latency["p50"] == 5.0


def test_each_backend_of_a_runtime_is_a_row_of_its_own_never_the_best_of_both() -> None:
    """A Vulkan run faster than the CPU's must not stand for the CPU (nor the CPU's for the GPU's): an
    engineer deploys one unit, and the fit answer says how each would do."""
    records = bench_records("phone", "m", 8.0, runtime="ncnn")
    for r in bench_records("phone", "m", 3.0, runtime="ncnn"):
        r.params["backend"] = "vulkan"
        records.append(r)
    obs = observations.observations(records, run_order=["r1"])
    assert {(o.runtime, o.latency["p50"]) for o in obs} == {("ncnn", 8.0), ("ncnn@vulkan", 3.0)}
    result = fit.assess(records, budget_defs.parse_budgets(["latency_p50_ms=5"]), run_order=["r1"])
    verdicts = {v.runtime: v.verdict for v in result.verdicts}
    assert verdicts == {"ncnn": "does not fit", "ncnn@vulkan": "fits"}, result.verdicts


def backend_records(p50: float, placement: dict) -> list[Record]:
    """A Vulkan run of m at `p50` whose records carry `placement`, as the agent's records do."""
    records = bench_records("phone", "m", p50, runtime="ncnn")
    for r in records:
        r.params["backend"] = "vulkan"
        r.annotations.update(backend_actual=placement["actual"], placement=placement)
    return records


def test_a_backend_row_that_ran_elsewhere_is_uncertain_and_a_partial_one_names_its_ops() -> None:
    """`ncnn@vulkan` measured on the CPU (a silent fallback) answers nothing for Vulkan, whichever way its
    figures fall; a partial run is what the backend does with the model, its answer kept, the ops named."""
    budgets = budget_defs.parse_budgets(["latency_p50_ms=5"])
    fell = {"requested": "vulkan", "actual": "cpu", "ops_by_unit": {"cpu": 7}, "evidence": "0 Vulkan devices"}
    for p50 in (3.0, 8.0):
        result = fit.assess(backend_records(p50, fell), budgets, run_order=["r1"])
        (v,) = result.verdicts
        assert v.runtime == "ncnn@vulkan" and v.verdict == "uncertain", v
        assert "vulkan asked for, ran on cpu (0 Vulkan devices)" in v.why, v.why
    ops = ["matmul_1 (MatMul)", "matmul_5 (MatMul)"]
    partial = {
        "requested": "vulkan",
        "actual": "vulkan+cpu",
        "ops_by_unit": {"vulkan": 10, "cpu": 2},
        "fallback_ops": ops,
        "partitions": 5,
    }
    result = fit.assess(backend_records(3.0, partial), budgets, run_order=["r1"])
    (v,) = result.verdicts
    assert v.verdict == "fits" and "partly on vulkan, 2 of 12 ops elsewhere (matmul_1 (MatMul), " in v.why
    back = fit_result.FitResult.from_records(result.to_records("fit1")).verdicts[0]
    assert back.placement == partial and back.why == v.why  # a stored fit run says it too
    whole = {**partial, "actual": "vulkan", "ops_by_unit": {"vulkan": 12}, "fallback_ops": []}
    (v,) = fit.assess(backend_records(3.0, whole), budgets, run_order=["r1"]).verdicts
    assert v.verdict == "fits" and "placement" not in v.why, v.why


def test_thread_sweep_points_count_as_configurations() -> None:
    records = bench_records("phone", "m", 6.0)
    records += [
        Record(
            "r2",
            "phone",
            "threads",
            "m",
            "onnxruntime",
            "latency_ms",
            v,
            "ms",
            {"threads": t, "cluster": "all", "stat": "p50"},
        )
        for t, v in ((1, 9.0), (2, 4.5))
    ]
    obs = observations.observations(records, run_order=["r1", "r2"])
    assert obs[0].latency["p50"] == 4.5 and obs[0].config == {"threads": 2, "cluster": "all"}


def test_roofline_totals_not_per_op_breakdowns() -> None:
    records = [
        Record("r0", "phone", "roofline", "m", None, "flops", 1e9, "FLOP", {"scope": "total"}),
        Record(
            "r0",
            "phone",
            "roofline",
            "m",
            None,
            "flops",
            6e8,
            "FLOP",
            {"scope": "op_type", "op_type": "Conv"},
        ),
        Record("r0", "phone", "roofline", "m", None, "weight_bytes", 4e6, "B", {}),
    ]
    assert model_counts.counts_from_records(records)["m"].flops == 1e9


def test_p99_from_raw_samples_when_too_few_for_a_record() -> None:
    records = bench_records("phone", "m", 5.0)  # no p99 record: fewer than 100 samples
    values = tuple([5.0] * 59 + [9.0])
    samples = [
        Samples("r1", "phone", "bench", "m", "onnxruntime", "latency_ms", "ms", values, {"threads": 1})
    ]
    result = fit.assess(records, budget_defs.parse_budgets(["latency_p99_ms=6"]), samples=samples)
    v = result.verdicts[0]
    assert v.values["latency_p99_ms"] == pytest.approx(float(np.percentile(values, 99)))
    assert "p99" in v.estimated and v.fits is False


def test_budget_without_data_is_unchecked_not_passed() -> None:
    result = fit.assess(
        bench_records("phone", "m", 5.0, p99=6.0),
        budget_defs.parse_budgets(["latency_p99_ms=10", "energy_mj=1"]),
    )
    v = result.verdicts[0]
    # A pair is never passed on a budget nobody checked: met on latency, unknown on energy: uncertain.
    assert v.verdict == fit_result.UNCERTAIN and v.fits is None and v.unchecked == ("energy_mj",)
    assert "energy_mj not checked" in v.why
    rec = next(r for r in result.to_records("x") if r.metric == "fits")
    assert rec.annotations["unchecked"] == ["energy_mj"] and rec.value is None


def test_energy_measured_and_predicted_from_net_power() -> None:
    records = fleet_records(skip=("m9",))
    for c in FLEET[:3]:
        p50 = true_latency_ms(c)
        records.append(
            Record(
                "r1", "board", "power", c.name, "onnxruntime", "energy_mj_per_inference", 0.5 * p50, "mJ", {}
            )
        )
    result = fit.assess(records, budget_defs.parse_budgets(["energy_mj=100"]), counts=COUNTS, models=["m9"])
    by = {v.model: v for v in result.verdicts}
    assert by["m0"].values["energy_mj"] == pytest.approx(0.5 * true_latency_ms(FLEET[0]))
    assert by["m9"].basis == "predicted"
    assert by["m9"].values["energy_mj"] == pytest.approx(0.5 * by["m9"].predicted["predicted_latency_ms:p50"])


def test_unknown_device_is_a_user_error() -> None:
    with pytest.raises(UserError, match="device 'nope' has no bench measurements"):
        fit.assess(bench_records("phone", "m", 5.0), devices=["nope"])


# ------------------------------------------------------------------------------------------- prediction


def test_unmeasured_model_is_predicted_and_marked() -> None:
    records = fleet_records(skip=("m5",))
    budgets = budget_defs.parse_budgets(["latency_p99_ms=1000", "memory_mb=500"])
    result = fit.assess(records, budgets, counts=COUNTS)
    v = next(v for v in result.verdicts if v.model == "m5")
    truth = true_latency_ms(COUNTS["m5"])
    assert v.basis == "predicted" and v.fits is True
    assert v.predicted["predicted_latency_ms:p50"] == pytest.approx(truth, rel=0.03)
    assert v.predicted["predicted_latency_ms:p99"] == pytest.approx(truth * 1.2, rel=0.03)
    assert v.predicted["predicted_memory_mb"] == pytest.approx(
        50 + 1.1 * COUNTS["m5"].weight_bytes / 1e6, rel=0.02
    )
    tight = fit.assess(records, budget_defs.parse_budgets([f"latency_p99_ms={truth * 0.5}"]), counts=COUNTS)
    v2 = next(v for v in tight.verdicts if v.model == "m5")
    assert v2.fits is False and v2.basis == "predicted" and v2.limiting == "latency_p99_ms"
    recs = {(r.model, r.metric, r.params.get("stat")): r for r in tight.to_records("x")}
    assert recs[("m5", "fits", None)].annotations["basis"] == "predicted"
    assert recs[("m5", "predicted_latency_ms", "p50")].value == pytest.approx(truth, rel=0.03)


def test_cross_validation_is_exact_on_a_device_the_model_describes() -> None:
    result = fit.assess(fleet_records(), counts=COUNTS)
    overall = {
        (s.holdout, s.quantity): s for s in result.cv_summaries() if s.device == fit_result.AGGREGATE_DEVICE
    }
    s = overall[("model", "latency_p50_ms")]
    assert s.pairs == len(FLEET) and s.within == 1.0 and s.median_abs_err < 0.02
    recs = result.to_records("x")
    within = [r for r in recs if r.metric == "cv_within_10pct" and r.device == "*"]
    assert {r.params["holdout"] for r in within} == {"pair", "model"}
    assert sum(
        1
        for r in recs
        if r.metric == "cv_error"
        and r.params["quantity"] == "latency_p50_ms"
        and r.params["holdout"] == "model"
    ) == len(FLEET)


def test_cross_validation_under_measurement_noise() -> None:
    """4% noise (a quiet device): at least 90% of held-out pairs stay within +-10%."""
    records = fleet_records("a", noise=0.04, seed=1) + fleet_records("b", slow=2.5, noise=0.04, seed=2)
    result = fit.assess(records, counts=COUNTS)
    s = next(
        s
        for s in result.cv_summaries()
        if s.device == "*" and s.holdout == "model" and s.quantity == "latency_p50_ms"
    )
    assert s.pairs == 2 * len(FLEET) and s.within >= 0.9


def test_measured_elsewhere_carries_over_to_another_device() -> None:
    """A model the counts mispredict (3x slower kernels) is predicted well where it ran elsewhere."""
    odd = model_counts.ModelCounts("odd", COUNTS["m5"].flops, COUNTS["m5"].weight_bytes, COUNTS["m5"].nodes)
    counts = {**COUNTS, "odd": odd}
    records = fleet_records("a") + fleet_records("b", slow=2.0)
    records += bench_records("a", "odd", 3 * true_latency_ms(COUNTS["m5"]), p99=1.0)
    for c in FLEET[:4]:  # other models that also run oddly on both, so the carry-over proves itself
        name = c.name + "x"
        counts[name] = model_counts.ModelCounts(name, c.flops, c.weight_bytes, c.nodes)
        records += bench_records("a", name, 3 * true_latency_ms(c), p99=1.0)
        records += bench_records("b", name, 6 * true_latency_ms(c), p99=1.0)
    result = fit.assess(records, counts=counts)
    v = next(v for v in result.verdicts if v.model == "odd" and v.device == "b")
    assert v.basis == "predicted" and "other devices" in v.evidence
    assert v.predicted["predicted_latency_ms:p50"] == pytest.approx(
        6 * true_latency_ms(COUNTS["m5"]), rel=0.1
    )


def test_few_measurements_still_predict_with_a_warning() -> None:
    records = fleet_records(skip=tuple(c.name for c in FLEET[2:]))
    result = fit.assess(records, counts=COUNTS, models=["m7"])
    v = next(v for v in result.verdicts if v.model == "m7")
    assert v.basis == "predicted" and v.predicted["predicted_latency_ms:p50"] > 0
    assert any("only 2 measured model" in w for w in result.warnings)


def test_counts_only_in_the_store_still_calibrate() -> None:
    """Totals from `roofline` records (no per-node detail) give a coarser but working calibration."""
    records = fleet_records(skip=("m3",))
    for c in FLEET:
        records.append(Record("r0", "board", "roofline", c.name, None, "flops", c.flops, "FLOP", {}))
        records.append(
            Record("r0", "board", "roofline", c.name, None, "weight_bytes", c.weight_bytes, "B", {})
        )
    result = fit.assess(records, models=["m3"])
    v = next(v for v in result.verdicts if v.model == "m3")
    assert v.basis == "predicted" and math.isfinite(v.predicted["predicted_latency_ms:p50"])
    assert result.cv and all(p.measured > 0 for p in result.cv)


def test_model_without_counts_is_reported_not_guessed() -> None:
    result = fit.assess(fleet_records(), counts=COUNTS, models=["mystery"])
    assert not any(v.model == "mystery" for v in result.verdicts)
    assert any("mystery" in w for w in result.warnings)


def test_measured_ceilings_turn_coefficients_into_efficiencies() -> None:
    records = fleet_records()
    records.append(
        Record("r0", "board", "matmul", None, None, "effective_tops", 0.1, "TOPS", {"dtype": "fp32"})
    )
    records.append(
        Record("r0", "board", "matmul", None, None, "effective_tops", 0.5, "TOPS", {"dtype": "int8"})
    )
    records.append(
        Record("r0", "board", "bandwidth", None, None, "bandwidth_gbps", 20.0, "GB/s", {"kernel": "copy"})
    )
    ceil = roofline_predict.device_ceilings(records)["board"]
    assert ceil.peak_flops == pytest.approx(0.1e12) and ceil.bandwidth == pytest.approx(20e9)
    result = fit.assess(records, counts=COUNTS)
    cal = result.calibrations[("board", "onnxruntime")]
    assert cal["ceilings"]["source"] == "measured" and cal["ceilings"]["peak_gflops"] == pytest.approx(100)
    if "conv" in cal.get("efficiency", {}):
        assert cal["efficiency"]["conv"] == pytest.approx(TRUE_PEAK / 0.1e12, rel=0.05)


# ------------------------------------------------------------------------------------------ static counts


def test_count_model_matches_hand_counts(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(hidden=256, width=128, layers=3), path)
    c = model_counts.count_model(path, "mlp")
    dims = [(128, 256), (256, 256), (256, 128)]
    assert c.weight_bytes == sum(4 * (k * n + n) for k, n in dims)
    matmul = sum(n.flops for n in c.nodes if n.op_type == "MatMul")
    assert matmul == sum(2 * k * n for k, n in dims)
    mm0 = next(n for n in c.nodes if n.op_type == "MatMul")
    assert mm0.weight_bytes == 4 * 128 * 256 and mm0.activation_bytes == 4 * (128 + 256)


def test_count_model_conv_and_shapes(tmp_path: Path) -> None:
    path = tmp_path / "conv.onnx"
    onnx.save(build_convnet(size=32, channels=16), path)
    c = model_counts.count_model(path, "conv")
    conv0 = next(n for n in c.nodes if n.op_type == "Conv")
    out = 32 * 32 * 32  # 32 output channels at 32x32
    assert conv0.flops == 2 * out * (3 * 9) + out  # 3x3x3 weights each, plus the bias (roofline convention)
    assert conv0.weight_bytes == 4 * (32 * 27 + 32)
    mlp = tmp_path / "mlp.onnx"
    onnx.save(build_mlp(hidden=64, width=32, layers=2), mlp)
    one = model_counts.count_model(mlp, "mlp")
    four = model_counts.count_model(mlp, "mlp", {"x": [4, 32]})
    assert four.flops == pytest.approx(4 * one.flops)
    assert model_counts.count_model(mlp, "mlp", {"x": [4, 32], "image": [1, 3, 8, 8]}).flops == four.flops
    with pytest.raises(UserError):
        model_counts.count_model(mlp, "mlp", {"x": [4, 32, 1]})


def test_count_model_refuses_non_onnx(tmp_path: Path) -> None:
    path = tmp_path / "m.mnn"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(UserError, match="ONNX"):
        model_counts.count_model(path, "m")


def test_ceilings_come_from_the_latest_runs_and_a_held_out_model_does_not_leak_into_fitted_ones() -> None:
    def tops(run: str, value: float) -> Record:
        return Record(run, "board", "matmul", None, None, "effective_tops", value, "TOPS", {"dtype": "fp32"})

    bw = Record("r2", "board", "bandwidth", None, None, "bandwidth_gbps", 20.0, "GB/s", {"kernel": "copy"})
    ceil = roofline_predict.device_ceilings(
        [tops("r0", 0.9), tops("r1", 0.1), bw], run_order=["r0", "r1", "r2"]
    )
    assert ceil["board"].peak_flops == pytest.approx(0.1e12)  # the latest run, not the best ever stored

    records = fleet_records()  # no ceilings: they are fitted from the benched models' own rates
    result = fit.assess(records, counts=COUNTS)
    source = result.calibrations[("board", "onnxruntime")]["ceilings"]["source"]
    assert source == "fitted from the measured models"
    obs = observations.observations(records)
    t = roofline_predict._Target(
        "board", "onnxruntime", roofline_predict.MachineModel(), {o.model: o for o in obs}
    )
    t.ceil = roofline_predict._effective_ceilings(None, t.obs, COUNTS)
    t.features = {n: roofline_predict.floor_times(c, t.ceil) for n, c in COUNTS.items()}
    t.z = {n: roofline_predict._descriptor(c, t.features[n]) for n, c in COUNTS.items()}
    engine = roofline_predict._Engine({("board", "onnxruntime"): t}, COUNTS)
    fastest = max(t.obs, key=lambda m: COUNTS[m].flops / observations.base_latency(t.obs[m]))
    held, _ = engine.features(("board", "onnxruntime"), fastest)
    full, _ = engine.features(("board", "onnxruntime"), None)
    assert held[fastest] != full[fastest]  # its floor times come from ceilings it did not set


def test_latency_pairs_with_counts_at_the_same_shapes() -> None:
    def at(shapes: dict[str, list[int]] | None, p50: float) -> list[Record]:
        recs = bench_records("board", "det", p50)
        if shapes is None:
            return recs
        return [dataclasses.replace(r, params={**r.params, "shapes": shapes}) for r in recs]

    records = at(None, 4.0) + at({"x": [1, 3, 320, 320]}, 1.0)  # declared 640x640, and a smaller bench
    declared = {"x": [1, 3, 640, 640]}

    def counts(shapes: dict[str, list[int]] | None) -> dict[str, model_counts.ModelCounts]:
        return {"det": model_counts.ModelCounts("det", 1e9, 1e6, shapes=shapes, declared=declared)}

    [big] = observations.observations(records, counts=counts({}))  # counted as declared: the 640x640 bench
    assert big.latency["p50"] == 4.0
    [small] = observations.observations(records, counts=counts({"x": [1, 3, 320, 320]}))
    assert small.latency["p50"] == 1.0
    assert (
        observations.observations(records, counts=counts({"x": [1, 3, 480, 480]})) == []
    )  # never benched there
    [fastest] = observations.observations(records, counts=counts(None))  # counts of unknown shapes: any bench
    assert fastest.latency["p50"] == 1.0
