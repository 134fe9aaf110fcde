"""LiteRT (formerly TensorFlow Lite) as the host knows it: .tflite models, its CPU interpreter in the agent,
`benchmark_model` on phones, and its GPU accelerator as backend "gpu"."""

from __future__ import annotations

from .base import KernelRules, Runtime
from .onnxruntime import RUNTIME as ONNXRUNTIME

RUNTIME = Runtime(
    name="litert",
    display="LiteRT",
    python_module="ai_edge_litert",
    formats=("tflite",),
    model_noun="a .tflite model",
    native_tool="benchmark_model",
    check_model="builtin:mlp.tflite",  # nothing here converts ONNX to .tflite
    # No kernel rules of its own yet (its graphs are not ONNX); the kernel predictor's op families are
    # onnxruntime's, as they have been for every runtime but MNN.
    kernels=KernelRules(op_families=ONNXRUNTIME.kernels.op_families),
    # the interpreter (XNNPACK), and the CompiledModel's GPU accelerator (WebGPU over Vulkan in
    # ai-edge-litert 2.x) with the CPU for the ops it lacks
    backends=("cpu", "gpu"),
)
