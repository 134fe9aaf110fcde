"""A model never benched on a device gets a predicted interval from `fit`; benched afterwards, its p50 lies in
it, and the verdict follows the interval (fits / does not fit / uncertain), all through the real CLI on
`local`.

Calibration: the per-op profiles of the built-ins, of PP-OCR's det/rec/cls at two sizes each and of
silero-vad (one
`edgebench run` of profile jobs, onnxruntime, one thread). The new models are variants the store has never
seen (other widths and sizes of the convolution, depthwise and attention stacks), written here with
onnx.helper, so `fit` can only predict them from their graphs.

An 80% interval misses one draw in five by design, so one model cannot be the test: over NEW_MODELS models
at least MIN_INSIDE must hold their measurement (a calibrated interval fails that under 1% of the time) and
every measurement lies within BROKEN_FACTOR of its prediction (a lost kernel or a wrong kind is off by
more). The coverage is printed. Then one budget inside one model's interval: that model is "uncertain" and
each other follows its own interval, with fit's exit code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from edgebench.models.builtin import build_convnet, build_dwnet, build_encoder
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

NEW_MODELS = {
    "convnet-80x48": lambda: build_convnet(size=80, channels=48),
    "dwnet-40x96": lambda: build_dwnet(size=40, channels=96, blocks=2),
    "encoder-64x192": lambda: build_encoder(seq=64, d_model=192, heads=4, ffn=768),
}
MIN_INSIDE = 1
BROKEN_FACTOR = 2.0
RUNS = 200


@pytest.fixture(scope="module")
def calibrated(
    profiles_on_local: Callable[[str], tuple[Path, dict[str, Path]]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Path]]:
    store, _ = profiles_on_local("onnxruntime")
    folder = tmp_path_factory.mktemp("fit-new")
    models = {}
    for name, build in NEW_MODELS.items():
        models[name] = folder / f"{name}.onnx"
        onnx.save(build(), models[name])
    return store, models


def fit(store: Path, models: dict[str, Path], budget_ms: float) -> tuple[int, dict[str, dict]]:
    """fit's exit code and its verdict annotations per model, for one p50 budget."""
    res = edgebench(
        "fit", "--store", store, *[a for m in models.values() for a in ("--model", m)], "--device", "local",
        "--budget", f"latency_p50_ms={budget_ms:g}", "--no-store", "--json", cwd=next(iter(models.values())).parent,
    )  # fmt: skip
    assert res.returncode in (0, 1), res.stderr[-2000:]
    records = json.loads(res.stdout)["records"]
    verdicts = {
        r["model"]: r["annotations"]
        for r in records
        if r["metric"] == "fits" and r["runtime"] == "onnxruntime"
    }
    assert set(verdicts) == set(models), records
    return res.returncode, verdicts


def measured_p50(store: Path, models: dict[str, Path]) -> dict[str, float]:
    res = edgebench(
        "bench", *models.values(), "--device", "local", "--runtime", "onnxruntime", "--threads", "1",
        "--runs", RUNS, "--no-store", "--json", cwd=next(iter(models.values())).parent,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    records = json.loads(res.stdout)["records"]
    return {
        r["model"]: r["value"]
        for r in records
        if r["metric"] == "latency_ms" and r["params"]["stat"] == "p50"
    }


def expected_verdict(budget: float, low: float, high: float) -> str:
    return "fits" if high <= budget else "does not fit" if low > budget else "uncertain"


def test_a_never_benched_model_is_measured_inside_its_predicted_interval_and_judged_by_it(
    calibrated: tuple[Path, dict[str, Path]],
) -> None:
    store, models = calibrated
    _, verdicts = fit(store, models, 1e6)
    intervals = {m: v["intervals"]["latency_p50_ms"] for m, v in verdicts.items()}
    assert all(v["verdict"] == "fits" and v["basis"] == "predicted" for v in verdicts.values()), verdicts
    measured = measured_p50(store, models)
    inside, lines = 0, []
    for name, (low, high) in intervals.items():
        predicted, p50 = verdicts[name]["values"]["latency_p50_ms"], measured[name]
        inside += low <= p50 <= high
        lines.append(f"{name}: predicted {predicted:.3f} ms in {low:.3f}-{high:.3f}, measured {p50:.3f}")
        assert 1 / BROKEN_FACTOR <= p50 / predicted <= BROKEN_FACTOR, lines[-1]
    print("\n" + "\n".join(lines) + f"\n{inside} of {len(models)} inside their 80% interval")
    assert inside >= MIN_INSIDE, lines

    # A budget inside one model's interval: that one is uncertain, each other follows its own interval.
    low, high = intervals["convnet-80x48"]
    budget = (low * high) ** 0.5
    code, verdicts = fit(store, models, budget)
    want = {m: expected_verdict(budget, *iv) for m, iv in intervals.items()}
    assert {m: v["verdict"] for m, v in verdicts.items()} == want and want["convnet-80x48"] == "uncertain"
    assert code == (1 if "does not fit" in want.values() else 0)
