"""The runtimes registry: every runtime is one module behind `Runtime`, analysis asks its rules and
never its name, and a new runtime module with a registry line is enough for the graph analysis."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from dataclasses import astuple, replace
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import edgebench
from edgebench import runtimes
from edgebench.analysis.cost import analyze
from edgebench.analysis.kernels import FUSIONS, graph_kernels
from edgebench.models.builtin import builtin_model
from edgebench.native import ADAPTERS, RUNNER_FOR_RUNTIME
from edgebench.probes.registry import RUNTIMES
from edgebench.runtimes import KernelRules, Runtime, kernel_rules, runtime


def test_every_registered_runtime_loads_by_name_and_names_a_real_adapter() -> None:
    assert RUNTIMES == runtimes.names() == ("onnxruntime", "mnn", "litert", "ncnn", "llama.cpp")
    for name in runtimes.names():
        rt = runtime(name)
        assert isinstance(rt, Runtime) and rt.name == name and runtimes.owner_of(rt.formats[0]) is rt
        if rt.decode_tool is not None:  # llama.cpp: its tool decodes, it is no bench runner
            assert rt.native_tool is None and rt.probes == ("decode",) and rt.decodes
            continue
        assert rt.native_tool in ADAPTERS and RUNNER_FOR_RUNTIME[name] == rt.native_tool
        assert set(rt.kernels.fusions) <= set(FUSIONS)
        assert all(f.seen_on for f in rt.gemm_tiles)  # every machine fact says where it was seen
    with pytest.raises(
        ValueError, match="unknown runtime 'tvm' \\(known: onnxruntime, mnn, litert, ncnn, llama.cpp\\)"
    ):
        runtime("tvm")


def test_machine_facts_are_keyed_by_isa() -> None:
    mnn, ort = runtime("mnn"), runtime("onnxruntime")
    for arch, tile in (("x86_64", 24), ("amd64", 24), ("aarch64", 12), ("arm64", 12), ("riscv64", None)):
        assert mnn.gemm_tile({"arch": arch}) == tile, arch
    assert mnn.gemm_tile({}) is None and ort.gemm_tile({"arch": "x86_64"}) is None  # ORT: no such tile
    assert ort.block({"arch": "x86_64", "cpu_flags": ["avx2", "fma", "avx512f"]}) == 16
    assert ort.block({"arch": "aarch64", "cpu_flags": ["asimd"]}) == 1
    assert mnn.block({"arch": "x86_64", "cpu_flags": ["avx2", "fma", "avx512f"]}) == 1


def test_available_is_a_guard_that_imports_nothing() -> None:
    assert runtime("onnxruntime").available()
    ghost = replace(runtime("onnxruntime"), name="ghost", python_module="no_such_runtime_module")
    assert not ghost.available()
    assert "no_such_runtime_module" not in sys.modules
    # in a fresh interpreter: asking whether MNN and LiteRT are there loads neither
    code = (
        "import sys\nfrom edgebench.runtimes import runtime\n"
        "found = [runtime(n).available() for n in ('mnn', 'litert')]\n"
        "print(found, [m for m in ('MNN', 'ai_edge_litert') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[True, True] []", out.stdout + out.stderr


def _hard_sigmoid_model(path: Path) -> Path:
    """x -> Conv 1x1 -> HardSigmoid -> Relu: kernels that differ by the runtime's rules."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8, 1, 1], [0.1] * 64)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("HardSigmoid", ["c"], ["h"], name="hs"),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "hs", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_new_runtime_is_one_module_and_one_registry_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime module the package has never seen, registered by one line: the graph analysis follows its
    rules (here MNN's, then onnxruntime's under another name) without knowing its name."""
    module = types.ModuleType("edgebench.runtimes.toyrt")
    module.RUNTIME = replace(runtime("mnn"), name="toyrt")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "edgebench.runtimes.toyrt", module)
    monkeypatch.setitem(runtimes.MODULES, "toyrt", "toyrt")
    cost = analyze(onnx.load(_hard_sigmoid_model(tmp_path / "hs.onnx")))
    as_mnn = [astuple(k) for k in graph_kernels(cost, "mnn")]
    assert [astuple(k) for k in graph_kernels(cost, "toyrt")] == as_mnn
    # MNN's rules: the HardSigmoid is three kernels; onnxruntime's: fused into the convolution
    assert sum(k.op_type == "HardSigmoid" for k in graph_kernels(cost, "toyrt")) == 3
    module.RUNTIME = replace(runtime("onnxruntime"), name="toyrt")  # type: ignore[attr-defined]
    assert sum(k.op_type == "HardSigmoid" for k in graph_kernels(cost, "toyrt")) == 0
    big = analyze(onnx.load(builtin_model("encoder")))
    assert [astuple(k) for k in graph_kernels(big, "toyrt", nchwc_block=8)] == [
        astuple(k) for k in graph_kernels(big, "onnxruntime", nchwc_block=8)
    ]


def test_an_unknown_fusion_is_named_with_its_runtime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    module = types.ModuleType("edgebench.runtimes.toyrt")
    module.RUNTIME = replace(  # type: ignore[attr-defined]
        runtime("mnn"), name="toyrt", kernels=KernelRules(fusions=("flash-attention",))
    )
    monkeypatch.setitem(sys.modules, "edgebench.runtimes.toyrt", module)
    monkeypatch.setitem(runtimes.MODULES, "toyrt", "toyrt")
    cost = analyze(onnx.load(_hard_sigmoid_model(tmp_path / "hs.onnx")))
    with pytest.raises(ValueError, match="runtime 'toyrt': unknown fusion 'flash-attention'"):
        graph_kernels(cost, "toyrt")


def test_no_runtime_keeps_every_shape_op_and_makes_only_the_common_fusions() -> None:
    assert kernel_rules("") == runtimes.NO_RUNTIME and not runtimes.NO_RUNTIME.folds_static_shapes
    assert kernel_rules("onnxruntime") == runtime("onnxruntime").kernels


def test_analysis_never_branches_on_a_runtime_name() -> None:
    """Runtime knowledge lives in edgebench.runtimes: analysis asks a runtime's rules."""
    analysis = Path(edgebench.__file__).parent / "analysis"
    found = [
        f"{path.name}:{i}: {line.strip()}"
        for path in sorted(analysis.glob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"runtime\s*[!=]=|[!=]=\s*\"(onnxruntime|mnn|litert|ncnn)\"", line)
    ]
    assert not found, found


def test_formats_decide_what_a_runtime_runs_and_the_error_names_who_can(tmp_path: Path) -> None:
    from edgebench.errors import ModelError
    from edgebench.jobs import ModelRef
    from edgebench.probes.common import check_runtime, model_file_for, runtime_of

    onnx_model = ModelRef("m", builtin_model("tinymlp"))
    mnn_model, tflite_model = ModelRef("m", tmp_path / "m.mnn"), ModelRef("m", tmp_path / "m.tflite")
    ncnn_model = ModelRef("m", tmp_path / "m.ncnn.param")
    assert [runtime_of(m, None) for m in (onnx_model, mnn_model, tflite_model, ncnn_model)] == [
        "onnxruntime",
        "mnn",
        "litert",
        "ncnn",
    ]
    assert check_runtime(onnx_model, "ncnn") == "ncnn"  # pnnx converts ONNX on the host
    assert check_runtime(onnx_model, "mnn") == "mnn"  # MNN converts ONNX on the host
    cases = [
        (
            mnn_model,
            "onnxruntime",
            "onnxruntime cannot run an MNN model (onnxruntime runs .onnx models; use --runtime mnn)",
        ),
        (
            onnx_model,
            "litert",
            "LiteRT cannot run an ONNX model (LiteRT runs .tflite models; use --runtime onnxruntime, mnn or ncnn)",
        ),
        (
            ncnn_model,
            "onnxruntime",
            "onnxruntime cannot run an ncnn model (onnxruntime runs .onnx models; use --runtime ncnn)",
        ),
        (
            ncnn_model,
            "mnn",
            "MNN cannot run an ncnn model (MNN runs .mnn and .onnx models; use --runtime ncnn)",
        ),
        (
            tflite_model,
            "ncnn",
            "ncnn cannot run a .tflite model (ncnn runs .param/.bin and .onnx models; use --runtime litert)",
        ),
        (
            tflite_model,
            "mnn",
            "MNN cannot run a .tflite model (MNN runs .mnn and .onnx models; use --runtime litert)",
        ),
    ]
    for model, asked, words in cases:
        with pytest.raises(ModelError) as err:
            check_runtime(model, asked)
        assert str(err.value).endswith(words), err.value
    converted = model_file_for(onnx_model, "mnn")  # through Runtime.converter: MNN's own tool
    assert converted.suffix == ".mnn" and converted.stat().st_size > 0
    assert model_file_for(onnx_model, "onnxruntime") == onnx_model.path


def test_each_runtime_names_its_profile_reader_and_its_doctor_model() -> None:
    from edgebench.jobs import ModelRef
    from edgebench.probes import profile
    from edgebench.probes.doctor import models_for

    assert runtime("onnxruntime").profile_reader() is profile.ort_profile_of
    assert runtime("mnn").profile_reader() is profile.mnn_profile_of
    assert runtime("litert").profile_reader() is None and runtime("onnxruntime").profiler_calibration
    from edgebench.agent.decode import DECODERS
    from edgebench.probes.decode import DECODE_RUNTIMES

    # the host's and the agent's; llama.cpp decodes through its own tool
    assert DECODE_RUNTIMES == (*DECODERS, "llama.cpp") == ("onnxruntime", "mnn", "llama.cpp")
    onnx_model = ModelRef("m", builtin_model("tinymlp"))
    chosen = models_for(onnx_model, ["onnxruntime", "mnn", "litert"])
    assert chosen["onnxruntime"] == chosen["mnn"] == onnx_model
    assert chosen["litert"].path.suffix == ".tflite"  # LiteRT's own check model
