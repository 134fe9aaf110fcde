"""ncnn as the host knows it: its own model is a `.param` graph with its `.bin` weights beside it (made on
the host from ONNX by pnnx), its Python wheel in the agent, `benchncnn` on phones, and what pnnx and its
CPU layers make of a graph."""

from __future__ import annotations

from .base import KernelRules, Runtime
from .onnxruntime import RUNTIME as ONNXRUNTIME

RUNTIME = Runtime(
    name="ncnn",
    display="ncnn",
    python_module="ncnn",
    formats=("ncnn", "onnx"),
    model_noun="an ncnn model",
    converters={"onnx": "models.convert_ncnn:onnx_to_ncnn"},
    converts_at_shapes=True,  # pnnx writes some layers for the shapes it converted at
    native_tool="benchncnn",
    profiler="probes.profile:ncnn_profile_of",
    # pnnx folds a bias and a ReLU into the convolution or inner product before it (convrelu_N,
    # fcrelu_N), as every runtime here does; its own fusions are not yet measured against a per-layer
    # profile, so the kernel predictor's op families are onnxruntime's, as for LiteRT.
    kernels=KernelRules(op_families=ONNXRUNTIME.kernels.op_families),
    per_op_outputs=False,  # pnnx fuses and renames the tensors: only the graph's own outputs keep names
    winograd_3x3=True,  # use_winograd_convolution: 3x3 stride-1 convolutions as Winograd F(6,3)/F(4,3)/F(2,3)
)
