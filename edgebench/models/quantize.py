"""ONNX graph tooling for variants and quantization sensitivity (host side; onnx + numpy).

- `weight_layers` / `overridable_weights`: find every weight layer (Conv, ConvTranspose, Gemm, MatMul with a
  constant operand, Gather over a float table, LSTM/GRU/RNN input and recurrence weights), wherever the
  weight is defined: an initializer or a Constant node (also behind Identity nodes), in the main graph or
  inside If/Loop/Scan subgraphs. `overridable_weights` hoists each
  weight into a main-graph initializer that is also a graph input, so a runtime can be fed a replacement
  weight per run without rebuilding the model.
- `fake_quantize`: symmetric per-channel quantize-dequantize of a weight, at 2..8 bits.
- `constants_to_initializers`: Constant nodes become initializers (quantizers only see initializers).
- `compact_names`: shorten internal tensor names and drop shape annotations; quantizers add many nodes
  with long generated names, which on a small model cost more bytes than the int8 weights save.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

# op type -> positions of inputs that may be a weight, in order of preference
WEIGHT_INPUTS: dict[str, tuple[int, ...]] = {
    "Conv": (1,),
    "ConvTranspose": (1,),
    "Gemm": (1, 0),
    "MatMul": (1, 0),
    "Gather": (0,),
    "LSTM": (1, 2),
    "GRU": (1, 2),
    "RNN": (1, 2),
}
# Recurrent layers have two weights (input W and recurrence R): each is its own entry.
MULTI_WEIGHT_OPS = frozenset({"LSTM", "GRU", "RNN"})
MIN_BITS, MAX_BITS = 2, 8


@dataclass(frozen=True)
class DeclaredInput:
    """A model input as the graph declares it: dims are ints, or a name / None when dynamic."""

    name: str
    shape: tuple[int | str | None, ...]
    dtype: str

    @property
    def dynamic(self) -> bool:
        return any(not (isinstance(d, int) and d > 0) for d in self.shape)


@dataclass(frozen=True)
class WeightLayer:
    """One weight tensor and the layer(s) that use it."""

    key: str  # short id used in files exchanged with the device (w0, w1, ...)
    weight: str  # the tensor's name in the model
    input_name: str  # its name as an overridable main-graph input (differs only on a name clash)
    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    axis: int | None  # output-channel axis for per-channel scales; None = per-tensor
    shape: tuple[int, ...]
    dtype: str
    scope: str  # "" for the main graph, else the path of the subgraph that defined it

    @property
    def node(self) -> str:
        return self.nodes[0]

    @property
    def op_type(self) -> str:
        return self.op_types[0]


# ---- walking graphs ----------------------------------------------------------------------------------
def subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for i, g in enumerate(attr.graphs):
                yield f"{attr.name}[{i}]", g


def all_graphs(graph: onnx.GraphProto, scope: str = "") -> Iterator[tuple[str, onnx.GraphProto]]:
    """The graph and every nested subgraph, each with a readable scope path."""
    yield scope, graph
    for node in graph.node:
        for attr_name, sub in subgraphs(node):
            yield from all_graphs(sub, f"{scope}/{node.name or node.op_type}.{attr_name}".lstrip("/"))


def declared_inputs(model: onnx.ModelProto) -> list[DeclaredInput]:
    """The main graph's real inputs (initializers listed as inputs are left out)."""
    inits = {i.name for i in model.graph.initializer}
    found = []
    for value in model.graph.input:
        if value.name in inits:
            continue
        t = value.type.tensor_type
        dims: list[int | str | None] = []
        for d in t.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).name if t.elem_type else "float32"
        found.append(DeclaredInput(value.name, tuple(dims), dtype))
    return found


def opset_version(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def has_subgraphs(model: onnx.ModelProto) -> bool:
    return any(True for _ in list(all_graphs(model.graph))[1:])


# ---- weights ---------------------------------------------------------------------------------------------
def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
        return None
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            return attr.t
    return None


def _attr(node: onnx.NodeProto, name: str, default: int = 0) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(onnx.helper.get_attribute_value(a))
    return default


def channel_axis(node: onnx.NodeProto, position: int, ndim: int) -> int | None:
    """The output-channel axis of a weight operand; per-channel scales are taken along it."""
    op = node.op_type
    if ndim < 2:
        return None
    if op == "Conv":
        return 0
    if op == "ConvTranspose":
        return 1
    if op == "Gemm":
        if position == 1:
            return 0 if _attr(node, "transB") else 1
        return 1 if _attr(node, "transA") else 0
    if op == "MatMul":
        return ndim - 1 if position == 1 else ndim - 2
    if op == "Gather":
        return 0
    if op in MULTI_WEIGHT_OPS:
        return 1  # (directions, gates x hidden, input or hidden): one scale per gate row
    return None


@dataclass
class _Definition:
    graph: onnx.GraphProto
    kind: str  # "init" | "const"
    tensor: onnx.TensorProto
    node: onnx.NodeProto | None
    scope: str


def _definitions(graph: onnx.GraphProto, scope: str) -> dict[str, _Definition]:
    defs = {i.name: _Definition(graph, "init", i, None, scope) for i in graph.initializer}
    for node in graph.node:
        t = _constant_tensor(node)
        if t is not None and node.output:
            defs[node.output[0]] = _Definition(graph, "const", t, node, scope)
    return defs


def _aliases(graph: onnx.GraphProto) -> dict[str, str]:
    """Identity outputs -> their inputs: some exporters pass weights through an Identity node."""
    return {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity" and n.input and n.output}


def _find(
    graph: onnx.GraphProto,
    scope: str,
    outer: list[tuple[dict[str, _Definition], dict[str, str]]],
    found: dict[int, dict[str, Any]],
) -> None:
    scopes = [(_definitions(graph, scope), _aliases(graph)), *outer]
    for node in graph.node:
        for position in WEIGHT_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ():
            if position >= len(node.input) or not node.input[position]:
                continue
            name = _resolve(node.input[position], scopes)
            definition = next((defs[name] for defs, _ in scopes if name in defs), None)
            if definition is None or definition.tensor.data_type not in _FLOAT_TYPES:
                continue
            dims = tuple(int(d) for d in definition.tensor.dims)
            if node.op_type == "Gather" and len(dims) < 2:
                continue
            ident = id(definition.tensor)
            entry = found.setdefault(
                ident,
                {
                    "definition": definition,
                    "name": name,
                    "nodes": [],
                    "ops": [],
                    "axis": channel_axis(node, position, len(dims)),
                    "dims": dims,
                },
            )
            entry["nodes"].append(node.name or f"{node.op_type}:{name}")
            entry["ops"].append(node.op_type)
            if node.op_type not in MULTI_WEIGHT_OPS:
                break  # one weight per layer: the preferred operand
        for attr_name, sub in subgraphs(node):
            _find(sub, f"{scope}/{node.name or node.op_type}.{attr_name}".lstrip("/"), scopes, found)


def _resolve(name: str, scopes: list[tuple[dict[str, _Definition], dict[str, str]]]) -> str:
    """Follow Identity nodes back to the tensor that defines the value (bounded: no cycles in a graph)."""
    for _ in range(16):
        if any(name in defs for defs, _ in scopes):
            return name
        source = next((aliases[name] for _, aliases in scopes if name in aliases), None)
        if source is None:
            return name
        name = source
    return name


_FLOAT_TYPES = (
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.BFLOAT16,
)


def weight_layers(model: onnx.ModelProto) -> list[WeightLayer]:
    """Every weight layer of the model, in graph order (a shared weight is one entry naming all users)."""
    found: dict[int, dict[str, Any]] = {}
    _find(model.graph, "", [], found)
    names = _all_names(model)
    layers = []
    for i, entry in enumerate(found.values()):
        d: _Definition = entry["definition"]
        name = entry["name"]
        in_main = d.graph is model.graph
        unique = name if in_main or names.count(name) <= 1 else f"{name}__w{i}"
        layers.append(
            WeightLayer(
                key=f"w{i}",
                weight=name,
                input_name=unique,
                nodes=tuple(entry["nodes"]),
                op_types=tuple(entry["ops"]),
                axis=entry["axis"],
                shape=entry["dims"],
                dtype=np.dtype(onnx.helper.tensor_dtype_to_np_dtype(d.tensor.data_type)).name,
                scope=d.scope,
            )
        )
    return layers


def _all_names(model: onnx.ModelProto) -> list[str]:
    """Every defined tensor name in every graph (a name may repeat across sibling subgraphs)."""
    names: list[str] = []
    for _, g in all_graphs(model.graph):
        names += [i.name for i in g.initializer] + [v.name for v in g.input]
        names += [o for n in g.node for o in n.output if o]
    return names


def overridable_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[WeightLayer]]:
    """A copy of the model in which every weight is a main-graph initializer listed as a graph input.

    Subgraph weights are hoisted to the main graph (subgraphs see outer-scope names); a weight whose name
    is not unique across the model is renamed within its defining subgraph.
    """
    model = copy.deepcopy(model)
    found: dict[int, dict[str, Any]] = {}
    _find(model.graph, "", [], found)
    layers = weight_layers(model)
    main = model.graph
    main_inputs = {v.name for v in main.input}
    for layer, entry in zip(layers, found.values(), strict=True):
        d: _Definition = entry["definition"]
        tensor = copy.deepcopy(d.tensor)
        tensor.name = layer.input_name
        if d.kind == "const":
            d.graph.node.remove(d.node)
        elif d.graph is not main:
            d.graph.initializer.remove(d.tensor)
        if d.kind == "const" or d.graph is not main:
            main.initializer.append(tensor)
        if layer.input_name != layer.weight:
            _rename_in_scope(d.graph, layer.weight, layer.input_name)
        if layer.input_name not in main_inputs:
            main.input.append(
                onnx.helper.make_tensor_value_info(layer.input_name, tensor.data_type, list(tensor.dims))
            )
            main_inputs.add(layer.input_name)
    if model.ir_version < 4:
        model.ir_version = 4
    return model, layers


def _rename_in_scope(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for _, sub in subgraphs(node):
            _rename_in_scope(sub, old, new)
    for value in graph.output:
        if value.name == old:
            value.name = new


def weight_array(model: onnx.ModelProto, layer: WeightLayer) -> np.ndarray:
    """The weight's values, from an overridable model (where it is a main-graph initializer)."""
    for init in model.graph.initializer:
        if init.name == layer.input_name:
            return numpy_helper.to_array(init)
    raise KeyError(layer.input_name)


def fake_quantize(weight: np.ndarray, bits: int, axis: int | None) -> np.ndarray:
    """Symmetric quantize-dequantize: per channel along `axis` (per tensor when None), levels -q..q."""
    if not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"bits must be {MIN_BITS}..{MAX_BITS}, got {bits}")
    qmax = float(2 ** (bits - 1) - 1)
    w = np.asarray(weight, dtype=np.float64)
    if axis is None or w.ndim == 0:
        amax = np.max(np.abs(w)) if w.size else 0.0
    else:
        others = tuple(a for a in range(w.ndim) if a != axis % w.ndim)
        amax = np.max(np.abs(w), axis=others, keepdims=True)
    scale = np.where(amax > 0, amax / qmax, 1.0)
    q = np.clip(np.rint(w / scale), -qmax, qmax)
    return (q * scale).astype(weight.dtype)


# ---- rewriting for quantizers -------------------------------------------------------------------------
def constants_to_initializers(model: onnx.ModelProto) -> int:
    """Turn tensor-valued Constant nodes into initializers of the same graph; returns how many."""
    moved = 0
    for _, graph in all_graphs(model.graph):
        keep = []
        for node in graph.node:
            t = _constant_tensor(node)
            if t is not None and len(node.output) == 1:
                init = copy.deepcopy(t)
                init.name = node.output[0]
                graph.initializer.append(init)
                moved += 1
            else:
                keep.append(node)
        if len(keep) != len(graph.node):
            del graph.node[:]
            graph.node.extend(keep)
    if moved and model.ir_version < 4:
        model.ir_version = 4  # initializers not listed as inputs need IR 4
    return moved


def compact_names(model: onnx.ModelProto) -> int:
    """Rename internal tensors to short ids and drop value_info; the computation is unchanged.

    The main graph's inputs and outputs keep their names (they are the model's interface), so do node
    names (profiles show them). One mapping covers all graphs, so outer-scope references stay valid.
    Returns the bytes the renaming saved in names.
    """
    keep = {v.name for v in model.graph.input} | {v.name for v in model.graph.output} | {""}
    mapping: dict[str, str] = {}
    counter = 0

    def short(name: str) -> str:
        nonlocal counter
        if name in keep:
            return name
        if name not in mapping:
            while True:
                candidate = "_" + np.base_repr(counter, 36).lower()
                counter += 1
                if candidate not in keep:
                    break
            mapping[name] = candidate
        return mapping[name]

    saved = 0
    for _, graph in all_graphs(model.graph):
        for init in graph.initializer:
            init.name = short(init.name)
        for sparse in graph.sparse_initializer:
            sparse.values.name = short(sparse.values.name)
        for value in list(graph.input) + list(graph.output):
            value.name = short(value.name)
        for node in graph.node:
            node.input[:] = [short(n) for n in node.input]
            node.output[:] = [short(n) for n in node.output]
        for annotation in graph.quantization_annotation:
            annotation.tensor_name = short(annotation.tensor_name)
        del graph.value_info[:]
    saved = sum(len(k) - len(v) for k, v in mapping.items())
    return saved
