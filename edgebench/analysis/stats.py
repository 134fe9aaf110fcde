"""Pure statistics over raw samples (numpy/scipy), shared by bench, threads, thermal and gates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_SAMPLES_FOR_P99 = 100
MIN_SAMPLES_FOR_P90 = 10


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


def summarize(values: list[float] | tuple[float, ...] | np.ndarray) -> Summary:
    """Percentiles a sample size can support; p99 needs 100 samples, p90 needs 10 (else refused, with why)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("no samples")
    pct = {"p50": float(np.percentile(x, 50))}
    refused = {}
    for name, q, need in (("p90", 90, MIN_SAMPLES_FOR_P90), ("p99", 99, MIN_SAMPLES_FOR_P99)):
        if x.size >= need:
            pct[name] = float(np.percentile(x, q))
        else:
            refused[name] = f"{name} needs at least {need} samples, got {x.size}"
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
