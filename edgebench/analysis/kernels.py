"""Kernels: the units a runtime really executes, described the same way whether they come from a
runtime's per-op profile (what ran, with the shapes it saw) or from a model's graph (what will run).

A kernel-level predictor (edgebench.analysis.predict) learns, per device, runtime and thread count, what
each *kind* of kernel costs from profiled kernels, and predicts a model as the sum of its kernels. That only
works if a profiled kernel and a graph node of the same work get the same kind and the same features, so
both sides go through `describe` below:

- kinds are by the work, not by the runtime's name for it: a MatMul with constant weights, a Gemm and a
  1x1 convolution (MNN converts MatMuls into 1x1 convolutions; every CPU runtime runs a 1x1 convolution as
  a GEMM) are all `gemm` (`gemv` when fewer than GEMV_ROWS rows); `conv` is a dense KxK convolution (K > 1),
  `conv_dw` a depthwise one, `matmul` a product of two activations (attention scores), `deconv` a
  transposed convolution; `elementwise`, `norm`, `pool`, `softmax`, `resize`, `recurrent` as named;
  `view` ops only relabel a buffer (Reshape, Squeeze ...), `copy` ops move it (Transpose, Concat, Slice,
  MNN's Raster ...); `layout` are the runtime's own reorders (onnxruntime's NCHWc ReorderInput/Output),
  which no graph node stands for; `shape` is shape arithmetic a runtime could not fold; `control` If/Loop.
- features: FLOPs by edgebench's convention (2 x multiply-adds for GEMMs and convolutions, 1 per output
  element for pointwise work), activation bytes read and written, weight bytes.

Graph nodes become kernels through fusion rules (`graph_kernels`): a BatchNormalization after a
convolution or GEMM is folded into its weights, and an activation right after a convolution or GEMM runs
inside it (onnxruntime's FusedConv / FusedGemm, MNN's Conv+ReLU); both runtimes do so when loading.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .cost import ModelCost, NodeCost

GEMV_ROWS = 8  # a GEMM with fewer rows streams its weights once: memory-bound, its own kind

ITEMSIZE = {
    "float": 4,
    "float32": 4,
    "float16": 2,
    "double": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

KINDS = (
    "conv",
    "conv_dw",
    "deconv",
    "gemm",
    "gemv",
    "matmul",
    "elementwise",
    "norm",
    "pool",
    "softmax",
    "resize",
    "recurrent",
    "copy",
    "view",
    "layout",
    "shape",
    "control",
    "other",
)

_CONV = {"Conv", "FusedConv", "ConvInteger", "QLinearConv", "NhwcFusedConv", "Convolution", "ConvInt8"}
_DW = {"ConvolutionDepthwise", "DepthwiseConvInt8"}
_DECONV = {"ConvTranspose", "Deconvolution", "DeconvolutionDepthwise"}
_GEMM = {
    "MatMul",
    "Gemm",
    "FusedMatMul",
    "FusedGemm",
    "MatMulInteger",
    "QLinearMatMul",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QGemm",
    "MatMulNBits",
    "InnerProduct",
    "BatchMatMul",
}
_ELEMENTWISE = {
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Sum",
    "Mean",
    "Neg",
    "Abs",
    "Reciprocal",
    "Sqrt",
    "Exp",
    "Log",
    "Erf",
    "Sin",
    "Cos",
    "Tanh",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Relu",
    "LeakyRelu",
    "PRelu",
    "Elu",
    "Selu",
    "Gelu",
    "FastGelu",
    "BiasGelu",
    "QuickGelu",
    "Softplus",
    "Clip",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "And",
    "Or",
    "Not",
    "Xor",
    "Where",
    "Cast",
    "CastLike",
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "Mish",
    "Swish",
    "BinaryOp",
    "UnaryOp",
    "Eltwise",
    "ReLU",
    "ReLU6",
    "TanH",
    "Select",
    "BiasAdd",
    "Scale",
}
_NORM = {
    "BatchNormalization",
    "LayerNormalization",
    "SkipLayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "RMSNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "LayerNorm",
    "BatchNorm",
    "InstanceNorm",
    "Normalize",
}
_POOL = {
    "MaxPool",
    "AveragePool",
    "LpPool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "NhwcMaxPool",
    "Pooling",
    "Pooling3D",
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "ArgMax",
    "ArgMin",
    "Reduction",
    "TopK",
    "CumSum",
}
_SOFTMAX = {"Softmax", "LogSoftmax", "Hardmax"}
_RESIZE = {"Resize", "Upsample", "Interp"}
_RECURRENT = {"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM"}
_VIEW = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Dropout", "ExpandDims"}
_COPY = {
    "Transpose",
    "Concat",
    "Slice",
    "Split",
    "Gather",
    "GatherElements",
    "GatherND",
    "GatherV2",
    "Pad",
    "Tile",
    "Expand",
    "ScatterND",
    "ScatterElements",
    "DepthToSpace",
    "SpaceToDepth",
    "Raster",
    "Permute",
    "SliceTf",
    "StridedSlice",
    "Broadcast",
    "ConvertTensor",
    "Col2Im",
}
_LAYOUT = {"ReorderInput", "ReorderOutput", "MemcpyFromHost", "MemcpyToHost"}
_SHAPE = {"Shape", "Size", "ConstantOfShape", "Range", "NonZero", "Fill", "Rank"}
_CONTROL = {"If", "Loop", "Scan", "While"}
_ACTIVATIONS = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"}
_FOLDS_INTO = _CONV | _GEMM | _DECONV  # producers a BatchNormalization or an activation fuses into


@dataclass(frozen=True)
class Kernel:
    """One unit of work a runtime dispatches: its kind and the features its cost is learned on."""

    kind: str
    flops: float
    bytes: float  # activations read + written
    weight_bytes: float
    name: str = ""
    op_type: str = ""

    def features(self) -> tuple[float, float, float]:
        return self.flops, self.bytes, self.weight_bytes


Tensor = tuple[str, tuple[int, ...] | None]  # element type name, dims (None: unknown)


def _numel(dims: Sequence[int] | None) -> int:
    return math.prod(dims) if dims else (1 if dims is not None else 0)


def _nbytes(t: Tensor) -> int:
    return ITEMSIZE.get(t[0], 4) * _numel(t[1])


def _conv_kind(x: Sequence[int] | None, w: Sequence[int] | None, group: int | None, op_type: str) -> str:
    if op_type in _DW:
        return "conv_dw"
    if not w or len(w) < 3:
        return "conv"
    cin = x[1] if x and len(x) > 1 else None
    groups = group or (max(1, cin // w[1]) if cin and w[1] else 1)
    if groups > 1 and w[1] == 1:
        return "conv_dw"
    return "gemm" if _numel(w[2:]) == 1 and groups == 1 else "conv"


def describe(
    op_type: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    weights: Sequence[bool] = (),
    weight_bytes: float | None = None,
    activation_bytes: float | None = None,
    attrs: dict | None = None,
    runtime_macs: float | None = None,
    name: str = "",
) -> Kernel:
    """A kernel from its op type and tensors.

    `weights` marks which inputs are constants (graph side). A runtime's profile says instead how many
    bytes of parameters and activations the kernel moved (`weight_bytes`, `activation_bytes`) and may leave
    pre-packed weights out of its inputs, so shapes missing there are recovered from the output (a MatMul's
    N) or from the runtime's own count of multiply-adds (`runtime_macs`, MNN's getFlops: a convolution's
    kernel size, its weights).
    """
    attrs = attrs or {}
    const = list(weights) + [False] * (len(inputs) - len(weights))
    if activation_bytes is None:
        activation_bytes = sum(_nbytes(t) for t, c in zip(inputs, const, strict=False) if not c)
        activation_bytes += sum(_nbytes(t) for t in outputs)
    if weight_bytes is None:
        weight_bytes = sum(_nbytes(t) for t, c in zip(inputs, const, strict=False) if c)
    out = outputs[0][1] if outputs else None
    out_n = float(sum(_numel(t[1]) for t in outputs))
    x = inputs[0][1] if inputs else None
    kind, flops = _kind_and_flops(op_type, inputs, out, out_n, x, const, attrs, runtime_macs)
    if not weight_bytes and runtime_macs and kind in ("conv", "conv_dw", "gemm", "gemv", "deconv") and out:
        channels = out[1] if len(out) == 4 else out[-1]
        positions = out_n / max(1, channels)  # each weight is used once per output position
        weight_bytes = 4.0 * runtime_macs / max(1.0, positions)
    return Kernel(kind, flops, float(activation_bytes), float(weight_bytes), name, op_type)


def _kind_and_flops(
    op: str,
    inputs: Sequence[Tensor],
    out: Sequence[int] | None,
    out_n: float,
    x: Sequence[int] | None,
    const: Sequence[bool],
    attrs: dict,
    runtime_macs: float | None,
) -> tuple[str, float]:
    if op in _CONV or op in _DW:
        w = inputs[1][1] if len(inputs) > 1 else None
        if w and x:
            kind = _conv_kind(x, w, attrs.get("group"), op)
            if kind == "gemm":
                kind = _pointwise_gemm(out)
            return kind, 2.0 * out_n * _numel(w[1:])
        if runtime_macs is not None and x and len(x) > 1 and out_n:
            per_out = runtime_macs / out_n  # MNN: MACs = outputs x C_in / group x kernel size
            if op in _DW:
                return "conv_dw", 2.0 * runtime_macs
            if per_out > x[1] * 1.0001:
                return "conv", 2.0 * runtime_macs
            return _pointwise_gemm(out), 2.0 * runtime_macs
        return ("conv_dw" if op in _DW else "conv"), out_n
    if op in _DECONV:
        w = inputs[1][1] if len(inputs) > 1 else None
        if w and x:
            return "deconv", 2.0 * _numel(x) * _numel(w[1:])
        return "deconv", 2.0 * (runtime_macs or out_n)
    if op in _GEMM or op == "While" and runtime_macs and len(inputs) == 2:
        return _gemm(op, inputs, out, const, runtime_macs)
    for kinds, kind in (
        (_ELEMENTWISE, "elementwise"),
        (_NORM, "norm"),
        (_POOL, "pool"),
        (_SOFTMAX, "softmax"),
        (_RESIZE, "resize"),
        (_RECURRENT, "recurrent"),
        (_VIEW, "view"),
        (_COPY, "copy"),
        (_LAYOUT, "layout"),
        (_SHAPE, "shape"),
        (_CONTROL, "control"),
    ):
        if op in kinds:
            if kind in ("pool", "norm"):
                return kind, float(max(out_n, _numel(x)))
            return kind, out_n if kind in ("elementwise", "softmax", "resize") else 0.0
    return "other", out_n


def _pointwise_gemm(out: Sequence[int] | None) -> str:
    """A 1x1 convolution is a GEMM with one row per output position (batch x height x width)."""
    rows = _numel(out) // max(1, out[1]) if out and len(out) > 1 else 1
    return "gemv" if rows < GEMV_ROWS else "gemm"


def _gemm(
    op: str,
    inputs: Sequence[Tensor],
    out: Sequence[int] | None,
    const: Sequence[bool],
    runtime_macs: float | None,
) -> tuple[str, float]:
    """GEMM-like work: rows M, depth K, columns N from the first input and the output."""
    a = inputs[0][1] if inputs else None
    if not a or not out:
        return "gemm", 2.0 * (runtime_macs or 0.0)
    n = out[-1]
    if op in ("Gemm", "FusedGemm", "QGemm", "InnerProduct"):
        m = out[0] if len(out) > 1 else 1
        k = _numel(a) // max(1, m)
    else:
        k = a[-1]
        m = _numel(out) // max(1, n)
    b_const = len(const) > 1 and const[1]
    b_missing = len(inputs) < 2  # pre-packed by the runtime: a constant
    activations_only = len(inputs) >= 2 and not b_const and not b_missing and op != "Gemm"
    if activations_only and len(inputs[1][1] or ()) > 2:
        kind = "matmul"  # batched product of two activations (attention)
    else:
        rows = _numel(out[:-1]) if out else 1
        kind = "gemv" if rows < GEMV_ROWS else "gemm"
    return kind, 2.0 * m * n * k


def graph_kernels(cost: ModelCost, runtime: str = "onnxruntime") -> list[Kernel]:
    """The kernels a runtime will dispatch for a model, from its graph (fusion rules in the docstring).

    Shape arithmetic the analysis resolved statically is left out when the model's inputs are fully known
    (runtimes fold it then), kept as `shape` kernels otherwise.
    """
    nodes = list(cost.nodes)
    consumers: dict[str, int] = {}
    for n in nodes:
        for name in n.inputs:
            if name:
                consumers[name] = consumers.get(name, 0) + 1
    producer = {o: n for n in nodes for o in n.outputs if o}
    absorbed: dict[str, NodeCost] = {}  # node name -> the kernel it runs inside
    for n in nodes:
        if n.op_type not in ("BatchNormalization", "Add", *_ACTIVATIONS) or not n.inputs:
            continue
        data = _bias_data_input(n) if n.op_type == "Add" else 0
        if data is None:
            continue
        p = producer.get(n.inputs[data])
        head = absorbed.get(p.name, p) if p is not None else None
        if head is None or head.op_type not in _FOLDS_INTO or consumers.get(n.inputs[data], 0) != 1:
            continue
        if n.op_type == "Add" and not _fuses_bias(head):
            continue
        if n.op_type not in ("BatchNormalization", "Add") and not _fuses_activation(head, n, runtime):
            continue
        absorbed[n.name] = head
    out = [_node_kernel(n) for n in nodes if n.name not in absorbed]
    out += [_node_kernel(n, kind="shape") for n in cost.meta_nodes if n.op_type in _SHAPE or runtime == ""]
    return out


def _bias_data_input(add: NodeCost) -> int | None:
    """Which input of an Add is the data when the other is a constant (a bias), else None."""
    const = list(add.constant_inputs) + [False] * (len(add.inputs) - len(add.constant_inputs))
    if len(add.inputs) != 2 or const[0] == const[1]:
        return None
    return 1 if const[0] else 0


def _fuses_bias(head: NodeCost) -> bool:
    """A constant Add after a convolution, a Gemm or a 2-D MatMul becomes the kernel's bias (onnxruntime's
    MatMulAddFusion makes a Gemm of the 2-D MatMul; MNN's converter folds it); after a batched MatMul it
    stays a kernel of its own."""
    if head.op_type != "MatMul":
        return True
    out = head.output_shapes[0] if head.output_shapes else None
    return out is not None and len(out) == 2


def _fuses_activation(head: NodeCost, act: NodeCost, runtime: str) -> bool:
    """Which activations a runtime runs inside the convolution or GEMM before them."""
    if head.op_type in _DECONV:
        return False
    if runtime == "mnn":
        if act.op_type == "Relu":
            return True
        return act.op_type == "Clip" and head.op_type in _CONV
    return head.op_type in _CONV or act.op_type == "Relu"


def _node_kernel(n: NodeCost, kind: str | None = None) -> Kernel:
    elem = {"fp32": "float", "fp16": "float16", "bf16": "float16", "fp64": "double"}.get(n.dtype, "float")
    ins: list[Tensor] = [(elem, s) for s in n.input_shapes]
    outs: list[Tensor] = [(elem, s) for s in n.output_shapes]
    k = describe(
        n.op_type,
        ins,
        outs,
        weights=n.constant_inputs,
        weight_bytes=float(n.weight_bytes),
        attrs=dict(n.attrs),
        name=n.name,
    )
    if n.op_type in _GEMM | _CONV | _DECONV and n.flops:
        k = Kernel(k.kind, float(n.flops), k.bytes, k.weight_bytes, k.name, k.op_type)
    if kind is not None:
        k = Kernel(kind, 0.0, 0.0, 0.0, n.name, n.op_type)
    return k


def profile_kernel(
    op_type: str,
    inputs: Iterable[Sequence],
    outputs: Iterable[Sequence],
    parameter_bytes: float | None = None,
    runtime_flops: float | None = None,
    activation_bytes: float | None = None,
    name: str = "",
) -> Kernel:
    """A kernel from a per-op profile record's annotations (edgebench.probes.profile)."""
    ins: list[Tensor] = [(str(t), tuple(int(d) for d in dims)) for t, dims in inputs]
    outs: list[Tensor] = [(str(t), tuple(int(d) for d in dims)) for t, dims in outputs]
    k = describe(
        op_type,
        ins,
        outs,
        weight_bytes=parameter_bytes,
        activation_bytes=activation_bytes,
        runtime_macs=runtime_flops,
        name=name,
    )
    implied = _implied_weight_bytes(k, outs[0][1] if outs else None)
    if implied > k.weight_bytes:  # the runtime pre-packed the weights and counts the bias only
        k = Kernel(k.kind, k.flops, k.bytes, implied, k.name, k.op_type)
    return k


def _implied_weight_bytes(k: Kernel, out: Sequence[int] | None) -> float:
    """fp32 weight bytes of a GEMM or convolution from its work: each weight is used once per output
    position (a GEMM's rows, a convolution's pixels), so weights = FLOPs / 2 / positions."""
    if k.kind not in ("gemm", "gemv", "conv", "conv_dw") or not out or not k.flops:
        return 0.0
    channels = out[1] if len(out) == 4 else out[-1]
    positions = _numel(out) / max(1, channels)
    if k.kind == "conv_dw":
        return 4.0 * k.flops / 2.0 / max(1.0, positions) if positions else 0.0
    return 4.0 * k.flops / 2.0 / max(1.0, positions)
