"""Where a model ran (agent.placement), as the host reads it: counts, partitions and fallen-back ops from each
op's unit, what strict mode refuses and says, the notes and warning every record of a backend's run
carries, and the one-line errors for a backend a runtime does not have."""

from __future__ import annotations

import pytest

from edgebench.agent.placement import OpUnit, Placement, from_ops, partitions_of, unknown, whole
from edgebench.analysis.gate import on_backend_share, placement_verdicts
from edgebench.errors import UserError
from edgebench.probes.common import check_backend, placement_notes
from edgebench.records import Record


def ops(*units: str) -> list[OpUnit]:
    return [OpUnit(f"op{i}", "Conv" if unit == "vulkan" else "MatMul", unit) for i, unit in enumerate(units)]


def test_partitions_count_each_change_of_unit() -> None:
    assert partitions_of([]) == 0
    assert partitions_of(["vulkan"] * 4) == 1
    assert partitions_of(["vulkan", "cpu", "vulkan", "vulkan", "cpu"]) == 4


def test_from_ops_counts_units_and_names_the_ops_that_ran_elsewhere_in_order() -> None:
    placed = from_ops(
        "vulkan", ops("vulkan", "cpu", "vulkan", "vulkan", "cpu"), "read back", {"mode": "fp16"}
    )
    assert placed.actual == "vulkan+cpu" and placed.ops_by_unit == {"vulkan": 3, "cpu": 2}
    assert placed.partitions == 4 and placed.fallback_ops == ["op1 (MatMul)", "op4 (MatMul)"]
    assert placed.precision == {"mode": "fp16"} and not placed.full
    why = placed.shortfall()
    assert why is not None and "2 of 5 ops ran elsewhere (op1 (MatMul), op4 (MatMul)), 4 partitions" in why


def test_the_backend_asked_for_wins_a_tie_in_the_actual_name_and_a_minority_still_counts() -> None:
    assert from_ops("vulkan", ops("cpu", "vulkan"), "e").actual == "vulkan+cpu"
    mostly_cpu = from_ops("vulkan", ops("cpu", "cpu", "cpu", "vulkan"), "e")
    assert mostly_cpu.actual == "cpu+vulkan" and not mostly_cpu.full


def test_only_a_whole_model_on_the_backend_asked_for_is_full() -> None:
    assert from_ops("vulkan", ops("vulkan", "vulkan"), "e").full
    assert from_ops("vulkan", ops("vulkan", "vulkan"), "e").shortfall() is None
    fell = whole("vulkan", "cpu", "ncnn found 0 Vulkan devices", ops=7)
    assert (
        not fell.full
        and fell.shortfall() == "vulkan was asked for; the model ran on cpu (ncnn found 0 Vulkan devices)"
    )
    assert whole("cpu", "cpu", "the CPU").full


def test_no_evidence_is_unknown_never_the_backend_asked_for() -> None:
    nothing = from_ops("gpu", [], "")
    assert nothing.actual == "unknown" and not nothing.full and nothing.partitions is None
    said = unknown("gpu", "the delegate gave no per-op report").shortfall()
    assert said == "gpu was asked for; where the ops ran is unknown (the delegate gave no per-op report)"


def test_many_fallen_back_ops_are_named_up_to_eight_then_counted() -> None:
    placed = from_ops("vulkan", ops("vulkan", *["cpu"] * 11), "e")
    why = placed.shortfall() or ""
    assert "op8 (MatMul)" in why and "op9 (MatMul)" not in why and "and 3 more" in why


def test_every_record_of_a_backend_run_carries_where_it_ran_and_a_warning_when_it_fell() -> None:
    warnings: list[str] = []
    placed = from_ops("vulkan", ops("vulkan", "cpu"), "support_vulkan").as_dict()
    notes = placement_notes(placed, warnings)
    assert notes == {"backend_actual": "vulkan+cpu", "placement": placed}
    assert warnings == ["asked for vulkan, ran on vulkan+cpu (1 ops elsewhere: op1 (MatMul)): support_vulkan"]
    quiet: list[str] = []
    assert (
        placement_notes(whole("vulkan", "vulkan", "e", ops=2).as_dict(), quiet)["backend_actual"] == "vulkan"
    )
    assert quiet == []
    assert placement_notes({}, quiet) == {"backend_actual": "unknown"}  # an agent that reported nothing


def test_a_placement_survives_the_agent_channel_as_a_dict() -> None:
    placed = from_ops("vulkan", ops("vulkan", "cpu"), "e", {"mode": "fp16"})
    assert Placement(**placed.as_dict()) == placed


def test_a_backend_the_runtime_does_not_have_is_one_line_naming_the_field_and_those_it_has() -> None:
    check_backend("ncnn", "vulkan")
    check_backend("onnxruntime", "cpu")
    with pytest.raises(UserError) as caught:
        check_backend("ncnn", "cuda")
    assert str(caught.value) == "backend: ncnn has no backend 'cuda' (it has: cpu, vulkan)"
    with pytest.raises(UserError, match=r"^backend: .* has no backend 'vulkan' \(it has: cpu"):
        check_backend("onnxruntime", "vulkan")


def bench_record(run: str, placed: Placement) -> Record:
    return Record(
        run_id=run, device="phone", probe="bench", model="net", runtime="ncnn", metric="latency_ms", value=5.0,
        unit="ms", params={"stat": "p50", "backend": placed.requested}, annotations={"placement": placed.as_dict()},
    )  # fmt: skip


def test_the_gate_judges_a_change_of_placement_as_a_finding() -> None:
    full = from_ops("vulkan", ops("vulkan", "vulkan", "vulkan"), "e")
    partial = from_ops("vulkan", ops("vulkan", "cpu", "vulkan"), "e")
    other = Placement("vulkan", "vulkan+cpu", {"vulkan": 2, "cpu": 1}, 3, ["op2 (MatMul)"], "e")
    cases = [
        (full, partial, "FAIL", "ops now off vulkan: op1 (MatMul)"),
        (partial, full, "IMPROVED", "now on vulkan (3 on vulkan)"),
        (partial, partial, "PASS", "ran on vulkan+cpu"),
        (partial, other, "FAIL", "ops now off vulkan: op2 (MatMul)"),  # as many ops, but other ones
        (full, whole("vulkan", "cpu", "0 devices"), "FAIL", "now on cpu (ops not counted)"),
        (full, unknown("vulkan", "no report"), "INCOMPLETE", "unknown on one side"),
    ]
    for before, after, verdict, said in cases:
        (found,) = placement_verdicts([bench_record("a", before)], [bench_record("b", after)])
        assert (found.verdict, found.key.metric) == (verdict, "placement"), (before, after, found)
        assert said in found.reason, found.reason
    assert on_backend_share(partial.as_dict()) == pytest.approx(2 / 3)
    assert on_backend_share(whole("vulkan", "vulkan", "e").as_dict()) == 1.0
    assert on_backend_share(Placement("gpu", "gpu+cpu", evidence="split, ops unknown").as_dict()) is None
    cpu = whole("cpu", "cpu", "e", ops=3)
    assert placement_verdicts([bench_record("a", cpu)], [bench_record("b", cpu)]) == []  # nothing to judge


def test_the_report_says_where_each_backend_run_ran_in_html_and_markdown() -> None:
    from edgebench.render.report.data import ReportData
    from edgebench.render.report.markdown import render_markdown
    from edgebench.render.report.placement import where_it_ran

    partial = from_ops("vulkan", ops("vulkan", "cpu", "vulkan"), "support_vulkan", {"mode": "fp16"})
    records = (bench_record("r1", partial), bench_record("r1", whole("cpu", "cpu", "e", ops=3)))
    data = ReportData("t", "now", "s.db", (), (), (), records, (), ())
    html, has = where_it_ran(data)
    assert has and html.count("<tr>") == 2  # the heading and the vulkan run; a CPU run is not listed
    for text in ("vulkan+cpu", "not wholly on it", "2 vulkan, 1 cpu", "op1 (MatMul)", "fp16 (the backend"):
        assert text in html, text
    md = render_markdown(data)
    assert "## Where it ran" in md and "vulkan+cpu (not wholly on it)" in md and "op1 (MatMul)" in md
    empty, has = where_it_ran(ReportData("t", "now", "s.db", (), (), (), records[1:], (), ()))
    assert not has and "--backend" in empty


def test_a_native_tool_is_told_the_backend_asked_for_and_keeps_the_descriptors_environment() -> None:
    from edgebench.probes.native import native_delegate, run_env
    from edgebench.probes.registry import BenchParams

    assert native_delegate(BenchParams(backend="vulkan")) == "vulkan"  # --backend reaches the vendor tool
    assert native_delegate(BenchParams(delegate="opencl")) == "opencl"
    assert native_delegate(BenchParams()) is None
    with pytest.raises(UserError, match="^backend: --backend vulkan and --delegate opencl name different"):
        native_delegate(BenchParams(backend="vulkan", delegate="opencl"))
    spec = {"LD_PRELOAD": "libMNN_Vulkan.so", "LD_LIBRARY_PATH": "/vendor/lib64"}
    assert run_env(spec, {"LD_LIBRARY_PATH": "/data/local/tmp/libs"}) == {
        "LD_PRELOAD": "libMNN_Vulkan.so",
        "LD_LIBRARY_PATH": "/data/local/tmp/libs:/vendor/lib64",
    }
    assert run_env({}, {}) is None and run_env(spec, {}) == spec


def test_threads_that_ran_other_than_asked_are_said_beside_the_identity() -> None:
    from edgebench.probes.bench import effective_threads
    from edgebench.records import RecordContext

    ctx = RecordContext("r", "phone", "bench", base_params={"threads": 2})
    effective_threads(ctx, {"effective_threads": 4})  # MNN's GPU mode on the CPU it fell back to
    assert ctx.base_params["threads"] == 2 and ctx.base_annotations["threads_ran"] == 4
    same = RecordContext("r", "phone", "bench", base_params={"threads": 2})
    effective_threads(same, {"effective_threads": 2})
    assert "threads_ran" not in same.base_annotations
