"""The README's main job shows how far to trust the kernel predictor, and its figure is the held-out truth.

The smoke suite (run once per session, `smoke_run`) profiles its six models and a trimmed calibration of
kernel samples at one thread beside the one-thread memory sweep. Its report's "How far to trust the
predictions" section gives the per-kernel predictor's leave-one-model-out share within +-10%. Here that
share is recomputed apart from fit and the report: each model's measured p50 from the store's raw plain
runs (numpy's median), each held-out prediction from a calibration built with the predictor's API on the
other models' and the samples' profiles, each model's graph counted from its ONNX file. The share is
printed against the issue's target (>= 60%; a shared 2-core host moves a profile's p50 by 2-5x under load,
so it is not asserted); what is asserted is that the report shows exactly the recomputed figure, and that
the whole-model predictor's shares over six models say "too few models to judge" with the next step.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

import numpy as np
import pytest

from edgebench.analysis import kernel_predict as kp
from edgebench.analysis.cost import analyze, load_model
from edgebench.analysis.kernels import graph_kernels
from edgebench.models.builtin import builtin_model
from edgebench.models.kernel_samples import is_kernel_sample, sample_model
from edgebench.results.store import Store
from edgebench.runtimes.onnxruntime import nchwc_block
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

TARGET_SHARE = 0.6  # issue 39: >= 60% of held-out p50s within +-10% in the main job (goal 90%)
SMOKE_MODELS = ("mlp", "tinymlp", "batchmlp", "encoder", "convnet", "dwnet")


def measured_p50s(store: Any) -> dict[str, float]:
    """Each profiled model's p50 over its plain runs, from the raw samples the store kept."""
    with Store(store) as s:
        samples = [x for x in s.samples() if x.probe == "profile" and x.metric == "latency_ms"]
    return {x.model: float(np.median(x.values)) for x in samples if x.model}


def held_out_errors(store: Any) -> dict[str, float]:
    """predicted / measured - 1 of each smoke model, predicted by a calibration that never saw it."""
    with Store(store) as s:
        records, devices = s.records(), s.device_info()
    fingerprint = next(d["fingerprint"] for d in devices if d["device"] == "local")
    block = nchwc_block(fingerprint)
    runs = [r for r in kp.profiled_runs(records) if r.device == "local" and r.threads == 1]
    memory = kp.memory_curve(records, "local", 1)
    assert memory.points, "the smoke suite's one-thread sweep is missing"

    def graph(run: kp.ProfiledRun) -> list:
        path = builtin_model(run.model) if run.model in SMOKE_MODELS else _sample_file(run.model)
        cost = analyze(load_model(path), {k: list(v) for k, v in json.loads(run.shapes).items()})
        return graph_kernels(cost, "onnxruntime", nchwc_block=block)

    graphs = {(r.model, r.shapes): graph(r) for r in runs}
    p50 = measured_p50s(store)
    errors = {}
    for model in SMOKE_MODELS:
        (run,) = [r for r in runs if r.model == model]
        assert run.latency_ms == pytest.approx(p50[model], rel=1e-6)  # the p50 the predictor is judged by
        cal = kp.calibrate([r for r in runs if r.model != model], graphs, memory)
        assert cal is not None
        errors[model] = cal.latency_ms(graphs[(run.model, run.shapes)]) / p50[model] - 1
    return errors


def _sample_file(name: str) -> Any:
    """A kernel sample's ONNX file from its stored name, as the calibration suite generates it."""
    assert is_kernel_sample(name)
    from edgebench.models.kernel_samples import CALIBRATION, parse_sample

    (key,) = [k for k in CALIBRATION if parse_sample(k).name == name]
    return sample_model(key)[1]


def tiles(page: str) -> dict[str, str]:
    """data-kpi -> the tile's text, from the report's prediction section."""
    section = page[page.index('id="prediction"') :]
    section = section[: section.index("</section>")]
    out = {}
    for m in re.finditer(r'<div class="kpi[^"]*" data-kpi="([^"]+)"[^>]*>(.*?)</div>', section, re.S):
        text = html.unescape(re.sub(r"<[^>]+>", " ", m.group(2)))
        out.setdefault(m.group(1), re.sub(r"\s+", " ", text).strip())
    return out


def test_the_main_jobs_report_shows_the_held_out_share(smoke_run: Any) -> None:
    out = smoke_run.folder / "smoke.html"
    res = edgebench(
        "report",
        "--store",
        smoke_run.store,
        "--suite",
        smoke_run.suite,
        "--out",
        out,
        cwd=smoke_run.folder,
        env=smoke_run.env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    errors = held_out_errors(smoke_run.store)
    for model, e in errors.items():
        print(f"held out {model}: predicted / measured p50 {e:+.1%}")
    share = float(np.mean([abs(e) <= 0.1 for e in errors.values()]))
    print(
        f"main job: {share:.0%} of {len(errors)} held-out p50s within +-10% (target {TARGET_SHARE:.0%}), "
        f"median error {np.median(np.abs(list(errors.values()))):.1%}"
    )
    shown = tiles(out.read_text())
    kernel = shown["cv-kernel-latency_p50_ms"]
    assert kernel.startswith(f"{share:.1%} within ±10%"), (kernel, errors)
    assert f"{len(errors)} held-out profiles" in kernel
    # six benched models are too few for the whole-model predictor's share: said, with the next step
    whole = shown["cv-model-latency_p50_ms"]
    assert whole.startswith("too few models to judge") and "6 held out, 8 needed" in whole, whole
    assert "edgebench bench MODEL.onnx --device" in whole
    assert "0.0%" not in whole
