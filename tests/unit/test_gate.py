"""Gate statistics, pairing, rules, verdicts and exit codes (pure; a store built in the test)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from edgebench.analysis.gate import (
    FAIL,
    IMPROVED,
    INCOMPLETE,
    MISSING,
    NOISY,
    PASS,
    GateOptions,
    GateRule,
    JobFailure,
    PairKey,
    Side,
    Threshold,
    collect_side,
    default_rules,
    evaluate,
    gate_runs,
    merge_rules,
    parse_percent,
)
from edgebench.errors import ConfigError, UserError
from edgebench.execution.suite import rules_from_suite
from edgebench.jobs import Job, JobOutcome, ModelRef
from edgebench.records import Record, RecordContext
from edgebench.render.junit import gate_junit
from edgebench.render.markdown_gate import gate_markdown
from edgebench.results.store import Store
from edgebench.stats import MIN_SAMPLES_FOR_P99

LATENCY = default_rules()[0]


def lognormal(rng: np.random.Generator, median: float, cv: float, n: int) -> tuple[float, ...]:
    return tuple(median * np.exp(rng.normal(0.0, cv, n)))


def key(model: str = "m", metric: str = "latency_ms", stat: str = "p50", probe: str = "bench") -> PairKey:
    return PairKey("phone", model, "onnxruntime", probe, metric, stat, '{"threads":1}')


def sampled(values: tuple[float, ...], invocations: int = 5) -> Side:
    """A side measured in `invocations` invocations (the values split in order); 1: within-run only."""
    groups = (
        tuple(tuple(g) for g in np.array_split(np.asarray(values), invocations)) if invocations > 1 else ()
    )
    return Side(float(np.median(values)), "ms", values, invocations=groups)


def one(base: Side, cand: Side, rule: GateRule = LATENCY, k: PairKey | None = None, **opts: object):
    k = k or key()
    return evaluate({k: base}, {k: cand}, [rule], GateOptions(**opts)).verdicts[0]  # type: ignore[arg-type]


def test_same_distribution_passes_and_clear_slowdown_fails() -> None:
    rng = np.random.default_rng(1)
    base = sampled(lognormal(rng, 10.0, 0.02, 50))
    same = one(base, sampled(lognormal(rng, 10.0, 0.02, 50)))
    assert same.verdict == PASS and same.ci_high is not None and same.ci_high < 0.05
    slow = one(base, sampled(lognormal(rng, 12.0, 0.02, 50)))
    assert slow.verdict == FAIL
    assert slow.change == pytest.approx(0.2, abs=0.02)
    assert slow.q_value is not None and slow.q_value < 1e-3
    assert slow.method == "welch t on log p50 of 5 vs 5 invocations"


def test_one_invocation_per_side_is_never_a_fail() -> None:
    """Within-run samples share their invocation's disturbance: a clear slowdown seen in one invocation per
    side is NOISY with the hint, and a change ruled out still passes."""
    rng = np.random.default_rng(1)
    base = sampled(lognormal(rng, 10.0, 0.02, 50), invocations=1)
    slow = one(base, sampled(lognormal(rng, 12.0, 0.02, 50), invocations=1))
    assert slow.verdict == NOISY and "one invocation per side: use repeats >= 3" in slow.reason
    assert slow.method.startswith("mann-whitney")
    same = one(base, sampled(lognormal(rng, 10.0, 0.02, 50), invocations=1))
    assert same.verdict == PASS
    mixed = one(sampled(lognormal(rng, 10.0, 0.02, 50)), sampled(lognormal(rng, 12.0, 0.02, 50), 1))
    assert mixed.verdict == NOISY and "one invocation" in mixed.reason


def test_small_significant_change_under_the_threshold_passes() -> None:
    rng = np.random.default_rng(2)
    v = one(sampled(lognormal(rng, 10.0, 0.005, 200)), sampled(lognormal(rng, 10.1, 0.005, 200)))
    assert v.verdict == PASS and "significantly worse" in v.reason and "ruled out" in v.reason


def test_faster_candidate_is_improved() -> None:
    rng = np.random.default_rng(3)
    v = one(sampled(lognormal(rng, 10.0, 0.02, 40)), sampled(lognormal(rng, 8.0, 0.02, 40)))
    assert v.verdict == IMPROVED and v.change is not None and v.change < -0.15


def test_too_few_samples_is_incomplete_with_the_count_needed() -> None:
    rng = np.random.default_rng(4)
    v = one(sampled(lognormal(rng, 10.0, 0.02, 5)), sampled(lognormal(rng, 15.0, 0.02, 5)))
    assert v.verdict == INCOMPLETE and "too few samples" in v.reason and v.samples_needed == 10


def test_high_noise_is_noisy_and_the_power_estimate_settles_it() -> None:
    rng = np.random.default_rng(5)
    v = one(sampled(lognormal(rng, 10.0, 0.15, 20)), sampled(lognormal(rng, 10.0, 0.15, 20)))
    assert v.verdict == NOISY and v.samples_needed is not None and v.samples_needed > 20
    assert f"~{v.samples_needed} invocations (repeats) per side" in v.reason
    n = v.samples_needed
    settled = [
        one(
            sampled(lognormal(rng, 10.0, 0.15, 4 * n), n), sampled(lognormal(rng, 10.0, 0.15, 4 * n), n)
        ).verdict
        for _ in range(10)
    ]
    assert settled.count(PASS) >= 8, settled


def test_tail_statistic_uses_a_permutation_test() -> None:
    rng = np.random.default_rng(6)
    p99 = GateRule("latency_ms", "higher", Threshold(0.10, True), stat="p99", probe="bench")
    base = lognormal(rng, 10.0, 0.02, 2000)
    tail = np.array(lognormal(rng, 10.0, 0.02, 2000)).reshape(5, 400)
    tail[:, :20] *= 1.6  # 5% of inferences hit a slow path: the median barely moves
    v = one(sampled(base), sampled(tuple(tail.ravel())), p99, key(stat="p99"))
    assert v.verdict == FAIL and v.method == "welch t on log p99 of 5 vs 5 invocations"
    within = one(sampled(base[:400], 1), sampled(tuple(tail[0]), 1), p99, key(stat="p99"))
    assert within.verdict == NOISY and within.method.startswith("permutation")
    few = one(sampled(base[:50]), sampled(tuple(tail.ravel()[:50])), p99, key(stat="p99"))
    assert few.verdict == INCOMPLETE and f"needs at least {MIN_SAMPLES_FOR_P99}" in few.reason


def test_single_values_use_a_plain_threshold() -> None:
    rules = default_rules()
    mem, cos = key(metric="peak_rss_mb", stat=""), key(metric="cosine", stat="", probe="accuracy")
    base = {mem: Side(100.0, "MB"), cos: Side(0.9999, "ratio")}
    cand = {mem: Side(125.0, "MB"), cos: Side(0.990, "ratio")}
    res = evaluate(base, cand, rules)
    by = {v.key.metric: v for v in res.verdicts}
    assert by["peak_rss_mb"].verdict == FAIL and by["peak_rss_mb"].method.startswith("threshold")
    assert by["cosine"].verdict == FAIL and by["cosine"].change == pytest.approx(-0.0099)
    ok = evaluate(base, {mem: Side(101.0, "MB"), cos: Side(0.9998, "ratio")}, rules)
    assert {v.verdict for v in ok.verdicts} == {PASS}
    small = evaluate({mem: Side(10.0, "MB")}, {mem: Side(11.5, "MB")}, rules)  # +15% but under min_delta 2 MB
    assert small.verdicts[0].verdict == PASS


def test_drop_rule_on_samples_gates_lower_is_worse() -> None:
    rng = np.random.default_rng(7)
    rule = GateRule("throughput_ips", "lower", Threshold(0.05, True), stat="p50")
    k = key(metric="throughput_ips")
    v = one(sampled(lognormal(rng, 100.0, 0.02, 40)), sampled(lognormal(rng, 80.0, 0.02, 40)), rule, k)
    assert v.verdict == FAIL and v.change is not None and v.change < -0.15
    up = one(sampled(lognormal(rng, 100.0, 0.02, 40)), sampled(lognormal(rng, 120.0, 0.02, 40)), rule, k)
    assert up.verdict == IMPROVED


def test_missing_pairs_and_candidate_failures() -> None:
    rng = np.random.default_rng(8)
    a, b, c = key("a"), key("b"), key("c")
    base = {k: sampled(lognormal(rng, 10.0, 0.02, 30)) for k in (a, b, c)}
    failures = [
        JobFailure("phone", "bench", "b", "onnxruntime", "lab", "phone: adb device offline"),
        JobFailure("phone", "bench", "c", "onnxruntime", "measurement", "runtime rejected the model"),
    ]
    res = evaluate(base, {}, [LATENCY], candidate_failures=failures)
    by = {v.key.model: v for v in res.verdicts}
    assert by["a"].verdict == MISSING and not by["a"].lab_failure
    assert by["b"].verdict == MISSING and by["b"].lab_failure and "offline" in by["b"].reason
    assert by["c"].verdict == FAIL and "rejected" in by["c"].reason
    assert res.exit_code == 1
    lab_only = evaluate({a: base[a], b: base[b]}, {}, [LATENCY], candidate_failures=failures)
    assert lab_only.exit_code == 3
    plain = evaluate({a: base[a]}, {}, [LATENCY])
    assert plain.exit_code == 0
    assert evaluate({a: base[a]}, {}, [LATENCY], GateOptions(strict=True)).exit_code == 1


def test_noisy_fails_only_when_strict() -> None:
    rng = np.random.default_rng(9)
    base, cand = sampled(lognormal(rng, 10, 0.02, 4)), sampled(lognormal(rng, 10, 0.02, 4))
    k = key()
    assert evaluate({k: base}, {k: cand}, [LATENCY]).exit_code == 0
    assert evaluate({k: base}, {k: cand}, [LATENCY], GateOptions(strict=True)).exit_code == 1


def test_false_discovery_correction_across_pairs() -> None:
    rng = np.random.default_rng(10)
    keys = [key(f"m{i}") for i in range(40)]
    base = {k: sampled(lognormal(rng, 10, 0.02, 30)) for k in keys}
    cand = {k: sampled(lognormal(rng, 10, 0.02, 30)) for k in keys}
    cand[keys[0]] = sampled(lognormal(rng, 11, 0.02, 30))
    res = evaluate(base, cand, [LATENCY])
    fails = [v.key.model for v in res.verdicts if v.verdict == FAIL]
    assert fails == ["m0"]
    ps = {v.key.model: (v.p_value, v.q_value) for v in res.verdicts}
    assert all(q >= p for p, q in ps.values() if p is not None and q is not None)


def test_pairing_is_on_identity_and_attaches_samples() -> None:
    ctx = RecordContext("r1", "phone", "bench", "m", "onnxruntime", {"threads": 2})
    records = [
        ctx.record("latency_ms", 10.0, "ms", {"runs": 100, "seed": 1}, stat="p50"),
        ctx.record("peak_rss_mb", 50.0, "MB", {"rss_before_load_mb": 20.0}),
    ]
    samples = [ctx.samples("latency_ms", "ms", [9.0, 10.0, 11.0], {"runs": 100})]
    side = collect_side(records, samples)
    ctx2 = RecordContext("r2", "phone", "bench", "m", "onnxruntime", {"threads": 2})
    other = collect_side([ctx2.record("latency_ms", 12.0, "ms", {"runs": 300}, stat="p50")], [])
    assert set(other) <= set(side)
    lat = next(v for k, v in side.items() if k.metric == "latency_ms")
    assert lat.samples == (9.0, 10.0, 11.0)
    assert all(k.params == '{"threads":2}' for k in side)
    threads4 = collect_side(
        [
            RecordContext("r3", "phone", "bench", "m", "onnxruntime", {"threads": 4}).record(
                "latency_ms", 12.0, "ms", stat="p50"
            )
        ],
        [],
    )
    assert not set(threads4) & set(side)


def test_percent_parsing_and_rule_merging() -> None:
    assert parse_percent("5%", "x") == pytest.approx(0.05)
    assert parse_percent(" 12.5% ", "x") == pytest.approx(0.125)
    for bad in ("5", "abc%", "-1%"):
        with pytest.raises(UserError, match="--max-slowdown"):
            parse_percent(bad, "--max-slowdown")
    mine = GateRule("peak_rss_mb", "higher", Threshold(0.3, True), source="s.toml gate[0]")
    rules = merge_rules(default_rules(), [mine], max_slowdown=0.2)
    assert [r for r in rules if r.metric == "peak_rss_mb"] == [mine]
    assert next(r for r in rules if r.metric == "latency_ms").threshold == Threshold(0.2, True)


def _suite(tmp_path: Path, gate: str) -> Path:
    path = tmp_path / "nightly.toml"
    path.write_text(
        'name = "nightly"\ndevices = ["local"]\nmodels = ["builtin:mlp"]\n[[probe]]\nkind = "bench"\n' + gate
    )
    return path


def test_rules_from_a_suite(tmp_path: Path) -> None:
    path = _suite(
        tmp_path,
        '[[gate]]\nmetric = "latency_ms"\nstat = "p99"\nmax_slowdown = "8%"\n'
        '[[gate]]\nmetric = "cosine"\nmax_drop = 0.001\nmodel = "mlp"\n',
    )
    rules = rules_from_suite(path)
    assert [(r.metric, r.stat, r.worse, r.threshold.amount, r.model) for r in rules] == [
        ("latency_ms", "p99", "higher", pytest.approx(0.08), None),
        ("cosine", "p50", "lower", pytest.approx(0.001), "mlp"),
    ]
    assert rules[0].source == "nightly.toml gate[0]"


@pytest.mark.parametrize(
    "gate, needle",
    [
        ('[[gate]]\nmetric = "latency_ms"\nmax_slowdow = "5%"\n', "max_slowdow"),
        ('[[gate]]\nmetric = "latency_ms"\n', "give max_slowdown"),
        ('[[gate]]\nmetric = "latency_ms"\nmax_slowdown = "five"\n', "max_slowdown"),
    ],
)
def test_bad_gate_tables_name_the_file_and_key(tmp_path: Path, gate: str, needle: str) -> None:
    path = _suite(tmp_path, gate)
    with pytest.raises(ConfigError) as err:
        rules_from_suite(path)
    assert "nightly.toml" in str(err.value) and needle in str(err.value)
    assert "\n" not in str(err.value)


def _store_run(
    store: Store, run_id: str, values: tuple[float, ...], model: str = "m", invocations: int = 4
) -> None:
    """A bench run of `invocations` repeated jobs (the values split between them), as `repeats` stores it."""
    store.begin_run(run_id, "bench", {})
    for i, part in enumerate(np.array_split(np.asarray(values), invocations), 1):
        notes = {"invocation": i, "repeats": invocations}
        ctx = RecordContext(run_id, "local", "bench", model, "onnxruntime", {"threads": 1}, notes)
        recs = [
            ctx.record("latency_ms", float(np.percentile(part, 50)), "ms", stat="p50"),
            ctx.record("latency_ms", float(np.mean(part)), "ms", stat="mean"),
            ctx.record("peak_rss_mb", 80.0, "MB"),
        ]
        params = {"threads": 1, "repeats": invocations}
        job = Job(
            "local", "bench", ModelRef(model, Path(f"{model}.onnx")), "onnxruntime", params, invocation=i
        )
        store.save_job(run_id, JobOutcome(job, "ok", recs, [ctx.samples("latency_ms", "ms", tuple(part))]))
    store.finish_run(run_id, "ok")


def test_gate_runs_from_a_store_and_renderers(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    with Store(tmp_path / "e.db") as st:
        _store_run(st, "base", lognormal(rng, 10, 0.02, 40))
        _store_run(st, "cand", lognormal(rng, 13, 0.02, 40))
        st.begin_run("lab", "bench", {})
        job = Job("local", "bench", ModelRef("m", Path("m.onnx")), "onnxruntime", {"threads": 1})
        st.save_job("lab", JobOutcome(job, "error", error="local: device unreachable", error_kind="lab"))
        res = gate_runs(st, "base", "cand", default_rules())
        with pytest.raises(UserError, match="unknown run 'nope'"):
            gate_runs(st, "base", "nope", default_rules())
        lab = gate_runs(st, "base", "lab", default_rules())
    assert res.exit_code == 1 and res.counts()[FAIL] == 1 and res.counts()[PASS] == 1
    assert lab.exit_code == 3
    root = ET.fromstring(gate_junit(res))
    cases = root.findall(".//testcase")
    assert len(cases) == 2 and root.get("failures") == "1"
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == 1 and "latency_ms" in failed[0].get("name", "")
    body = failed[0].find("failure")
    assert body is not None and "baseline: " in (body.text or "") and "+3" in body.get("message", "")
    assert ET.fromstring(gate_junit(lab)).find(".//error") is not None
    md = gate_markdown(res)
    assert "edgebench gate: FAIL" in md and "| **FAIL** | local · m · onnxruntime<br>" in md
    assert res.to_dict()["verdict"] == "FAIL"


def test_records_with_extra_side_values_pair() -> None:
    # records carry values that are not identity (rss_before_load_mb) as annotations: still paired
    def rss(run: str, before: int) -> Record:
        return Record(
            run, "d", "bench", "m", "ort", "peak_rss_mb", 10.0, "MB", {"threads": 1},
            annotations={"rss_before_load_mb": before},
        )  # fmt: skip

    a, b = rss("a", 3), rss("b", 4)
    assert set(collect_side([a], [])) == set(collect_side([b], []))


def test_native_runner_records_pair_across_run_counts() -> None:
    def side(run: str, runs: int, values: list[float]) -> dict[PairKey, Side]:
        ctx = RecordContext(run, "phone", "bench", "m", "mnn", {"threads": 4, "runner": "benchmark.out"})
        what = f"mean of {runs} inferences"
        notes = {"aggregated_by": "edgebench", "sample": what, "n": len(values)}
        rec = ctx.record("latency_ms", float(np.median(values)), "ms", notes, stat="p50")
        return collect_side([rec], [ctx.samples("latency_ms", "ms", values, {"sample": what})])

    a = side("a", 10, [5.0, 5.1, 5.2])
    b = side("b", 50, [5.0, 5.1, 5.2, 5.3])
    assert set(a) == set(b)
    assert next(iter(b.values())).samples == (5.0, 5.1, 5.2, 5.3)


def test_power_records_pair_across_sample_counts() -> None:
    def side(run: str, samples: int, inferences: int) -> dict[PairKey, Side]:
        ctx = RecordContext(run, "phone", "power", "m", "onnxruntime", {"threads": 0})
        counts = {
            "samples_idle": samples,
            "samples_active": samples * 2,
            "sample_rate_hz": 4.0 + samples / 100,
        }
        runs = {**counts, "inferences": inferences, "active_s": inferences / 10}
        return collect_side(
            [
                ctx.record("energy_mj_per_inference", 2.0, "mJ", runs, source="battery"),
                ctx.record("power_mw", 900.0, "mW", counts, idle_subtracted=True, source="battery"),
            ],
            [],
        )

    assert set(side("a", 40, 300)) == set(side("b", 43, 310))


def test_a_candidate_that_lost_its_number_fails() -> None:
    def side(run: str, value: float | None) -> dict[PairKey, Side]:
        ctx = RecordContext(run, "phone", "accuracy", "enc-int8", "onnxruntime", {"variant": "enc-int8"})
        return collect_side([ctx.record("cosine", value, "ratio", output="y")], [])

    res = evaluate(side("a", 0.999), side("b", None), default_rules())
    assert [(v.verdict, v.reason) for v in res.verdicts] == [(FAIL, "the candidate measured no finite value")]
    assert evaluate(side("a", None), side("b", 0.9), default_rules()).verdicts == ()


def test_device_changes_between_runs_are_noted(tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    with Store(tmp_path / "e.db") as st:
        _store_run(st, "base", lognormal(rng, 10, 0.02, 20))
        _store_run(st, "cand", lognormal(rng, 10, 0.02, 20))
        st.save_device("base", "local", {"kernel": "6.1", "runtimes": {"onnxruntime": "1.17.0"}}, {})
        st.save_device("cand", "local", {"kernel": "6.1", "runtimes": {"onnxruntime": "1.18.1"}}, {})
        res = gate_runs(st, "base", "cand", default_rules())
    assert res.notes == ("local: runtimes.onnxruntime changed from 1.17.0 to 1.18.1",)
    assert "> local: runtimes.onnxruntime changed" in gate_markdown(res)
