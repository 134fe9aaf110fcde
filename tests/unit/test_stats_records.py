"""Statistics refuse percentiles the data cannot support; argv quoting is the only command builder."""

from __future__ import annotations

import shlex

import numpy as np
import pytest

from edgebench.errors import UserError
from edgebench.jobs import Job
from edgebench.stats import MAD_TO_SIGMA, count_outliers, percentile_interval, samples_needed, summarize
from edgebench.transports.base import command_line


def test_a_tail_percentile_needs_samples_that_bound_its_interval() -> None:
    # p99 of 100 samples has no upper bound inside the samples (it reaches past the largest): refused.
    assert samples_needed(0.99) == 368 and samples_needed(0.90) == 36 and samples_needed(0.5) == 6
    s = summarize(list(np.linspace(1, 2, 367)))
    assert "p99" not in s.percentiles and "needs at least 368 samples" in s.refused["p99"]
    s = summarize(list(np.linspace(1, 2, 368)))
    assert s.percentiles["p99"] == pytest.approx(np.percentile(np.linspace(1, 2, 368), 99))
    notes = s.percentile_annotations("p99")
    assert notes["ci_low"] <= s.percentiles["p99"] <= notes["ci_high"] and notes["ci_level"] == 0.95


def test_the_median_is_always_given_but_flagged_uncertain_when_unbounded() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s.percentiles["p50"] == 3.0 and s.uncertain("p50")
    assert "needs 6 samples" in s.percentile_annotations("p50")["uncertain"]
    assert not summarize([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).uncertain("p50")


def test_order_statistic_intervals_cover_the_true_quantile() -> None:
    """Distribution-free: over many skewed samples the interval holds the true quantile >= 95% of the time."""
    rng = np.random.default_rng(3)
    for q, n in ((0.5, 40), (0.9, 120), (0.99, 500)):
        truth = -np.log(1 - q)  # exponential(1) quantile
        hits = 0
        for _ in range(400):
            iv = percentile_interval(np.sort(rng.exponential(size=n)), q)
            hits += iv.low <= truth <= iv.high
        assert hits / 400 >= 0.93, (q, n, hits)
        assert iv.coverage >= 0.95


def test_interval_ranks_and_coverage_match_scipy_stats_binomial() -> None:
    """The ranks come from scipy.special's binomial CDF (light to import); scipy.stats' binomial distribution
    is the reference: same ranks and the same exact coverage for every sample count and level."""
    from scipy import stats as sps

    for n in [*range(1, 50), 99, 100, 367, 368, 1000, 20000]:
        x = np.arange(n, dtype=float)
        for q in (0.5, 0.9, 0.99, 0.999):
            for level in (0.9, 0.95, 0.99):
                tail, b = (1 - level) / 2, sps.binom(n, q)
                k = int(b.ppf(tail)) - (1 if b.cdf(int(b.ppf(tail))) > tail else 0)
                low = k + 1 if k >= 0 else None
                high = int(b.ppf(1 - tail)) + 1
                high = high if high <= n else None
                coverage = (b.cdf(high - 1) if high else 1.0) - (b.cdf(low - 1) if low else 0.0)
                iv = percentile_interval(x, q, level)
                assert (iv.low_rank, iv.high_rank) == (low, high), (n, q, level)
                assert iv.coverage == pytest.approx(coverage, abs=1e-9), (n, q, level)


def test_summary_values() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0] * 20)
    assert s.n == 100 and s.min == 1.0 and s.max == 100.0
    assert s.percentiles["p50"] == 3.0
    assert s.outliers == 20


@pytest.mark.parametrize(("sigmas", "flagged"), [(9.0, 0), (11.0, 1), (12.0, 1)])
def test_outliers_are_ten_robust_sigmas_from_the_median(sigmas: float, flagged: int) -> None:
    # Median 100 and MAD 1 (one robust sigma is 1.4826) with the extra sample `sigmas` sigmas away.
    body = np.concatenate([np.full(26, 99.0), np.full(49, 100.0), np.full(26, 101.0)])
    x = np.append(body, 100.0 + sigmas * 1.4826)
    assert np.median(x) == 100.0 and np.median(np.abs(x - 100.0)) * MAD_TO_SIGMA == pytest.approx(1.4826)
    assert count_outliers(x) == flagged


@pytest.mark.parametrize("evil", ["a b", "x;rm -rf /", "$(touch /tmp/p)", "`id`", "it's", 'q"q', "new\nline"])
def test_command_line_quotes_every_argument(evil: str) -> None:
    line = command_line(["python3", evil], env={"LD_LIBRARY_PATH": "/a b;c"})
    assert shlex.split(line) == ["env", "LD_LIBRARY_PATH=/a b;c", "python3", evil]


def test_command_line_refuses_bad_env_names() -> None:
    with pytest.raises(UserError, match="invalid environment variable name 'A;B'"):  # one line, exit 2
        command_line(["true"], env={"A;B": "x"})


def test_job_key_is_stable_and_param_sensitive() -> None:
    a = Job("local", "bench", None, "onnxruntime", {"threads": 1, "runs": 10})
    b = Job("local", "bench", None, "onnxruntime", {"runs": 10, "threads": 1})
    c = Job("local", "bench", None, "onnxruntime", {"threads": 2, "runs": 10})
    assert a.key == b.key != c.key
