"""The kernels ncnn runs for an ONNX model, read from the graph pnnx converts it to: the same layers, shapes,
multiply-adds and weights that the agent's per-layer profile records (`agent.session_ncnn.layer_ops`), so a
graph's kernels and a profile's are one list by construction, whatever pnnx fused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..agent.inputs import make_inputs
from ..agent.session_ncnn import NcnnSession, layer_ops
from ..models.convert_ncnn import onnx_to_ncnn
from .kernels import Kernel, profile_kernel


def ncnn_layer_ops(param: Path) -> list[dict[str, Any]]:
    """Every layer of an ncnn graph (its .bin beside it) as the profile describes an op: type, name, the
    shapes it reads and writes, multiply-adds and weight bytes; ncnn runs it once on the host on seeded
    inputs of its declared shapes to give each layer the shapes it sees."""
    session = NcnnSession(str(param), threads=1)
    step = session.prepare(make_inputs(session.inputs, {}, 0, None, []))
    return layer_ops(session.net, step.mats, str(param))


def ncnn_kernels(onnx_path: Path, shapes: Mapping[str, Sequence[int]]) -> list[Kernel]:
    """Every layer of the model's ncnn graph at `shapes` (converted on the host, cached), as a kernel."""
    param = onnx_to_ncnn(Path(onnx_path), shapes={k: list(v) for k, v in shapes.items()} or None)
    return [
        profile_kernel(
            str(op["op_type"]),
            op.get("inputs") or (),
            op.get("outputs") or (),
            parameter_bytes=int(op["parameter_bytes"]) if op.get("parameter_bytes") is not None else None,
            runtime_flops=float(op["mflops"]) * 1e6 if op.get("mflops") is not None else None,
            name=str(op["node"]),
        )
        for op in ncnn_layer_ops(param)
    ]
