"""A held-out share from too few models is not shown as a figure: fit's records say it was not judged and
what gives enough, and the report (html and markdown) says "too few models to judge" with that step."""

from __future__ import annotations

import sys
from pathlib import Path

from edgebench.analysis import fit_result
from edgebench.analysis.fit_result import KERNEL_PREDICTOR, CvPoint, FitResult
from edgebench.render.report import render

sys.path.insert(0, str(Path(__file__).parent))
from test_report import make_data


def _result(kernel_models: int, whole_models: int) -> FitResult:
    """Held-out points, every one 30% off (a 0% share), over the given numbers of models."""
    kernel = [
        CvPoint("pc", "onnxruntime", f"k{i}", "model", "latency_p50_ms", 1.0, 1.3, KERNEL_PREDICTOR, "{}", 1)
        for i in range(kernel_models)
    ]
    whole = [
        fit_result.CvPoint("pc", "onnxruntime", f"m{i}", "model", "latency_p50_ms", 1.0, 1.3)
        for i in range(whole_models)
    ]
    return FitResult(budgets=(), cv=whole + kernel)


def _section(page: str) -> str:
    part = page[page.index('id="prediction"') :]
    return part[: part.index("</section>")]


def test_thin_shares_say_too_few_models_to_judge() -> None:
    result = _result(
        kernel_models=fit_result.MIN_JUDGED_KERNEL_MODELS - 1, whole_models=fit_result.MIN_JUDGED_MODELS - 1
    )
    recs = result.to_records("fit1")
    shares = [r for r in recs if r.metric == "cv_within_10pct"]
    assert shares and all(r.annotations["judged"] is False for r in shares)
    kernel = next(
        r for r in shares if r.params.get("predictor") == fit_result.KERNEL_PREDICTOR and r.device == "pc"
    )
    assert kernel.annotations["models"] == 4 and kernel.annotations["models_needed"] == 5
    assert "edgebench profile MODEL.onnx --device pc --threads 1" in kernel.annotations["next_step"]
    section = _section(render(make_data(recs, runs=("fit1",)), "html"))
    assert (
        'data-kpi="cv-kernel-latency_p50_ms"' in section and 'data-kpi="cv-model-latency_p50_ms"' in section
    )
    assert section.count('data-judged="no"') >= 3 and "too few models to judge" in section
    assert "7 held out, 8 needed" in section and "edgebench bench MODEL.onnx --device" in section
    assert "0.0%</b>" not in section  # no 0% tile
    md = render(make_data(recs, runs=("fit1",)), "md")
    part = md[md.index("## How far to trust the predictions") :]
    assert "too few models to judge: 4 held out, 5 needed" in part


def test_enough_models_show_the_share() -> None:
    result = _result(
        kernel_models=fit_result.MIN_JUDGED_KERNEL_MODELS, whole_models=fit_result.MIN_JUDGED_MODELS
    )
    recs = result.to_records("fit1")
    assert all(r.annotations["judged"] for r in recs if r.metric == "cv_within_10pct")
    section = _section(render(make_data(recs, runs=("fit1",)), "html"))
    assert "too few models to judge" not in section and "0.0%</b>" in section
