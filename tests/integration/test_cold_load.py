"""`bench --cold-load`: the model file evicted from the page cache before each cold load (checked with
mincore), cold and warm loads alternated. The reference for "evicted" is the kernel's own residency count;
for "slower" the warm loads paired with the cold ones in the same run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgebench.agent.loading import evict, resident_fraction
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

BIG = 5000  # a 5000 x 5000 fp32 weight: 100 MB


def big_onnx(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((BIG, BIG)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, BIG])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, BIG])],
        [numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def big_tflite(path: Path) -> Path:
    pytest.importorskip("ai_edge_litert")
    from edgebench.models.tflite_builtin import build_mlp_tflite

    path.write_bytes(build_mlp_tflite(hidden=BIG, width=BIG, layers=1))
    return path


def cold_bench(model: Path, cwd: Path) -> dict:
    res = edgebench(
        "bench", model, "--cold-load", "--runs", 3, "--min-seconds", 0, "--threads", 1, "--no-store",
        "--json", cwd=cwd,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    [cold] = [
        r for r in json.loads(res.stdout)["records"] if r["metric"] == "load_ms" and r["params"].get("cache")
    ]
    assert cold["params"]["cache"] == "cold"
    notes = cold["annotations"]
    assert notes["eviction_verified"] is True and notes["check"] == "mincore"
    assert notes["resident_before"] == 1.0 and max(notes["resident_after"]) < 0.05
    assert len(notes["cold_ms"]) == len(notes["warm_ms"]) == 5
    return cold


def test_eviction_is_seen_by_mincore(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(np.random.default_rng(1).bytes(8 << 20))
    path.read_bytes()
    assert resident_fraction(str(path)) == 1.0
    result = evict(str(path))
    assert result["eviction_verified"] and resident_fraction(str(path)) < 0.05
    path.read_bytes()
    assert resident_fraction(str(path)) == 1.0


def test_cold_load_of_a_100_mb_mapped_model_is_slower_than_warm(tmp_path: Path) -> None:
    """LiteRT maps the flatbuffer: a cold load reads 100 MB from storage, a warm one from the page cache."""
    cold = cold_bench(big_tflite(tmp_path / "big.tflite"), tmp_path)
    notes = cold["annotations"]
    print(
        f"LiteRT 100 MB: cold {cold['value']:.1f} ms, warm {notes['warm_median_ms']:.1f} ms, "
        f"ratio {notes['cold_to_warm']:.2f} (p={notes['slower_p_value']:.3f})"
    )
    assert notes["distinct"] and notes["cold_to_warm"] > 1.0


def test_cold_load_of_a_100_mb_onnx_model_is_measured_and_judged(tmp_path: Path) -> None:
    """onnxruntime copies and prepacks the weights: reading the file is a small share of its load, so the
    product says whether cold was distinguishably slower rather than assuming it."""
    cold = cold_bench(big_onnx(tmp_path / "big.onnx"), tmp_path)
    notes = cold["annotations"]
    print(
        f"onnxruntime 100 MB: cold {cold['value']:.1f} ms, warm {notes['warm_median_ms']:.1f} ms, "
        f"ratio {notes['cold_to_warm']:.2f} (p={notes['slower_p_value']:.3f}, distinct={notes['distinct']})"
    )
    assert notes["distinct"] == (notes["slower_p_value"] < 0.05)
    assert cold["value"] == pytest.approx(float(np.median(notes["cold_ms"])))
