"""Built-in `.tflite` models, written with the flatbuffer schema module that the LiteRT wheel ships
(`ai_edge_litert.schema_py_generated`): no converter, no download, seeded weights.

`builtin:mlp.tflite` is the network of `builtin:mlp` (same layer sizes, the same seeded weights) as
FULLY_CONNECTED ops with fused ReLU, so LiteRT and onnxruntime can be compared on one model. Its identity
in the store is `mlp`, like the ONNX file: the runtime tells them apart.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError
from ..files import seal
from .cache import models_cache_dir

TFLITE_REVISION = 1  # bump when a builder changes, so caches regenerate
TFLITE_SUFFIX = ".tflite"


def _schema() -> Any:
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError:
        raise ModelError(
            "built-in .tflite models need the LiteRT wheel (pip install ai-edge-litert)"
        ) from None
    return schema


def _weights(rng: np.random.Generator, fan_in: int, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


class _Graph:
    """One subgraph being written: tensors, their buffers and the operators between them."""

    def __init__(self, schema: Any) -> None:
        self.s = schema
        self.buffers = [schema.BufferT()]  # buffer 0 is the schema's empty sentinel
        self.tensors: list[Any] = []
        self.operators: list[Any] = []
        self.opcodes: dict[int, int] = {}

    def tensor(self, name: str, shape: list[int], data: np.ndarray | None = None, signature=None) -> int:
        t = self.s.TensorT()
        t.name, t.shape, t.type = name, shape, self.s.TensorType.FLOAT32
        if signature is not None:
            t.shapeSignature = signature
        if data is not None:
            buf = self.s.BufferT()
            buf.data = np.ascontiguousarray(data, dtype=np.float32).view(np.uint8).ravel()
            self.buffers.append(buf)
            t.buffer = len(self.buffers) - 1
        self.tensors.append(t)
        return len(self.tensors) - 1

    def op(self, code: int, inputs: list[int], outputs: list[int], options_type: int, options: Any) -> None:
        if code not in self.opcodes:
            self.opcodes[code] = len(self.opcodes)
        o = self.s.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = self.opcodes[code], inputs, outputs
        o.builtinOptionsType, o.builtinOptions = options_type, options
        self.operators.append(o)

    def finish(self, name: str, inputs: list[int], outputs: list[int]) -> bytes:
        import flatbuffers

        s = self.s
        sub = s.SubGraphT()
        sub.tensors, sub.inputs, sub.outputs, sub.operators, sub.name = (
            self.tensors,
            inputs,
            outputs,
            self.operators,
            name,
        )
        codes = []
        for code in sorted(self.opcodes, key=self.opcodes.__getitem__):
            c = s.OperatorCodeT()
            c.builtinCode, c.deprecatedBuiltinCode, c.version = code, min(code, 127), 1
            codes.append(c)
        model = s.ModelT()
        model.version, model.description = 3, "edgebench built-in"
        model.operatorCodes, model.subgraphs, model.buffers = codes, [sub], self.buffers
        model.signatureDefs = [_signature(s, self.tensors, inputs, outputs)]
        builder = flatbuffers.Builder(1 << 20)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def _signature(s: Any, tensors: list[Any], inputs: list[int], outputs: list[int]) -> Any:
    def maps(indices: list[int]) -> list[Any]:
        out = []
        for i in indices:
            m = s.TensorMapT()
            m.name, m.tensorIndex = tensors[i].name, i
            out.append(m)
        return out

    sig = s.SignatureDefT()
    sig.signatureKey, sig.subgraphIndex = "serving_default", 0
    sig.inputs, sig.outputs = maps(inputs), maps(outputs)
    return sig


def build_mlp_tflite(hidden: int = 2048, width: int = 1024, layers: int = 3) -> bytes:
    """The built-in MLP (see models.builtin.build_mlp): batch-1 GEMVs over ~34 MB of fp32 weights."""
    s = _schema()
    rng = np.random.default_rng(1)  # the ONNX builder's seed and draw order: the same weights
    dims = [width] + [hidden] * (layers - 1) + [width]
    g = _Graph(s)
    x = g.tensor("x", [1, width], signature=[-1, width])
    prev = x
    for i in range(layers):
        w = _weights(rng, dims[i], (dims[i], dims[i + 1]))
        # FULLY_CONNECTED keeps weights as [out, in]: the transpose of the MatMul operand.
        wt = g.tensor(f"fc{i}/weights", [dims[i + 1], dims[i]], w.T)
        bt = g.tensor(f"fc{i}/bias", [dims[i + 1]], np.zeros(dims[i + 1], np.float32))
        last = i == layers - 1
        out = g.tensor("y" if last else f"h{i}", [1, dims[i + 1]], signature=[-1, dims[i + 1]])
        opts = s.FullyConnectedOptionsT()
        act = s.ActivationFunctionType
        opts.fusedActivationFunction = act.NONE if last else act.RELU
        fc, fc_options = s.BuiltinOperator.FULLY_CONNECTED, s.BuiltinOptions.FullyConnectedOptions
        g.op(fc, [prev, wt, bt], [out], fc_options, opts)
        prev = out
    return g.finish("mlp", [x], [prev])


TFLITE_BUILTINS: dict[str, Callable[[], bytes]] = {"mlp": build_mlp_tflite}


def is_tflite_builtin(key: str) -> bool:
    return key.endswith(TFLITE_SUFFIX)


def tflite_builtin_model(key: str, cache_dir: Path | None = None) -> tuple[str, Path]:
    """Write the built-in `NAME.tflite` (once); returns (identity name, path)."""
    name = key[: -len(TFLITE_SUFFIX)]
    if name not in TFLITE_BUILTINS:
        known = ", ".join(f"{n}{TFLITE_SUFFIX}" for n in sorted(TFLITE_BUILTINS))
        raise ModelError(f"unknown built-in model '{key}' (known .tflite built-ins: {known})")
    folder = cache_dir or models_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.r{TFLITE_REVISION}{TFLITE_SUFFIX}"
    if not path.exists():
        tmp = path.with_name(f".{name}.{os.getpid()}{TFLITE_SUFFIX}")
        tmp.write_bytes(TFLITE_BUILTINS[name]())
        seal(tmp)
        os.replace(tmp, path)
    return name, path
