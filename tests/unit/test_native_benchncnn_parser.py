"""The benchncnn adapter against real output of the lab's binaries (edgebench/native/fixtures/benchncnn.*,
each naming its command), and, for Vulkan, which no driver here can run, against the binary's format strings.

The real binary is driven through the probe path in tests/integration/test_benchncnn_real.py.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from edgebench.errors import ModelError, UserError
from edgebench.native import ADAPTERS, RUNNER_FOR_RUNTIME, NativeOptions, NativeToolError
from edgebench.native.base import NativeResult
from edgebench.native.benchncnn import BenchNcnn, declared_inputs, layer_times
from edgebench.probes.native import native_records, tool_argv, with_input_types
from edgebench.records import RecordContext

CONVNET = (("image", (112, 112, 3)),)


def fixture(name: str) -> str:
    text = resources.files("edgebench.native").joinpath("fixtures", name).read_text()
    assert text.startswith("# source:"), f"{name} must say where it came from"
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("# "))


def options(**kw) -> NativeOptions:  # type: ignore[no-untyped-def]
    base = {"threads": 1, "runs": 10, "model_name": "convnet.param", "input_shapes": CONVNET}
    return NativeOptions(**{**base, **kw})


def parse(name: str, rc: int = 0, **kw) -> NativeResult:  # type: ignore[no-untyped-def]
    return BenchNcnn().parse(fixture(name), rc, options(**kw))


def refused(name: str, rc: int = 0, **kw) -> NativeToolError:  # type: ignore[no-untyped-def]
    with pytest.raises(NativeToolError) as info:
        parse(name, rc, **kw)
    assert "\n" not in str(info.value), "one line"
    return info.value


def test_registered_as_the_runner_of_ncnn() -> None:
    assert ADAPTERS["benchncnn"] is BenchNcnn and RUNNER_FOR_RUNTIME["ncnn"] == "benchncnn"
    assert BenchNcnn.runtime == "ncnn" and BenchNcnn.model_suffix == ".param"
    assert not BenchNcnn.needs_model_dir and not BenchNcnn.profile_to_file


# ---- argv --------------------------------------------------------------------------------------------------
def test_argv_maps_runs_threads_and_states_powersave_gpu_and_cooling_down() -> None:
    argv = BenchNcnn().argv("/bin/benchncnn", "/c/ab.param", options(threads=2, runs=40, warmup=3))
    # loops, threads, powersave 0 (no core binding), gpu device -1 (cpu), cooling down 0 (no 10 s sleep)
    assert argv == ["/bin/benchncnn", "40", "2", "0", "-1", "0", "param=/c/ab.param", "shape=[112,112,3]"]
    for delegate in ("vulkan", "gpu"):
        assert BenchNcnn().argv("/b", "/m.param", options(delegate=delegate))[4] == "0"
    assert BenchNcnn().argv("/b", "/m.param", options(delegate="cpu"))[4] == "-1"


def test_argv_passes_every_input_in_the_graphs_order_in_ncnn_axis_order() -> None:
    shapes = (("a", (56, 56, 8, 3)), ("b", (256, 128)), ("c", (4,)))
    argv = BenchNcnn().argv("/b", "/m.param", options(input_shapes=shapes))
    assert argv[-1] == "shape=[56,56,8,3],[256,128],[4]"


def test_argv_refuses_what_benchncnn_cannot_take() -> None:
    cases = {
        "no delegate 'nnapi'": options(delegate="nnapi"),
        "0 crashes benchncnn": options(threads=0),
        "no input shape known": options(input_shapes=()),
    }
    for message, opts in cases.items():
        with pytest.raises(NativeToolError, match=message) as info:
            BenchNcnn().argv("/b", "/m.param", opts)
        assert info.value.kind == "usage"
    with pytest.raises(UserError, match="give --threads N"):  # the probe's one-line usage error
        tool_argv(BenchNcnn(), "/b", "/m.param", options(threads=0))


# ---- input shapes read from the .param on the host ------------------------------------------------------
def test_declared_inputs_of_edgebench_converted_graphs() -> None:
    """Input lines as edgebench's ONNX -> ncnn conversion writes them (0=w 1=h [11=d] 2=c)."""
    conv = "7767517\n7 7\nInput in0 0 1 image 0=112 1=112 2=3\nConvolution c0 1 1 image 1 0=32 6=864\n"
    assert declared_inputs(conv, "c.param") == CONVNET
    mlp = "7767517\n4 4\nInput in0 0 1 x 0=1024\nInnerProduct fc 1 1 x 1 0=2048\n"
    assert declared_inputs(mlp, "m.param") == (("x", (1024,)),)
    two = "7767517\n3 3\nInput in0 0 1 a 0=256 1=128\nInput in1 0 1 b 0=8 1=8 11=4 2=3\nConcat c 2 1 a b y\n"
    assert declared_inputs(two, "t.param") == (("a", (256, 128)), ("b", (8, 8, 4, 3)))


def test_declared_inputs_name_the_file_and_layer_when_a_shape_is_missing() -> None:
    bare = "7767517\n2 2\nInput in0 0 1 in0\nReLU r 1 1 in0 out0\n"
    with pytest.raises(NativeToolError, match=r"x\.param: Input layer 'in0' declares no shape"):
        declared_inputs(bare, "x.param")
    with pytest.raises(NativeToolError, match=r"Input layer 'in0' declares a partial shape \(0=8 2=3\)"):
        declared_inputs("7767517\n1 1\nInput in0 0 1 in0 0=8 2=3\n", "x.param")
    with pytest.raises(NativeToolError, match="not an ncnn param file"):
        declared_inputs("\x00\x01junk", "x.param")
    with pytest.raises(NativeToolError, match="no Input layer"):
        declared_inputs("7767517\n1 1\nReLU r 1 1 a b\n", "x.param")


def test_the_probe_reads_shapes_for_a_param_and_names_the_file_when_it_cannot(tmp_path: Path) -> None:
    good = tmp_path / "conv.ncnn.param"
    good.write_text("7767517\n2 2\nInput in0 0 1 image 0=112 1=112 2=3\nReLU r 1 1 image out0\n")
    assert with_input_types(NativeOptions(), BenchNcnn(), good).input_shapes == CONVNET
    bare = tmp_path / "bare.param"
    bare.write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU r 1 1 in0 out0\n")
    with pytest.raises(ModelError, match=rf"{bare}: Input layer 'in0' declares no shape"):
        with_input_types(NativeOptions(), BenchNcnn(), bare)


# ---- real output --------------------------------------------------------------------------------------------
def test_real_cpu_run() -> None:
    r = parse("benchncnn.cpu_20260722.txt", threads=2)
    assert r.aggregates == {"min": 2.10, "max": 2.34, "mean": 2.23}  # aggregates only: no percentiles
    assert r.count == 10 and r.warmup_count == 8 and r.inferences == 18
    assert r.path == "cpu" and r.applied == {"backend": "cpu", "precision": "low", "layer_timing": False}
    assert r.resolution_ms == 0.01 and not r.unresolved and r.ops == []
    assert "numerics need the Python agent" in r.notes["weights"]
    assert r.notes["input_shapes"] == "image=[112,112,3]" and r.notes["powersave"].startswith("0:")
    assert r.load_ms is None and r.first_ms is None and r.peak_memory_mb is None  # not printed


def test_the_probe_stores_the_printed_aggregates_and_refuses_percentiles() -> None:
    r = parse("benchncnn.cpu_20260722.txt", threads=2)
    ctx = RecordContext(run_id="r", device="d", probe="bench", model="convnet", runtime="ncnn")
    out = native_records(ctx, [r], options())
    stats = {rec.params["stat"]: rec.value for rec in out.records if rec.metric == "latency_ms"}
    assert stats == {"min": 2.10, "max": 2.34, "mean": 2.23}  # nothing invented
    assert any("prints only max, mean, min" in w for w in out.warnings)


def test_real_run_says_what_it_cannot_honour() -> None:
    r = parse("benchncnn.cpu_20260722.txt", threads=2, warmup=3, warmup_seconds=0.5, min_seconds=1.0)
    [counts] = [w for w in r.warnings if "not applied" in w and "warm-up" in w]
    assert "10 timed and 8 warm-up" in counts and "warmup=3" in counts and "min_seconds=1 s" in counts
    assert any("cannot run fp32" in w for w in r.warnings)
    r = parse("benchncnn.cpu_20260722.txt", threads=2, profile=True)
    assert any("no per-layer times" in w and "profile not applied" in w for w in r.warnings)


def test_echoed_settings_that_differ_are_warned() -> None:
    out = fixture("benchncnn.cpu_20260722.txt").replace("powersave = 0", "powersave = 2")
    r = BenchNcnn().parse(out, 0, options(threads=4))
    assert "benchncnn ran 2 threads, not 4" in r.warnings
    assert any("powersave = 2" in w for w in r.warnings)


def test_real_per_layer_build() -> None:
    r = parse("benchncnn.layers_20260722.txt", runs=4)
    names = [(node, kind) for node, kind, _ in r.ops]
    assert names == [
        ("convrelu_0", "Convolution"),
        ("convrelu_1", "Convolution"),
        ("convrelu_2", "Convolution"),
        ("convrelu_3", "Convolution"),
        ("gap_0", "Pooling"),
        ("linear_9", "InnerProduct"),
    ]
    # the last 4 of 12 lines per layer are the timed runs: convrelu_1 read 1.76, 1.62, 1.60, 1.72 there
    layer = dict((node, ms) for node, _, ms in r.ops)
    lines = [ln.split() for ln in fixture("benchncnn.layers_20260722.txt").splitlines()]
    timed = [float(f[2][:-2]) for f in lines if len(f) > 2 and f[1] == "convrelu_1"][-4:]
    assert layer["convrelu_1"] == pytest.approx(sum(timed) / 4)
    assert r.count == 4 and r.warmup_count == 8 and r.applied["layer_timing"] is True
    assert 0.8 * r.aggregates["mean"] <= sum(layer.values()) <= r.aggregates["mean"] + 6 * 0.005
    assert any("per-layer build" in w for w in r.warnings)
    assert not any("fewer than" in w for w in r.warnings)
    assert r.notes["layer_times"].startswith("mean of the last 4")


def test_per_layer_lines_cut_short_are_said() -> None:
    text = "\n".join(
        f"Convolution              conv_{i % 2}    0.{i}0ms    |     [1] -> [1]" for i in range(6)
    )
    ops, warnings = layer_times(text, 4, 8)
    assert [op[0] for op in ops] == ["conv_0", "conv_1"] and "fewer than 12" in warnings[0]


def test_real_sub_resolution_model_is_unresolved_not_refused() -> None:
    r = parse("benchncnn.tiny_20260722.txt", model_name="tinymlp.param", input_shapes=(("x", (256,)),))
    assert r.unresolved and r.aggregates["mean"] == 0.02 and r.resolution_ms == 0.01


# ---- real failures: one line each, naming the file or layer ------------------------------------------------
def test_unknown_layer_type_is_a_model_error_never_a_zero_latency() -> None:
    err = refused("benchncnn.unknown_layer_20260722.txt", model_name="fancypool.param")
    assert "fancypool.param: ncnn has no layer type 'FancyPool'" in str(err) and err.kind == "model"


@pytest.mark.parametrize(
    "name, model, message",
    [
        ("missing_file", "absent.param", "absent.param: the param file could not be opened ('fopen"),
        ("inconsistent", "miscount.param", "miscount.param: the param file did not load ('parse layer_type"),
        (
            "load_model_crash",
            "badweights.param",
            "'layer load_model 6 linear_9 failed'), then crashed (SIGSEGV, exit 139)",
        ),
    ],
)
def test_param_that_does_not_load_is_a_model_error(name: str, model: str, message: str) -> None:
    rc = 139 if "crash" in name else 0
    err = refused(f"benchncnn.{name}_20260722.txt", rc, model_name=model)
    assert message in str(err) and err.kind == "model"


def test_fewer_shapes_than_inputs_is_an_error() -> None:
    err = refused("benchncnn.two_inputs_one_shape_20260722.txt", model_name="twoinputs.param")
    assert "twoinputs.param: the graph has 2 inputs, benchncnn was given 1 shapes" in str(err)


def test_a_shape_the_graph_does_not_fit_crashes_and_is_named() -> None:
    big = (("image", (100000, 100000, 3)),)
    err = refused("benchncnn.shape_too_large_crash_20260722.txt", 139, input_shapes=big, runs=2)
    assert "convnet.param: crashed (SIGSEGV, exit 139) running the graph at shape [100000,100000,3]" in str(
        err
    )
    assert err.kind == "model"


def test_arguments_not_taken_are_a_usage_error() -> None:
    err = refused("benchncnn.shape_rank5_20260722.txt", 255)
    assert "unsupported input shape size 5" in str(err) and err.kind == "usage"


def test_a_tool_sigkilled_by_the_device_is_not_blamed_on_the_model() -> None:
    err = refused("benchncnn.shape_too_large_crash_20260722.txt", 137)
    assert "from outside the tool" in str(err) and err.kind == "killed"


def test_vulkan_without_a_driver_is_a_delegate_error() -> None:
    err = refused("benchncnn.vulkan_no_driver_20260722.txt", 139, delegate="vulkan")
    assert "asked for vulkan" in str(err) and "load vulkan driver failed" in str(err)
    assert "crashed (SIGSEGV, exit 139)" in str(err) and err.kind == "delegate"


# ---- Vulkan, from the binary's format strings (no Vulkan driver here to capture a run) ---------------------
_HEADER = """[0 llvmpipe (LLVM 15.0.6, 256 bits)]  queueC=0[1]  queueT=0[1]  rebar=0  r-score=1
loop_count = 10
num_threads = 1
powersave = 0
gpu_device = 0
cooling_down = 0
"""
_RESULT = "       convnet.param  min =    4.40  max =    4.61  avg =    4.47\n"
_VULKAN = _HEADER + _RESULT


def test_vulkan_run_is_named_by_the_tools_echo_and_device_line() -> None:
    r = BenchNcnn().parse(_VULKAN, 0, options(delegate="vulkan"))
    assert r.path == "vulkan" and r.applied["backend"] == "vulkan" and r.warmup_count == 10
    assert r.notes["vulkan_device"] == "llvmpipe (LLVM 15.0.6, 256 bits)"
    assert "only a per-layer build" in r.notes["placement_evidence"]
    with pytest.raises(NativeToolError, match="vulkan is required.*cannot be shown") as info:
        BenchNcnn().parse(_VULKAN, 0, options(delegate="vulkan", require_backend=True))
    assert info.value.kind == "delegate"
    with pytest.raises(NativeToolError, match="asked for cpu, but benchncnn says gpu_device = 0"):
        BenchNcnn().parse(_VULKAN, 0, options())


def test_vulkan_per_layer_lines_in_us_and_layers_left_on_the_cpu() -> None:
    layers = "".join(
        f"{'Convolution':<24} {'convrelu_0':<30} {us:8.2f}us    |\n"
        f"{'Pooling':<24} {'gap_0':<30} {ms:8.2f}ms    |     [ 56,  56,  64] -> [ 64]\n"
        for us, ms in [(2540.21, 0.02)] * 10 + [(2000.0, 0.01), (3000.0, 0.03)]
    )
    header = _HEADER.replace("loop_count = 10", "loop_count = 2")  # 10 warm-up runs, then 2 timed
    r = BenchNcnn().parse(header + layers + _RESULT, 0, options(delegate="vulkan", runs=2))
    assert dict((n, ms) for n, _, ms in r.ops) == pytest.approx({"convrelu_0": 2.5, "gap_0": 0.02})
    assert r.notes["layers_on_cpu"] == "gap_0"
    with pytest.raises(NativeToolError, match="1 layers ran on the CPU: gap_0"):
        BenchNcnn().parse(
            header + layers + _RESULT, 0, options(delegate="vulkan", runs=2, require_backend=True)
        )
