"""A calibration sweep for the kernel-level predictor: synthetic models of single kernels at many shapes.

A predictor calibrated on a handful of real models only knows the shapes those models use; a held-out model
with larger activations (a detector at 640x640) or bigger weights (an MLP whose weights leave the cache)
would be extrapolated. nn-Meter calibrates each device on kernels sampled over their configuration space;
here that is a few ONNX models built with onnx.helper, each a set of independent chains of the kernels
CPU vision and sequence models are made of (dense, depthwise and pointwise convolutions, GEMMs and GEMVs,
elementwise work and activations, pooling, resizing, concatenation, normalisation, attention products) at
sizes from cache-resident to well beyond the last-level cache. They are profiled like any model (the
`profile` probe, once per device, runtime and thread count); their kernels join the fit but never the
per-inference overhead (their latency is no real model's) and they are never held out.

Shapes are a fixed grid, not sampled from the models to be predicted, so a held-out model never leaks in.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SWEEP_PREFIX = "kernel-sweep-"
SWEEP_REVISION = 5
OPSET = 17


@dataclass
class _Builder:
    """Accumulates one model's inputs, nodes, initializers and outputs."""

    rng: np.random.Generator
    inputs: list[onnx.ValueInfoProto]
    nodes: list[onnx.NodeProto]
    inits: list[onnx.TensorProto]
    outputs: list[str]
    count: int = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def input(self, shape: list[int]) -> str:
        name = self.name("in")
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        return name

    def const(self, array: np.ndarray) -> str:
        name = self.name("w")
        self.inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def const_int(self, values: list[int]) -> str:
        name = self.name("shape")
        self.inits.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def weights(self, shape: list[int], fan_in: int) -> str:
        return self.const(self.rng.standard_normal(shape) / np.sqrt(max(1, fan_in)))

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def output(self, name: str) -> None:
        self.outputs.append(name)

    def model(self, graph_name: str) -> onnx.ModelProto:
        """The model, with one small output: a runtime allocates graph outputs afresh on every run (page
        faults inside the kernels that write them), so the branches end in means summed into one scalar,
        and every other tensor lives in the runtime's planned memory as in a real model."""
        if len(self.outputs) > 1:
            means = [self.op("ReduceMean", [t], keepdims=0) for t in self.outputs]
            self.outputs = [self.op("Sum", means)]
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, [], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
        model.graph.output.extend(inferred[name] for name in self.outputs)
        model.producer_name = "edgebench"
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def _builder(seed: int) -> _Builder:
    return _Builder(np.random.default_rng(seed), [], [], [], [])


def _conv(b: _Builder, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1) -> str:
    w = b.weights([cout, cin // group, k, k], cin // group * k * k)
    bias = b.const(np.zeros(cout))
    pads = [k // 2] * 4
    return b.op("Conv", [x, w, bias], kernel_shape=[k, k], strides=[stride, stride], pads=pads, group=group)


def _vision_chain(b: _Builder, c: int, h: int, w: int, k: int) -> None:
    """A MobileNet/ResNet-like block at one size: dense kxk conv + ReLU, depthwise conv, pointwise conv,
    a hard-swish as PaddleOCR exports it, a residual Add, then pooling and a 2x resize."""
    x = b.input([1, c, h, w])
    y = b.op("Relu", [_conv(b, x, c, c, k)])
    y = _conv(b, y, c, c, 3 if k == 1 else k, group=c)
    y = _conv(b, y, c, 2 * c, 1)
    # hard-swish: x * clip(x + 3, 0, 6) / 6 (Add, Clip, Div, Mul: four elementwise kernels)
    t = b.op("Add", [y, b.const(np.array(3.0))])
    t = b.op("Clip", [t, b.const(np.array(0.0)), b.const(np.array(6.0))])
    t = b.op("Div", [t, b.const(np.array(6.0))])
    y = b.op("Mul", [y, t])
    s = b.op("Sigmoid", [y])
    y = b.op("Add", [y, s])
    y = _conv(b, y, 2 * c, c, 3, stride=2)
    b.output(b.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2]))
    g = b.op("GlobalAveragePool", [y])
    b.output(b.op("Mul", [y, g]))
    up = b.op("Resize", [y, "", b.const(np.array([1.0, 1.0, 2.0, 2.0]))], mode="nearest")
    b.output(b.op("Concat", [up, x], axis=1) if up and h % 2 == 0 and w % 2 == 0 else up)
    b.output(b.op("ConvTranspose", [y, b.weights([c, c // 2, 2, 2], c)], kernel_shape=[2, 2], strides=[2, 2]))


def _sequence_chain(b: _Builder, rows: int, width: int, hidden: int) -> None:
    """Transformer/MLP-like GEMMs (GEMVs at one row), LayerNorm, Softmax over an attention product."""
    x = b.input([rows, width])
    y = b.op("MatMul", [x, b.weights([width, hidden], width)])
    y = b.op("Add", [y, b.const(np.zeros(hidden))])
    y = b.op("Relu", [y])
    y = b.op("MatMul", [y, b.weights([hidden, width], hidden)])
    if rows >= 8:
        y = b.op("LayerNormalization", [y, b.const(np.ones(width)), b.const(np.zeros(width))], axis=-1)
        heads = b.op("Reshape", [y, b.const_int([4, rows, width // 4])])  # a batched product, as attention's
        scores = b.op("MatMul", [heads, b.op("Transpose", [heads], perm=[0, 2, 1])])
        b.output(b.op("Softmax", [scores], axis=-1))
        b.output(b.op("Tanh", [y]))
    else:
        b.output(y)


# (channels, height, width, kernel) of the vision chains and (rows, width, hidden) of the sequence chains:
# from a few kB of activations and weights to tens of MB, past every cache level. One chain per model, so
# that what stays cached from one inference to the next (which sets what a memory-bound kernel costs) is a
# single network's working set at each of these sizes, as in a real model.
VISION = (
    (8, 160, 160, 3),
    (16, 48, 320, 3),
    (16, 320, 320, 3),
    (24, 80, 80, 5),
    (32, 112, 112, 3),
    (48, 40, 40, 3),
    (64, 56, 56, 3),
    (96, 6, 80, 1),
    (128, 28, 28, 3),
    (256, 14, 14, 3),
    (512, 7, 7, 1),
)
SEQUENCE = (
    (1, 256, 512),
    (1, 512, 1024),
    (1, 1024, 2048),
    (1, 1024, 4096),
    (1, 1536, 4096),
    (16, 256, 1024),
    (64, 1024, 1024),
    (128, 256, 1024),
    (256, 512, 2048),
)


def sweep_models() -> dict[str, Callable[[], onnx.ModelProto]]:
    """The sweep's models by name, each well under a second per inference at one thread."""

    def vision(c: int, h: int, w: int, k: int) -> Callable[[], onnx.ModelProto]:
        def build() -> onnx.ModelProto:
            b = _builder(c * h + w + k)
            _vision_chain(b, c, h, w, k)
            return b.model("kernel_sweep")

        return build

    def sequence(rows: int, width: int, hidden: int) -> Callable[[], onnx.ModelProto]:
        def build() -> onnx.ModelProto:
            b = _builder(rows + width + hidden)
            _sequence_chain(b, rows, width, hidden)
            return b.model("kernel_sweep")

        return build

    out: dict[str, Callable[[], onnx.ModelProto]] = {}
    for dims in VISION:
        out[SWEEP_PREFIX + "conv-" + "x".join(map(str, dims))] = vision(*dims)
    for dims in SEQUENCE:
        out[SWEEP_PREFIX + "gemm-" + "x".join(map(str, dims))] = sequence(*dims)
    return out


def is_sweep(model: str) -> bool:
    return model.startswith(SWEEP_PREFIX)


def write_sweep(folder: Path) -> dict[str, Path]:
    """Write the sweep's models (once per revision) into `folder`; returns name -> path."""
    folder = folder / f"kernel-sweep.r{SWEEP_REVISION}"  # the file's stem is the model's name
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, build in sweep_models().items():
        path = folder / f"{name}.onnx"
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            onnx.save(build(), tmp)
            os.replace(tmp, path)
        out[name] = path
    return out


__all__ = ["SWEEP_PREFIX", "is_sweep", "sweep_models", "write_sweep"]
