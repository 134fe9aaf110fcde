"""Nightly history: find the runs where a metric's series stepped (change points).

Method (binary segmentation, as e-divisive does it, with a rank statistic so one outlier night cannot
make a step):
  1. locate the best single split of a segment with `ruptures.Binseg(model="rank")`;
  2. test whether the segment has a change at all with a permutation test
     (`scipy.stats.permutation_test`, order permuted) of the largest standardised rank-CUSUM split
     statistic, so choosing the best split is part of the null distribution;
  3. keep the split when p < alpha and the medians on either side differ by at least `min_change`,
     then look again in both halves.

Series points are one value per run (the median when a run has several records), ordered by when the
run measured (its earliest record time), so imported results keep their original dates.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UserError
from ..records import Record

DEFAULT_ALPHA = 0.01
DEFAULT_MIN_CHANGE = 0.02
MIN_SEGMENT = 2


@dataclass(frozen=True)
class Step:
    """A change point: the series' level moved between `index - 1` and `index`."""

    index: int
    p_value: float


def _max_split_statistic(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Largest between-segment sum of squares over the allowed split points (vectorised over permutations).

    For a split after k of m values x, (sum_{i<k} (x_i - mean x))^2 * m / (k (m - k)) is what a change of
    level at k removes from the squared error: the `l2` cost reduction ruptures uses to place the split.
    """
    x = np.moveaxis(np.asarray(values, dtype=float), axis, -1)
    m = x.shape[-1]
    cusum = np.cumsum(x - x.mean(axis=-1, keepdims=True), axis=-1)[..., :-1]
    k = np.arange(1, m)
    gain = cusum**2 * m / (k * (m - k))
    return gain[..., MIN_SEGMENT - 1 : m - MIN_SEGMENT].max(axis=-1)


def _candidates(z: np.ndarray) -> list[int]:
    """Where PELT (ruptures, `l2` cost) would put level changes, on a robust noise scale.

    The noise scale is the MAD of first differences (a step moves one difference, not the MAD); the
    penalty is BIC's 2 log n per change. PELT may over-propose: every candidate is then tested.
    """
    import ruptures
    from scipy import stats as sps  # lazily: scipy costs a second of every CLI start

    sigma = float(sps.median_abs_deviation(np.diff(z), scale="normal")) / math.sqrt(2)
    if not sigma > 0:
        sigma = float(np.std(z)) * 1e-3 or 1.0
    algo = ruptures.Pelt(model="l2", min_size=MIN_SEGMENT, jump=1).fit((z / sigma).reshape(-1, 1))
    return [int(b) for b in algo.predict(pen=2 * math.log(z.size))[:-1]]


def _relative_change(before: np.ndarray, after: np.ndarray) -> float:
    b, a = float(np.median(before)), float(np.median(after))
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return a / b - 1


def detect_steps(
    values: Sequence[float],
    alpha: float = DEFAULT_ALPHA,
    min_change: float = DEFAULT_MIN_CHANGE,
    resamples: int = 1999,
    seed: int = 0,
) -> list[Step]:
    """Change points of a series (indices of the first point of each new level), sorted.

    PELT proposes; each proposal must then hold between its neighbours: the medians on either side differ
    by at least `min_change` and a permutation test of the segment (order permuted; the statistic is the
    largest split gain, so the search is part of the null) gives p < alpha / (proposals standing). The
    weakest failing proposal is dropped and its neighbours retested, until all hold.
    """
    from scipy import stats as sps  # lazily: scipy costs a second of every CLI start

    y = np.asarray(values, dtype=float)
    if y.ndim != 1 or not np.all(np.isfinite(y)):
        raise ValueError("a series must be a flat list of finite numbers")
    if y.size < 2 * MIN_SEGMENT or np.ptp(y) == 0:
        return []
    z = np.log(y) if np.all(y > 0) else y  # steps are relative when the metric allows it
    rng = np.random.default_rng(seed)
    tested: dict[tuple[int, int, int], float] = {}

    def p_value(lo: int, at: int, hi: int, n_tests: int) -> float:
        # enough resamples that the smallest reachable p sits well under the Bonferroni level
        n_resamples = max(resamples, int(10 * n_tests / alpha))
        if (lo, at, hi) not in tested:
            if abs(_relative_change(y[lo:at], y[at:hi])) < min_change:
                tested[lo, at, hi] = 1.0
            else:
                res = sps.permutation_test(
                    (z[lo:hi],),
                    _max_split_statistic,
                    permutation_type="pairings",
                    alternative="greater",
                    n_resamples=n_resamples,
                    vectorized=True,
                    rng=rng,
                )
                tested[lo, at, hi] = float(res.pvalue)
        return tested[lo, at, hi]

    points = _candidates(z)
    while points:
        bounds = [0, *points, y.size]
        ps = [p_value(bounds[i], bounds[i + 1], bounds[i + 2], len(points)) for i in range(len(points))]
        worst = int(np.argmax(ps))
        if ps[worst] < alpha / len(points):  # Bonferroni over the proposals still standing
            return [Step(at, p) for at, p in zip(points, ps, strict=True)]
        del points[worst]
    return []


# ---- series from the store -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    run_id: str
    ts: str
    value: float


@dataclass(frozen=True)
class ChangePoint:
    run_id: str  # the first run at the new level
    previous_run: str
    ts: str
    before: float  # median level of the segment before
    after: float  # median level of the segment after
    change: float  # after / before - 1
    p_value: float


@dataclass(frozen=True)
class Series:
    device: str
    model: str | None
    runtime: str | None
    probe: str
    metric: str
    stat: str | None
    params: dict[str, Any]
    unit: str
    points: tuple[Point, ...]

    def label(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.params.items())
        stat = f"[{self.stat}]" if self.stat else ""
        return f"{self.device} {self.model or '-'} {self.runtime or '-'} {self.probe}:{self.metric}{stat}" + (
            f" ({extra})" if extra else ""
        )


def build_series(records: Sequence[Record], stat: str | None = "p50") -> list[Series]:
    """Group records into series (one per runtime, probe and identity params); one point per run."""
    groups: dict[tuple[Any, ...], dict[str, list[Record]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.value is None or not math.isfinite(r.value):
            continue
        rstat = r.params.get("stat")
        if rstat is not None and stat is not None and rstat != stat:
            continue
        groups[(r.key(), rstat)][r.run_id].append(r)
    out = []
    for (key, rstat), runs in groups.items():
        points = sorted(
            (
                Point(run_id, min(r.ts for r in recs), float(np.median([r.value for r in recs])))
                for run_id, recs in runs.items()
            ),
            key=lambda p: (p.ts, p.run_id),
        )
        first = next(iter(runs.values()))[0]
        out.append(
            Series(
                first.device,
                first.model,
                first.runtime,
                first.probe,
                first.metric,
                rstat,
                key.series().param_dict(),
                first.unit,
                tuple(points),
            )
        )
    return sorted(out, key=lambda s: s.label())


def change_points(
    series: Series, alpha: float = DEFAULT_ALPHA, min_change: float = DEFAULT_MIN_CHANGE, seed: int = 0
) -> list[ChangePoint]:
    """The runs where the series stepped, with the median levels before and after each step."""
    values = [p.value for p in series.points]
    steps = detect_steps(values, alpha=alpha, min_change=min_change, seed=seed)
    bounds = [0] + [s.index for s in steps] + [len(values)]
    out = []
    for i, step in enumerate(steps):
        before = np.median(values[bounds[i] : step.index])
        after = np.median(values[step.index : bounds[i + 2]])
        change = float(after / before - 1) if before else math.inf
        pt, prev = series.points[step.index], series.points[step.index - 1]
        out.append(
            ChangePoint(pt.run_id, prev.run_id, pt.ts, float(before), float(after), change, step.p_value)
        )
    return out


def change_point_records(series: Series, points: Sequence[ChangePoint]) -> list[Record]:
    """Change points as records (probe `history`, metric `change_point`, value = relative step)."""
    return [
        Record(
            run_id=cp.run_id,
            device=series.device,
            probe="history",
            model=series.model,
            runtime=series.runtime,
            metric="change_point",
            value=cp.change if math.isfinite(cp.change) else None,
            unit="ratio",
            params={
                **series.params,
                "series_probe": series.probe,
                "series_metric": series.metric,
                "stat": series.stat,
                "before": cp.before,
                "after": cp.after,
                "level_unit": series.unit,
                "previous_run": cp.previous_run,
                "p_value": cp.p_value,
            },
            ts=cp.ts,
        )
        for cp in points
    ]


def load_series(
    store: Any,
    device: str,
    model: str,
    metric: str = "latency_ms",
    stat: str | None = "p50",
    probe: str | None = None,
    runtime: str | None = None,
) -> list[Series]:
    """The series of one device and model from an open Store; none found is a one-line UserError."""
    records = store.records(None, device=device, model=model, metric=metric, probe=probe, runtime=runtime)
    series = build_series(records, stat)
    if not series:
        what = f"device '{device}', model '{model}', metric '{metric}'" + (f" [{stat}]" if stat else "")
        raise UserError(f"no records for {what} in {store.path}")
    return series
