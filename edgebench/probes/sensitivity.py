"""Probe `sensitivity`: per-layer quantization sensitivity, one weight layer at a time.

The host finds every weight layer (Conv, ConvTranspose, Gemm, MatMul with a constant operand, Gather
embeddings, LSTM/GRU/RNN weights; also inside If/Loop subgraphs), makes a copy of the model whose weights are
overridable inputs, and fake-quantizes each layer's weights alone (symmetric, per output channel, `bits`
2..8). The device runs the model once with fp32 weights and once per layer with that layer's quantized weights
fed in, and compares each run's outputs with the fp32 run.

Records, ranked from the most sensitive layer: `cosine` (the worst over the model's float outputs) and
`snr_db`, with params node, op_type, bits, weight, rank (and `shared_by` when several nodes use one
weight). Layers with the lowest cosine are the ones to keep at higher precision.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import onnx

from ..agent.protocol import SensitivityTask
from ..errors import MeasurementError, ModelError, UserError
from ..jobs import Job, ModelRef
from ..lab.device import Device
from ..models.quantize import (
    WeightLayer,
    fake_quantize,
    overridable_weights,
    weight_array,
)
from ..models.refs import models_cache_dir
from ..records import ProbeResult, RecordContext
from .common import job_timeout, require_model, shape_lists
from .numerics import write_npz
from .registry import SensitivityParams

DEFAULT_BITS = SensitivityParams.bits
PREPARE_REVISION = 2  # bump when the overridable model or the weight files change, so caches regenerate


def prepare(model: ModelRef, bits: int) -> tuple[Path, Path, list[WeightLayer]]:
    """The overridable model and the fake-quantized weights (.npz), cached by content and bit width."""
    if model.format != "onnx":
        raise ModelError(f"{model.path}: sensitivity needs an ONNX model (fp32), not {model.format}")
    digest = hashlib.sha256(model.path.read_bytes()).hexdigest()[:16]
    folder = models_cache_dir() / "sensitivity" / f"{digest}-r{PREPARE_REVISION}"
    try:
        proto = onnx.load(str(model.path))
    except Exception as exc:  # noqa: BLE001 - protobuf raises many types
        raise ModelError(f"{model.path}: not a valid ONNX model ({type(exc).__name__})") from None
    overridable, layers = overridable_weights(proto)
    if not layers:
        raise ModelError(
            f"{model.path}: no weight layer (Conv, ConvTranspose, Gemm, MatMul with a constant "
            "weight, Gather over a float table) to quantize"
        )
    model_path = folder / "overridable.onnx"
    if not model_path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".overridable.{os.getpid()}.onnx"
        onnx.save(overridable, tmp)
        tmp.replace(model_path)
    weights_path = folder / f"weights-int{bits}.npz"
    if not weights_path.exists():
        arrays = {
            layer.key: fake_quantize(weight_array(overridable, layer), bits, layer.axis) for layer in layers
        }
        write_npz(weights_path, arrays)
    return model_path, weights_path, layers


def run_sensitivity(device: Device, job: Job, ctx: RecordContext) -> ProbeResult:
    params = SensitivityParams.of(job)
    model = require_model(job)
    bits = params.bits
    if job.runtime not in (None, "onnxruntime"):
        raise UserError("sensitivity runs on onnxruntime (the fp32 ONNX model); drop --runtime")
    ctx.runtime = "onnxruntime"
    ctx.base_params = {**params.identity(), "bits": bits}
    timeout = job_timeout(device, job)
    model_path, weights_path, layers = prepare(model, bits)
    files = [model_path, weights_path]
    inputs = params.inputs
    if inputs:
        if not Path(inputs).is_file():
            raise UserError(f"{inputs}: inputs file not found")
        files.append(Path(inputs))
    remote = device.ensure_files(files, timeout)
    task = SensitivityTask(
        runtime="onnxruntime",
        model=remote[0],
        weights=remote[1],
        layers=[[layer.key, layer.input_name] for layer in layers],
        threads=params.threads,
        shapes=shape_lists(params.shapes),
        seed=params.seed,
        inputs=remote[2] if inputs else None,
    )
    reply = device.run_agent(task, timeout)
    return sensitivity_records(ctx, layers, reply.result, list(reply.warnings))


def sensitivity_records(
    ctx: RecordContext, layers: list[WeightLayer], result: dict[str, Any], warnings: list[str]
) -> ProbeResult:
    by_key = {layer.key: layer for layer in layers}
    scored = []
    for entry in result["layers"]:
        layer = by_key.get(entry["key"])
        if layer is None:
            raise MeasurementError(f"the device scored an unknown layer {entry['key']!r}")
        cosines = [c for c in entry["cosine"] if c == c]
        worst = min(range(len(entry["cosine"])), key=lambda i: entry["cosine"][i]) if cosines else 0
        scored.append(
            (
                min(cosines) if cosines else None,
                entry["snr_db"][worst] if cosines else None,
                result["outputs"][worst],
                layer,
            )
        )
    missing = set(by_key) - {e["key"] for e in result["layers"]}
    if missing:
        raise MeasurementError(f"the device skipped {len(missing)} of {len(layers)} layers")
    scored.sort(key=lambda s: (s[0] is None, s[0] if s[0] is not None else 0.0))
    out = ProbeResult(warnings=warnings)
    for rank, (cosine, snr, output, layer) in enumerate(scored, start=1):
        params: dict[str, Any] = {
            "node": layer.node,
            "op_type": layer.op_type,
            "weight": layer.weight,
            "output": output,
            "shape": list(layer.shape),
            "per_channel": layer.axis is not None,
        }
        if len(layer.nodes) > 1:
            params["shared_by"] = list(layer.nodes)
        if layer.scope:
            params["scope"] = layer.scope
        out.records.append(ctx.record("cosine", cosine, "ratio", {"rank": rank}, **params))
        out.records.append(ctx.record("snr_db", snr, "dB", {"rank": rank}, **params))
    return out
