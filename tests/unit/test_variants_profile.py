"""Units of the per-op profile: onnxruntime trace parsing (runs, warm-up, nested subgraph nodes, overhead
correction), MNN callback results, robust aggregation, and the records a profile makes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from edgebench.analysis.kernel_predict import profiled_runs
from edgebench.lab.device import AgentReply
from edgebench.probes.profile import (
    OpKey,
    ProfilerOverhead,
    aggregate,
    mnn_profile,
    ort_overhead,
    ort_profile,
    profile_records,
)
from edgebench.records import RecordContext


def node(name: str, op: str, ts: float, dur: float) -> dict[str, Any]:
    return {
        "cat": "Node",
        "name": f"{name}_kernel_time",
        "ts": ts,
        "dur": dur,
        "ph": "X",
        "args": {"op_name": op, "provider": "CPUExecutionProvider"},
    }


def model_run(ts: float, dur: float) -> dict[str, Any]:
    return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur, "ph": "X", "args": {}}


def trace(runs: int, warmup: int = 2, slow_run: int | None = None) -> list[dict[str, Any]]:
    """Runs of: conv (100 us), an If (60 us) holding add (10 us) and mul (20 us), relu (5 us)."""
    events: list[dict[str, Any]] = [{"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 50}]
    t = 1000.0
    for i in range(warmup + runs):
        first = i < warmup
        conv = 500.0 if first else (100.0 + (4000.0 if i == slow_run else 0.0))
        events += [
            model_run(t, 300 + conv),
            node("conv", "Conv", t + 1, conv),
            node("gate", "If", t + conv + 2, 60),
            node("add", "Add", t + conv + 5, 10),
            node("mul", "Mul", t + conv + 20, 20),
            node("relu", "Relu", t + conv + 70, 5),
        ]
        t += 1000.0 + conv
    return events


def test_runs_are_assigned_warmup_dropped_and_subgraph_time_not_counted_twice() -> None:
    profile = ort_profile(trace(runs=10), runs=10, overhead=ProfilerOverhead(0.0, 0.0))
    ms = {op.node: op.ms for op in profile.ops}
    assert ms == pytest.approx({"conv": 0.1, "gate": 0.03, "add": 0.01, "mul": 0.02, "relu": 0.005})
    assert {op.node: op.op_type for op in profile.ops}["gate"] == "If"
    assert profile.runs == 10 and profile.disturbed == 0
    assert sum(ms.values()) == pytest.approx(0.165)  # conv + If's 60 us (its children inside) + relu


def test_overhead_is_subtracted_inside_each_node_and_around_nested_ones() -> None:
    profile = ort_profile(trace(runs=10), runs=10, overhead=ProfilerOverhead(inside_us=2.0, outside_us=4.0))
    ms = {op.node: op.ms for op in profile.ops}
    # the If loses its own 2 us and 4 us for each of its two children's event records
    assert ms == pytest.approx({"conv": 0.098, "gate": 0.020, "add": 0.008, "mul": 0.018, "relu": 0.003})


def test_a_preempted_op_is_left_out_of_the_mean() -> None:
    profile = ort_profile(trace(runs=10, slow_run=5), runs=10, overhead=ProfilerOverhead(0.0, 0.0))
    ms = {op.node: op.ms for op in profile.ops}
    assert ms["conv"] == pytest.approx(0.1) and profile.disturbed == 1


def test_aggregate_keeps_ordinary_noise_and_the_profilers_resolution() -> None:
    keys = [OpKey("a", "Conv"), OpKey("b", "Add")]
    rng = np.random.default_rng(3)
    a = 1.0 + rng.normal(0, 0.05, 40)  # 5% noise: nothing is an outlier
    b = rng.choice([0.001, 0.002], 40)  # 1-2 us, the resolution of onnxruntime's timer
    profile = aggregate(keys, np.column_stack([a, b]), [1.0, 1.0], 0.0, "test")
    assert profile.disturbed == 0
    assert profile.ops[0].ms == pytest.approx(a.mean()) and profile.ops[1].ms == pytest.approx(b.mean())


def test_ort_overhead_from_the_calibration_chain() -> None:
    events = []
    t = 0.0
    for _ in range(12):  # 2 warm-up + 10 measured; 4 trivial nodes of 3 us, 5 us apart
        events.append(model_run(t, 4 * 8.0))
        events += [node(f"add{j}", "Add", t + j * 8.0, 3.0) for j in range(4)]
        t += 100.0
    plain_ms = [0.004] * 10  # 1 us per node without the profiler
    overhead = ort_overhead(events, plain_ms, runs=10)
    assert overhead.inside_us == pytest.approx(2.0)
    assert overhead.outside_us == pytest.approx(4.0)


def test_mnn_profile_subtracts_one_callback_pair_per_call() -> None:
    result = {
        "ops": [
            {"node": "conv", "op_type": "Convolution", "calls": 1.0},
            {"node": "cell", "op_type": "While", "calls": 3.0},
        ],
        "per_run_ms": [[0.105, 0.036]] * 6,
        "overhead_ms": 0.002,
        "runs": 6,
    }
    profile = mnn_profile(result)
    ms = {op.node: op.ms for op in profile.ops}
    assert ms == pytest.approx({"conv": 0.103, "cell": 0.030})
    assert profile.overhead_us == pytest.approx(2.0)


def test_profile_records_and_coverage() -> None:
    profile = ort_profile(trace(runs=10), runs=10, overhead=ProfilerOverhead(0.0, 0.0))
    reply = AgentReply({"latencies_ms": [0.16, 0.17, 0.165, 0.2, 0.16]}, [])
    ctx = RecordContext("r", "local", "profile", "m", "onnxruntime", {"threads": 1})
    out = profile_records(ctx, reply, profile)
    ops = [r for r in out.records if r.metric == "op_time_ms"]
    assert [r.params["node"] for r in ops][0] == "conv"  # slowest first
    assert all(r.params["threads"] == 1 and r.params["op_type"] for r in ops)
    got = {r.metric: r for r in out.records if r.metric != "op_time_ms"}
    assert got["op_time_total_ms"].value == pytest.approx(0.165)
    assert got["op_time_coverage"].value == pytest.approx(0.165 / 0.165)
    by_type = {r.params["op_type"]: r.value for r in out.records if r.metric == "op_type_time_ms"}
    assert by_type["Conv"] == pytest.approx(0.1)
    assert out.samples[0].values == (0.16, 0.17, 0.165, 0.2, 0.16)
    assert not out.warnings
    slow = profile_records(ctx, AgentReply({"latencies_ms": [1.0] * 5}, []), profile)
    assert any("add up to 16%" in w for w in slow.warnings)


def test_op_records_keep_the_order_the_ops_ran_in() -> None:
    """Records go out slowest first; the kernel predictor reads them back in the order the ops ran, so a
    kernel's repeats and neighbours in a profile are those it has in its graph."""
    ran = [("stem", "Convolution", 0.010), ("body", "Convolution", 0.080), ("act", "UnaryOp", 0.005)]
    result = {
        "ops": [{"node": n, "op_type": t, "calls": 1.0} for n, t, _ in ran],
        "per_run_ms": [[ms for _, _, ms in ran]] * 6,
        "overhead_ms": 0.0,
        "runs": 6,
    }
    ctx = RecordContext("r", "local", "profile", "m", "mnn", {"threads": 1})
    out = profile_records(ctx, AgentReply({"latencies_ms": [0.1] * 5}, []), mnn_profile(result))
    ops = [r for r in out.records if r.metric == "op_time_ms"]
    assert [r.params["node"] for r in ops] == ["body", "stem", "act"]  # slowest first
    assert [r.annotations["order"] for r in ops] == [1, 0, 2]
    (run,) = profiled_runs(out.records)
    assert [ms for _, ms in run.kernels] == pytest.approx([0.010, 0.080, 0.005])
    older = [
        replace(r, annotations={k: v for k, v in r.annotations.items() if k != "order"}) for r in out.records
    ]
    (run,) = profiled_runs(older)  # stores from before the order: as stored
    assert [ms for _, ms in run.kernels] == pytest.approx([0.080, 0.010, 0.005])
