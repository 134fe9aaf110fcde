"""The invocation-level gate's parts: round-robin repeats, the agent's disturbance figures against an
independent reference, the stated thresholds, the history floor from a store, the 120-column table and a
PR-comment-sized gate.md."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgebench.agent import disturbance as agent_disturbance
from edgebench.analysis.disturbance import Disturbance, Thresholds
from edgebench.analysis.gate import (
    FAIL,
    NOISY,
    PASS,
    GateResult,
    PairKey,
    PairVerdict,
    collect_side,
    default_rules,
    evaluate,
    gate_runs,
)
from edgebench.analysis.invocations import history_floor, invocation_test
from edgebench.execution.repeats import interleave
from edgebench.jobs import Job, JobOutcome, ModelRef
from edgebench.records import RecordContext
from edgebench.render.markdown_gate import MAX_ROWS, gate_markdown
from edgebench.results.store import Store
from edgebench.testing.cli import edgebench


def test_repeats_run_round_robin_and_unrepeated_jobs_once() -> None:
    a = Job("local", "bench", ModelRef("a", Path("a.onnx")), params={"repeats": 3})
    b = Job("local", "bench", ModelRef("b", Path("b.onnx")), params={"repeats": 3})
    c = Job("local", "matmul")
    jobs = interleave([a, b, c])
    assert [(j.model.name if j.model else "-", j.invocation) for j in jobs] == [
        ("a", 1), ("b", 1), ("-", 0), ("a", 2), ("b", 2), ("a", 3), ("b", 3),
    ]  # fmt: skip
    assert len({j.key for j in jobs}) == len(jobs)  # each invocation is its own job (resume knows which)
    assert interleave([c]) == [c] and c.key == Job("local", "matmul").key


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc/PID/stat: what the reference counts of a busy neighbour."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_agent_counts_a_busy_neighbour_in_others_cpu_share() -> None:
    """A busy loop started beside the agent: its own CPU time (read from its /proc entry, independently)
    is part of what the agent reports as others' share, and the agent's own time is not."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        before = _cpu_seconds(busy.pid)
        start = agent_disturbance.snapshot()
        time.sleep(1.0)
        end = agent_disturbance.snapshot()
        neighbour = _cpu_seconds(busy.pid) - before
    finally:
        busy.kill()
        busy.wait()
    d = agent_disturbance.delta(start, end)
    others_s = d["others_cpu_share"] * d["elapsed_s"] * d["cpus_counted"]
    assert neighbour > 0.0  # the loop ran (how much depends on what else shares the host's cores)
    assert others_s >= neighbour - 0.05, (others_s, neighbour, d)  # jiffy rounding: 10 ms per CPU-read
    assert 0.0 <= d["others_cpu_share"] <= 1.0 and d["own_cpu_s"] < 0.1
    assert (
        Thresholds(0.1).evidence(Disturbance.from_reply(d)) is not None or neighbour < 0.1 * d["cpus_counted"]
    )


def test_thresholds_say_what_disturbed_a_job() -> None:
    quiet = Disturbance(others_cpu_share=0.04, runqueue_wait_share=0.02, steal_share=0.0)
    assert Thresholds().evidence(quiet) is None
    busy = Disturbance(others_cpu_share=0.63, runqueue_wait_share=0.02)
    assert Thresholds().evidence(busy) == "others used 63% of the CPUs"
    assert Thresholds(0.7).evidence(busy) is None
    assert Thresholds().evidence(Disturbance()) is None  # unknown is not disturbed, and not quiet either


def _side(run: str, medians: list[float], others: float = 0.0, model: str = "m"):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(len(medians) + int(medians[0] * 100))
    records, samples = [], []
    for i, med in enumerate(medians, 1):
        ctx = RecordContext(run, "local", "bench", model, "onnxruntime", {"threads": 1}, {"invocation": i})
        values = tuple(med * np.exp(rng.normal(0, 0.01, 40)))
        records.append(ctx.record("latency_ms", float(np.median(values)), "ms", stat="p50"))
        records += Disturbance(others_cpu_share=others, runqueue_wait_share=0.0).to_records(ctx)
        samples.append(ctx.samples("latency_ms", "ms", values))
    return records, samples


def test_a_disturbed_baseline_makes_the_pair_noisy_with_the_evidence() -> None:
    base = collect_side(*_side("a", [10.0, 10.1, 9.9], others=0.63))
    cand = collect_side(*_side("b", [13.0, 13.1, 12.9]))
    v = evaluate(base, cand, default_rules()).verdicts[0]
    assert v.verdict == NOISY and "baseline: invocation 1: others used 63% of the CPUs" in v.reason
    quiet = collect_side(*_side("a", [10.0, 10.1, 9.9]))
    assert evaluate(quiet, cand, default_rules()).verdicts[0].verdict == FAIL
    # A candidate that passed although it alone was disturbed still passes: a disturbance only slows.
    slowed = collect_side(*_side("c", [10.0, 10.05, 9.95], others=0.5))
    assert evaluate(quiet, slowed, default_rules()).verdicts[0].verdict == PASS


def test_welch_on_logs_matches_scipy() -> None:
    from scipy import stats

    b, c = [10.0, 10.4, 9.8], [11.0, 11.5, 11.2]
    t = invocation_test(b, c, relative=True, higher_is_worse=True, alpha=0.01)
    ref = stats.ttest_ind(np.log(c), np.log(b), equal_var=False, alternative="greater")
    assert t.p_worse == pytest.approx(ref.pvalue, rel=1e-9)
    assert t.effect == pytest.approx(np.exp(np.mean(np.log(c)) - np.mean(np.log(b))))


def test_history_floor_from_earlier_runs_keeps_a_within_spread_change_from_failing(tmp_path: Path) -> None:
    """Six earlier runs that wander +-6% run to run: a +6% candidate, significant on its invocations, is
    within that spread and not a FAIL; the verdict says so, with the spread."""
    levels = [10.0, 10.6, 9.5, 10.3, 9.7, 10.5, 10.0]
    with Store(tmp_path / "h.db") as st:
        for n, level in enumerate([*levels, 10.6]):
            run = f"2026120{n}T000000Z-aaaaa{n}"
            st.begin_run(run, "bench", {})
            records, samples = _side(run, [level * f for f in (1.0, 1.004, 0.996)])
            job = Job("local", "bench", ModelRef("m", Path("m.onnx")), "onnxruntime", {"threads": 1})
            st.save_job(run, JobOutcome(job, "ok", records, samples))
            st.finish_run(run, "ok")
        floor = history_floor(levels)
        assert floor is not None and floor.runs == 7 and 0.05 < floor.relative < 0.25
        res = gate_runs(st, "20261206T000000Z-aaaaa6", "20261207T000000Z-aaaaa7", default_rules())
    v = next(v for v in res.verdicts if v.key.metric == "latency_ms")
    assert v.verdict == NOISY and "within the history: run-to-run spread of 7 earlier runs" in v.reason
    assert history_floor(levels[:3]) is None  # fewer than 4 runs: no floor


def _history_store(path: Path, runs: list[tuple[str, list[float]]]) -> list[str]:
    """A store of runs (kind, per-invocation medians) of one configuration, oldest first; their ids."""
    ids = []
    with Store(path) as st:
        for n, (kind, medians) in enumerate(runs):
            run = f"202612{n + 1:02d}T000000Z-aaaa{n:02d}"
            st.begin_run(run, kind, {})
            records, samples = _side(run, medians)
            job = Job("local", "bench", ModelRef("m", Path("m.onnx")), "onnxruntime", {"threads": 1})
            st.save_job(run, JobOutcome(job, "ok", records, samples))
            st.finish_run(run, "ok")
            ids.append(run)
    return ids


def _three(level: float) -> list[float]:
    return [level * f for f in (1.0, 1.004, 0.996)]


def test_one_step_in_the_history_does_not_switch_the_gate_off(tmp_path: Path) -> None:
    """History 10 10 10 8 8 8 (a faster build landed): its run-to-run spread is the small wobble around
    each level, not the step (3 x 1.4826 x MAD of the logs around one median said ±64%), so a +15%
    candidate still FAILs."""
    step = [10.0, 10.1, 9.95, 8.0, 8.05, 7.95]
    floor = history_floor(step)
    assert floor is not None and floor.runs == 6 and floor.relative < 0.10, floor
    # Runs that wander 2% (one sigma) around each level: the floor is about 3 sigma, the step left out.
    wobble = np.r_[np.full(6, 10.0), np.full(6, 8.0)] * np.exp(np.random.default_rng(0).normal(0, 0.02, 12))
    floor = history_floor(list(wobble))
    assert floor is not None and 0.03 < floor.relative < 0.12, floor
    ids = _history_store(tmp_path / "s.db", [("bench", _three(v)) for v in [*step, 7.95 * 1.15]])
    with Store(tmp_path / "s.db") as st:
        res = gate_runs(st, ids[-2], ids[-1], default_rules())
    v = next(v for v in res.verdicts if v.key.metric == "latency_ms")
    assert v.verdict == FAIL and "history: run-to-run spread of 6 earlier runs" in v.reason, v.reason


def test_confirm_runs_are_no_history(tmp_path: Path) -> None:
    """A `gate --confirm` after each nightly stores a run holding both sides' models under one key (here
    8 and 12 ms, median 10): as history they would read as a 25% wobble between nightlies and turn a
    +15% FAIL into NOISY. Analysis runs of every kind are left out."""
    mixed = [8.0, 12.0, 8.0, 12.0, 8.0, 12.0]
    runs = []
    for level in (8.0, 8.05, 7.95):
        runs += [("bench", _three(level)), ("confirm", mixed)]
    runs += [("bench", _three(8.02)), ("bench", _three(8.02 * 1.15))]
    ids = _history_store(tmp_path / "c.db", runs)
    with Store(tmp_path / "c.db") as st:
        res = gate_runs(st, ids[-2], ids[-1], default_rules())
    v = next(v for v in res.verdicts if v.key.metric == "latency_ms")
    assert v.verdict == FAIL and "history: run-to-run spread of 4 earlier runs" in v.reason, v.reason


def _verdict(i: int, verdict: str) -> PairVerdict:
    key = PairKey("local", f"model-with-a-long-name-{i:03d}", "onnxruntime", "bench", "latency_ms", "p50",
                  '{"threads":2,"shapes":{"input":[1,3,224,224]}}')  # fmt: skip
    reason = "significantly worse (q=0.001) and over the max slowdown 5%; " + "measured disturbed " * 30
    return PairVerdict(key, default_rules()[0], verdict, reason, "ms", 10.0, 11.0, 0.1, 0.05, 0.15, 1e-3, 1e-3,
                       3, 3, "welch t on log p50 of 3 vs 3 invocations")  # fmt: skip


def test_gate_markdown_stays_pr_comment_sized() -> None:
    result = GateResult("base", "cand", tuple(_verdict(i, FAIL) for i in range(100)))
    md = gate_markdown(result)
    assert f"{100 - MAX_ROWS} more row(s) left out" in md
    assert len(md) < 30_000 and md.count("| **FAIL** |") == MAX_ROWS


def test_the_gate_table_fits_120_columns_and_wide_keeps_every_column(tmp_path: Path) -> None:
    with Store(tmp_path / "w.db") as st:
        for run, meds in (
            ("20261201T000000Z-aaaaaa", [10.0, 10.1, 9.9]),
            ("20261202T000000Z-bbbbbb", [13.0, 13.1, 12.9]),
        ):
            st.begin_run(run, "bench", {})
            for model in ("a-model-with-a-rather-long-name", "b"):
                records, samples = _side(run, meds, model=model)
                job = Job(
                    "local", "bench", ModelRef(model, Path(f"{model}.onnx")), "onnxruntime", {"threads": 1}
                )
                st.save_job(run, JobOutcome(job, "ok", records, samples))
            st.finish_run(run, "ok")
    args = (
        "gate",
        "--store",
        tmp_path / "w.db",
        "--baseline",
        "latest~1",
        "--candidate",
        "latest",
        "--no-store",
    )
    narrow = edgebench(*args, cwd=tmp_path)
    assert narrow.returncode == 1, narrow.stderr
    widths = [len(line) for line in narrow.stdout.splitlines()]
    assert max(widths) <= 120, max(widths)
    assert "FAIL" in narrow.stdout and "q=" in narrow.stdout
    wide = edgebench(*args, "--wide", cwd=tmp_path)
    assert (
        wide.returncode == 1 and "┃ q " in wide.stdout and max(len(x) for x in wide.stdout.splitlines()) > 120
    )


def test_the_reports_regression_section_says_whose_verdicts_it_shows(tmp_path: Path) -> None:
    """One verdict per question: a stored gate run's verdicts when one compared the two runs, else the
    suite's [[gate]] rules applied now, and the section says which."""
    from edgebench.cli.report import _gate_rules
    from edgebench.render.report.data import load_report_data

    suite = tmp_path / "nightly.toml"
    suite.write_text(
        'name = "nightly"\ndevices = ["local"]\nmodels = ["builtin:mlp"]\n[[probe]]\nkind = "bench"\n'
        '[[gate]]\nmetric = "latency_ms"\nstat = "p50"\nmax_slowdown = "50%"\n'
    )
    rules, source = _gate_rules(suite)
    with Store(tmp_path / "r.db") as st:
        for run, meds in (
            ("20261201T000000Z-aaaaaa", [10.0, 10.1, 9.9]),
            ("20261202T000000Z-bbbbbb", [13.0, 13.1, 12.9]),
        ):
            st.begin_run(run, "suite", {}, suite="nightly")
            records, samples = _side(run, meds)
            job = Job("local", "bench", ModelRef("m", Path("m.onnx")), "onnxruntime", {"threads": 1})
            st.save_job(run, JobOutcome(job, "ok", records, samples))
            st.finish_run(run, "ok")
        applied = load_report_data(st, gate_rules=rules, gate_rules_source=source)
        assert "the [[gate]] rules of nightly.toml" in applied.regression_source
        assert applied.regression is not None and applied.regression["verdict"] == "PASS"  # +30% < 50%
        res = gate_runs(st, "20261201T000000Z-aaaaaa", "20261202T000000Z-bbbbbb", default_rules())
        st.save_gate("gate1", {**res.to_dict(), "gate_run": "gate1"}, [], {})
        stored = load_report_data(st, gate_rules=rules, gate_rules_source=source)
    assert stored.regression_source == "the verdicts of stored gate run gate1"
    assert stored.regression is not None and stored.regression["verdict"] == "FAIL"


def test_disturbance_warnings_reach_pairs_of_jobs_that_named_no_runtime() -> None:
    from edgebench.analysis.gate import PairKey, job_warnings

    key = PairKey("local", "mlp", "onnxruntime", "bench", "latency_ms", "p50", '{"threads": 1}')
    job = {"device": "local", "probe": "bench", "model": "mlp", "params": {"threads": 1}}
    warn = ["device disturbed: 83 of 400 samples are outliers"]
    for runtime, seen in ((None, True), ("onnxruntime", True), ("mnn", False)):
        jobs = {"baseline": [{**job, "runtime": runtime, "warnings": warn}]}
        assert bool(job_warnings(key, jobs)) is seen, runtime
