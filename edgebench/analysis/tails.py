"""Whether a tail percentile (p90, p99, max) measures the model or the device's disturbance.

On a shared or emulated device the slowest inferences are often not the model's: a scheduler tick (4 ms at
HZ=250, 10 ms at HZ=100, 1 ms at HZ=1000) or another process pre-empting the agent adds a fixed step to a
few runs. With a p50 of 0.1-0.3 ms every p99 then reads ~4.2 ms, and a verdict on it flips between fits and
does not fit from night to night. A tail is *disturbed* when most of the samples at or above the percentile
are outliers (modified z-score over TAIL_OUTLIER_Z above the median, MAD x 1.4826; the tail is the
slowest samples, those above the percentile's rank and the one at it): the percentile is then
recomputed without the outliers, and fit calls the budget "uncertain (tail disturbed)" when the two disagree
on the verdict. The evidence says how many tail samples were outliers, the step they cluster at (when it is
tick-sized) and any disturbance the job measured.

Pure functions over the kept raw samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..stats import MAD_TO_SIGMA

TAIL_STATS = {"p90": 90.0, "p99": 99.0, "max": 100.0}
# Lower than the outlier count's hyperfine threshold (10): a tick-sized step over a steady 0.2 ms model is
# far beyond it, but on a model whose runs spread a little a 4 ms step is 5-10 robust sigmas.
TAIL_OUTLIER_Z = 5.0
DOMINATED_SHARE = 0.5  # a tail is disturbed when at least this share of its samples are outliers
TICKS_MS = (1.0, 3.333, 4.0, 10.0)  # scheduler ticks at HZ = 1000, 300, 250, 100
TICK_TOLERANCE = 0.15  # a step within 15% of a tick (or two) counts as tick-sized
MIN_TAIL = 3  # fewer tail samples than this say nothing about the tail's make-up


@dataclass(frozen=True)
class TailCheck:
    """A tail percentile with and without the samples that look like disturbance."""

    stat: str
    value: float  # the percentile of every sample
    clean_value: float  # the percentile of the samples that are not outliers
    n: int
    outliers: int  # samples over TAIL_OUTLIER_Z robust sigmas above the median
    tail_n: int  # the slowest samples, those the percentile rests on
    tail_outliers: int  # of those, outliers
    step_ms: float  # the outliers' median excess over the median sample
    tick_ms: float | None  # the scheduler tick the step matches, if any
    measured: Mapping[str, Any] | None = None  # disturbance the job recorded, where it did

    @property
    def disturbed(self) -> bool:
        """Most of the tail is disturbance (and there is a tail to speak of)."""
        return self.tail_n >= MIN_TAIL and self.tail_outliers >= DOMINATED_SHARE * self.tail_n

    def evidence(self) -> str:
        """One line: what the tail is made of, with and without the disturbance."""
        step = f"~{self.step_ms:.3g} ms steps" + (
            f" (a {self.tick_ms:g} ms scheduler tick)" if self.tick_ms is not None else ""
        )
        measured = f"; measured: {dict(self.measured)}" if self.measured else ""
        return (
            f"{self.tail_outliers} of the {self.tail_n} slowest samples (those {self.stat} rests on) are "
            f"outliers ({self.outliers} of {self.n} in all, {step}); {self.stat} = {self.value:.4g} ms "
            f"with them, {self.clean_value:.4g} ms without{measured}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "stat": self.stat,
            "value": self.value,
            "clean_value": self.clean_value,
            "n": self.n,
            "outliers": self.outliers,
            "tail_n": self.tail_n,
            "tail_outliers": self.tail_outliers,
            "step_ms": self.step_ms,
            "tick_ms": self.tick_ms,
            "measured": dict(self.measured) if self.measured else None,
        }


def tick_of(step_ms: float) -> float | None:
    """The scheduler tick a step of `step_ms` is closest to one or two of (within TICK_TOLERANCE), or None."""
    fits = [
        (abs(step_ms - k * tick) / (k * tick), tick)
        for tick in TICKS_MS
        for k in (1, 2)
        if abs(step_ms - k * tick) <= TICK_TOLERANCE * k * tick
    ]
    return min(fits)[1] if fits else None


def check_tail(
    samples: Sequence[float], stat: str, measured: Mapping[str, Any] | None = None
) -> TailCheck | None:
    """The tail `stat` (p90, p99, max) of the samples with and without their high outliers; None for a
    statistic that is not a tail or too few samples to tell."""
    if stat not in TAIL_STATS:
        return None
    x = np.asarray(samples, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 10:
        return None
    q = TAIL_STATS[stat]
    median = float(np.median(x))
    mad = float(np.median(np.abs(x - median))) * MAD_TO_SIGMA
    # A perfectly steady device (MAD 0) still has a resolution: a step under 1% of the median is none.
    scale = max(mad, 0.01 * median, 1e-9)
    high = (x - median) / scale > TAIL_OUTLIER_Z
    value = float(np.percentile(x, q))
    clean = x[~high]
    clean_value = float(np.percentile(clean, q)) if clean.size else value
    # The samples the percentile rests on: those above its rank, and the one at it (at least MIN_TAIL).
    k = max(MIN_TAIL, int(np.ceil(x.size * (1 - q / 100))) + 1)
    tail = np.zeros(x.size, dtype=bool)
    tail[np.argsort(x)[-k:]] = True
    step = float(np.median(x[high] - median)) if high.any() else 0.0
    return TailCheck(
        stat=stat,
        value=value,
        clean_value=clean_value,
        n=int(x.size),
        outliers=int(high.sum()),
        tail_n=int(tail.sum()),
        tail_outliers=int((tail & high).sum()),
        step_ms=step,
        tick_ms=tick_of(step) if high.any() else None,
        measured=measured,
    )
