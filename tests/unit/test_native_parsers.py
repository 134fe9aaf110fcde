"""Runner adapters against real output of each tool (fixtures name where each came from) and, where no real
capture of a format exists, against the tool's format strings (the upstream file and line are cited)."""

from __future__ import annotations

from importlib import resources

import pytest

from edgebench.native import MnnBenchmark, NativeOptions, NativeToolError, OrtPerfTest, TfliteBenchmarkModel
from edgebench.native.base import NativeResult, killed_from_outside


def fixture(name: str) -> str:
    text = resources.files("edgebench.native").joinpath("fixtures", name).read_text()
    assert text.startswith("# source:"), f"{name} must say where it came from"
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("# "))


def parse(adapter, name: str, rc: int = 0, **opts) -> NativeResult:  # type: ignore[no-untyped-def]
    return adapter.parse(fixture(name), rc, NativeOptions(**opts))


def test_every_fixture_names_its_source() -> None:
    names = [p.name for p in resources.files("edgebench.native").joinpath("fixtures").iterdir()]
    assert "mnn_benchmark.load_error.txt" not in names  # was pip MNN's Python message, not benchmark.out
    assert "onnxruntime_perf_test.load_error.txt" not in names  # was ORT's Python binding, not perf_test
    for name in names:
        folder = resources.files("edgebench.native").joinpath("fixtures", name)
        if folder.is_dir():  # a tool's captures as stdout/stderr pairs: its README names each one's command
            readme = folder.joinpath("README.md").read_text()
            stems = {p.name.rsplit(".", 1)[0] for p in folder.iterdir() if p.name != "README.md"}
            assert stems and all(f"`{stem}`" in readme for stem in stems), (name, stems)
            continue
        fixture(name)


# ---- TFLite / LiteRT benchmark_model ------------------------------------------------------------------------
def test_tflite_profiled_run_reads_the_timed_runs_not_the_profilers_timings() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.profiling_tc2.txt", threads=4, profile=True)
    assert r.count == 67
    assert r.aggregates["mean"] == pytest.approx(7.45497)  # not 7.36009, the profiler's op sum
    assert r.aggregates["min"] == pytest.approx(6.373) and r.aggregates["max"] == pytest.approx(7.775)
    assert r.load_ms == pytest.approx(16.772) and r.first_ms == pytest.approx(8.781)


def test_tflite_current_eight_column_op_table() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.profiling_tc2.txt", profile=True)
    assert len(r.ops) == 15  # the regular runs' Run Order table, not the initialization one
    assert r.ops[0] == ("Delegate/Convolution (NHWC, QU8) IGEMM:0", "Convolution (NHWC, QU8) IGEMM", 0.278)
    assert r.ops[-1][1] == "TFLite_Detection_PostProcess" and r.ops[-1][2] == pytest.approx(1.339)
    assert not any(op_type == "ModifyGraphWithDelegate" for _, op_type, _ in r.ops)


def test_tflite_partly_delegated_run_is_not_labelled_xnnpack() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.profiling_tc2.txt", profile=True)
    assert r.path == "xnnpack+cpu" and r.notes["delegated"] == "partial"
    assert any("runs part of the graph" in w for w in r.warnings)


def test_tflite_default_xnnpack_over_the_whole_graph() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.chromeos_cpu.txt")
    assert r.path == "xnnpack" and r.applied == {"delegate": "xnnpack", "precision": "fp32"}
    assert r.count == 1061 and r.aggregates["mean"] == pytest.approx(56.2658)


def test_tflite_overall_peak_memory_is_the_peak() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.chromeos_cpu.txt")
    assert r.peak_memory_mb == pytest.approx(93.2383) and r.memory_growth_mb is None


@pytest.mark.parametrize(
    ("name", "growth"), [("benchmark_model.xnnpack.txt", 18.7227), ("benchmark_model.android.txt", 12.8672)]
)
def test_tflite_footprint_growth_is_not_a_peak(name: str, growth: float) -> None:
    r = parse(TfliteBenchmarkModel(), name)
    assert r.peak_memory_mb is None and r.memory_growth_mb == pytest.approx(growth)
    assert any("not a peak" in w for w in r.warnings)


def test_tflite_older_captures_still_parse() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.android.txt", threads=4)
    assert r.count == 50
    assert r.aggregates == {"min": 32.641, "max": 34.005, "mean": 33.2094, "std": 0.45}
    assert r.load_ms == pytest.approx(0.855) and r.first_ms == pytest.approx(49.06)
    r = parse(TfliteBenchmarkModel(), "benchmark_model.xnnpack.txt")
    assert (
        r.count == 50
        and r.aggregates["mean"] == pytest.approx(55.0432)
        and r.load_ms == pytest.approx(18.777)
    )


def test_tflite_gpu_delegate_read_from_what_the_tool_says() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.chromeos_gpu.txt", delegate="gpu")
    assert r.path == "gpu" and r.applied["delegate"] == "gpu" and r.notes["delegated"] == "full"


# Format strings: xla/tsl/util/stats_calculator.h Stat::OutputToStream (`count=N curr=X` when every run took
# the same, as one run does) and StatWithPercentiles (` p5= median= p95=`); benchmark_model.cc:226.
RUN = "INFO: Running benchmark for at least {n} iterations and at least 0 seconds but terminate if exceeding 150 seconds."


def test_tflite_single_timed_run_prints_count_1_curr() -> None:
    out = "\n".join(
        [RUN.format(n=1), "INFO: count=1 curr=41000", "", RUN.format(n=1), "INFO: count=1 curr=40512", ""]
    )
    r = TfliteBenchmarkModel().parse(out, 0, NativeOptions(runs=1, warmup=1))
    assert r.count == 1 and r.aggregates == {"min": 40.512, "max": 40.512, "mean": 40.512, "std": 0.0}
    assert r.first_ms == pytest.approx(41.0)


def test_tflite_percentiles_of_current_builds() -> None:
    out = (
        RUN.format(n=50)
        + "\nINFO: count=50 first=900 curr=850 min=800 max=990 avg=860.5 std=30 p5=810 median=855 p95=950\n"
    )
    r = TfliteBenchmarkModel().parse(out, 0, NativeOptions())
    assert r.aggregates["p50"] == pytest.approx(0.855) and r.aggregates["p95"] == pytest.approx(0.95)
    assert r.notes["percentile_method"].startswith("tool: nearest rank")


def test_tflite_unconsumed_delegate_flag_is_an_error_not_a_cpu_run() -> None:
    # benchmark_model.cc:385: TFLITE_LOG(WARN) << "Unconsumed cmdline flags: " << unconsumed_args;
    out = fixture("benchmark_model.android.txt").replace(
        "STARTING!",
        "STARTING!\nWARN: Unconsumed cmdline flags: --use_gpu=true --gpu_precision_loss_allowed=false",
    )
    with pytest.raises(NativeToolError, match="Unconsumed cmdline flags") as info:
        TfliteBenchmarkModel().parse(out, 0, NativeOptions(delegate="gpu"))
    assert info.value.kind == "delegate"


def test_tflite_other_unconsumed_flags_are_a_warning() -> None:
    out = fixture("benchmark_model.android.txt").replace(
        "STARTING!", "STARTING!\nWARN: Unconsumed cmdline flags: --warmup_min_secs=0.5"
    )
    r = TfliteBenchmarkModel().parse(out, 0, NativeOptions())
    assert any("--warmup_min_secs=0.5" in w for w in r.warnings)


def test_tflite_delegate_asked_but_never_applied_is_an_error() -> None:
    with pytest.raises(NativeToolError, match="never said it applied it") as info:
        parse(TfliteBenchmarkModel(), "benchmark_model.chromeos_cpu.txt", delegate="nnapi")
    assert info.value.kind == "delegate"
    # benchmark_tflite_model.cc:1358: a delegate applied to no node at all.
    out = fixture("benchmark_model.android.txt") + (
        "\nINFO: Though NNAPI delegate is explicitly applied, the model graph will not be executed by the delegate."
    )
    with pytest.raises(NativeToolError, match="runs none of the graph"):
        TfliteBenchmarkModel().parse(out, 0, NativeOptions(delegate="nnapi"))


def test_tflite_delegate_failure_is_an_error_with_the_tools_message() -> None:
    with pytest.raises(NativeToolError, match="Failed to apply XNNPACK delegate") as info:
        parse(TfliteBenchmarkModel(), "benchmark_model.delegate_error.txt", rc=1)
    assert info.value.kind == "delegate"


def test_tflite_flags_for_precision_warmup_and_delegates() -> None:
    tfl = TfliteBenchmarkModel()
    opts = NativeOptions(threads=2, warmup=3, warmup_seconds=0, runs=40, min_seconds=2, precision="fp16")
    args = tfl.argv("/bin/bm", "/m.tflite", opts)
    assert {"--graph=/m.tflite", "--num_threads=2", "--warmup_runs=3", "--warmup_min_secs=0", "--num_runs=40",
            "--min_secs=2", "--report_peak_memory_footprint=true"} <= set(args)  # fmt: skip
    # fp16 reaches XNNPACK only through --xnnpack_force_fp16 on an explicitly applied XNNPACK.
    assert {"--use_xnnpack=true", "--xnnpack_force_fp16=true"} <= set(
        args
    ) and "--allow_fp16=true" not in args
    gpu = tfl.argv("/bin/bm", "/m", NativeOptions(delegate="gpu"))
    assert "--use_gpu=true" in gpu and "--gpu_precision_loss_allowed=false" in gpu  # fp32 asked explicitly
    assert "--gpu_precision_loss_allowed=true" in tfl.argv(
        "/bin/bm", "/m", NativeOptions(delegate="gpu", precision="fp16")
    )
    nnapi = tfl.argv("/bin/bm", "/m", NativeOptions(delegate="nnapi", precision="fp16", profile=True))
    assert {"--use_nnapi=true", "--nnapi_allow_fp16=true", "--enable_op_profiling=true"} <= set(nnapi)
    with pytest.raises(NativeToolError):
        tfl.argv("/bin/bm", "/m", NativeOptions(delegate="warp-drive"))
    with pytest.raises(NativeToolError, match="no fp16 switch"):
        tfl.argv("/bin/bm", "/m", NativeOptions(delegate="hexagon", precision="fp16"))


# Fixtures in the current format (LiteRT f6745779), each written from the print statements its header cites.
def test_tflite_current_format_percentiles_and_the_tools_warmup_count() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.linux_default_current.txt")
    assert r.count == 76 and r.warmup_count == 37 and r.inferences == 113  # the tool's counts, not runs + 1
    assert r.aggregates["p50"] == pytest.approx(13.177) and r.aggregates["p5"] == pytest.approx(12.990)
    assert r.aggregates["mean"] == pytest.approx(13.2471) and r.first_ms == pytest.approx(19.211)
    assert r.peak_memory_mb == pytest.approx(18.25) and r.memory_growth_mb == pytest.approx(9.5)


def test_tflite_linux_default_xnnpack_without_placement_evidence_is_unknown() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.linux_default_current.txt")
    assert r.notes["delegated"] == "unknown" and r.path == "xnnpack+unknown"
    assert r.applied["delegate"] == "xnnpack" and "none printed" in r.notes["placement_evidence"]
    assert any("unknown" in w for w in r.warnings)
    with pytest.raises(NativeToolError, match="required.*unknown") as info:
        parse(TfliteBenchmarkModel(), "benchmark_model.linux_default_current.txt", require_backend=True)
    assert info.value.kind == "delegate"


def test_tflite_verbose_replacing_line_for_subgraph_is_the_evidence() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.no_warmup_current.txt")
    assert r.notes["delegated"] == "full" and r.path == "xnnpack"
    assert "31 out of 31" in r.notes["placement_evidence"]
    partial = fixture("benchmark_model.no_warmup_current.txt").replace(
        "Replacing 31 out of 31 node(s) with delegate (TfLiteXNNPackDelegate) node, yielding 1 partitions",
        "Replacing 29 out of 31 node(s) with delegate (TfLiteXNNPackDelegate) node, yielding 2 partitions",
    )
    r = TfliteBenchmarkModel().parse(partial, 0, NativeOptions())
    assert r.notes["delegated"] == "partial" and r.path == "xnnpack+cpu"


def test_tflite_no_warmup_count0_parses_and_first_inference_0_is_no_time() -> None:
    r = parse(TfliteBenchmarkModel(), "benchmark_model.no_warmup_current.txt", warmup=0, warmup_seconds=0)
    assert r.count == 20 and r.warmup_count == 0 and r.inferences == 20
    assert r.aggregates["mean"] == pytest.approx(3.14425) and r.aggregates["p95"] == pytest.approx(3.419)
    assert r.first_ms is None and "no warm-up" in r.notes["first_inference"]


def test_tflite_timed_count0_is_an_error_never_the_warmups_stats() -> None:
    with pytest.raises(NativeToolError, match=r"timed phase ran no inference \(count=0\)") as info:
        parse(TfliteBenchmarkModel(), "benchmark_model.timed_count0_current.txt")
    assert info.value.kind == "measurement"


def test_tflite_error_prefix_names_the_first_error() -> None:
    with pytest.raises(NativeToolError, match="Encountered unresolved custom op: MyCustomOp") as info:
        parse(TfliteBenchmarkModel(), "benchmark_model.init_error_current.txt", rc=1)
    assert info.value.kind == "model"


def test_tflite_fp32_passes_no_fp16_flag_an_older_build_would_refuse() -> None:
    tfl = TfliteBenchmarkModel()
    for delegate in ("xnnpack", "nnapi", None):
        args = tfl.argv("/bin/bm", "/m", NativeOptions(delegate=delegate, precision="fp32"))
        assert not [a for a in args if "fp16" in a], args
    r = parse(TfliteBenchmarkModel(), "benchmark_model.linux_default_current.txt", precision="fp32")
    assert r.applied["precision"] == "fp32" and "default" in r.notes["precision_source"]


# ---- onnxruntime_perf_test -----------------------------------------------------------------------------------
def test_ort_perf_test_percentiles() -> None:
    r = parse(OrtPerfTest(), "onnxruntime_perf_test.acl.txt", delegate="acl", min_seconds=0)
    assert r.count == 8 and r.load_ms == pytest.approx(27.3071) and r.first_ms == 20
    assert r.aggregates["p50"] == pytest.approx(16.7086) and r.aggregates["mean"] == pytest.approx(17.735)
    assert r.aggregates["min"] == pytest.approx(15.9831) and r.aggregates["p999"] == pytest.approx(23.2702)
    assert r.peak_memory_mb == pytest.approx(35299328 / 2**20)
    assert r.applied == {"delegate": "acl", "precision": "fp32"} and r.path == "acl"


def test_ort_perf_test_new_average_label() -> None:
    r = parse(OrtPerfTest(), "onnxruntime_perf_test.android_sme2.txt", threads=1)
    assert r.aggregates["mean"] == pytest.approx(98.961997) and r.count == 5
    assert r.aggregates["p99"] == pytest.approx(101.519)


def test_ort_perf_test_old_format_without_percentiles() -> None:
    r = parse(OrtPerfTest(), "onnxruntime_perf_test.windows_old.txt")
    assert r.aggregates == {"mean": 734.606} and r.load_ms == pytest.approx(1841.49) and r.first_ms is None


def test_ort_perf_test_inputs_are_seeded_random_not_zeros() -> None:
    args = OrtPerfTest().argv("/bin/pt", "/m.onnx", NativeOptions(seed=7))
    assert args[args.index("-I") + 1 : args.index("-I") + 3] == ["-S", "7"]


def test_ort_perf_test_says_what_it_cannot_honour() -> None:
    r = parse(OrtPerfTest(), "onnxruntime_perf_test.acl.txt", warmup=5, min_seconds=2.0)
    assert any("warmup=5 not applied" in w for w in r.warnings)
    assert any("min_seconds=2 s and max_seconds not applied" in w for w in r.warnings)


def test_ort_perf_test_precision_per_execution_provider() -> None:
    ort = OrtPerfTest()
    nnapi = ort.argv("/bin/pt", "/m", NativeOptions(delegate="nnapi", precision="fp16"))
    assert nnapi[nnapi.index("-i") + 1] == "NNAPI_FLAG_USE_FP16"
    qnn = ort.argv("/bin/pt", "/m", NativeOptions(delegate="qnn"))  # QNN's HTP defaults to fp16
    assert qnn[qnn.index("-i") + 1] == "enable_htp_fp16_precision|0"
    with pytest.raises(NativeToolError, match="no fp16 option") as info:
        ort.argv("/bin/pt", "/m", NativeOptions(precision="fp16"))
    assert info.value.kind == "usage"


def test_ort_perf_test_profile_flag_and_unknown_provider() -> None:
    args = OrtPerfTest().argv("/bin/pt", "/m.onnx", NativeOptions(profile=True, profile_path="/w/tmp/perf-1"))
    assert args[args.index("-p") + 1] == "/w/tmp/perf-1" and args[-1] == "/m.onnx"
    with pytest.raises(NativeToolError, match="unknown execution provider 'nnapy'") as info:
        OrtPerfTest().argv("/bin/pt", "/m.onnx", NativeOptions(delegate="nnapy"))
    assert info.value.kind == "usage"


def test_ort_perf_test_corrupt_model_names_the_reason() -> None:
    # onnxruntime/core/graph/model.cc: the status text of a file protobuf cannot parse; perf_test prints it
    # and returns -1 (exit 255).
    out = "Setting intra_op_num_threads to 2\nFailed to load model because protobuf parsing failed.\n"
    with pytest.raises(NativeToolError, match="protobuf parsing failed") as info:
        OrtPerfTest().parse(out, 255, NativeOptions())
    assert info.value.kind == "model"


def test_ort_perf_test_provider_missing_from_the_build_is_a_delegate_error() -> None:
    # onnxruntime/test/perftest/ort_test_session.cc: ORT_THROW("NNAPI is not supported in this build\n").
    with pytest.raises(NativeToolError, match="NNAPI is not supported in this build") as info:
        OrtPerfTest().parse("NNAPI is not supported in this build\n", 255, NativeOptions(delegate="nnapi"))
    assert info.value.kind == "delegate"


def test_ort_perf_test_cpu_fallback_is_recorded_partial_and_fails_when_required() -> None:
    name = "onnxruntime_perf_test.nnapi_fallback_current.txt"
    r = parse(OrtPerfTest(), name, delegate="nnapi")
    assert r.count == 20 and r.aggregates["p50"] == pytest.approx(15.877)
    assert r.path == "nnapi+cpu" and r.notes["delegated"] == "partial"
    assert "Some nodes were not assigned" in r.notes["placement_evidence"]
    assert any("nnapi+cpu" in w for w in r.warnings)
    with pytest.raises(NativeToolError, match="nnapi is required.*Some nodes were not assigned") as info:
        parse(OrtPerfTest(), name, delegate="nnapi", require_backend=True)
    assert info.value.kind == "delegate"
    clean = parse(OrtPerfTest(), "onnxruntime_perf_test.acl.txt", delegate="acl", require_backend=True)
    assert clean.path == "acl" and clean.notes["delegated"] == "full"


def test_ort_perf_test_says_which_inputs_ran_on_zeros() -> None:
    name = "onnxruntime_perf_test.nnapi_fallback_current.txt"
    types = (("input_ids", "INT64"), ("mask", "FLOAT"))
    r = parse(OrtPerfTest(), name, seed=3, input_types=types)
    assert (
        r.notes["inputs"]
        == "generated by the tool (-I): input_ids (int64) zeros; mask random with seed 3 (-S)"
    )
    assert any("input_ids (int64) on zeros" in w for w in r.warnings)
    r = parse(OrtPerfTest(), name, seed=3)  # types not read: the tool's own line still tells
    assert "1 input(s) zeros" in r.notes["inputs"]
    r = parse(OrtPerfTest(), "onnxruntime_perf_test.acl.txt", seed=3, input_types=(("x", "FLOAT"),))
    assert r.notes["inputs"] == "generated by the tool (-I), random with seed 3 (-S)"


def test_ort_perf_test_counts_its_one_warmup_and_says_warmup_seconds_cannot_be_honoured() -> None:
    r = parse(OrtPerfTest(), "onnxruntime_perf_test.acl.txt", warmup_seconds=0.5)
    assert r.warmup_count == 1 and r.inferences == 9
    assert any("warmup_seconds=0.5 s cannot be honoured" in w for w in r.warnings)


# ---- MNN benchmark.out -----------------------------------------------------------------------------------------
def test_mnn_real_3_6_1_output() -> None:
    r = parse(MnnBenchmark(), "mnn_benchmark.cpu_3.6.1.txt", runs=10, threads=2, model_name="convnet.mnn")
    assert r.aggregates == {"max": 15.199, "min": 8.012, "mean": 9.999} and r.path == "cpu"
    assert r.applied == {"backend": "cpu", "precision": "fp32"}
    assert r.load_ms is None and r.first_ms is None  # the tool does not print them


@pytest.mark.parametrize("name", ["mnn_benchmark.rockpi.txt", "mnn_benchmark.android_old.txt"])
def test_mnn_older_formats(name: str) -> None:
    r = parse(MnnBenchmark(), name, runs=20)  # no model name: the first line
    assert set(r.aggregates) == {"min", "max", "mean"} and r.path == "cpu"
    assert r.aggregates["min"] <= r.aggregates["mean"] <= r.aggregates["max"]


def test_mnn_result_line_is_picked_by_the_models_name() -> None:
    r = parse(MnnBenchmark(), "mnn_benchmark.two_models_3.6.1.txt", runs=5, model_name="convnet.mnn")
    assert r.aggregates["mean"] == pytest.approx(9.441)  # not other.mnn's 0.000, printed first
    with pytest.raises(NativeToolError, match="no result for absent.mnn"):
        parse(MnnBenchmark(), "mnn_benchmark.two_models_3.6.1.txt", model_name="absent.mnn")


def test_mnn_dynamic_shapes_are_an_error_never_a_zero_latency() -> None:
    with pytest.raises(NativeToolError, match="not resized") as info:
        parse(MnnBenchmark(), "mnn_benchmark.not_resized_3.6.1.txt", runs=5, model_name="dyn2.mnn")
    assert info.value.kind == "model"


def test_mnn_non_model_file_crash_is_a_clear_error() -> None:
    with pytest.raises(NativeToolError, match=r"crashed \(SIGSEGV, exit 139\).*not a valid MNN model"):
        parse(MnnBenchmark(), "mnn_benchmark.not_mnn_3.6.1.txt", rc=139, model_name="junk.mnn")


def test_a_tool_sigkilled_by_the_device_is_not_blamed_on_the_model() -> None:
    """SIGKILL comes from outside (a phone's low-memory killer, a watchdog): the error says so, for every
    vendor tool, and never calls the file invalid."""
    with pytest.raises(NativeToolError, match=r"killed \(SIGKILL, exit 137\) from outside the tool") as info:
        parse(MnnBenchmark(), "mnn_benchmark.not_mnn_3.6.1.txt", rc=137, model_name="junk.mnn")
    assert "not a valid MNN model" not in str(info.value) and info.value.kind == "killed"
    # a run cut off before any result: only the banner the tools print first
    for adapter, banner in (
        (OrtPerfTest(), "Session creation time cost: 0.0123 s\n"),
        (TfliteBenchmarkModel(), "INFO: STARTING!\nINFO: Loaded model m.tflite\n"),
    ):
        with pytest.raises(NativeToolError, match=r"from outside the tool.*not by the model") as other:
            adapter.parse(banner, 137, NativeOptions())
        assert other.value.kind == "killed"  # a measurement failure on the device, not a model error
    for rc in (137, -9):
        assert killed_from_outside(rc) is not None and "not by the model" in str(killed_from_outside(rc))
    assert (
        killed_from_outside(139) is None and killed_from_outside(0) is None and killed_from_outside(1) is None
    )


def test_mnn_missing_backend_is_recorded_as_the_cpu_it_ran_on() -> None:
    """A CPU-only libMNN asked for OpenCL prints `Can't Find type=3 backend, use 0 instead` and runs on the
    CPU: recorded as cpu with that line as evidence and a warning, never as opencl; an error (kind
    "delegate") only when the backend is required."""
    name = "mnn_benchmark.opencl_missing_3.6.1.txt"
    r = parse(MnnBenchmark(), name, delegate="opencl", model_name="convnet.mnn")
    assert r.path == "cpu" and r.applied == {"backend": "cpu", "precision": "fp32"}
    assert "Can't Find type=3 backend, use 0 instead" in r.notes["placement_evidence"]
    assert any("asked for opencl" in w and "recorded as cpu" in w for w in r.warnings)
    assert r.aggregates["mean"] == pytest.approx(8.728)
    with pytest.raises(NativeToolError, match="opencl is required.*ran on cpu") as info:
        parse(MnnBenchmark(), name, delegate="opencl", model_name="convnet.mnn", require_backend=True)
    assert info.value.kind == "delegate"


def test_mnn_argv_precision_and_gpu_mode() -> None:
    mnn = MnnBenchmark()
    cpu = mnn.argv("/b.out", "/dir", NativeOptions(threads=2, runs=40, warmup=3))
    assert cpu == ["/b.out", "/dir", "40", "3", "0", "2", "0"]  # fp32 on the CPU: Normal (0)
    gpu = mnn.argv("/b.out", "/dir", NativeOptions(threads=2, runs=40, warmup=3, delegate="opencl"))
    assert gpu == ["/b.out", "/dir", "40", "3", "3", "4", "1"]  # GPU mode 4 (wide tuning), High: fp32
    assert mnn.argv("/b.out", "/d", NativeOptions(delegate="vulkan", precision="fp16"))[4:] == ["7", "4", "2"]


def test_mnn_logcat_build_never_records_the_asked_backend_it_cannot_show() -> None:
    name = "mnn_benchmark.logcat_opencl_3.6.1.txt"
    r = parse(MnnBenchmark(), name, delegate="opencl", model_name="convnet.mnn", runs=10, warmup=2)
    assert r.path == "unknown" and r.applied["backend"] == "unknown"
    assert "logcat" in r.notes["backend_evidence"] and any("recorded as unknown" in w for w in r.warnings)
    assert r.aggregates["mean"] == pytest.approx(7.544)
    with pytest.raises(NativeToolError, match="opencl is required.*cannot be shown") as info:
        parse(MnnBenchmark(), name, delegate="opencl", model_name="convnet.mnn", require_backend=True)
    assert info.value.kind == "delegate"
    # The CPU always exists: a logcat build on the CPU is the CPU.
    cpu = fixture(name).replace(
        "Forward type: OpenCL thread=4 precision=1", "Forward type: CPU thread=4 precision=0"
    )
    assert MnnBenchmark().parse(cpu, 0, NativeOptions(model_name="convnet.mnn")).path == "cpu"


def test_mnn_near_zero_without_the_librarys_messages_is_refused() -> None:
    with pytest.raises(
        NativeToolError, match="below what benchmark.out resolves.*cannot be ruled out"
    ) as info:
        parse(MnnBenchmark(), "mnn_benchmark.logcat_not_resized_3.6.1.txt", model_name="dyn2.mnn")
    assert info.value.kind == "measurement"


def test_mnn_real_sub_microsecond_model_is_unresolved_not_refused() -> None:
    r = parse(MnnBenchmark(), "mnn_benchmark.tiny_3.6.1.txt", model_name="tiny.mnn", runs=10, warmup=2)
    assert r.unresolved and r.resolution_ms == 0.001 and r.aggregates["mean"] == 0.0
    assert r.path == "cpu" and r.count == 10 and r.warmup_count == 2 and r.inferences == 12
    resolved = parse(MnnBenchmark(), "mnn_benchmark.cpu_3.6.1.txt", model_name="convnet.mnn")
    assert not resolved.unresolved


def test_mnn_says_what_it_cannot_honour() -> None:
    r = parse(
        MnnBenchmark(), "mnn_benchmark.cpu_3.6.1.txt", model_name="convnet.mnn", runs=10, warmup=2,
        min_seconds=1.0, warmup_seconds=0.5, profile=True,
    )  # fmt: skip
    [durations] = [w for w in r.warnings if "not applied" in w and "seconds" in w]
    assert (
        "min_seconds=1 s" in durations and "warmup_seconds=0.5 s" in durations and "max_seconds" in durations
    )
    assert any("no per-op profile" in w for w in r.warnings)
    assert r.count == 10 and r.warmup_count == 2  # the tool's own echo of its loop and warm-up counts


def test_input_types_are_read_from_the_onnx_model_on_the_host(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The host reads each graph input's element type (weights listed as inputs are not inputs); a
    format other than ONNX is left alone."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgebench.probes.native import with_input_types

    w = numpy_helper.from_array(np.zeros((4, 8), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["w", "ids"], ["e"]), helper.make_node("Mul", ["e", "mask"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 3, 8]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 8]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), path)
    opts = with_input_types(NativeOptions(), OrtPerfTest(), path)
    assert opts.input_types == (("ids", "INT64"), ("mask", "FLOAT"))
    assert with_input_types(NativeOptions(), MnnBenchmark(), path).input_types == ()
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\xff" * 50)
    assert with_input_types(NativeOptions(), OrtPerfTest(), junk).input_types == ()
