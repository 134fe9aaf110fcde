"""Inputs are the inputs on every run: MNN's session reuses its input buffer for activations, so a harness
that copies the inputs in once times every later inference on leftover activations (decaying to denormals,
two orders of magnitude slower on the conv stack). edgebench's p50 is held against a bare MNN loop that
copies its inputs in before every run, and the agent's own output self-check must pass."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgebench.models.convert import onnx_to_mnn
from edgebench.models.refs import resolve_model
from edgebench.testing.bare import bare_mnn
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

# Enough warm-up calls that the copy-once defect has set in (it did after about 70 on the conv stack).
WARMUP = ["--warmup", "100", "--warmup-seconds", "0"]


def p50_of(doc: dict) -> float:
    return next(
        r["value"] for r in doc["records"] if r["metric"] == "latency_ms" and r["params"].get("stat") == "p50"
    )


def test_mnn_conv_stack_p50_matches_a_bare_loop_that_refreshes_its_inputs(workdir: Path) -> None:
    res = edgebench(
        "bench", "builtin:convnet", "--runtime", "mnn", "--threads", "1", *WARMUP,
        "--runs", "20", "--min-seconds", "0", "--json", cwd=workdir,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    ours = p50_of(json.loads(res.stdout))
    path = str(onnx_to_mnn(resolve_model("builtin:convnet").path))
    image = np.random.default_rng(0).uniform(-1, 1, (1, 3, 112, 112)).astype(np.float32)
    bare = bare_mnn(path, {"image": image}, threads=1, runs=50, warmup_s=0.3).p50
    print(f"\nconvnet MNN 1 thread: edgebench p50 {ours:.2f} ms, bare loop p50 {bare:.2f} ms")
    # Generous: this is a regression test (the defect gave ~100x), the benchmarks hold the +-15%.
    assert ours < 2.0 * bare, (ours, bare)


def test_the_bench_says_its_outputs_were_checked(workdir: Path) -> None:
    res = edgebench(
        "bench", "builtin:mlp", "--runtime", "mnn", "--threads", "1", "--runs", "20", "--min-seconds", "0",
        "--json", cwd=workdir,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    p50 = next(
        r
        for r in json.loads(res.stdout)["records"]
        if r["metric"] == "latency_ms" and r["params"]["stat"] == "p50"
    )
    assert "matches a fresh inference" in p50["annotations"]["self_check"]
