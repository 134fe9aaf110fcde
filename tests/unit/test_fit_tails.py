"""Tails that are honest: a p99 made of scheduler-tick steps makes the verdict "uncertain (tail disturbed)",
while a clean tail fits or does not fit on its own value. Seeded samples; then through `fit.assess` on
stored records with their kept samples."""

from __future__ import annotations

import numpy as np
import pytest

from edgebench.analysis import budgets as budget_defs
from edgebench.analysis import fit, fit_result
from edgebench.analysis.tails import check_tail, tick_of
from edgebench.records import Record, Samples


def steady(n: int = 400, median: float = 0.2, seed: int = 1) -> np.ndarray:
    """A steady model: ~0.2 ms with a few percent of spread."""
    rng = np.random.default_rng(seed)
    return median * (1 + 0.03 * rng.standard_normal(n))


def ticked(n: int = 400, share: float = 0.03, tick: float = 4.0, seed: int = 1) -> np.ndarray:
    """The same model on a device whose scheduler tick lands on `share` of the runs (~4 ms each)."""
    x = steady(n, seed=seed)
    rng = np.random.default_rng(seed + 100)
    hit = rng.choice(n, size=int(n * share), replace=False)
    x[hit] += tick * (1 + 0.05 * rng.standard_normal(hit.size))
    return x


def slow_tail(n: int = 400, seed: int = 1) -> np.ndarray:
    """A model whose own slow path is the tail: a smooth right skew, no step."""
    rng = np.random.default_rng(seed)
    return 2.0 + rng.gamma(2.0, 0.4, n)


def test_a_tick_dominated_p99_is_disturbed_with_its_evidence() -> None:
    check = check_tail(ticked(), "p99")
    assert check is not None and check.disturbed
    assert check.value > 3.5 and check.clean_value < 0.25
    assert check.tick_ms == 4.0 and 3.5 < check.step_ms < 4.5
    assert "scheduler tick" in check.evidence() and "without" in check.evidence()


def test_a_clean_tail_is_not_disturbed() -> None:
    for samples in (steady(), slow_tail()):
        check = check_tail(samples, "p99")
        assert check is not None and not check.disturbed, check
    assert check_tail(steady(), "p50") is None  # not a tail
    assert check_tail(steady(5), "p99") is None  # too few to tell


def test_tick_sizes() -> None:
    assert tick_of(4.1) == 4.0 and tick_of(8.2) == 4.0 and tick_of(10.5) == 10.0 and tick_of(1.1) == 1.0
    assert tick_of(5.5) is None and tick_of(15.0) is None


def stored(model: str, samples: np.ndarray, run_id: str = "r1") -> tuple[list[Record], list[Samples]]:
    """A bench's records and kept samples as the bench probe stores them."""
    params = {"threads": 1}
    stats = {
        "p50": np.percentile(samples, 50),
        "p90": np.percentile(samples, 90),
        "p99": np.percentile(samples, 99),
        "min": samples.min(),
        "max": samples.max(),
        "mean": samples.mean(),
    }
    records = [
        Record(
            run_id,
            "phone",
            "bench",
            model,
            "onnxruntime",
            "latency_ms",
            float(v),
            "ms",
            {**params, "stat": s},
        )
        for s, v in stats.items()
    ]
    kept = Samples(run_id, "phone", "bench", model, "onnxruntime", "latency_ms", "ms", tuple(samples), params)
    return records, [kept]


@pytest.mark.parametrize(
    ("samples", "budget", "verdict"),
    [
        (steady(), 1.5, fit_result.FITS),  # clean tail under the budget
        (slow_tail(), 1.5, fit_result.NO_FIT),  # clean tail over the budget: the model's own
        (
            ticked(),
            1.5,
            fit_result.UNCERTAIN,
        ),  # 4 ms ticks over a 0.2 ms model: over with them, under without
        (ticked(), 6.0, fit_result.FITS),  # fits even with the ticks: the same either way
    ],
)
def test_fit_on_stored_records(samples: np.ndarray, budget: float, verdict: str) -> None:
    records, kept = stored("m", samples)
    result = fit.assess(records, budget_defs.parse_budgets([f"latency_p99_ms={budget}"]), samples=kept)
    [v] = result.verdicts
    assert v.verdict == verdict, v.why
    if verdict == fit_result.UNCERTAIN:
        assert "uncertain (tail disturbed)" in v.why and "scheduler tick" in v.why
        [rec] = [r for r in result.to_records("f") if r.metric == "fits"]
        assert rec.annotations["tails"]["p99"]["tick_ms"] == 4.0
    if budget == 6.0:
        assert "the same either way" in v.why


def test_two_nights_do_not_flip() -> None:
    """The issue's case: the same int8 model on two nights, ticks on a different share of runs: never
    "fits" one night and "does not fit" the next."""
    verdicts = set()
    for seed, share in ((1, 0.02), (2, 0.06)):
        records, kept = stored("int8", ticked(share=share, seed=seed))
        [v] = fit.assess(records, budget_defs.parse_budgets(["latency_p99_ms=0.5"]), samples=kept).verdicts
        verdicts.add(v.verdict)
    assert verdicts == {fit_result.UNCERTAIN}


def test_a_disturbed_tail_cites_the_jobs_measured_disturbance() -> None:
    """The `disturbance_*` records a bench job stored reach the tail's evidence (the worst invocation's)."""
    records, kept = stored("m", ticked())
    records += [
        Record(
            "r1",
            "phone",
            "bench",
            "m",
            "onnxruntime",
            "disturbance_others_cpu_share",
            share,
            "",
            {"threads": 1},
        )
        for share in (0.1, 0.6)
    ]
    result = fit.assess(records, budget_defs.parse_budgets(["latency_p99_ms=1.5"]), samples=kept)
    [v] = result.verdicts
    assert v.verdict == fit_result.UNCERTAIN and v.tails["p99"].measured == {"others_cpu_share": 0.6}
