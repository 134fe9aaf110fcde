"""A model's static counts as fit uses them (per op class: FLOPs, weight and activation bytes; its nodes and
declared inputs), counted from its file at the shapes benched, or read back from stored `fit` records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError
from ..records import Record

PROBE = "fit"


@dataclass(frozen=True)
class OpCost:
    """What one node costs at run time: FLOPs, the weight bytes it reads, the activation bytes it moves."""

    op_type: str
    flops: float
    weight_bytes: float
    activation_bytes: float


@dataclass(frozen=True)
class ModelCounts:
    """Static counts of one model. `nodes` is empty when only totals are known (e.g. from stored records)."""

    name: str
    flops: float
    weight_bytes: float
    nodes: tuple[OpCost, ...] = ()
    source: str = ""
    warnings: tuple[str, ...] = ()
    # The shapes the counts were made at, as given (None: not known, e.g. totals from the store), and
    # the dims every input took with nothing given (dynamic dimensions at 1, as the analysis takes them).
    shapes: dict[str, list[int]] | None = None
    declared: dict[str, list[int]] = field(default_factory=dict)

    @property
    def node_count(self) -> int | None:
        return len(self.nodes) or None

    def counted_at(self, bench_shapes: Mapping[str, Sequence[int]] | None) -> bool:
        """Whether a bench with these `shapes` params ran the inputs these counts were made at (an input
        neither side gives takes its declared dims on both). True when the counts' shapes are unknown."""
        if self.shapes is None:
            return True
        given = {k: list(v) for k, v in (bench_shapes or {}).items()}
        names = set(given) | set(self.shapes)
        return all(
            given.get(k, self.declared.get(k)) == self.shapes.get(k, self.declared.get(k)) for k in names
        )


def count_model(path: Path, name: str, shapes: Mapping[str, Sequence[int]] | None = None) -> ModelCounts:
    """Static counts of an ONNX model file, per node, from the roofline analysis (`edgebench.analysis.cost`).

    The analysis gives each node's FLOPs and the bytes it writes; this adds the weight bytes each node reads
    (its constant inputs, shape and index parameters excepted) and the activation bytes it reads, which is
    what tells a memory-bound node from a compute-bound one.
    """
    from .cost import PARAM_INPUTS, analyze, load_model, storage_bytes

    if path.suffix.lower() != ".onnx":
        raise ModelError(f"{path}: fit needs the ONNX model to count FLOPs and bytes (got {path.suffix})")
    model = load_model(path)
    # One --shape list serves several models: each takes the names that are its inputs.
    inputs = {vi.name for vi in model.graph.input}
    cost = analyze(model, {k: [int(d) for d in v] for k, v in (shapes or {}).items() if k in inputs})
    stored: dict[str, int] = {}
    for init in model.graph.initializer:
        stored[init.name] = storage_bytes(init.data_type, int(np.prod(init.dims)) if init.dims else 1)
    constant: dict[str, frozenset[str]] = {n: frozenset([n]) for n in stored}
    reads: dict[str, tuple[float, float]] = {}  # node key -> (weight bytes, tensor names read)
    readers: dict[str, list[str]] = {}
    for node in model.graph.node:
        key = node.name or f"{node.op_type}:{node.output[0] if node.output else ''}"
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            t = node.attribute[0].t
            stored[node.output[0]] = storage_bytes(t.data_type, int(np.prod(t.dims)) if t.dims else 1)
            constant[node.output[0]] = frozenset([node.output[0]])
            continue
        ins = [x for x in node.input if x]
        if ins and all(x in constant for x in ins):  # folded at load time: a constant, not work
            for out in node.output:
                constant[out] = frozenset().union(*(constant[x] for x in ins))
            continue
        params = PARAM_INPUTS.get(node.op_type, set()) if not node.domain else set()
        sources: set[str] = set()
        for i, x in enumerate(node.input):
            if x in constant and i not in params:
                sources |= constant[x]
        reads[key] = (float(sum(stored.get(src, 0) for src in sources)), 0.0)
        readers[key] = [x for x in ins if x not in constant]
    written: dict[str, float] = {}
    by_key = {n.name or f"{n.op_type}:{n.output[0] if n.output else ''}": n for n in model.graph.node}
    for nc in cost.nodes:
        node = by_key.get(nc.name)
        outs = [o for o in (node.output if node is not None else []) if o]
        for o in outs:
            written[o] = nc.output_bytes / len(outs)
    itemsize = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    for name, dims in cost.inputs.items():
        written[name] = float(storage_bytes(itemsize.get(name, 1), int(np.prod(dims)) if dims else 1))
    nodes = []
    for nc in cost.nodes:
        weights, _ = reads.get(nc.name, (0.0, 0.0))
        read = sum(written.get(x, 0.0) for x in readers.get(nc.name, []))
        nodes.append(OpCost(nc.op_type, float(nc.flops), weights, read + float(nc.output_bytes)))
    return ModelCounts(
        name=name,
        flops=float(cost.flops),
        weight_bytes=float(cost.weight_bytes),
        nodes=tuple(nodes),
        source=str(path),
        warnings=tuple(cost.warnings),
        shapes={k: [int(d) for d in v] for k, v in (shapes or {}).items() if k in inputs},
        declared=_declared_inputs(model),
    )


def _declared_inputs(model: Any) -> dict[str, list[int]]:
    """Each graph input's declared dims, a dynamic one at 1 (the analysis' default)."""
    inits = {i.name for i in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in inits or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        out[vi.name] = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims]
    return out


def counts_from_records(records: Iterable[Record]) -> dict[str, ModelCounts]:
    """Totals kept in the store: `roofline` records (`flops`, `weight_bytes`) and earlier fit records."""
    flops: dict[str, float] = {}
    weights: dict[str, float] = {}
    for r in records:
        if r.model is None or r.value is None:
            continue
        if r.probe == "roofline" and r.metric == "flops" and r.params.get("scope", "total") == "total":
            flops[r.model] = r.value  # the model's total (per-op-type breakdowns carry another scope)
        elif r.probe == "roofline" and r.metric == "weight_bytes":
            weights[r.model] = r.value
        elif r.probe == PROBE and r.metric == "fits":
            if "flops" in r.params and "weight_bytes" in r.params:
                flops.setdefault(r.model, float(r.params["flops"]))
                weights.setdefault(r.model, float(r.params["weight_bytes"]))
    return {m: ModelCounts(m, flops[m], weights[m], source="store") for m in flops if m in weights}
