"""`gate --confirm` power under a disturbed run: a model 15% heavier (same name) must be confirmed FAIL.

Each trial: bench the model (the baseline run), put the 15% heavier build in its place, bench again (the
candidate run), with two busy loops (`edgebench.testing.load`) running beside one of the two
runs (the baseline in even trials, the candidate in odd ones), then `gate --confirm`. The heavier model's
extra work is checked against an independent reference measured in the same test: both models timed
in-process by onnxruntime, alternately, on one thread.

Full form (EDGEBENCH_FULL_TRIALS=1): 20 trials, FAIL in >= 18 (the issue's bound). Default: 2 trials,
each FAIL or NOISY (never PASS), at least one FAIL.

The false-alarm side, in the full form only (10 trials; an unchanged model may take all 20 pairs): the same
file in both runs, busy loops beside one of them: `gate --confirm` FAIL in none.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from edgebench.testing import load
from edgebench.testing.cli import edgebench
from tests.integration.test_gate_cli import mlp
from tests.integration.test_gate_confirm import reference_ratio

pytestmark = pytest.mark.integration

FULL = os.environ.get("EDGEBENCH_FULL_TRIALS") == "1"
TRIALS = 20 if FULL else 2
WIDTH, LAYERS, HEAVY_LAYERS = 256, 20, 23  # 23 / 20 = 1.15 times the MatMul work
CONFIRM_BUDGET_S = 150  # a trial's confirmation: at most this long, so the CI form's two fit its timeout
BENCH = ["--device", "local", "--threads", "1", "--runs", "50", "--warmup", "2", "--min-seconds", "0.2"]


def trial(tmp: Path, light: Path, heavy: Path, disturb_baseline: bool) -> dict[str, Any]:
    tmp.mkdir(exist_ok=True)
    model, store = tmp / "net.onnx", tmp / "s.db"
    shutil.copy(light, model)
    for run, disturbed in (("baseline", disturb_baseline), ("candidate", not disturb_baseline)):
        if run == "candidate":
            shutil.copy(heavy, model)
        loops = load.start() if disturbed else []
        try:
            res = edgebench("bench", model, *BENCH, "--store", store, cwd=tmp)
        finally:
            load.stop(loops)
        assert res.returncode == 0, res.stderr
    res = edgebench(
        "gate",
        "--baseline",
        "latest~1",
        "--candidate",
        "latest",
        "--store",
        store,
        "--confirm",
        "--confirm-budget",
        str(CONFIRM_BUDGET_S),
        "--json",
        cwd=tmp,
    )
    assert res.returncode in (0, 1), res.stderr
    doc = json.loads(res.stdout)
    [pair] = [p for p in doc["pairs"] if p["metric"] == "latency_ms" and p["stat"] == "p50"]
    return pair


@pytest.mark.timeout(5400 if FULL else 900)
def test_confirm_fails_a_15_percent_heavier_model_beside_busy_loops(tmp_path: Path) -> None:
    light = mlp(tmp_path / "light.onnx", WIDTH, LAYERS)
    heavy = mlp(tmp_path / "heavy.onnx", WIDTH, HEAVY_LAYERS)
    ratio = reference_ratio(light, heavy, rounds=15)
    assert 1.05 < ratio < 1.3, ratio  # the premise: ~15% more work, measured independently
    verdicts, evidence = [], []
    for i in range(TRIALS):
        tmp = tmp_path / f"trial{i}"
        tmp.mkdir()
        pair = trial(tmp, light, heavy, disturb_baseline=i % 2 == 0)
        verdicts.append(pair["verdict"])
        evidence.append(f"{pair['verdict']}: {pair['reason']}")
        print(f"trial {i}: {evidence[-1]}", flush=True)
    print(f"reference ratio {ratio:.3f}; verdicts {verdicts}")
    print("\n".join(evidence))
    assert "PASS" not in verdicts, evidence
    if FULL:
        assert verdicts.count("FAIL") >= 18, evidence
    else:
        assert verdicts.count("FAIL") >= 1, evidence
    if FULL:  # the false-alarm side: the same file in both runs
        unchanged = []
        for i in range(10):
            pair = trial(tmp_path / f"same{i}", light, light, i % 2 == 0)
            unchanged.append(pair["verdict"])
            print(f"unchanged trial {i}: {pair['verdict']}: {pair['reason']}", flush=True)
        assert "FAIL" not in unchanged, unchanged
