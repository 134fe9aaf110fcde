"""A minimal ONNX ModelProto writer in the standard library, for the probe graphs the agent builds itself.

The `onnx` package is not part of a device's runtime install (onnxruntime does not need it), so the agent
encodes the few messages a one-node probe graph uses directly in protobuf wire format. Field numbers are
those of onnx.proto (proto2): repeated scalars are written unpacked, which every parser accepts.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# TensorProto.DataType values
FLOAT, UINT8, INT8, INT32, INT64, FLOAT16, BFLOAT16 = 1, 2, 3, 6, 7, 10, 16
NUMPY_TO_ONNX = {
    "float32": FLOAT,
    "uint8": UINT8,
    "int8": INT8,
    "int32": INT32,
    "int64": INT64,
    "float16": FLOAT16,
}

_VARINT, _LEN, _FIXED32 = 0, 2, 5
# AttributeProto.AttributeType values
_ATTR_FLOAT, _ATTR_INT = 1, 2


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 two's complement, as protobuf encodes negative int64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _int(number: int, value: int) -> bytes:
    return _key(number, _VARINT) + _varint(int(value))


def _bytes(number: int, data: bytes) -> bytes:
    return _key(number, _LEN) + _varint(len(data)) + data


def _str(number: int, text: str) -> bytes:
    return _bytes(number, text.encode())


def _messages(number: int, items: Iterable[bytes]) -> bytes:
    return b"".join(_bytes(number, item) for item in items)


@dataclass(frozen=True)
class Tensor:
    """An initializer: name, ONNX data type, dims and little-endian raw bytes."""

    name: str
    data_type: int
    dims: tuple[int, ...]
    raw: bytes

    def encode(self) -> bytes:
        dims = b"".join(_int(1, d) for d in self.dims)
        return dims + _int(2, self.data_type) + _str(8, self.name) + _bytes(9, self.raw)


@dataclass(frozen=True)
class Node:
    """One operator: inputs, outputs, op type, domain and int/float attributes."""

    op_type: str
    inputs: Sequence[str]
    outputs: Sequence[str]
    domain: str = ""
    attributes: dict[str, int | float] = field(default_factory=dict)

    def encode(self, index: int = 0) -> bytes:
        body = b"".join(_str(1, i) for i in self.inputs) + b"".join(_str(2, o) for o in self.outputs)
        body += _str(3, f"{self.op_type}_{index}") + _str(4, self.op_type)
        for name, value in self.attributes.items():
            if isinstance(value, float):
                attr = _str(1, name) + _key(2, _FIXED32) + struct.pack("<f", value) + _int(20, _ATTR_FLOAT)
            else:
                attr = _str(1, name) + _int(3, value) + _int(20, _ATTR_INT)
            body += _bytes(5, attr)
        if self.domain:
            body += _str(7, self.domain)
        return body


def value_info(name: str, data_type: int, dims: Sequence[int]) -> bytes:
    """ValueInfoProto of a tensor with a static shape."""
    shape = _messages(1, (_int(1, d) for d in dims))
    tensor_type = _int(1, data_type) + _bytes(2, shape)
    return _str(1, name) + _bytes(2, _bytes(1, tensor_type))


def model_bytes(
    nodes: Sequence[Node],
    inputs: Sequence[bytes],
    outputs: Sequence[bytes],
    initializers: Sequence[Tensor],
    opsets: dict[str, int],
    ir_version: int = 8,
) -> bytes:
    """A serialized ModelProto holding one graph."""
    graph = (
        _messages(1, (n.encode(i) for i, n in enumerate(nodes)))
        + _str(2, "probe")
        + _messages(5, (t.encode() for t in initializers))
        + _messages(11, inputs)
        + _messages(12, outputs)
    )
    opset_msgs = (_str(1, domain) + _int(2, version) for domain, version in opsets.items())
    return _int(1, ir_version) + _str(2, "edgebench") + _bytes(7, graph) + _messages(8, opset_msgs)


def tensor_from_array(name: str, array) -> Tensor:
    """An initializer from a numpy array (C order, little-endian raw data)."""
    data = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return Tensor(name, NUMPY_TO_ONNX[str(array.dtype)], tuple(int(d) for d in array.shape), data.tobytes())
