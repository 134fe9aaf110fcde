"""MNN as the host knows it: its own .mnn format (converted from ONNX on the host), its backends in the agent
(CPU in the PyPI wheel), `benchmark.out` on phones, and what its converter and CPU backend make of a graph."""

from __future__ import annotations

from .base import IsaFact, KernelRules, Runtime

# Output positions per tile of MNN's float GEMM (its eP): a unary op reading the output of a convolution
# run as a GEMM over a whole number of these tiles runs ~6x slower per element (measured on x86-64).
GEMM_TILES = (
    IsaFact("x86_64", 24, "MNN 3.x x86-64 wheel, AVX2 kernels: measured in this lab"),
    # MNNGetMatMulPackMode (source/backend/cpu/arm/CommonOptFunctionNeon.cpp, MNN 3.x) packs eP = 12,
    # hP = 8, lP = 1 (the ARMv8.2 FP16 path also eP = 12); the slow-unary effect not yet measured on ARM.
    IsaFact("aarch64", 12, "MNN 3.x source, arm64 NEON: read, not measured"),
)

RUNTIME = Runtime(
    name="mnn",
    display="MNN",
    python_module="MNN",
    formats=("mnn", "onnx"),
    # The backends its agent session opens (agent.session_mnn.BACKENDS): the PyPI wheel has the CPU alone
    # and runs every other on it after "Can't Find type=N backend", which the session reports
    backends=("cpu", "opencl", "vulkan", "opengl", "metal", "cuda", "nn"),
    model_noun="an MNN model",
    converters={"onnx": "models.convert:onnx_to_mnn"},
    native_tool="mnn_benchmark",
    profiler="probes.profile:mnn_profile_of",
    decodes=True,
    kernels=KernelRules(
        fusions=("erf-gelu",),
        activation_fusion="relu-or-conv-clip",
        hard_swish_as_unary=True,
        lstm_as_steps=True,
        hard_sigmoid_kernels=3,  # a scale, a shift and a ReLU6
        marks_gemm_tile_reads=True,
        unknown_device_gemm_tile=GEMM_TILES[0].value,  # where the effect was measured
    ),
    gemm_tiles=GEMM_TILES,
    winograd_3x3=True,  # 3x3 stride-1 convolutions as Winograd F(2,3): 2.25x fewer multiplies
)
