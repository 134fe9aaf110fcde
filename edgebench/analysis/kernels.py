"""Kernels: the units a runtime really executes, described the same way whether they come from a
runtime's per-op profile (what ran, with the shapes it saw) or from a model's graph (what will run).

A kernel-level predictor (edgebench.analysis.kernel_predict) learns, per device, runtime and thread
count, what each *kind* of kernel costs from profiled kernels, and predicts a model as the sum of its
kernels. That only works if a profiled kernel and a graph node of the same work get the same kind and the
same features, so both sides go through `describe` below:

- kinds are by the work, not by the runtime's name for it: a MatMul with constant weights, a Gemm and a
  1x1 convolution (MNN converts MatMuls into 1x1 convolutions; every CPU runtime runs a 1x1 convolution as
  a GEMM) are all `gemm` (`gemv` when fewer than GEMV_ROWS rows); `conv` is a dense KxK convolution (K > 1;
  `gemv` too with fewer than GEMV_ROWS output positions), `conv_dw` a depthwise one, `matmul` a product
  of two activations (attention scores), `deconv` a transposed convolution;
  `elementwise`, `norm`, `pool`, `softmax`, `resize`, `recurrent` as named;
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
from dataclasses import dataclass, replace

from ..runtimes import KernelRules, kernel_rules
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

_CONV = {
    "Conv",
    "FusedConv",
    "ConvInteger",
    "QLinearConv",
    "NhwcFusedConv",
    "Convolution",
    "ConvInt8",
    "Convolution1D",  # ncnn's
}
# MNN's names and ncnn's (ConvolutionDepthWise, DeconvolutionDepthWise)
_DW = {"ConvolutionDepthwise", "ConvolutionDepthWise", "DepthwiseConvInt8"}
_DECONV = {"ConvTranspose", "Deconvolution", "DeconvolutionDepthwise", "DeconvolutionDepthWise"}
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
    "MultiHeadAttention",  # ncnn's: its four projections carry the work
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
    "Crop",  # ncnn's
    "Padding",
}
_LAYOUT = {"ReorderInput", "ReorderOutput", "MemcpyFromHost", "MemcpyToHost"}
_SHAPE = {"Shape", "Size", "ConstantOfShape", "Range", "NonZero", "Fill", "Rank"}
_CONTROL = {"If", "Loop", "Scan", "While"}
_ACTIVATIONS = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"}
_FOLDS_INTO = _CONV | _GEMM | _DECONV  # producers a BatchNormalization or an activation fuses into
# ONNX ops MNN runs as its UnaryOp (an exported hard-swish too, fused by its converter)
_MNN_UNARY = {
    "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Sigmoid", "Tanh", "Erf", "HardSwish", "Softplus",
    "Floor", "Ceil", "Round", "Sign", "Sin", "Cos",
}  # fmt: skip


@dataclass(frozen=True)
class Kernel:
    """One unit of work a runtime dispatches: its kind and the features its cost is learned on."""

    kind: str
    flops: float
    bytes: float  # activations read + written
    weight_bytes: float
    name: str = ""
    op_type: str = ""
    # channels in, channels out (a GEMM's K and N), output positions (pixels, rows), multiply-adds per
    # output: the shape a kernel's efficiency depends on beyond its totals (kernel size, depthwise, width)
    geometry: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    # an MNN unary op reading what a convolution just wrote as a GEMM over whole tiles (`reads_gemm_tiles`)
    reads_gemm_tiles: bool = False

    def features(self) -> tuple[float, float, float]:
        return self.flops, self.bytes, self.weight_bytes


def _channels(op_type: str, dims: Sequence[int]) -> int:
    """A tensor's channels: axis 1 of a convolution's N, C, ... tensors at any rank (a 1-D convolution's
    [N, C, L] too), of any other 4-D (NCHW) tensor, else the last axis (a GEMM's features)."""
    if len(dims) == 4 or (len(dims) >= 3 and op_type in _CONV | _DW | _DECONV):
        return int(dims[1])
    return int(dims[-1])


def _geometry(
    flops: float, x: Sequence[int] | None, out: Sequence[int] | None, op_type: str = ""
) -> tuple[float, ...]:
    if not out:
        return (0.0, 0.0, 0.0, 0.0)
    out_n = float(_numel(out))
    cout = float(_channels(op_type, out)) if len(out) else 1.0
    cin = float(_channels(op_type, x)) if x else 0.0
    positions = out_n / max(1.0, cout)
    return (cin, cout, positions, flops / 2.0 / max(1.0, out_n))


Tensor = tuple[str, tuple[int, ...] | None]  # element type name, dims (None: unknown)


def _element_type(dtype: str) -> str:
    """A graph node's dtype (fp32, fp16 ...) as the element-type names profiles use (float, float16 ...)."""
    return {"fp16": "float16", "bf16": "float16", "fp64": "double"}.get(dtype, "float")


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
        positions = out_n / max(1, _channels(op_type, out))  # each weight is used once per output position
        weight_bytes = 4.0 * runtime_macs / max(1.0, positions)
    if kind == "deconv" and not (len(inputs) > 1 and inputs[1][1] and len(inputs[1][1]) == 4):
        implied = _deconv_weight(x, out, attrs)  # a profile that left the packed weights out
        weight_bytes = max(weight_bytes, 4.0 * _numel(implied)) if implied else weight_bytes
    if kind == "recurrent":
        weight_bytes = max(weight_bytes, _recurrent_cost(op_type, x, out, attrs)[1])
    geometry = _geometry(flops, x, out, op_type)
    return Kernel(kind, flops, float(activation_bytes), float(weight_bytes), name, op_type, geometry)


def _deconv_weight(x: Sequence[int] | None, out: Sequence[int] | None, attrs: dict) -> tuple[int, ...] | None:
    """A transposed convolution's weight dims from its tensors alone, for profiles that list neither the
    weights nor the attributes (onnxruntime's): a kernel as large as the upsampling factor (k = s, no
    overlap, as detectors' necks use), the channels from input and output."""
    if not x or not out or len(x) != 4 or len(out) != 4 or not x[2] or out[2] % x[2]:
        return None
    k = out[2] // x[2]
    group = int(attrs.get("group") or 1)
    return (x[1], out[1] // max(1, group), k, k)


_GATES = {"LSTM": 4, "DynamicQuantizeLSTM": 4, "GRU": 3, "RNN": 1}


def _recurrent_cost(
    op: str, x: Sequence[int] | None, out: Sequence[int] | None, attrs: dict
) -> tuple[float, float]:
    """FLOPs and fp32 weight bytes of a recurrent layer from its input [seq, batch, in] and hidden size
    (the attribute, else the output's last dim): the same on a graph and on a profile that left the packed
    weights out (onnxruntime's lists only the data and the state)."""
    if not x or len(x) != 3 or not out:
        return 0.0, 0.0
    seq, batch, width = x
    hidden = int(attrs.get("hidden_size") or out[-1])
    dirs = 2 if attrs.get("direction") in ("bidirectional", b"bidirectional") else 1
    per_step = _GATES.get(op, 4) * hidden * (width + hidden)
    return 2.0 * seq * batch * dirs * per_step, 4.0 * dirs * (per_step + 2 * _GATES.get(op, 4) * hidden)


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
            elif kind == "conv":
                kind = _dense_conv(out)
            return kind, 2.0 * out_n * _numel(w[1:])
        if runtime_macs is not None and x and len(x) > 1 and out_n:
            per_out = runtime_macs / out_n  # MNN: MACs = outputs x C_in / group x kernel size
            if op in _DW:
                return "conv_dw", 2.0 * runtime_macs
            if per_out > x[1] * 1.0001:
                return _dense_conv(out), 2.0 * runtime_macs
            return _pointwise_gemm(out), 2.0 * runtime_macs
        return ("conv_dw" if op in _DW else "conv"), out_n
    if op in _DECONV:
        w = inputs[1][1] if len(inputs) > 1 else None
        w = w if w and len(w) == 4 else _deconv_weight(x, out, attrs)
        if w and x:
            return "deconv", 2.0 * _numel(x) * _numel(w[1:])
        return "deconv", 2.0 * (runtime_macs or out_n)
    if op in _RECURRENT:
        return "recurrent", _recurrent_cost(op, x, out, attrs)[0]
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


def _positions(out: Sequence[int] | None) -> int:
    """A convolution's output positions (batch x height x width): the rows of the GEMM it runs as."""
    return _numel(out) // max(1, out[1]) if out and len(out) > 1 else 1


def _pointwise_gemm(out: Sequence[int] | None) -> str:
    """A 1x1 convolution is a GEMM with one row per output position."""
    return "gemv" if _positions(out) < GEMV_ROWS else "gemm"


def _dense_conv(out: Sequence[int] | None) -> str:
    """A KxK convolution is an (im2col) GEMM with one row per output position: with fewer than GEMV_ROWS
    of them each weight serves a few multiply-adds only, so it streams its weights like a GEMV (silero-vad's
    front end: a few positions, a quarter MB of weights per layer)."""
    return "gemv" if _positions(out) < GEMV_ROWS else "conv"


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


UNKNOWN_DEVICE = -1  # a gemm_tile for "the device is not known"

# The runtime-specific graph fusions a `KernelRules.fusions` can name (applied in graph_kernels).
FUSIONS = ("erf-gelu", "quick-gelu", "skip-layer-norm", "matmul-scale")


def graph_kernels(
    cost: ModelCost,
    runtime: str = "onnxruntime",
    nchwc_block: int = 1,
    gemm_tile: int | None = UNKNOWN_DEVICE,
) -> list[Kernel]:
    """The kernels a runtime will dispatch for a model, from its graph (fusion rules in the docstring).

    The runtime's rules are its `edgebench.runtimes` module's `KernelRules` ("": no runtime, the common
    fusions only). `nchwc_block` is the device's NCHWc channel block (`Runtime.block`; 1: none): a
    runtime with NCHWc layouts has its layout reorders predicted at it. `gemm_tile` is the runtime's GEMM
    tile on the device (`Runtime.gemm_tile`; None: unknown, no unary op is marked as reading whole tiles).

    Shape arithmetic the analysis resolved statically is left out when the model's inputs are fully known
    (runtimes fold it then), kept as `shape` kernels otherwise.
    """
    rules = kernel_rules(runtime)
    if gemm_tile == UNKNOWN_DEVICE:
        gemm_tile = rules.unknown_device_gemm_tile
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
        if n.op_type == "Add" and not _fuses_bias(head, rules, cost.declared_static):
            continue
        if n.op_type not in ("BatchNormalization", "Add") and not _fuses_activation(head, n, rules):
            continue
        absorbed[n.name] = head
    hidden, swish_reads = (
        _hard_swish_parts(nodes, consumers, producer) if rules.hard_swish_as_unary else (set(), {})
    )
    adds = {n.name: n.op_type == "Add" for n in nodes}
    fused: dict[str, Kernel] = {}  # node name -> the fused kernel that runs in its place
    fused.update(_layer_norms(nodes, hidden))
    for fusion in rules.fusions:
        if fusion == "erf-gelu":
            fused.update(_erf_gelus(nodes, consumers, producer, hidden))
        elif fusion == "quick-gelu":
            fused.update(_quick_gelus(nodes, producer, hidden))
        elif fusion == "skip-layer-norm":
            fused.update(_skip_layer_norms(nodes, consumers, producer, absorbed))
        elif fusion == "matmul-scale":
            absorbed.update(_matmul_scales(nodes, consumers, producer))
        else:
            raise ValueError(f"runtime '{runtime}': unknown fusion '{fusion}' (known: {', '.join(FUSIONS)})")
    block = nchwc_block if rules.nchwc_layout else 1
    steps = {n.name: _mnn_lstm_step(n) for n in nodes if n.op_type == "LSTM"} if rules.lstm_as_steps else {}
    out = []
    for n in nodes:
        if n.name in absorbed or n.name in hidden:
            continue
        kernels = steps.get(n.name) or [fused.get(n.name) or _nchwc_node_kernel(n, block)]
        if rules.marks_gemm_tile_reads and _reads_gemm_tiles(n, swish_reads, producer, absorbed, gemm_tile):
            kernels = [replace(k, reads_gemm_tiles=True) for k in kernels]
        out += kernels
    # a HardSigmoid run as several kernels (MNN: a scale, a shift and a ReLU6)
    out += [
        _node_kernel(n)
        for n in nodes
        if n.op_type == "HardSigmoid"
        for _ in range(rules.hard_sigmoid_kernels - 1)
    ]
    if rules.nchwc_layout:
        out += nchwc_reorders(nodes, absorbed, nchwc_block)
    if rules.reshapes_around_batched_gemm:
        # a MatMul of more than two dimensions that took its bias runs as a Gemm between two reshapes
        out += [
            Kernel("view", 0.0, 0.0, 0.0, f"{head.name}/reshape", "Reshape")
            for head in {
                h.name: h for n, h in absorbed.items() if h.op_type == "MatMul" and adds.get(n)
            }.values()
            if head.output_shapes and len(head.output_shapes[0] or ()) > 2
            for _ in range(2)
        ]
    out += [
        _node_kernel(n, kind="shape")
        for n in cost.meta_nodes
        if n.op_type in _SHAPE or not rules.folds_static_shapes
    ]
    return out


def _mnn_lstm_step(n: NodeCost) -> list[Kernel] | None:
    """The 23 ops MNN runs a one-step, one-direction LSTM as (None for any other LSTM): the input's and the
    state's projections onto all four gates, each a GEMV (a 1x1 convolution) between copies into its
    layout, their sum, then the gates' element-wise work (5 unary and 4 binary ops) between 9 more copies
    that slice the gates and lay out the state. A streaming model steps so; its profile shows these ops."""
    x, w = (n.input_shapes + (None, None))[:2]  # X [steps, batch, input], W [directions, 4 x hidden, input]
    if not x or not w or len(x) != 3 or len(w) != 3 or x[0] != 1 or w[0] != 1:
        return None
    batch, size, h = int(x[1]), int(x[2]), int(w[1]) // 4
    elem = _element_type(n.dtype)

    def t(channels: int, c_out: int = 0) -> Tensor:
        return elem, (c_out, channels, 1, 1) if c_out else (batch, channels, 1, 1)

    def op(op_type: str, ins: list[Tensor], out: Tensor, weights: Sequence[bool] = ()) -> Kernel:
        return describe(op_type, ins, [out], weights=weights, name=n.name)

    def projection(width: int) -> list[Kernel]:
        gates = op(
            "Convolution", [t(width), t(width, 4 * h), (elem, (4 * h,))], t(4 * h), (False, True, True)
        )
        return [op("Raster", [t(width)], t(width)), gates]

    kernels = [*projection(size), *projection(h), op("BinaryOp", [t(4 * h), t(4 * h)], t(4 * h))]
    kernels += [op("Raster", [t(4 * h)], t(h)) for _ in range(4)]  # a gate sliced out
    kernels += [op("Raster", [t(h)], t(h)) for _ in range(5)]
    kernels += [op("UnaryOp", [t(h)], t(h)) for _ in range(5)]
    kernels += [op("BinaryOp", [t(h), t(h)], t(h)) for _ in range(4)]
    return kernels


def _hard_swish_parts(
    nodes: Sequence[NodeCost], consumers: dict[str, int], producer: dict[str, NodeCost]
) -> tuple[set[str], dict[str, str]]:
    """The parts of an exported hard-swish, x * clip(x + 3, 0, 6) / 6 (Add, Clip, Mul and Div in either
    order), but the last: MNN's converter fuses the four into one unary op, kept as the last's kernel.
    Also: the last part's node name -> x, the tensor the fused op reads."""
    hidden: set[str] = set()
    reads: dict[str, str] = {}
    users = _users(nodes)
    for mul in nodes:
        if mul.op_type != "Mul" or len(mul.inputs) != 2 or any(mul.constant_inputs):
            continue
        for x, t in (mul.inputs, mul.inputs[::-1]):
            scaled = _chain_back(producer, t, ("Div", "Mul"), ("Clip",), ("Add",))
            clipped = _chain_back(producer, t, ("Clip",), ("Add",))
            if scaled and scaled[-1].inputs[0] == x:
                parts, last = scaled, [mul]  # x * (clip(x + 3) / 6): the Mul is the kernel
            elif clipped and clipped[-1].inputs[0] == x and consumers.get(mul.outputs[0], 0) == 1:
                parts, last = [*clipped, mul], users.get(mul.outputs[0], [])  # the Div after it is
            else:
                continue
            if all(consumers.get(n.outputs[0], 0) == 1 for n in parts if n.outputs):
                hidden.update(n.name for n in parts)
                reads.update((n.name, x) for n in last)
                break
    return hidden, reads


def runs_gemm_tiles(
    conv: Kernel, x: Sequence[int] | None, out: Sequence[int] | None, tile: int | None
) -> bool:
    """Whether MNN runs a dense convolution as one GEMM over a whole number of GEMM tiles of
    output positions: a 1x1 or a strided one (a stride-1 kxk runs its own way) whose batch x height x width
    divides by the tile (`Runtime.gemm_tile` of the device; None: no tile known, never). From the sizes alone
    (a profile has no attributes), as both sides see them."""
    if tile is None:
        return False
    if conv.op_type not in _CONV or conv.kind not in ("conv", "gemm") or not x or not out or len(x) < 3:
        return False
    cin, _, positions, macs_per_output = conv.geometry
    pointwise = macs_per_output < cin + 1  # a kxk window makes k*k multiply-adds per channel in
    strided = _numel(x[2:]) >= 2 * _numel(out[2:])
    return (pointwise or strided) and round(positions) % tile == 0


def _reads_gemm_tiles(
    n: NodeCost,
    swish_reads: dict[str, str],
    producer: dict[str, NodeCost],
    absorbed: dict[str, NodeCost],
    tile: int | None,
) -> bool:
    """Whether a graph node runs as an MNN unary op reading a convolution `runs_gemm_tiles` wrote (what a
    BatchNormalization or an activation fused into it counts as the convolution's)."""
    x = swish_reads.get(n.name) or (n.inputs[0] if n.op_type in _MNN_UNARY and n.inputs else None)
    p = producer.get(x) if x else None
    head = absorbed.get(p.name, p) if p is not None else None
    if head is None or head.op_type not in _CONV or not head.input_shapes or not head.output_shapes:
        return False
    return runs_gemm_tiles(_node_kernel(head), head.input_shapes[0], head.output_shapes[0], tile)


def mark_gemm_tile_reads(
    kernels: Sequence[tuple[Kernel, Sequence[int] | None, Sequence[int] | None]],
    tile: int | None,
) -> list[Kernel]:
    """A profile's kernels as they ran, each with its input and output dims: MNN's unary ops that read what
    the kernel before them wrote as a GEMM over whole tiles (`runs_gemm_tiles`) marked so."""
    out = []
    for i, (k, x, _) in enumerate(kernels):
        before = kernels[i - 1] if i else None
        reads = (
            before is not None
            and k.op_type == "UnaryOp"
            and _numel(x) == _numel(before[2])
            and runs_gemm_tiles(*before, tile)
        )
        out.append(replace(k, reads_gemm_tiles=True) if reads else k)
    return out


def _users(nodes: Sequence[NodeCost]) -> dict[str, list[NodeCost]]:
    users: dict[str, list[NodeCost]] = {}
    for n in nodes:
        for name in n.inputs:
            if name:
                users.setdefault(name, []).append(n)
    return users


def _fused_kernel(op_type: str, first: NodeCost, inputs: Sequence[int], last: NodeCost, extra=()) -> Kernel:
    """One kernel for a fused chain: `first`'s inputs at `inputs` (and `extra` constants) in, `last`'s out."""
    elem = _element_type(first.dtype)
    ins: list[Tensor] = [(elem, first.input_shapes[i]) for i in inputs if i < len(first.input_shapes)]
    ins += [(elem, s) for s in extra]
    outs: list[Tensor] = [(elem, s) for s in last.output_shapes[:1]]
    weights = [False] * (len(ins) - len(extra)) + [True] * len(extra)
    return describe(op_type, ins, outs, weights=weights, name=last.name)


def _skip_layer_norms(
    nodes: Sequence[NodeCost],
    consumers: dict[str, int],
    producer: dict[str, NodeCost],
    absorbed: dict[str, NodeCost],
) -> dict[str, Kernel]:
    """onnxruntime's SkipLayerNormFusion: a residual Add of two activations of one shape feeding only a
    LayerNormalization runs with it as one SkipLayerNormalization (the Add joins `absorbed`)."""
    out: dict[str, Kernel] = {}
    for ln in nodes:
        if ln.op_type != "LayerNormalization" or not ln.inputs:
            continue
        add = producer.get(ln.inputs[0])
        if add is None or add.op_type != "Add" or add.name in absorbed or len(add.inputs) != 2:
            continue
        shapes = add.input_shapes
        if any(add.constant_inputs) or len(shapes) != 2 or shapes[0] != shapes[1] or shapes[0] is None:
            continue
        if consumers.get(add.outputs[0], 0) != 1 or ln.attr("axis", -1) not in (-1, len(shapes[0]) - 1):
            continue
        absorbed[add.name] = ln
        params = [s for s, c in zip(ln.input_shapes[1:], ln.constant_inputs[1:], strict=False) if c]
        out[ln.name] = _fused_kernel("SkipLayerNormalization", add, (0, 1), ln, params)
    return out


def _matmul_scales(
    nodes: Sequence[NodeCost], consumers: dict[str, int], producer: dict[str, NodeCost]
) -> dict[str, NodeCost]:
    """onnxruntime's MatMulScaleFusion: a Mul or Div by a constant scalar right after a MatMul runs inside
    it (a FusedMatMul with alpha), e.g. attention's 1/sqrt(d) on its scores."""
    out: dict[str, NodeCost] = {}
    for n in nodes:
        if n.op_type not in ("Mul", "Div") or len(n.inputs) != 2 or len(n.input_shapes) != 2:
            continue
        data = _bias_data_input(n)
        if data is None or (n.op_type == "Div" and data != 0) or _numel(n.input_shapes[1 - data]) != 1:
            continue
        head = producer.get(n.inputs[data])
        if head is not None and head.op_type == "MatMul" and consumers.get(n.inputs[data], 0) == 1:
            out[n.name] = head
    return out


def _only_user(users: dict[str, list[NodeCost]], n: NodeCost, *ops: str) -> NodeCost | None:
    """The single node reading `n`'s output, if it is one of `ops`."""
    after = users.get(n.outputs[0], []) if n.outputs else []
    return after[0] if len(after) == 1 and after[0].op_type in ops else None


def _layer_norms(nodes: Sequence[NodeCost], hidden: set[str]) -> dict[str, Kernel]:
    """A LayerNormalization exported as its parts, (x - mean) / sqrt(var + eps) [* gamma] [+ beta] from
    ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt and Div: onnxruntime's LayerNormFusion and MNN's converter
    both run it as one LayerNorm, the chain's last node's kernel (the rest join `hidden`)."""
    users = _users(nodes)
    out: dict[str, Kernel] = {}
    for mean in nodes:
        if mean.op_type != "ReduceMean" or not mean.inputs:
            continue
        x = mean.inputs[0]
        sub = _only_user(users, mean, "Sub")
        if sub is None or sub.inputs[0] != x:
            continue
        centred = users.get(sub.outputs[0], [])
        pow_ = next((n for n in centred if n.op_type == "Pow"), None)
        div = next((n for n in centred if n.op_type == "Div"), None)
        if len(centred) != 2 or pow_ is None or div is None:
            continue
        var = _only_user(users, pow_, "ReduceMean")
        eps = var and _only_user(users, var, "Add")
        sqrt = eps and _only_user(users, eps, "Sqrt")
        if sqrt is None or _only_user(users, sqrt, "Div") is not div:
            continue
        chain = [mean, sub, pow_, var, eps, sqrt, div]
        for op in ("Mul", "Add"):  # gamma, then beta
            nxt = _only_user(users, chain[-1], op)
            if nxt is None or not any(nxt.constant_inputs):
                break
            chain.append(nxt)
        hidden.update(n.name for n in chain[:-1])
        params = [s for n in chain[7:] for s, c in zip(n.input_shapes, n.constant_inputs, strict=False) if c]
        out[chain[-1].name] = _fused_kernel("LayerNormalization", mean, (0,), chain[-1], params)
    return out


def _quick_gelus(
    nodes: Sequence[NodeCost], producer: dict[str, NodeCost], hidden: set[str]
) -> dict[str, Kernel]:
    """x * sigmoid(a * x) (a swish, or a GELU's sigmoid form): onnxruntime's QuickGeluFusion runs the
    scale, the Sigmoid and the product as one QuickGelu, the product's kernel (the rest join `hidden`)."""
    users = _users(nodes)
    out: dict[str, Kernel] = {}
    for sig in nodes:
        if sig.op_type != "Sigmoid" or not sig.inputs:
            continue
        scale = producer.get(sig.inputs[0])
        x = sig.inputs[0]
        parts = [sig]
        if scale is not None and scale.op_type == "Mul" and any(scale.constant_inputs):
            data = _bias_data_input(scale)
            if data is not None and len(users.get(scale.outputs[0], [])) == 1:
                x, parts = scale.inputs[data], [scale, sig]
        mul = _only_user(users, sig, "Mul")
        if mul is None or x not in mul.inputs:
            continue
        hidden.update(n.name for n in parts)
        out[mul.name] = _fused_kernel("QuickGelu", parts[0], (0,) if parts[0] is sig else (data,), mul)
    return out


def _erf_gelus(
    nodes: Sequence[NodeCost], consumers: dict[str, int], producer: dict[str, NodeCost], hidden: set[str]
) -> dict[str, Kernel]:
    """An exported GELU, x * (erf(x / sqrt 2) + 1) / 2 (the scale as a Mul or a Div, the half before or
    after): MNN's converter makes one unary op of it, the chain's last node's kernel (the rest join
    `hidden`)."""
    users = _users(nodes)
    out: dict[str, Kernel] = {}
    for erf in nodes:
        scale = producer.get(erf.inputs[0]) if erf.op_type == "Erf" and erf.inputs else None
        if scale is None or scale.op_type not in ("Mul", "Div") or not any(scale.constant_inputs):
            continue
        x = scale.inputs[0]
        chain = [scale, erf]
        while chain[-1].outputs and len(users.get(chain[-1].outputs[0], [])) == 1 and len(chain) < 5:
            nxt = users[chain[-1].outputs[0]][0]
            if nxt.op_type not in ("Add", "Mul") or (nxt.op_type == "Mul" and len(chain) > 4):
                break
            chain.append(nxt)
        times_x = [i for i, n in enumerate(chain) if n.op_type == "Mul" and x in n.inputs and i > 1]
        if len(chain) < 4 or not times_x or any(consumers.get(n.outputs[0], 0) != 1 for n in chain[:-1]):
            continue
        hidden.update(n.name for n in chain[:-1])
        out[chain[-1].name] = _fused_kernel("UnaryOp", scale, (0,), chain[-1])
    return out


def _chain_back(producer: dict[str, NodeCost], tensor: str, *steps: tuple[str, ...]) -> list[NodeCost] | None:
    """The producers of `tensor` walking back through the first data input, one op type set per step."""
    chain = []
    for ops in steps:
        n = producer.get(tensor)
        if n is None or n.op_type not in ops or not n.inputs:
            return None
        chain.append(n)
        tensor = n.inputs[0]
    return chain


_NCHWC_POOLS = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}
_NCHWC_BINARY = {"Add", "Sum", "Mul"}  # blocked when every input is a blocked activation of one shape
_NCHWC_UNARY = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid"}


def nchwc_reorders(nodes: Sequence[NodeCost], absorbed: dict[str, NodeCost], block: int) -> list[Kernel]:
    """The layout kernels onnxruntime inserts around its NCHWc convolutions at channel block `block`,
    from the graph (none when the block is 1: no NCHWc on the device).

    Its NchwcTransformer runs a float 2-D convolution in a channel-blocked layout when its channels align
    (dense: input channels below one block, read as NCHW, or a multiple of 4; any depthwise; channels
    padded up to the block), and pools whose channels are a multiple of the block; activations,
    same-shape Add/Mul, BatchNormalization, Concat and Resize on blocked tensors stay blocked. A blocked
    tensor read by anything else (or a graph output) gets one ReorderOutput, a plain tensor read by a
    blocked op one ReorderInput; each moves the tensor once in, once out (padded to the block)."""
    if block <= 1:
        return []
    tail = {head.name: n for n in nodes if (head := absorbed.get(n.name)) is not None}
    blocked: set[str] = set()  # tensors in the NCHWc layout
    shapes: dict[str, Sequence[int] | None] = {}
    for n in nodes:
        for name, shape in zip(n.inputs, n.input_shapes, strict=False):
            shapes.setdefault(name, shape)
        for name, shape in zip(n.outputs, n.output_shapes, strict=False):
            shapes[name] = shape
    reorder_in: set[str] = set()
    reorder_out: set[str] = set()
    read: set[str] = set()
    for n in nodes:
        if n.name in absorbed:
            continue
        last = tail.get(n.name, n)
        data = [
            i for i, c in zip(n.inputs, _padded(n.constant_inputs, len(n.inputs)), strict=True) if i and not c
        ]
        read.update(data)
        wants = _nchwc_input(n, blocked, data, block)
        if wants is None:
            reorder_out.update(t for t in data if t in blocked)
            continue
        for t, want in zip(data, wants, strict=False):
            if want and t not in blocked:
                reorder_in.add(t)
            elif not want and t in blocked:
                reorder_out.add(t)
        if last.outputs and last.outputs[0]:
            blocked.add(last.outputs[0])
    reorder_out.update(t for t in blocked if t not in read)  # graph outputs
    out = []
    for op, tensors in (("ReorderInput", reorder_in), ("ReorderOutput", reorder_out)):
        for t in sorted(tensors):
            nbytes = 4.0 * _numel(_block_padded(shapes.get(t), block))
            out.append(Kernel("layout", 0.0, 2.0 * nbytes, 0.0, f"{op}:{t}", op))
    return out


def _nchwc_node_kernel(n: NodeCost, block: int) -> Kernel:
    """A node's kernel as onnxruntime runs it: in NCHWc (`nchwc_padded`) where it can, where a depthwise
    kernel also skips its padded taps (`without_padded_taps`)."""
    padded = nchwc_padded(n, block)
    k = _node_kernel(padded)
    if not runs_nchwc(n, block):
        return k
    return without_padded_taps(k, [("float", s) for s in padded.input_shapes], padded.output_shapes[0])


def runs_nchwc(n: NodeCost, block: int) -> bool:
    """Whether onnxruntime runs this convolution in its NCHWc layout at channel block `block`."""
    if block <= 1 or n.op_type != "Conv" or not n.output_shapes or len(n.output_shapes[0] or ()) != 4:
        return False
    return _nchwc_input(n, set(), [], block) is not None  # a 4-D input and a constant 4-D weight


def nchwc_padded(n: NodeCost, block: int) -> NodeCost:
    """A convolution as onnxruntime runs it in NCHWc at channel block `block`: its output channels padded
    up to the block, and its input channels too where it reads a blocked input (a depthwise one always),
    so its work, weights and tensors are those the runtime's kernel does and reports (the first 3x3 of a
    PP-OCR classifier, 8 channels out, ran with 16 and twice its graph's FLOPs). Any other node as it is."""
    if not runs_nchwc(n, block):
        return n
    wants = _nchwc_input(n, set(), [], block) or []
    x, w, out = n.input_shapes[0], n.input_shapes[1], n.output_shapes[0]
    pad = -(-w[0] // block) * block
    depthwise = int(n.attr("group", 1) or 1) > 1
    cin = pad if depthwise else (-(-w[1] // block) * block if wants[0] else w[1])
    x_pad = (x[0], cin if wants[0] else x[1], *x[2:])
    w_pad = (pad, w[1] if depthwise else cin, *w[2:])
    work = (pad / w[0]) * (w_pad[1] / w[1])
    shapes = [x_pad, w_pad] + [(pad,) if s is not None and len(s) == 1 else s for s in n.input_shapes[2:]]
    return replace(
        n,
        flops=int(round(n.flops * work)),
        input_shapes=tuple(shapes),
        output_shapes=((out[0], pad, *out[2:]), *n.output_shapes[1:]),
        weight_bytes=int(round(n.weight_bytes * work)),
    )


def _padded(flags: Sequence[bool], n: int) -> list[bool]:
    return list(flags) + [False] * (n - len(flags))


def _block_padded(shape: Sequence[int] | None, block: int) -> tuple[int, ...]:
    if not shape or len(shape) < 2:
        return tuple(shape or ())
    c = -(-shape[1] // block) * block
    return (shape[0], c, *shape[2:])


def _nchwc_input(n: NodeCost, blocked: set[str], data: Sequence[str], block: int) -> list[bool] | None:
    """Which data inputs a node reads blocked when onnxruntime runs it in NCHWc (None: it runs plain)."""
    x = n.input_shapes[0] if n.input_shapes else None
    if n.op_type == "Conv":
        w = n.input_shapes[1] if len(n.input_shapes) > 1 else None
        if not w or len(w) != 4 or not x or len(x) != 4 or not _padded(n.constant_inputs, 2)[1]:
            return None
        group = int(n.attr("group", 1) or 1)
        if group == 1:
            if w[1] < block:
                return [False]  # few input channels: the NCHWc kernel reads the plain input
            return [True] if w[1] % 4 == 0 else None  # padded up to the block
        return [True] if w[1] == 1 and w[0] == group else None  # depthwise (padded); other groups: plain
    if n.op_type in _NCHWC_POOLS:
        channels = x[1] if x and len(x) == 4 else 0
        return [True] if channels and channels % block == 0 else None
    if not data or not all(t in blocked for t in data):
        return None  # the other ops stay blocked only on blocked inputs
    if n.op_type in ("BatchNormalization", "Resize", "Upsample", "Concat"):
        return [True] * len(data)
    if n.op_type in _NCHWC_UNARY:
        return [True]
    if n.op_type in _NCHWC_BINARY and len(data) == len(n.inputs) > 1:
        same = len({tuple(s or ()) for s in n.input_shapes}) == 1
        return [True] * len(data) if same else None
    return None


def _bias_data_input(add: NodeCost) -> int | None:
    """Which input of an Add is the data when the other is a constant (a bias), else None."""
    const = list(add.constant_inputs) + [False] * (len(add.inputs) - len(add.constant_inputs))
    if len(add.inputs) != 2 or const[0] == const[1]:
        return None
    return 1 if const[0] else 0


def _fuses_bias(head: NodeCost, rules: KernelRules, static: bool) -> bool:
    """A constant Add after a convolution, a Gemm or a MatMul of constant 2-D weights becomes the kernel's
    bias (onnxruntime's MatMulAddFusion makes a Gemm of the MatMul, beyond two dimensions only when the
    model declares its shapes, reshaping to two and back; MNN's converter makes a 1x1 convolution of it);
    after a product of two activations it stays a kernel of its own."""
    if head.op_type != "MatMul":
        return True
    out = head.output_shapes[0] if head.output_shapes else None
    if out is not None and len(out) == 2:
        return True
    const = list(head.constant_inputs) + [False] * 2
    w = head.input_shapes[1] if len(head.input_shapes) > 1 else None
    if not const[1] or w is None or len(w) != 2 or out is None:
        return False
    return not rules.bias_fusion_needs_static_shapes or static


def _fuses_activation(head: NodeCost, act: NodeCost, rules: KernelRules) -> bool:
    """Which activations a runtime runs inside the convolution or GEMM before them (`activation_fusion`)."""
    if head.op_type in _DECONV:
        return False
    if rules.activation_fusion == "relu-or-conv-clip":
        if act.op_type == "Relu":
            return True
        return act.op_type == "Clip" and head.op_type in _CONV
    return head.op_type in _CONV or act.op_type == "Relu"


def _node_kernel(n: NodeCost, kind: str | None = None) -> Kernel:
    elem = _element_type(n.dtype)
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
        x = n.input_shapes[0] if n.input_shapes else None
        out = n.output_shapes[0] if n.output_shapes else None
        k = replace(k, flops=float(n.flops), geometry=_geometry(float(n.flops), x, out, n.op_type))
    if kind is not None:
        return Kernel(kind, 0.0, 0.0, 0.0, n.name, n.op_type)
    return k


NCHWC_NODE_SUFFIX = "_nchwc"  # how onnxruntime names the nodes its NCHWc transformer made, in its profiles


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
        k = replace(k, weight_bytes=implied)
    if not name.endswith(NCHWC_NODE_SUFFIX):
        return k
    return without_padded_taps(k, ins, outs[0][1] if outs else None)


def _implied_weight_bytes(k: Kernel, out: Sequence[int] | None) -> float:
    """fp32 weight bytes of a GEMM or convolution from its work: each weight is used once per output
    position (a GEMM's rows, a convolution's pixels), so weights = FLOPs / 2 / positions."""
    if k.kind not in ("gemm", "gemv", "conv", "conv_dw") or not out or not k.flops:
        return 0.0
    positions = _numel(out) / max(1, _channels(k.op_type, out))
    if k.kind == "conv_dw":
        return 4.0 * k.flops / 2.0 / max(1.0, positions) if positions else 0.0
    return 4.0 * k.flops / 2.0 / max(1.0, positions)


def in_bounds_share(x: Sequence[int] | None, out: Sequence[int] | None, window: Sequence[int]) -> float:
    """The share of a convolution's window taps that land inside its input rather than in the padding,
    over all outputs: onnxruntime's NCHWc depthwise kernels skip the padded taps, so on a map a few rows
    high most of a 5x5 window is no work (PP-OCR cls's depthwise layers on 3 rows x 96 ran 2x faster
    than their window counts said; MNN's ran at the window's count, about 40 GFLOP/s at 2, 3 and 6 rows).
    Per spatial axis, the stride and the (centred) padding are recovered from the sizes in and out, as a
    profile gives no attributes: the same rule on both sides."""
    if not x or not out or len(x) != len(out) or len(window) != len(x) - 2:
        return 1.0
    share = 1.0
    for size_in, size_out, k in zip(x[2:], out[2:], window, strict=True):
        if size_in <= 0 or size_out <= 0 or k <= 1:
            continue
        stride = max(1, round(size_in / size_out))
        begin = max(0, (size_out - 1) * stride + k - size_in) // 2
        starts = [o * stride - begin for o in range(size_out)]  # each window's first row, -begin at most
        taps = sum(max(0, min(k, size_in - first) - max(0, -first)) for first in starts)
        share *= taps / (size_out * k)
    return share


def _depthwise_window(inputs: Sequence[Tensor], out: Sequence[int] | None) -> tuple[int, ...]:
    """A depthwise kernel's window from its weight's shape (() where the weight is not given)."""
    w = inputs[1][1] if len(inputs) > 1 else None
    return tuple(int(d) for d in w[2:]) if w and out and len(w) == len(out) else ()


def without_padded_taps(k: Kernel, inputs: Sequence[Tensor], out: Sequence[int] | None) -> Kernel:
    """A depthwise kernel's work as the taps it runs (`in_bounds_share`); any other kernel as it is."""
    if k.kind != "conv_dw" or not inputs:
        return k
    x = inputs[0][1]
    share = in_bounds_share(x, out, _depthwise_window(inputs, out))
    if share >= 1.0:
        return k
    flops = k.flops * share
    return replace(k, flops=flops, geometry=_geometry(flops, x, out, k.op_type))
