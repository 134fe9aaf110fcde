"""Built-in models, generated with onnx.helper (no downloads), with seeded weights, so the same name
always gives the same bytes (and the same content hash)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ModelError
from .cache import generated_once

OPSET = 17
BUILTIN_REVISION = 1  # bump when a builder changes, so caches regenerate


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def _weights(rng: np.random.Generator, fan_in: int, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def build_mlp(
    hidden: int = 2048, width: int = 1024, layers: int = 3, batch: int | str = "batch", seed: int = 1
) -> onnx.ModelProto:
    """Memory-bound MLP: batch-1 GEMVs over ~34 MB of fp32 weights (about 0.5 FLOP per weight byte)."""
    rng = np.random.default_rng(seed)
    dims = [width] + [hidden] * (layers - 1) + [width]
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w, b = f"w{i}", f"b{i}"
        inits += [_init(w, _weights(rng, dims[i], (dims[i], dims[i + 1]))), _init(b, np.zeros(dims[i + 1]))]
        nodes.append(helper.make_node("MatMul", [prev, w], [f"mm{i}"], name=f"fc{i}/MatMul"))
        last = i == layers - 1
        out = "y" if last else f"h{i}"
        nodes.append(helper.make_node("Add", [f"mm{i}", b], [out if last else f"a{i}"], name=f"fc{i}/Add"))
        if not last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [out], name=f"fc{i}/Relu"))
        prev = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])],
        inits,
    )
    return _model(graph)


def build_convnet(size: int = 112, channels: int = 64) -> onnx.ModelProto:
    """Compute-bound conv stack: 3x3 convolutions over small weights (~0.6 GFLOP per image)."""
    rng = np.random.default_rng(2)
    nodes, inits = [], []
    specs = [(3, 32, 1), (32, channels, 2), (channels, channels, 1), (channels, channels, 1)]
    prev = "image"
    for i, (cin, cout, stride) in enumerate(specs):
        w, b = f"conv{i}.w", f"conv{i}.b"
        inits += [_init(w, _weights(rng, cin * 9, (cout, cin, 3, 3))), _init(b, np.zeros(cout))]
        nodes.append(
            helper.make_node(
                "Conv",
                [prev, w, b],
                [f"c{i}"],
                name=f"conv{i}",
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[stride, stride],
            )
        )
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    inits += [_init("fc.w", _weights(rng, channels, (channels, 10))), _init("fc.b", np.zeros(10))]
    nodes += [
        helper.make_node("GlobalAveragePool", [prev], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    return _model(graph)


def build_encoder(seq: int = 128, d_model: int = 256, heads: int = 4, ffn: int = 1024) -> onnx.ModelProto:
    """One transformer encoder block: self-attention plus GELU feed-forward, post-LayerNorm."""
    rng = np.random.default_rng(3)
    dh = d_model // heads
    inits = [
        _init("ln1.g", np.ones(d_model)),
        _init("ln1.b", np.zeros(d_model)),
        _init("ln2.g", np.ones(d_model)),
        _init("ln2.b", np.zeros(d_model)),
        numpy_helper.from_array(np.array([1, seq, heads, dh], dtype=np.int64), "split_shape"),
        numpy_helper.from_array(np.array([1, seq, d_model], dtype=np.int64), "merge_shape"),
        _init("scale", np.array(1.0 / np.sqrt(dh))),
        _init("half", np.array(0.5)),
        _init("one", np.array(1.0)),
        _init("rsqrt2", np.array(1 / np.sqrt(2))),
    ]
    for name, shape in [
        ("wq", (d_model, d_model)),
        ("wk", (d_model, d_model)),
        ("wv", (d_model, d_model)),
        ("wo", (d_model, d_model)),
        ("w1", (d_model, ffn)),
        ("w2", (ffn, d_model)),
    ]:
        inits.append(_init(name, _weights(rng, shape[0], shape)))
    inits += [_init("b1", np.zeros(ffn)), _init("b2", np.zeros(d_model))]
    n = helper.make_node
    nodes = []
    for p in ("q", "k", "v"):
        nodes += [
            n("MatMul", ["x", f"w{p}"], [f"{p}2"], name=f"attn/{p}_proj"),
            n("Reshape", [f"{p}2", "split_shape"], [f"{p}4"], name=f"attn/{p}_split"),
            n(
                "Transpose",
                [f"{p}4"],
                [f"{p}h"],
                name=f"attn/{p}_heads",
                perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3],
            ),
        ]
    nodes += [
        n("MatMul", ["qh", "kh"], ["scores"], name="attn/scores"),
        n("Mul", ["scores", "scale"], ["scaled"], name="attn/scale"),
        n("Softmax", ["scaled"], ["probs"], name="attn/softmax", axis=-1),
        n("MatMul", ["probs", "vh"], ["ctx"], name="attn/context"),
        n("Transpose", ["ctx"], ["ctx_t"], name="attn/merge_t", perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_t", "merge_shape"], ["ctx2"], name="attn/merge"),
        n("MatMul", ["ctx2", "wo"], ["attn_out"], name="attn/out_proj"),
        n("Add", ["x", "attn_out"], ["res1"], name="attn/residual"),
        n("LayerNormalization", ["res1", "ln1.g", "ln1.b"], ["h1"], name="ln1", axis=-1, epsilon=1e-5),
        n("MatMul", ["h1", "w1"], ["f1"], name="ffn/fc1"),
        n("Add", ["f1", "b1"], ["f1b"], name="ffn/fc1_bias"),
        # GELU written out with Erf so every runtime and opset takes it.
        n("Mul", ["f1b", "rsqrt2"], ["g0"], name="ffn/gelu_scale"),
        n("Erf", ["g0"], ["g1"], name="ffn/gelu_erf"),
        n("Add", ["g1", "one"], ["g2"], name="ffn/gelu_add"),
        n("Mul", ["f1b", "g2"], ["g3"], name="ffn/gelu_mul"),
        n("Mul", ["g3", "half"], ["gelu"], name="ffn/gelu_half"),
        n("MatMul", ["gelu", "w2"], ["f2"], name="ffn/fc2"),
        n("Add", ["f2", "b2"], ["f2b"], name="ffn/fc2_bias"),
        n("Add", ["h1", "f2b"], ["res2"], name="ffn/residual"),
        n("LayerNormalization", ["res2", "ln2.g", "ln2.b"], ["y"], name="ln2", axis=-1, epsilon=1e-5),
    ]
    graph = helper.make_graph(
        nodes,
        "encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, d_model])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, d_model])],
        inits,
    )
    return _model(graph)


def build_tinymlp() -> onnx.ModelProto:
    """Cache-resident MLP: batch-1 GEMVs over ~1.6 MB of weights, which stay in L2 between runs."""
    return build_mlp(hidden=512, width=256, layers=3, batch=1, seed=4)


def build_batchmlp() -> onnx.ModelProto:
    """Compute-bound MLP: the same GEMMs at batch 64 over ~12 MB of weights (~32 FLOP per weight byte)."""
    return build_mlp(hidden=1024, width=1024, layers=3, batch=64, seed=5)


def build_dwnet(size: int = 56, channels: int = 64, blocks: int = 3) -> onnx.ModelProto:
    """Mobile-style depthwise-separable blocks (3x3 depthwise, then 1x1 pointwise): few FLOPs and few
    weights per activation byte, the low-intensity end of a vision model."""
    rng = np.random.default_rng(6)
    nodes, inits, prev = [], [], "image"
    inits += [_init("stem.w", _weights(rng, 27, (channels, 3, 3, 3))), _init("stem.b", np.zeros(channels))]
    nodes.append(
        helper.make_node(
            "Conv", [prev, "stem.w", "stem.b"], ["s"], name="stem", kernel_shape=[3, 3], pads=[1] * 4
        )
    )
    nodes.append(helper.make_node("Relu", ["s"], ["s_r"], name="stem_relu"))
    prev = "s_r"
    for i in range(blocks):
        dw, pw = f"dw{i}", f"pw{i}"
        inits += [
            _init(f"{dw}.w", _weights(rng, 9, (channels, 1, 3, 3))),
            _init(f"{dw}.b", np.zeros(channels)),
        ]
        inits += [
            _init(f"{pw}.w", _weights(rng, channels, (channels, channels, 1, 1))),
            _init(f"{pw}.b", np.zeros(channels)),
        ]
        nodes += [
            helper.make_node(
                "Conv",
                [prev, f"{dw}.w", f"{dw}.b"],
                [f"{dw}.o"],
                name=dw,
                kernel_shape=[3, 3],
                pads=[1] * 4,
                group=channels,
            ),
            helper.make_node("Relu", [f"{dw}.o"], [f"{dw}.r"], name=f"{dw}_relu"),
            helper.make_node(
                "Conv", [f"{dw}.r", f"{pw}.w", f"{pw}.b"], [f"{pw}.o"], name=pw, kernel_shape=[1, 1]
            ),
            helper.make_node("Relu", [f"{pw}.o"], [f"{pw}.r"], name=f"{pw}_relu"),
        ]
        prev = f"{pw}.r"
    nodes.append(helper.make_node("GlobalAveragePool", [prev], ["y"], name="gap"))
    graph = helper.make_graph(
        nodes,
        "dwnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 1, 1])],
        inits,
    )
    return _model(graph)


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edgebench"
    )
    model.ir_version = 8  # readable by every onnxruntime and MNN converter still in use
    onnx.checker.check_model(model)
    return model


BUILTINS: dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp": build_mlp,
    "convnet": build_convnet,
    "encoder": build_encoder,
    "tinymlp": build_tinymlp,
    "batchmlp": build_batchmlp,
    "dwnet": build_dwnet,
}


def builtin_model(name: str, cache_dir: Path | None = None) -> Path:
    """Write the built-in model NAME (once) and return its path."""
    if name not in BUILTINS:
        known = ", ".join([*sorted(BUILTINS), "decoder:layers=L,hidden=H,heads=A,vocab=V,ffn=F,dtype=D"])
        raise ModelError(f"unknown built-in model '{name}' (known: {known})")
    return generated_once(cache_dir, f"{name}.r{BUILTIN_REVISION}.onnx", BUILTINS[name])
