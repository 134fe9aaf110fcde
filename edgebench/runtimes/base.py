"""The interface every runtime module fills in: what the host needs to know about one runtime (its model
formats and conversion, its vendor tool's adapter, how its graph becomes kernels) and the machine-specific
numbers it runs at, each keyed by what it depends on (the ISA) and by the runtime version it was seen on."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..lab.nominal import cpu_isa

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


def isa_of(fingerprint: Mapping[str, Any]) -> str:
    """The architecture a device fingerprint reports, under one name per ISA ("x86_64", "aarch64")."""
    _, arch = cpu_isa(fingerprint)
    arch = arch.lower()
    return _ARCH_ALIASES.get(arch, arch)


@dataclass(frozen=True)
class IsaFact:
    """A number a runtime runs at on one ISA, and where it comes from (runtime version, measured or read)."""

    isa: str
    value: int
    seen_on: str


@dataclass(frozen=True)
class KernelRules:
    """How a runtime turns an ONNX graph into the kernels it dispatches, as `analysis.kernels.graph_kernels`
    applies them: which graph fusions it makes beyond the common ones (folding a BatchNormalization, a bias
    or an activation into the convolution or GEMM before it, LayerNormalization) and which kernels it adds.
    The defaults are a runtime that makes only the common fusions."""

    # Named fusions (`analysis.kernels.FUSIONS`) the runtime makes, in the order they are applied.
    fusions: tuple[str, ...] = ()
    # Which activations fold into the convolution or GEMM before them: "conv-or-relu" (any after a
    # convolution, a ReLU after anything) or "relu-or-conv-clip" (a ReLU, or a Clip after a convolution).
    activation_fusion: str = "conv-or-relu"
    # A bias after a MatMul of more than two dimensions fuses only when the model declares its shapes.
    bias_fusion_needs_static_shapes: bool = False
    # An exported hard-swish (x * HardSigmoid(x)) runs as one unary op.
    hard_swish_as_unary: bool = False
    # A one-step LSTM runs as its gate projections and element-wise steps (`analysis.kernels`).
    lstm_as_steps: bool = False
    # Kernels a HardSigmoid runs as (MNN: a scale, a shift and a ReLU6).
    hard_sigmoid_kernels: int = 1
    # Unary ops reading a convolution's whole GEMM tiles are marked (they run on a law of their own), at
    # the device's tile (`Runtime.gemm_tile`); a device whose ISA is not known is taken at this one.
    marks_gemm_tile_reads: bool = False
    unknown_device_gemm_tile: int | None = None
    # Channel-blocked (NCHWc) convolutions with layout reorders around them, at the device's block.
    nchwc_layout: bool = False
    # A MatMul of more than two dimensions that took its bias runs as a Gemm between two reshapes.
    reshapes_around_batched_gemm: bool = False
    # Shape arithmetic resolved statically is folded when the inputs are fully known.
    folds_static_shapes: bool = True
    # The host estimates a profiler's cost per kernel from the profiles (their sum past the plain p50, per
    # kernel: `analysis.kernel_predict.profiler_cost_ms`); False where the agent measured the instrument's
    # cost per call and took it off already, and what remains is no per-kernel constant (ncnn)
    estimates_profiler_cost: bool = True
    # Ops the runtime runs at a cost of their own within their kernel kind, with their family code (the
    # kernel predictor fits them apart and tells the correction which family ran).
    op_families: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Runtime:
    """One runtime as the host knows it; each module in `edgebench.runtimes` defines one as `RUNTIME`."""

    name: str
    display: str  # its name in a sentence ("MNN", "LiteRT")
    python_module: str  # what the agent imports to run it (checked by `available`)
    formats: tuple[str, ...]  # model file formats it runs; the first is its own, the others it converts
    model_noun: str  # a model in its own format, in a sentence ("an MNN model")
    native_tool: str | None  # its vendor benchmark tool: the runner key in `edgebench.native.ADAPTERS`
    kernels: KernelRules
    # Its float GEMM's output tile (positions) per ISA, where known.
    gemm_tiles: tuple[IsaFact, ...] = ()
    # Its channel block for NCHWc layouts on a device, from the fingerprint (1: no such layout).
    layout_block: Callable[[Mapping[str, Any]], int] | None = None
    # Convolutions it runs as Winograd, so a measurement may beat a floor counted in direct MACs.
    winograd_3x3: bool = False
    # format -> "module:function" in edgebench (path -> path of its own format, cached): how a model in
    # another format it runs is converted on the host first
    converters: Mapping[str, str] = field(default_factory=dict)
    # Its converter bakes the input shapes into the model (pnnx): it is given the job's shapes
    # (`shapes=`), and the model converted at them
    converts_at_shapes: bool = False
    # "module:function" in edgebench reading the agent's per-op profile reply on this runtime
    # (device, reply, timeout) -> OpProfile, and whether its profiler's own cost is calibrated out with
    # a calibration model; None: no per-op profile
    profiler: str | None = None
    profiler_calibration: bool = False
    # A model in its own format `doctor` checks it with when the doctor's model is one it cannot run
    # (nothing here converts to it)
    check_model: str | None = None
    # Whether an ONNX model with every node output made a graph output runs on it with each tensor under
    # its name (`accuracy --per-op`); pnnx fuses layers and renames their blobs, so ncnn does not
    per_op_outputs: bool = True
    # "module:function" in edgebench giving the kernels it runs for an ONNX model at its input shapes,
    # read from its own converted graph ((onnx path, shapes) -> list[Kernel]); None: the ONNX graph and
    # the rules above (`kernels`) stand for it
    graph_kernels: str | None = None
    # "module:function" in edgebench describing each layer of a model in its own format as a profile does
    # ((path) -> [{node, op_type, inputs, outputs, mflops, parameter_bytes}]), run on the host: what a
    # vendor tool's per-layer times on a device without Python are joined with, by layer name
    graph_layers: str | None = None
    # The probes it runs (None: every probe); a job of another is refused before anything runs
    probes: tuple[str, ...] | None = None
    # The [runners] key of the vendor tool `probe decode` runs on it instead of the agent (llama-bench)
    decode_tool: str | None = None
    # The backends its agent session opens (`--backend`), as the runtime names them; the first is its
    # CPU. Each session reports where the model actually ran (agent.placement)
    backends: tuple[str, ...] = ("cpu",)
    # Whether the agent runs LLM decode on it (`probe decode`: prefill, then token by token with its KV
    # cache; agent.decode.DECODERS)
    decodes: bool = False

    def runs_probe(self, probe: str) -> bool:
        """Whether it runs probe kind `probe` (decode alone on llama.cpp)."""
        return self.probes is None or probe in self.probes

    def gemm_tile(self, fingerprint: Mapping[str, Any]) -> int | None:
        """The GEMM tile on the device the fingerprint describes; None where its ISA's tile is not known."""
        isa = isa_of(fingerprint)
        return next((f.value for f in self.gemm_tiles if f.isa == isa), None)

    def block(self, fingerprint: Mapping[str, Any]) -> int:
        return self.layout_block(fingerprint) if self.layout_block else 1

    def converter(self, fmt: str) -> Callable[[Path], Path] | None:
        """The host-side conversion of a model in format `fmt` to this runtime's own (None: none needed or
        none known), imported on use."""
        target = self.converters.get(fmt)
        return _load(target) if target is not None else None

    def own_graph_kernels(self) -> Callable[..., Any] | None:
        """How the kernels it runs are read from its own converted graph (None: from the ONNX rules)."""
        return _load(self.graph_kernels) if self.graph_kernels is not None else None

    def own_graph_layers(self) -> Callable[..., Any] | None:
        """How each layer of a model in its own format is described on the host (None: it cannot be)."""
        return _load(self.graph_layers) if self.graph_layers is not None else None

    def profile_reader(self) -> Callable[..., Any] | None:
        """How this runtime's per-op profile is read from the agent's reply (None: it has none)."""
        return _load(self.profiler) if self.profiler is not None else None

    def available(self) -> bool:
        """Whether this host can run it in-process (its Python package imports), as a guard for tests and
        `doctor`, without importing it."""
        return importlib.util.find_spec(self.python_module) is not None


def _load(target: str) -> Callable[..., Any]:
    """The function a "module:function" in edgebench names, imported on use (the runtime modules sit
    below the layers that implement them)."""
    module, function = target.split(":")
    found: Callable[..., Any] = getattr(importlib.import_module(f"edgebench.{module}"), function)
    return found
