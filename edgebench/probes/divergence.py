"""Layer-wise divergence (`accuracy --per-op`): every intermediate tensor of a variant against the same
tensor of its reference, on the same inputs, and the first op (in the reference's topological order) whose
relative error passes the tolerance.

How the tensors are exposed: each ONNX model is copied with every node output made a graph output (cached by
content), and run on the device like any model: onnxruntime returns every output; for MNN the copy is
converted, and MNN keeps each graph output under its name. Exposing a tensor stops the runtimes fusing
across it, so the numbers are those of the unfused kernels (they differ from fused ones at rounding level).

How the tensors are matched (the renames quantization and its pre-processing make, read from real graphs of
`edgebench variants`):
- the same tensor name (fp16 variants, conversions that keep names);
- the same node name: `quant_pre_process` renames tensors (`_c`, `_d`, ...) but keeps node names
  (`fc0/Relu`), and the node's first output is the reference node's first output;
- a fusion named after its first node: `fc0/MatMul/MatMulAddFusion` (Gemm, static int8) and
  `fc0/MatMul/MatMulAddFusion_Add` (dynamic int8) compute the output of the Add that consumed
  `fc0/MatMul`'s output;
- quantize/dequantize pairs: `h0_DequantizeLinear` (node) or `h0_DequantizeLinear_Output` (tensor) is `h0`
  as the int8 model sees it.
Integer tensors (the quantized values themselves) are not compared.

Records: `op_cosine`, `op_rel_error` (||b - a|| / ||a||) and `op_max_abs_err` per matched tensor (params
`op`, `tensor`; annotations the topological `order`, the candidate's tensor and node, the rule that matched),
and one `first_divergent_op` (value: its relative error; params `op`, `tensor`, `tolerance`; both None when
no op passes the tolerance).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError, UserError
from ..jobs import ModelRef
from ..models.cache import models_cache_dir
from ..records import ProbeResult, RecordContext

FUSIONS = ("/MatMulAddFusion_Add", "/MatMulAddFusion")
# Ops a runtime folds into the kernel before them (MNN fuses Relu into its Convolution even when the tensor
# between them is a graph output, and returns the activated values under the first tensor's name).
FOLDABLE = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Identity")
DEQUANTIZED = ("_DequantizeLinear_Output", "_DequantizeLinear", "_dequantized")
INSTRUMENT_REVISION = 1


@dataclass(frozen=True)
class Tensor:
    """A node output of the reference: its name, the node that makes it, and its topological position."""

    name: str
    op: str
    op_type: str
    order: int


@dataclass(frozen=True)
class Match:
    reference: Tensor
    candidate: str  # the candidate's tensor name
    candidate_op: str
    rule: str


def load_onnx(path: Path) -> Any:
    import onnx

    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError and friends
        raise ModelError(f"{path}: not a readable ONNX model ({exc})") from None


def node_tensors(model: Any) -> list[Tensor]:
    """Every node output of the main graph, in the graph's order (ONNX requires it topological)."""
    out = []
    for i, node in enumerate(model.graph.node):
        for name in node.output:
            if name:
                out.append(Tensor(name, node.name or f"#{i}", node.op_type, i))
    return out


def instrument(model: ModelRef) -> ModelRef:
    """A copy of the ONNX model whose every node output is a graph output (cached by content)."""
    import onnx

    if model.format != "onnx":
        raise UserError(
            f"{model.path}: --per-op compares ONNX models (MNN runs them converted, every tensor kept)"
        )
    digest = hashlib.sha256(model.path.read_bytes()).hexdigest()[:16]
    out = models_cache_dir() / "per-op" / f"{model.path.stem}-{digest}-r{INSTRUMENT_REVISION}.onnx"
    if not out.exists():
        proto = load_onnx(model.path)
        try:
            typed = onnx.shape_inference.infer_shapes(proto)
        except Exception:  # noqa: BLE001 - shapes are a nicety; types come from value_info when known
            typed = proto
        known = {v.name: v for v in [*typed.graph.value_info, *typed.graph.output]}
        present = {o.name for o in proto.graph.output}
        for t in node_tensors(proto):
            if t.name not in present:
                info = known.get(t.name)
                proto.graph.output.append(info if info is not None else onnx.ValueInfoProto(name=t.name))
                present.add(t.name)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.part")
        onnx.save(proto, str(tmp))
        tmp.replace(out)
    return ModelRef(model.name, out)


def match_tensors(reference: Any, candidate: Any) -> list[Match]:
    """Reference tensors paired with the candidate's, by the rules of the module docstring."""
    ref = node_tensors(reference)
    by_name = {t.name: t for t in ref}
    ref_nodes = {n.name: n for n in reference.graph.node if n.name}
    consumers: dict[str, list[Any]] = {}
    for n in reference.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    found: dict[str, Match] = {}

    def add(tensor: Tensor | None, cand: str, op: str, rule: str) -> None:
        if tensor is not None and tensor.name not in found:
            found[tensor.name] = Match(tensor, cand, op, rule)

    for node in candidate.graph.node:
        if not node.output or not node.output[0]:
            continue
        out = node.output[0]
        if out in by_name:
            add(by_name[out], out, node.name, "name")
            continue
        if node.name in ref_nodes and ref_nodes[node.name].output:
            add(by_name.get(ref_nodes[node.name].output[0]), out, node.name, "node")
            continue
        fused = _fused_output(node.name, ref_nodes, consumers)
        if fused is not None:
            add(by_name.get(fused), out, node.name, "fusion")
            continue
        base = _strip(out, DEQUANTIZED) or (
            _strip(node.name, DEQUANTIZED) if node.op_type == "DequantizeLinear" else None
        )
        if base is not None:
            add(by_name.get(base), out, node.name, "dequantized")
    return sorted(found.values(), key=lambda m: (m.reference.order, m.reference.name))


def _strip(text: str, suffixes: tuple[str, ...]) -> str | None:
    for suffix in suffixes:
        if text.endswith(suffix) and len(text) > len(suffix):
            return text[: -len(suffix)]
    return None


def _fused_output(name: str, ref_nodes: dict[str, Any], consumers: dict[str, list[Any]]) -> str | None:
    """`X/MatMulAddFusion...`: the output of the single Add that consumed X's output in the reference."""
    base = _strip(name, FUSIONS)
    first = ref_nodes.get(base or "")
    if first is None or not first.output:
        return None
    after = consumers.get(first.output[0], [])
    if len(after) == 1 and after[0].op_type == "Add":
        return str(after[0].output[0])
    return None


def fold_successors(model: Any, depth: int = 2) -> dict[str, list[str]]:
    """For each tensor, the tensors of the foldable ops that alone consume it (a chain of up to `depth`)."""
    consumers: dict[str, list[Any]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    out: dict[str, list[str]] = {}
    for t in node_tensors(model):
        chain, name = [], t.name
        for _ in range(depth):
            after = consumers.get(name, [])
            if len(after) != 1 or after[0].op_type not in FOLDABLE or not after[0].output:
                break
            name = after[0].output[0]
            chain.append(name)
        if chain:
            out[t.name] = chain
    return out


def compare(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Cosine, relative L2 error and max-abs error, in float64 over the flattened arrays."""
    a = np.asarray(reference, np.float64).ravel()
    b = np.asarray(candidate, np.float64).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
    a, b = a[finite], b[finite]
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    diff = float(np.linalg.norm(b - a))
    cosine = 1.0 if na == nb == 0.0 else (0.0 if na == 0.0 or nb == 0.0 else float(a @ b / (na * nb)))
    rel = 0.0 if diff == 0.0 else (diff / na if na > 0 else float("inf"))
    return {
        "cosine": cosine,
        "rel_error": rel,
        "max_abs_err": float(np.max(np.abs(b - a))) if a.size else 0.0,
    }


def _fused_into(
    m: Match,
    b: np.ndarray,
    ref_arrays: dict[str, np.ndarray],
    chain: list[str],
    scores: dict[str, float],
    tolerance: float,
) -> str | None:
    if scores["rel_error"] <= tolerance:
        return None
    for name in chain:
        a = ref_arrays.get(name)
        if a is not None and a.size == b.size and compare(a, b)["rel_error"] <= tolerance:
            return name
    return None


def divergence_records(
    ctx: RecordContext,
    matches: list[Match],
    ref_arrays: dict[str, np.ndarray],
    cand_arrays: dict[str, np.ndarray],
    tolerance: float,
    folds: dict[str, list[str]] | None = None,
) -> ProbeResult:
    """Per matched tensor op_cosine / op_rel_error / op_max_abs_err, then first_divergent_op.

    A tensor over tolerance that equals (within it) the reference's next foldable op's output was fused
    into that op by the runtime: it is compared with that output and said so (`fused_into`), not counted.
    """
    out = ProbeResult()
    first: tuple[Match, float] | None = None
    compared = 0
    for m in matches:
        a, b = ref_arrays.get(m.reference.name), cand_arrays.get(m.candidate)
        if a is None or b is None or a.dtype.kind != "f" or b.dtype.kind != "f" or a.size != b.size:
            continue
        scores = compare(a, b)
        compared += 1
        fused = _fused_into(m, b, ref_arrays, (folds or {}).get(m.reference.name, []), scores, tolerance)
        if fused is not None:
            scores = compare(ref_arrays[fused], b)
        notes = {
            "fused_into": fused,
            "order": m.reference.order,
            "op_type": m.reference.op_type,
            "candidate_tensor": m.candidate,
            "candidate_op": m.candidate_op,
            "matched_by": m.rule,
        }
        at = {"op": m.reference.op, "tensor": m.reference.name}
        out.records.append(ctx.record("op_cosine", scores["cosine"], "ratio", annotations=notes, **at))
        out.records.append(ctx.record("op_rel_error", scores["rel_error"], "ratio", annotations=notes, **at))
        out.records.append(ctx.record("op_max_abs_err", scores["max_abs_err"], "", annotations=notes, **at))
        if first is None and scores["rel_error"] > tolerance:
            first = (m, scores["rel_error"])
    if compared == 0:
        raise UserError("--per-op: no intermediate tensor of the variant matches one of the reference")
    notes: dict[str, Any] = {"compared": compared, "matched": len(matches)}
    if first is None:
        out.records.append(
            ctx.record(
                "first_divergent_op",
                None,
                "ratio",
                annotations=notes,
                op=None,
                tensor=None,
                tolerance=tolerance,
            )
        )
        return out
    m, rel = first
    notes.update(order=m.reference.order, op_type=m.reference.op_type, candidate_op=m.candidate_op)
    out.records.append(
        ctx.record(
            "first_divergent_op", rel, "ratio", annotations=notes, op=m.reference.op, tensor=m.reference.name,
            tolerance=tolerance,
        )
    )  # fmt: skip
    out.warnings.append(
        f"first op over tolerance {tolerance:g}: {m.reference.op} ({m.reference.op_type}, tensor "
        f"{m.reference.name}), relative error {rel:.3g}"
    )
    return out
