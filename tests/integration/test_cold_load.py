"""`bench --cold-load`: the model file evicted from the page cache before each cold load (checked with
mincore), cold and warm loads alternated. The reference for "evicted" is the kernel's own residency count;
for "slower" the warm loads paired with the cold ones in the same run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from edgebench.agent.loading import evict, resident_fraction
from edgebench.testing.cli import edgebench

pytestmark = pytest.mark.integration

BIG = 5000  # a 5000 x 5000 fp32 weight: 100 MB
COLD_BUDGET_S = 60.0


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


def read_ms(path: Path) -> float:
    """Milliseconds to read the whole file unbuffered (the test's own clock and reads)."""
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while fh.read(1 << 22):
            pass
    return (time.perf_counter() - start) * 1e3


def drop(path: Path) -> None:
    """The file's pages dropped from the page cache as the product drops them (posix_fadvise DONTNEED)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.xfail(
    strict=True,
    reason="open defect: the product's onnxruntime cold loads read 12.5 ms over warm (median of 25 pairs) "
    "where reading the dropped file costs 43 ms over warm here: its cold loads are not as cold as it says",
)
def test_cold_load_of_a_100_mb_onnx_model_is_slower_than_warm(tmp_path: Path) -> None:
    """onnxruntime reads the whole file before it copies and prepacks the weights, so a cold load costs at
    least the extra of reading the file cold. The reference is the test's own: the file dropped as the
    product drops it, read cold then warm, interleaved with the product's rounds so both meet the same
    machine (on a VM the "disk" may be the host's page cache: the extra is whatever it is here, measured).
    The product's paired cold - warm differences must reach half that extra; rounds go on (more cold
    loads) until conclusive within the budget, then pass or fail."""
    model = big_onnx(tmp_path / "big.onnx")
    extra_read: list[float] = []
    paired: list[float] = []
    values: list[dict] = []
    start = time.monotonic()
    while True:
        for _ in range(3):
            drop(model)
            cold_read = read_ms(model)
            extra_read.append(cold_read - read_ms(model))
        cold = cold_bench(model, tmp_path)
        notes = cold["annotations"]
        values.append(cold)
        paired += [c - w for c, w in zip(notes["cold_ms"], notes["warm_ms"], strict=True)]
        reference = float(np.median(extra_read))
        ours = float(np.median(paired))
        spent = time.monotonic() - start
        if ours >= 0.5 * reference or spent * (len(values) + 1) / len(values) > COLD_BUDGET_S:
            break
    print(
        f"onnxruntime 100 MB: cold - warm load {ours:.1f} ms (median of {len(paired)} pairs), the file read "
        f"cold - warm {reference:.1f} ms (median of {len(extra_read)}); last run cold {cold['value']:.1f} ms, "
        f"warm {notes['warm_median_ms']:.1f} ms, p={notes['slower_p_value']:.3f}"
    )
    assert reference > 5.0, "dropping the file's pages did not make reading it slower here"
    assert ours >= 0.5 * reference, (
        f"cold loads {ours:.1f} ms over warm, the file's cold read {reference:.1f}"
    )
    assert notes["distinct"] == (notes["slower_p_value"] < 0.05)
    assert cold["value"] == pytest.approx(float(np.median(notes["cold_ms"])))
