"""onnxruntime as the host knows it: ONNX in, the CPU provider (or another execution provider) in the
agent, `onnxruntime_perf_test` on phones, and the graph optimizations that decide which kernels it
dispatches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..lab.nominal import cpu_isa
from .base import KernelRules, Runtime


def nchwc_block(fingerprint: Mapping[str, Any]) -> int:
    """The channel block onnxruntime's MLAS runs NCHWc kernels at on a device, from its fingerprint's
    architecture and CPU flags (1: no NCHWc, and then onnxruntime registers no NchwcTransformer).

    MLAS (core/mlas/lib/platform.cpp) sets the block per platform: 8 on every x86-64 CPU (its SSE, AVX and
    AVX2/FMA3 kernels), 16 where AVX-512F is usable (checked inside the AVX2/FMA3 branch); 32-bit x86 has
    none. On ARM64 the NEON NCHWc kernels are compiled only with the build option
    onnxruntime_USE_ARM_NEON_NCHWC, off by default (onnxruntime PR 26171; so in the published wheels,
    1.32 included): 1. A fingerprint without an architecture is taken as having none either."""
    flags, arch = cpu_isa(fingerprint)
    if arch.lower() not in ("x86_64", "amd64", "x64"):
        return 1
    return 16 if {"avx512f", "avx2", "fma"} <= flags else 8


RUNTIME = Runtime(
    name="onnxruntime",
    display="onnxruntime",
    python_module="onnxruntime",
    formats=("onnx",),
    model_noun="an ONNX model",
    native_tool="onnxruntime_perf_test",
    profiler="probes.profile:ort_profile_of",
    profiler_calibration=True,
    decodes=True,
    # The backends its agent session opens (agent.session_onnxruntime.BACKENDS), each an execution provider
    # that only some onnxruntime wheels carry: the agent refuses one its onnxruntime lacks, naming the wheel
    backends=(
        "cpu",
        "openvino",
        "openvino-gpu",
        "openvino-npu",
        "cuda",
        "tensorrt",
        "rocm",
        "migraphx",
        "dml",
        "qnn",
        "nnapi",
        "coreml",
        "xnnpack",
        "webgpu",
        "dnnl",
        "acl",
        "armnn",
        "vitisai",
        "cann",
    ),  # fmt: skip
    kernels=KernelRules(
        # QuickGelu, SkipLayerNormalization and a MatMul's constant scale folded in (its level-2 fusions)
        fusions=("quick-gelu", "skip-layer-norm", "matmul-scale"),
        bias_fusion_needs_static_shapes=True,  # MatMulAddFusion beyond two dimensions needs known shapes
        nchwc_layout=True,
        reshapes_around_batched_gemm=True,
        # its 1x1 Conv against its Gemm/MatMul, its SkipLayerNormalization (the residual Add inside)
        # against a LayerNormalization: ops that run their kind's work at a cost of their own
        op_families={"Conv": 1.0, "FusedConv": 1.0, "NhwcFusedConv": 1.0, "SkipLayerNormalization": 2.0},
    ),
    layout_block=nchwc_block,
)
