"""`fit` answers the question: --model and --device select the row asked about; a prediction is "fits"
only when its whole prediction interval is under the budget ("uncertain" when the interval spans it, or
when cross-validation cannot bound it); value / limit ratios instead of -3530% margins; the exit code is
the verdict, so `fit` can gate a release."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgebench.analysis import budgets as budget_defs
from edgebench.analysis import fit, fit_result
from edgebench.records import Record
from edgebench.results.store import Store


def synthetic(n: int, seed: int = 0) -> list[tuple[str, float, float]]:
    """(name, FLOPs, weight bytes) of n models spread over two decades of each."""
    rng = np.random.default_rng(seed)
    return [(f"m{i}", 10 ** rng.uniform(7, 9), 10 ** rng.uniform(5.5, 7.5)) for i in range(n)]


def truth_ms(flops: float, weight_bytes: float) -> float:
    """The synthetic device: 20 GFLOP/s and 5 GB/s, both paid, plus 0.05 ms of overhead."""
    return flops / 20e9 * 1e3 + weight_bytes / 5e9 * 1e3 + 0.05


def lab_records(models, noise: float, device: str = "phone", skip=(), seed: int = 1) -> list[Record]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    out = []
    for name, flops, wb in models:
        out += [
            Record("r0", device, "roofline", name, None, "flops", flops, "FLOP", {}),
            Record("r0", device, "roofline", name, None, "weight_bytes", wb, "B", {}),
        ]
        if name in skip:
            continue
        p50 = truth_ms(flops, wb) * float(np.exp(noise * rng.standard_normal()))
        for stat, k in (
            ("min", 0.97),
            ("p50", 1.0),
            ("p90", 1.05),
            ("p99", 1.2),
            ("mean", 1.02),
            ("max", 1.3),
        ):
            out.append(
                Record(
                    "r1",
                    device,
                    "bench",
                    name,
                    "onnxruntime",
                    "latency_ms",
                    p50 * k,
                    "ms",
                    {"threads": 1, "stat": stat},
                )
            )
        out.append(
            Record(
                "r1", device, "bench", name, "onnxruntime", "peak_rss_mb", 40 + wb / 1e6, "MB", {"threads": 1}
            )
        )
    return out


MODELS = synthetic(24)
HELD = "m3"


def predicted(noise: float, limit_factor: float, n_models: int = 24):  # type: ignore[no-untyped-def]
    models = MODELS[:n_models]
    name, flops, wb = next(m for m in models if m[0] == HELD)
    budget = budget_defs.parse_budgets([f"latency_p50_ms={truth_ms(flops, wb) * limit_factor}"])
    result = fit.assess(lab_records(models, noise, skip=(HELD,)), budget)
    return next(v for v in result.verdicts if v.model == HELD), result


def test_a_quiet_device_bounds_the_prediction_and_answers() -> None:
    fits, _ = predicted(noise=0.02, limit_factor=1.3)
    assert fits.basis == "predicted" and fits.verdict == fit_result.FITS and fits.fits is True
    lo, hi = fits.intervals["latency_p50_ms"]
    assert lo < fits.values["latency_p50_ms"] < hi < fits.values["latency_p50_ms"] * 1.3
    over, _ = predicted(noise=0.02, limit_factor=0.7)
    assert (
        over.verdict == fit_result.NO_FIT
        and over.fits is False
        and over.ratio == pytest.approx(1 / 0.7, rel=0.1)
    )


def test_a_noisy_device_makes_the_same_prediction_uncertain() -> None:
    """30% noise: cross-validation finds few held-out pairs within +-10%, so a prediction under the
    budget is not called a fit when the budget is 15% over the truth; on a quiet device it is."""
    quiet, _ = predicted(noise=0.02, limit_factor=1.15)
    assert quiet.verdict == fit_result.FITS
    v, result = predicted(noise=0.3, limit_factor=1.15)
    cv = next(
        s
        for s in result.cv_summaries()
        if s.device == "phone" and s.holdout == "model" and s.quantity == "latency_p50_ms"
    )
    assert cv.within < 0.5
    name, flops, wb = next(m for m in MODELS if m[0] == HELD)
    limit = truth_ms(flops, wb) * 1.15  # the budget predicted() set, from the synthetic device's truth
    assert v.values["latency_p50_ms"] < limit  # a point prediction under the limit...
    lo, hi = v.intervals["latency_p50_ms"]
    assert lo < limit < hi  # ...whose interval spans it
    assert v.verdict == fit_result.UNCERTAIN and v.fits is None and "spans the limit" in v.why


def test_too_few_measured_models_give_no_interval_and_no_fit() -> None:
    v, _ = predicted(noise=0.02, limit_factor=3.0, n_models=6)
    assert v.basis == "predicted" and v.verdict == fit_result.UNCERTAIN
    assert "no prediction interval" in v.why and "needs 9" in v.why


def test_prediction_interval_is_the_conformal_order_statistic() -> None:
    cv = [
        fit_result.CvPoint("d", "ort", f"m{i}", "model", "latency_p50_ms", 1.0 + i / 100, 1.0)
        for i in range(19)
    ]
    lo, hi, n = fit.prediction_interval(cv, "d", "ort", "latency_p50_ms", ("model",))
    assert n == 19 and lo == pytest.approx(1.01) and hi == pytest.approx(1.17)  # 2nd smallest, 18th
    assert fit.prediction_interval(cv[:8], "d", "ort", "latency_p50_ms", ("model",))[:2] == (None, None)
    # Coverage, counted: a new ratio from the same distribution falls inside at least 80% of the time.
    rng = np.random.default_rng(0)
    inside = 0
    for _ in range(2000):
        r = np.exp(rng.normal(0, 0.2, 20))
        pts = [fit_result.CvPoint("d", None, "m", "model", "q", float(x), 1.0) for x in r[:19]]
        a, b, _ = fit.prediction_interval(pts, "d", None, "q", ("model",))
        inside += a <= r[19] <= b
    assert 0.78 <= inside / 2000 <= 0.9


def test_ratios_are_sane_where_margins_read_minus_3530_percent() -> None:
    records = lab_records(MODELS[:3], 0.0)
    name = MODELS[0][0]
    p99 = next(r.value for r in records if r.model == name and r.params.get("stat") == "p99")
    budgets = budget_defs.parse_budgets([f"latency_p99_ms={p99 / 36.3}"])
    v = next(v for v in fit.assess(records, budgets).verdicts if v.model == name)
    assert v.margin == pytest.approx(-35.3, rel=1e-3)  # what the report used to print as -3530%
    assert v.ratio == pytest.approx(36.3) and v.verdict == fit_result.NO_FIT and "36x the budget" in v.why
    from edgebench.cli.report import ratio_text

    assert ratio_text(v.ratio) == "36x budget" and ratio_text(0.62) == "0.62x budget"


def _store(path: Path, records: list[Record]) -> None:
    with Store(path) as st:
        st.import_records("20261201T000000Z-aaaaaa", records, kind="bench")


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from edgebench.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_model_and_device_select_and_the_exit_code_is_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "lab.db"
    _store(db, lab_records(MODELS, 0.02, "phone", skip=(HELD,)) + lab_records(MODELS, 0.02, "board", seed=2))
    name, flops, wb = next(m for m in MODELS if m[0] == HELD)
    limit = truth_ms(flops, wb)
    base = ["fit", "--store", str(db), "--no-store", "--json"]
    code, out, _ = run_cli(
        [*base, "--model", HELD, "--device", "phone", "--budget", f"latency_p50_ms={limit * 1.3}"], capsys
    )
    rows = [r for r in json.loads(out)["records"] if r["metric"] == "fits"]
    assert [(r["device"], r["model"]) for r in rows] == [("phone", HELD)]  # one of 48 pairs: the one asked
    assert rows[0]["annotations"]["basis"] == "predicted" and rows[0]["annotations"]["verdict"] == "fits"
    assert code == 0
    code, out, _ = run_cli(
        [*base, "--model", HELD, "--device", "phone", "--budget", f"latency_p50_ms={limit * 0.6}"], capsys
    )
    assert code == 1 and json.loads(out)["exit_code"] == 1
    # At the limit itself the interval spans it: uncertain, which fails only with --strict.
    at = [*base, "--model", HELD, "--device", "phone", "--budget", f"latency_p50_ms={limit}"]
    code, out, _ = run_cli(at, capsys)
    verdict = next(r for r in json.loads(out)["records"] if r["metric"] == "fits")["annotations"]["verdict"]
    assert verdict == "uncertain" and code == 0
    assert run_cli([*at, "--strict"], capsys)[0] == 1
    code, out, err = run_cli(["fit", "--store", str(db), "--no-store", "--model", "nope"], capsys)
    assert code == 2 and "--model nope: neither a model measured" in err
    code, out, _ = run_cli(
        [
            "fit",
            "--store",
            str(db),
            "--no-store",
            "--model",
            HELD,
            "--budget",
            f"latency_p50_ms={limit * 1.3}",
        ],
        capsys,
    )
    assert "fits" in out and "x budget" in out and "%" not in out.split("why")[0]
