"""Seeded simulation of the gate's error rates (no timing): 5% slowdowns at CV 2% with 30 samples per side.

Gates of 10 pairs each, as a nightly suite would give: "mixed" gates hold 5 slowed and 5 unchanged pairs
(the false-discovery correction then works with real discoveries present), "quiet" gates hold 10
unchanged pairs. The default gate (5% max slowdown, alpha 0.01) must catch >= 95% of the slowdowns and
raise <= 1% false alarms on the unchanged pairs.
"""

from __future__ import annotations

import numpy as np

from edgebench.analysis.gate import FAIL, GateOptions, PairKey, Side, default_rules, evaluate

CV, N, SLOWDOWN, PAIRS = 0.02, 30, 0.05, 10
MIXED_GATES, QUIET_GATES = 60, 40


def arm(rng: np.random.Generator, median: float) -> Side:
    # Latencies are right-skewed: log-normal with sigma = CV (CV of a log-normal ~ sigma for small sigma).
    values = tuple(median * np.exp(rng.normal(0.0, CV, N)))
    return Side(float(np.median(values)), "ms", values)


def simulate(rng: np.random.Generator, slowed: int) -> tuple[list[str], list[str]]:
    keys = [
        PairKey("board", f"model{i}", "onnxruntime", "bench", "latency_ms", "p50", "{}") for i in range(PAIRS)
    ]
    base = {k: arm(rng, 10.0) for k in keys}
    cand = {k: arm(rng, 10.0 * (1 + SLOWDOWN) if i < slowed else 10.0) for i, k in enumerate(keys)}
    res = evaluate(base, cand, default_rules(), GateOptions(seed=int(rng.integers(2**31))))
    verdict = {v.key: v.verdict for v in res.verdicts}
    return [verdict[k] for k in keys[:slowed]], [verdict[k] for k in keys[slowed:]]


def test_five_percent_slowdowns_are_caught_and_unchanged_pairs_pass() -> None:
    rng = np.random.default_rng(20261129)
    slowed: list[str] = []
    unchanged: list[str] = []
    for _ in range(MIXED_GATES):
        s, u = simulate(rng, PAIRS // 2)
        slowed += s
        unchanged += u
    for _ in range(QUIET_GATES):
        unchanged += simulate(rng, 0)[1]
    detected = slowed.count(FAIL) / len(slowed)
    false_alarms = unchanged.count(FAIL) / len(unchanged)
    print(
        f"detected {detected:.2%} of {len(slowed)} slowdowns; false alarms {false_alarms:.2%} of "
        f"{len(unchanged)} unchanged pairs (NOISY: {unchanged.count('NOISY')} unchanged, "
        f"{slowed.count('NOISY')} slowed)"
    )
    assert len(slowed) == 300 and len(unchanged) == 700
    assert detected >= 0.95
    assert false_alarms <= 0.01
