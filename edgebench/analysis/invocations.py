"""Invocation-level statistics for the gate: the invocation (a fresh agent process), not the sample, is the
unit of evidence.

Samples of one invocation share its disturbance (a neighbour, a thermal state, a frequency step) and are
autocorrelated, so hundreds of them make a tiny p-value for a difference the next invocation would not
repeat (pyperf replicates over processes, Google Benchmark's compare.py over repetitions). Here each
invocation gives one value of the rule's statistic (its p50, say); the two sides' values are compared
with Welch's t-test on their logarithms (a ratio is a difference of logs), and the change's bounds come
from Welch's t-interval.

The history floor (asv / Otava style): when the store holds >= `MIN_HISTORY` earlier runs of the same
configuration, their run-to-run spread is a change that happens between runs of unchanged code; a change
within it is not a regression. The spread is read from successive differences of the log statistic
(3 x 1.4826 x MAD of diff(log) / sqrt(2)), not from deviations around one median: a history that stepped
once (a faster build, a new kernel) would otherwise count its step as noise and switch the gate off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_INVOCATIONS = 2  # per side, for a variance at all; 3 or more recommended
RECOMMENDED_INVOCATIONS = 3
MIN_HISTORY = 4
MAD_TO_SD = 1.4826
FLOOR_SDS = 3.0


@dataclass(frozen=True)
class InvocationTest:
    """Welch's t-test of the worse-oriented change between two sides' per-invocation statistics."""

    n_baseline: int
    n_candidate: int
    baseline: float  # geometric mean (relative) or mean (absolute) of the per-invocation statistics
    candidate: float
    effect: float  # worse-oriented: a ratio (relative) or a difference (absolute)
    ci_low: float  # one-sided (1 - alpha) bounds of `effect`
    ci_high: float
    p_worse: float
    p_better: float
    se: float  # standard error of the (log) difference


def invocation_test(
    base: Sequence[float], cand: Sequence[float], relative: bool, higher_is_worse: bool, alpha: float
) -> InvocationTest:
    """Welch's t-test and t-interval on log values (relative) or values (absolute), >= 2 per side."""
    from scipy import stats as sps  # lazily: scipy costs a second of every CLI start

    b, c = np.asarray(base, dtype=float), np.asarray(cand, dtype=float)
    if relative and (np.any(b <= 0) or np.any(c <= 0)):
        relative = False  # a log needs positive values; compare the values themselves
    tb, tc = (np.log(b), np.log(c)) if relative else (b, c)
    sign = 1.0 if higher_is_worse else -1.0
    d = sign * float(tc.mean() - tb.mean())
    vb, vc = float(tb.var(ddof=1)) / tb.size, float(tc.var(ddof=1)) / tc.size
    se = math.sqrt(vb + vc)
    if se == 0:
        p_worse, p_better, half = (0.0 if d > 0 else 1.0), (0.0 if d < 0 else 1.0), 0.0
    else:
        df = (vb + vc) ** 2 / (vb**2 / (tb.size - 1) + vc**2 / (tc.size - 1))
        t = d / se
        p_worse, p_better = float(sps.t.sf(t, df)), float(sps.t.cdf(t, df))
        half = float(sps.t.ppf(1 - alpha, df)) * se
    back = math.exp if relative else float
    base_v, cand_v = (
        (float(np.exp(tb.mean())), float(np.exp(tc.mean())))
        if relative
        else (
            float(tb.mean()),
            float(tc.mean()),
        )
    )
    return InvocationTest(
        tb.size, tc.size, base_v, cand_v, back(d), back(d - half), back(d + half), p_worse, p_better, se
    )


def invocations_to_settle(
    se: float, n_baseline: int, n_candidate: int, limit: float, alpha: float, power: float
) -> int | None:
    """Invocations per side for a threshold-sized change (`limit`, in log for ratios) to show at `power`,
    scaling the observed standard error with sqrt(1/n_b + 1/n_c)."""
    from scipy import stats as sps  # lazily

    if not math.isfinite(se) or se <= 0 or limit <= 0:
        return None
    z = float(sps.norm.ppf(1 - alpha) + sps.norm.ppf(power))
    inv_now = 1 / n_baseline + 1 / n_candidate
    n = 2 * (z * se / limit) ** 2 / inv_now
    return max(int(math.ceil(n)), RECOMMENDED_INVOCATIONS, n_baseline, n_candidate)


@dataclass(frozen=True)
class HistoryFloor:
    """The run-to-run spread of a configuration's statistic over earlier runs of unchanged history."""

    runs: int
    log_spread: float  # 3 x 1.4826 x MAD of successive differences of the log statistic / sqrt(2)

    @property
    def relative(self) -> float:
        """The spread as a relative change (0.08 for 8%)."""
        return math.exp(self.log_spread) - 1

    def text(self) -> str:
        return (
            f"run-to-run spread of {self.runs} earlier runs is ±{self.relative:.1%} "
            "(3 x 1.4826 x MAD of successive log differences / sqrt 2)"
        )


def history_floor(values: Sequence[float]) -> HistoryFloor | None:
    """The floor from one value per earlier run, oldest first; None with fewer than MIN_HISTORY positive
    values.

    A difference of two successive runs' logs has twice one run's variance, and a step between two levels
    is one outlier among the differences, which the MAD ignores (deviations around one median would count
    every run of the shorter level as noise: history 10 10 10 8 8 8 gave ±64%)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x) and x > 0], dtype=float)
    if v.size < MIN_HISTORY:
        return None
    steps = np.diff(np.log(v))
    mad = float(np.median(np.abs(steps - np.median(steps))))
    return HistoryFloor(int(v.size), FLOOR_SDS * MAD_TO_SD * mad / math.sqrt(2))
