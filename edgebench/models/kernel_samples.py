"""Kernel samples: models of one kernel (or one attention block) at one size, generated with onnx.helper.

The kernel predictor (`analysis.kernel_predict`) is calibrated per device from per-op profiles. Profiles of
whole models cover the sizes those models happen to have: one DRAM-sized GEMV, one LSTM, one attention
block. nn-Meter calibrates its kernel predictors on kernels sampled over their configuration space instead;
these are such samples, a grid per kind from cache-resident to DRAM-sized, so that a model whose kernels no
profiled model shares is predicted from kernels of its own kind and size. `suites/calibrate.toml` profiles
the default grid (`CALIBRATION`); any other sample is `builtin:kernel:OP,KEY=VALUE,...`.

A sample's identity in the store is `kernel-OP-KEYVALUE-...` (`is_kernel_sample` tells it from a model):
the predictor fits on samples but never holds one out as a model to predict.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ModelError
from .cache import generated_once

SAMPLE_PREFIX = "kernel-"
SAMPLE_REVISION = 2  # bump when a builder changes, so caches regenerate
OPSET = 17


def _f32(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def _weights(rng: np.random.Generator, fan_in: int, shape: tuple[int, ...]) -> onnx.TensorProto:
    return _f32("w", rng.standard_normal(shape) / np.sqrt(fan_in))


def _graph(
    name: str, nodes: list, x: list[int], y: list[int], inits: list, more: dict[str, list[int]] | None = None
) -> onnx.ModelProto:
    inputs = {"x": x, **(more or {})}
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, dims) for k, dims in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edgebench"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _out(hw: int, k: int, s: int) -> int:
    return (hw + 2 * (k // 2) - k) // s + 1


def gemm(rng: np.random.Generator, m: int, k: int, n: int) -> onnx.ModelProto:
    """x[m,k] @ W[k,n] + b, ReLU: a GEMV at m=1 (weight-streaming), a GEMM above."""
    n_ = helper.make_node
    nodes = [n_("MatMul", ["x", "w"], ["mm"]), n_("Add", ["mm", "b"], ["a"]), n_("Relu", ["a"], ["y"])]
    return _graph("gemm", nodes, [m, k], [m, n], [_weights(rng, k, (k, n)), _f32("b", np.zeros(n))])


def conv(
    rng: np.random.Generator, c: int, o: int, hw: int, k: int = 3, s: int = 1, g: int = 1
) -> onnx.ModelProto:
    """A k x k convolution (grouped by g; depthwise at g = c = o) with bias and ReLU."""
    if c % g or o % g:
        raise ModelError(f"builtin:kernel:conv: channels c={c} and o={o} must divide by the groups g={g}")
    node = helper.make_node(
        "Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], pads=[k // 2] * 4, strides=[s, s], group=g
    )
    relu = helper.make_node("Relu", ["c"], ["y"])
    ho = _out(hw, k, s)
    inits = [_weights(rng, c // g * k * k, (o, c // g, k, k)), _f32("b", np.zeros(o))]
    return _graph("conv", [node, relu], [1, c, hw, hw], [1, o, ho, ho], inits)


def conv1d(
    rng: np.random.Generator,
    c: int,
    o: int,
    l: int,  # noqa: E741 - the length, as its key names it
    k: int = 3,
    s: int = 1,
) -> onnx.ModelProto:
    """A 1-D convolution over l steps (padded by k // 2 each side) with bias and ReLU: what a streaming
    audio model runs on its few frames (an STFT as a convolution, its encoder's convolutions)."""
    node = helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k], pads=[k // 2] * 2, strides=[s])
    relu = helper.make_node("Relu", ["c"], ["y"])
    inits = [_weights(rng, c * k, (o, c, k)), _f32("b", np.zeros(o))]
    return _graph("conv1d", [node, relu], [1, c, l], [1, o, _out(l, k, s)], inits)


def dwconv(rng: np.random.Generator, c: int, hw: int, k: int = 3, s: int = 1) -> onnx.ModelProto:
    """A depthwise k x k convolution with bias and ReLU."""
    return conv(rng, c, c, hw, k, s, c)


def deconv(rng: np.random.Generator, c: int, o: int, hw: int, k: int = 2, s: int = 2) -> onnx.ModelProto:
    """A transposed convolution (the upsampling of a detector's neck)."""
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[s, s])
    inits = [_weights(rng, c * k * k, (c, o, k, k)), _f32("b", np.zeros(o))]
    ho = (hw - 1) * s + k
    return _graph("deconv", [node], [1, c, hw, hw], [1, o, ho, ho], inits)


def attention(rng: np.random.Generator, h: int, s: int, d: int) -> onnx.ModelProto:
    """softmax(x x^T) x over h heads of s positions: two activation x activation products, a softmax."""
    n_ = helper.make_node
    nodes = [
        n_("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]),
        n_("MatMul", ["x", "xt"], ["scores"]),
        n_("Softmax", ["scores"], ["p"], axis=-1),
        n_("MatMul", ["p", "x"], ["y"]),
    ]
    return _graph("attention", nodes, [1, h, s, d], [1, h, s, d], [])


def lstm(rng: np.random.Generator, i: int, h: int, s: int = 1) -> onnx.ModelProto:
    """One LSTM layer over s steps of a batch of one, its state an input as a streaming model's is."""
    node = helper.make_node("LSTM", ["x", "w", "r", "b", "", "h0", "c0"], ["seq", "y", "c"], hidden_size=h)
    inits = [
        _weights(rng, i, (1, 4 * h, i)),
        _f32("r", rng.standard_normal((1, 4 * h, h)) / np.sqrt(h)),
        _f32("b", np.zeros((1, 8 * h))),
    ]
    return _graph("lstm", [node], [s, 1, i], [1, 1, h], inits, {"h0": [1, 1, h], "c0": [1, 1, h]})


def norm(rng: np.random.Generator, s: int, d: int) -> onnx.ModelProto:
    """LayerNormalization over the last axis of [1, s, d]."""
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)
    inits = [_f32("g", np.ones(d)), _f32("b", np.zeros(d))]
    return _graph("norm", [node], [1, s, d], [1, s, d], inits)


def skipnorm(rng: np.random.Generator, s: int, d: int) -> onnx.ModelProto:
    """A residual Add, then LayerNormalization (onnxruntime fuses the two into SkipLayerNormalization)."""
    n_ = helper.make_node
    nodes = [
        n_("Sigmoid", ["x"], ["r"]),
        n_("Add", ["x", "r"], ["sum"]),
        n_("LayerNormalization", ["sum", "g", "b"], ["y"], axis=-1, epsilon=1e-5),
    ]
    return _graph("skipnorm", nodes, [1, s, d], [1, s, d], [_f32("g", np.ones(d)), _f32("b", np.zeros(d))])


def gelu(rng: np.random.Generator, s: int, d: int) -> onnx.ModelProto:
    """GELU as exported, x * (erf(x / sqrt 2) + 1) / 2 (MNN's converter makes one op of the five)."""
    n_ = helper.make_node
    consts = [
        _f32("rsqrt2", np.array(1 / np.sqrt(2))),
        _f32("one", np.array(1.0)),
        _f32("half", np.array(0.5)),
    ]
    nodes = [
        n_("Mul", ["x", "rsqrt2"], ["g0"]),
        n_("Erf", ["g0"], ["g1"]),
        n_("Add", ["g1", "one"], ["g2"]),
        n_("Mul", ["x", "g2"], ["g3"]),
        n_("Mul", ["g3", "half"], ["y"]),
    ]
    return _graph("gelu", nodes, [1, s, d], [1, s, d], consts)


def hardswish(rng: np.random.Generator, c: int, hw: int) -> onnx.ModelProto:
    """x * HardSigmoid(x), as mobile vision models export their hard-swish."""
    n_ = helper.make_node
    nodes = [n_("HardSigmoid", ["x"], ["hs"], alpha=1 / 6, beta=0.5), n_("Mul", ["x", "hs"], ["y"])]
    return _graph("hardswish", nodes, [1, c, hw, hw], [1, c, hw, hw], [])


def convswish(
    rng: np.random.Generator, c: int, o: int, h: int, w: int, k: int = 1, s: int = 1
) -> onnx.ModelProto:
    """A k x k convolution over an h x w map, then a hard-swish as mobile backbones export it,
    x * clip(x + 3, 0, 6) / 6: on MNN the hard-swish's cost depends on how the convolution ran
    (`analysis.kernels.runs_gemm_tiles`), so the map need not be square."""
    n_ = helper.make_node
    node = n_("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], pads=[k // 2] * 4, strides=[s, s])
    nodes = [
        node,
        n_("Add", ["c", "three"], ["a"]),
        n_("Clip", ["a", "zero", "six"], ["r"]),
        n_("Mul", ["c", "r"], ["m"]),
        n_("Div", ["m", "six"], ["y"]),
    ]
    consts = [_f32("three", np.float32(3)), _f32("zero", np.float32(0)), _f32("six", np.float32(6))]
    consts += [_weights(rng, c * k * k, (o, c, k, k)), _f32("b", np.zeros(o))]
    return _graph("convswish", nodes, [1, c, h, w], [1, o, _out(h, k, s), _out(w, k, s)], consts)


def add(rng: np.random.Generator, c: int, hw: int) -> onnx.ModelProto:
    """A residual add of two activations (here one tensor twice: one read stream, not two)."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Add", ["x", "s"], ["y"])]
    return _graph("add", nodes, [1, c, hw, hw], [1, c, hw, hw], [])


def pool(rng: np.random.Generator, c: int, hw: int, k: int = 3, s: int = 2) -> onnx.ModelProto:
    """A k x k max pool at stride s (k = 0: global average pool)."""
    if k == 0:
        node = helper.make_node("GlobalAveragePool", ["x"], ["y"])
        return _graph("pool", [node], [1, c, hw, hw], [1, c, 1, 1], [])
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[k, k], pads=[k // 2] * 4, strides=[s, s])
    ho = _out(hw, k, s)
    return _graph("pool", [node], [1, c, hw, hw], [1, c, ho, ho], [])


def resize(rng: np.random.Generator, c: int, hw: int) -> onnx.ModelProto:
    """A nearest-neighbour 2x upsample (a detector's feature pyramid)."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    return _graph("resize", [node], [1, c, hw, hw], [1, c, 2 * hw, 2 * hw], [scales])


def transpose(rng: np.random.Generator, c: int, hw: int) -> onnx.ModelProto:
    """NCHW to NHWC: a copy whose reads stride over the tensor."""
    node = helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])
    return _graph("transpose", [node], [1, c, hw, hw], [1, hw, hw, c], [])


BUILDERS: dict[str, Callable[..., onnx.ModelProto]] = {
    "gemm": gemm,
    "conv": conv,
    "conv1d": conv1d,
    "dwconv": dwconv,
    "deconv": deconv,
    "attention": attention,
    "lstm": lstm,
    "norm": norm,
    "skipnorm": skipnorm,
    "gelu": gelu,
    "hardswish": hardswish,
    "convswish": convswish,
    "add": add,
    "pool": pool,
    "resize": resize,
    "transpose": transpose,
}


@dataclass(frozen=True)
class KernelSample:
    """One sample: its op and its sizes, in the builder's argument order."""

    op: str
    sizes: tuple[tuple[str, int], ...]

    @property
    def name(self) -> str:
        """Its identity in the store, one per configuration."""
        return SAMPLE_PREFIX + "-".join([self.op, *(f"{k}{v}" for k, v in self.sizes)])

    def build(self) -> onnx.ModelProto:
        rng = np.random.default_rng(_seed(self.name))
        return BUILDERS[self.op](rng, **dict(self.sizes))


def _seed(name: str) -> int:
    """A seed from the name alone (Python's hash is salted per process): the same bytes every time."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def parse_sample(key: str) -> KernelSample:
    """`kernel:OP,KEY=VALUE,...` -> its checked sample; a bad key is one line naming what is wrong."""
    import inspect

    _, _, spec = key.partition(":")
    op, *items = [p.strip() for p in spec.split(",") if p.strip()] or [""]
    if op not in BUILDERS:
        raise ModelError(f"builtin:kernel: unknown op '{op}' (known: {', '.join(BUILDERS)})")
    params = list(inspect.signature(BUILDERS[op]).parameters.values())[1:]
    known = {p.name: p for p in params}
    values: dict[str, int] = {}
    for item in items:
        name, sep, text = (s.strip() for s in item.partition("="))
        if not sep or name not in known:
            raise ModelError(
                f"builtin:kernel:{op}: '{item}' is not KEY=VALUE with KEY one of {', '.join(known)}"
            )
        try:
            values[name] = int(text)
        except ValueError:
            raise ModelError(f"builtin:kernel:{op}: {name}={text!r} is not an integer") from None
        if values[name] < 0 or (values[name] == 0 and not (op == "pool" and name == "k")):
            raise ModelError(f"builtin:kernel:{op}: {name}={text} must be positive")
    missing = [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in values]
    if missing:
        raise ModelError(f"builtin:kernel:{op}: missing {', '.join(missing)}")
    sizes = tuple((p.name, values.get(p.name, p.default)) for p in params)
    return KernelSample(op, sizes)


def is_kernel_sample(model: str | None) -> bool:
    """Whether a stored model name is a kernel sample (calibration data, not a model to predict)."""
    return bool(model) and str(model).startswith(SAMPLE_PREFIX)


def sample_key(name: str) -> str | None:
    """The key of a stored sample's identity (`kernel-gemm-m1-k64-n32` -> `kernel:gemm,m=1,k=64,n=32`), so
    its graph can be rebuilt where the store is read; None for a name that is not a sample's."""
    op, *sizes = name[len(SAMPLE_PREFIX) :].split("-") if is_kernel_sample(name) else [""]
    pairs = [re.fullmatch(r"([a-z]+)(\d+)", part) for part in sizes]
    if op not in BUILDERS or not all(pairs):
        return None
    key = ",".join([f"kernel:{op}", *(f"{m.group(1)}={m.group(2)}" for m in pairs if m)])
    try:
        return key if parse_sample(key).name == name else None
    except ModelError:
        return None


def sample_model(key: str, cache_dir: Path | None = None) -> tuple[str, Path]:
    """(identity, path) of the sample `key` ("kernel:OP,..."), written once into the cache."""
    sample = parse_sample(key)
    return sample.name, generated_once(cache_dir, f"{sample.name}.r{SAMPLE_REVISION}.onnx", sample.build)


# The default grid, a handful per kind over sizes from L1/L2-resident to DRAM-sized (weights of 0.1 to
# 64 MiB for the GEMVs), the kinds vision, speech and language models on a phone are made of.
CALIBRATION: tuple[str, ...] = (
    *(f"kernel:gemm,m=1,k={k},n={n}" for k, n in [(128, 256), (256, 512), (512, 1024), (1024, 1024)]),
    *(f"kernel:gemm,m=1,k={k},n={n}" for k, n in [(1024, 2048), (1024, 4096), (2048, 4096), (4096, 4096)]),
    *(f"kernel:gemm,m={m},k={k},n={n}" for m, k, n in [(16, 1024, 1024), (64, 512, 512), (64, 1024, 4096)]),
    "kernel:gemm,m=256,k=256,n=256",
    *(f"kernel:conv,c={c},o={o},hw={hw}" for c, o, hw in [(16, 32, 112), (32, 32, 56), (64, 64, 28)]),
    *(f"kernel:conv,c={c},o={o},hw={hw}" for c, o, hw in [(128, 128, 14), (256, 256, 7)]),
    "kernel:conv,c=3,o=16,hw=224,s=2",
    "kernel:conv,c=32,o=64,hw=56,s=2",
    *(f"kernel:conv,c={c},o={o},hw={hw},k=1" for c, o, hw in [(32, 64, 56), (64, 128, 28), (128, 256, 14)]),
    "kernel:conv,c=256,o=512,hw=7,k=1",
    # a squeeze-excitation's 1x1s at one position: a call's fixed cost, not its work (mobile classifiers)
    *(f"kernel:conv,c={c},o={o},hw=1,k=1" for c, o in [(16, 8), (96, 24), (24, 96), (208, 52)]),
    # a streaming audio model's: an STFT as a convolution, then convolutions over its few frames (GEMV-like)
    "kernel:conv1d,c=1,o=258,l=640,k=256,s=128",
    *(f"kernel:conv1d,c={c},o={o},l={n}" for c, o, n in [(129, 128, 4), (64, 128, 2), (256, 256, 6)]),
    "kernel:conv1d,c=128,o=64,l=4,s=2",
    "kernel:conv1d,c=80,o=256,l=32,k=5",
    *(f"kernel:dwconv,c={c},hw={hw}" for c, hw in [(32, 112), (64, 56), (128, 28), (256, 14), (512, 7)]),
    "kernel:dwconv,c=64,hw=56,s=2",
    "kernel:dwconv,c=64,hw=40,k=5",
    "kernel:dwconv,c=128,hw=20,k=5",
    # the small end, under 1 MFLOP, where a mobile classifier's depthwise layers sit
    *(f"kernel:dwconv,c={c},hw={hw}" for c, hw in [(16, 24), (32, 12)]),
    *(f"kernel:dwconv,c={c},hw={hw},k=5" for c, hw in [(96, 12), (208, 10)]),
    *(
        f"kernel:deconv,c={c},o={o},hw={hw}"
        for c, o, hw in [(64, 32, 40), (32, 16, 80), (96, 24, 40), (24, 1, 160)]
    ),
    *(
        f"kernel:attention,h={h},s={s},d={d}"
        for h, s, d in [(4, 128, 64), (8, 64, 32), (2, 256, 64), (1, 64, 64)]
    ),
    # one step, as a streaming model runs (MNN runs a longer sequence as a While loop it cannot time per op)
    *(f"kernel:lstm,i={n},h={n}" for n in (32, 64, 96, 128)),
    *(f"kernel:norm,s={s},d={d}" for s, d in [(128, 256), (64, 512), (256, 64), (32, 96)]),
    *(f"kernel:skipnorm,s={s},d={d}" for s, d in [(128, 256), (64, 128), (256, 512), (32, 96)]),
    *(f"kernel:gelu,s={s},d={d}" for s, d in [(128, 1024), (64, 256), (32, 512), (256, 256)]),
    *(f"kernel:hardswish,c={c},hw={hw}" for c, hw in [(16, 112), (64, 28), (24, 80), (128, 14)]),
    # a hard-swish after a convolution run as a GEMM over whole tiles of positions (MNN) and not
    *(
        f"kernel:convswish,c={c},o={o},h={h},w={w}"
        for c, o, h, w in [
            (16, 32, 12, 24),
            (32, 64, 6, 24),
            (8, 16, 24, 48),
            (64, 128, 3, 48),
            (48, 96, 12, 12),
        ]
    ),
    "kernel:convswish,c=3,o=16,h=48,w=96,k=3,s=2",
    *(
        f"kernel:convswish,c={c},o={o},h={h},w={w}"
        for c, o, h, w in [(16, 32, 9, 9), (32, 64, 14, 14), (64, 128, 10, 20)]
    ),
    *(f"kernel:add,c={c},hw={hw}" for c, hw in [(32, 56), (128, 28), (16, 160), (256, 14)]),
    *(f"kernel:pool,c={c},hw={hw}" for c, hw in [(64, 56), (32, 112)]),
    *(f"kernel:pool,c={c},hw={hw},k=0" for c, hw in [(256, 14), (480, 10)]),
    *(f"kernel:resize,c={c},hw={hw}" for c, hw in [(64, 20), (32, 80), (96, 40), (16, 160)]),
    *(f"kernel:transpose,c={c},hw={hw}" for c, hw in [(64, 56), (256, 14), (32, 96), (128, 24)]),
)
