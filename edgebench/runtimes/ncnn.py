"""ncnn as the host knows it: its own model is a `.param` graph with its `.bin` weights beside it (made on
the host from ONNX by pnnx), its Python wheel in the agent, `benchncnn` on phones, and what pnnx and its
CPU layers make of a graph."""

from __future__ import annotations

from .base import KernelRules, Runtime

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
    # pnnx fuses far past the common rules (hard-swish and hard-sigmoid chains into one layer, an
    # activation of any kind into the convolution before it, 1x1 convolutions over one position into an
    # InnerProduct, a Split per fan-out): the kernels are read from the graph pnnx makes, converted at the
    # model's shapes and run once on the host for each layer's shapes, exactly as the profile reads them
    graph_kernels="analysis.ncnn_graph:ncnn_kernels",
    graph_layers="analysis.ncnn_graph:ncnn_layer_ops",  # benchncnn's per-layer times joined by layer name
    # the agent takes the cost of an extract call off each layer (measured); what its profile still reads
    # above the plain p50 (every blob kept: rec 1.48x) grows with the activations, not per layer, and is
    # scaled off with the rest (`kernel_predict.without_profiler_cost`); estimated per kernel on the
    # host as well, it read 32 us a layer and put PP-OCR cls 77% low (held out, median error 34 -> 20%)
    kernels=KernelRules(estimates_profiler_cost=False),
    per_op_outputs=False,  # pnnx fuses and renames the tensors: only the graph's own outputs keep names
    backends=("cpu", "vulkan"),  # the wheel is built with Vulkan compute
    winograd_3x3=True,  # use_winograd_convolution: 3x3 stride-1 convolutions as Winograd F(6,3)/F(4,3)/F(2,3)
)
