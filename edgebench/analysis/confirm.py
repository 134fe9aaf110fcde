"""The paired decision of `gate --confirm`: baseline (A) and candidate (B) measured alternately, A B then
B A, one invocation each, and judged on the pairs.

Each pair gives one worse-oriented change e_i (log(B/A) for a slowdown rule, log(A/B) for a drop rule,
B - A or A - B for absolute thresholds): drift and a neighbour that come and go hit both sides of a pair
alike, so they cancel, and the invocation (a fresh agent process), not the sample, is the unit of evidence.

  * location: the Hodges-Lehmann estimate (median of the Walsh averages (e_i + e_j) / 2, i <= j), the
    estimate that goes with the signed-rank test;
  * interval: its exact distribution-free bounds from the Walsh averages and the null distribution of the
    signed-rank statistic, each one-sided at level 1 - a, a = alpha / looks (together a 1 - 2a interval:
    99% at the default alpha 0.01 and two looks);
  * test: Wilcoxon's signed-rank test that B is worse (`scipy.stats.wilcoxon`), reported as p.

Verdict: FAIL when the whole interval lies beyond the rule's limit (e.g. every ratio it admits is over
1.05 for a 5% rule), PASS when it lies within (IMPROVED when beyond the limit on the better side), else
more pairs are needed; at the budget that is NOISY, never a guess.

Looks: the pairs are judged at a few fixed pair counts (`look_schedule`), not after every pair, and alpha
is split evenly among the looks scheduled (Bonferroni): stopping at the first conclusive look of many, each
at alpha, fails a candidate exactly at the limit far more often than alpha (2.8% instead of 1% at alpha
0.01 with a look after each of pairs 5-20). Two looks: the first as early as the exact test can reach
alpha / 2, the second at the budget's last pair. A look the time budget forces before the next scheduled
one takes that one's place, so the looks never outnumber the schedule.

Minimum pairs: with n pairs the smallest one-sided signed-rank p-value is 2^-n, so a bound at level
1 - a exists only when 2^-n <= a: 7 pairs for one look at alpha 0.01 (2^-7 = 0.0078; 6 give 0.0156), 8
for the first of two (0.005 each), 5 for one look at 0.05. Fewer pairs can never be conclusive
(`min_pairs_for`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .gate import FAIL, IMPROVED, NOISY, PASS, GateRule, effect_frame, worse_effect

LOOKS = 2  # judged at most this often: an early look for clear cases, then the budget's last pair


def min_pairs_for(alpha: float, looks: int = 1) -> int:
    """The fewest pairs whose signed-rank test can reach `alpha / looks` one-sided: 2^-n <= alpha / looks
    (7 for one look at 0.01, 8 for two)."""
    return max(1, math.ceil(math.log2(looks / alpha) - 1e-12))


@dataclass(frozen=True)
class Looks:
    """When the pairs are judged (pair counts, increasing) and the family alpha split evenly among them."""

    pairs: tuple[int, ...]
    alpha: float

    @property
    def each(self) -> float:
        """The level of each look: alpha / looks (Bonferroni)."""
        return self.alpha / max(len(self.pairs), 1)

    def text(self) -> str:
        """`judged at 8 and 20 pairs (alpha 0.005 each)`."""
        at = " and ".join(str(n) for n in self.pairs)
        return f"judged at {at} pairs (alpha {self.each:.2g} each)"


def look_schedule(alpha: float, max_pairs: int, most: int = LOOKS) -> Looks:
    """Up to `most` looks, evenly spaced from the first pair count at which the exact test can reach
    alpha / looks to `max_pairs`; fewer where the budget is too small for them, none (no pairs) when even
    one look at alpha cannot conclude (`max_pairs < min_pairs_for(alpha)`)."""
    for k in range(max(most, 1), 0, -1):
        first = min_pairs_for(alpha, k)
        if k == 1:
            return Looks((max_pairs,) if max_pairs >= first else (), alpha)
        if max_pairs - first >= k - 1:  # evenly spaced looks at least one pair apart
            step = (max_pairs - first) / (k - 1)
            return Looks(tuple(round(first + i * step) for i in range(k)), alpha)
    raise AssertionError("unreachable")


def signed_rank_cdf(n: int) -> np.ndarray:
    """P(T+ <= t) for t = 0 .. n(n+1)/2 under the null (no ties): the exact distribution of the
    signed-rank statistic, by counting the subsets of ranks 1..n with each sum."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for r in range(1, n + 1):
        counts[r:] = counts[r:] + counts[:-r].copy()
    return np.cumsum(counts) / 2.0**n


def walsh_averages(e: np.ndarray) -> np.ndarray:
    """All (e_i + e_j) / 2 for i <= j, sorted."""
    i, j = np.triu_indices(len(e))
    return np.sort((e[i] + e[j]) / 2.0)


def hodges_lehmann(e: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """(estimate, lower, upper): the pseudo-median and its one-sided (1 - alpha) bounds; -inf/+inf when
    n is too small for that level (see `min_pairs_for`)."""
    walsh = walsh_averages(e)
    cdf = signed_rank_cdf(len(e))
    # The lower bound is the k-th Walsh average, k the largest with P(T+ <= k - 1) <= alpha: the bound
    # misses the true value exactly when T+ (of e - true value) >= M - k + 1, which has that probability.
    ok = np.nonzero(cdf <= alpha + 1e-12)[0]
    estimate = float(np.median(walsh))
    if ok.size == 0:
        return estimate, -math.inf, math.inf
    k = int(ok[-1]) + 1
    return estimate, float(walsh[k - 1]), float(walsh[len(walsh) - k])


@dataclass(frozen=True)
class PairedDecision:
    """What the alternated pairs say about one gated pair: a verdict ("" while more pairs are needed), the
    change (candidate relative to baseline, as the gate reports it) with its interval, and p."""

    verdict: str
    reason: str
    n_pairs: int
    baseline: float  # median over the baseline's invocations
    candidate: float
    change: float  # ratio - 1 (relative rules) or a difference in the metric's unit
    ci_low: float | None  # None: too few pairs for any bound at this alpha
    ci_high: float | None
    p_worse: float | None  # signed-rank, one-sided: the candidate is worse
    confidence: float  # of the two-sided interval: 1 - 2 alpha
    relative: bool

    @property
    def conclusive(self) -> bool:
        return self.verdict in (FAIL, PASS, IMPROVED)

    def ratio_text(self) -> str:
        """`HL ratio 1.98 [1.91, 2.05] (99% CI)` or the difference's equivalent."""
        if self.relative:
            text = f"HL ratio {1 + self.change:.3g}"
            if self.ci_low is not None and self.ci_high is not None:
                text += f" [{1 + self.ci_low:.3g}, {1 + self.ci_high:.3g}]"
        else:
            text = f"HL change {self.change:+.4g}"
            if self.ci_low is not None and self.ci_high is not None:
                text += f" [{self.ci_low:+.4g}, {self.ci_high:+.4g}]"
        return f"{text} ({self.confidence:.0%} CI)"

    def evidence(self) -> str:
        p = "-" if self.p_worse is None else f"{self.p_worse:.2g}"
        return f"{self.n_pairs} alternated pairs, {self.ratio_text()}, p={p}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict or NOISY,
            "reason": self.reason,
            "pairs": self.n_pairs,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "change": self.change,
            "ratio": 1 + self.change if self.relative else None,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "confidence": self.confidence,
            "p_value": self.p_worse,
        }


def _effects(baseline: np.ndarray, candidate: np.ndarray, rule: GateRule) -> np.ndarray:
    """Worse-oriented change of each pair: log ratios for relative rules, differences otherwise."""
    e = np.array([worse_effect(float(a), float(b), rule) for a, b in zip(baseline, candidate, strict=True)])
    return np.log(e) if rule.threshold.relative else e


def _user_change(effect: float, rule: GateRule) -> float:
    """A worse-oriented effect (log ratio or difference) as the change users read: candidate vs baseline."""
    if rule.threshold.relative:
        return math.exp(effect if rule.worse == "higher" else -effect) - 1
    return effect if rule.worse == "higher" else -effect


def decide(
    baseline: Sequence[float],
    candidate: Sequence[float],
    rule: GateRule,
    alpha: float,
    final: bool = False,
    looks: int = 1,
) -> PairedDecision:
    """Judge alternated pairs (baseline[i], candidate[i]) against the rule at level alpha / looks (one of
    `looks` scheduled looks sharing alpha); `final`: no more pairs will come, so an open question is NOISY
    instead of "" (more pairs)."""
    from scipy import stats as sps  # lazily: scipy costs a second of every CLI start

    family, alpha = alpha, alpha / looks
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(candidate, dtype=float)
    if len(a) != len(b) or len(a) == 0:
        raise ValueError("decide: needs as many baseline as candidate values, at least one")
    frame = effect_frame(rule)
    relative = rule.threshold.relative
    if relative and (np.any(a <= 0) or np.any(b <= 0) or not np.all(np.isfinite(a * b))):
        raise ValueError("decide: a relative rule needs positive finite values")
    e = _effects(a, b, rule)
    estimate, low, high = hodges_lehmann(e, alpha)
    limit = math.log(frame.limit) if relative else frame.limit
    better = math.log(frame.better_limit) if relative else frame.better_limit
    p = float(sps.wilcoxon(e, alternative="greater").pvalue) if np.any(e != 0) else 1.0
    bounds = sorted((_user_change(low, rule), _user_change(high, rule))) if math.isfinite(low) else None
    common: dict[str, Any] = dict(
        n_pairs=len(e),
        baseline=float(np.median(a)),
        candidate=float(np.median(b)),
        change=_user_change(estimate, rule),
        ci_low=bounds[0] if bounds else None,
        ci_high=bounds[1] if bounds else None,
        p_worse=p,
        confidence=1 - 2 * alpha,
        relative=relative,
    )
    what = rule.describe()
    small = rule.min_delta > 0 and abs(float(np.median(b)) - float(np.median(a))) <= rule.min_delta
    if bounds is None:
        need = min_pairs_for(alpha)
        level = f"alpha {alpha:.2g}" + (f", {family:g} over {looks} looks," if looks > 1 else "")
        why = f"{len(e)} pairs cannot reach {level} (the signed-rank test needs at least {need})"
        return PairedDecision(NOISY if final else "", why, **common)
    if low > limit and not small:
        return PairedDecision(FAIL, f"confirmed: the whole interval is over the {what}", **common)
    if high < better and not small:
        return PairedDecision(IMPROVED, f"confirmed: better by more than the {what}", **common)
    if high < limit or small:
        why = f"absolute change within min_delta {rule.min_delta:g}" if small else f"within the {what}"
        return PairedDecision(PASS, f"confirmed: {why}", **common)
    why = f"the interval straddles the {what}"
    if final:
        return PairedDecision(NOISY, f"not settled by the pairs measured: {why}", **common)
    return PairedDecision("", why, **common)
