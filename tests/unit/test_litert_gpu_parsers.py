"""Parser tests on LiteRT's GPU delegation log, captured from ai-edge-litert 2.3.0's WebGPU accelerator (the
process's stderr while `CompiledModel.from_file` ran, GPU|CPU, on models of FULLY_CONNECTED ops built with
the wheel's flatbuffer schema), and the placement read from it: which ops ran where, the partial and the
whole model, the failures of a machine with no adapter Dawn takes. The logs are cut to the lines around
what is read, kept as LiteRT wrote them."""

from __future__ import annotations

from edgebench.agent.session_litert import (
    DelegationLog,
    GraphOp,
    gpu_failure,
    gpu_placement,
    gpu_run,
    parse_delegation,
)

# Mesa 25.0.7 lavapipe (bookworm-backports), FC, FC, LOG_SOFTMAX, FC: the GPU lacks LOG_SOFTMAX
PARTIAL = """\
INFO: [compiled_model.cc:829] Flatbuffer model initialized directly from incoming litert model.
INFO: [delegate_webgpu.cc:342] Create WebGPU environment (use_low_power=0, enable_host_mapped_pointer=1)
Warning: maxDynamicUniformBuffersPerPipelineLayout artificially reduced from 1000000 to 16 to fit dynamic \
offset allocation limit.
Warning: maxDynamicStorageBuffersPerPipelineLayout artificially reduced from 1000000 to 16 to fit dynamic \
offset allocation limit.
WARNING: Logging before InitGoogle() is written to STDERR
I0000 00:00:1796647991.894922   30233 environment.cc:532] Selected adapter: llvmpipe (LLVM 15.0.6, 256 bits), \
arch=software, vendor=mesa, backend=Vulkan, adapterType=CPU / Software
INFO: [delegate_webgpu.cc:363] Created a WebGPU environment.
INFO: [environment.cc:47] Adding options to the existing LiteRT environment
INFO: [gpu_environment.h:155] Created LiteRT GpuEnvironment.
INFO: [environment.cc:47] Adding options to the existing LiteRT environment
I0000 00:00:1796647991.906801   30233 delegate_webgpu.cc:751] # of threads to upload weights = 0
I0000 00:00:1796647991.906818   30233 delegate_webgpu.cc:759] # of threads to compile kernels = 0
ERROR: Following operations are not supported by GPU delegate:
LOG_SOFTMAX: Operation is not supported.
1 operations will run on the GPU, and the remaining 2 operations will run on the CPU.
I0000 00:00:1796647991.906933   30233 delegate_kernel.cc:984] Initializing WebGPU-based API from graph.
INFO: Created TensorFlow Lite XNNPACK delegate for CPU.
"""

# The same, FC, FC, LOG_SOFTMAX, FC, FC, FC, ZEROS_LIKE: two types refused, the three FCs taken
TWO_TYPES = """\
WARNING: Logging before InitGoogle() is written to STDERR
I0000 00:00:1796648102.938919    1562 environment.cc:532] Selected adapter: llvmpipe (LLVM 15.0.6, 256 bits), \
arch=software, vendor=mesa, backend=Vulkan, adapterType=CPU / Software
I0000 00:00:1796648102.950740    1562 delegate_webgpu.cc:759] # of threads to compile kernels = 0
ERROR: Following operations are not supported by GPU delegate:
LOG_SOFTMAX: Operation is not supported.
ZEROS_LIKE: Operation is not supported.
3 operations will run on the GPU, and the remaining 4 operations will run on the CPU.
I0000 00:00:1796648102.950887    1562 delegate_kernel.cc:984] Initializing WebGPU-based API from graph.
"""

# The same, FC, SIN, FC: every op taken; the log says nothing of a split
FULL = """\
INFO: [delegate_webgpu.cc:342] Create WebGPU environment (use_low_power=0, enable_host_mapped_pointer=1)
WARNING: Logging before InitGoogle() is written to STDERR
I0000 00:00:1796647992.600033   30281 environment.cc:532] Selected adapter: llvmpipe (LLVM 15.0.6, 256 bits), \
arch=software, vendor=mesa, backend=Vulkan, adapterType=CPU / Software
INFO: [delegate_webgpu.cc:363] Created a WebGPU environment.
I0000 00:00:1796647992.611504   30281 delegate_webgpu.cc:759] # of threads to compile kernels = 0
I0000 00:00:1796647992.611641   30281 delegate_kernel.cc:984] Initializing WebGPU-based API from graph.
INFO: Created TensorFlow Lite XNNPACK delegate for CPU.
"""

# Debian 12's own Mesa 22.3 lavapipe: Dawn refuses the adapter, from_file raises
MESA22 = """\
INFO: [compiled_model.cc:829] Flatbuffer model initialized directly from incoming litert model.
INFO: [delegate_webgpu.cc:342] Create WebGPU environment (use_low_power=0, enable_host_mapped_pointer=1)
Warning: Vulkan shaderUniform*ArrayDynamicIndexing required.
 - While initializing adapter (backend=BackendType::Vulkan)
    at InitializeImpl (third_party/dawn/src/dawn/native/vulkan/PhysicalDeviceVk.cpp:256)

ERROR: [delegate_webgpu.cc:359] Failed to initialize WebGPU environment: INTERNAL: No adapters found
WARNING: Logging before InitGoogle() is written to STDERR
E0000 00:00:1796647993.305038   30359 delegate_webgpu.cc:736] Failed to get or create delegate WebGPU \
environment: INTERNAL: Failed to initialize WebGPU environment
=== Source Location Trace: ===
third_party/odml/litert/ml_drift/delegate/delegate_webgpu.cc:432
"""

# VK_ICD_FILENAMES naming no file: the Vulkan loader finds no driver
NO_ICD = """\
INFO: [delegate_webgpu.cc:342] Create WebGPU environment (use_low_power=0, enable_host_mapped_pointer=1)
Warning: loader_get_json: Failed to open JSON file /nonexistent.json
Warning: vkCreateInstance: Found no drivers!
Warning: vkCreateInstance failed with VK_ERROR_INCOMPATIBLE_DRIVER
    at CheckVkSuccessImpl (third_party/dawn/src/dawn/native/vulkan/VulkanError.cpp:106)

ERROR: [delegate_webgpu.cc:359] Failed to initialize WebGPU environment: INTERNAL: No adapters found
WARNING: Logging before InitGoogle() is written to STDERR
E0000 00:00:1796647993.972327   30407 delegate_webgpu.cc:736] Failed to get or create delegate WebGPU \
environment: INTERNAL: Failed to initialize WebGPU environment
"""

# What from_file raised on Mesa 22.3 (its own text names no reason)
RAISED = RuntimeError(
    "ERROR: [./litert/cc/litert_compiled_model.h:1961]\n└ ERROR: [litert/runtime/compiled_model.cc:1036]"
)
FP16 = {"mode": "fp16", "enforce_f32": False, "asked": None}
LLVMPIPE = "llvmpipe (LLVM 15.0.6, 256 bits)"


def ops(*types: str) -> list[GraphOp]:
    return [GraphOp(f"t{i}", kind) for i, kind in enumerate(types)]


def test_partial_log_gives_the_refused_type_the_split_and_the_adapter() -> None:
    log = parse_delegation(PARTIAL)
    assert log == DelegationLog(
        adapter=LLVMPIPE,
        adapter_type="CPU / Software",
        applied=True,
        unsupported=(("LOG_SOFTMAX", "Operation is not supported."),),
        gpu_ops=1,
        cpu_ops=2,
    )
    assert parse_delegation(TWO_TYPES).unsupported == (
        ("LOG_SOFTMAX", "Operation is not supported."),
        ("ZEROS_LIKE", "Operation is not supported."),
    )
    assert (parse_delegation(TWO_TYPES).gpu_ops, parse_delegation(TWO_TYPES).cpu_ops) == (3, 4)


def test_full_log_has_no_split_and_failure_logs_name_why() -> None:
    full = parse_delegation(FULL)
    assert full.applied and full.adapter == LLVMPIPE and full.gpu_ops is None and full.unsupported == ()
    mesa22, no_icd = parse_delegation(MESA22), parse_delegation(NO_ICD)
    assert not mesa22.applied and mesa22.adapter is None
    assert mesa22.failure == no_icd.failure == "INTERNAL: No adapters found"
    assert mesa22.refusals == ("Vulkan shaderUniform*ArrayDynamicIndexing required.",)
    assert no_icd.refusals == ("vkCreateInstance: Found no drivers!",)
    assert gpu_failure(mesa22, RAISED) == (
        "LiteRT's GPU backend (WebGPU over Vulkan) could not be opened: INTERNAL: No adapters found "
        "(Dawn: Vulkan shaderUniform*ArrayDynamicIndexing required.)"
    )
    said = gpu_failure(parse_delegation(""), RAISED)
    assert "\n" not in said and said.endswith("ERROR: [litert/runtime/compiled_model.cc:1036]")


def test_gpu_run_is_the_one_longest_run_of_supported_ops_matching_the_count() -> None:
    refused = {"LOG_SOFTMAX", "ZEROS_LIKE"}
    assert gpu_run(["FC", "FC", "LOG_SOFTMAX", "FC"], refused, 2) == range(0, 2)
    assert gpu_run(["FC", "FC", "LOG_SOFTMAX", "FC", "FC", "FC", "ZEROS_LIKE"], refused, 3) == range(3, 6)
    assert gpu_run(["FC", "LOG_SOFTMAX", "FC"], refused, 1) is None  # a tie: either FC
    assert gpu_run(["FC", "FC", "LOG_SOFTMAX", "FC"], refused, 3) is None  # the count says otherwise
    assert gpu_run(["LOG_SOFTMAX"], refused, 0) == range(0)


def test_partial_placement_names_the_ops_on_the_cpu_and_counts_partitions() -> None:
    log = parse_delegation(PARTIAL.replace("1 operations", "2 operations"))  # FC, FC, LOG_SOFTMAX, FC
    placement = gpu_placement(
        ops("FULLY_CONNECTED", "FULLY_CONNECTED", "LOG_SOFTMAX", "FULLY_CONNECTED"), log, False, FP16
    )
    assert placement.actual == "gpu+cpu" and placement.ops_by_unit == {"gpu": 2, "cpu": 2}
    assert placement.partitions == 2
    assert placement.fallback_ops == ["t2 (LOG_SOFTMAX)", "t3 (FULLY_CONNECTED)"]
    assert (
        "LOG_SOFTMAX (Operation is not supported.)" in placement.evidence and LLVMPIPE in placement.evidence
    )
    assert placement.precision == FP16
    assert "t2 (LOG_SOFTMAX)" in (placement.shortfall() or "")

    seven = ops(*"FC FC LOG_SOFTMAX FC FC FC ZEROS_LIKE".split())
    placement = gpu_placement(seven, parse_delegation(TWO_TYPES), False, FP16)
    assert placement.ops_by_unit == {"cpu": 4, "gpu": 3} and placement.partitions == 3
    assert placement.fallback_ops == ["t0 (FC)", "t1 (FC)", "t2 (LOG_SOFTMAX)", "t6 (ZEROS_LIKE)"]


def test_a_split_that_cannot_be_pinned_is_gpu_plus_cpu_with_the_refused_type_named() -> None:
    placement = gpu_placement(ops("FC", "LOG_SOFTMAX", "FC"), parse_delegation(PARTIAL), False, FP16)
    assert placement.actual == "gpu+cpu" and placement.ops_by_unit == {} and placement.partitions is None
    assert "LOG_SOFTMAX" in placement.evidence and "unknown" in placement.evidence
    assert "LOG_SOFTMAX" in (placement.shortfall() or "")


def test_whole_gpu_needs_both_witnesses_and_no_gpu_is_cpu_never_gpu() -> None:
    full = parse_delegation(FULL)
    placement = gpu_placement(ops("FC", "SIN", "FC"), full, True, FP16)
    assert placement.actual == "gpu" and placement.ops_by_unit == {"gpu": 3} and placement.shortfall() is None
    # fully accelerated by the API's word, but no delegate in the log (or the reverse): not known
    assert gpu_placement(ops("FC"), parse_delegation(""), True, FP16).actual == "unknown"
    assert gpu_placement(ops("FC"), full, False, FP16).actual == "unknown"
    # a split in the log contradicting is_fully_accelerated(): not known either
    assert (
        gpu_placement(ops("FC", "FC", "LOG_SOFTMAX"), parse_delegation(PARTIAL), True, FP16).actual
        == "unknown"
    )
    # LiteRT found no GPU accelerator library: every op on the CPU, said so
    missing = DelegationLog(not_loaded=True)
    placement = gpu_placement(ops("FC", "FC"), missing, False, FP16)
    assert placement.actual == "cpu" and placement.ops_by_unit == {"cpu": 2}
    assert "no GPU accelerator" in placement.evidence
    assert placement.shortfall() is not None and "ran on cpu" in placement.shortfall()  # type: ignore[operator]
