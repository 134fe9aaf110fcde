"""Pure statistics over raw samples (numpy/scipy), shared by bench, threads, thermal and gates.

Percentiles carry a distribution-free confidence interval from order statistics: the number of samples
below the true q-quantile is Binomial(n, q), so ranks l < u with P(l <= B < u) >= level bracket it between
the l-th and u-th smallest samples whatever the distribution. A percentile is claimed only when both ends
of its interval are samples (the interval is bounded): that needs n with max(q, 1-q)^n <= (1-level)/2,
e.g. 368 samples for p99 and 36 for p90 at 95%. A tail percentile short of that is refused, with the
samples it needs; the median is always given (everything pairs on it) and flagged "uncertain" instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

CI_LEVEL = 0.95
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0))


def samples_needed(q: float, level: float = CI_LEVEL) -> int:
    """The fewest samples whose order statistics bracket the q-quantile (0 < q < 1) at `level`."""
    tail = (1.0 - level) / 2.0
    return max(1, math.ceil(math.log(tail) / math.log(max(q, 1.0 - q)) - 1e-12))


MIN_SAMPLES_FOR_P99 = samples_needed(0.99)
MIN_SAMPLES_FOR_P90 = samples_needed(0.90)


@dataclass(frozen=True)
class Interval:
    """A percentile's confidence interval: the `low_rank`-th and `high_rank`-th smallest samples (1-based;
    None where the interval reaches beyond the sample) and its exact coverage."""

    low: float | None
    high: float | None
    low_rank: int | None
    high_rank: int | None
    coverage: float
    level: float

    @property
    def bounded(self) -> bool:
        return self.low is not None and self.high is not None

    def annotations(self) -> dict[str, float | int | None]:
        """What a percentile record carries about its uncertainty."""
        return {
            "ci_low": self.low,
            "ci_high": self.high,
            "ci_level": self.level,
            "ci_ranks": [self.low_rank, self.high_rank],
        }


def binomial_cdf(n: int, q: float) -> np.ndarray:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, q), by scipy.special's incomplete beta (scipy.stats gives the
    same figures but costs most of a second to import in every run that summarizes samples)."""
    from scipy.special import bdtr

    return np.asarray(bdtr(np.arange(n + 1), n, q), dtype=float)


def percentile_interval(sorted_x: np.ndarray, q: float, level: float = CI_LEVEL) -> Interval:
    """Distribution-free interval of the q-quantile (0 < q < 1) from sorted samples (order statistics)."""
    n = int(sorted_x.size)
    tail = (1.0 - level) / 2.0
    cdf = binomial_cdf(n, q)

    def cdf_at(k: int) -> float:
        return 0.0 if k < 0 else 1.0 if k >= n else float(cdf[k])

    def ppf(p: float) -> int:  # the smallest k with P(B <= k) >= p
        return int(np.searchsorted(cdf, p, side="left"))

    # Lower rank l: the largest with P(B <= l - 1) <= tail; upper rank u: the smallest with
    # P(B <= u - 1) >= 1 - tail. B counts samples below the true quantile.
    k = ppf(tail)
    if cdf_at(k) > tail:
        k -= 1
    low_rank = k + 1 if k >= 0 else None
    high_rank = ppf(1.0 - tail) + 1
    high_rank_ok = high_rank if high_rank <= n else None
    cdf_high = cdf_at(high_rank - 1) if high_rank_ok else 1.0
    cdf_low = cdf_at(low_rank - 1) if low_rank else 0.0
    return Interval(
        low=float(sorted_x[low_rank - 1]) if low_rank else None,
        high=float(sorted_x[high_rank_ok - 1]) if high_rank_ok else None,
        low_rank=low_rank,
        high_rank=high_rank_ok,
        coverage=float(cdf_high - cdf_low),
        level=level,
    )


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float
    cv: float
    min: float
    max: float
    percentiles: dict[str, float]
    outliers: int
    refused: dict[str, str]
    intervals: dict[str, Interval]

    def uncertain(self, name: str) -> bool:
        """A given percentile whose interval is not bounded by the samples (only ever the median)."""
        interval = self.intervals.get(name)
        return interval is not None and not interval.bounded

    def percentile_annotations(self, name: str) -> dict[str, object]:
        """The interval annotations of a percentile record (plus "uncertain" when it is not bounded)."""
        interval = self.intervals.get(name)
        if interval is None:
            return {}
        notes: dict[str, object] = dict(interval.annotations())
        if not interval.bounded:
            need = samples_needed(_level_of(name), interval.level)
            notes["uncertain"] = f"{name} needs {need} samples for a bounded interval"
        return notes


def _level_of(name: str) -> float:
    return float(name[1:]) / 100.0


def summarize(values: list[float] | tuple[float, ...] | np.ndarray, level: float = CI_LEVEL) -> Summary:
    """Percentiles with their order-statistic intervals; a tail percentile whose interval the samples cannot
    bound is refused (with the samples it needs), the median flagged instead."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("no samples")
    ordered = np.sort(x)
    pct: dict[str, float] = {}
    intervals: dict[str, Interval] = {}
    refused = {}
    for name, q in PERCENTILES:
        interval = percentile_interval(ordered, q / 100.0, level)
        if interval.bounded or name == "p50":
            pct[name] = float(np.percentile(x, q))
            intervals[name] = interval
        else:
            need = samples_needed(q / 100.0, level)
            refused[name] = (
                f"{name} needs at least {need} samples for a {level:.0%} confidence interval inside "
                f"the samples, got {x.size}"
            )
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
    return Summary(
        n=int(x.size),
        mean=mean,
        std=std,
        cv=std / mean if mean else 0.0,
        min=float(x.min()),
        max=float(x.max()),
        percentiles=pct,
        outliers=count_outliers(x),
        refused=refused,
        intervals=intervals,
    )


# hyperfine flags a sample whose modified z-score exceeds 10: |x - median| / (1.4826 x MAD) > 10, i.e. more
# than ten robust standard deviations from the median. (hyperfine writes it as |x - median| / MAD > 14.826.)
OUTLIER_Z = 10.0
MAD_TO_SIGMA = 1.4826  # MAD x 1.4826 estimates the standard deviation of a normal distribution


def count_outliers(x: np.ndarray, threshold: float = OUTLIER_Z) -> int:
    """Samples more than `threshold` robust standard deviations (MAD x 1.4826) from the median."""
    if x.size < 3:
        return 0
    median = np.median(x)
    sigma = np.median(np.abs(x - median)) * MAD_TO_SIGMA
    if sigma == 0:
        return int(np.sum(x != median))
    return int(np.sum(np.abs(x - median) / sigma > threshold))


# A figure reached in this many rounds is one the side can reach again: one lucky round decides nothing.
CORROBORATING_ROUNDS = 3


def corroborated_ratio(ours: list[float], reference: list[float]) -> float:
    """Latency of `ours` over `reference`, each side's k-th fastest round, k = a third of the rounds (1 to
    CORROBORATING_ROUNDS). Load only slows a side, and a slow stretch of a shared device can cover one side
    of a round whole (a round read 1.34 with both CVs steady, the next 0.67), so a median of round ratios
    takes it for overhead; each side's single fastest round lets one lucky round decide (a bare MNN loop's
    first round at 6.1 ms against 7.3 in its nine others read 1.21 where every other round read 0.98-1.16)."""
    rank = max(1, min(CORROBORATING_ROUNDS, min(len(ours), len(reference)) // 3))
    return sorted(ours)[rank - 1] / sorted(reference)[rank - 1]


def conformal_bounds(ratios_seen: Iterable[float], coverage: float) -> tuple[float, float] | None:
    """Split-conformal bounds on measured / predicted from held-out ratios (None with too few of them)."""
    ratios = sorted(ratios_seen)
    n = len(ratios)
    tail = (1 - coverage) / 2
    k = math.ceil((n + 1) * (1 - tail))
    if n == 0 or k > n:
        return None
    return ratios[n - k], ratios[k - 1]
