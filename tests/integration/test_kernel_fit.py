"""A model never benched on the host is predicted from the per-op profiles of others (the kernel-level
predictor) with an interval; benched afterwards, its p50 lies in that interval, and a budget inside the
interval gets "uncertain", never "fits". The reference: the bench of the same model on the same host, at
the same thread count, taken after the prediction. Also prints the leave-one-model-out share within 10%."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

NEW = "convnet"  # never profiled, never benched before it is predicted


def cls_model() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr-onnxruntime is not installed (scripts/install-test-deps.sh installs it)")
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    if not path.is_file():
        pytest.skip(f"{path} missing")
    return path


def records(proc) -> list[dict]:  # type: ignore[no-untyped-def]
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)["records"]


def test_an_unbenched_model_is_measured_inside_its_predicted_interval(tmp_path: Path) -> None:
    cls = cls_model()
    store = tmp_path / "kernel.db"
    # Nine profiled (model, shape) pairs: an 80% split-conformal interval needs nine held-out ones.
    profiles = [
        ("builtin:mlp", "x=1x1024"),
        ("builtin:mlp", "x=8x1024"),
        ("builtin:tinymlp", None),
        ("builtin:batchmlp", None),
        ("builtin:encoder", None),
        ("builtin:dwnet", None),
        (cls, "x=1x3x48x192"),
        (cls, "x=2x3x48x192"),
        (cls, "x=4x3x48x192"),
    ]
    for model, shape in profiles:
        args = ["profile", model, "--threads", 1, "--runs", 10, "--store", store]
        proc = edgebench(*args, *(["--shape", shape] if shape else []), cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr
    models = ["builtin:mlp", "builtin:tinymlp", "builtin:batchmlp", "builtin:encoder", "builtin:dwnet", cls]
    fit_args = ["fit", "--store", store, "--no-store", "--json", "--shape", "mlp:x=1x1024"]
    fit_args += [a for m in [*models, f"builtin:{NEW}"] for a in ("-m", m)]
    first = records(edgebench(*fit_args, "--budget", "latency_p50_ms=1000", cwd=tmp_path, timeout=300))
    verdict = next(r for r in first if r["model"] == NEW and r["metric"] == "fits")
    assert verdict["annotations"]["evidence"].startswith("per-op-kind calibration"), verdict
    low, high = verdict["annotations"]["intervals"]["latency_p50_ms"]
    p50 = verdict["annotations"]["values"]["latency_p50_ms"]
    assert 0 < low <= p50 <= high

    # A budget inside the interval: the prediction may meet it or not, so "uncertain".
    mid = records(edgebench(*fit_args, "--budget", f"latency_p50_ms={p50:.6g}", cwd=tmp_path, timeout=300))
    assert next(r for r in mid if r["model"] == NEW and r["metric"] == "fits")["annotations"]["verdict"] == (
        "uncertain"
    )

    bench = records(
        edgebench(
            "bench", f"builtin:{NEW}", "--threads", 1, "--json", "--store", store, cwd=tmp_path, timeout=300
        )
    )
    measured = next(
        r["value"] for r in bench if r["metric"] == "latency_ms" and r["params"].get("stat") == "p50"
    )
    print(f"{NEW}: predicted p50 {p50:.3f} ms in [{low:.3f}, {high:.3f}], measured {measured:.3f} ms")
    assert low <= measured <= high
