"""Graph-side fusion rules of `kernels.graph_kernels`, on small graphs: which nodes each runtime runs as one
kernel (tests/integration/test_kernel_fusions.py checks the same against the real runtimes' profiles)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgebench.analysis.cost import analyze
from edgebench.analysis.kernels import graph_kernels

n_ = helper.make_node


def const(name: str, value) -> object:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def model(nodes, x: list, y: list, inits=(), dynamic: bool = False):
    dims = ["batch", *x[1:]] if dynamic else x
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        list(inits),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ops(m, runtime: str, shapes=None) -> Counter:
    return Counter(
        k.op_type for k in graph_kernels(analyze(m, shapes), runtime) if k.kind not in ("view", "shape")
    )


def test_a_residual_add_and_its_layer_norm_are_one_skip_layer_norm_on_onnxruntime() -> None:
    m = model(
        [
            n_("Sigmoid", ["x"], ["s"]),
            n_("Add", ["x", "s"], ["r"]),
            n_("LayerNormalization", ["r", "g", "b"], ["y"], axis=-1),
        ],
        [1, 8, 16],
        [1, 8, 16],
        [const("g", np.ones(16)), const("b", np.zeros(16))],
    )
    assert ops(m, "onnxruntime") == Counter({"Sigmoid": 1, "SkipLayerNormalization": 1})
    (skip,) = [k for k in graph_kernels(analyze(m), "onnxruntime") if k.kind == "norm"]
    assert skip.bytes == 3 * 8 * 16 * 4  # the two inputs and the output, as onnxruntime's profile says
    assert ops(m, "mnn") == Counter({"Sigmoid": 1, "Add": 1, "LayerNormalization": 1})


def test_a_layer_norm_exported_as_its_parts_is_one_kernel_on_both_runtimes() -> None:
    m = model(
        [
            n_("ReduceMean", ["x"], ["m"], axes=[-1]),
            n_("Sub", ["x", "m"], ["d"]),
            n_("Pow", ["d", "two"], ["sq"]),
            n_("ReduceMean", ["sq"], ["v"], axes=[-1]),
            n_("Add", ["v", "eps"], ["ve"]),
            n_("Sqrt", ["ve"], ["sd"]),
            n_("Div", ["d", "sd"], ["nrm"]),
            n_("Mul", ["nrm", "g"], ["sc"]),
            n_("Add", ["sc", "b"], ["y"]),
        ],
        [1, 8, 16],
        [1, 8, 16],
        [const("two", 2.0), const("eps", 1e-5), const("g", np.ones(16)), const("b", np.zeros(16))],
    )
    for runtime in ("onnxruntime", "mnn"):
        assert ops(m, runtime) == Counter({"LayerNormalization": 1}), runtime


def test_x_times_sigmoid_of_ax_is_one_quick_gelu_on_onnxruntime() -> None:
    m = model(
        [n_("Mul", ["x", "a"], ["ax"]), n_("Sigmoid", ["ax"], ["s"]), n_("Mul", ["x", "s"], ["y"])],
        [1, 64],
        [1, 64],
        [const("a", 1.702)],
    )
    assert ops(m, "onnxruntime") == Counter({"QuickGelu": 1})
    assert ops(m, "mnn") == Counter({"Mul": 2, "Sigmoid": 1})


def test_an_erf_gelu_is_one_unary_op_on_mnn() -> None:
    m = model(
        [
            n_("Div", ["x", "sqrt2"], ["g0"]),
            n_("Erf", ["g0"], ["g1"]),
            n_("Add", ["g1", "one"], ["g2"]),
            n_("Mul", ["x", "g2"], ["g3"]),
            n_("Mul", ["g3", "half"], ["y"]),
        ],
        [1, 64],
        [1, 64],
        [const("sqrt2", np.sqrt(2)), const("one", 1.0), const("half", 0.5)],
    )
    assert ops(m, "mnn") == Counter({"UnaryOp": 1})
    assert sum(ops(m, "onnxruntime").values()) == 5


def test_a_scale_after_a_matmul_of_activations_runs_inside_it_on_onnxruntime() -> None:
    m = model(
        [
            n_("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
            n_("MatMul", ["x", "xt"], ["s"]),
            n_("Mul", ["s", "scale"], ["y"]),
        ],
        [1, 8, 16],
        [1, 8, 8],
        [const("scale", 0.25)],
    )
    assert ops(m, "onnxruntime") == Counter({"Transpose": 1, "MatMul": 1})
    assert ops(m, "mnn") == Counter({"Transpose": 1, "MatMul": 1, "Mul": 1})


@pytest.mark.parametrize(("dynamic", "fused"), [(False, True), (True, False)])
def test_a_3d_matmul_takes_its_bias_on_onnxruntime_only_when_the_model_declares_its_shapes(
    dynamic: bool, fused: bool
) -> None:
    m = model(
        [n_("MatMul", ["x", "w"], ["h"]), n_("Add", ["h", "b"], ["y"])],
        [1, 8, 16],
        [1, 8, 4],
        [const("w", np.zeros((16, 4))), const("b", np.zeros(4))],
        dynamic=dynamic,
    )
    shapes = {"x": [1, 8, 16]} if dynamic else None
    assert ops(m, "onnxruntime", shapes) == (
        Counter({"MatMul": 1}) if fused else Counter({"MatMul": 1, "Add": 1})
    )
    views = [k for k in graph_kernels(analyze(m, shapes), "onnxruntime") if k.kind == "view"]
    assert len(views) == (2 if fused else 0)  # the Gemm's reshapes to two dimensions and back
    assert ops(m, "mnn", shapes) == Counter({"MatMul": 1})  # MNN's converter folds it either way
