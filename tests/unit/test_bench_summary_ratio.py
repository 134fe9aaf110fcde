"""`bench A B` compares p50s with a confidence interval: the ratio of the medians, bootstrapped over both
sides' samples, not the ratio of means with hyperfine's error propagation (which read "4.39 ± 6.91 times
faster" when a few runs were disturbed)."""

from __future__ import annotations

import numpy as np

from edgebench.render.bench_summary import BenchSummary, comparison_lines, p50_ratio


def disturbed(median: float, n: int, seed: int) -> np.ndarray:
    """Steady runs around `median`, 5% of them hit by a 4 ms scheduler tick."""
    rng = np.random.default_rng(seed)
    x = median * (1 + 0.05 * rng.standard_normal(n))
    x[rng.choice(n, n // 20, replace=False)] += 4.0
    return x


def summary(label: str, x: np.ndarray) -> BenchSummary:
    return BenchSummary(
        label, float(x.mean()), float(x.std(ddof=1)), float(x.min()), float(x.max()), x.size,
        float(np.median(x)), None, None, None, tuple(x),
    )  # fmt: skip


def test_ratio_of_p50s_holds_the_true_ratio_in_a_narrow_interval() -> None:
    slow, fast = disturbed(2.1, 300, 1), disturbed(0.7, 900, 2)
    ratio, lo, hi = p50_ratio(slow, fast)
    assert ratio == np.median(slow) / np.median(fast)  # the reference: numpy's medians
    assert lo < 3.0 < hi and hi - lo < 0.3
    # the ratio of means and its propagated σ, as before, say nothing useful here
    means = slow.mean() / fast.mean()
    sigma = means * np.hypot(slow.std() / slow.mean(), fast.std() / fast.mean())
    assert sigma > 1.0 and abs(means - 3.0) > 0.3
    assert p50_ratio(slow, fast) == (ratio, lo, hi)  # seeded: the same samples, the same interval


def test_summary_lines_name_the_interval_and_an_indistinct_pair() -> None:
    a, b = disturbed(2.1, 300, 1), disturbed(0.7, 900, 2)
    lines = comparison_lines([summary("mlp", a), summary("mlp.int8", b)])
    assert lines[1].strip() == "mlp.int8 ran"
    assert "times faster than mlp" in lines[2] and "ratio of p50s, 95% CI" in lines[2] and "±" not in lines[2]
    same = comparison_lines([summary("x", disturbed(1.0, 200, 3)), summary("y", disturbed(1.0, 200, 4))])
    assert "not distinguishably faster" in same[2]
    assert "samples" not in summary("mlp", a).to_dict()
