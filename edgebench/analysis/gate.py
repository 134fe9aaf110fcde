"""Regression gates: pair two runs' records, test each pair, give a verdict and an exit code.

A regression needs both (asv's rule)
  * magnitude: the change of the rule's statistic (ratio of candidate to baseline, e.g. of medians for
    p50) is over the threshold; when it is not but its one-sided (1 - alpha) upper bound reaches the
    threshold, the pair is NOISY (a threshold-sized change is not ruled out);
  * significance: a one-sided test that the candidate is worse, Benjamini-Hochberg corrected across all
    pairs of the gate (`scipy.stats.false_discovery_control`).

The unit of evidence is the invocation (a fresh agent process; `repeats = N` measures a configuration in
N of them): with >= 2 invocations per side the test is Welch's t on the log of each invocation's
statistic (analysis.invocations). With one invocation on either side only that invocation's samples are
left, which share its disturbance and are autocorrelated: they are tested (Mann-Whitney U for p50 and
mean, a permutation test of the statistic for tails, a bootstrap bound) but can never make a FAIL: the
pair is NOISY with the hint to repeat, or PASS when a threshold-sized change is ruled out. Then `guard`:
a change within the history's run-to-run spread (>= 4 earlier runs of the configuration in the store) is
not a FAIL, and a pair measured disturbed (analysis.disturbance) is NOISY with the evidence.

Verdicts: PASS, FAIL, NOISY (a threshold-sized change can neither be shown nor ruled out; carries a power
estimate of the samples per side that would settle it), INCOMPLETE (the rule cannot be evaluated: too few
samples for its statistic, or a rule the suite asks for pairs nothing), MISSING (in the baseline, not in
the candidate), IMPROVED (significantly better by at least the threshold). A gate never passes on what it
could not evaluate: its overall verdict is INCOMPLETE then (exit 1 with --strict).

A rule's statistic need not be stored: a bench with 97 samples has no p99 record, but its samples are
kept, so a p99 rule still pairs it (and finds it INCOMPLETE: p99 needs 100 samples per side).

Single-value metrics (peak memory, energy per inference, accuracy) have no samples: they are compared
with a plain threshold, and the verdict says so (method "threshold").

Everything here is pure except `collect_side` / `gate_runs`, which read a Store.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import UserError
from ..records import Record, Samples, params_as_recorded
from ..stats import MIN_SAMPLES_FOR_P90, MIN_SAMPLES_FOR_P99
from .disturbance import DEFAULT_MAX_WAIT, Thresholds, by_job
from .disturbance import PREFIX as DISTURBANCE_PREFIX
from .invocations import (
    MIN_INVOCATIONS,
    RECOMMENDED_INVOCATIONS,
    HistoryFloor,
    invocation_test,
    invocations_to_settle,
)

PASS, FAIL, NOISY, MISSING, IMPROVED = "PASS", "FAIL", "NOISY", "MISSING", "IMPROVED"
INCOMPLETE = "INCOMPLETE"
VERDICTS = (FAIL, INCOMPLETE, MISSING, NOISY, IMPROVED, PASS)

LOCATION_STATS = ("p50", "mean")
STAT_METRICS = ("latency_ms", "frame_latency_ms")  # metrics whose records carry a `stat` param
DEFAULT_STAT = "p50"


# ---- rules ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Threshold:
    """A limit on a change: relative (0.05 for "5%") or absolute (in the metric's unit)."""

    amount: float
    relative: bool

    def text(self, unit: str = "") -> str:
        if self.relative:
            return f"{self.amount * 100:g}%"
        return f"{self.amount:g}{' ' + unit if unit else ''}"


@dataclass(frozen=True)
class GateRule:
    """One gate: which records, which way is worse, how much change is allowed."""

    metric: str
    worse: str  # "higher" (slowdown / increase) or "lower" (drop)
    threshold: Threshold
    stat: str = DEFAULT_STAT  # used for records that carry a `stat` param
    probe: str | None = None
    device: str | None = None
    model: str | None = None
    min_delta: float = 0.0  # absolute change that never fails, whatever the ratio
    source: str = "default"
    kind: str = ""  # max_slowdown | max_increase | max_drop (for messages); derived when empty
    # A rule someone asked for (a suite's [[gate]]) must pair something, or the gate is INCOMPLETE; a
    # default rule applies where its metric was measured and is skipped elsewhere.
    required: bool = False
    replaces_defaults: bool = False  # `replace_defaults = true` in the suite: drop defaults of its metric

    def matches(self, key: PairKey) -> bool:
        for want, have in (
            (self.metric, key.metric),
            (self.probe, key.probe),
            (self.device, key.device),
            (self.model, key.model),
        ):
            if want is not None and want != have:
                return False
        return not key.stat or key.stat == self.stat

    def describe(self, unit: str = "") -> str:
        if self.kind == "placement":
            return "no op may move off the backend asked for"
        word = (self.kind or {"higher": "max_increase", "lower": "max_drop"}[self.worse]).replace("_", " ")
        return f"{word} {self.threshold.text(unit)}"

    def selection(self) -> str:
        """What the rule covers, as a user would write it: `latency_ms[p99] probe=bench model=enc`."""
        where = [
            f"{k}={v}" for k, v in (("probe", self.probe), ("device", self.device), ("model", self.model))
        ]
        stat = f"[{self.stat}]" if self.metric in STAT_METRICS or self.stat != DEFAULT_STAT else ""
        return " ".join([f"{self.metric}{stat}", *[w for w in where if not w.endswith("=None")]])

    def covers(self, other: GateRule) -> bool:
        """Everything `other` judges, this rule judges too: the same metric and stat, and each filter
        either open or the same (`latency_ms[p50]` covers `latency_ms[p50] probe=bench`)."""
        if (self.metric, self.stat) != (other.metric, other.stat):
            return False
        pairs = ((self.probe, other.probe), (self.device, other.device), (self.model, other.model))
        return all(mine is None or mine == theirs for mine, theirs in pairs)


def default_rules(max_slowdown: float = 0.05) -> list[GateRule]:
    """What `gate` checks without a suite: bench latency statistically, the rest by plain thresholds."""
    return [
        GateRule(
            "latency_ms",
            "higher",
            Threshold(max_slowdown, True),
            stat="p50",
            probe="bench",
            kind="max_slowdown",
        ),
        GateRule("peak_rss_mb", "higher", Threshold(0.10, True), min_delta=2.0),
        GateRule("energy_mj_per_inference", "higher", Threshold(0.10, True)),
        GateRule("cosine", "lower", Threshold(0.001, False)),
        GateRule("snr_db", "lower", Threshold(1.0, False)),
        GateRule("max_abs_err", "higher", Threshold(0.5, True), min_delta=1e-4),
        # an LLM's throughput, as any other figure: a drop past 10% (per context depth)
        GateRule("decode_tokens_per_s", "lower", Threshold(0.10, True), probe="decode"),
        GateRule("prefill_tokens_per_s", "lower", Threshold(0.10, True), probe="decode"),
    ]


def parse_percent(text: str, where: str) -> float:
    """ "5%" -> 0.05; anything else is a one-line UserError naming where it came from."""
    value = text.strip()
    if not value.endswith("%"):
        raise UserError(f"{where}: expected a percentage like 5%, got {text!r}")
    try:
        amount = float(value[:-1]) / 100.0
    except ValueError:
        raise UserError(f"{where}: expected a percentage like 5%, got {text!r}") from None
    if not math.isfinite(amount) or amount < 0:
        raise UserError(f"{where}: must be a non-negative percentage, got {text!r}")
    return amount


def merge_rules(
    defaults: Sequence[GateRule], overrides: Sequence[GateRule], max_slowdown: float | None = None
) -> list[GateRule]:
    """Suite rules add to the defaults. A default is dropped only when a suite rule covers all it covers
    (same metric and stat, filters open or equal: the suite sets that check's threshold), or when a suite
    rule on its metric says `replace_defaults = true`. --max-slowdown overrides the relative thresholds of
    every latency rule."""
    replaced = {r.metric for r in overrides if r.replaces_defaults}
    rules = [
        d for d in defaults if d.metric not in replaced and not any(o.covers(d) for o in overrides)
    ] + list(overrides)
    if max_slowdown is not None:
        rules = [
            replace(r, threshold=Threshold(max_slowdown, True))
            if r.worse == "higher" and r.metric == "latency_ms"
            else r
            for r in rules
        ]
    return rules


# ---- pairing -------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class PairKey:
    """What makes two records comparable across runs."""

    device: str
    model: str
    runtime: str
    probe: str
    metric: str
    stat: str
    params: str  # canonical JSON of the identity params

    def label(self) -> str:
        p = self.params if self.params != "{}" else ""
        stat = f"[{self.stat}]" if self.stat else ""
        return f"{self.device} {self.model} {self.runtime} {self.probe}:{self.metric}{stat} {p}".strip()

    def to_dict(self) -> dict[str, Any]:
        import json

        d = asdict(self)
        d["params"] = json.loads(self.params)
        return d


def record_key(r: Record | Samples, stat: str | None = None) -> PairKey:
    """The pair a record (or samples) belongs to: `Record.key()`, with its statistic held apart so that
    samples (which have none) pair with every statistic of their records."""
    key = r.key()
    series = key.series()
    st = stat if stat is not None else key.stat
    return PairKey(
        series.device, series.model, series.runtime, series.probe, series.metric, st, series.params
    )


@dataclass(frozen=True)
class Side:
    """One run's view of a pair: the stored value(s) and, when kept, the raw samples behind them, by
    invocation (each a fresh agent process), with what disturbed those invocations."""

    value: float
    unit: str
    samples: tuple[float, ...] | None = None  # every invocation's samples pooled
    n_records: int = 1
    invocations: tuple[tuple[float, ...], ...] = ()  # samples per invocation (empty: one, `samples`)
    disturbed: tuple[str, ...] = ()  # evidence per disturbed invocation ("others used 63% of the CPUs")

    def per_invocation(self) -> tuple[tuple[float, ...], ...]:
        """Samples by invocation; a side without invocation marks is one invocation."""
        if self.invocations:
            return self.invocations
        return (self.samples,) if self.samples else ()


def collect_side(
    records: Iterable[Record], samples: Iterable[Samples], max_wait: float = DEFAULT_MAX_WAIT
) -> dict[PairKey, Side]:
    """Group one run's records by pair key; attach the samples whose params equal the records' minus stat,
    kept apart by invocation (the `invocation` annotation of a repeated job), and the evidence of the
    invocations whose `disturbance_*` records pass `max_wait` (analysis.disturbance).

    Several records under one key (a repeated job) are summarised by their median; their samples pooled.
    A key whose every value is missing or not finite (NaN outputs, say) keeps a NaN value, so a candidate
    that lost its number fails rather than going missing.
    """
    records = list(records)
    by_inv: dict[PairKey, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        inv = int(s.annotations.get("invocation") or 0)
        by_inv[record_key(s, stat="")][inv] += [
            float(v) for v in s.values if v is not None and math.isfinite(v)
        ]
    disturbed = _disturbed(records, max_wait)
    values: dict[PairKey, list[float]] = defaultdict(list)
    units: dict[PairKey, str] = {}
    for r in records:
        if r.metric.startswith(DISTURBANCE_PREFIX):
            continue
        key = record_key(r)
        units[key] = r.unit
        if r.value is not None and math.isfinite(r.value):
            values[key].append(float(r.value))
    out = {}
    for key, unit in units.items():
        vals = values.get(key, [])
        series = replace(key, stat="")
        groups = [tuple(v) for _, v in sorted(by_inv.get(series, {}).items()) if v]
        raw = tuple(x for g in groups for x in g)
        value = float(np.median(vals)) if vals else math.nan
        kept = bool(raw and vals)
        out[key] = Side(
            value,
            unit,
            raw if kept else None,
            len(vals),
            tuple(groups) if kept and len(groups) > 1 else (),
            disturbed.get(series, ()),
        )
    return out


def _disturbed(records: Sequence[Record], max_wait: float) -> dict[PairKey, tuple[str, ...]]:
    """The evidence of each disturbed invocation, by the pair key (stat-less) of what it measured."""
    thresholds = Thresholds(max_wait)
    out: dict[PairKey, list[str]] = defaultdict(list)
    for (_, device, model, runtime, probe, params, inv), d in sorted(by_job(records).items()):
        why = thresholds.evidence(d)
        if why is None:
            continue
        where = f"invocation {inv}: " if inv else ""
        for metric in STAT_METRICS:
            out[PairKey(device, model, runtime, probe, metric, "", params)].append(where + why)
    return {k: tuple(v) for k, v in out.items()}


# ---- statistics (pure) ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateOptions:
    alpha: float = 0.01
    min_samples: int = 10
    power: float = 0.9  # for the NOISY samples estimate
    resamples: int = 2000  # bootstrap and permutation resamples
    seed: int = 0
    strict: bool = False
    max_wait: float = DEFAULT_MAX_WAIT  # beyond it (others' CPU share, run-queue wait) a job is disturbed


def stat_of(x: np.ndarray, stat: str, axis: int = -1) -> np.ndarray:
    """The rule's statistic along an axis: pNN (linear percentiles, as `stats.summarize`), mean, min, max."""
    if stat == "mean":
        return np.mean(x, axis=axis)
    if stat == "min":
        return np.min(x, axis=axis)
    if stat == "max":
        return np.max(x, axis=axis)
    if stat.startswith("p"):
        return np.percentile(x, float(stat[1:]), axis=axis)
    raise UserError(f"unknown statistic '{stat}' (use p50, p90, p99, mean, min or max)")


def check_stat(stat: str) -> None:
    if stat in ("mean", "min", "max"):
        return
    try:
        q = float(stat[1:]) if stat.startswith("p") else -1.0
    except ValueError:
        q = -1.0
    if not 0 <= q <= 100:
        raise UserError(f"unknown statistic '{stat}' (use p50, p90, p99, mean, min or max)")


def min_samples_for(stat: str, floor: int) -> int:
    """A percentile needs enough samples to exist at all (as the bench probe refuses p99 under 100)."""
    if stat.startswith("p") and stat != "p50":
        q = float(stat[1:])
        if q >= 99:
            return max(floor, MIN_SAMPLES_FOR_P99)
        if q >= 90:
            return max(floor, MIN_SAMPLES_FOR_P90)
    return floor


@dataclass(frozen=True)
class Effect:
    """A change expressed so that larger is worse, with its neutral point and the rule's limit."""

    relative: bool
    neutral: float  # 1 for ratios, 0 for differences
    limit: float  # the first value that is "over the threshold"
    better_limit: float  # mirror of limit on the better side (for IMPROVED)


def effect_frame(rule: GateRule) -> Effect:
    t = rule.threshold
    if t.relative:
        limit = 1 + t.amount if rule.worse == "higher" else 1 / (1 - t.amount)
        return Effect(True, 1.0, limit, 1 / limit)
    return Effect(False, 0.0, t.amount, -t.amount)


def worse_effect(base: float, cand: float, rule: GateRule) -> float:
    """Candidate vs baseline oriented so that > neutral is worse: a ratio (relative) or a difference."""
    if rule.threshold.relative:
        num, den = (cand, base) if rule.worse == "higher" else (base, cand)
        if den == 0:
            return 1.0 if num == 0 else (math.inf if num > 0 else -math.inf)
        return num / den
    return cand - base if rule.worse == "higher" else base - cand


@dataclass(frozen=True)
class SampleTest:
    """The raw result of testing one samples-backed pair (before the false-discovery correction)."""

    n_baseline: int
    n_candidate: int
    baseline_stat: float
    candidate_stat: float
    effect: float
    ci_low: float  # one-sided (1 - alpha) bounds, as a (1 - 2 alpha) two-sided interval
    ci_high: float
    p_worse: float
    p_better: float
    se_log: float  # bootstrap standard error of log effect (relative) or of the effect (absolute)
    method: str
    level: str = "sample"  # "invocation": n counts invocations and the test compares their statistics


def test_invocations(base: Side, cand: Side, rule: GateRule, opts: GateOptions) -> SampleTest:
    """One pair's significance and magnitude from each invocation's statistic (analysis.invocations)."""
    bstats = [float(stat_of(np.asarray(x, dtype=float), rule.stat)) for x in base.per_invocation()]
    cstats = [float(stat_of(np.asarray(x, dtype=float), rule.stat)) for x in cand.per_invocation()]
    t = invocation_test(bstats, cstats, rule.threshold.relative, rule.worse == "higher", opts.alpha)
    method = f"welch t on log {rule.stat} of {t.n_baseline} vs {t.n_candidate} invocations"
    return SampleTest(
        t.n_baseline,
        t.n_candidate,
        t.baseline,
        t.candidate,
        t.effect,
        t.ci_low,
        t.ci_high,
        t.p_worse,
        t.p_better,
        t.se,
        method if rule.threshold.relative else method.replace(" log", ""),
        level="invocation",
    )


def test_pair(
    base: Side, cand: Side, rule: GateRule, opts: GateOptions, rng: np.random.Generator
) -> SampleTest:
    """Invocation-level when both sides have >= 2 invocations; else within one invocation's samples (which
    `guard` never lets FAIL)."""
    if min(len(base.per_invocation()), len(cand.per_invocation())) >= MIN_INVOCATIONS:
        return test_invocations(base, cand, rule, opts)
    assert base.samples is not None and cand.samples is not None
    return test_samples(base.samples, cand.samples, rule, opts, rng)


def test_samples(
    base: Sequence[float], cand: Sequence[float], rule: GateRule, opts: GateOptions, rng: np.random.Generator
) -> SampleTest:
    """One pair's significance and magnitude from raw samples."""
    from scipy import stats as sps  # lazily: scipy costs a second of every CLI start

    b, c = np.asarray(base, dtype=float), np.asarray(cand, dtype=float)
    bstat, cstat = float(stat_of(b, rule.stat)), float(stat_of(c, rule.stat))
    eff = worse_effect(bstat, cstat, rule)
    worse_alt, better_alt = ("greater", "less") if rule.worse == "higher" else ("less", "greater")
    if np.ptp(np.r_[b, c]) == 0:  # every sample identical: nothing to test, nothing changed
        return SampleTest(b.size, c.size, bstat, cstat, eff, eff, eff, 1.0, 1.0, 0.0, "identical samples")
    if rule.stat in LOCATION_STATS:
        p_worse = float(sps.mannwhitneyu(c, b, alternative=worse_alt).pvalue)
        p_better = float(sps.mannwhitneyu(c, b, alternative=better_alt).pvalue)
        method = "mann-whitney u + bootstrap"
    else:
        p_worse, p_better = _permutation_pvalues(b, c, rule.stat, worse_alt, opts, rng)
        method = f"permutation ({rule.stat}) + bootstrap"
    low, high, se = _bootstrap_effect(b, c, rule, opts, rng)
    return SampleTest(b.size, c.size, bstat, cstat, eff, low, high, p_worse, p_better, se, method)


def _batch(b: np.ndarray, c: np.ndarray) -> int:
    """Resamples per vectorised call: keeps memory near 32 MB however long the benches ran."""
    return max(1, 4_000_000 // (b.size + c.size))


def _permutation_pvalues(
    b: np.ndarray, c: np.ndarray, stat: str, worse_alt: str, opts: GateOptions, rng: np.random.Generator
) -> tuple[float, float]:
    from scipy import stats as sps  # lazily: scipy costs a second of every CLI start

    def diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return stat_of(y, stat, axis) - stat_of(x, stat, axis)

    res = sps.permutation_test(
        (b, c),
        diff,
        permutation_type="independent",
        alternative="two-sided",
        n_resamples=opts.resamples,
        vectorized=True,
        batch=_batch(b, c),
        rng=rng,
    )
    null = np.asarray(res.null_distribution)
    observed = float(res.statistic)
    # Both one-sided p-values from one null distribution (with the +1 that keeps them valid).
    greater = (np.sum(null >= observed) + 1) / (null.size + 1)
    less = (np.sum(null <= observed) + 1) / (null.size + 1)
    return (float(greater), float(less)) if worse_alt == "greater" else (float(less), float(greater))


def _bootstrap_effect(
    b: np.ndarray, c: np.ndarray, rule: GateRule, opts: GateOptions, rng: np.random.Generator
) -> tuple[float, float, float]:
    """Percentile-bootstrap (1 - 2 alpha) interval of the worse-oriented effect and its standard error."""
    from scipy import stats as sps  # lazily: scipy costs a second of every CLI start

    stat, relative, higher = rule.stat, rule.threshold.relative, rule.worse == "higher"

    def effect(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        bx, cy = stat_of(x, stat, axis), stat_of(y, stat, axis)
        if relative:
            with np.errstate(divide="ignore", invalid="ignore"):
                return cy / bx if higher else bx / cy
        return cy - bx if higher else bx - cy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples: the interval is then just wider
        res = sps.bootstrap(
            (b, c),
            effect,
            vectorized=True,
            paired=False,
            n_resamples=opts.resamples,
            confidence_level=1 - 2 * opts.alpha,
            method="percentile",
            batch=_batch(b, c),
            rng=rng,
        )
    dist = np.asarray(res.bootstrap_distribution, dtype=float)
    dist = dist[np.isfinite(dist)]
    if relative:
        dist = dist[dist > 0]
        se = float(np.std(np.log(dist), ddof=1)) if dist.size > 1 else math.inf
    else:
        se = float(np.std(dist, ddof=1)) if dist.size > 1 else math.inf
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return low, high, se


def samples_to_settle(test: SampleTest, effect: Effect, opts: GateOptions) -> int | None:
    """Power estimate: samples per side for a threshold-sized change to show at `opts.power`.

    Scales the bootstrap standard error of the observed effect with sqrt(1/n_b + 1/n_c); the detectable
    change at n per side is (z_{1-alpha} + z_{power}) * se(n). None when the noise is unmeasurable.
    """
    from scipy import stats as sps  # lazily: scipy costs a second of every CLI start

    if not math.isfinite(test.se_log) or test.se_log <= 0:
        return None
    delta = math.log(effect.limit) if effect.relative else effect.limit
    if delta <= 0:
        return None
    z = float(sps.norm.ppf(1 - opts.alpha) + sps.norm.ppf(opts.power))
    inv_now = 1 / test.n_baseline + 1 / test.n_candidate
    n = 2 * (z * test.se_log / delta) ** 2 / inv_now
    return max(int(math.ceil(n)), opts.min_samples, test.n_baseline, test.n_candidate)


# ---- verdicts ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairVerdict:
    """One pair's outcome, with the numbers behind it."""

    key: PairKey
    rule: GateRule
    verdict: str
    reason: str
    unit: str = ""
    baseline: float | None = None
    candidate: float | None = None
    change: float | None = None  # relative change (candidate/baseline - 1) or absolute difference
    ci_low: float | None = None  # bounds of `change`, in the same terms
    ci_high: float | None = None
    p_value: float | None = None
    q_value: float | None = None
    n_baseline: int = 0
    n_candidate: int = 0
    method: str = "-"
    samples_needed: int | None = None
    lab_failure: bool = False
    warnings: tuple[str, ...] = ()  # what the two runs' jobs warned of (outliers: a disturbed device)

    def change_text(self) -> str:
        if self.change is None:
            return "-"
        if self.rule.threshold.relative:
            text = f"{self.change * 100:+.2f}%"
            if self.ci_low is not None and self.ci_high is not None:
                text += f" [{self.ci_low * 100:+.2f}%, {self.ci_high * 100:+.2f}%]"
            return text
        text = f"{self.change:+.4g}"
        if self.ci_low is not None and self.ci_high is not None:
            text += f" [{self.ci_low:+.4g}, {self.ci_high:+.4g}]"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.key.to_dict(),
            "verdict": self.verdict,
            "reason": self.reason,
            "unit": self.unit,
            "baseline": _finite(self.baseline),
            "candidate": _finite(self.candidate),
            "change": _finite(self.change),
            "change_relative": self.rule.threshold.relative,
            "ci_low": _finite(self.ci_low),
            "ci_high": _finite(self.ci_high),
            "p_value": _finite(self.p_value),
            "q_value": _finite(self.q_value),
            "n_baseline": self.n_baseline,
            "n_candidate": self.n_candidate,
            "method": self.method,
            "samples_needed": self.samples_needed,
            "lab_failure": self.lab_failure,
            "warnings": list(self.warnings),
            "rule": {
                "metric": self.rule.metric,
                "stat": self.rule.stat,
                "probe": self.rule.probe,
                "worse": self.rule.worse,
                "threshold": self.rule.threshold.text(),
                "min_delta": self.rule.min_delta,
                "source": self.rule.source,
            },
        }


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


@dataclass(frozen=True)
class RuleReport:
    """What one rule covered: how many pairs and their verdicts; INCOMPLETE when it could not be
    evaluated (a required rule that paired nothing, or pairs it could not judge)."""

    rule: GateRule
    pairs: int
    counts: dict[str, int]
    status: str  # the rule's verdict: FAIL, INCOMPLETE, ... PASS; "n/a" for a default with nothing to judge
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule.selection(),
            "threshold": self.rule.describe(),
            "source": self.rule.source,
            "required": self.rule.required,
            "pairs": self.pairs,
            "counts": {k: n for k, n in self.counts.items() if n},
            "status": self.status,
            "note": self.note,
        }


NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class GateResult:
    baseline: str
    candidate: str
    verdicts: tuple[PairVerdict, ...]
    options: GateOptions = field(default_factory=GateOptions)
    unpaired_candidate: int = 0
    notes: tuple[str, ...] = ()
    rules: tuple[RuleReport, ...] = ()

    def counts(self) -> dict[str, int]:
        return {v: sum(1 for p in self.verdicts if p.verdict == v) for v in VERDICTS}

    @property
    def incomplete(self) -> bool:
        """Something asked for could not be evaluated, or nothing at all was compared."""
        return (
            not self.verdicts
            or self.counts()[INCOMPLETE] > 0
            or any(r.status == INCOMPLETE for r in self.rules)
        )

    @property
    def exit_code(self) -> int:
        """1 a regression (or, with strict, NOISY/MISSING/INCOMPLETE); 3 a lab failure left pairs
        unmeasured; else 0."""
        c = self.counts()
        if c[FAIL] or (self.options.strict and (c[NOISY] or c[MISSING] or self.incomplete)):
            return 1
        if any(v.lab_failure for v in self.verdicts):
            return 3
        return 0

    @property
    def overall(self) -> str:
        """FAIL, LAB FAILURE, INCOMPLETE (never PASS on what could not be evaluated) or PASS."""
        code = self.exit_code
        if code == 3:
            return "LAB FAILURE"
        if self.counts()[FAIL]:
            return FAIL
        if self.incomplete:
            return INCOMPLETE
        return FAIL if code == 1 else PASS

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "verdict": self.overall,
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "alpha": self.options.alpha,
            "strict": self.options.strict,
            "unpaired_candidate": self.unpaired_candidate,
            "notes": list(self.notes),
            "rules": [r.to_dict() for r in self.rules],
            "pairs": [v.to_dict() for v in self.verdicts],
        }


def _change_from_effect(e: float, rule: GateRule) -> float:
    """Worse-oriented effect -> the signed change users read (candidate relative to baseline)."""
    if rule.threshold.relative:
        ratio = e if rule.worse == "higher" else (1 / e if e != 0 else math.inf)
        return ratio - 1
    return e if rule.worse == "higher" else -e


def _change_bounds(low: float, high: float, rule: GateRule) -> tuple[float, float]:
    a, b = _change_from_effect(low, rule), _change_from_effect(high, rule)
    return (min(a, b), max(a, b))


def judge_single(key: PairKey, rule: GateRule, base: Side, cand: Side) -> PairVerdict:
    """A value without samples: a plain threshold (no test of significance is possible)."""
    eff = worse_effect(base.value, cand.value, rule)
    frame = effect_frame(rule)
    delta = abs(cand.value - base.value)
    common: dict[str, Any] = dict(
        unit=cand.unit,
        baseline=base.value,
        candidate=cand.value,
        change=_change_from_effect(eff, rule),
        n_baseline=1,
        n_candidate=1,
        method="threshold (single value, no samples)",
    )
    what = rule.describe(cand.unit)
    if eff > frame.limit and delta > rule.min_delta:
        return PairVerdict(key, rule, FAIL, f"over the {what}", **common)
    if eff < frame.better_limit and delta > rule.min_delta:
        return PairVerdict(key, rule, IMPROVED, f"better by more than the {what}", **common)
    return PairVerdict(key, rule, PASS, f"within the {what}", **common)


def judge_samples(
    key: PairKey,
    rule: GateRule,
    test: SampleTest,
    q_worse: float,
    q_better: float,
    unit: str,
    opts: GateOptions,
) -> PairVerdict:
    """Combine magnitude (bootstrap bound vs the limit) and significance (BH-corrected p) into a verdict."""
    frame = effect_frame(rule)
    low, high = _change_bounds(test.ci_low, test.ci_high, rule)
    common: dict[str, Any] = dict(
        unit=unit,
        baseline=test.baseline_stat,
        candidate=test.candidate_stat,
        change=_change_from_effect(test.effect, rule),
        ci_low=low,
        ci_high=high,
        p_value=test.p_worse,
        q_value=q_worse,
        n_baseline=test.n_baseline,
        n_candidate=test.n_candidate,
        method=test.method,
    )
    what = rule.describe(unit)
    delta = abs(test.candidate_stat - test.baseline_stat)
    worse_sig, better_sig = q_worse < opts.alpha, q_better < opts.alpha
    if worse_sig and test.effect >= frame.limit and delta > rule.min_delta:
        return PairVerdict(
            key, rule, FAIL, f"significantly worse (q={q_worse:.2g}) and over the {what}", **common
        )
    if better_sig or test.ci_high < frame.limit or delta <= rule.min_delta:
        if better_sig and test.effect <= frame.better_limit:
            return PairVerdict(
                key,
                rule,
                IMPROVED,
                f"significantly better (q={q_better:.2g}) by more than the {what}",
                **common,
            )
        why = (
            "a change of the threshold's size is ruled out" if test.ci_high < frame.limit else "within limits"
        )
        if worse_sig:
            why = f"significantly worse (q={q_worse:.2g}) but {why}"
        return PairVerdict(key, rule, PASS, why, **common)
    if test.level == "invocation":
        limit = math.log(frame.limit) if frame.relative else frame.limit
        need = invocations_to_settle(
            test.se_log, test.n_baseline, test.n_candidate, limit, opts.alpha, opts.power
        )
        what_n = "invocations (repeats)"
    else:
        need, what_n = samples_to_settle(test, frame, opts), "samples"
    more = "" if need is None else f"; ~{need} {what_n} per side would settle it at {opts.power:.0%} power"
    if worse_sig:
        return PairVerdict(
            key,
            rule,
            NOISY,
            f"significantly worse (q={q_worse:.2g}) but under the {what}, which the change may reach{more}",
            samples_needed=need,
            **common,
        )
    return PairVerdict(
        key,
        rule,
        NOISY,
        f"not significant, yet the change may reach the {what}{more}",
        samples_needed=need,
        **common,
    )


ONE_INVOCATION_HINT = f"one invocation per side: use repeats >= {RECOMMENDED_INVOCATIONS}"


def guard(
    v: PairVerdict, test: SampleTest, base: Side, cand: Side, floor: HistoryFloor | None
) -> PairVerdict:
    """What the samples cannot back is never a FAIL: one invocation per side (its samples share one
    invocation's disturbance), a change within the history's run-to-run spread, or a side measured
    disturbed (the pair is NOISY with the evidence; a candidate that passed although it alone was
    disturbed still passes, since a disturbance only slows)."""
    if test.level != "invocation":
        if v.verdict == FAIL:
            v = replace(v, verdict=NOISY, reason=f"looks worse ({v.reason}), but {ONE_INVOCATION_HINT}")
        elif v.verdict in (NOISY, IMPROVED):
            v = replace(v, reason=f"{v.reason}; {ONE_INVOCATION_HINT}")
    if floor is not None and v.rule.threshold.relative:
        within = test.effect > 0 and abs(math.log(test.effect)) <= floor.log_spread
        if v.verdict == FAIL and within:
            v = replace(v, verdict=NOISY, reason=f"{v.reason}, but within the history: {floor.text()}")
        else:
            v = replace(v, reason=f"{v.reason}; history: {floor.text()}")
    evidence = [f"baseline: {w}" for w in base.disturbed] + [f"candidate: {w}" for w in cand.disturbed]
    if evidence:
        shown = "; ".join(evidence[:3]) + (f"; +{len(evidence) - 3} more" if len(evidence) > 3 else "")
        if v.verdict in (FAIL, IMPROVED) or (v.verdict == PASS and base.disturbed):
            v = replace(v, verdict=NOISY, reason=f"measured disturbed ({shown}); without it: {v.reason}")
        else:
            v = replace(v, reason=f"{v.reason}; measured disturbed ({shown})")
    return v


def too_few(key: PairKey, rule: GateRule, base: Side, cand: Side, need: int) -> PairVerdict:
    nb, nc = len(base.samples or ()), len(cand.samples or ())
    return PairVerdict(
        key,
        rule,
        INCOMPLETE,
        f"cannot evaluate: too few samples ({nb} vs {nc}); {rule.stat} needs at least {need} per side",
        unit=cand.unit,
        baseline=base.value,
        candidate=cand.value,
        change=_change_from_effect(worse_effect(base.value, cand.value, rule), rule),
        n_baseline=nb,
        n_candidate=nc,
        method="-",
        samples_needed=need,
    )


@dataclass(frozen=True)
class JobFailure:
    """A candidate job that failed: the pairs it should have produced are explained by it."""

    device: str
    probe: str
    model: str
    runtime: str
    kind: str
    error: str

    def covers(self, key: PairKey) -> bool:
        return (self.device, self.probe, self.model, self.runtime) == (
            key.device,
            key.probe,
            key.model,
            key.runtime,
        )


def with_rule_stats(sides: dict[PairKey, Side], rules: Sequence[GateRule]) -> dict[PairKey, Side]:
    """Add the pairs a rule's statistic needs but no record holds, from the kept samples.

    A bench with fewer than 100 samples stores no p99 record; its samples still exist, so a p99 rule
    pairs it (and finds it INCOMPLETE for want of samples) instead of silently matching nothing.
    """
    out = dict(sides)
    for key, side in sides.items():
        if not key.stat or not side.samples:
            continue
        for rule in rules:
            wanted = replace(key, stat=rule.stat)
            if wanted in out or not rule.matches(wanted):
                continue
            values = np.asarray(side.samples, dtype=float)
            out[wanted] = replace(side, value=float(stat_of(values, rule.stat)), n_records=0)
    return out


def evaluate(
    baseline: dict[PairKey, Side],
    candidate: dict[PairKey, Side],
    rules: Sequence[GateRule],
    opts: GateOptions | None = None,
    candidate_failures: Sequence[JobFailure] = (),
    baseline_run: str = "baseline",
    candidate_run: str = "candidate",
    floors: Mapping[PairKey, HistoryFloor] | None = None,
) -> GateResult:
    """Judge every baseline pair some rule covers; pure given its inputs (seeded resampling).

    `floors`: each pair's run-to-run spread from the store's history (`gate_runs` reads it), if known."""
    from scipy import stats as sps  # lazily: scipy costs a second of every CLI start

    opts = opts or GateOptions()
    rng = np.random.default_rng(opts.seed)
    for rule in rules:
        check_stat(rule.stat)
    baseline = with_rule_stats(baseline, rules)
    candidate = with_rule_stats(candidate, rules)
    pending: list[tuple[PairKey, GateRule, SampleTest, Side, Side]] = []
    done: list[PairVerdict] = []
    for key in sorted(baseline):
        for rule in rules:
            if not rule.matches(key):
                continue
            base, cand = baseline[key], candidate.get(key)
            if math.isnan(base.value):
                continue  # nothing to compare against
            if cand is None:
                done.append(_missing(key, rule, base, candidate_failures))
            elif math.isnan(cand.value):
                done.append(
                    PairVerdict(
                        key,
                        rule,
                        FAIL,
                        "the candidate measured no finite value",
                        unit=base.unit,
                        baseline=base.value,
                        n_baseline=base.n_records,
                    )
                )
            elif base.samples is None or cand.samples is None:
                done.append(judge_single(key, rule, base, cand))
            else:
                need = min_samples_for(rule.stat, opts.min_samples)
                each = min(len(x) for x in (*base.per_invocation(), *cand.per_invocation()))
                if min(len(base.samples), len(cand.samples)) < need or each < min_samples_for(rule.stat, 1):
                    done.append(too_few(key, rule, base, cand, need))
                else:
                    pending.append((key, rule, test_pair(base, cand, rule, opts, rng), base, cand))
    if pending:
        q_worse = sps.false_discovery_control([t.p_worse for _, _, t, _, _ in pending], method="bh")
        q_better = sps.false_discovery_control([t.p_better for _, _, t, _, _ in pending], method="bh")
        floors = floors or {}
        done += [
            guard(
                judge_samples(k, r, t, float(qw), float(qb), c.unit, opts),
                t,
                b,
                c,
                floors.get(replace(k, stat=r.stat)),
            )
            for (k, r, t, b, c), qw, qb in zip(pending, q_worse, q_better, strict=True)
        ]
    unpaired = sum(1 for k in candidate if k not in baseline and any(r.matches(k) for r in rules))
    order = {v: i for i, v in enumerate(VERDICTS)}
    done.sort(key=lambda v: (order[v.verdict], v.key))
    reports = tuple(rule_report(r, done, candidate) for r in rules)
    notes = [] if done else ["no baseline record matches any gate rule: nothing was compared"]
    notes += [
        f"rule {r.rule.selection()} ({r.rule.source}): {r.note}" for r in reports if r.status == INCOMPLETE
    ]
    return GateResult(baseline_run, candidate_run, tuple(done), opts, unpaired, tuple(notes), reports)


def rule_report(
    rule: GateRule, verdicts: Sequence[PairVerdict], candidate: dict[PairKey, Side]
) -> RuleReport:
    """One rule's coverage and verdict, from the pairs it judged."""
    mine = [v for v in verdicts if v.rule == rule]
    counts = {k: sum(1 for v in mine if v.verdict == k) for k in VERDICTS}
    if not mine:
        seen = any(rule.matches(k) for k in candidate)
        why = "no baseline record matches it (the candidate has some)" if seen else "no record matches it"
        if rule.required:
            return RuleReport(rule, 0, counts, INCOMPLETE, f"cannot evaluate: {why}")
        return RuleReport(rule, 0, counts, NOT_APPLICABLE, why)
    status = next(k for k in VERDICTS if counts[k])
    note = f"{counts[INCOMPLETE]} of {len(mine)} pair(s) could not be evaluated" if counts[INCOMPLETE] else ""
    return RuleReport(rule, len(mine), counts, status, note)


def _missing(key: PairKey, rule: GateRule, base: Side, failures: Sequence[JobFailure]) -> PairVerdict:
    failure = next((f for f in failures if f.covers(key)), None)
    common: dict[str, Any] = dict(unit=base.unit, baseline=base.value)
    if failure is None:
        return PairVerdict(key, rule, MISSING, "in the baseline, not in the candidate", **common)
    if failure.kind == "lab":
        return PairVerdict(
            key, rule, MISSING, f"candidate job failed (lab): {failure.error}", lab_failure=True, **common
        )
    return PairVerdict(key, rule, FAIL, f"candidate job failed ({failure.kind}): {failure.error}", **common)


# ---- placement: where a backend's run ran ---------------------------------------------------------------

PLACEMENT_RULE = GateRule("placement", "lower", Threshold(0.0, False), kind="placement")


def on_backend_share(placement: Mapping[str, Any]) -> float | None:
    """The share of a run's ops that ran on the backend asked for (1.0: all of them), from its recorded
    placement; None where it is not known (no evidence, or units without op counts)."""
    asked, actual = placement.get("requested"), placement.get("actual")
    counts = placement.get("ops_by_unit") or {}
    if actual in (None, "unknown"):
        return None
    if counts and sum(counts.values()) > 0:
        return counts.get(asked, 0) / sum(counts.values())
    if "+" in str(actual):
        return None
    return 1.0 if actual == asked else 0.0


def placements_of(records: Iterable[Record]) -> dict[PairKey, Mapping[str, Any]]:
    """Each backend run's placement (a backend other than the CPU asked for), by its pair key with metric
    "placement" (one per series: its records all carry the run's)."""
    out: dict[PairKey, Mapping[str, Any]] = {}
    for r in records:
        placement = r.annotations.get("placement")
        if not placement or placement.get("requested") in (None, "cpu"):
            continue
        key = replace(record_key(r), metric="placement", stat="")
        out.setdefault(key, placement)
    return out


def placement_verdicts(base: Iterable[Record], cand: Iterable[Record]) -> list[PairVerdict]:
    """A change of where a backend's run ran, judged like a figure: FAIL when the candidate ran a smaller
    share of its ops on the backend asked for (ops fell back, or the whole model did), IMPROVED when a
    larger one, INCOMPLETE when either side's placement is unknown, PASS when the same. The values are the
    shares; the reason names the units and the ops that moved."""
    before, after = placements_of(base), placements_of(cand)
    out = []
    for key in sorted(before.keys() & after.keys()):
        old, new = before[key], after[key]
        a, b = on_backend_share(old), on_backend_share(new)
        moved = sorted(set(new.get("fallback_ops") or []) - set(old.get("fallback_ops") or []))
        said = f"ran on {old.get('actual')} ({_units(old)}), now on {new.get('actual')} ({_units(new)})"
        said += f"; ops now off {new.get('requested')}: {', '.join(moved[:8])}" if moved else ""
        if a is None or b is None:
            verdict, said = INCOMPLETE, f"where it ran is unknown on one side: {said}"
        elif b < a or (b == a and moved):
            verdict = FAIL
        else:
            verdict = IMPROVED if b > a else PASS
        change = None if a is None or b is None else b - a
        out.append(
            PairVerdict(
                key, PLACEMENT_RULE, verdict, said, "share", a, b, change, n_baseline=1, n_candidate=1
            )
        )
    return out


def _units(placement: Mapping[str, Any]) -> str:
    counts = placement.get("ops_by_unit") or {}
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))  # stored JSON keeps no order
    return ", ".join(f"{n} on {unit}" for unit, n in ordered) or "ops not counted"


# ---- store glue ----------------------------------------------------------------------------------------


def gate_runs(
    store: Any, baseline: str, candidate: str, rules: Sequence[GateRule], opts: GateOptions | None = None
) -> GateResult:
    """Read both runs from an open Store (unknown runs are a UserError) and evaluate them."""
    store.run(baseline)
    store.run(candidate)
    failures = [
        JobFailure(
            e["device"],
            e["probe"],
            e["model"] or "-",
            e["runtime"] or "-",
            e["kind"] or "internal",
            e["error"] or "",
        )
        for e in store.errors([candidate])
    ]
    opts = opts or GateOptions()
    base = collect_side(store.records([baseline]), store.samples([baseline]), opts.max_wait)
    cand = collect_side(store.records([candidate]), store.samples([candidate]), opts.max_wait)
    floors = history_floors(store, candidate, [k for k, s in base.items() if s.samples and k.stat])
    result = evaluate(base, cand, rules, opts, failures, baseline, candidate, floors)
    warned = {"baseline": store.jobs([baseline]), "candidate": store.jobs([candidate])}
    verdicts = tuple(
        replace(v, warnings=job_warnings(v.key, warned)) if v.verdict == FAIL else v for v in result.verdicts
    )
    placed = placement_verdicts(store.records([baseline]), store.records([candidate]))
    changed = fingerprint_changes(store.device_info([baseline]), store.device_info([candidate]))
    return replace(result, verdicts=verdicts + tuple(placed), notes=result.notes + tuple(changed))


def history_floors(store: Any, candidate: str, keys: Sequence[PairKey]) -> dict[PairKey, HistoryFloor]:
    """Each key's run-to-run spread over the stored runs made before the candidate (the baseline among
    them): one value per run (the median of its records under the key), oldest first, a floor once there
    are `invocations.MIN_HISTORY` of them. Analysis runs are no history: a gate or fit measures nothing,
    and a `confirm` run holds baseline and candidate models under one key."""
    from ..results.store import ANALYSIS_KINDS
    from .invocations import history_floor

    runs = {r.run_id: r for r in store.runs()}
    made = runs[candidate].created
    earlier = [
        rid
        for rid, r in runs.items()
        if r.kind not in ANALYSIS_KINDS and r.created < made and rid != candidate
    ]
    if not earlier or not keys:
        return {}
    wanted = set(keys)
    per_run: dict[PairKey, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for device, model, probe, metric in sorted({(k.device, k.model, k.probe, k.metric) for k in keys}):
        for r in store.records(earlier, device=device, model=None if model == "-" else model, probe=probe,
                               metric=metric):  # fmt: skip
            key = record_key(r)
            if key in wanted and r.value is not None and math.isfinite(r.value):
                per_run[key][r.run_id].append(float(r.value))
    out = {}
    for key, by_run in per_run.items():
        order = sorted(by_run, key=lambda rid: (runs[rid].created, rid))
        floor = history_floor([float(np.median(by_run[rid])) for rid in order])
        if floor is not None:
            out[key] = floor
    return out


# Words of the warnings that say a measurement was disturbed (outliers, a warm device, retries), as the
# bench probe, the cool-down guard and the session word them.
DISTURBANCE_WORDS = ("outlier", "disturb", "did not cool", "starts warm", "throttl", "transport error")


def job_warnings(
    key: PairKey, jobs: Mapping[str, Sequence[Mapping[str, Any]]], most: int = 3
) -> tuple[str, ...]:
    """The disturbance warnings stored with the jobs that measured a pair (outliers: the device was
    disturbed), by side, so a FAIL on a noisy host says so next to the numbers."""
    import json

    identity = json.loads(key.params)
    out = []
    for side, side_jobs in jobs.items():
        for j in side_jobs:
            # a job that named no runtime ran the device's default: its records name the one that ran
            same = (j["device"], j["probe"], j["model"] or "-") == (key.device, key.probe, key.model) and (
                j["runtime"] in (None, key.runtime)
            )
            params = j.get("params") or {}
            if not same or not params_as_recorded(params, identity):
                continue
            disturbed = [w for w in j.get("warnings") or [] if any(d in w.lower() for d in DISTURBANCE_WORDS)]
            out += [f"{side}: {w}" for w in disturbed[:most]]
    return tuple(dict.fromkeys(out))


FINGERPRINT_KEYS = ("kernel", "build", "cpu_model", "cores", "arch", "memory_mb", "governors", "runtimes")


def fingerprint_changes(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> list[str]:
    """What changed on a device between the runs (kernel, build, runtime versions ...): a slowdown's
    likely cause, said next to the verdicts (a note, never a verdict)."""
    old = {d["device"]: d.get("fingerprint") or {} for d in before}
    notes = []
    for d in after:
        prev, now = old.get(d["device"]), d.get("fingerprint") or {}
        if prev is None:
            continue
        for k in FINGERPRINT_KEYS:
            a, b = prev.get(k), now.get(k)
            if isinstance(a, dict) and isinstance(b, dict):
                notes += [
                    f"{d['device']}: {k}.{sub} changed from {a.get(sub)} to {b.get(sub)}"
                    for sub in sorted(set(a) | set(b))
                    if a.get(sub) != b.get(sub)
                ]
            elif a is not None and b is not None and a != b:
                notes.append(f"{d['device']}: {k} changed from {a} to {b}")
    return notes
