"""The thread sweep interleaves thread counts over rounds and says whether its best beats the runner-up."""

from __future__ import annotations

import numpy as np

from edgebench.lab.device import AgentReply
from edgebench.probes.threads import Evidence, Group, pooled, round_order, sweep_records
from edgebench.records import RecordContext

ALL = Group("all", (0, 1), False)


def evidence(centres: dict[int, list[float]], n: int = 60, spread: float = 0.02) -> tuple[dict, Evidence]:
    """Per thread count, one round of n lognormal samples around each given centre."""
    rng = np.random.default_rng(5)
    samples, rounds = {}, {}
    for t, per_round in centres.items():
        draws = [list(c * rng.lognormal(0.0, spread, n)) for c in per_round]
        samples[t] = [v for d in draws for v in d]
        rounds[t] = [float(np.median(d)) for d in draws]
    p50 = {t: float(np.percentile(v, 50)) for t, v in samples.items()}
    return p50, Evidence(samples, rounds, 0.01)


def best_of(out):  # type: ignore[no-untyped-def]
    return next(r for r in out.records if r.metric == "best_threads")


def test_rounds_rotate_the_order_of_thread_counts() -> None:
    assert [round_order([1, 2, 3], r) for r in range(4)] == [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 2, 3]]


def test_a_clear_winner_is_significant() -> None:
    p50, ev = evidence({1: [10.0, 10.1, 9.9], 2: [6.0, 6.1, 5.9]})
    out = sweep_records(RecordContext("r", "d", "threads"), ALL, p50, 0.05, ev)
    best = best_of(out)
    assert best.value == 2 and best.annotations["runner_up"] == 1
    assert best.annotations["significant"] and best.annotations["rounds_won"] == 3
    assert best.annotations["p_value"] < 1e-6 and not out.warnings


def test_a_tie_is_not_significant_and_says_so() -> None:
    # the same speed, a different round the fastest: one ascending pass would just pick one
    p50, ev = evidence({1: [6.0, 6.05, 5.95], 2: [6.02, 5.97, 6.01]})
    out = sweep_records(RecordContext("r", "d", "threads"), ALL, p50, 0.05, ev)
    best = best_of(out)
    assert not best.annotations["significant"]
    assert any("not significantly faster" in w for w in out.warnings)


def test_a_win_in_only_some_rounds_is_not_significant() -> None:
    p50, ev = evidence({1: [6.6, 6.6, 5.8], 2: [6.0, 6.0, 6.0]}, spread=0.005)
    best = best_of(sweep_records(RecordContext("r", "d", "threads"), ALL, p50, 0.05, ev))
    assert best.value == 2 and best.annotations["rounds_won"] == 2 and not best.annotations["significant"]


def test_replies_of_the_rounds_pool_their_samples() -> None:
    a = AgentReply({"latencies_ms": [1.0, 2.0], "load_ms": 3.0}, ["w"], 1.0)
    b = AgentReply({"latencies_ms": [4.0], "load_ms": 9.0}, ["w", "x"], 2.0)
    got = pooled([a, b])
    assert got.result["latencies_ms"] == [1.0, 2.0, 4.0] and got.result["load_ms"] == 3.0
    assert got.result["rounds"] == 2 and got.warnings == ["w", "x"] and got.duration_s == 3.0
