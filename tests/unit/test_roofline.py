"""roofline: exact FLOPs and weight bytes on generated models whose counts are computed here by hand,
the subgraph and shape conventions, and the floor / bound / efficiency arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebench.analysis.cost import analyze, efficiency_check, floor
from edgebench.errors import ModelError, UserError

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17, domains=()):  # type: ignore[no-untyped-def]
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(graph, opset_imports=opsets)
    m.ir_version = 8
    return m


def vi(name: str, dims, elem=F):  # type: ignore[no-untyped-def]
    return helper.make_tensor_value_info(name, elem, dims)


def const(name: str, shape, dtype=np.float32, seed=0):  # type: ignore[no-untyped-def]
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(dtype), name)


def by_op(cost, op):  # type: ignore[no-untyped-def]
    return cost.flops_by_op.get(op, 0)


def test_mlp_gemm_shared_and_unused_weights_are_exact() -> None:
    b, d, h = 4, 64, 96
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"]),
        helper.make_node("Add", ["a", "b1"], ["ab"]),
        helper.make_node("Relu", ["ab"], ["r"]),
        # Gemm with transB, alpha 2, a bias with beta 0.5: 2MNK + bias + alpha + beta
        helper.make_node("Gemm", ["r", "w2", "c2"], ["g"], transB=1, alpha=2.0, beta=0.5),
        # the same weight used twice: counted once
        helper.make_node("MatMul", ["g", "w1s"], ["m2"]),
        helper.make_node("MatMul", ["m2", "wsq"], ["m3"]),
        helper.make_node("MatMul", ["m3", "wsq"], ["y0"]),
        helper.make_node("Reshape", ["y0", "shape"], ["y"]),
    ]
    inits = [
        const("w1", (d, h)),
        const("b1", (h,)),
        const("w2", (d, h)),
        const("c2", (d,)),
        const("w1s", (d, d)),
        const("wsq", (d, d)),
        const("unused", (1000,)),
        numpy_helper.from_array(np.array([b, -1], np.int64), "shape"),
    ]
    m = model(nodes, [vi("x", [b, d])], [vi("y", [b, d])], inits)
    cost = analyze(m)
    want_flops = (2 * b * h * d) + b * h + b * h + (2 * b * d * h + 3 * b * d) + 3 * (2 * b * d * d)
    assert cost.flops == want_flops
    assert by_op(cost, "Gemm") == 2 * b * d * h + 3 * b * d
    # weights: w1, b1, w2, c2, w1s, wsq once; not the unused tensor, not the Reshape shape parameter
    assert cost.weight_bytes == 4 * (d * h + h + d * h + d + d * d + d * d)
    assert cost.stored_weight_bytes == cost.weight_bytes + 4 * 1000 + 8 * 2
    assert cost.input_bytes == 4 * b * d and cost.output_bytes == 4 * b * d
    assert cost.floor_bytes == cost.weight_bytes + 8 * b * d
    assert cost.warnings == ()


def conv_out(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def test_conv_and_conv_transpose_count_by_the_right_elements() -> None:
    n, cin, hw = 2, 8, 15
    cout, groups, k, stride, pad, dil = 12, 4, 3, 2, 1, 2
    ho = conv_out(hw, k, stride, pad, dil)
    ct_out, ct_groups, ct_k, ct_stride = 6, 2, 4, 2
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "w", "b"],
            ["c"],
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad] * 4,
            dilations=[dil, dil],
            group=groups,
        ),
        helper.make_node(
            "ConvTranspose",
            ["c", "wt", "bt"],
            ["y"],
            kernel_shape=[ct_k, ct_k],
            strides=[ct_stride, ct_stride],
            group=ct_groups,
        ),
    ]
    inits = [
        const("w", (cout, cin // groups, k, k)),
        const("b", (cout,)),
        const("wt", (cout, ct_out // ct_groups, ct_k, ct_k)),
        const("bt", (ct_out,)),
    ]
    yo = (ho - 1) * ct_stride + ct_k
    m = model(nodes, [vi("x", [n, cin, hw, hw])], [vi("y", [n, ct_out, yo, yo])], inits)
    cost = analyze(m)
    conv_macs = n * cout * ho * ho * (cin // groups) * k * k
    assert by_op(cost, "Conv") == 2 * conv_macs + n * cout * ho * ho
    # every input pixel of the transposed conv meets C_out/group * k*k weights
    ct_macs = n * cout * ho * ho * (ct_out // ct_groups) * ct_k * ct_k
    assert by_op(cost, "ConvTranspose") == 2 * ct_macs + n * ct_out * yo * yo
    assert cost.output_bytes == 4 * n * ct_out * yo * yo


def test_attention_decomposition_norms_reductions_and_pooling() -> None:
    bsz, heads, s, dh = 2, 4, 16, 8
    c, hw = 6, 10
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["ctx"]),
        helper.make_node("LayerNormalization", ["ctx", "g", "beta"], ["ln"], axis=-1),
        helper.make_node("ReduceMean", ["ln"], ["rm"], axes=[-1], keepdims=1),
        helper.make_node("BatchNormalization", ["img", "s", "bb", "mean", "var"], ["bn"]),
        helper.make_node("MaxPool", ["bn"], ["mp"], kernel_shape=[3, 3], strides=[1, 1]),
        helper.make_node("AveragePool", ["bn"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["bn"], ["gap"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0.125, np.float32), "scale"),
        const("g", (dh,)),
        const("beta", (dh,)),
        const("s", (c,)),
        const("bb", (c,)),
        const("mean", (c,)),
        const("var", (c,)),
    ]
    inputs = [
        vi("q", [bsz, heads, s, dh]),
        vi("kt", [bsz, heads, dh, s]),
        vi("v", [bsz, heads, s, dh]),
        vi("img", [1, c, hw, hw]),
    ]
    outputs = [vi("rm", [bsz, heads, s, 1]), vi("mp", None), vi("ap", None), vi("gap", None)]
    cost = analyze(model(nodes, inputs, outputs, inits, opset=17))
    bh = bsz * heads
    assert by_op(cost, "MatMul") == 2 * bh * s * s * dh * 2
    assert by_op(cost, "Mul") == bh * s * s
    assert by_op(cost, "Softmax") == 5 * bh * s * s
    assert by_op(cost, "LayerNormalization") == 7 * bh * s * dh + 3 * bh * s
    assert by_op(cost, "ReduceMean") == bh * s * dh + bh * s
    assert by_op(cost, "BatchNormalization") == 2 * c * hw * hw
    assert by_op(cost, "MaxPool") == 9 * c * (hw - 2) ** 2
    assert by_op(cost, "AveragePool") == (4 + 1) * c * (hw // 2) ** 2
    assert by_op(cost, "GlobalAveragePool") == c * hw * hw + c
    assert cost.weight_bytes == 4 * (1 + 2 * dh + 4 * c)


def test_lstm_gru_and_contrib_attention() -> None:
    seq, batch, i, h = 5, 2, 7, 6
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh"], hidden_size=h),
        helper.make_node("GRU", ["x", "Wg", "Rg"], ["yg"], hidden_size=h),
    ]
    inits = [
        const("W", (1, 4 * h, i)),
        const("R", (1, 4 * h, h)),
        const("B", (1, 8 * h)),
        const("Wg", (1, 3 * h, i)),
        const("Rg", (1, 3 * h, h)),
    ]
    cost = analyze(
        model(nodes, [vi("x", [seq, batch, i])], [vi("y", None), vi("yh", None), vi("yg", None)], inits)
    )
    steps = seq * batch
    assert by_op(cost, "LSTM") == steps * (8 * h * (i + h) + 4 * h + 8 * h + 5 * h + 4 * h)
    assert by_op(cost, "GRU") == steps * (6 * h * (i + h) + 3 * h + 3 * h + 5 * h)
    b, s, d, heads = 2, 8, 16, 4
    att = helper.make_node("Attention", ["x", "w", "bias"], ["y"], domain="com.microsoft", num_heads=heads)
    m = model(
        [att],
        [vi("x", [b, s, d])],
        [vi("y", [b, s, d])],
        [const("w", (d, 3 * d)), const("bias", (3 * d,))],
        domains=("com.microsoft",),
    )
    cost = analyze(m)
    scores = b * heads * s * s
    assert cost.flops == 2 * b * s * d * 3 * d + b * s * 3 * d + 2 * scores * (d // heads) * 2 + 6 * scores
    assert cost.output_bytes == 4 * b * s * d


def if_model(cond_from_input: bool) -> onnx.ModelProto:
    d = 32
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "wt"], ["t_out"])],
        "then",
        [],
        [vi("t_out", [1, d])],
        [const("wt", (d, d), seed=1)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["e_out"])], "else", [], [vi("e_out", [1, d])]
    )
    if cond_from_input:
        nodes = [helper.make_node("Equal", ["sr", "k16"], ["c"])]
        inputs = [vi("x", [1, d]), vi("sr", [], TensorProto.INT64)]
        inits = [numpy_helper.from_array(np.array(16000, np.int64), "k16")]
    else:
        nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True), "c"))]
        inputs, inits = [vi("x", [1, d])], []
    nodes.append(helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g))
    return model(nodes, inputs, [vi("y", [1, d])], inits)


def test_if_branch_selection_and_the_floor_convention() -> None:
    d = 32
    static = analyze(if_model(False))
    assert static.flops == 2 * d * d and static.weight_bytes == 4 * d * d and static.branch_choice == "static"
    open_cond = analyze(if_model(True))
    # the costlier branch, plus the Equal that decides it (a pointwise op: 1 per element)
    assert open_cond.flops == 2 * d * d + 1
    assert sum(open_cond.floor_flops_by_dtype.values()) == d + 1  # the cheaper branch bounds the floor
    # the int64 constant the condition compares with is a data input of a computing node
    assert open_cond.floor_weight_bytes == 8 and open_cond.weight_bytes == 4 * d * d + 8
    assert any("not known statically" in w for w in open_cond.warnings)
    chosen = analyze(if_model(True), values={"sr": 8000})
    assert chosen.flops == d and chosen.branch_choice == "static"  # Equal on known values: shape math
    assert not any("statically" in w for w in chosen.warnings)


def test_loop_counts_body_times_trip_count() -> None:
    d, trips = 16, 5
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", "w"], ["h_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL), vi("h_in", [1, d])],
        [vi("cond_out", [], TensorProto.BOOL), vi("h_out", [1, d])],
    )
    nodes = [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)]
    inits = [numpy_helper.from_array(np.array(trips, np.int64), "n"), const("w", (d, d))]
    cost = analyze(model(nodes, [vi("x", [1, d])], [vi("y", [1, d])], inits))
    assert cost.flops == trips * 2 * d * d
    assert cost.weight_bytes == 4 * d * d  # read every trip, stored once


def test_constant_folding_and_quantized_weights_count_stored_bytes() -> None:
    k, n = 64, 32
    nodes = [
        # Transpose of a weight is folded at load time: the weight is counted once, as stored
        helper.make_node("Transpose", ["wT"], ["w"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        # weight-only int8: the stored int8 bytes (+ scale and zero point) are what is read
        helper.make_node("DequantizeLinear", ["q", "qs", "qz"], ["wq"]),
        helper.make_node("MatMul", ["a", "wq"], ["y"]),
    ]
    inits = [
        const("wT", (n, k)),
        numpy_helper.from_array(np.ones((n, n), np.int8), "q"),
        numpy_helper.from_array(np.array(0.1, np.float32), "qs"),
        numpy_helper.from_array(np.array(0, np.int8), "qz"),
    ]
    cost = analyze(model(nodes, [vi("x", [1, k])], [vi("y", [1, n])], inits))
    assert cost.weight_bytes == 4 * n * k + n * n + 4 + 1
    assert cost.flops == 2 * k * n + 2 * n * n
    assert by_op(cost, "Transpose") == 0 and by_op(cost, "DequantizeLinear") == 0


def test_dynamic_dims_default_to_one_with_a_warning_and_shape_overrides() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    m = model(nodes, [vi("x", ["batch", 8])], [vi("y", ["batch", 4])], [const("w", (8, 4))])
    cost = analyze(m)
    assert cost.flops == 2 * 8 * 4 and cost.inputs == {"x": [1, 8]}
    assert any("dynamic" in w and "--shape x=" in w for w in cost.warnings)
    big = analyze(m, {"x": [16, 8]})
    assert big.flops == 16 * 2 * 8 * 4 and not big.warnings
    with pytest.raises(UserError, match="'nope' is not an input"):
        analyze(m, {"nope": [1]})
    with pytest.raises(UserError, match="rank"):
        analyze(m, {"x": [1, 2, 3]})


def test_shape_arithmetic_resolves_data_dependent_reshapes() -> None:
    """Shape -> Gather -> Concat -> Reshape chains are computed, so the MatMul after them is costed."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "ax"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
        const("w", (48, 5)),
    ]
    cost = analyze(model(nodes, [vi("x", ["n", 3, 4, 4])], [vi("y", None)], inits), {"x": [2, 3, 4, 4]})
    assert cost.flops == 2 * 2 * 48 * 5
    assert cost.weight_bytes == 4 * 48 * 5  # shape constants are parameters, not weights
    assert cost.uncounted == {}


def test_corrupt_model_is_a_model_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00not a model at all")
    with pytest.raises(ModelError):
        analyze(bad)


def test_floor_bound_and_efficiency() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    cost = analyze(model(nodes, [vi("x", [1, 1000])], [vi("y", [1, 1000])], [const("w", (1000, 1000))]))
    # 2 MFLOP, 4 MB of weights + 8 kB of I/O
    fl = floor(cost, {"fp32": 0.1}, 10.0)
    assert fl.compute_ms == pytest.approx(2e6 / 0.1e12 * 1e3)
    assert fl.memory_ms == pytest.approx((4e6 + 8000) / 10e9 * 1e3)
    assert fl.bound == "memory" and fl.floor_ms == fl.memory_ms
    fast_memory = floor(cost, {"fp32": 0.001}, 1000.0)
    assert fast_memory.bound == "compute"
    eff, problem = efficiency_check(fl.floor_ms, fl.floor_ms * 2)
    assert eff == pytest.approx(0.5) and problem is None
    eff, problem = efficiency_check(fl.floor_ms, fl.floor_ms * 0.9)
    assert eff > 1 and problem is not None and "ceiling" in problem
    assert efficiency_check(fl.floor_ms, fl.floor_ms * 0.97)[1] is None  # within the 5% margin
    int8 = floor(cost, {"fp32": 0.1}, 10.0)
    assert not int8.notes
