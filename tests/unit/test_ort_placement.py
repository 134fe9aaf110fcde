"""onnxruntime's backends as pure logic: which EP a backend opens and with which options (OpenVINO's
precision hint through load_config), the unit each EP's nodes count as, and the placement parsed from what
onnxruntime 1.24.1 with the OpenVINO EP (onnxruntime-openvino) actually returned for a MatMul chain with a
Hardmax in the middle (OpenVINO takes no Hardmax): its EP assignment record, its profile's kernel events
and the error lines it logged when an EP could not be created."""

from __future__ import annotations

import json

import pytest

from edgebench.agent.placement import OpUnit
from edgebench.agent.session import BackendError
from edgebench.agent.session_onnxruntime import (
    BACKENDS,
    assigned_ops,
    backend_options,
    ort_errors,
    profile_kernels,
    provider_of,
    read_placement,
    unit_of,
)
from edgebench.runtimes.onnxruntime import RUNTIME

OV = "OpenVINOExecutionProvider"
FP32 = {"mode": "fp32"}

# session.get_provider_graph_assignment_info() of part.onnx (mm1 relu1 mm2 hardmax mm3 relu2 mm4) on
# onnxruntime-openvino 1.24.1, as assignment_of turns it into data: two fused OpenVINO subgraphs, then
# the CPU's node (by EP, not in execution order)
ASSIGNMENT = [
    {"ep": OV, "nodes": [["mm1", "MatMul"], ["relu1", "Relu"], ["mm2", "MatMul"]]},
    {"ep": OV, "nodes": [["mm3", "MatMul"], ["relu2", "Relu"], ["mm4", "MatMul"]]},
    {"ep": "CPUExecutionProvider", "nodes": [["hardmax", "Hardmax"]]},
]


def node(name: str, provider: str, op_name: str) -> dict:
    """A "Node" event of an onnxruntime profile, trimmed to the fields the parser reads and a few it
    must ignore."""
    args = {"thread_scheduling_stats": "", "output_size": "512", "provider": provider, "op_name": op_name}
    return {"cat": "Node", "ph": "X", "dur": 19, "ts": 83727, "name": f"{name}_kernel_time", "args": args}


def session(name: str) -> dict:
    return {"cat": "Session", "ph": "X", "dur": 800, "ts": 83056, "name": name, "args": {}}


ONE_RUN = [
    node("OpenVINOExecutionProvider_OpenVINO-EP-subgraph_1_0", OV, "OpenVINO-EP-subgraph_1"),
    node("hardmax", "CPUExecutionProvider", "Hardmax"),
    node("OpenVINOExecutionProvider_OpenVINO-EP-subgraph_2_1", OV, "OpenVINO-EP-subgraph_2"),
    session("SequentialExecutor::Execute"),
    session("model_run"),
]
# the profile of two runs as onnxruntime wrote it (session events first)
PROFILE = [session("model_loading_uri"), session("session_initialization"), *ONE_RUN, *ONE_RUN]

# what onnxruntime-openvino 1.24.1 wrote on stderr when asked for device_type GPU on a machine without one
DROPPED = (
    "\x1b[1;31m2026-12-07 12:57:57.839852143 [E:onnxruntime:Default, provider_bridge_ort.cc:2310 Create] "
    "/onnxruntime/onnxruntime/core/providers/openvino/openvino_provider_factory.cc:141 std::string "
    "onnxruntime::openvino_ep::ParseDeviceType(std::shared_ptr<OVCore>, const onnxruntime::ProviderOptions&) "
    "[ERROR] [OpenVINO] Device GPU is not available\n\x1b[m\n\x1b[0;93m2026-12-07 12:57:57.839884550 "
    "[W:onnxruntime:Default, onnxruntime_pybind_state.cc:1066 CreateExecutionProviderFactoryInstance] Failed "
    "to create OpenVINOExecutionProvider. Please refer https://onnxruntime.ai/docs/execution-providers/"
    "OpenVINO-ExecutionProvider.html#requirements to ensure all dependencies are met.\x1b[m\n"
)


def test_each_backend_opens_its_ep_and_an_unknown_name_is_refused_naming_those_there_are() -> None:
    assert provider_of("openvino") == OV
    assert provider_of("cpu") == "CPUExecutionProvider"
    assert provider_of("cuda") == "CUDAExecutionProvider"
    with pytest.raises(BackendError, match=r"onnxruntime has no backend 'vulcan' \(it has: cpu, openvino,"):
        provider_of("vulcan")


def test_the_host_runtime_entry_offers_exactly_the_backends_the_agent_session_opens() -> None:
    assert RUNTIME.backends == tuple(BACKENDS)
    assert RUNTIME.backends[0] == "cpu"


def test_a_node_counts_as_the_backend_asked_for_where_that_backend_is_its_ep() -> None:
    assert unit_of(OV, "openvino") == "openvino"
    assert unit_of(OV, "openvino-gpu") == "openvino-gpu"  # the same EP on another OpenVINO device
    assert unit_of("CPUExecutionProvider", "openvino") == "cpu"
    assert unit_of(OV, "cuda") == "openvino"  # not the EP asked for: the first backend naming it
    assert unit_of("SomeVendorExecutionProvider", "openvino") == "SomeVendorExecutionProvider"


def test_openvino_options_name_its_device_and_threads_and_record_its_default_precision() -> None:
    options, record = backend_options("openvino", 2, None)
    assert options == {"device_type": "CPU", "num_of_threads": "2"}
    assert record == {"mode": "fp32", "device_type": "CPU", "set_by": "the OpenVINO EP's default"}
    options, record = backend_options("openvino-gpu", 0, None)
    assert options == {"device_type": "GPU"} and record["mode"] == "fp16"


@pytest.mark.parametrize(("precision", "hint"), [("bf16", "bf16"), ("fp16", "f16"), ("fp32", "f32")])
def test_a_precision_is_openvinos_inference_precision_hint_through_load_config(
    precision: str, hint: str
) -> None:
    options, record = backend_options("openvino", 1, precision)
    assert json.loads(options["load_config"]) == {"CPU": {"INFERENCE_PRECISION_HINT": hint}}
    assert record["mode"] == precision and record["INFERENCE_PRECISION_HINT"] == hint


def test_a_precision_openvino_lacks_or_on_an_ep_without_a_hint_is_refused() -> None:
    with pytest.raises(BackendError, match="openvino takes precision fp32, fp16, bf16, not 'int8'"):
        backend_options("openvino", 1, "int8")
    with pytest.raises(BackendError, match="backend 'cuda' takes no precision here"):
        backend_options("cuda", 1, "fp16")
    options, record = backend_options("cuda", 1, None)
    assert options == {} and record["mode"] == "unknown"


def test_parser_ort_errors_reads_the_reason_an_ep_was_dropped_from_its_log() -> None:
    assert ort_errors(DROPPED) == ["[OpenVINO] Device GPU is not available"]
    assert ort_errors("nothing logged\n") == []


def test_parser_assignment_counts_every_node_of_a_fused_subgraph_on_its_unit() -> None:
    ops = assigned_ops(ASSIGNMENT, "openvino")
    assert [op.unit for op in ops] == ["openvino"] * 6 + ["cpu"]
    assert ops[-1] == OpUnit("hardmax", "Hardmax", "cpu")


def test_parser_profile_kernels_of_the_first_run_in_execution_order() -> None:
    kernels = profile_kernels(PROFILE, "openvino")
    assert [(k.name, k.op_type, k.unit) for k in kernels] == [
        ("OpenVINOExecutionProvider_OpenVINO-EP-subgraph_1_0", "OpenVINO-EP-subgraph_1", "openvino"),
        ("hardmax", "Hardmax", "cpu"),
        ("OpenVINOExecutionProvider_OpenVINO-EP-subgraph_2_1", "OpenVINO-EP-subgraph_2", "openvino"),
    ]


def test_parser_placement_takes_counts_from_the_assignment_and_partitions_from_the_profile() -> None:
    kernels = profile_kernels(PROFILE, "openvino")
    placed = read_placement("openvino", assigned_ops(ASSIGNMENT, "openvino"), kernels, FP32)
    assert placed.actual == "openvino+cpu" and not placed.full
    assert placed.ops_by_unit == {"openvino": 6, "cpu": 1}
    assert placed.partitions == 3 and placed.fallback_ops == ["hardmax (Hardmax)"]
    assert "partitions from the kernel order" in placed.evidence and placed.precision == FP32
    assert placed.shortfall() == (
        "openvino was asked for; 1 of 7 ops ran elsewhere (hardmax (Hardmax)), 3 partitions"
    )


def test_parser_placement_without_a_profile_leaves_partitions_unknown_never_guessed() -> None:
    placed = read_placement("openvino", assigned_ops(ASSIGNMENT, "openvino"), None, FP32, "profiled")
    assert placed.partitions is None and "partitions unknown (profiled)" in placed.evidence


def test_parser_placement_of_a_model_wholly_on_the_ep_is_full_in_one_partition() -> None:
    placed = read_placement("openvino", assigned_ops(ASSIGNMENT[:2], "openvino"), None, FP32)
    assert placed.full and placed.partitions == 1 and placed.ops_by_unit == {"openvino": 6}
    assert placed.shortfall() is None


def test_parser_placement_from_the_profile_alone_counts_a_fused_subgraph_as_one_op() -> None:
    placed = read_placement("openvino", None, profile_kernels(PROFILE, "openvino"), FP32)
    assert placed.ops_by_unit == {"openvino": 2, "cpu": 1} and placed.partitions == 3
    assert "a fused EP subgraph counts as one op" in placed.evidence


def test_parser_placement_with_no_evidence_is_unknown_never_the_backend_asked_for() -> None:
    placed = read_placement("openvino", None, None, FP32, "the profiled run at load failed: boom")
    assert placed.actual == "unknown" and not placed.full
    assert "the profiled run at load failed: boom" in (placed.shortfall() or "")


def test_parser_placement_of_a_model_the_ep_took_nothing_of_says_it_ran_on_the_cpu() -> None:
    cpu_only = [{"ep": "CPUExecutionProvider", "nodes": [["a", "Hardmax"], ["b", "Hardmax"]]}]
    placed = read_placement("openvino", assigned_ops(cpu_only, "openvino"), None, FP32)
    assert placed.actual == "cpu" and placed.partitions == 1
    assert "the model ran on cpu" in (placed.shortfall() or "")
