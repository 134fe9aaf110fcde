"""Static roofline analysis of an ONNX model: FLOPs per node, weight and activation bytes, intensity; with a
device's measured ceilings, the latency floor max(FLOPs / peak, bytes / bandwidth) and what bounds it.

Shapes: graph inputs take their declared dims, `shapes` overrides, and 1 for a dynamic dim left open (with
a warning). Every node is then inferred in order with ONNX's own per-op shape functions, fed the values of
small tensors this analysis computes on the way (Shape, Gather, Concat ... of known shapes, and constant
subgraphs, evaluated with onnx.reference), so data-dependent reshapes resolve without running the model.

Counting conventions (every number below is per inference, for the shapes above):
- Weight ops: FLOPs = 2 x multiply-accumulates. MatMul / Gemm / *MatMulInteger* / QLinearMatMul: 2·M·N·K
  per output matrix (batched and broadcast); Conv: 2 · output elements · (C_in / group) · kernel size;
  ConvTranspose: 2 · *input* elements · (C_out / group) · kernel size (every input pixel is scattered through
  the kernel; counting by output elements, as some tools do, is wrong by the stride and channel ratio).
  A bias adds 1 FLOP per output element; Gemm's alpha != 1 and beta not in (0, 1) add 1 each.
  Integer and quantized GEMM/conv count the same operations and are tagged int8; QDQ graphs
  (DequantizeLinear -> MatMul) are counted as the graph states them (fp32).
- Recurrent ops per time step, batch row and direction (H hidden, I input size): LSTM
  8·H·(I+H) gate GEMMs + 4H gate sums + 8H biases (when B is given) + 5H activations + 4H cell/hidden update
  (+6H with peepholes); GRU 6·H·(I+H) + 3H + 6H biases + 3H activations + 5H update; RNN 2·H·(I+H) + H
  + 2H biases + H activation.
- Attention-style ops (com.microsoft Attention / MultiHeadAttention, ONNX Attention): input projections
  (when the op has weights) as GEMMs, 2·S·L·d for the scores and again for the context per head, 1 FLOP
  per score for the scale and 5 for the softmax. The decomposed form (MatMul, Mul, Softmax, MatMul) counts
  the same through the rules for each op.
- Pointwise ops (arithmetic, activations, comparisons, Clip, Where, (De)QuantizeLinear ...): 1 FLOP per
  output element, whatever they cost in instructions; variadic Sum/Max/Min: (inputs - 1) per element,
  Mean one more. Softmax / LogSoftmax: 5 per element (max, subtract, exp, sum, divide).
- Normalisations: BatchNormalization 2 per element (runtimes fold it into one multiply-add; the statistics
  are per channel constants); LayerNormalization / InstanceNormalization / GroupNormalization 7 per element
  (mean, subtract, square, variance sum, normalise, scale, shift; 6 without bias) + 3 per normalised group;
  RMS-style (SimplifiedLayerNormalization, RMSNormalization) 4 per element + 2 per row.
- Reductions: 1 per input element (ReduceMean +1 per output, ReduceL2 / LogSumExp 2 per input +1 per output,
  SumSquare / L1 2 per input); ArgMax/ArgMin 1 per input. Pooling: kernel size per output element (average
  +1), global pooling 1 per input element (average +1 per output). Resize: nearest 0, linear 2 per tap
  with 2^r taps (r resized axes), cubic 4^r taps.
- Data movement (Reshape, Transpose, Concat, Slice, Gather, Pad, Cast, Expand, Split ...): 0 FLOPs.
- Constant-only subgraphs (all inputs constants) are folded at load time by every runtime: 0 FLOPs, and
  their result is not an activation.
- Subgraphs: If counts the branch its condition selects when that is known statically (constants, or
  `values` for model inputs); otherwise `flops` counts the costlier branch and the floor uses the cheaper
  one (a floor must hold whichever branch runs), with a warning. Loop/Scan count their body times the trip
  count when it is known, else once (warned).

Bytes: `weight_bytes` are the stored bytes of the constants (initializers and Constant nodes) that reach a
data input of a computing node, each counted once even when shared, and only on the counted path; shape,
axes and index parameters are not weights. `activation_bytes` are the graph inputs plus every tensor a
computing node writes (each counted once). The floor's memory traffic is weights + graph inputs + graph
outputs: the least any runtime must move (activations can stay in cache), so the floor stays a floor.
"""

from __future__ import annotations

import math
from collections import ChainMap, Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ModelError, UserError

VALUE_LIMIT = 1 << 16  # tensors up to this many elements get their values computed (shape arithmetic)
DEFAULT_DIM = 1
MS_DOMAIN = "com.microsoft"

# ---- tensors ---------------------------------------------------------------------------------------


@dataclass
class TensorInfo:
    """What the analysis knows about one value: type, shape (None dims unknown), value, constant sources."""

    elem_type: int
    shape: tuple[int | None, ...] | None
    value: np.ndarray | None = None
    sources: frozenset[str] | None = None  # constants it derives from; None for runtime tensors

    @property
    def known(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> int | None:
        return math.prod(self.shape) if self.known else None  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int | None:
        n = self.numel
        return None if n is None else storage_bytes(self.elem_type, n)


def storage_bytes(elem_type: int, numel: int) -> int:
    """Bytes of `numel` elements of an ONNX type (4-bit types packed two per byte)."""
    four_bit = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(TensorProto, n)}
    if elem_type in four_bit:
        return (numel + 1) // 2
    if elem_type == TensorProto.STRING or elem_type == TensorProto.UNDEFINED:
        return 0
    return numel * helper.tensor_dtype_to_np_dtype(elem_type).itemsize


def dtype_class(elem_type: int, op_type: str) -> str:
    """The compute class a node's FLOPs count against: int8 for integer/quantized GEMMs, else its type."""
    if op_type in INT8_OPS:
        return "int8"
    classes: dict[int, str] = {
        TensorProto.FLOAT: "fp32",
        TensorProto.FLOAT16: "fp16",
        TensorProto.BFLOAT16: "bf16",
        TensorProto.DOUBLE: "fp64",
    }
    return classes.get(elem_type, "int" if elem_type else "fp32")


INT8_OPS = {
    "MatMulInteger",
    "QLinearMatMul",
    "ConvInteger",
    "QLinearConv",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QGemm",
    "MatMulNBits",
    "DynamicQuantizeLSTM",
}

# Input positions that carry shapes, axes, indices or scalars rather than data: not weights.
PARAM_INPUTS: dict[str, set[int]] = {
    "Reshape": {1},
    "Expand": {1},
    "Tile": {1},
    "Slice": {1, 2, 3, 4},
    "Pad": {1, 2, 3},
    "Resize": {1, 2, 3},
    "Upsample": {1},
    "Squeeze": {1},
    "Unsqueeze": {1},
    "TopK": {1},
    "Split": {1},
    "ConstantOfShape": {0},
    "Range": {0, 1, 2},
    "OneHot": {1, 2},
    "Gather": {1},
    "GatherElements": {1},
    "GatherND": {1},
    "ScatterND": {1},
    "ScatterElements": {1},
    "Scatter": {1},
    "Clip": {1, 2},
    "CumSum": {1},
    "Trilu": {1},
    "Compress": {1},
    "Dropout": {1, 2},
    "Loop": {0, 1},
    "If": {0},
    "NonMaxSuppression": {2, 3, 4},
    "RoiAlign": {2},
    "CenterCropPad": {1},
    "ReduceSum": {1},
    "ReduceMean": {1},
    "ReduceMax": {1},
    "ReduceMin": {1},
    "ReduceProd": {1},
    "ReduceL1": {1},
    "ReduceL2": {1},
    "ReduceLogSum": {1},
    "ReduceLogSumExp": {1},
    "ReduceSumSquare": {1},
    "Shape": {0},
    "Size": {0},
}

POINTWISE = {
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Mod",
    "Neg",
    "Abs",
    "Reciprocal",
    "Sqrt",
    "Exp",
    "Log",
    "Erf",
    "Sin",
    "Cos",
    "Tan",
    "Asin",
    "Acos",
    "Atan",
    "Sinh",
    "Cosh",
    "Tanh",
    "Asinh",
    "Acosh",
    "Atanh",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Relu",
    "LeakyRelu",
    "PRelu",
    "Elu",
    "Selu",
    "Celu",
    "Gelu",
    "Softplus",
    "Softsign",
    "ThresholdedRelu",
    "Mish",
    "Swish",
    "Clip",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "IsNaN",
    "IsInf",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "And",
    "Or",
    "Xor",
    "Not",
    "BitShift",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "BitwiseNot",
    "Where",
    "QuantizeLinear",
    "DequantizeLinear",
    "Shrink",
    "FastGelu",
    "BiasGelu",
    "QuickGelu",
    "Affine",
    "ScaledTanh",
    "ParametricSoftplus",
}
VARIADIC = {"Sum", "Max", "Min", "Mean"}
DATA_MOVEMENT = {
    "Reshape",
    "Transpose",
    "Concat",
    "Slice",
    "Gather",
    "GatherElements",
    "GatherND",
    "Pad",
    "Cast",
    "CastLike",
    "Expand",
    "Split",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Identity",
    "Tile",
    "DepthToSpace",
    "SpaceToDepth",
    "ScatterND",
    "ScatterElements",
    "Scatter",
    "Shape",
    "Size",
    "ConstantOfShape",
    "Range",
    "Dropout",
    "OneHot",
    "Compress",
    "Trilu",
    "ReverseSequence",
    "EyeLike",
    "NonZero",
    "SequenceConstruct",
    "SplitToSequence",
    "ConcatFromSequence",
    "SequenceAt",
    "SequenceInsert",
    "SequenceLength",
    "Optional",
    "OptionalGetElement",
    "OptionalHasElement",
    "CenterCropPad",
    "Col2Im",
}
RANDOM = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
}


# ---- results ---------------------------------------------------------------------------------------
Shape = tuple[int, ...] | None


@dataclass(frozen=True)
class NodeCost:
    """One node on the counted path, with what a kernel-level predictor needs to know of it: its tensors'
    names and shapes (None for an absent optional input or an unknown shape), which inputs are constants
    (weights), and the attributes that pick a kernel (kernel_shape, group, strides ...)."""

    name: str
    op_type: str
    scope: str
    flops: int
    dtype: str
    output_bytes: int
    note: str | None = None
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    input_shapes: tuple[Shape, ...] = ()
    output_shapes: tuple[Shape, ...] = ()
    constant_inputs: tuple[bool, ...] = ()
    weight_bytes: int = 0
    attrs: tuple[tuple[str, Any], ...] = ()
    shape_math: bool = False  # computes on shapes only (runtimes that cannot fold it still dispatch it)

    def attr(self, name: str, default: Any = None) -> Any:
        return dict(self.attrs).get(name, default)


@dataclass
class Totals:
    """Costs accumulated along one execution path."""

    flops_by_dtype: Counter[str] = field(default_factory=Counter)
    flops_by_op: Counter[str] = field(default_factory=Counter)
    weights: set[str] = field(default_factory=set)
    activation_bytes: int = 0
    nodes: list[NodeCost] = field(default_factory=list)
    meta: list[NodeCost] = field(default_factory=list)  # shape arithmetic: no FLOPs, no bytes

    @property
    def flops(self) -> int:
        return sum(self.flops_by_dtype.values())

    def add(self, other: Totals, times: int = 1) -> None:
        for k, v in other.flops_by_dtype.items():
            self.flops_by_dtype[k] += v * times
        for k, v in other.flops_by_op.items():
            self.flops_by_op[k] += v * times
        self.weights |= other.weights
        self.activation_bytes += other.activation_bytes * times
        self.nodes += other.nodes
        self.meta += other.meta

    def copy(self) -> Totals:
        t = Totals()
        t.add(self)
        return t


@dataclass(frozen=True)
class ModelCost:
    """The analysis of one model for one set of input shapes."""

    path: str
    inputs: dict[str, list[int]]
    flops: int
    flops_by_dtype: dict[str, int]
    flops_by_op: dict[str, int]
    weight_bytes: int
    stored_weight_bytes: int
    activation_bytes: int
    input_bytes: int
    output_bytes: int
    nodes: tuple[NodeCost, ...]
    floor_flops_by_dtype: dict[str, int]
    floor_weight_bytes: int
    branch_choice: str  # "static" when every If was decided, else "costlier counted, cheaper for the floor"
    uncounted: dict[str, int]
    warnings: tuple[str, ...]
    meta_nodes: tuple[NodeCost, ...] = ()
    peak_activation_bytes: int = 0
    # the model declares every input dimension: a runtime knows all shapes when it optimizes the graph,
    # and some of its fusions (onnxruntime's MatMulAddFusion beyond two dimensions) need them
    declared_static: bool = True

    @property
    def working_set_bytes(self) -> int:
        """What one inference keeps touching: the weights on the floor's path and the activations alive at
        once at their peak (inputs and outputs included). It decides which memory level the floor charges."""
        return self.floor_weight_bytes + max(self.peak_activation_bytes, self.input_bytes + self.output_bytes)

    @property
    def floor_bytes(self) -> int:
        """The least memory traffic of one inference on the floor's path: weights + inputs + outputs."""
        return self.floor_weight_bytes + self.input_bytes + self.output_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per byte of that least traffic (the roofline's x-axis)."""
        return sum(self.floor_flops_by_dtype.values()) / max(self.floor_bytes, 1)

    @property
    def winograd_flops(self) -> int:
        """FLOPs of dense 3x3 stride-1 convolutions: work a runtime may do as Winograd, with fewer
        multiplies than the 2 x multiply-adds counted here (F(2,3): 2.25x fewer)."""
        return sum(n.flops for n in self.nodes if is_winograd_candidate(n))


# ---- analysis ------------------------------------------------------------------------------------
class Analyzer:
    """Walks a model's graphs in order, inferring shapes and small values, costing every node."""

    def __init__(self, model: onnx.ModelProto, shapes: dict[str, list[int]], values: dict[str, Any]) -> None:
        self.model = model
        self.opsets = {o.domain or "": o.version for o in model.opset_import}
        self.shapes = shapes
        self.values = values
        self.warnings: list[str] = []
        self.uncounted: Counter[str] = Counter()
        self.stored: dict[str, int] = {}  # constant source -> stored bytes
        self.decided_all = True
        self.declared_dynamic = False
        self.input_shapes: dict[str, list[int]] = {}

    # graph level
    def run(self) -> tuple[Totals, Totals, ChainMap[str, TensorInfo], list[str]]:
        g = self.model.graph
        env: ChainMap[str, TensorInfo] = ChainMap()
        self._constants(g, env, "")
        for vi in g.input:
            if vi.name in env:
                continue  # old exporters list initializers among the inputs
            env[vi.name] = self._graph_input(vi)
        top, low = self.graph(g, env, "")
        return top, low, env, [o.name for o in g.output]

    def _graph_input(self, vi: onnx.ValueInfoProto) -> TensorInfo:
        tt = vi.type.tensor_type
        dims: list[Any] = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
        ]
        if not all(isinstance(d, int) and d > 0 for d in dims):
            self.declared_dynamic = True
        if vi.name in self.shapes:
            given = [int(d) for d in self.shapes[vi.name]]
            batch_free = dims and (dims[0] in (1, None) or isinstance(dims[0], str))
            if batch_free and len(given) == len(dims) - 1:
                given = [1, *given]  # the tensor without its batch axis of 1, as ncnn holds it
            if len(given) != len(dims) and tt.HasField("shape"):
                raise UserError(
                    f"--shape {vi.name}: rank {len(given)} but the model declares {len(dims)} "
                    f"dimensions {dims}"
                )
            dims = given
        else:
            for axis, d in enumerate(dims):
                if not isinstance(d, int) or d <= 0:
                    self.warnings.append(
                        f"input '{vi.name}' dimension {axis} ({d or '?'}) is dynamic; using "
                        f"{DEFAULT_DIM} (set --shape {vi.name}=...)"
                    )
                    dims[axis] = DEFAULT_DIM
        self.input_shapes[vi.name] = [int(d) for d in dims]
        value = None
        if vi.name in self.values:
            dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
            value = np.array(self.values[vi.name], dtype=dtype).reshape(dims)
        return TensorInfo(tt.elem_type, tuple(int(d) for d in dims), value)

    def _constants(self, g: onnx.GraphProto, env: ChainMap[str, TensorInfo], scope: str) -> None:
        for init in g.initializer:
            env[init.name] = self._constant(init, f"{scope}{init.name}")

    def _constant(self, tensor: onnx.TensorProto, source: str) -> TensorInfo:
        dims = tuple(int(d) for d in tensor.dims)
        numel = math.prod(dims)
        self.stored[source] = storage_bytes(tensor.data_type, numel)
        value = None
        if numel <= VALUE_LIMIT:
            try:
                value = numpy_helper.to_array(tensor)
            except Exception:  # noqa: BLE001 - external data not loaded, exotic types: shape is enough
                value = None
        return TensorInfo(tensor.data_type, dims, value, frozenset([source]))

    def graph(self, g: onnx.GraphProto, env: ChainMap[str, TensorInfo], scope: str) -> tuple[Totals, Totals]:
        """(costlier path, cheaper path) totals of one graph; they differ only below undecided Ifs."""
        top, low = Totals(), Totals()
        for node in topological(g):
            self.node(node, env, scope, top, low)
        return top, low

    # node level
    def node(
        self, node: onnx.NodeProto, env: ChainMap[str, TensorInfo], scope: str, top: Totals, low: Totals
    ) -> None:
        ins = [env.get(name) if name else None for name in node.input]
        if node.op_type == "Constant" and not node.domain:
            env[node.output[0]] = self._constant_node(node, scope)
            return
        if node.op_type in ("If", "Loop", "Scan") and not node.domain:
            getattr(self, f"_{node.op_type.lower()}")(node, ins, env, scope, top, low)
            return
        missing = [name for name, t in zip(node.input, ins, strict=True) if name and t is None]
        if missing:
            raise ModelError(
                f"node '{node.name or node.op_type}' reads '{missing[0]}', which nothing defines"
            )
        outs = self.infer(node, ins)
        present = [t for t in ins if t is not None]
        folded = bool(present) and node.op_type not in RANDOM and all(t.sources is not None for t in present)
        if folded:
            # Constant-only work: folded when the runtime loads the model; its result is a constant.
            sources = frozenset().union(*(t.sources for t in present if t.sources))
            for t in outs:
                t.sources = sources
        for name, t in zip(node.output, outs, strict=False):
            if name:
                env[name] = t
        if folded:
            return
        if self.shape_arithmetic(node, present, outs):
            meta = self._node_cost(node, scope, ins, outs, 0, None, set(), shape_math=True)
            for totals in (top, low) if top is not low else (top,):
                totals.meta.append(meta)
            return
        flops, note = self.cost(node, ins, outs)
        if flops is None:
            self.uncounted[node.op_type] += 1
            flops = 0
        dtype = dtype_class(outs[0].elem_type if outs else TensorProto.FLOAT, node.op_type)
        written = sum(t.nbytes or 0 for t in outs)
        weights = self.weight_sources(node, ins)
        cost = self._node_cost(node, scope, ins, outs, int(flops), note, weights)
        for totals in (top, low) if top is not low else (top,):
            totals.flops_by_dtype[dtype] += int(flops)
            totals.flops_by_op[node.op_type] += int(flops)
            totals.weights |= weights
            totals.activation_bytes += written
            totals.nodes.append(cost)

    def _node_cost(
        self,
        node: onnx.NodeProto,
        scope: str,
        ins: list[TensorInfo | None],
        outs: list[TensorInfo],
        flops: int,
        note: str | None,
        weights: set[str],
        shape_math: bool = False,
    ) -> NodeCost:
        dtype = dtype_class(outs[0].elem_type if outs else TensorProto.FLOAT, node.op_type)
        return NodeCost(
            node.name or f"{node.op_type}:{node.output[0] if node.output else ''}",
            node.op_type,
            scope,
            flops,
            dtype,
            sum(t.nbytes or 0 for t in outs),
            note,
            inputs=tuple(node.input),
            outputs=tuple(node.output),
            input_shapes=tuple(t.shape if t is not None and t.known else None for t in ins),
            output_shapes=tuple(t.shape if t.known else None for t in outs),
            constant_inputs=tuple(t is not None and t.sources is not None for t in ins),
            weight_bytes=sum(self.stored.get(w, 0) for w in weights),
            attrs=tuple(
                (a.name, _plain(helper.get_attribute_value(a)))
                for a in node.attribute
                if a.name in KERNEL_ATTRS
            ),
            shape_math=shape_math,
        )

    @staticmethod
    def shape_arithmetic(node: onnx.NodeProto, present: list[TensorInfo], outs: list[TensorInfo]) -> bool:
        """Shape/Size, and small computations on values already known (shape math): metadata, not work."""
        if node.op_type in ("Shape", "Size") and not node.domain:
            return True
        return (
            bool(present)
            and all(t.value is not None for t in present)
            and bool(outs)
            and all(t.value is not None for t in outs)
        )

    def _constant_node(self, node: onnx.NodeProto, scope: str) -> TensorInfo:
        attr = node.attribute[0]
        source = f"{scope}{node.output[0]}"
        if attr.name == "value":
            return self._constant(attr.t, source)
        if attr.name == "sparse_value":
            return self._constant(attr.sparse_tensor.values, source)
        value = np.array(helper.get_attribute_value(attr))
        value = value.astype(
            np.float32
            if attr.name.startswith("value_float")
            else np.int64
            if attr.name.startswith("value_int")
            else value.dtype
        )
        tensor = numpy_helper.from_array(value) if value.dtype != object else None
        if tensor is None:
            return TensorInfo(TensorProto.STRING, tuple(value.shape), None, frozenset([source]))
        return self._constant(tensor, source)

    def weight_sources(self, node: onnx.NodeProto, ins: list[TensorInfo | None]) -> set[str]:
        params = PARAM_INPUTS.get(node.op_type, set()) if not node.domain else set()
        found: set[str] = set()
        for i, t in enumerate(ins):
            if t is not None and t.sources and i not in params:
                found |= t.sources
        return found

    # shapes and values
    def infer(self, node: onnx.NodeProto, ins: list[TensorInfo | None]) -> list[TensorInfo]:
        """Output tensors of a node: shape from ONNX's inference (or ours for contrib ops), small values."""
        if (
            node.op_type in ("Shape", "Size")
            and not node.domain
            and ins
            and ins[0] is not None
            and ins[0].known
        ):
            return [self._shape_value(node, ins[0])]
        types = self._onnx_infer(node, ins)
        outs = []
        for i, name in enumerate(node.output):
            tp = types.get(name)
            if tp is not None and tp.HasField("tensor_type"):
                tt = tp.tensor_type
                shape = (
                    tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
                    if tt.HasField("shape")
                    else None
                )
                outs.append(TensorInfo(tt.elem_type, shape))
            else:
                outs.append(contrib_output(node, ins, i))
        if (
            ins
            and all(t is not None and t.value is not None for t in ins)
            and node.op_type not in RANDOM
            and all(t.numel is not None and t.numel <= VALUE_LIMIT for t in outs)
        ):
            self._evaluate(node, ins, outs)
        return outs

    def _shape_value(self, node: onnx.NodeProto, x: TensorInfo) -> TensorInfo:
        if node.op_type == "Size":
            return TensorInfo(TensorProto.INT64, (), np.array(x.numel, dtype=np.int64))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        dims = list(x.shape)[attrs.get("start", 0) : attrs.get("end", None)]  # type: ignore[index,arg-type]
        return TensorInfo(TensorProto.INT64, (len(dims),), np.array(dims, dtype=np.int64))

    def _onnx_infer(self, node: onnx.NodeProto, ins: list[TensorInfo | None]) -> dict[str, onnx.TypeProto]:
        domain = node.domain or ""
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opsets.get(domain, 1), domain)
        except onnx.defs.SchemaError:
            return {}
        types, data = {}, {}
        for name, t in zip(node.input, ins, strict=True):
            if not name or t is None:
                continue
            dims = None if t.shape is None else list(t.shape)
            types[name] = helper.make_tensor_type_proto(t.elem_type, dims)
            if t.value is not None and t.value.size <= VALUE_LIMIT and t.value.dtype != object:
                data[name] = numpy_helper.from_array(np.asarray(t.value), name)
        try:
            return onnx.shape_inference.infer_node_outputs(
                schema,
                node,
                types,
                data,
                opset_imports=list(self.model.opset_import),
                ir_version=self.model.ir_version or 8,
            )
        except Exception:  # noqa: BLE001 - inference errors leave the shape unknown
            return {}

    def _evaluate(self, node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> None:
        from onnx.reference import ReferenceEvaluator

        try:
            evaluator = ReferenceEvaluator(node, opsets=self.opsets)
            feeds = {name: t.value for name, t in zip(node.input, ins, strict=True) if name and t is not None}
            results = evaluator.run(None, feeds)
        except Exception:  # noqa: BLE001 - an op the reference cannot run keeps only its shape
            return
        for t, value in zip(outs, results, strict=False):
            if isinstance(value, np.ndarray) or np.isscalar(value):
                t.value = np.asarray(value)
                t.shape = tuple(int(d) for d in t.value.shape)

    # control flow
    def _if(
        self,
        node: onnx.NodeProto,
        ins: list[TensorInfo | None],
        env: ChainMap[str, TensorInfo],
        scope: str,
        top: Totals,
        low: Totals,
    ) -> None:
        branches = {a.name: a.g for a in node.attribute if a.name in ("then_branch", "else_branch")}
        cond = ins[0]
        label = node.name or f"If:{node.output[0]}"
        decided = cond is not None and cond.value is not None and cond.value.size == 1
        if decided:
            taken = "then_branch" if bool(cond.value.reshape(())) else "else_branch"  # type: ignore[union-attr]
            branches = {taken: branches[taken]}  # the branch that cannot run is not analysed at all
        results = {}
        for name, g in branches.items():
            child = env.new_child()
            self._constants(g, child, f"{scope}{label}/{name}/")
            branch_top, branch_low = self.graph(g, child, f"{scope}{label}/{name}/")
            results[name] = (branch_top, branch_low, [child.get(o.name) for o in g.output])
        if decided:
            chosen_top, chosen_low = results[taken][0], results[taken][1]
            outs = results[taken][2]
        else:
            self.decided_all = False
            order = sorted(results, key=lambda b: results[b][0].flops)
            cheap, costly = order[0], order[-1]
            chosen_top, chosen_low = results[costly][0], results[cheap][1]
            outs = merge_outputs(results[costly][2], results[cheap][2])
            self.warnings.append(
                f"If '{label}': its condition is not known statically; flops count the costlier "
                f"{costly} ({results[costly][0].flops:.4g} FLOPs), the floor the cheaper {cheap} "
                f"({results[cheap][1].flops:.4g}); give the input that decides it with --value NAME=V"
            )
        top.add(chosen_top)
        low.add(chosen_low)
        for name, t in zip(node.output, outs, strict=False):
            if name:
                env[name] = (
                    TensorInfo(t.elem_type, t.shape, t.value, None) if t is not None else TensorInfo(0, None)
                )

    def _loop(
        self,
        node: onnx.NodeProto,
        ins: list[TensorInfo | None],
        env: ChainMap[str, TensorInfo],
        scope: str,
        top: Totals,
        low: Totals,
    ) -> None:
        body = next(a.g for a in node.attribute if a.name == "body")
        label = node.name or f"Loop:{node.output[0]}"
        trips_t = ins[0] if ins else None
        trips = int(trips_t.value.reshape(())) if trips_t is not None and trips_t.value is not None else None
        child = env.new_child()
        carried = ins[2:]
        child[body.input[0].name] = TensorInfo(TensorProto.INT64, ())
        child[body.input[1].name] = TensorInfo(TensorProto.BOOL, ())
        for vi, t in zip(body.input[2:], carried, strict=False):
            child[vi.name] = TensorInfo(t.elem_type, t.shape) if t is not None else TensorInfo(0, None)
        self._constants(body, child, f"{scope}{label}/body/")
        body_top, body_low = self.graph(body, child, f"{scope}{label}/body/")
        if trips is None:
            self.warnings.append(f"Loop '{label}': trip count unknown statically; its body is counted once")
        top.add(body_top, trips or 1)
        low.add(body_low, trips or 1)
        n_carried = len(carried)
        outs = [child.get(o.name) for o in body.output[1:]]
        for i, name in enumerate(node.output):
            src = outs[i] if i < len(outs) else None
            if not name:
                continue
            if i < n_carried:
                env[name] = TensorInfo(src.elem_type, src.shape) if src is not None else TensorInfo(0, None)
            else:
                shape = (trips, *src.shape) if src is not None and src.shape is not None else None
                env[name] = TensorInfo(src.elem_type if src else 0, shape)

    def _scan(
        self,
        node: onnx.NodeProto,
        ins: list[TensorInfo | None],
        env: ChainMap[str, TensorInfo],
        scope: str,
        top: Totals,
        low: Totals,
    ) -> None:
        attrs = {a.name: a for a in node.attribute}
        body = attrs["body"].g
        n_scan = int(attrs["num_scan_inputs"].i)
        label = node.name or f"Scan:{node.output[0]}"
        n_state = len(ins) - n_scan
        scan_ins = ins[n_state:]
        trips = next((t.shape[0] for t in scan_ins if t is not None and t.known and t.shape), None)
        child = env.new_child()
        for i, vi in enumerate(body.input):
            t = ins[i] if i < len(ins) else None
            if t is None:
                child[vi.name] = TensorInfo(0, None)
            elif i >= n_state:
                child[vi.name] = TensorInfo(t.elem_type, t.shape[1:] if t.shape else None)
            else:
                child[vi.name] = TensorInfo(t.elem_type, t.shape)
        self._constants(body, child, f"{scope}{label}/body/")
        body_top, body_low = self.graph(body, child, f"{scope}{label}/body/")
        if trips is None:
            self.warnings.append(f"Scan '{label}': sequence length unknown; its body is counted once")
        top.add(body_top, trips or 1)
        low.add(body_low, trips or 1)
        outs = [child.get(o.name) for o in body.output]
        for i, name in enumerate(node.output):
            src = outs[i] if i < len(outs) else None
            if not name:
                continue
            if i < n_state or src is None or src.shape is None:
                env[name] = TensorInfo(src.elem_type if src else 0, src.shape if src else None)
            else:
                env[name] = TensorInfo(src.elem_type, (trips, *src.shape))

    # costs
    def cost(
        self, node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]
    ) -> tuple[int | None, str | None]:
        fn = _cost_dispatch(node)
        if fn is None:
            if node.op_type in POINTWISE:
                fn = pointwise
            elif node.op_type in DATA_MOVEMENT:
                return 0, None
            else:
                return None, f"no FLOP rule for {node.domain + '.' if node.domain else ''}{node.op_type}"
        try:
            return fn(node, ins, outs), None
        except (TypeError, ValueError, IndexError, KeyError, AttributeError, ZeroDivisionError):
            return None, "shapes unknown"


KERNEL_ATTRS = frozenset(
    {"kernel_shape", "group", "strides", "dilations", "transA", "transB", "mode", "axis", "to", "perm"}
)


def is_winograd_candidate(n: NodeCost) -> bool:
    """A dense (group 1) 3x3 convolution with stride 1."""
    if n.op_type not in ("Conv", "FusedConv") or len(n.input_shapes) < 2 or n.input_shapes[1] is None:
        return False
    w = n.input_shapes[1]
    group = n.attr("group", 1) or 1
    strides = n.attr("strides") or (1, 1)
    return len(w) == 4 and tuple(w[2:]) == (3, 3) and group == 1 and all(s == 1 for s in strides)


def _plain(value: Any) -> Any:
    """An attribute value as plain data (bytes decoded, lists as tuples, graphs and tensors dropped)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, int | float | str):
        return value
    return None


def peak_live_bytes(nodes: Iterable[NodeCost], input_bytes: int, graph_outputs: set[str]) -> int:
    """The most activation bytes alive at once when the nodes run in this order: a tensor lives from the
    node that writes it to its last reader (graph outputs to the end). Graph inputs count from the start."""
    order = list(nodes)
    sizes: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, n in enumerate(order):
        for name in n.inputs:
            last[name] = i
        per = n.output_bytes // max(1, len([o for o in n.outputs if o]))
        for name in n.outputs:
            if name:
                sizes[name] = per
    live, peak = input_bytes, input_bytes
    ending: dict[int, int] = {}
    for i, n in enumerate(order):
        for name in n.outputs:
            if name in sizes:
                live += sizes[name]
                end = len(order) if name in graph_outputs else last.get(name, i)
                ending[end] = ending.get(end, 0) + sizes[name]
        peak = max(peak, live)
        live -= ending.pop(i, 0)
    return peak


def topological(g: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes in an order where producers come first (ONNX requires it, some exporters do not keep it)."""
    produced = {o for n in g.node for o in n.output if o}
    done: set[str] = set()
    order, pending = [], list(g.node)
    while pending:
        progress, rest = False, []
        for n in pending:
            needs = [i for i in n.input if i in produced and i not in done]
            if needs:
                rest.append(n)
            else:
                order.append(n)
                done.update(n.output)
                progress = True
        if not progress:
            return order + rest  # a cycle: keep file order for the rest
        pending = rest
    return order


def merge_outputs(a: list[TensorInfo | None], b: list[TensorInfo | None]) -> list[TensorInfo | None]:
    """Branch outputs where both branches agree; differing dims become unknown."""
    out: list[TensorInfo | None] = []
    for x, y in zip(a, b, strict=False):
        if x is None or y is None or x.shape is None or y.shape is None or len(x.shape) != len(y.shape):
            out.append(x if y is None else y if x is None else TensorInfo(x.elem_type, None))
            continue
        out.append(
            TensorInfo(
                x.elem_type, tuple(p if p == q else None for p, q in zip(x.shape, y.shape, strict=True))
            )
        )
    return out


def contrib_output(node: onnx.NodeProto, ins: list[TensorInfo | None], index: int) -> TensorInfo:
    """Output shapes of the contrib ops ONNX's inference does not know; unknown otherwise."""
    op = node.op_type
    x = ins[0] if ins else None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if x is None or x.shape is None:
        return TensorInfo(x.elem_type if x else 0, None)
    if index == 0 and op in (
        "FastGelu",
        "BiasGelu",
        "QuickGelu",
        "Gelu",
        "SkipLayerNormalization",
        "SimplifiedLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "BiasAdd",
        "RotaryEmbedding",
        "BiasDropout",
    ):
        return TensorInfo(x.elem_type, x.shape)
    if index == 0 and op in ("FusedMatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"):
        b = ins[1]
        if b is None or b.shape is None:
            return TensorInfo(TensorProto.FLOAT, None)
        a_shape, b_shape = list(x.shape), list(b.shape)
        if attrs.get("transA"):
            a_shape[-2:] = a_shape[-2:][::-1]
        if attrs.get("transB"):
            b_shape[-2:] = b_shape[-2:][::-1]
        return TensorInfo(
            TensorProto.FLOAT if op != "FusedMatMul" else x.elem_type, matmul_shape(a_shape, b_shape)
        )
    if index == 0 and op == "MatMulNBits":
        return TensorInfo(x.elem_type, (*x.shape[:-1], int(attrs["N"])))
    if index == 0 and op == "Attention":
        w = ins[1]
        hidden = (
            sum(attrs["qkv_hidden_sizes"])
            if "qkv_hidden_sizes" in attrs
            else (w.shape[1] if w and w.shape else None)
        )
        v = attrs["qkv_hidden_sizes"][2] if "qkv_hidden_sizes" in attrs else (hidden // 3 if hidden else None)
        return TensorInfo(x.elem_type, (*x.shape[:-1], v))
    if index == 0 and op == "MultiHeadAttention":
        value = ins[2] if len(ins) > 2 else None
        dv = value.shape[-1] if value is not None and value.shape and len(value.shape) == 3 else x.shape[-1]
        return TensorInfo(x.elem_type, (*x.shape[:-1], dv))
    return TensorInfo(x.elem_type, None)


def matmul_shape(a: list[Any], b: list[Any]) -> tuple[Any, ...]:
    """numpy matmul's output shape (1-D operands promoted and dropped)."""
    a1, b1 = len(a) == 1, len(b) == 1
    a = [1, *a] if a1 else a
    b = [*b, 1] if b1 else b
    batch_a, batch_b = a[:-2], b[:-2]
    n = max(len(batch_a), len(batch_b))
    batch_a = [1] * (n - len(batch_a)) + batch_a
    batch_b = [1] * (n - len(batch_b)) + batch_b
    batch = [x if y == 1 else y for x, y in zip(batch_a, batch_b, strict=True)]
    shape = [*batch, a[-2], b[-1]]
    if a1:
        shape.pop(-2)
    if b1:
        shape.pop(-1)
    return tuple(shape)


# ---- cost rules (conventions in the module docstring) ----------------------------------------------
CostFn = Callable[[onnx.NodeProto, list[TensorInfo | None], list[TensorInfo]], int]


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _numel(t: TensorInfo | None) -> int:
    if t is None or t.numel is None:
        raise ValueError("unknown shape")
    return t.numel


def _dims(t: TensorInfo | None) -> tuple[int, ...]:
    if t is None or not t.known:
        raise ValueError("unknown shape")
    return t.shape  # type: ignore[return-value]


def pointwise(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    return _numel(outs[0])


def variadic(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    n = _numel(outs[0])
    extra = n if node.op_type == "Mean" else 0
    return max(len([i for i in ins if i is not None]) - 1, 0) * n + extra


def matmul(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    """2·K per output element; A's last axis is K (1-D A is promoted, which keeps that true)."""
    a_index = 0
    k = _dims(ins[a_index])[-1]
    if node.op_type == "FusedMatMul" and _attrs(node).get("transA"):
        k = _dims(ins[0])[-2]
    return 2 * _numel(outs[0]) * k


def qlinear_matmul(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    return 2 * _numel(outs[0]) * _dims(ins[0])[-1]


def matmul_nbits(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    return 2 * _numel(outs[0]) * int(_attrs(node)["K"])


def gemm(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    attrs = _attrs(node)
    a = _dims(ins[0])
    k = a[0] if attrs.get("transA") else a[1]
    mn = _numel(outs[0])
    flops = 2 * mn * k
    has_c = len(ins) > 2 and ins[2] is not None
    if has_c:
        flops += mn  # bias add
        if attrs.get("beta", 1.0) not in (0.0, 1.0):
            flops += mn
    if attrs.get("alpha", 1.0) != 1.0:
        flops += mn
    return flops


def conv(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    """2 · output elements · (C_in/group · kernel) + 1 per output element for the bias."""
    w_index, b_index = {"QLinearConv": (3, 8), "ConvInteger": (1, None)}.get(node.op_type, (1, 2))
    w = _dims(ins[w_index])
    out = _numel(outs[0])
    flops = 2 * out * math.prod(w[1:])
    if b_index is not None and len(ins) > b_index and ins[b_index] is not None:
        flops += out
    return flops


def conv_transpose(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    """Every input element meets C_out/group · kernel weights: 2 · input elements · prod(W.shape[1:])."""
    w = _dims(ins[1])
    flops = 2 * _numel(ins[0]) * math.prod(w[1:])
    if len(ins) > 2 and ins[2] is not None:
        flops += _numel(outs[0])
    return flops


def _recurrent(
    node: onnx.NodeProto, ins: list[TensorInfo | None], gates: int
) -> tuple[int, int, int, int, bool]:
    attrs = _attrs(node)
    x, w = _dims(ins[0]), _dims(ins[1])
    seq, batch = (x[1], x[0]) if attrs.get("layout", 0) else (x[0], x[1])
    dirs, hidden = w[0], w[1] // gates
    has_bias = len(ins) > 3 and ins[3] is not None
    return seq * batch * dirs, x[2], hidden, dirs, has_bias


def lstm(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    steps, i, h, _, bias = _recurrent(node, ins, 4)
    per = 8 * h * (i + h) + 4 * h + (8 * h if bias else 0) + 5 * h + 4 * h
    if len(ins) > 7 and ins[7] is not None:
        per += 6 * h  # peepholes: 3 multiplies and 3 adds
    return steps * per


def gru(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    steps, i, h, _, bias = _recurrent(node, ins, 3)
    return steps * (6 * h * (i + h) + 3 * h + (6 * h if bias else 0) + 3 * h + 5 * h)


def rnn(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    steps, i, h, _, bias = _recurrent(node, ins, 1)
    return steps * (2 * h * (i + h) + h + (2 * h if bias else 0) + h)


def _attention_core(batch_heads: int, s: int, length: int, dk: int, dv: int) -> int:
    scores = batch_heads * s * length
    return 2 * scores * dk + scores + 5 * scores + 2 * scores * dv  # QK^T, scale, softmax, ·V


def ms_attention(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    """com.microsoft Attention: QKV projection GEMM (+bias) and the attention core; past keys lengthen L."""
    attrs = _attrs(node)
    b, s, d_in = _dims(ins[0])
    w = _dims(ins[1])
    sizes = list(attrs.get("qkv_hidden_sizes") or [w[1] // 3] * 3)
    heads = int(attrs["num_heads"])
    flops = 2 * b * s * d_in * sum(sizes)
    if len(ins) > 2 and ins[2] is not None:
        flops += b * s * sum(sizes)
    past = ins[4] if len(ins) > 4 else None
    past_len = _dims(past)[3] if past is not None and past.known else 0
    return flops + _attention_core(b * heads, s, s + past_len, sizes[0] // heads, sizes[2] // heads)


def ms_mha(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    """com.microsoft MultiHeadAttention with separate 3-D query, key, value (already projected)."""
    heads = int(_attrs(node)["num_heads"])
    b, s, d = _dims(ins[0])
    key, value = ins[1], ins[2] if len(ins) > 2 else None
    kd, vd = _dims(key), _dims(value)
    if len(kd) != 3 or len(vd) != 3:
        raise ValueError("packed or 4-D key/value layouts are not counted")
    flops = _attention_core(b * heads, s, kd[1], d // heads, vd[2] // heads)
    if len(ins) > 3 and ins[3] is not None:
        flops += b * s * d + b * kd[1] * kd[2] + b * vd[1] * vd[2]  # q, k, v bias adds
    return flops


def onnx_attention(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    """ONNX Attention (opset 23): 4-D (B, heads, S, d) or 3-D (B, S, heads·d) Q, K, V."""
    attrs = _attrs(node)
    q, k, v = _dims(ins[0]), _dims(ins[1]), _dims(ins[2])
    if len(q) == 4:
        return _attention_core(q[0] * q[1], q[2], k[2], q[3], v[3])
    heads = int(attrs["q_num_heads"])
    kv_heads = int(attrs.get("kv_num_heads", heads))
    return _attention_core(q[0] * heads, q[1], k[1], q[2] // heads, v[2] // kv_heads)


def softmax(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    return (1 if node.op_type == "Hardmax" else 5) * _numel(outs[0])


def batchnorm(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    return 2 * _numel(outs[0])


def layernorm(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    """7 per element (6 without bias) + 3 per normalised row (two divides and a reciprocal square root)."""
    x = _dims(ins[0])
    axis = int(_attrs(node).get("axis", -1)) % len(x)
    rows = math.prod(x[:axis])
    has_bias = len(ins) > 2 and ins[2] is not None
    per = 7 if has_bias else 6
    if node.op_type in ("SkipLayerNormalization",):
        per += 1 + (1 if len(ins) > 4 and ins[4] is not None else 0)  # skip add (+ bias add)
    return per * math.prod(x) + 3 * rows


def rmsnorm(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    x = _dims(ins[0])
    axis = int(_attrs(node).get("axis", -1)) % len(x)
    extra = 1 if node.op_type == "SkipSimplifiedLayerNormalization" else 0
    return (4 + extra) * math.prod(x) + 2 * math.prod(x[:axis])


def instancenorm(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    x = _dims(ins[0])
    return 7 * math.prod(x) + 3 * x[0] * x[1]


def groupnorm(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    x = _dims(ins[0])
    return 7 * math.prod(x) + 3 * x[0] * int(_attrs(node)["num_groups"])


def lrn(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    return (2 * int(_attrs(node)["size"]) + 3) * _numel(outs[0])


REDUCE_PER_INPUT = {"ReduceL2": 2, "ReduceLogSumExp": 2, "ReduceSumSquare": 2, "ReduceL1": 2}
REDUCE_PER_OUTPUT = {"ReduceMean": 1, "ReduceL2": 1, "ReduceLogSumExp": 1, "ReduceLogSum": 1}


def reduce(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    return REDUCE_PER_INPUT.get(node.op_type, 1) * _numel(ins[0]) + REDUCE_PER_OUTPUT.get(
        node.op_type, 0
    ) * _numel(outs[0])


def pool(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    kernel = math.prod(_attrs(node)["kernel_shape"])
    out = _numel(outs[0])
    per = {"AveragePool": kernel + 1, "LpPool": 2 * kernel + 1}.get(node.op_type, kernel)
    return per * out


def global_pool(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    per_in = 2 if node.op_type == "GlobalLpPool" else 1
    per_out = 0 if node.op_type == "GlobalMaxPool" else 1
    return per_in * _numel(ins[0]) + per_out * _numel(outs[0])


def resize(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    mode = _attrs(node).get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode == "nearest":
        return 0
    x, y = _dims(ins[0]), _dims(outs[0])
    resized = sum(1 for p, q in zip(x, y, strict=True) if p != q)
    taps = (2 if mode == "linear" else 4) ** resized
    return 2 * taps * _numel(outs[0])


def einsum(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    """Each term of the full index space costs (operands - 1) multiplies and one add."""
    equation = _attrs(node)["equation"]
    equation = equation.decode() if isinstance(equation, bytes) else equation
    lhs = equation.replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, t in zip(lhs, ins, strict=True):
        dims = _dims(t)
        letters = [c for c in term if c.isalpha()]
        if "..." in term:
            raise ValueError("ellipsis einsum not counted")
        for c, d in zip(letters, dims, strict=True):
            sizes[c] = max(sizes.get(c, 1), d)
    return len(lhs) * math.prod(sizes.values()) if len(lhs) > 1 else math.prod(sizes.values())


def cumsum(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    return _numel(outs[0])


def argreduce(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    return _numel(ins[0])


def topk(node: onnx.NodeProto, ins: list[TensorInfo | None], outs: list[TensorInfo]) -> int:
    return _numel(ins[0])  # one comparison per input element (a selection, not a full sort)


COSTS: dict[str, CostFn] = {
    "MatMul": matmul,
    "FusedMatMul": matmul,
    "MatMulInteger": matmul,
    "MatMulIntegerToFloat": matmul,
    "DynamicQuantizeMatMul": matmul,
    "QLinearMatMul": qlinear_matmul,
    "MatMulNBits": matmul_nbits,
    "Gemm": gemm,
    "QGemm": gemm,
    "Conv": conv,
    "ConvInteger": conv,
    "QLinearConv": conv,
    "FusedConv": conv,
    "ConvTranspose": conv_transpose,
    "LSTM": lstm,
    "GRU": gru,
    "RNN": rnn,
    "Attention": ms_attention,
    "MultiHeadAttention": ms_mha,
    "Softmax": softmax,
    "LogSoftmax": softmax,
    "Hardmax": softmax,
    "BatchNormalization": batchnorm,
    "LayerNormalization": layernorm,
    "SkipLayerNormalization": layernorm,
    "SimplifiedLayerNormalization": rmsnorm,
    "SkipSimplifiedLayerNormalization": rmsnorm,
    "RMSNormalization": rmsnorm,
    "InstanceNormalization": instancenorm,
    "GroupNormalization": groupnorm,
    "LRN": lrn,
    "ReduceSum": reduce,
    "ReduceMean": reduce,
    "ReduceMax": reduce,
    "ReduceMin": reduce,
    "ReduceProd": reduce,
    "ReduceL1": reduce,
    "ReduceL2": reduce,
    "ReduceLogSum": reduce,
    "ReduceLogSumExp": reduce,
    "ReduceSumSquare": reduce,
    "ArgMax": argreduce,
    "ArgMin": argreduce,
    "TopK": topk,
    "MaxPool": pool,
    "AveragePool": pool,
    "LpPool": pool,
    "GlobalAveragePool": global_pool,
    "GlobalMaxPool": global_pool,
    "GlobalLpPool": global_pool,
    "Resize": resize,
    "Upsample": resize,
    "Einsum": einsum,
    "CumSum": cumsum,
    "Sum": variadic,
    "Max": variadic,
    "Min": variadic,
    "Mean": variadic,
}


def _cost_dispatch(node: onnx.NodeProto) -> CostFn | None:
    """ONNX's own Attention (default domain) differs from com.microsoft's."""
    if node.op_type == "Attention" and not node.domain:
        return onnx_attention
    return COSTS.get(node.op_type)


# ---- public API -----------------------------------------------------------------------------------
def load_model(path: Path | str) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises many types for a corrupt file
        raise ModelError(f"{path}: not a valid ONNX model ({type(exc).__name__})") from None


def analyze(
    model: onnx.ModelProto | Path | str,
    shapes: dict[str, list[int]] | None = None,
    values: dict[str, Any] | None = None,
) -> ModelCost:
    """Cost one model for the given input shapes (and values of inputs that decide control flow)."""
    path = "<model>"
    if not isinstance(model, onnx.ModelProto):
        path = str(model)
        model = load_model(model)
    shapes, values = dict(shapes or {}), dict(values or {})
    known_inputs = {vi.name for vi in model.graph.input}
    for name in [*shapes, *values]:
        if name not in known_inputs:
            raise UserError(
                f"'{name}' is not an input of the model (inputs: {', '.join(sorted(known_inputs))})"
            )
    analyzer = Analyzer(model, shapes, values)
    # ONNX's own Attention rule replaces the contrib one per node.
    top, low, env, outputs = analyzer.run()
    input_bytes = sum(
        env[vi.name].nbytes or 0 for vi in model.graph.input if vi.name in analyzer.input_shapes
    )
    out_tensors = [env.get(name) for name in outputs]
    unknown_out = [n for n, t in zip(outputs, out_tensors, strict=True) if t is None or t.nbytes is None]
    warnings = list(analyzer.warnings)
    if unknown_out:
        warnings.append(f"output shapes unknown for {', '.join(unknown_out)}: their bytes are not counted")
    if analyzer.uncounted:
        listed = ", ".join(f"{op} x{n}" for op, n in sorted(analyzer.uncounted.items()))
        warnings.append(f"FLOPs not counted (no rule, or shapes unknown): {listed}")
    stored = analyzer.stored
    return ModelCost(
        path=path,
        inputs=analyzer.input_shapes,
        flops=top.flops,
        flops_by_dtype=dict(top.flops_by_dtype),
        flops_by_op={k: v for k, v in top.flops_by_op.most_common()},
        weight_bytes=sum(stored[s] for s in top.weights),
        stored_weight_bytes=sum(stored.values()),
        activation_bytes=top.activation_bytes + input_bytes,
        input_bytes=input_bytes,
        output_bytes=sum(t.nbytes or 0 for t in out_tensors if t is not None),
        nodes=tuple(top.nodes),
        floor_flops_by_dtype=dict(low.flops_by_dtype),
        floor_weight_bytes=sum(stored[s] for s in low.weights),
        branch_choice="static" if analyzer.decided_all else "costlier counted, cheaper for the floor",
        uncounted=dict(analyzer.uncounted),
        warnings=tuple(warnings),
        meta_nodes=tuple(top.meta),
        peak_activation_bytes=peak_live_bytes(top.nodes, input_bytes, set(outputs)),
        declared_static=not analyzer.declared_dynamic,
    )


# ---- the floor -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Floor:
    """The least latency the device's measured ceilings allow, and which one binds."""

    compute_ms: float
    memory_ms: float
    peak_tops: dict[str, float]
    bandwidth_gbps: float
    notes: tuple[str, ...] = ()
    level: str = "DRAM"  # the memory level whose bandwidth the traffic is charged at
    working_set_bytes: int | None = None

    @property
    def floor_ms(self) -> float:
        return max(self.compute_ms, self.memory_ms)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ms >= self.memory_ms else "memory"


def floor(cost: Any, peak_tops: dict[str, float], bandwidth_gbps: float) -> Floor:
    """max(FLOPs / peak, bytes / bandwidth): FLOPs of each compute class against its own measured peak.

    `cost` is a ModelCost or anything with its `floor_flops_by_dtype` and `floor_bytes` (counts read back
    from stored records)."""
    if bandwidth_gbps <= 0:
        raise ValueError("bandwidth must be positive")
    notes = []
    compute_s = 0.0
    fallback = peak_tops.get("fp32") or max(peak_tops.values(), default=0.0)
    if fallback <= 0:
        raise ValueError("no measured peak")
    used: dict[str, float] = {}
    for dtype, flops in cost.floor_flops_by_dtype.items():
        if not flops:
            continue
        peak = peak_tops.get(dtype)
        if not peak:
            peak = fallback
            if dtype in ("fp16", "int8", "bf16"):
                notes.append(f"no measured {dtype} peak: its {flops:.4g} FLOPs are timed at the fp32 peak")
        used[dtype] = peak
        compute_s += flops / (peak * 1e12)
    memory_s = cost.floor_bytes / (bandwidth_gbps * 1e9)
    return Floor(compute_s * 1e3, memory_s * 1e3, used, bandwidth_gbps, tuple(notes))


BEATS_FLOOR_MARGIN = 0.05


def efficiency_check(floor_ms: float, measured_ms: float) -> tuple[float, str | None]:
    """efficiency = floor / measured; a measurement more than 5% under the floor means a ceiling is wrong."""
    eff = floor_ms / measured_ms
    if measured_ms < floor_ms * (1.0 - BEATS_FLOOR_MARGIN):
        return eff, (
            f"the measured p50 ({measured_ms:.4g} ms) beats the roofline floor ({floor_ms:.4g} ms) by "
            f"{(1 - measured_ms / floor_ms) * 100:.0f}%: a ceiling (peak TOPS or memory bandwidth) was "
            "measured too low; re-measure with `edgebench probe matmul` / `edgebench probe bandwidth`"
        )
    return eff, None


def cost_summary(cost: ModelCost) -> dict[str, Any]:
    """The analysis as plain data (for --json), nodes included."""
    return {
        "path": cost.path,
        "inputs": cost.inputs,
        "flops": cost.flops,
        "flops_by_dtype": cost.flops_by_dtype,
        "flops_by_op": cost.flops_by_op,
        "weight_bytes": cost.weight_bytes,
        "stored_weight_bytes": cost.stored_weight_bytes,
        "activation_bytes": cost.activation_bytes,
        "input_bytes": cost.input_bytes,
        "output_bytes": cost.output_bytes,
        "floor_bytes": cost.floor_bytes,
        "arithmetic_intensity": cost.intensity,
        "branch_choice": cost.branch_choice,
        "uncounted": cost.uncounted,
        "nodes": [
            {
                "name": n.name,
                "op_type": n.op_type,
                "scope": n.scope,
                "flops": n.flops,
                "dtype": n.dtype,
                "output_bytes": n.output_bytes,
                **({"note": n.note} if n.note else {}),
            }
            for n in cost.nodes
        ],
    }


def iter_costly(cost: ModelCost, top: int = 10) -> Iterable[NodeCost]:
    """The nodes with the most FLOPs."""
    return sorted(cost.nodes, key=lambda n: n.flops, reverse=True)[:top]
