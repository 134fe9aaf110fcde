"""`edgebench bench model.tflite --runtime litert --device D` on the host, a real ssh board and an emulated
adb phone with Python: one body, the same answer everywhere, and LiteRT computing on the given inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration
pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed (scripts/install-test-deps.sh)")

BENCH = ["--runs", "30", "--min-seconds", "0", "--warmup", "2", "--timeout", "180", "--threads", "1"]


@pytest.mark.parametrize("explicit", [True, False], ids=["--runtime litert", "by extension"])
def test_bench_tflite_through_litert(lab_device: tuple[Path, str], tmp_path: Path, explicit: bool) -> None:
    lab, name = lab_device
    runtime = ["--runtime", "litert"] if explicit else []
    res = edgebench(
        "bench", "builtin:mlp.tflite", "--device", name, "--lab", str(lab), *runtime, *BENCH, "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    records = json.loads(res.stdout)["records"]
    got = {(r["metric"], r["params"].get("stat")): r for r in records}
    assert {(r["device"], r["model"], r["runtime"]) for r in records} == {(name, "mlp", "litert")}
    lo, p50, hi = (got[("latency_ms", s)]["value"] for s in ("min", "p50", "max"))
    assert 0 < lo <= p50 <= hi
    for metric in ("load_ms", "first_inference_ms", "peak_rss_mb"):
        assert got[(metric, None)]["value"] > 0
    execution = got[("latency_ms", "p50")]["annotations"]["execution"]
    assert execution["delegate"] == "xnnpack" and execution["delegated"] == "full"
    assert execution["num_threads"] == 1 and got[("latency_ms", "p50")]["params"]["threads"] == 1


def test_onnx_model_with_litert_is_one_clear_line(tmp_path: Path) -> None:
    res = edgebench("bench", "builtin:mlp", "--runtime", "litert", "--runs", "5", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "LiteRT runs .tflite models" in res.stderr and "Traceback" not in res.stderr
