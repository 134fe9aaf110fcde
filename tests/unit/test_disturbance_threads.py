"""A job whose own threads outnumber its CPUs waits on itself: its run-queue wait is not disturbance
(analysis.disturbance), while others' CPU share and steal still count; the `threads` and `cpus` figures
travel as records and the code that lists disturbance (results, report health, gate) takes them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from edgebench.analysis.disturbance import PREFIX, Disturbance, Thresholds, by_job, summary
from edgebench.analysis.gate import FAIL, NOISY, collect_side, default_rules, evaluate
from edgebench.jobs import Job, JobOutcome, ModelRef
from edgebench.records import RecordContext
from edgebench.results.store import Store
from edgebench.testing.cli import edgebench

WAITED = "its threads waited 45% of their time on a run queue"


def test_a_job_with_more_threads_than_cpus_is_not_disturbed_by_its_own_run_queue_wait() -> None:
    oversubscribed = Disturbance(others_cpu_share=0.02, runqueue_wait_share=0.45, threads=4, cpus=2)
    assert oversubscribed.oversubscribed and Thresholds().evidence(oversubscribed) is None
    assert summary(oversubscribed) == "others 2%, wait 45% (4 threads on 2 CPUs)"
    # As many threads as CPUs, the runtime's default (0: one per CPU), or counts unknown: the wait counts.
    for threads, cpus in ((2, 2), (1, 2), (0, 2), (None, 2), (4, None), (None, None)):
        d = Disturbance(others_cpu_share=0.02, runqueue_wait_share=0.45, threads=threads, cpus=cpus)
        assert not d.oversubscribed and Thresholds().evidence(d) == WAITED, (threads, cpus)


def test_others_share_and_steal_still_count_for_an_oversubscribed_job_and_say_the_wait_was_left_out() -> None:
    busy = Disturbance(others_cpu_share=0.30, runqueue_wait_share=0.45, threads=4, cpus=2)
    assert Thresholds().evidence(busy) == (
        "others used 30% of the CPUs (its run-queue wait, 45%, not counted: 4 threads on 2 CPUs)"
    )
    stolen = Disturbance(others_cpu_share=0.0, steal_share=0.2, runqueue_wait_share=0.05, threads=4, cpus=2)
    assert Thresholds().evidence(stolen) == "the VM's host stole 20% of the CPUs"  # wait under the limit


def _ctx(run: str = "r1", invocation: int = 1) -> RecordContext:
    return RecordContext(
        run, "local", "bench", "m", "onnxruntime", {"threads": 4}, {"invocation": invocation}
    )


def test_threads_and_cpus_round_trip_through_records() -> None:
    reply = {
        "others_cpu_share": 0.02,
        "runqueue_wait_share": 0.45,
        "threads": 4,
        "cpus": 2,
        "cpus_counted": 2,
    }
    d = Disturbance.from_reply(reply)
    assert (d.threads, d.cpus) == (4.0, 2.0)
    records = d.to_records(_ctx())
    units = {r.metric: r.unit for r in records}
    assert units[PREFIX + "threads"] == "count" and units[PREFIX + "cpus"] == "count"
    assert PREFIX + "cpus_counted" not in units  # the shares' own denominator stays on the device
    assert Disturbance.from_records(records) == d
    default = Disturbance.from_reply({**reply, "threads": 0})
    assert Disturbance.from_records(default.to_records(_ctx())).threads == 0.0  # 0 is kept, not dropped
    old = Disturbance.from_reply({"others_cpu_share": 0.02, "runqueue_wait_share": 0.45})  # an older agent
    assert old.threads is None and Thresholds().evidence(old) == WAITED
    [(key, grouped)] = by_job(records).items()
    assert grouped == d and key[-1] == 1


def _side(run: str, medians: list[float], wait: float, threads: int, cpus: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(len(medians) + int(medians[0] * 100))
    records, samples = [], []
    for i, med in enumerate(medians, 1):
        ctx = _ctx(run, i)
        values = tuple(med * np.exp(rng.normal(0, 0.01, 40)))
        records.append(ctx.record("latency_ms", float(np.median(values)), "ms", stat="p50"))
        d = Disturbance(others_cpu_share=0.01, runqueue_wait_share=wait, threads=threads, cpus=cpus)
        records += d.to_records(ctx)
        samples.append(ctx.samples("latency_ms", "ms", values))
    return records, samples


def test_an_oversubscription_regression_fails_the_gate_instead_of_hiding_as_noisy() -> None:
    """threads=4 on 2 CPUs, both sides waiting 45-60% on their own threads, the candidate 30% slower: FAIL.
    The same waits with as many threads as CPUs are a disturbance: NOISY, with the evidence."""
    base = collect_side(*_side("a", [10.0, 10.1, 9.9], wait=0.45, threads=4, cpus=2))
    cand = collect_side(*_side("b", [13.0, 13.1, 12.9], wait=0.60, threads=4, cpus=2))
    assert evaluate(base, cand, default_rules()).verdicts[0].verdict == FAIL
    base = collect_side(*_side("a", [10.0, 10.1, 9.9], wait=0.45, threads=2, cpus=2))
    v = evaluate(base, cand, default_rules()).verdicts[0]
    assert v.verdict == NOISY and "baseline: invocation 1: " + WAITED in v.reason


def test_results_and_the_report_health_list_disturbance_with_the_new_fields(tmp_path: Path) -> None:
    from edgebench.cli.core import disturbed_lines
    from edgebench.render.report.frames import health

    run = "20261201T000000Z-aaaaaa"
    quiet, _ = _side(run, [10.0], wait=0.45, threads=4, cpus=2)
    waited, _ = _side(run, [10.0, 10.0], wait=0.45, threads=2, cpus=2)
    assert disturbed_lines(quiet) == []
    assert [line.endswith(WAITED) for line in disturbed_lines(waited)] == [True, True]
    job = {"run_id": run, "device": "local", "probe": "bench", "model": "m", "warnings": []}
    [row] = health([SimpleNamespace(run_id=run)], [job], [], quiet).to_dict("records")
    assert row["status"] == "ok" and any("(4 threads on 2 CPUs)" in n for n in row["notes"]), row
    with Store(tmp_path / "s.db") as st:
        st.begin_run(run, "bench", {})
        records, samples = _side(run, [10.0], wait=0.45, threads=4, cpus=2)
        ref = Job("local", "bench", ModelRef("m", Path("m.onnx")), "onnxruntime", {"threads": 4})
        st.save_job(run, JobOutcome(ref, "ok", records, samples))
        st.finish_run(run, "ok")
    shown = edgebench("results", "--store", tmp_path / "s.db", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "disturbance_threads" in shown.stdout and "disturbance_cpus" in shown.stdout
    assert "disturbed job" not in shown.stdout + shown.stderr
