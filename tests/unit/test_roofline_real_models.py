"""roofline on real models shipped in PyPI wheels, against an independent counter (onnx-tool).

onnx-tool counts MACs with its own per-op instruction weights; edgebench counts FLOPs with the conventions
in edgebench/roofline.py. Every difference is translated here explicitly, never copied:
- Conv / MatMul / Gemm: onnx-tool = output elements x K, plus one MAC per output element for a bias.
  Ours = 2 x (output elements x K) + 1 FLOP per output element for the bias. So ours = 2 x (ot - bias) + bias.
- ConvTranspose: onnx-tool multiplies *output* elements by C_out/group x kernel; the work is *input*
  elements x C_out/group x kernel (each input pixel is scattered through the kernel). Its count is off by
  (C_out x H_out x W_out) / (C_in x H_in x W_in): 4x for a channel-preserving stride-2 upsampler.
- BatchNormalization: onnx-tool charges 31 MACs per element (add, 24 for sqrt, 4 for div, add, mul);
  ours is 2 (runtimes fold it into one multiply-add per element).
- Pointwise ops: onnx-tool weighs each by instruction cost (Div 4, Clip 2, Sigmoid 36, Pow 32, Sqrt 24,
  HardSigmoid 4 ...) times (inputs - 1); ours is 1 per output element.
- Softmax: onnx-tool 36 per element (exp + div); ours 5 (max, subtract, exp, sum, divide).
- GlobalAveragePool: onnx-tool input + 4 x output (div 4); ours input + output.
- AveragePool: onnx-tool kernel per output; ours kernel + 1 (the divide). ReduceMean: onnx-tool input
  elements; ours input + output (the divide).
- Weight bytes: onnx-tool (with constant folding, which turns these models' Constant-node weights into
  initializers) counts the elements of every constant a node it profiles reads, skipping the data-movement
  ops it leaves out (Reshape, Concat, Slice ...) but including scalar parameters such as Clip's bounds;
  ours are stored bytes at data inputs of computing nodes. These fp32 models differ by a few hundred bytes.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import numpy as np
import pytest

from edgebench.analysis.cost import analyze

onnx_tool = pytest.importorskip("onnx_tool")

WEIGHT_OPS = ("Conv", "MatMul", "Gemm")


def wheel_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed (scripts/install-test-deps.sh installs it)")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        pytest.skip(f"{path} missing")
    return path


def profile_with_onnx_tool(path: Path, shape: list[int]):  # type: ignore[no-untyped-def]
    model = onnx_tool.Model(str(path), {"verbose": False, "constant_folding": True})
    graph = model.graph
    graph.graph_reorder_nodes()
    graph.shape_infer({graph.input[0]: np.zeros(shape, np.float32)})
    graph.profile()
    return graph


def out_elements(graph, node) -> int:  # type: ignore[no-untyped-def]
    return math.prod(graph.tensormap[node.output[0]].get_shape())


def in_elements(graph, node) -> int:  # type: ignore[no-untyped-def]
    return math.prod(graph.tensormap[node.input[0]].get_shape())


def conv_transpose_flops(graph, node) -> int:  # type: ignore[no-untyped-def]
    """Independent count: 2 x N x C_in x H_in x W_in x (C_out/group) x kernel + bias per output element."""
    w = graph.tensormap[node.input[1]].get_shape()
    flops = 2 * in_elements(graph, node) * math.prod(w[1:])
    return flops + (out_elements(graph, node) if len(node.input) > 2 else 0)


def translated(graph, node) -> int:  # type: ignore[no-untyped-def]
    """onnx-tool's count of one node, translated to edgebench's conventions (see the module docstring)."""
    macs, op = int(round(node.macs[0])), node.op_type
    out = out_elements(graph, node)
    if op in WEIGHT_OPS:
        bias = out if len(node.input) > 2 else 0
        return 2 * (macs - bias) + bias
    if op == "ConvTranspose":
        return conv_transpose_flops(graph, node)
    if op == "BatchNormalization":
        return 2 * out
    if op == "Softmax":
        return 5 * out
    if op == "GlobalAveragePool":
        return in_elements(graph, node) + out
    if op == "AveragePool":
        return macs + out
    if op == "ReduceMean":
        return macs + out
    if op == "MaxPool":
        return macs
    if hasattr(node, "op_mac") and macs:
        return out  # any pointwise op: 1 per output element
    return 0


CASES = [
    ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", [1, 3, 640, 640]),
    ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", [1, 3, 48, 320]),
    ("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", [1, 3, 48, 192]),
]


@pytest.mark.parametrize(("package", "relative", "shape"), CASES, ids=lambda v: str(v).split("/")[-1])
def test_pp_ocr_agrees_with_onnx_tool_within_one_percent(
    package: str, relative: str, shape: list[int]
) -> None:
    path = wheel_file(package, relative)
    graph = profile_with_onnx_tool(path, shape)
    cost = analyze(path, {"x": shape})
    assert not cost.uncounted and not cost.warnings
    ours = {n.name: n for n in cost.nodes}
    translated_total = 0
    for name, node in graph.nodemap.items():
        want = translated(graph, node)
        translated_total += want
        if node.op_type in WEIGHT_OPS or node.op_type == "ConvTranspose":
            assert ours[name].flops == want, name  # exact, node by node
        elif name in ours and node.op_type not in ("Constant", "Identity"):
            # shapes agree: our output bytes are onnx-tool's output elements x 4 (fp32)
            assert ours[name].output_bytes == 4 * out_elements(graph, node), name
    assert cost.flops == pytest.approx(translated_total, rel=0.01)
    # the weight ops dominate: their FLOPs agree within 1% even before the bias translation
    weight_ours = sum(cost.flops_by_op.get(op, 0) for op in WEIGHT_OPS)
    weight_ot = sum(2 * node.macs[0] for node in graph.nodemap.values() if node.op_type in WEIGHT_OPS)
    assert weight_ours == pytest.approx(weight_ot, rel=0.01)
    assert cost.weight_bytes == pytest.approx(4 * graph.params, rel=0.01)


def test_onnx_tool_conv_transpose_error_is_the_stride_and_channel_ratio() -> None:
    """PP-OCR detector's two ConvTransposes: onnx-tool's count over ours is C_out·HW_out / (C_in·HW_in)."""
    path = wheel_file("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx")
    graph = profile_with_onnx_tool(path, [1, 3, 320, 320])
    cost = analyze(path, {"x": [1, 3, 320, 320]})
    ours = {n.name: n.flops for n in cost.nodes}
    ratios = []
    for name, node in graph.nodemap.items():
        if node.op_type != "ConvTranspose":
            continue
        x = graph.tensormap[node.input[0]].get_shape()
        y = graph.tensormap[node.output[0]].get_shape()
        bias = out_elements(graph, node) if len(node.input) > 2 else 0
        ot_products = 2 * (node.macs[0] - bias)
        expected_ratio = (y[1] * y[2] * y[3]) / (x[1] * x[2] * x[3])
        ratios.append(ot_products / (ours[name] - bias))
        assert ot_products / (ours[name] - bias) == pytest.approx(expected_ratio)
    assert len(ratios) == 2 and any(r == pytest.approx(4.0) for r in ratios)


def test_silero_vad_subgraphs_follow_the_sample_rate_branch() -> None:
    """silero_vad.onnx wraps its 16 kHz and 8 kHz networks in an If on `sr`; the branch bodies are counted."""
    path = wheel_file("silero_vad", "data/silero_vad.onnx")
    shapes = {"input": [1, 512], "state": [2, 1, 128]}
    k16 = analyze(path, shapes, {"sr": 16000})
    assert k16.branch_choice == "static" and not k16.uncounted
    assert not [w for w in k16.warnings if "statically" in w]
    # one LSTM step, hidden 128 over a 128-wide input: 8H(I+H) + 4H + 8H + 5H + 4H
    h = 128
    assert k16.flops_by_op["LSTM"] == 8 * h * (h + h) + 21 * h
    assert k16.flops_by_op["Conv"] > 0.7 * k16.flops
    # the same network exported without the If (the 16k-only file) has the same weights
    alone = analyze(wheel_file("silero_vad", "data/silero_vad_16k_op15.onnx"), shapes, {"sr": 16000})
    assert k16.weight_bytes == alone.weight_bytes
    assert k16.flops == pytest.approx(alone.flops, rel=0.01)
    assert k16.stored_weight_bytes > k16.weight_bytes  # the 8 kHz branch's weights are stored, not read
    k8 = analyze(path, {"input": [1, 256], "state": [2, 1, 128]}, {"sr": 8000})
    assert k8.flops < k16.flops and k8.weight_bytes < k16.weight_bytes
    unknown = analyze(path, shapes)
    assert unknown.branch_choice != "static"
    assert any("--value" in w for w in unknown.warnings)
    assert sum(unknown.floor_flops_by_dtype.values()) <= unknown.flops


def test_real_models_analyse_fast() -> None:
    import time

    path = wheel_file("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx")
    start = time.perf_counter()
    analyze(path, {"x": [1, 3, 48, 320]})
    assert time.perf_counter() - start < 30  # generous: ~0.5 s on a quiet core
    assert os.path.getsize(path) > 1e6
